"""The ``sglang`` role on a booted systemd test host: real SGLang 0.5.23 (its CPU import
lock, torch 2.13.0 CPU) from the controller wheelhouse, installed offline (the host has
no route to the internet), the capability probe shown in the play, second run changed=0,
an interrupted install converging on re-run, and bad pins refused with the host left as
it was.

``inventory/test`` serves through the simulator and, with ``install_release: true``, also
installs the real release into the SGLang venv to probe the argv with its real parser.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from hostutil import REPO_ROOT, ssh

pytestmark = pytest.mark.hosts

HOST = "ddt-th1"
PLAYBOOK = [str(REPO_ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(REPO_ROOT / "inventory" / "test"),
            "-l", HOST, "deploy.yml"]
VENV = "/opt/ddtree-ops/sglang-venv"
SNAPSHOT = (f"readlink {VENV}; ls -A --time-style=+%s -l /opt/ddtree-ops {VENV}.builds "
            "/opt/ddtree-ops/sglang-wheelhouse; cat {VENV}/.ddtree-sglang-complete; "
            "systemctl is-active ddtree-sglang.service; sha256sum /etc/ddtree-ops/sglang/*").replace("{VENV}", VENV)


def play(*extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([*PLAYBOOK, *extra], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200,
                       stdin=subprocess.DEVNULL)
    return r, time.monotonic() - t0


def recap(output: str) -> dict[str, int]:
    m = re.search(rf"^{re.escape(HOST)}\s+:\s+(.*)$", output, re.M)
    assert m, output[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def wheelhouse_cache() -> Path:
    return Path(os.environ.get("DDTREE_SGLANG_WHEELHOUSE") or REPO_ROOT / ".state" / "sglang-wheelhouse")


@pytest.fixture(scope="module")
def installed(hosts):
    assert HOST in hosts, f"{HOST} is not up: {hosts}"
    first, t1 = play()
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    second, t2 = play()
    sizes = re.findall(r"wheelhouse (cp\S+) \((\d+) files, ([\d.]+) MiB", re.sub(r"\s+", " ", first.stdout))
    print(f"\nsglang role: first run {t1:.1f} s, second run {t2:.1f} s, wheelhouse {sizes}")
    return {"address": hosts[HOST], "first": first, "second": second}


def test_probe_output_shown_in_play(installed):
    out = installed["first"].stdout
    assert "TASK [sglang : Show the probe]" in out
    flat = re.sub(r"\s+", " ", out)  # the YAML callback folds long lines
    assert "ok sglang-version: SGLang 0.5.23" in flat
    assert re.search(r"ok argv-parses: \d+ flags accepted by SGLang 0.5.23'+s parser", flat)  # YAML doubles the quote
    assert "--speculative-ddtree-budget checked against the versions table" in flat


def test_second_run_changes_nothing(installed):
    r = recap(installed["second"].stdout)
    assert installed["second"].returncode == 0
    assert r["changed"] == 0 and r["failed"] == 0, installed["second"].stdout[-4000:]


def test_real_sglang_installed_offline(installed):
    addr = installed["address"]
    r = ssh(addr, f"{VENV}/bin/python -c 'import sglang, torch, sglang.srt.server_args; "
                  f"print(sglang.__version__, torch.__version__)'; readlink {VENV}; "
                  "ip route show default | wc -l")
    assert r.returncode == 0, r.stderr
    ver, link, routes = r.stdout.strip().splitlines()
    assert ver == "0.5.23 2.13.0+cpu"
    assert link.startswith(f"{VENV}.builds/cp311-")
    assert routes == "0"  # no default route: everything came from the wheelhouse


def test_cli_probe_on_host(installed):
    """``ddtree-ops probe-sglang --plan`` on the host (ops venv) runs the probe in the SGLang venv."""
    r = ssh(installed["address"], "/opt/ddtree-ops/venv/bin/ddtree-ops probe-sglang "
                                  "--plan /etc/ddtree-ops/sglang/plan.json --json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["version"] == "0.5.23" and "DDTREE" not in doc["algorithms"]


def _bad_pin(tmp_path: Path, name: str, pin: dict) -> Path:
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps({"ddtree_sglang": {"ddtree_source": "sglang-pr-29907", **pin}}))
    return f


def _refused(installed, extra: Path, message: str) -> None:
    addr = installed["address"]
    before = ssh(addr, SNAPSHOT).stdout
    r, _ = play("-e", f"@{extra}")
    text = re.sub(r"\s+", " ", r.stdout + r.stderr)
    assert r.returncode != 0
    assert message in text, text[-3000:]
    assert ssh(addr, SNAPSHOT).stdout == before


def test_wrong_sha256_refused_host_unchanged(installed, tmp_path):
    wheel = next(wheelhouse_cache().glob("cp311-*/sglang-0.5.23-*.whl"))  # the real wheel
    extra = _bad_pin(tmp_path, "sha", {"source": "wheel", "path": str(wheel), "sha256": "0" * 64, "version": "0.5.23"})
    _refused(installed, extra, "but ddtree_sglang.sha256 = " + "0" * 64 + ": the file is not the wheel that was pinned")


def test_patch_not_applying_refused_host_unchanged(installed, tmp_path):
    from sglang_git import make_git_source

    src = make_git_source(tmp_path)
    extra = _bad_pin(tmp_path, "patch", {"source": "git", "repo": str(src.repo), "commit": src.commit, "patches": [
        {"path": str(src.good_patch), "sha256": src.sha(src.good_patch)},
        {"path": str(src.bad_patch), "sha256": src.sha(src.bad_patch)}]})
    _refused(installed, extra, "does not apply to " + src.commit[:12])


def test_branch_name_refused_host_unchanged(installed, tmp_path):
    extra = _bad_pin(tmp_path, "branch", {"source": "git", "repo": "/srv/sglang.git", "commit": "main"})
    _refused(
        installed, extra, "ddtree_sglang.commit = 'main': must be a full 40-hex commit SHA, not a branch or tag name"
    )


def test_build_without_ddtree_stops_before_the_service(installed, tmp_path):
    """A real DDTree deployment pinned to the plain 0.5.23 release: the probe finds no
    DDTREE, the play stops naming the pin that fixes it; unit, files and venv untouched."""
    extra = _bad_pin(tmp_path, "noddtree", {"source": "pypi", "version": "0.5.23",
                                             "requirements": "requirements/sglang-0.5.23-import.txt"})
    _refused(installed, extra, "this build does not know DDTREE. Fix: this pin (pypi, ddtree_source sglang-pr-29907) "
                               "installed a build without DDTREE: set ddtree_sglang.source: git")


@pytest.mark.slow  # ~1.5 min: scripts/test.sh --slow (CI)
def test_interrupted_install_converges(installed):
    """Kill ansible-playbook while pip installs the lock on the host; the re-run replaces
    the incomplete build and ends where an uninterrupted run does."""
    addr = installed["address"]
    assert ssh(addr, f"rm -rf {VENV} {VENV}.builds").returncode == 0
    proc = subprocess.Popen(
        PLAYBOOK,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    seen = []
    try:
        for line in proc.stdout:
            seen.append(line)
            if "TASK [sglang : Install the lock" in line:
                time.sleep(8)  # pip is now unpacking torch/triton on the host
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert any("Install the lock" in s for s in seen), "".join(seen)[-3000:]
    time.sleep(3)
    partial = ssh(addr, f"ls -d {VENV}.builds/*; ls {VENV}.builds/*/.ddtree-sglang-complete; readlink {VENV}")
    assert "No such file" in partial.stderr and f"{VENV}.builds/cp311-" in partial.stdout  # incomplete, not switched
    again, t = play()
    assert again.returncode == 0, again.stdout[-5000:]
    r = ssh(addr, f"{VENV}/bin/python -c 'import sglang.srt.server_args, sglang; print(sglang.__version__)'")
    assert r.stdout.strip() == "0.5.23", r.stderr
    third, _ = play()
    assert recap(third.stdout)["changed"] == 0, third.stdout[-4000:]
    print(f"\ninterrupted install: re-run converged in {t:.1f} s")
