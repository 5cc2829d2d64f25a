"""The capability probe against REAL released SGLang (0.5.13.post1 and 0.5.23).

The packages come from the cached venvs of ``scripts/sglang-venv.sh`` (built once, CPU
torch; nothing GPU). ddtree-ops is put on the probe's path with PYTHONPATH, standing in
for the ``--no-deps`` install the sglang role makes in a real SGLang venv (those shared
venvs are never modified).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import base_hostvars

from ddtree_ops.config import validate_hostvars
from ddtree_ops.config.versions import RELEASES, build_facts
from ddtree_ops.sglang.expect import probe_request, run_probe

REPO = Path(__file__).resolve().parents[1]
VERSIONS = ["0.5.13.post1", "0.5.23"]


@pytest.fixture(scope="session")
def sglang_python() -> dict[str, str]:
    """Version -> python of the cached venv with that real SGLang release."""
    out = {}
    for v in VERSIONS:
        proc = subprocess.run(["bash", str(REPO / "scripts" / "sglang-venv.sh"), v],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            pytest.fail(f"scripts/sglang-venv.sh {v} failed: {proc.stderr[-2000:]}", pytrace=False)
        out[v] = proc.stdout.strip().splitlines()[-1] + "/bin/python"
    return out


@pytest.fixture(autouse=True)
def _ddtree_ops_on_probe_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def dflash(version: str, **server) -> dict:
    hv = copy.deepcopy(base_hostvars())
    hv["ddtree_sglang"] = {"source": "pypi", "version": version}
    hv["ddtree_speculative"] = {"algorithm": "DFLASH", "draft_model_path": "z-lab/Kimi-K2.6-DFlash", "block_size": 8}
    hv["ddtree_server"] = {"tp_size": 8, "max_running_requests": 16, **server}
    hv.pop("ddtree_accepted_risks")
    return hv


def ddtree_on_release(version: str, source: str) -> dict:
    hv = copy.deepcopy(base_hostvars())
    hv["ddtree_sglang"] = {"source": "pypi", "version": version, "ddtree_source": source}
    return hv


def probe(python: str, hv: dict) -> tuple[int, dict, dict]:
    v = validate_hostvars("h1", hv)
    req = probe_request(v)
    rc, result = run_probe(python, req, timeout_s=300)
    return rc, {c["name"]: c for c in result["checks"]}, req


@pytest.mark.parametrize("version", VERSIONS)
def test_dflash_argv_parses_in_its_dialect(sglang_python, version):
    rc, checks, req = probe(sglang_python[version], dflash(version))
    flag = build_facts(version).dialect.max_bs_flag
    assert flag in req["argv"] and "--speculative-algorithm" in req["argv"]
    assert rc == 0, checks
    assert checks["sglang-version"]["detail"] == f"SGLang {version}"
    assert checks["argv-parses"]["ok"] and "flags accepted by SGLang" in checks["argv-parses"]["detail"]
    assert checks["speculative-algorithms"]["ok"] and checks["speculative-algorithms"]["ddtree"] is False
    assert checks["verify-graph-sizing"]["ok"]


@pytest.mark.parametrize("version", VERSIONS)
def test_versions_table_matches_the_real_package(sglang_python, version):
    rc, checks, _ = probe(sglang_python[version], dflash(version))
    assert tuple(checks["speculative-algorithms"]["algorithms"]) == RELEASES[version].speculative_algorithms
    assert "DDTREE" not in checks["speculative-algorithms"]["algorithms"]


@pytest.mark.parametrize(("version", "source"), [("0.5.13.post1", "sglang-pr-27509"), ("0.5.23", "sglang-pr-29907")])
def test_release_has_no_ddtree(sglang_python, version, source):
    """A DDTree deployment on a plain release: DDTREE missing, named with the pin that fixes it;
    every other flag (minus the DDTree-only budget flag) still parses."""
    rc, checks, req = probe(sglang_python[version], ddtree_on_release(version, source))
    assert "--speculative-ddtree-budget" in req["argv"]
    assert rc == 1
    algos = checks["speculative-algorithms"]
    assert not algos["ok"] and algos["ddtree"] is False
    assert (
        "does not know DDTREE" in algos["detail"]
        and "source: git" in algos["detail"]
        and source[-5:] in algos["detail"]
    )
    assert checks["argv-parses"]["ok"], checks["argv-parses"]
    assert "--speculative-ddtree-budget checked against the versions table" in checks["argv-parses"]["detail"]


def test_wrong_dialect_is_rejected_by_name(sglang_python):
    """The legacy --cuda-graph-max-bs (pin 0.5.13.post1) on a real 0.5.23 build: ambiguous."""
    rc, checks, req = probe(sglang_python["0.5.23"], dflash("0.5.13.post1"))
    assert "--cuda-graph-max-bs" in req["argv"]
    assert rc == 1
    parse = checks["argv-parses"]
    assert not parse["ok"] and parse["ambiguous"] == ["--cuda-graph-max-bs", "--cuda-graph-bs"]
    assert "ambiguous: --cuda-graph-max-bs --cuda-graph-bs" in parse["detail"] and "Fix:" in parse["detail"]
    assert not checks["sglang-version"]["ok"] and "pin says 0.5.13.post1" in checks["sglang-version"]["detail"]


def test_new_dialect_unrecognized_by_old_build(sglang_python):
    rc, checks, _ = probe(sglang_python["0.5.13.post1"], dflash("0.5.23"))
    assert rc == 1
    assert checks["argv-parses"]["unrecognized"] == ["--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode"]


def _ddtree_ops_copy(dest: Path, with_entry_point: bool) -> Path:
    """A copy of the ddtree_ops package on its own path; with ``with_entry_point`` a
    dist-info registers our ``sglang.srt.plugins`` entry point there (as the sglang role's
    ``--no-deps`` install does), without it SGLang would not discover the plugin. (The repo
    root itself may hold an ``ddtree_ops.egg-info`` from a wheel build, so it is not used.)"""
    shutil.copytree(REPO / "ddtree_ops", dest / "ddtree_ops", ignore=shutil.ignore_patterns("__pycache__"))
    if with_entry_point:
        info = dest / "ddtree_ops-0.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddtree-ops\nVersion: 0.0.0\n")
        (info / "entry_points.txt").write_text(
            "[sglang.srt.plugins]\nddtree_ops_verify_graph = ddtree_ops.sglang.plugin:register\n")
    return dest


def _unsized_request() -> dict:
    """A graphs-on DDTree deployment on sglang-pr-27509 (the validator accepts it with a
    warning: the plugin must ride along, which is what the probe checks)."""
    req = probe_request(validate_hostvars("h1", ddtree_on_release("0.5.13.post1", "sglang-pr-27509")))
    assert req["needs_verify_sizing"] is True
    return req


def test_unsized_ddtree_build_without_plugin_is_stopped(sglang_python, tmp_path, monkeypatch):
    """pr-27509 sizes verify graphs from block_size: with graphs on and no plugin the probe
    fails and names the pin that fixes it."""
    monkeypatch.setenv("PYTHONPATH", str(_ddtree_ops_copy(tmp_path, with_entry_point=False)))
    monkeypatch.chdir(tmp_path)  # `python -m` puts the cwd on sys.path
    rc, result = run_probe(sglang_python["0.5.13.post1"], _unsized_request())
    checks = {c["name"]: c for c in result["checks"]}
    assert rc == 1 and not checks["verify-graph-sizing"]["ok"]
    assert "sglang-pr-29907" in checks["verify-graph-sizing"]["detail"]
    assert "plugin" in checks["verify-graph-sizing"]["detail"]
    assert result["plugin"]["summary"].startswith("not installed")


def test_unsized_ddtree_build_with_plugin_installed_passes(sglang_python, tmp_path, monkeypatch):
    """The same build with our entry point discoverable: the plugin resizes, the probe says so."""
    monkeypatch.setenv("PYTHONPATH", str(_ddtree_ops_copy(tmp_path, with_entry_point=True)))
    monkeypatch.chdir(tmp_path)
    rc, result = run_probe(sglang_python["0.5.13.post1"], _unsized_request())
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["verify-graph-sizing"]["ok"], checks["verify-graph-sizing"]
    assert "plugin resizes" in checks["verify-graph-sizing"]["detail"]
    assert result["plugin"]["summary"].startswith("installed")
    assert "would hook 2 width function(s)" in result["plugin"]["summary"]


def test_cli_probe_sglang_json(sglang_python):
    """``ddtree-ops probe-sglang -i inventory/test --python ...``: the simulator host's argv
    (DDTree, budget 32) against real 0.5.23 minus the DDTree-only flag."""
    proc = subprocess.run([sys.executable, "-m", "ddtree_ops", "probe-sglang", "-i", "inventory/test", "-l", "ddt-th1",
                           "--python", sglang_python["0.5.23"], "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert [c["name"] for c in doc["checks"]] == ["sglang-version", "speculative-algorithms", "argv-parses",
                                                  "sglang-resolution", "verify-graph-sizing"]
    res = {c["name"]: c for c in doc["checks"]}["sglang-resolution"]
    assert res["ok"] and res["state"] == "not-run"
    assert res["detail"].startswith("parsed only; resolution not run: this build has no DDTREE")
    assert "resolved by" not in res["detail"]
    assert doc["version"] == "0.5.23" and doc["host"] == "ddt-th1"


def test_cli_probe_sglang_bad_python(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ddtree_ops", "probe-sglang", "-i", "inventory/test",
                           "--python", str(tmp_path / "nope"), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert json.loads(proc.stdout)["checks"][0]["detail"].startswith(
        f"--python {tmp_path / 'nope'}: no such interpreter"
    )


def test_cli_probe_sglang_from_plan(sglang_python, tmp_path):
    subprocess.run([sys.executable, "-m", "ddtree_ops", "render", "-i", "inventory/test", "--out", str(tmp_path)],
                   cwd=REPO, check=True, capture_output=True)
    plan = tmp_path / "ddt-th1" / "etc/ddtree-ops/sglang/plan.json"
    proc = subprocess.run([sys.executable, "-m", "ddtree_ops", "probe-sglang", "--plan", str(plan),
                           "--python", sglang_python["0.5.23"]], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok   argv-parses" in proc.stdout


def test_probe_module_imports_only_the_stdlib():
    """The SGLang venv holds ddtree-ops --no-deps: importing the probe (and the package
    __init__ files) must not pull pydantic, typer, packaging or any other third-party module."""
    code = ("import sys; before = set(sys.modules); import ddtree_ops.sglang.probe; "
            "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
            "print(sorted(m for m in new if m != 'ddtree_ops' and m not in sys.stdlib_module_names))")
    proc = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); {code}"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
