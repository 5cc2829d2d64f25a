"""``ddtree-ops fleet`` over real SSH: a throw-away OpenSSH ``sshd`` on 127.0.0.1 (temp host key,
temp authorized key, run as root) whose sessions find **test doubles** of ``systemctl``,
``journalctl``, the ops venv's ``ddtree-ops`` and ``python`` first on their PATH (sshd's
``SetEnv``). Each double reads what to answer from a per-host state directory, so one sshd
stands in for several hosts (one unit and one venv per host).

Misbehaving hosts: a closed port (down), a socket that accepts TCP and never speaks SSH
(hangs), a command that never returns, an unknown and a changed host key, huge and
escape-laden output.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers import gate_document

pytest.importorskip("fabric")
from ddtree_ops.fleet import ssh as fleet_ssh  # noqa: E402
from ddtree_ops.fleet.ssh import Limits, Target  # noqa: E402

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
pytestmark = pytest.mark.skipif(not (os.path.exists(SSHD) and os.geteuid() == 0 and shutil.which("ssh-keygen")),
                                reason="needs root and openssh-server (scripts/setup.sh installs it)")

SYSTEMCTL = """#!/bin/sh
# test double for systemctl (tests/test_fleet_ssh.py): the unit's state lives in STATE/<name>/
unit=""
for a in "$@"; do case "$a" in ddtree-*.service) unit="$a";; esac; done
name=${unit#ddtree-}; S="@STATE@/${name%.service}"
echo "$*" >> "$S/calls"
case "$1" in
  daemon-reload)
    # systemd re-reads every unit file: the unit now loaded is the one `current` names
    for d in "@STATE@"/*/; do [ -f "$d/releases" ] && readlink "$(cat "$d/releases")/current" > "$d/loaded"; done
    echo "$*" >> "@STATE@/reloads";;
  show)
    [ -f "$S/hang" ] && exec sleep 20
    if [ "$(cat "$S/active")" = activating ] && [ $(( $(date +%s) - $(cat "$S/restarted-at") )) -ge 2 ]; then
      echo active > "$S/active"  # the unit's ExecStartPost warmup finished
    fi
    echo "ActiveState=$(cat "$S/active")"; echo "SubState=$(cat "$S/sub")"; echo "InvocationID=$(cat "$S/inv")";;
  restart)
    echo "$name" >> "@STATE@/restart-order"  # across the hosts: which unit restarted first
    [ -f "$S/restart-fails" ] && { echo "Job for $unit failed."; exit 1; }
    cp "$S/after-active" "$S/active"; echo running > "$S/sub"; echo "inv-$(date +%s%N)" > "$S/inv"
    # a restart runs the unit systemd loaded: one of another release than `current` fails its
    # own readiness check (the plan.json read through `current` does not match its argv)
    if [ -f "$S/releases" ] && [ "$(cat "$S/loaded")" != "$(readlink "$(cat "$S/releases")/current")" ]; then
      echo failed > "$S/active"; echo failed > "$S/sub"
    fi
    date +%s > "$S/restarted-at";;
esac
"""

JOURNALCTL = """#!/bin/sh
# test double for journalctl: prints STATE/<name>/journal
unit=""; prev=""
for a in "$@"; do [ "$prev" = "-u" ] && unit="$a"; prev="$a"; done
name=${unit#ddtree-}; S="@STATE@/${name%.service}"; echo "$*" >> "$S/calls"; cat "$S/journal"
"""

DDTREE_OPS = """#!/bin/sh
# test double for the host's ddtree-ops: health answers from the unit's state; release rollback
S="@S@"
case "$1" in
  health)
    echo "health $(cat "$S/active")" >> "$S/calls"
    if [ -f "$S/health.json" ]; then cat "$S/health.json"; exit 0; fi
    if [ "$(cat "$S/active")" = active ] && [ ! -f "$S/unhealthy" ]; then
      echo '@HEALTH_OK@'
    else
      echo '@HEALTH_BAD@'; exit 1
    fi;;
  release)
    if [ -f "$S/no-release" ]; then
      echo "Usage: ddtree-ops [OPTIONS] COMMAND [ARGS]..."; echo "Error: No such command 'release'."; exit 2
    fi
    echo "$*" >> "$S/calls"; ln -sfn r1 "@CONFIG@/releases/current"
    if [ -f "$S/rollback-flood" ] && [ "$2" = rollback ]; then head -c 400000 /dev/zero | tr '\0' x; exit 0; fi
    echo '{"ok": true, "current": "r1", "previous": "r2"}';;
esac
"""

HEALTH_OK = json.dumps({"ok": True, "checks": [
    {"name": "reachable", "ok": True, "detail": "port open"},
    {"name": "ready", "ok": True, "detail": "/health answered 200"},
    {"name": "warm", "ok": True, "detail": "warmed"}, {"name": "drift", "ok": True, "detail": "running settings match"},
    {"name": "accept_length", "ok": True, "detail": "3.10 tokens per verify pass"}]})
HEALTH_BAD = json.dumps({"ok": False, "checks": [
    {"name": "reachable", "ok": True, "detail": "port open"},
    {"name": "ready", "ok": False, "detail": "/health answered 503 three times"}]})
DDTREE_OPS = DDTREE_OPS.replace("@HEALTH_OK@", HEALTH_OK).replace("@HEALTH_BAD@", HEALTH_BAD)

PYTHON = """#!/bin/sh
# test double for the ops venv's python: `-m ddtree_ops release gate` (the playbook's gate) answers
# from STATE/gate.out + gate.rc (default: passed), can hang or trickle; anything else is the
# exporter's /metrics read
S="@S@"
if [ "$1 $2 $3 $4" = "-m ddtree_ops release gate" ]; then
  echo "gate $*" >> "$S/calls"
  [ -f "$S/gate-hang" ] && exec sleep 20
  if [ -f "$S/gate-trickle" ]; then i=0; while [ $i -lt 100 ]; do printf '{'; sleep 0.1; i=$((i+1)); done; exit 0; fi
  if [ -f "$S/gate.out" ]; then cat "$S/gate.out"; exit "$(cat "$S/gate.rc" 2>/dev/null || echo 1)"; fi
  echo '@GATE_OK@'; exit 0
fi
cat "$S/metrics" 2>/dev/null
"""


def _gate_doc(acc: float | None, floor: float | None = 1.5, ok: bool | None = None) -> str:
    """What `ddtree-ops release gate --json` prints (tests/helpers.py gate_document), after a load check."""
    return gate_document(acc, floor, ok, extra_checks=[
        {"name": "load", "ok": True, "detail": "16/16 requests answered in 1.20 s (850 tok/s)"}], elapsed_s=1.4)


PYTHON = PYTHON.replace("@GATE_OK@", _gate_doc(3.1).replace("\n", " "))

METRICS = ("# HELP ddtree_accept_length x\nddtree_accept_length{host=\"h\"} 3.25\n"
           "ddtree_generation_tokens_per_second{host=\"h\"} 812.5\n")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Sshd:
    """A throw-away sshd on 127.0.0.1 and the hosts (units, venvs, states) behind it."""

    def __init__(self, root: Path):
        self.root = root
        self.state = root / "state"
        self.port = _free_port()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "hostkey")], check=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "client")], check=True)
        shutil.copy(root / "client.pub", root / "authorized_keys")
        _write(root / "bin" / "systemctl", SYSTEMCTL.replace("@STATE@", str(self.state)), 0o755)
        _write(root / "bin" / "journalctl", JOURNALCTL.replace("@STATE@", str(self.state)), 0o755)
        _write(root / "sshd_config", "\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {root / 'hostkey'}",
            f"AuthorizedKeysFile {root / 'authorized_keys'}", "PidFile none", "UsePAM no", "StrictModes no",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            f"SetEnv PATH={root / 'bin'}:/usr/bin:/bin", "LogLevel ERROR", ""]))
        os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation directory
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        end = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"sshd did not start: {self.proc.stderr.read().decode()[-2000:]}") from None
                time.sleep(0.05)
        self.known_hosts = root / "known_hosts"
        pub = (root / "hostkey.pub").read_text().split()
        _write(self.known_hosts, f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def host(self, name: str, active: str = "active", **files: str) -> Target:
        """A host behind this sshd: unit ``ddtree-<name>.service``, its own venv, config dir and
        state (``files``: state file name -> content, e.g. ``hang=""``)."""
        s = self.state / name
        cfg = self.root / "etc" / name
        (cfg / "releases" / "r2").mkdir(parents=True, exist_ok=True)
        (cfg / "releases" / "r1").mkdir(parents=True, exist_ok=True)
        link = cfg / "releases" / "current"
        if not link.is_symlink():
            link.symlink_to("r2")
        venv = self.root / "venv" / name
        _write(venv / "bin" / "ddtree-ops", DDTREE_OPS.replace("@S@", str(s)).replace("@CONFIG@", str(cfg)), 0o755)
        _write(venv / "bin" / "python", PYTHON.replace("@S@", str(s)), 0o755)
        defaults = {"active": active, "sub": "running" if active == "active" else "dead", "inv": f"inv-{name}-0",
                    "after-active": "active", "journal": f"line one of {name}\nline two of {name}\n",
                    "metrics": METRICS, "releases": str(cfg / "releases"), "loaded": "r2"}
        for k, v in {**defaults, **files}.items():
            _write(s / k, v)
        return Target(host=name, address="127.0.0.1", port=self.port, user="root", key_file=str(self.root / "client"),
                      unit=f"ddtree-{name}.service", config_dir=str(cfg), venv=str(venv),
                      warm_marker=f"/run/ddtree-ops/{name}/warm.json", exporter_port=19400, gate_s=6.0)


@pytest.fixture(scope="module")
def sshd():
    # not under /tmp: the deployments the CLI tests validate may not keep their venv and config
    # there (the unit's PrivateTmp hides it), so the hosts' directories live below /srv, removed after
    root = Path(tempfile.mkdtemp(prefix="ddtree-fleet-test-", dir="/srv" if os.path.isdir("/srv") else "/opt"))
    try:
        d = Sshd(root)
        yield d
        d.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _limits(sshd: Sshd, **kw) -> Limits:
    return Limits(known_hosts=sshd.known_hosts, **{"timeout_s": 10.0, "deadline_s": 30.0, **kw})


def _down_target(sshd: Sshd) -> Target:
    t = sshd.host("down")
    return Target(**{**t.__dict__, "port": _free_port()})  # nothing listens there


@pytest.fixture
def hanging_port():
    """A socket that completes the TCP handshake (the kernel's backlog) and never sends a byte."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield s.getsockname()[1]


def test_status_of_a_good_host_reads_unit_release_health_and_metrics(sshd):
    t = sshd.host("good")
    [s] = fleet_ssh.status([t], _limits(sshd))
    assert s.ok, s
    assert (s.active_state, s.sub_state, s.release, s.ready, s.warm, s.drift) == ("active", "running", "r2", True, True,
                                                                                  "none")
    assert (s.accept_length, s.tokens_per_s) == (3.25, 812.5)  # the exporter's gauges win over health's detail


def test_status_without_releases_or_exporter_reports_dash_and_health_accept_length(sshd):
    t = sshd.host("norel", metrics="")
    (Path(t.config_dir) / "releases" / "current").unlink()
    [s] = fleet_ssh.status([t], _limits(sshd))
    assert s.ok and s.release == "-" and s.accept_length == 3.10 and s.tokens_per_s is None


def test_down_and_hanging_hosts_are_reported_without_stalling_the_good_one(sshd, hanging_port):
    good = sshd.host("good2")
    hang = Target(**{**good.__dict__, "host": "hang", "port": hanging_port})
    t0 = time.monotonic()
    res = fleet_ssh.status([_down_target(sshd), hang, good], _limits(sshd, timeout_s=3.0))
    took = time.monotonic() - t0
    assert took < 6, took  # the hanging host costs its own deadline, in parallel with the rest
    down, hung, ok = res
    assert not down.ok and down.error.startswith("down:") and "refused" in down.error
    assert not hung.ok and ("banner" in hung.error or "deadline" in hung.error), hung.error
    assert ok.ok, ok


def test_the_runs_deadline_bounds_queued_hosts(sshd, hanging_port):
    good = sshd.host("good3")
    hangs = [Target(**{**good.__dict__, "host": f"hang{i}", "port": hanging_port}) for i in range(3)]
    t0 = time.monotonic()
    res = fleet_ssh.status(hangs, _limits(sshd, timeout_s=20.0, deadline_s=2.0, parallel=1))
    assert time.monotonic() - t0 < 4
    assert all(not r.ok for r in res)
    # the first host's banner wait ends with the run (either message); the queued ones never start
    assert "banner" in res[0].error or "run's deadline" in res[0].error, res[0].error
    assert all("run's deadline" in r.error for r in res[1:]), [r.error for r in res]


def test_unknown_host_key_is_refused_and_named(sshd, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    [s] = fleet_ssh.status([sshd.host("good")], Limits(known_hosts=empty, timeout_s=10))
    assert not s.ok
    assert f"[127.0.0.1]:{sshd.port}" in s.error and "not in" in s.error and "ssh-keyscan" in s.error, s.error
    assert "" == empty.read_text()  # never written: nothing accepted on first sight


def test_changed_host_key_is_refused(sshd, tmp_path):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    pub = (tmp_path / "other.pub").read_text().split()
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    [s] = fleet_ssh.status([sshd.host("good")], Limits(known_hosts=kh, timeout_s=10))
    assert not s.ok and "CHANGED" in s.error and f"[127.0.0.1]:{sshd.port}" in s.error, s.error


def test_a_command_that_never_returns_ends_at_the_hosts_deadline(sshd):
    stuck, good = sshd.host("stuck", hang=""), sshd.host("good4")
    t0 = time.monotonic()
    a, b = fleet_ssh.status([stuck, good], _limits(sshd, timeout_s=2.5))
    assert time.monotonic() - t0 < 5
    assert not a.ok and "deadline" in a.error and "reading status" in a.error, a.error
    assert b.ok


def test_huge_and_escape_laden_output_is_cut_and_cleaned(sshd):
    evil = "\x1b]0;owned\x07\x1b[31mred\x1b[0m token=hf_abcdefghijklmnopqrstuvwxyz0123 " + "A" * 5000
    health = json.dumps({"ok": False, "checks": [{"name": "ready", "ok": False, "detail": evil}]})
    t = sshd.host("evil", **{"health.json": health, "journal": ("x" * 3000 + "\x1b[2J\n") * 2000})
    [s] = fleet_ssh.status([t], _limits(sshd))
    assert not s.ok
    detail = s.checks[0]["detail"]
    assert "\x1b" not in detail and "\x07" not in detail and "hf_abc" not in detail and "(redacted)" in detail
    assert len(detail) <= fleet_ssh.FIELD_CAP + 1 and detail.startswith("red token=")
    [lg] = fleet_ssh.logs([t], _limits(sshd), lines=2000, max_bytes=20_000)
    assert lg.cut and sum(len(x) for x in lg.lines) <= 20_000
    assert all("\x1b" not in x and len(x) <= fleet_ssh.LOG_LINE_CAP + 1 for x in lg.lines)


def test_logs_prints_the_units_last_lines(sshd):
    [lg] = fleet_ssh.logs([sshd.host("logs")], _limits(sshd), lines=50)
    assert lg.ok and lg.lines == ["line one of logs", "line two of logs"]
    assert "-u ddtree-logs.service -n 50 --no-pager" in (sshd.state / "logs" / "calls").read_text()


def test_rolling_restart_gates_each_host_and_stops_at_the_first_failing_gate(sshd):
    a = sshd.host("ra")
    b = sshd.host("rb", **{"after-active": "failed"})  # the unit fails to start again
    c = sshd.host("rc")
    res = fleet_ssh.rolling([a, b, c], _limits(sshd, timeout_s=10.0, gate_s=4.0))
    assert [(r.host, r.ok, r.step) for r in res] == [("ra", True, "restart"), ("rb", False, "restart"),
                                                     ("rc", False, "skipped")]
    assert "gate: active" in res[0].detail
    assert "failed after the restart" in res[1].detail
    assert "stopped after rb" in res[2].detail
    assert not (sshd.state / "rc" / "calls").exists()  # never connected to


def test_restart_gate_times_out_on_an_unhealthy_but_active_unit(sshd):
    t = sshd.host("sick", unhealthy="")
    t0 = time.monotonic()
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=3.0))
    assert not r.ok and "not healthy within 3 s" in r.detail and "ready" in r.detail, r.detail
    assert time.monotonic() - t0 < 8


def test_rollback_switches_the_release_then_restarts_and_gates(sshd):
    t = sshd.host("rbk")
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=4.0), rollback=True)
    assert r.ok and (r.release_from, r.release_to) == ("r2", "r1"), r
    calls = (sshd.state / "rbk" / "calls").read_text()
    assert f"release rollback --root {t.config_dir}/releases --json" in calls
    assert "restart --no-block ddtree-rbk.service" in calls


def test_rollback_reloads_the_units_before_the_restart_so_the_release_switched_to_runs(sshd):
    """The live unit is a symlink through releases/current: without `systemctl daemon-reload`
    systemd restarts the unit of the release being left while plan.json names the other one, and
    the unit's readiness check fails the start (the double's restart fails exactly then)."""
    t = sshd.host("rbreload")
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=4.0), rollback=True)
    assert r.ok, r.detail
    # loaded is r1 only when the reload came after the rollback switched `current`
    assert (sshd.state / "rbreload" / "loaded").read_text().strip() == "r1"


def test_restart_after_current_moved_without_a_reload_runs_the_current_release(sshd):
    """A deploy cut off after it switched `current` leaves systemd's loaded unit behind; `fleet
    restart` must run the release `current` names, not the cached one."""
    t = sshd.host("moved")
    (Path(t.config_dir) / "releases" / "current").unlink()
    (Path(t.config_dir) / "releases" / "current").symlink_to("r1")  # switched, never reloaded
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=4.0))
    assert r.ok and r.release_to == "r1", r


def test_a_failed_rollback_names_the_release_switched_to_not_the_one_left(sshd):
    t = sshd.host("rbfail", **{"after-active": "failed"})
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=4.0), rollback=True)
    assert not r.ok and "failed after the restart" in r.detail, r.detail
    assert (r.release_from, r.release_to) == ("r2", "r1"), r


def test_rollback_without_the_release_command_on_the_host_fails_that_host(sshd):
    a, b = sshd.host("old", **{"no-release": ""}), sshd.host("next")
    res = fleet_ssh.rolling([a, b], _limits(sshd), rollback=True)
    assert not res[0].ok and "no `release rollback` (No such command 'release'.)" in res[0].detail, res[0].detail
    assert res[1].step == "skipped"
    assert "restart" not in (sshd.state / "old" / "calls").read_text()


def test_restart_runs_the_playbooks_gate_and_shows_accept_length_vs_floor(sshd):
    t = sshd.host("gok")
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=4.0, gate_deadline_s=30.0))
    assert r.ok, r.detail
    assert "release gate passed: accept length 3.10 >= floor 1.50" in r.detail, r.detail
    calls = (sshd.state / "gok" / "calls").read_text()
    # the very command of playbooks/rolling.yml, after the unit is active again
    assert f"gate -m ddtree_ops release gate --plan {t.config_dir}/plan.json --deadline 30 --json" in calls, calls
    assert calls.index("restart --no-block") < calls.index("gate -m ddtree_ops")


def test_a_gate_under_the_acceptance_floor_stops_the_rolling_restart(sshd):
    a = sshd.host("fa")
    b = sshd.host("fb", **{"gate.out": _gate_doc(1.2), "gate.rc": "1"})  # healthy, but acceptance collapsed
    c = sshd.host("fc")
    res = fleet_ssh.rolling([a, b, c], _limits(sshd, gate_s=4.0))
    assert [(r.host, r.ok, r.step) for r in res] == [("fa", True, "restart"), ("fb", False, "restart"),
                                                     ("fc", False, "skipped")]
    assert "gate FAILED (accept length 1.20 < floor 1.50)" in res[1].detail, res[1].detail
    assert "acceptance length 1.20 < the floor 1.5" in res[1].detail
    assert "stopped after fb" in res[2].detail
    assert not (sshd.state / "fc" / "calls").exists()


def test_a_gate_that_says_ok_below_the_floor_is_not_believed(sshd):
    t = sshd.host("liar", **{"gate.out": _gate_doc(1.0, ok=True).replace('"ok": false', '"ok": true'),
                             "gate.rc": "0"})
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=4.0))
    assert not r.ok and "1.00 < floor 1.50" in r.detail, r.detail


def test_cli_restart_names_the_host_whose_gate_fails_the_floor(sshd, tmp_path):
    a, b = sshd.host("cli7"), sshd.host("cli8", **{"gate.out": _gate_doc(0.9), "gate.rc": "1"})
    inv = _inventory(tmp_path, sshd, {"cli7": _host_entry(a), "cli8": _host_entry(b)})
    rc, out, err = _cli("fleet", "restart", "-i", str(inv), "--known-hosts", str(sshd.known_hosts),
                        "--gate-timeout", "4", "--gate-deadline", "20")
    assert rc == 1
    assert "ok   cli7 restart" in out and "accept length 3.10 >= floor 1.50" in out, out + err
    assert "FAIL cli8 restart" in err and "accept length 0.90 < floor 1.50" in err, out + err
    assert "1/2 hosts restarted" in err, out + err


@pytest.mark.parametrize(("name", "files", "expect"), [
    ("hg0", {"gate.out": "Traceback (most recent call last):\n  boom\x1b[31m\n", "gate.rc": "1"},
     "no JSON result from `ddtree-ops release gate` (exit 1): Traceback"),
    ("hg1", {"gate.out": "{" + '"a":' * 3 + "[" * 30000, "gate.rc": "0"}, "no JSON result"),
    ("hg2", {"gate.out": '{"ok": true, "checks": [], "accept_length": 9}', "gate.rc": "0"}, "no list of checks"),
    ("hg3", {"gate.out": json.dumps({"ok": True, "checks": [{"name": "x", "ok": True, "detail": "y"}],
                              "accept_length": "NaN", "floor": 1.5}), "gate.rc": "0"}, "accept length - vs floor 1.50"),
    ("hg4", {"gate.out": '{"ok": true, "checks": [{"name": "x", "ok": true}], "pad": "' + "A" * 100_000 + '"}',
      "gate.rc": "0"}, "more than 65536 bytes"),
    ("hg5", {"gate-trickle": ""}, "did not end within 1 s + 1 s"),
    ("hg6", {"gate-hang": ""}, "did not end within 1 s + 1 s"),
])
def test_hostile_gate_output_fails_that_host_with_one_clean_line(sshd, name, files, expect):
    t = sshd.host(name, **files)
    t0 = time.monotonic()
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=4.0, gate_deadline_s=1.0, gate_margin_s=1.0))
    assert time.monotonic() - t0 < 8
    assert not r.ok and expect in r.detail, r.detail
    assert "\x1b" not in r.detail and "\n" not in r.detail and len(r.detail) < 600, r.detail
    # the session lives on after a gate that hung: the release seen after it is still read
    assert r.release_to == "r2"


# ---------------------------------------------------------------------------------------
# The CLI: hosts, users, ports and keys from an Ansible inventory.


def _inventory(tmp_path: Path, sshd: Sshd, hosts: dict[str, dict], common_args: str | None = None) -> Path:
    import yaml
    from helpers import base_hostvars

    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    group = {**base_hostvars(), "ansible_user": "root", "ansible_ssh_private_key_file": str(sshd.root / "client")}
    if common_args:
        group["ansible_ssh_common_args"] = common_args
    (inv / "group_vars" / "b300.yml").write_text(yaml.safe_dump(group))
    (inv / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": hosts}}}}))
    return inv


def _host_entry(t: Target, **kw) -> dict:
    return {"ansible_host": t.address, "ansible_port": t.port, **kw,
            "ddtree_service": {"name": t.host, "venv": t.venv, "config_dir": t.config_dir}}


def _cli(*args: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from ddtree_ops.cli import main

    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        from ddtree_ops.cli import common as cli

        cli.out.file, cli.err.file = o, e
        try:
            rc = main(list(args))
        finally:
            cli.out.file, cli.err.file = None, None
    return rc, o.getvalue(), e.getvalue()


def test_cli_status_reads_the_inventory_and_reports_a_down_host(sshd, tmp_path):
    good = sshd.host("cli1")
    down = _down_target(sshd)
    inv = _inventory(tmp_path, sshd, {"cli1": _host_entry(good), "cli2": _host_entry(down)})
    t0 = time.monotonic()
    rc, out, err = _cli("fleet", "status", "-i", str(inv), "--known-hosts", str(sshd.known_hosts), "--json",
                        "--timeout", "5")
    assert time.monotonic() - t0 < 10
    assert rc == 1, out + err
    doc = json.loads(out)
    by = {h["host"]: h for h in doc["hosts"]}
    assert by["cli1"]["ok"] and by["cli1"]["active_state"] == "active" and by["cli1"]["warm"] is True
    assert not by["cli2"]["ok"] and "down:" in by["cli2"]["error"]
    rc, out, err = _cli("fleet", "status", "-i", str(inv), "-l", "cli1", "--known-hosts", str(sshd.known_hosts))
    assert rc == 0, out + err
    assert "cli1" in out and "active/running" in out and "812.50" in out and "cli2" not in out


def test_cli_refuses_the_default_known_hosts_where_the_inventory_turns_checking_off(sshd, tmp_path):
    good = sshd.host("cli3")
    inv = _inventory(tmp_path, sshd, {"cli3": _host_entry(good)},
                     common_args="-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null")
    rc, out, err = _cli("fleet", "status", "-i", str(inv))
    assert rc == 2
    assert "host-key checking off" in err and "cli3" in err and "--known-hosts" in err and "ssh-keyscan" in err, err
    rc, out, err = _cli("fleet", "status", "-i", str(inv), "--known-hosts", str(sshd.known_hosts))
    assert rc == 0, out + err


def test_cli_names_a_key_path_that_is_no_file_a_bad_port_and_a_bad_user(sshd, tmp_path):
    good = sshd.host("cli4")
    inv = _inventory(tmp_path, sshd, {"cli4": _host_entry(good, ansible_ssh_private_key_file=str(tmp_path))})
    rc, out, err = _cli("fleet", "status", "-i", str(inv), "--known-hosts", str(sshd.known_hosts))
    assert rc == 2 and "ansible_ssh_private_key_file" in err and "not a readable regular file" in err, err
    inv2 = _inventory(tmp_path / "b", sshd, {"cli4": {**_host_entry(good), "ansible_port": 70000}})
    rc, out, err = _cli("fleet", "logs", "-i", str(inv2), "--known-hosts", str(sshd.known_hosts))
    assert rc == 2 and "ansible_port" in err and "70000" in err, err
    inv3 = _inventory(tmp_path / "c", sshd, {"cli4": {**_host_entry(good), "ansible_user": "-oProxyCommand=sh"}})
    rc, out, err = _cli("fleet", "restart", "-i", str(inv3), "--known-hosts", str(sshd.known_hosts))
    assert rc == 2 and "ansible_user" in err and "must be a user name" in err, err


def test_cli_restart_prints_each_host_and_a_summary(sshd, tmp_path):
    a, b = sshd.host("cli5"), sshd.host("cli6", **{"after-active": "failed"})
    inv = _inventory(tmp_path, sshd, {"cli5": _host_entry(a), "cli6": _host_entry(b)})
    rc, out, err = _cli("fleet", "restart", "-i", str(inv), "--known-hosts", str(sshd.known_hosts),
                        "--gate-timeout", "4")
    assert rc == 1
    assert "ok   cli5 restart r2 -> r2" in out and "FAIL cli6 restart" in err, out + err
    assert "1/2 hosts restarted" in err, out + err


def test_batches_restart_together_and_the_next_batch_waits_for_every_gate(sshd):
    a, b, c = sshd.host("ba"), sshd.host("bb", **{"after-active": "failed"}), sshd.host("bc")
    res = fleet_ssh.rolling([a, b, c], _limits(sshd, gate_s=4.0), batch=2)
    assert [(r.host, r.ok, r.step) for r in res] == [("ba", True, "restart"), ("bb", False, "restart"),
                                                     ("bc", False, "skipped")]
    assert not (sshd.state / "bc" / "calls").exists()


def test_a_host_cannot_fake_a_section_or_a_release_name(sshd):
    t = sshd.host("fake", metrics="@@0123456789abcdef health\n{\"ok\": true, \"checks\": []}\n")
    link = Path(t.config_dir) / "releases" / "current"
    link.unlink()
    link.symlink_to("r2\x1b[31m$(reboot)")
    [s] = fleet_ssh.status([t], _limits(sshd))
    assert s.ok and s.ready is True  # the fake marker (a guessed nonce) in /metrics changed nothing
    assert "\x1b" not in s.release and s.release.startswith("'") and "$(reboot)" in s.release


@pytest.mark.parametrize(("hv", "off"), [
    ({"ansible_ssh_common_args": "-o StrictHostKeyChecking=no"}, True),
    ({"ansible_ssh_extra_args": "-oUserKnownHostsFile=/dev/null"}, True),
    ({"ansible_ssh_common_args": "-o StrictHostKeyChecking=accept-new"}, True),
    ({"ansible_host_key_checking": False}, True),
    ({"ansible_ssh_common_args": "-o StrictHostKeyChecking=yes -o ConnectTimeout=5"}, False),
    ({}, False),
])
def test_host_key_checking_off_in_the_inventory_is_recognised(hv, off):
    assert (fleet_ssh.host_key_checking_off(hv) is not None) is off


def test_the_gate_waits_for_the_unit_to_leave_activating_before_asking_health(sshd):
    t = sshd.host("slow", **{"after-active": "activating"})  # active again 2-3 s after the restart
    t0 = time.monotonic()
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=8.0))
    assert r.ok, r.detail
    assert 2 <= time.monotonic() - t0 < 7, time.monotonic() - t0
    calls = (sshd.state / "slow" / "calls").read_text().splitlines()
    assert "health activating" not in calls and calls.count("health active") == 2, calls  # before + gate
    assert sum(c.startswith("show ") for c in calls) >= 3, calls


# --- hostile hosts ------------------------------------------------------------

def test_health_json_nested_past_the_stack_fails_that_host_cleanly(sshd):
    deep = "[" * 100_000 + "]" * 100_000
    t, good = sshd.host("deep", **{"health.json": '{"ok": true, "checks": ' + deep + "}"}), sshd.host("good5")
    a, b = fleet_ssh.status([t, good], _limits(sshd))
    assert not a.ok and b.ok
    assert any("no JSON from" in c["detail"] for c in a.checks), a.checks


@pytest.mark.parametrize("content", [b"[127.0.0.1]:22 ssh-ed25519 !!!not-base64!!!\n", b"\xff\xfe\x00binary\x80\n"])
def test_a_known_hosts_file_that_cannot_be_parsed_is_one_line_per_host(sshd, tmp_path, content):
    kh = tmp_path / "known_hosts"
    kh.write_bytes(content)
    [s] = fleet_ssh.status([sshd.host("good")], Limits(known_hosts=kh, timeout_s=10))
    assert not s.ok and "cannot be read" in s.error and "\n" not in s.error, s.error


def test_one_hosts_surprise_does_not_cost_the_others_their_results(sshd):
    good, bad = sshd.host("good6"), sshd.host("surprise")

    def work(t, deadline, cancel):
        if t.host == "surprise":
            raise RuntimeError("boom")
        return fleet_ssh.HostStatus(host=t.host, ok=True)

    res = fleet_ssh.run_pool([bad, good], work, lambda t, why: fleet_ssh.HostStatus(host=t.host, error=why),
                             _limits(sshd))
    assert res[1].ok and not res[0].ok and "internal error on this host: RuntimeError: boom" in res[0].error


def test_a_host_without_ssh_banner_prints_nothing_to_stderr(sshd, hanging_port, capfd):
    good = sshd.host("good7")
    hang = Target(**{**good.__dict__, "host": "hang", "port": hanging_port})
    [r] = fleet_ssh.status([hang], _limits(sshd, timeout_s=2.0))
    assert not r.ok
    assert capfd.readouterr().err == ""


def test_a_rollback_that_switches_then_floods_is_not_restarted_and_says_where_current_is(sshd):
    t = sshd.host("flood", **{"rollback-flood": ""})
    [r] = fleet_ssh.rolling([t], _limits(sshd, gate_s=4.0), rollback=True)
    assert not r.ok and "current` is now" in r.detail and "NOT restarted" in r.detail, r.detail
    assert "restart" not in (sshd.state / "flood" / "calls").read_text()


# --- a multi-node server restarts as one unit --------------------------------------------------

def _node(t: Target, nodes: tuple[str, ...]) -> Target:
    return Target(**{**t.__dict__, "nodes": nodes})


def test_units_keep_the_nodes_of_a_server_together_rank_0_first():
    base = dict(address="127.0.0.1", port=22, user=None, key_file=None, unit="u", config_dir="/c", venv="/v",
                warm_marker="/w", exporter_port=19400, gate_s=6.0)
    mn = ("n0", "n1", "n2")
    a, n1, n0, b, n2 = (Target(host=h, **base, nodes=mn if h.startswith("n") else ()) for h in
                        ("a", "n1", "n0", "b", "n2"))
    assert [[t.host for t in u] for u in fleet_ssh.units([a, n1, n0, b, n2])] == [["a"], ["n0", "n1", "n2"], ["b"]]
    assert [[t.host for t in u] for u in fleet_ssh.units([n2, n0, n1])] == [["n0", "n1", "n2"]]
    for picked, missing in (([a, n1, n0], "n2"), ([n2], "n0, n1")):
        with pytest.raises(fleet_ssh.FleetError, match=f"node\\(s\\) {missing} of the multi-node server"):
            fleet_ssh.units(picked)


def _pair(sshd: Sshd, prefix: str, rank0: dict | None = None, rank1: dict | None = None) -> list[Target]:
    nodes = (f"{prefix}0", f"{prefix}1")
    return [_node(sshd.host(nodes[0], **(rank0 or {})), nodes), _node(sshd.host(nodes[1], **(rank1 or {})), nodes)]


def _calls(sshd: Sshd, host: str) -> str:
    return (sshd.state / host / "calls").read_text()


def test_a_multinode_server_restarts_rank_1_first_and_is_gated_once_on_rank_0(sshd):
    (sshd.state / "restart-order").unlink(missing_ok=True)
    r1, r0 = reversed(_pair(sshd, "mn"))  # the selection's order does not matter
    res = fleet_ssh.rolling([r1, r0], _limits(sshd, gate_s=4.0))
    assert [(r.host, r.ok) for r in res] == [("mn0", True), ("mn1", True)], [r.detail for r in res]
    assert (sshd.state / "restart-order").read_text().split() == ["mn1.service", "mn0.service"]
    assert "gate -m ddtree_ops release gate" in _calls(sshd, "mn0")
    assert "release gate" not in _calls(sshd, "mn1") and "gated on rank 0" in res[1].detail


@pytest.mark.parametrize("fails", ["rank0", "rank1"])
def test_a_failing_node_fails_its_whole_server_and_stops_the_run(sshd, fails):
    """Rank 0's gate under the floor, or the other node's unit failing to start: both nodes are failed
    (naming the node that failed), the next unit is not started."""
    bad_gate = {"gate.out": _gate_doc(1.0), "gate.rc": "1"}
    pair = _pair(sshd, f"f{fails[-1]}", rank0=bad_gate if fails == "rank0" else None,
                 rank1={"after-active": "failed"} if fails == "rank1" else None)
    later = sshd.host(f"later{fails[-1]}")
    res = fleet_ssh.rolling([*pair, later], _limits(sshd, gate_s=4.0))
    assert [(r.host, r.ok, r.step) for r in res] == [(pair[0].host, False, "restart"), (pair[1].host, False, "restart"),
                                                     (later.host, False, "skipped")], [r.detail for r in res]
    culprit = pair[0].host if fails == "rank0" else pair[1].host
    other = next(r for r in res[:2] if r.host != culprit)
    assert f"the multi-node server failed on {culprit}:" in other.detail, other.detail
    assert not (sshd.state / later.host / "calls").exists()


def test_cli_restart_takes_a_multinode_server_whole_or_refuses_a_part(sshd, tmp_path):
    """The inventory's multinode block reaches the targets: both nodes restart, rank 1 first and gated on
    rank 0; a limit to one node is refused before any host is touched (exit 2, one line)."""
    a, b = sshd.host("mc0"), sshd.host("mc1")
    mn = {"tp_size": 16, "multinode": {"nodes": ["mc0", "mc1"], "dist_init_addr": "127.0.0.1"}}
    inv = _inventory(tmp_path, sshd, {"mc0": _host_entry(a, ddtree_server=mn), "mc1": _host_entry(b, ddtree_server=mn)})
    rc, out, err = _cli("fleet", "restart", "-i", str(inv), "-l", "mc1", "--known-hosts", str(sshd.known_hosts))
    assert rc == 2 and "node(s) mc0 of the multi-node server of mc1" in err, out + err
    assert not (sshd.state / "mc1" / "calls").exists()
    (sshd.state / "restart-order").unlink(missing_ok=True)
    rc, out, err = _cli("fleet", "restart", "-i", str(inv), "--known-hosts", str(sshd.known_hosts),
                        "--gate-timeout", "4", "--gate-deadline", "20")
    assert rc == 0, out + err
    assert (sshd.state / "restart-order").read_text().split() == ["mc1.service", "mc0.service"]
    assert "ok   mc1 restart" in out and "gated on rank 0" in out, out
