"""Toolchain data, rules, plan, driver check, reboot guard and ptxas checks.

The ptxas tests run the REAL ptxas binaries of NVIDIA's PyPI wheels (12.8.93, 12.9.86,
13.0.88; sha256-pinned in scripts/cuda_apt_standin.py, cached under /var/cache/ddtree-ops)
and the real Triton 3.6.0 wheel's own ptxas selection code.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import FIXTURES, REPO

from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.toolchain import ARCHS, CUDA_TOOLKITS, TRITONS, default_cuda, nvidia_repo, plan_toolchain
from ddtree_ops.host import ptxas as ptxas_mod
from ddtree_ops.host.toolkit import DriverCheckError, check_driver, parse_query_gpu, parse_smi_xml, reboot_decision
from ddtree_ops.render.files import service_env

PTXAS_CACHE = Path(os.environ.get("DDTREE_CACHE", "/var/cache/ddtree-ops")) / "ptxas-bin"  # as scripts/triton-venv.sh


def _standin():
    spec = importlib.util.spec_from_file_location("cuda_apt_standin", REPO / "scripts" / "cuda_apt_standin.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="session")
def real_ptxas() -> dict[str, str]:
    """CUDA version -> path of the real ptxas extracted from NVIDIA's wheel (cached by sha256)."""
    mod = _standin()
    out = {}
    for ver, (_, _, digest, inner, _) in mod.TOOLKITS.items():
        dest = PTXAS_CACHE / digest[:16] / "ptxas"
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".tmp")
            with zipfile.ZipFile(mod.wheel(ver)) as z, z.open(inner) as src, open(tmp, "wb") as dst:
                dst.write(src.read())
            tmp.chmod(0o755)
            tmp.rename(dest)
        out[ver] = str(dest)
    return out


