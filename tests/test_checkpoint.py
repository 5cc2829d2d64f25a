"""Checkpoint facts and model revisions: ``ddtree_ops/config/checkpoint.py`` against the
public config files in ``tests/fixtures/checkpoints`` (provenance: ``tests/fixtures/README.md``).

No network: Hub reads go through a fake ``hf_hub_download`` that serves the fixture files.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from helpers import FIXTURES

from ddtree_ops.cli import main
from ddtree_ops.config.checkpoint import (
    CONFIG,
    INDEX,
    MAX_FILE_BYTES,
    PREPROCESSOR,
    CheckpointFileError,
    CheckpointReader,
    check_with_checkpoints,
    estimate_params,
    kv_bytes_per_token,
    parse_json_object,
    read_hub,
    validate_with_checkpoints,
)
from ddtree_ops.config.errors import ConfigError
from ddtree_ops.config.load import deployment_from_hostvars
from ddtree_ops.render.argv import build_argv


def _readable_copy() -> Path:
    """The checkpoint fixtures, copied once per test process to a place the service sandbox lets
    a unit read (/dev/shm): a checkout under /tmp, /home or /root would otherwise be refused by
    the sandbox path rule before any checkpoint rule runs (PrivateTmp / ProtectHome)."""
    import atexit

    base = Path(tempfile.mkdtemp(prefix="ddtree-ckpt-fixtures-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    atexit.register(shutil.rmtree, base, True)
    return Path(shutil.copytree(FIXTURES / "checkpoints", base / "checkpoints"))


CK = _readable_copy()
QWEN3_8B = CK / "Qwen--Qwen3-8B"
LLAMA31 = CK / "meta-llama--Llama-3.1-8B-Instruct"
EAGLE3_HEAD = CK / "sgl-project--SpecForge-llama3-8B-eagle3"
DFLASH_DRAFT = CK / "FlashDriveVLA--Alpamayo-R1-10B-DFlash"
QWEN2_VL = CK / "Qwen--Qwen2-VL-7B-Instruct"
HOSTS_YML = yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": {"b300-01": None}}}}})
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def tmp_path():
    """A scratch directory outside /tmp: the unit's PrivateTmp hides /tmp, so the sandbox rule
    refuses checkpoints there (/dev/shm is a place the unit can read)."""
    d = Path(tempfile.mkdtemp(prefix="ddtree-ckpt-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def hostvars(target: str | Path, draft: str | Path | None = None, algorithm: str = "DFLASH", host_class: str = "b300",
             **over) -> dict:
    spec: dict = {"algorithm": algorithm if draft else "none"}
    if draft:
        spec["draft_model_path"] = str(draft)
    if algorithm in ("EAGLE", "EAGLE3"):
        spec.update(num_steps=3, topk=1)
    spec.update(over.pop("spec", {}))
    hv = {"ddtree_host_class": host_class,
          "ddtree_model": {"path": str(target), **over.pop("model", {})},
          "ddtree_speculative": spec,
          "ddtree_server": {"tp_size": 8, "max_running_requests": 16, **over.pop("server", {})}}
    hv.update(over)
    return hv


def run(hv: dict, reader: CheckpointReader | None = None):
    d = deployment_from_hostvars("h1", hv)
    return check_with_checkpoints(d, reader or CheckpointReader())


def rules_of(findings, level: str = "error") -> list[str]:
    return [f.message() for f in findings if f.level == level]


# --- bounded, strict reads -------------------------------------------------------------------

@pytest.mark.parametrize("data, why", [
    (b"[1, 2]", "must be a JSON object, not list"),
    (b'{"vocab_size": NaN}', "holds NaN"),
    (b'{"a": Infinity}', "holds Infinity"),
    (b'{"vocab_size": 1, "vocab_size": 2}', "repeats the key 'vocab_size'"),
    (b'{"a": 1,}', "is not valid JSON"),
    (b"\xff\xfe{}", "is not UTF-8"),
    (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    (b'{"pad": "' + b"x" * MAX_FILE_BYTES + b'"}', "is over 1024 KiB"),
])
def test_parse_refuses_what_is_not_a_bounded_strict_object(data, why):
    with pytest.raises(CheckpointFileError, match=why.replace("(", r"\(")):
        parse_json_object(data, CONFIG)


def test_every_fixture_parses_as_an_object():
    for p in CK.rglob("*.json"):
        assert isinstance(parse_json_object(p.read_bytes(), p.name), dict), p


def _copy(src: Path, dst: Path, **changes) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((src / CONFIG).read_text())
    cfg.update(changes)
    (dst / CONFIG).write_text(json.dumps(cfg))
    return dst


def test_malformed_config_is_one_error_naming_the_file(tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / CONFIG).write_text('{"vocab_size": 151936, "vocab_size": 1}')
    with pytest.raises(ConfigError) as exc:
        validate_with_checkpoints("h1", hostvars(bad), CheckpointReader())
    (f,) = exc.value.findings
    assert f.field == "ddtree_model.path" and "config.json repeats the key 'vocab_size'" in f.message()


def test_a_fifo_or_huge_file_is_a_finding_not_a_hang(tmp_path):
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / CONFIG)
    huge = tmp_path / "huge"
    huge.mkdir()
    with open(huge / CONFIG, "wb") as f:
        f.truncate(64 * MAX_FILE_BYTES)  # sparse: 64 MiB of zeros; at most 1 MiB + 1 byte is read
    t0 = time.monotonic()
    for path, why in ((fifo, "is not a regular file"), (huge, "is over 1024 KiB")):
        with pytest.raises(ConfigError) as exc:
            validate_with_checkpoints("h1", hostvars(path), CheckpointReader())
        assert [why in f.message() for f in exc.value.findings] == [True]
    assert time.monotonic() - t0 < 2


def test_malformed_optional_file_is_an_error_but_config_is_still_read(tmp_path):
    d = _copy(QWEN3_8B, tmp_path / "m")
    (d / INDEX).write_text('{"metadata": {"total_size": 1}, "weight_map": {}, "weight_map": {}}')
    _, _, findings = run(hostvars(d), CheckpointReader())
    assert [f"{INDEX} repeats the key 'weight_map'" in m for m in rules_of(findings)] == [True]


# --- "not read" is said, never a silent ok -----------------------------------------------------

def test_offline_hub_ids_give_one_info_line_each_and_no_fetch():
    calls = []
    reader = CheckpointReader(hub=False, fetch=lambda **kw: calls.append(kw))
    _, plan, findings = run(hostvars("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", spec={"block_size": 16}), reader)
    infos = rules_of(findings, "info")
    assert len(infos) == 2 and not calls and not rules_of(findings)
    assert "ddtree_model.path = 'Qwen/Qwen3-8B': checkpoint config not read: offline" in infos[0]
    assert "rules block-size, context-length, draft architecture, vocab, draft tensors not checked" in infos[1]
    assert plan.checkpoint["checkpoints"]["draft"] == {"read": None}  # the why is the info line, not plan data


def test_absolute_path_missing_on_the_controller_is_said(tmp_path):
    _, _, findings = run(hostvars(tmp_path / "on-the-host-only"))
    assert ["the path is not on this controller" in m for m in rules_of(findings, "info")] == [True]


def test_cli_validate_prints_info_and_json_lists_it(tmp_path, capsys):
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(HOSTS_YML)
    hv = hostvars("Qwen/Qwen3-8B", str(DFLASH_DRAFT), spec={"block_size": 8})
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(hv))
    assert main(["validate", "-i", str(inv)]) == 0  # the draft was read and fits; the target was not
    out = capsys.readouterr().out
    assert "ok   b300-01" in out
    assert "info b300-01: ddtree_model.path = 'Qwen/Qwen3-8B': checkpoint config not read: offline" in out
    assert main(["validate", "-i", str(inv), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [i["field"] for i in doc["info"]] == ["ddtree_model.path"] and doc["info"][0]["level"] == "info"
    hv["ddtree_model"]["context_length"] = 65536  # beyond the draft's 40960
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(hv))
    assert main(["validate", "-i", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "error b300-01: ddtree_model.context_length = 65536: the served context (65536 tokens) exceeds the " \
           "draft's max_position_embeddings (40960)" in err and "Traceback" not in err


# --- rules against real configs -------------------------------------------------------------------

def test_dflash_block_size_must_equal_the_drafts_own():
    _, _, findings = run(hostvars(QWEN3_8B, DFLASH_DRAFT, spec={"block_size": 16}))
    errors = rules_of(findings)
    assert any("ddtree_speculative.block_size = 16: the draft checkpoint was trained with block_size 8" in m
               for m in errors)
    _, _, findings = run(hostvars(QWEN3_8B, DFLASH_DRAFT, spec={"block_size": 8}))
    assert not any("block_size" in m and "trained with" in m for m in rules_of(findings))


def test_dflash_block_size_is_derived_from_the_draft_when_unset():
    d, plan, findings = run(hostvars(QWEN3_8B, DFLASH_DRAFT, algorithm="DDTREE",
                                     ddtree_sglang={"ddtree_source": "sglang-pr-29907"}, spec={"budget": 7}))
    assert not any("needs block_size" in m for m in rules_of(findings))  # rule_draft_model sees the derived value
    assert d.speculative.block_size == 8 and plan.block_size == 8 and plan.verify_tokens_per_req == 8
    assert plan.checkpoint["derived"]["ddtree_speculative.block_size"] == {
        "value": 8,
        "source": "draft config.json (local)",
    }
    argv = build_argv(d, plan)
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"


def test_vocab_must_match_target():
    _, _, findings = run(hostvars(QWEN3_8B, DFLASH_DRAFT, spec={"block_size": 8}))
    assert any("the draft's vocab_size (155697) differs from the target's (151936)" in m for m in rules_of(findings))
    _, _, findings = run(hostvars(QWEN3_8B, EAGLE3_HEAD, algorithm="EAGLE3"))
    assert any("vocab_size (128256) differs from the target's (151936)" in m for m in rules_of(findings))
    _, _, findings = run(hostvars(LLAMA31, EAGLE3_HEAD, algorithm="EAGLE3", model={"context_length": 2048}))
    assert rules_of(findings) == []  # draft_vocab_size 32000 is the hot vocab: allowed


def test_eagle3_hot_vocab_larger_than_vocab_is_refused(tmp_path):
    head = _copy(EAGLE3_HEAD, tmp_path / "head", draft_vocab_size=200000)
    _, _, findings = run(hostvars(LLAMA31, head, algorithm="EAGLE3", model={"context_length": 2048}))
    assert ["draft_vocab_size (200000) exceeds the draft's vocab_size (128256)" in m for m in rules_of(findings)] == [
        True
    ]


@pytest.mark.parametrize("algorithm, draft, fits", [
    ("EAGLE3", EAGLE3_HEAD, True),
    ("EAGLE3", LLAMA31, False),        # a full LlamaForCausalLM is no EAGLE-3 head
    ("EAGLE3", DFLASH_DRAFT, False),
    ("EAGLE", EAGLE3_HEAD, False),
    ("DFLASH", EAGLE3_HEAD, False),
    ("DFLASH", DFLASH_DRAFT, True),
])
def test_draft_architecture_must_fit_the_algorithm(algorithm, draft, fits):
    spec = {"block_size": 8} if algorithm == "DFLASH" else {}
    _, _, findings = run(hostvars(LLAMA31, draft, algorithm=algorithm, model={"context_length": 2048}, spec=spec))
    arch = [m for m in rules_of(findings) if "draft (" in m or "head (" in m or "cannot run a" in m]
    assert (arch == []) is fits, arch


def test_served_context_beyond_the_drafts_window():
    # Llama 3.1 serves 131072 tokens by default; the EAGLE-3 head was trained for 2048
    _, _, findings = run(hostvars(LLAMA31, EAGLE3_HEAD, algorithm="EAGLE3"))
    assert any("the served context (131072 tokens, the target default) exceeds the draft's max_position_embeddings "
               "(2048)" in m for m in rules_of(findings))
    _, _, findings = run(hostvars(LLAMA31, EAGLE3_HEAD, algorithm="EAGLE3",
                                  ddtree_service={"env": {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}}))
    assert rules_of(findings) == [] and any("stretch the draft's window" in m for m in rules_of(findings, "warning"))
    _, _, findings = run(hostvars(QWEN3_8B, model={"context_length": 65536}))
    assert ["exceeds the target's max_position_embeddings (40960)" in m for m in rules_of(findings)] == [True]


def test_vision_warmup_uses_the_processors_min_pixels():
    d, plan, findings = run(hostvars(QWEN2_VL, model={"vision": True, "vision_min_pixels": 1000}))
    assert d.model.vision_min_pixels == 3136
    assert plan.checkpoint["derived"]["ddtree_model.vision_min_pixels"] == {
        "value": 3136, "source": "preprocessor_config.json (local)"}
    assert any("image processor has min_pixels 3136" in m for m in rules_of(findings, "warning"))
    # no config.json in that fixture: said, not silent
    assert any(f"no {CONFIG} in the checkpoint" in m for m in rules_of(findings, "info"))
    d, _, findings = run(hostvars(QWEN2_VL, model={"vision": True}))  # default 3136 = processor's: no warning
    assert d.model.vision_min_pixels == 3136 and not rules_of(findings, "warning")


# --- memory estimate -------------------------------------------------------------------------------

def test_param_and_kv_estimates_of_llama31_8b():
    cfg = json.loads((LLAMA31 / CONFIG).read_text())
    # embeddings + untied LM head + 32 x (q,o 4096x4096; k,v 4096x1024; MLP 3 x 4096x14336; 2 norms) + final norm
    assert estimate_params(cfg) == 128256 * 4096 * 2 + 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
                                                              + 2 * 4096) + 4096
    assert estimate_params(cfg) == 8_030_261_248  # the Hub's safetensors metadata of Llama-3.1-8B (exact)
    qwen = json.loads((QWEN3_8B / CONFIG).read_text())
    assert estimate_params(qwen) == 8_190_735_360  # the Hub's safetensors metadata of Qwen3-8B (exact: q/k norms)
    assert kv_bytes_per_token(cfg, tp=1) == 32 * 8 * 128 * 2 * 2 == 131072
    assert kv_bytes_per_token(cfg, tp=8) == 32 * 1 * 128 * 2 * 2
    assert kv_bytes_per_token(cfg, tp=16) == 32 * 1 * 128 * 2 * 2  # 8 KV heads on 16 ranks: replicated, not halved
    head = json.loads((EAGLE3_HEAD / CONFIG).read_text())
    assert estimate_params(head) == (
        128256 * 4096 + 32000 * 4096 + (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 3 * 4096
    )  # one layer's two norms and the final norm


def test_plan_memory_numbers_and_warnings():
    hv = hostvars(LLAMA31, EAGLE3_HEAD, algorithm="EAGLE3", host_class="ct200",
                  model={"context_length": 2048}, server={"tp_size": 1, "mem_fraction_static": 0.5})
    _, plan, findings = run(hv)
    mem = plan.checkpoint["memory"]
    weights = (
        8_030_261_248 * 2 + (128256 * 4096 + 32000 * 4096 + 218_103_808 + 3 * 4096) * 2
    )  # bf16 target, fp16 head (+ its norms)
    assert mem["weights_per_gpu"] == weights and mem["weights_source"] == "target: config, draft: config"
    assert mem["kv_per_token"] == 131072 + 1 * 8 * 128 * 2 * 2
    assert mem["kv_needed"] == mem["kv_per_token"] * 16 * 2048 and mem["kv_for"] == "16 requests x 2048 tokens"
    assert mem["budget"] == int(0.5 * 96 * (1 << 30)) and "weights +-10 %" in mem["error_bound"]
    assert rules_of(findings) == [] and not any("mem_fraction_static" in m for m in rules_of(findings, "warning"))
    hv["ddtree_server"]["max_running_requests"] = 256
    hv["ddtree_server"]["cuda_graph_max_bs"] = 256
    _, plan, findings = run(hv)
    assert any("exceed the 48.0 GiB mem_fraction_static leaves" in m for m in rules_of(findings, "warning"))
    assert any("exceed the 48.0 GiB" in w for w in plan.warnings)
    hv["ddtree_server"]["mem_fraction_static"] = 0.1
    _, _, findings = run(hv)
    assert any("weights alone need ~16.59 GiB per GPU (tp 1) but mem_fraction_static leaves 9.6 GiB" in m
               for m in rules_of(findings))


def test_weights_come_from_the_safetensors_index_when_present(tmp_path):
    d = _copy(QWEN3_8B, tmp_path / "q")
    total = 16_381_470_720  # test input: an index total_size, bytes
    (d / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": {}}))
    _, plan, _ = run(hostvars(d, server={"tp_size": 4}))
    assert plan.checkpoint["memory"]["weights_per_gpu"] == total // 4
    assert plan.checkpoint["memory"]["error_bound"].startswith("weights +-2 %")


def test_plan_cli_shows_derived_values_and_the_estimate(tmp_path, capsys):
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(HOSTS_YML)
    hv = hostvars(LLAMA31, EAGLE3_HEAD, algorithm="EAGLE3", model={"context_length": 2048},
                  server={"mem_fraction_static": 0.8})
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(hv))
    assert main(["plan", "-i", str(inv)]) == 0
    out = capsys.readouterr().out
    for text in ("model checkpoint", "read (local)", "weights/GPU", "KV needed/GPU", "estimate error"):
        assert text in out, text
    assert main(["plan", "-i", str(inv), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["hosts"]["b300-01"]["checkpoint"]["memory"]["kv_for"] == "16 requests x 2048 tokens"


# --- the Hub, through a fake hf_hub_download -----------------------------------------------------------

class FakeHub:
    """Serves fixture directories as Hub repos; records each call (the real signature's keywords)."""

    def __init__(self, repos: dict[str, Path], delay: float = 0.0):
        self.repos, self.delay, self.calls, self.asked = repos, delay, [], []

    def __call__(self, *, repo_id, filename, revision=None, token=None, etag_timeout=10, dry_run=False):
        self.asked.append(filename)
        time.sleep(self.delay)
        path = self.repos[repo_id] / filename
        if not path.exists():
            from huggingface_hub.errors import EntryNotFoundError

            raise EntryNotFoundError(f"{filename} not in {repo_id}")
        if dry_run:
            from huggingface_hub import DryRunFileInfo

            return DryRunFileInfo(COMMIT, path.stat().st_size, filename, str(path), False, True)
        self.calls.append((repo_id, filename, revision, token))  # downloads
        return str(path)


def test_the_fake_matches_hf_hub_download_keywords():
    from huggingface_hub import hf_hub_download

    params = inspect.signature(hf_hub_download).parameters
    assert {"repo_id", "filename", "revision", "token", "etag_timeout", "dry_run"} <= set(params)


def test_hub_reads_config_files_only_with_revision_and_token():
    hub = FakeHub({"meta-llama/Llama-3.1-8B-Instruct": LLAMA31, "lmsys/head": EAGLE3_HEAD})
    hv = hostvars("meta-llama/Llama-3.1-8B-Instruct", "lmsys/head", algorithm="EAGLE3",
                  model={"context_length": 2048, "revision": COMMIT}, ddtree_hf_token="hf_secret_token_123")
    _, plan, findings = run(hv, CheckpointReader(hub=True, fetch=hub))
    # the head has no index on the Hub, and its weights are never fetched: its tensors go unchecked, said once
    [info] = rules_of(findings, "info")
    assert rules_of(findings) == [] and "the draft's tensor names were not read" in info
    assert set(hub.asked) == {CONFIG, PREPROCESSOR, INDEX}  # config files only, never weights
    assert {c[1] for c in hub.calls} == {CONFIG}  # downloaded: the files that exist
    assert ("meta-llama/Llama-3.1-8B-Instruct", CONFIG, COMMIT, "hf_secret_token_123") in hub.calls
    assert ("lmsys/head", CONFIG, None, "hf_secret_token_123") in hub.calls
    assert plan.checkpoint["checkpoints"]["model"] == {"read": "hub", "ref": "meta-llama/Llama-3.1-8B-Instruct"}
    assert "hf_secret_token_123" not in json.dumps(plan.as_dict())


def test_hub_refuses_a_huge_file_before_downloading_it(tmp_path):
    big = tmp_path / "big"
    big.mkdir()
    with open(big / CONFIG, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 1)
    hub = FakeHub({"org/big": big})
    f = read_hub("model", "org/big", None, None, fetch=hub)
    assert hub.calls == [] and f.config is None
    assert f.malformed == ((CONFIG, f"is {MAX_FILE_BYTES + 1} bytes on the Hub, over 1024 KiB (not downloaded)"),)


def test_hub_total_deadline():
    hub = FakeHub({"a/b": QWEN3_8B}, delay=5)
    t0 = time.monotonic()
    f = read_hub("model", "a/b", None, None, fetch=hub, deadline_s=0.2)
    assert time.monotonic() - t0 < 1.5
    assert f.config is None and f.not_read == "the Hugging Face Hub did not answer within 0.2 s"


def test_hub_time_of_a_run_is_bounded_in_all():
    hub = FakeHub({f"org/m{i}": QWEN3_8B for i in range(5)}, delay=0.2)
    reader = CheckpointReader(hub=True, fetch=hub, deadline_s=0.3, budget_s=0.5)
    t0 = time.monotonic()
    facts = [reader.read("model", f"org/m{i}", None, None) for i in range(5)]
    assert time.monotonic() - t0 < 1.5
    assert facts[0].not_read == "the Hugging Face Hub did not answer within 0.3 s"
    assert facts[-1].not_read == "this run's Hub time (0.5 s in all) is spent"


def test_hub_failure_is_not_read_with_its_cause_and_no_token():
    def fail(**kw):
        raise OSError("401 Client Error for url https://huggingface.co/x (token hf_secret_token_123 rejected)")

    from ddtree_ops.config.errors import register_secret

    register_secret("hf_secret_token_123")
    f = read_hub("model", "org/private", None, "hf_secret_token_123", fetch=fail)
    assert f.not_read.startswith("Hub read failed (OSError: 401 Client Error")
    _, _, findings = run(hostvars("org/private", ddtree_hf_token="hf_secret_token_123"),
                         CheckpointReader(hub=True, fetch=fail))
    (info,) = rules_of(findings, "info")
    assert "hf_secret_token_123" not in info and "(redacted)" in info


def test_hub_refuses_a_non_repo_id_without_calling():
    hub = FakeHub({})
    assert read_hub("model", "https://evil.example/x", None, None, fetch=hub).not_read.startswith("not a local")
    assert hub.calls == []


def test_cli_hub_flag_and_env(tmp_path, capsys, monkeypatch):
    hub = FakeHub({"Qwen/Qwen3-8B": QWEN3_8B})
    monkeypatch.setattr("ddtree_ops.config.checkpoint._hub_download", lambda: hub)
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(HOSTS_YML)
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(hostvars("Qwen/Qwen3-8B",
                                                                           model={"context_length": 65536})))
    monkeypatch.delenv("DDTREE_HUB", raising=False)
    assert main(["validate", "-i", str(inv)]) == 0 and hub.asked == []  # offline: not read, said
    assert "checkpoint config not read: offline" in capsys.readouterr().out
    assert main(["validate", "-i", str(inv), "--hub"]) == 2
    assert "exceeds the target's max_position_embeddings (40960)" in capsys.readouterr().err
    monkeypatch.setenv("DDTREE_HUB", "1")
    assert main(["validate", "-i", str(inv)]) == 2


