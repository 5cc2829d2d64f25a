"""plan.json as a typed contract: the writer (``render.files.plan_document``)
and the one loader (``config.plandoc_model.load_plan`` -> ``PlanDoc``) agree on every shipped
inventory; every reader refuses a bad field with the same line; a newer ``schema_version`` is
refused; documents of earlier writers (``tests/fixtures/plan/``) are read as version 1 where
honest; and the preflight's standard-library check accepts exactly what ``PlanDoc`` accepts on
the fields it reads."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO
from prometheus_client import CollectorRegistry

from ddtree_ops.cli import main
from ddtree_ops.config import validate_hostvars
from ddtree_ops.config.errors import ConfigError
from ddtree_ops.config.inventory import load_hostvars
from ddtree_ops.config.plandoc_model import SCHEMA_VERSION, PlanDoc, PlanDocError, load_plan
from ddtree_ops.host import preflight as pf
from ddtree_ops.render.files import plan_document, render_host
from ddtree_ops.runtime.drift import find_drift
from ddtree_ops.runtime.exporter import Exporter
from ddtree_ops.runtime.health import HealthOptions
from ddtree_ops.runtime.warmup import warmup_plan

PLANS = REPO / "tests" / "fixtures" / "plan"
INVENTORIES = sorted(p.name for p in (REPO / "inventory").iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def rendered() -> dict[str, tuple]:
    """``{inventory/host: (Validated, plan.json text)}`` of every shipped inventory, as render writes it."""
    out = {}
    for inv in INVENTORIES:
        for host, hv in load_hostvars(REPO / "inventory" / inv).items():
            v = validate_hostvars(host, hv)
            [text] = [f.content for f in render_host(v) if f.path.endswith("/plan.json")]
            out[f"{inv}/{host}"] = (v, text)
    return out


def good_doc(rendered) -> dict:
    return json.loads(rendered["example/b300-01"][1])


def test_every_shipped_inventory_round_trips_writer_to_loader(rendered, tmp_path):
    assert set(INVENTORIES) >= {"example", "test", "dflash-example", "multi-example"} and len(rendered) >= 8
    for name, (v, text) in rendered.items():
        path = tmp_path / "plan.json"
        path.write_text(text)
        doc = load_plan(path)
        d = v.deployment
        assert doc.document == json.loads(text), name
        assert doc.schema_version == SCHEMA_VERSION and doc.document["schema_version"] == SCHEMA_VERSION
        # derived values written once, by the writer, from the config model's own properties
        assert doc.url == d.server.local_url and doc.sglang_base_version == d.sglang.base_version, name
        assert (doc.host, doc.host_class, doc.unit) == (d.host, d.host_class, d.service.unit_name)
        assert doc.plan.capture_bs == v.plan.capture_bs and doc.plan.algorithm == v.plan.algorithm
        assert doc.plan.verify_tokens_per_req == v.plan.verify_tokens_per_req
        assert doc.deployment.ops.model_dump() == d.ops.model_dump(), name
        assert doc.deployment.server.tp_size == d.server.tp_size and doc.deployment.server.port == d.server.port
        assert doc.model_name == (d.model.served_model_name or d.model.path)
        assert (doc.paths.state, doc.paths.cache) == (d.service.state_path, d.service.cache_path)
        # the in-memory path (-i/-l) gives the same typed view
        assert PlanDoc.of(plan_document(v)) == doc


BAD_FIELDS = [
    ("plan.capture_bs", [0, 8], "plan.capture_bs.0 = 0"),
    ("plan.capture_bs", "1,2", "plan.capture_bs = '1,2'"),
    ("plan.cuda_graphs", "yes", "plan.cuda_graphs = 'yes'"),
    ("plan.algorithm", "MEDUSA", "plan.algorithm = 'MEDUSA'"),
    ("deployment.ops.health_timeout_s", "abc", "deployment.ops.health_timeout_s = 'abc'"),
    ("deployment.ops.accept_length_floor", 1e300, "deployment.ops.accept_length_floor = 1e+300"),
    ("deployment.ops.exporter_port", 80, "deployment.ops.exporter_port = 80"),
    ("deployment.model.context_length", -5, "deployment.model.context_length = -5"),
    ("deployment.server.tp_size", True, "deployment.server.tp_size = True"),
    ("url", "http://admin:SEKRITpw@127.0.0.1:9", "url = 'http://(redacted)@127.0.0.1:9'"),
    ("url", "http://127.0.0.1:30000/?token=SEKRIT", "url = "),
    ("host_class", "h200", "host_class = 'h200'"),
    ("schema_version", "1", "schema_version = '1'"),
    ("schema_version", 0, "schema_version = 0"),
]


def mutated(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    *parents, last = path.split(".")
    cur = doc
    for k in parents:
        cur = cur[k]
    if value is _ABSENT:
        del cur[last]
    else:
        cur[last] = value
    return doc


_ABSENT = object()
READERS = [["health", "--failures", "1", "--timeout", "1"], ["warmup", "--batch-sizes", "1"], ["bench"],
           ["exporter", "--listen", "127.0.0.1:0"], ["probe-sglang"]]


@pytest.mark.parametrize("path, value, shown", BAD_FIELDS, ids=lambda x: str(x)[:30])
def test_every_reader_refuses_a_bad_field_with_the_same_line(rendered, tmp_path, capsys, path, value, shown):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(mutated(good_doc(rendered), path, value)))
    lines = set()
    for argv in READERS:
        url = ["http://127.0.0.1:9"] if argv[0] in ("health", "warmup", "bench") else []
        assert main([argv[0], *url, "--plan", str(plan), *argv[1:]]) == 2, argv
        io = capsys.readouterr()
        assert io.out == "" and io.err.count("\n") == 1, io
        lines.add(io.err)
    [line] = lines  # one line, the same for every command
    assert line.startswith(f"error --plan {plan}: {path.split('.')[0]}") and shown in line, line
    assert "not a plan.json rendered by ddtree-ops" in line and "Fix: re-render it" in line
    assert "SEKRIT" not in line and "Traceback" not in line
    # ... and the library readers raise the one error type (a ConfigError) with the same words
    bad = mutated(good_doc(rendered), path, value)
    messages = set()
    for reader in (lambda: Exporter(bad, registry=CollectorRegistry()), lambda: find_drift(bad, {}),
                   lambda: warmup_plan(bad), lambda: HealthOptions(plan_doc=bad), lambda: PlanDoc.of(bad)):
        with pytest.raises(PlanDocError) as exc:
            reader()
        assert isinstance(exc.value, ConfigError) and exc.value.field.startswith(path.split(".")[0])
        messages.add(str(exc.value))
    [message] = messages
    assert message.startswith("--plan <rendered>: ") and shown in message


def test_json_output_of_a_bad_plan_is_one_config_error(rendered, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(mutated(good_doc(rendered), "plan.capture_bs", [0])))
    assert main(["health", "http://127.0.0.1:9", "--plan", str(plan), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and len(out["checks"]) == 1 and "plan.capture_bs.0 = 0" in out["checks"][0]["detail"]
    assert out["errors"][0]["field"] == f"--plan {plan}: plan.capture_bs.0"


@pytest.mark.parametrize("extra", [{}, {"plan": {"renamed": True}}])
def test_a_newer_schema_version_is_refused_before_any_field(rendered, tmp_path, capsys, extra):
    doc = good_doc(rendered) | {"schema_version": SCHEMA_VERSION + 1} | extra
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    want = (f"plan.json schema_version {SCHEMA_VERSION + 1} is newer than this ddtree-ops ({SCHEMA_VERSION}): "
            "upgrade ddtree-ops on this host")
    with pytest.raises(PlanDocError) as exc:
        load_plan(plan)
    assert str(exc.value) == f"--plan {plan}: {want}" and exc.value.problem == want
    for argv in READERS:
        assert main([argv[0], "--plan", str(plan), *argv[1:]]) == 2
        assert capsys.readouterr().err == f"error --plan {plan}: {want}\n"


def test_a_newer_writers_added_fields_are_ignored(rendered, tmp_path):
    """Same schema_version, more fields (what a newer minor writes): read; kept in .document."""
    doc = good_doc(rendered)
    doc["added_later"] = {"x": 1}
    doc["plan"]["new_size"] = 7
    doc["deployment"]["ops"]["new_knob"] = "on"
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    typed = load_plan(plan)
    assert typed.document["added_later"] == {"x": 1} and not hasattr(typed.plan, "new_size")
    assert typed.model_dump() == PlanDoc.of(good_doc(rendered)).model_dump()


@pytest.mark.parametrize("name, rendered_as", [("v1-dab7f1d-example-b300-01.json", "example/b300-01"),
                                                ("v1-dab7f1d-multi-example-ct200-01-qwen8b.json",
                                                 "multi-example/ct200-01-qwen8b")])
def test_documents_of_the_previous_writer_are_version_1(rendered, name, rendered_as):
    """Written before schema_version and sglang_base_version existed (commit dab7f1d): read as
    version 1, the derived base version from the same property; the typed view equals today's."""
    raw = json.loads((PLANS / name).read_text())
    assert "schema_version" not in raw and "sglang_base_version" not in raw
    doc = load_plan(PLANS / name)
    v, text = rendered[rendered_as]
    assert doc.schema_version == 1 and doc.sglang_base_version == v.deployment.sglang.base_version
    assert doc.model_dump() == PlanDoc.of(json.loads(text)).model_dump()  # the typed view of today's writer
    assert pf.expect_from(None, raw).unit == doc.unit