@pytest.fixture(scope="session")
def triton_python() -> str:
    """Python of a venv holding the real Triton 3.6.0 wheel (no deps needed to pick ptxas).

    Built by ``scripts/triton-venv.sh`` (scripts/test.sh runs it in set-up, before pytest,
    so a cold run downloads nothing here; a plain ``pytest`` builds it on first use)."""
    r = subprocess.run(["bash", str(REPO / "scripts" / "triton-venv.sh")], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": sys.executable}, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


# ----------------------------------------------------------------------------- data + plan

def test_arch_minimums_and_default():
    assert (ARCHS["sm_103"].target, ARCHS["sm_103"].min_cuda, ARCHS["sm_103"].ptx_version) == ("sm_103a", "12.9", "8.8")
    assert (ARCHS["sm_120"].target, ARCHS["sm_120"].min_cuda, ARCHS["sm_120"].ptx_version) == ("sm_120a", "12.8", "8.7")
    assert default_cuda("sm_103") == default_cuda("sm_120") == "13.0"
    assert (
        CUDA_TOOLKITS["13.0"].package == "cuda-toolkit-13-0"
        and CUDA_TOOLKITS["13.0"].ptxas == "/usr/local/cuda-13.0/bin/ptxas"
    )


@pytest.mark.parametrize("arch,triton,env", [
    ("sm_103", "3.4.0", {"TRITON_PTXAS_PATH"}),     # bundled 12.8 only
    ("sm_103", "3.5.1", {"TRITON_PTXAS_PATH"}),
    ("sm_103", "3.6.0", set()),                      # ptxas-blackwell 12.9
    ("sm_103", "3.7.1", set()),
    ("sm_103", "3.9.0", set()),
    ("sm_120", "3.5.1", set()),                      # 12.8 knows sm_120a
    ("sm_90", "3.5.1", set()),
    ("sm_103", None, {"TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"}),  # unpinned: toolkit ptxas
])
def test_ptxas_override_decision(arch, triton, env):
    tc = plan_toolchain(arch, "13.0", triton)
    assert set(tc["ptxas_env"]) == env
    assert all(v == "/usr/local/cuda-13.0/bin/ptxas" for v in tc["ptxas_env"].values())
    assert tc["ptxas_reason"]


def test_triton_table_picks():
    assert TRITONS["3.6.0"].picks(103) == ("ptxas-blackwell", "12.9", "TRITON_PTXAS_BLACKWELL_PATH")
    assert TRITONS["3.6.0"].picks(90) == ("ptxas", "12.8", "TRITON_PTXAS_PATH")
    assert TRITONS["3.9.0"].picks(90) == ("ptxas-blackwell", "13.4", "TRITON_PTXAS_BLACKWELL_PATH")
    assert TRITONS["3.5.1"].picks(120) == ("ptxas", "12.8", "TRITON_PTXAS_PATH")


def test_plan_and_service_env_carry_the_override(hostvars):
    hostvars["ddtree_toolchain"] = {"cuda": "13.0", "triton": "3.5.1"}
    v = validate_hostvars("h", hostvars)
    assert v.plan.toolchain["cuda"] == "13.0" and v.plan.toolchain["target"] == "sm_103a"
    env = service_env(v)
    assert env["TRITON_PTXAS_PATH"] == "/usr/local/cuda-13.0/bin/ptxas" and "TRITON_PTXAS_BLACKWELL_PATH" not in env
    hostvars["ddtree_toolchain"]["triton"] = "3.6.0"
    assert not any(k.startswith("TRITON_PTXAS") for k in service_env(validate_hostvars("h", hostvars)))
    # the operator's explicit env still wins
    hostvars["ddtree_toolchain"]["triton"] = "3.5.1"
    hostvars["ddtree_service"] = {"env": {"TRITON_PTXAS_PATH": "/opt/cuda/bin/ptxas"}}
    assert service_env(validate_hostvars("h", hostvars))["TRITON_PTXAS_PATH"] == "/opt/cuda/bin/ptxas"


def test_default_toolchain_from_host_class(hostvars):
    assert validate_hostvars("h", hostvars).plan.toolchain["cuda"] == "13.0"
    hostvars["ddtree_host_class"] = "ct200"
    hostvars["ddtree_speculative"]["budget"] = 7
    tc = validate_hostvars("h", hostvars).plan.toolchain
    assert (tc["cuda"], tc["target"], tc["ptx_version"]) == ("13.0", "sm_120a", "8.7")


# ----------------------------------------------------------------------------- rules

def _errors(hostvars) -> list:
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h", hostvars)
    return exc.value.findings


def test_toolkit_older_than_arch_refused(hostvars):
    hostvars["ddtree_toolchain"] = {"cuda": "12.8"}
    (f,) = _errors(hostvars)
    assert (f.field, f.value) == ("ddtree_toolchain.cuda", "12.8")
    assert "sm_103a" in f.rule and "12.9" in f.rule and '"13.0"' in f.fix
    hostvars["ddtree_toolchain"] = {"cuda": "12.9"}
    validate_hostvars("h", hostvars)


def test_toolkit_12_8_fine_for_sm120(hostvars):
    hostvars.update(ddtree_host_class="ct200", ddtree_toolchain={"cuda": "12.8"})
    hostvars["ddtree_speculative"]["budget"] = 7
    assert validate_hostvars("h", hostvars).plan.toolchain["ptxas"] == "/usr/local/cuda-12.8/bin/ptxas"


@pytest.mark.parametrize("tc,field,words", [
    ({"cuda": "12.4"}, "ddtree_toolchain.cuda", "unknown CUDA toolkit"),
    ({"cuda": 13.0, "triton": "3.10.0"}, "ddtree_toolchain.triton", "unknown Triton release"),
    ({"triton": "3.3.1"}, "ddtree_toolchain.triton", "a systemd environment file cannot set"),
    ({"ptxas": "/x"}, "ddtree_toolchain.ptxas", "unknown setting"),
])
def test_bad_toolchain_input(hostvars, tc, field, words):
    hostvars["ddtree_toolchain"] = tc
    (f,) = _errors(hostvars)
    assert f.field == field and words in f.rule and f.fix


def test_float_cuda_from_yaml_accepted(hostvars):
    hostvars["ddtree_toolchain"] = {"cuda": 13.0}
    assert validate_hostvars("h", hostvars).plan.toolchain["cuda"] == "13.0"


# ----------------------------------------------------------------------------- repo mapping

@pytest.mark.parametrize("facts,path", [
    (("Debian", "12.7", "x86_64"), "debian12/x86_64"),
    (("Ubuntu", "22.04", "x86_64"), "ubuntu2204/x86_64"),
    (("Ubuntu", "24.04", "aarch64"), "ubuntu2404/sbsa"),
])
def test_nvidia_repo_paths(facts, path):
    repo = nvidia_repo(*facts)
    assert repo.path == path
    assert repo.list_file == f"/etc/apt/sources.list.d/cuda-{path.replace('/', '-')}.list"
    assert repo.url("http://mirror/cuda/") == f"http://mirror/cuda/{path}/"


@pytest.mark.parametrize(
    "facts", [("CentOS", "9", "x86_64"), ("Ubuntu", "20.04", "x86_64"), ("Debian", "12", "ppc64le")]
)
def test_nvidia_repo_unsupported(facts):
    with pytest.raises(ValueError, match="no NVIDIA CUDA repository"):
        nvidia_repo(*facts)


# ----------------------------------------------------------------------------- driver

def test_parse_fixture_csv_with_header():
    (g,) = parse_query_gpu((FIXTURES / "gpu" / "h200x1_query_gpu.csv").read_text())
    assert (g.driver_version, g.compute_cap, g.arch, g.name) == ("580.159.04", "9.0", "sm_90", "NVIDIA H200")


def test_parse_fixture_xml():
    gpus = parse_smi_xml((FIXTURES / "gpu" / "h200x2_nvidia_smi_q.xml").read_text())
    assert [g.driver_version for g in gpus] == ["580.159.04", "580.159.04"]
    assert all(g.name == "NVIDIA H200" for g in gpus)


def test_check_driver_on_fixture_driver():
    driver = parse_query_gpu((FIXTURES / "gpu" / "h200x1_query_gpu.csv").read_text())[0].driver_version
    noheader = f"{driver}, 9.0\n{driver}, 9.0\n"
    assert len(check_driver(noheader, 0, "13.0", "sm_90")) == 2
    with pytest.raises(DriverCheckError, match="GPUs are sm_90 but the host class is sm_103"):
        check_driver(noheader, 0, "13.0", "sm_103")


@pytest.mark.parametrize("out,rc,msg", [
    ("570.124.06, 10.3\n", 0, "NVIDIA driver 570.124.06 is too old for CUDA 13.0 (needs >= 580.65.06"),
    ("", 127, "nvidia-smi is not installed"),
    ("", 9, "nvidia-smi failed (rc 9"),
    ("", 0, "nvidia-smi listed no GPU"),
    ("580.65.06, 10.3\n575.51.03, 10.3\n", 0, "different drivers"),
    ("garbage\n", 0, "expected driver_version,compute_cap"),
])
def test_check_driver_refusals(out, rc, msg):
    with pytest.raises(DriverCheckError) as exc:
        check_driver(out, rc, "13.0", "sm_103")
    assert msg in str(exc.value) and "\n" not in str(exc.value)


def test_driver_minimum_is_inclusive():
    assert check_driver("580.65.06, 10.3\n", 0, "13.0", "sm_103")
    assert check_driver("575.51.03, 12.0\n", 0, "12.9", "sm_120")


# ----------------------------------------------------------------------------- reboot guard

@pytest.mark.parametrize("conn,host,changed,required,allowed,want", [
    ("ssh", "10.0.0.5", True, True, True, True),
    ("ssh", "10.0.0.5", True, True, False, False),     # operator did not allow
    ("ssh", "10.0.0.5", False, True, True, False),     # nothing of ours changed
    ("ssh", "10.0.0.5", True, False, True, False),     # no reboot required
    ("local", "gpu1", True, True, True, False),        # never over a local connection
    ("ssh", "localhost", True, True, True, False),
    ("ssh", "127.0.0.1", True, True, True, False),
])
def test_reboot_guard(conn, host, changed, required, allowed, want):
    reboot, reason = reboot_decision(conn, host, changed, required, allowed)
    assert reboot is want and reason


# ----------------------------------------------------------------------------- real ptxas

def test_real_ptxas_12_8_fails_sm103a_13_0_passes(real_ptxas):
    a = ARCHS["sm_103"]
    bad = ptxas_mod.assemble(real_ptxas["12.8"], a.target, a.ptx_version)
    assert not bad["ok"] and bad["version"] == "12.8"
    assert "Value 'sm_103a' is not defined for option 'gpu-name'" in bad["output"]
    for ver in ("12.9", "13.0"):
        ok = ptxas_mod.assemble(real_ptxas[ver], a.target, a.ptx_version)
        assert ok["ok"] and ok["version"] == ver, ok


def test_real_ptxas_matches_the_arch_table(real_ptxas):
    """Every toolkit at or above an arch's minimum assembles it; every one below does not."""
    from ddtree_ops.config.toolchain import at_least
    for arch in ("sm_90", "sm_100", "sm_103", "sm_120"):
        a = ARCHS[arch]
        for ver, path in real_ptxas.items():
            assert ptxas_mod.assemble(path, a.target, a.ptx_version)["ok"] == at_least(ver, a.min_cuda), (arch, ver)


def test_cli_check_ptxas_exit_codes(real_ptxas):
    cli = [sys.executable, "-m", "ddtree_ops", "check-ptxas", "--arch", "sm_103"]
    bad = subprocess.run([*cli, "--ptxas", real_ptxas["12.8"], "--json"], capture_output=True, text=True)
    assert bad.returncode == 1
    doc = json.loads(bad.stdout)
    assert doc["ok"] is False and doc["checks"][0]["name"] == "ptxas-sm_103a" and not doc["checks"][0]["ok"]
    ok = subprocess.run([*cli, "--ptxas", real_ptxas["13.0"]], capture_output=True, text=True)
    assert ok.returncode == 0 and "assembled .version 8.8 .target sm_103a" in ok.stdout
    for extra in ([], ["--ptxas", "/bin/true"], ["--ptxas", "/x", "--python", "/y"]):
        r = subprocess.run([*cli, *extra, "--json"], capture_output=True, text=True)
        assert r.returncode == 2 and json.loads(r.stdout)["ok"] is False, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "ddtree_ops", "check-ptxas", "--arch", "sm_77", "--ptxas", "/bin/true"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "sm_103" in r.stderr


def test_standalone_script_runs_without_ddtree_ops(real_ptxas, tmp_path):
    """The triton role copies ptxas.py alone to hosts: it must run with a bare python."""
    script = tmp_path / "check.py"
    script.write_text(Path(ptxas_mod.__file__).read_text())
    r = subprocess.run([sys.executable, "-I", str(script), "--target", "sm_103a", "--ptx-version", "8.8",
                        "--ptxas", real_ptxas["12.8"], "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 1 and "is not defined for option 'gpu-name'" in r.stdout


def test_triton_3_6_0_picks_what_the_table_says(triton_python, monkeypatch):
    """Triton 3.6.0's own get_ptxas(): ptxas-blackwell (12.9) for sm_103, ptxas (12.8) for sm_90."""
    for var in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH"):
        monkeypatch.delenv(var, raising=False)
    for arch in ("sm_103", "sm_90"):
        a = ARCHS[arch]
        res = ptxas_mod.check(a.target, a.ptx_version, python=triton_python)
        binary, cuda, env = TRITONS["3.6.0"].picks(a.number)
        assert res["ok"], res
        assert (res["triton"]["binary"], res["ptxas"]["version"], res["triton"]["env"]) == (binary, cuda, env)


def test_triton_override_and_silent_fallback(triton_python, real_ptxas, monkeypatch):
    a = ARCHS["sm_103"]
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", real_ptxas["12.8"])
    res = ptxas_mod.check(a.target, a.ptx_version, python=triton_python)
    assert res["ptxas"]["ptxas"] == real_ptxas["12.8"] and not res["ok"]
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", "/nonexistent/ptxas")
    res = ptxas_mod.check(a.target, a.ptx_version, python=triton_python)
    assert not res["ok"] and "fell back" in res["checks"][0]["detail"]
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", real_ptxas["13.0"])
    assert ptxas_mod.check(a.target, a.ptx_version, python=triton_python)["ok"]


@pytest.mark.parametrize("python", ["/bin/true", "/bin/echo"])
def test_python_that_prints_no_triton_choice_is_a_usage_error(python, tmp_path):
    """An interpreter that exits 0 without Triton's answer (nothing, or not JSON) is exit 2 with
    a one-line message, never IndexError/TypeError — also in the standalone script the role runs."""
    with pytest.raises(ptxas_mod.PtxasUsageError, match="could not be read"):
        ptxas_mod.check("sm_103a", "8.8", python=python)
    script = tmp_path / "check.py"
    script.write_text(Path(ptxas_mod.__file__).read_text())
    r = subprocess.run([sys.executable, "-I", str(script), "--target", "sm_103a", "--ptx-version", "8.8",
                        "--python", python, "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "could not be read" in json.loads(r.stdout)["checks"][0]["detail"], r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-m", "ddtree_ops", "check-ptxas", "--arch", "sm_103", "--python", python],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "could not be read" in r.stderr and "Error:" not in r.stderr, r.stderr