# --- revisions ---------------------------------------------------------------------------------

def test_revisions_reach_the_argv():
    hv = hostvars("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", spec={"block_size": 16, "draft_model_revision": "v1.0"},
                  model={"revision": COMMIT})
    d, plan, _ = run(hv)
    argv = build_argv(d, plan)
    assert argv[argv.index("--revision") + 1] == COMMIT
    assert argv[argv.index("--speculative-draft-model-revision") + 1] == "v1.0"
    d, plan, _ = run(hostvars("Qwen/Qwen3-8B"))
    assert "--revision" not in build_argv(d, plan)


@pytest.mark.parametrize("bad", ["../main", "main branch", "-rf", "a" * 129, "refs//x", "x;y", "main\n"])
def test_bad_revision_is_one_clear_line(bad):
    with pytest.raises(ConfigError) as exc:
        deployment_from_hostvars("h1", hostvars("Qwen/Qwen3-8B", model={"revision": bad}))
    (f,) = exc.value.findings
    assert f.field == "ddtree_model.revision" and ("40-hex commit" in f.message() or "at most 128" in f.message())


def test_trust_remote_code_without_a_pinned_commit_warns():
    hv = hostvars("moonshotai/Kimi-K2.6", "z-lab/Kimi-K2.6-DFlash", spec={"block_size": 8},
                  model={"trust_remote_code": True, "revision": "main"})
    _, _, findings = run(hv)
    warns = [m for m in rules_of(findings, "warning") if "trust_remote_code runs code" in m]
    assert len(warns) == 2 and "ddtree_model.revision = 'main'" in warns[0]
    assert "ddtree_speculative.draft_model_revision = None" in warns[1]
    hv["ddtree_model"]["revision"] = COMMIT
    hv["ddtree_speculative"]["draft_model_revision"] = COMMIT
    _, _, findings = run(hv)
    assert not [m for m in rules_of(findings, "warning") if "trust_remote_code runs code" in m]