def test_a_document_from_before_paths_is_refused_by_both_readers_naming_paths(capsys):
    """d88f681 wrote no ``paths`` (nor exporter_unit): the preflight has always required it, so
    such a document is not version 1; both readers refuse it naming the field."""
    f = PLANS / "v0-d88f681-example-b300-01.json"
    with pytest.raises(PlanDocError) as exc:
        load_plan(f)
    assert exc.value.field == "paths"
    assert "paths = None: not a plan.json rendered by ddtree-ops: is absent: must be an object" in str(exc.value)
    with pytest.raises(pf.PreflightUsageError, match="paths"):
        pf.expect_from(None, json.loads(f.read_text()))


# ---- the preflight's stdlib reader accepts exactly what PlanDoc accepts on its fields ----------
PREFLIGHT_CASES = [
    ("host_class", v) for v in ("b300", "ct200", "h200", 7, None, ["b300"])] + [
    ("unit", v) for v in ("ddtree-x.service", "x", "--host=root@1.service", 5, None)] + [
    ("exporter_unit", v) for v in ("ddtree-x-exporter.service", None, _ABSENT, "x y", 3)] + [
    ("deployment.server.port", v) for v in (1023, 1024, 30000, 65535, 65536, 30000.0, "30000", True, None)] + [
    ("deployment.server.host", v) for v in ("::", None, "h" * 254, {}, _ABSENT)] + [
    ("deployment.server", v) for v in ("x", None)] + [
    ("deployment.ops", v) for v in (None, {}, [1])] + [
    ("deployment.ops.exporter_port", v) for v in (19400, 80, 70000, None, _ABSENT, "19400", False)] + [
    ("deployment.model", v) for v in (None, [], _ABSENT)] + [
    ("deployment.model.path", v) for v in ("/models/m", "org/m", "", None, 3, "a\x00b", "p" * 4097)] + [
    ("paths", v) for v in (None, {}, [])] + [
    ("paths.state", v) for v in ("/var/lib/x", "rel/x", None, 7, _ABSENT)] + [
    ("paths.cache", v) for v in ("/var/cache/x", "", None)] + [
    ("plan.toolchain", v) for v in (None, {}, [], _ABSENT)] + [
    ("plan.toolchain.cuda", v) for v in ("13.0", 13.0, None, "13.0.x")] + [
    ("plan.toolchain.target", v) for v in ("sm_103a", "sm_x", None)] + [
    ("plan.toolchain.ptxas", v) for v in ("/usr/local/cuda/bin/ptxas", "ptxas")] + [
    ("plan.toolchain.ptxas_env", v) for v in ({"TRITON_PTXAS_PATH": "/x"}, {"TRITON_PTXAS_PATH": True}, ["x"])] + [
    ("plan", v) for v in (None, [])] + [
    ("deployment", v) for v in (None, "x")] + [
    ("deployment.host_classes", v) for v in (
        {}, None, [], "x", {"b300": {"gpu_memory_gib": 270}}, {"b300": {"gpu_count": 0}}, {"x1": {"like": "nope"}},
        {"h200x4": {"like": "h200x8", "gpu_count": 4}}, {"Bad": {"like": "b300"}}, {"b300": []},
        {"b300": {"gpu_memory_gib": 270, "added_later": 1}}, {"lab": {"gpu_name": "NVIDIA H200"}})]


