"""One set of bounds for plan.json's writer and its readers: what `ddtree-ops render` writes, every
reader on the host reads (the byte layer ddtree_ops/_core/plandoc.py, the typed contract
ddtree_ops/config/plandoc_model.py, the preflight's standard-library reader), and what a reader
would refuse, validate refuses first. A plan.json the host refused used to render with exit 0 (an
extra_args 2**64, .inf/.nan written as NaN/Infinity, 1000 accepted risks), and with --skip-tags
preflight the release activated and the unit crash-looped."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from helpers import REPO, base_hostvars

from ddtree_ops._core.plandoc import MAX_INT, read_plan_doc
from ddtree_ops.cli import main
from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.fields import MAX_ITEMS, MAX_TEXT
from ddtree_ops.config.plandoc_model import load_plan
from ddtree_ops.host import preflight as pf
from ddtree_ops.render import files

# Real options of the pinned release (SGLang 0.5.23, ddtree_ops.config.sglang_args): validate refuses
# flags the release's parser does not have, so the bound on extra_args is reached with real ones
# (list-valued options take the lists, single-valued ones a long string).
_LIST_FLAGS = (
    '--allowed-media-domains', '--bucket-e2e-request-latency', '--custom-weight-loader',
    '--debug-tensor-dump-layers', '--encoder-register-urls', '--encoder-urls',
    '--flashinfer-autotune-skip-ops', '--gc-threshold', '--generation-tokens-buckets',
    '--log-requests-target', '--lora-paths', '--lora-target-modules', '--monokernel-backend', '--numa-node',
    '--prefill-delayer-forward-passes-buckets', '--prefill-delayer-wait-seconds-buckets',
    '--prompt-tokens-buckets', '--return-aux-hidden-state-layer-ids',
    '--tokenizer-metrics-allowed-custom-labels', '--uvicorn-access-log-exclude-prefixes',
)
_VALUE_FLAGS = (
    '--asr-max-buffer-seconds', '--asr-max-concurrent-sessions', '--attention-context-parallel-size',
    '--batch-notify-size', '--bf16-gemm-backend', '--boundary-reduction', '--c128-page-size',
    '--chat-template', '--completion-template', '--constrained-json-max-whitespace-cnt',
    '--constrained-json-whitespace-pattern', '--context-bucket', '--cp-strategy', '--cpu-offload-gb',
    '--crash-dump-folder', '--dcp-comm-backend', '--dcp-replicate-q-proj', '--debug-tensor-dump-input-file',
    '--debug-tensor-dump-output-folder', '--decode-log-interval', '--decoupled-spec-bind-endpoint',
    '--decoupled-spec-connect-endpoints', '--decoupled-spec-rank', '--decoupled-spec-role',
    '--decrypted-config-file', '--decrypted-draft-config-file', '--deepep-config',
    '--deepep-dispatcher-output-dtype', '--deepep-mode', '--deepep-v2-mode', '--default-chat-template-kwargs',
    '--default-priority-value', '--detokenizer-worker-num', '--device',
    '--disaggregation-decode-allocation-policy', '--disaggregation-decode-extra-slots',
    '--disaggregation-decode-host-receive-threshold', '--disaggregation-decode-polling-interval',
    '--disaggregation-decode-retraction-backup', '--disaggregation-ib-device', '--disaggregation-mode',
    '--disaggregation-transfer-backend', '--dist-timeout', '--dllm-algorithm',
)
assert len(_LIST_FLAGS) + len(_VALUE_FLAGS) == MAX_ITEMS  # the bound on extra_args entries

AT_THE_BOUNDS = {  # accepted inputs as large or as extreme as the rules allow
    "risks-64-long": {"ddtree_accepted_risks": [
        {"rule": "sm103-ddtree-graph-capture", "reason": f"{i:02d}" + "r" * (MAX_TEXT - 2)} for i in range(MAX_ITEMS)]},
    "extra-int-extremes": {"ddtree_server": {"extra_args": {"--max-prefill-tokens": MAX_INT - 1,
                                                            "--chunked-prefill-size": 0}}},
    "extra-float-extremes": {"ddtree_server": {"extra_args": {"--schedule-conservativeness": 1.7976931348623157e308}}},
    "extra-float-tiny": {"ddtree_server": {"extra_args": {"--schedule-conservativeness": 5e-324}}},
    "extra-64-flags": {"ddtree_server": {"extra_args": {
        **{f: ["v" * 60] * 8 for f in _LIST_FLAGS}, **{f: "v" * 480 for f in _VALUE_FLAGS}}}},
    "env-64": {"ddtree_service": {"env": {f"X_{i}": "v" * 200 for i in range(MAX_ITEMS)}}},
}


def _inventory(root: Path, changes: dict) -> Path:
    gv = copy.deepcopy(base_hostvars())
    gv.pop("ddtree_host_class")
    for section, value in changes.items():
        gv[section] = {**gv.get(section, {}), **value} if isinstance(value, dict) else value
    inv = root / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": {"h1": {}}}}}}))
    (inv / "group_vars" / "b300.yml").write_text("ddtree_host_class: b300\n")
    (inv / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump(gv))
    return inv


def _read_by_every_reader(out: Path) -> int:
    plans = sorted(out.glob("*/etc/ddtree-ops/*/plan.json"))
    assert plans, sorted(out.rglob("*"))[:20]
    for p in plans:
        doc = read_plan_doc(p)  # the byte layer
        typed = load_plan(p)  # the typed contract (runs the preflight's field reader first)
        e = pf.expect_from(None, doc)  # the preflight's own reading, ports included
        assert typed.unit == e.unit and e.ports[0][0] == typed.deployment.server.port, p
    return len(plans)


@pytest.mark.parametrize("name", sorted(AT_THE_BOUNDS))
def test_inputs_at_the_bounds_render_and_every_reader_reads_them(tmp_path, name):
    inv = _inventory(tmp_path, AT_THE_BOUNDS[name])
    assert main(["validate", "-i", str(inv)]) == 0
    assert main(["render", "-i", str(inv), "--out", str(tmp_path / "out")]) == 0
    assert _read_by_every_reader(tmp_path / "out") == 1


@pytest.mark.parametrize("inventory", sorted(p.name for p in (REPO / "inventory").iterdir() if p.is_dir()))
def test_every_shipped_inventory_renders_plans_every_reader_reads(tmp_path, inventory):
    rc = main(["render", "-i", str(REPO / "inventory" / inventory), "--out", str(tmp_path / "out")])
    if rc != 0:
        pytest.skip(f"inventory/{inventory} does not render here (exit {rc}): it needs its machine's files")
    assert _read_by_every_reader(tmp_path / "out") >= 1


@pytest.mark.parametrize("poison, says", [
    ({"x": float("nan")}, "not JSON compliant: nan"),
    ({"x": 2 ** 64}, "out of range"),
    ({"x": "y" * (5 << 20)}, "larger than 4 MiB"),
])
def test_the_writer_refuses_a_plan_json_its_readers_would(monkeypatch, poison, says):
    """Whatever a future field lets through: plan.json is read back before it is written."""
    v = validate_hostvars("h1", base_hostvars())
    real = files.plan_document
    monkeypatch.setattr(files, "plan_document", lambda v: {**real(v), **poison})
    with pytest.raises(ConfigError) as exc:
        files.render_host(v)
    [f] = exc.value.findings
    assert f.field == "plan.json" and says in f.rule and f.fix, f