def test_fixture_readme_names_every_checkpoint_file():
    readme = (FIXTURES / "README.md").read_text()
    for p in (FIXTURES / "checkpoints").rglob("*"):
        if p.is_file():
            assert str(p.relative_to(FIXTURES)) in readme, p


def test_shutil_copy_of_a_fixture_reads_the_same(tmp_path):
    """A checkpoint reached through a symlink (Hugging Face cache snapshots link into blobs/) reads."""
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    shutil.copy(QWEN3_8B / CONFIG, blobs / "abc")
    snap = tmp_path / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (snap / CONFIG).symlink_to(blobs / "abc")
    _, plan, findings = run(hostvars(snap))
    assert plan.checkpoint["checkpoints"]["model"]["read"] == "local" and not rules_of(findings, "info")


# --- the deploy play reads the host's files (ddtree_checkpoint, run locally) ---------------

def _play(tmp_path: Path, hv: dict, extra_tasks: list | None = None):
    import subprocess
    import sys

    playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
    if playbook is None:
        pytest.skip("ansible-playbook not installed next to this Python")
    inv = tmp_path / "inv"
    (inv / "host_vars").mkdir(parents=True, exist_ok=True)
    (inv / "hosts.yml").write_text(HOSTS_YML)
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump(
        {**hv, "ansible_connection": "local", "ansible_python_interpreter": sys.executable}))
    tasks = [{"name": "host files", "ddtree_checkpoint": None, "register": "_ddtree_checkpoint"},
             {"name": "render", "ddtree_render": None, "register": "r"},
             {"name": "show", "ansible.builtin.debug": {"msg": "BLOCK={{ r.plan.block_size }} "
                                                       "SRC={{ r.plan.checkpoint.checkpoints.draft.read }}"}}]
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{"hosts": "sglang_servers", "gather_facts": False,
                                                      "tasks": tasks + (extra_tasks or [])}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(FIXTURES.parents[1] / "ansible.cfg"),
           "PYTHONPATH": str(FIXTURES.parents[1])}  # this checkout's ddtree_ops in the controller process
    r = subprocess.run([playbook, "-i", str(inv), str(tmp_path / "pb.yml")], capture_output=True, text=True,
                       timeout=120, cwd=FIXTURES.parents[1], env=env)
    return r.returncode, " ".join((r.stdout + r.stderr).split())