def _preflight_accepts(doc: dict) -> bool:
    try:
        pf.expect_from(None, doc)
    except pf.PreflightUsageError:
        return False
    return True


def _model_accepts(doc: dict) -> bool:
    try:
        PlanDoc.of(doc)
    except PlanDocError:
        return False
    return True


def test_preflight_and_plandoc_accept_the_same_documents(rendered):
    docs = [(name, json.loads(text)) for name, (_, text) in rendered.items()]
    docs += [(f.name, json.loads(f.read_text())) for f in sorted(PLANS.glob("*.json"))]
    base = good_doc(rendered)
    docs += [(f"{path}={value!r:.40}", mutated(base, path, value)) for path, value in PREFLIGHT_CASES]
    for name, classes in (("h200x4", {"h200x4": {"like": "h200x8", "gpu_count": 4}}), ("h200x4", {}),
                          ("lab", {"lab": {"like": "h200x1"}}), ("lab", {"lab": {"like": "h200x1", "gpu_count": 99}})):
        doc = mutated(mutated(base, "deployment.host_classes", classes), "host_class", name)
        docs.append((f"host_class={name} with {classes!r:.60}", doc))
    verdicts = {name: (_preflight_accepts(doc), _model_accepts(doc)) for name, doc in docs}
    assert all(a == b for a, b in verdicts.values()), {k: v for k, v in verdicts.items() if v[0] != v[1]}
    # the cases cut both ways (the comparison is not vacuous)
    assert {a for a, _ in verdicts.values()} == {True, False}
    assert sum(not a for a, _ in verdicts.values()) >= 40 and sum(a for a, _ in verdicts.values()) >= 25