def test_deploy_play_reads_the_hosts_checkpoint_files(tmp_path):
    """The draft exists only as a host path (here: this machine, connection local); the play reads
    it there, derives the block size, and ddtree_render (registered facts) plans with it."""
    host_draft = tmp_path / "models" / "draft"
    shutil.copytree(DFLASH_DRAFT, host_draft)
    hv = hostvars("Qwen/Qwen3-8B", host_draft)
    # the fleet check of deploy.yml's first play validates with the same registered facts
    fleet = {"name": "fleet", "ddtree_prometheus": {"servers": ["b300-01"], "fleet_only": True},
             "run_once": True, "delegate_to": "localhost", "register": "fl"}
    show = {"name": "fleet targets", "ansible.builtin.debug": {"msg": "FLEET={{ fl.targets | join(',') }}"}}
    rc, out = _play(tmp_path, hv, [fleet, show])
    assert rc == 0, out
    assert "BLOCK=8 SRC=host" in out and "FLEET=b300-01" in out


def test_host_payload_is_checked_like_local_files():
    """What ddtree_checkpoint hands over (base64 per file, refusals per file) is parsed by the same
    bounded reader: a malformed or damaged file is one finding, never a traceback."""
    import base64

    from ddtree_ops.config.checkpoint import reader_from_host_files

    good = base64.b64encode((DFLASH_DRAFT / CONFIG).read_bytes()).decode()
    path = "/srv/models/draft"
    hv = hostvars("Qwen/Qwen3-8B", path)
    for entry, expect in (
        ({"files": {CONFIG: good}}, None),
        ({"files": {CONFIG: base64.b64encode(b'{"block_size": NaN}').decode()}}, "config.json holds NaN"),
        ({"files": {CONFIG: "not base64!"}}, "the host's config.json did not arrive intact"),
        ({"files": {}, "errors": {CONFIG: "is not a regular file"}}, "config.json is not a regular file"),
    ):
        reader = reader_from_host_files({"draft": {"path": path, "revision": None, **entry}})
        d, plan, findings = run(hv, reader)
        text = " ".join(f.message() for f in findings)
        if expect is None:
            assert plan.block_size == 8 and plan.checkpoint["checkpoints"]["draft"]["read"] == "host"
        else:
            assert expect in text, text
    for junk in (None, [], {"draft": "x"}, {"evil": {"path": "/x"}}, {"draft": {"path": 3}}):
        assert reader_from_host_files(junk)._cache == {}


# --- numbers out of range and wrong types are findings, never a crash or a skip --

@pytest.mark.parametrize("data, why", [
    (b'{"vocab_size": ' + b"9" * 5000 + b"}", "holds an integer of 5000 digits"),  # past Python's int-string limit
    (b'{"hidden_size": ' + b"1" + b"0" * 200 + b"}", "holds an integer of 201 digits"),
    (b'{"hidden_size": 1e400}', "holds the number 1e400, which overflows a float"),
])
def test_parse_refuses_numbers_no_config_holds(data, why):
    with pytest.raises(CheckpointFileError, match=why):
        parse_json_object(data, CONFIG)


@pytest.mark.parametrize("change, why", [
    ({"hidden_size": 10**20, "vocab_size": 10**20, "intermediate_size": 10**20},
     "has hidden_size = 100000000000000000000: out of range (1..2**40-1)"),
    ({"num_hidden_layers": 0}, "has num_hidden_layers = 0: out of range"),
    ({"vocab_size": "151936"}, "has vocab_size = '151936' (string): an integer 1..2**40-1 expected"),
    ({"head_dim": 128.0}, "has head_dim = 128.0 (number): an integer"),
    ({"max_position_embeddings": True}, "has max_position_embeddings = True (boolean): an integer"),
    ({"layer_types": 5}, "has layer_types = 5 (int): a list of strings expected"),
    ({"architectures": "Qwen3ForCausalLM"}, "has architectures = 'Qwen3ForCausalLM' (string): a list of strings"),
    ({"text_config": [1]}, "has text_config = [1] (list): an object expected"),
    ({"text_config": {"hidden_size": -1}}, "has text_config.hidden_size = -1: out of range"),
    ({"torch_dtype": 2}, "has torch_dtype = 2 (int): a string expected"),
    ({"tie_word_embeddings": "no"}, "has tie_word_embeddings = 'no' (string): true or false expected"),
])
def test_config_field_types_and_ranges_are_findings(tmp_path, change, why):
    """Each is one error naming the file, field and value; the memory estimate never overflows."""
    d = _copy(QWEN3_8B, tmp_path / "m", **change)
    _, plan, findings = run(hostvars(d))
    msgs = rules_of(findings)
    assert [why in m for m in msgs].count(True) == 1, msgs
    json.dumps(plan.checkpoint)  # finite numbers throughout