def test_preflight_zipapp_agrees_on_the_same_files(rendered, tmp_path):
    """The zipapp (bare python3, no pydantic) against the same files: exit 2 exactly where PlanDoc refuses."""
    app = pf.build_zipapp(str(tmp_path / "preflight.pyz"))
    base = good_doc(rendered)
    cases = {"good": base, "port-1023": mutated(base, "deployment.server.port", 1023),
             "exporter-port-null": mutated(base, "deployment.ops.exporter_port", None),
             "old-d88f681": json.loads((PLANS / "v0-d88f681-example-b300-01.json").read_text())}
    for name, doc in cases.items():
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps(doc))
        r = subprocess.run([sys.executable, "-I", "-S", app, "--plan", str(f), "--nvidia-smi", str(tmp_path / "none"),
                            "--json"], capture_output=True, text=True, timeout=120)
        assert (r.returncode != 2) == _model_accepts(doc), (name, r.returncode, r.stdout[-400:], r.stderr[-400:])


def test_file_level_problems_are_the_same_error_type(tmp_path: Path):
    for text, words in (("[" * 100_000, "nested deeper than 64"), ('{"plan": 1}', "no 'plan' object"),
                        ("{", "not JSON")):
        f = tmp_path / "plan.json"
        f.write_text(text)
        with pytest.raises(PlanDocError) as exc:
            load_plan(f)
        assert words in str(exc.value) and str(exc.value).startswith(f"--plan {f}: ") and "\n" not in str(exc.value)


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, 10**18, 0, -1, "1", True, 1.0, None])
def test_preflight_and_diagnose_apply_the_schema_version_rule_too(rendered, tmp_path, capsys, version):
    """The standard-library readers (preflight's zipapp, diagnose) read schema_version by the
    same rule as the typed loader: a newer version or one that is no integer >= 1 is refused (exit 2)."""
    from ddtree_ops.host.diagnose import DiagnoseError
    from ddtree_ops.host.diagnose import load_plan as diagnose_plan
    from ddtree_ops.host.preflight import PreflightUsageError
    from ddtree_ops.host.preflight import load_plan as preflight_plan

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(good_doc(rendered) | {"schema_version": version}))
    with pytest.raises(PlanDocError):
        load_plan(plan)
    for reader, error in ((preflight_plan, PreflightUsageError), (diagnose_plan, DiagnoseError)):
        with pytest.raises(error) as exc:
            reader(str(plan))
        assert "schema_version" in str(exc.value) and "\n" not in str(exc.value)
    log = tmp_path / "x.log"
    log.write_text("hello\n")
    assert main(["diagnose", "--file", str(log), "--plan", str(plan)]) == 2
    assert "schema_version" in capsys.readouterr().err