def test_draft_block_size_of_the_wrong_type_is_a_finding_not_ok(tmp_path):
    d = _copy(DFLASH_DRAFT, tmp_path / "d", block_size="16")
    _, _, findings = run(hostvars(QWEN3_8B, d, spec={"block_size": 16}))
    assert any("ddtree_speculative.draft_model_path" in m and "has block_size = '16' (string)" in m
               for m in rules_of(findings)), rules_of(findings)
    d2 = _copy(DFLASH_DRAFT, tmp_path / "d2", dflash_config={"block_size": [16]})
    _, _, findings = run(hostvars(QWEN3_8B, d2, spec={"block_size": 16}))
    assert any("has dflash_config.block_size = [16] (list)" in m for m in rules_of(findings)), rules_of(findings)


@pytest.mark.parametrize(
    "index, why",
    [
        ('{"metadata": {"total_size": 1e400}, "weight_map": {}}', "holds the number 1e400"),
        (
            '{"metadata": {"total_size": "16381470720"}, "weight_map": {}}',
            "metadata.total_size = '16381470720' (string)",
        ),
        (
            '{"metadata": {"total_size": ' + str(2**60) + '}, "weight_map": {}}',
            "metadata.total_size = 1152921504606846976: out of range",
        ),
        ('{"metadata": 3, "weight_map": {}}', "has metadata = 3 (int): an object expected"),
    ],
)
def test_index_total_size_of_the_wrong_type_or_range_is_a_finding(tmp_path, index, why):
    d = _copy(QWEN3_8B, tmp_path / "m")
    (d / INDEX).write_text(index)
    _, plan, findings = run(hostvars(d))
    assert [why in m for m in rules_of(findings)].count(True) == 1, rules_of(findings)
    assert plan.checkpoint["memory"]["weights_source"].startswith("target: config")


def test_sizes_at_the_bound_do_not_overflow_the_estimate(tmp_path):
    big = 2**40 - 1
    d = _copy(QWEN3_8B, tmp_path / "m", hidden_size=big, vocab_size=big, intermediate_size=big, num_hidden_layers=big)
    _, plan, _ = run(hostvars(d))
    assert plan.checkpoint["memory"]["gib"]["weights_per_gpu"] > 0


def test_memory_is_checked_against_the_derived_fraction_when_unset():
    """With mem_fraction_static unset the memory check used to be skipped; it now runs against
    the fraction the pinned release derives (0.5.17 on a 96 GB ct200 at tp 1: at most
    (98304 - 13440) / 98304 = 0.863), which weights + KV for 256 x 4096 tokens exceed."""
    hv = hostvars(LLAMA31, host_class="ct200", model={"context_length": 4096},
                  server={"tp_size": 1, "max_running_requests": 256, "cuda_graph_max_bs": 256})
    hv["ddtree_sglang"] = {"source": "pypi", "version": "0.5.17"}
    _, plan, findings = run(hv)
    assert plan.derived["mem_fraction_static"]["value"] == round((98304 - 13440) / 98304, 3)
    mem = plan.checkpoint["memory"]
    assert mem["budget"] == int(plan.derived["mem_fraction_static"]["value"] * 96 * (1 << 30))
    assert "0.5.17" in mem["budget_from"] and "_handle_gpu_memory_settings" in mem["budget_from"]
    warned = [f for f in findings if f.level == "warning" and f.field == "ddtree_server.mem_fraction_static"]
    assert warned and "derived mem_fraction_static (an upper bound) leaves" in warned[0].rule
    assert warned[0].value is None
    # half the context fits: no warning
    hv["ddtree_model"]["context_length"] = 2048
    _, _, findings = run(hv)
    assert not [f for f in findings if f.field == "ddtree_server.mem_fraction_static"]


@pytest.mark.parametrize("frac", [0.95, 0.97])
def test_the_memory_warning_never_advises_raising_a_fraction_already_at_sglangs_ceiling(frac):
    """'raise ... mem_fraction_static' was advised at 0.95, past what SGLang itself would use (the rest holds
    activations and CUDA graph buffers)."""
    hv = hostvars(LLAMA31, EAGLE3_HEAD, algorithm="EAGLE3", host_class="ct200",
                  model={"context_length": 131072}, server={"tp_size": 1, "mem_fraction_static": frac})
    from ddtree_ops.config import ConfigError

    try:
        _, _, findings = run(hv)
    except ConfigError as exc:
        findings = exc.findings
    texts = [f.message() for f in findings if f.field == "ddtree_server.mem_fraction_static"]
    assert texts, "no memory finding"
    for t in texts:
        assert "raise tp_size / mem_fraction_static" not in t and "or raise tp_size or mem_fraction_static" not in t
    assert any("already at or above" in t or "outside the static pool" in t for t in texts)


def test_the_memory_warning_still_offers_a_higher_fraction_below_the_ceiling():
    hv = hostvars(LLAMA31, EAGLE3_HEAD, algorithm="EAGLE3", host_class="ct200",
                  model={"context_length": 2048}, server={"tp_size": 1, "mem_fraction_static": 0.5,
                                                          "max_running_requests": 256, "cuda_graph_max_bs": 256})
    _, _, findings = run(hv)
    warn = [f.message() for f in findings if f.level == "warning" and "exceed the" in f.message()]
    assert warn and "raise tp_size / mem_fraction_static (up to 0.8" in warn[0]


@pytest.mark.parametrize(("frac", "level"), [(0.99, "error"), (0.985, "error"), (0.97, "warning"), (0.95, None)])
def test_a_fraction_that_leaves_no_room_for_graph_capture_is_refused(frac, level):
    """mem_fraction_static 0.99 with a small KV passed: graph capture then runs out of memory
    (sgl-project/sglang#6875). Graph buffers and activations are counted outside the static pool."""
    from helpers import base_hostvars

    from ddtree_ops.config import ConfigError, validate_hostvars

    hv = base_hostvars()  # b300: 288 GB GPUs, tp 8
    hv["ddtree_server"]["mem_fraction_static"] = frac
    try:
        found = [f for f in validate_hostvars("h1", hv).warnings if f.field == "ddtree_server.mem_fraction_static"]
    except ConfigError as exc:
        found = [f for f in exc.findings if f.field == "ddtree_server.mem_fraction_static"]
    assert [f.level for f in found] == ([level] if level else [])
    if level:
        text = found[0].message()
        assert "outside the static pool" in text and "lower mem_fraction_static to 0." in text
        assert "sgl-project/sglang#6875" in text
