"""Attack corpus (attack pass 7): `ddtree-ops fleet` against hostile hosts on a throw-away sshd
(tests/test_fleet_ssh.py's Sshd: 127.0.0.1 only, stopped at the end).

Prints per case: what came back (ok/error per host, or the exception that escaped) and seconds.
Expected: every host a clean per-host failure (or ok); never an exception out of
fleet_ssh.status/logs/rolling (that is exit 70 for the whole fleet), never a hang.
Run (as root): cd <worktree> && .venv/bin/python attack/fleet_attack.py [CASE...]
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
import test_fleet_ssh as tf  # noqa: E402
from ddtree_ops.ops import fleet_ssh  # noqa: E402
from ddtree_ops.ops.fleet_ssh import Limits, Target  # noqa: E402

DEEP = '{"ok": false, "checks": ' + "[" * 100000 + "]" * 100000 + "}"


def lim(sshd, **kw):
    return Limits(known_hosts=sshd.known_hosts, **{"timeout_s": 8.0, "deadline_s": 20.0, **kw})


def run(name, fn):
    t0 = time.monotonic()
    try:
        res = fn()
        text = "; ".join(f"{getattr(r, 'host', '?')}: ok={getattr(r, 'ok', None)} "
                         f"{(getattr(r, 'error', '') or getattr(r, 'detail', '') or '')[:160]!r}" for r in res) \
            if isinstance(res, list) and res and hasattr(res[0], "host") else str(res)[:400]
    except BaseException as exc:  # noqa: BLE001 - the finding
        text = f"ESCAPED {type(exc).__name__}: {str(exc)[:200]}"
    print(f"{name:38s} {time.monotonic() - t0:6.1f}s | {text}", flush=True)


def cli(*args):
    from ddtree_ops import cli as c
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        c.out.file, c.err.file = o, e
        try:
            rc = c.main(list(args))
        finally:
            c.out.file, c.err.file = None, None
    return rc, o.getvalue(), e.getvalue()


def cases(sshd: tf.Sshd, tmp: Path) -> dict:
    C = {}
    C["health_json_nested_100k"] = lambda: fleet_ssh.status([sshd.host("deep", **{"health.json": DEEP})], lim(sshd))
    C["health_numbers_as_strings_nan"] = lambda: fleet_ssh.status([sshd.host("strs", **{"health.json": json.dumps(
        {"ok": "true", "checks": [{"name": "ready", "ok": "true", "detail": float("nan")}, {"name": 5, "ok": 1}]})})],
        lim(sshd))
    C["health_checks_10000"] = lambda: fleet_ssh.status([sshd.host("many", **{"health.json": json.dumps(
        {"ok": True, "checks": [{"name": f"c{i}", "ok": True, "detail": "x"} for i in range(10000)]})})], lim(sshd))
    C["health_accept_200_digits"] = lambda: [(s, s.accept_length) for s in fleet_ssh.status([sshd.host(
        "acc", metrics="", **{"health.json": json.dumps({"ok": True, "checks": [
            {"name": "ready", "ok": True, "detail": "x"}, {"name": "accept_length", "ok": True,
                                                          "detail": "9" * 300 + " tokens per verify pass"}]})})],
        lim(sshd))][0]
    C["metrics_inf_and_huge"] = lambda: [(s.accept_length, s.tokens_per_s) for s in fleet_ssh.status([sshd.host(
        "minf", metrics="ddtree_accept_length +Inf\nddtree_generation_tokens_per_second 1e308\n")], lim(sshd))]
    C["binary_escape_show"] = lambda: fleet_ssh.status([sshd.host("bin", active="\x1b[2J\x00\xff" * 50)], lim(sshd))
    C["journal_binary_4MB"] = lambda: [(lg.ok, lg.cut, len(lg.lines), max(map(len, lg.lines), default=0)) for lg in
                                       fleet_ssh.logs([sshd.host("jb", journal=os.urandom(3 << 20).decode("latin-1"))],
                                                      lim(sshd), lines=10000, max_bytes=1 << 20)]

    def half_then_hang():
        t = sshd.host("halfhang")
        vb = Path(t.venv) / "bin" / "ddtree-ops"
        vb.write_text("#!/bin/sh\necho '{\"ok\": true, \"checks\": [{\"name\"'\nexec sleep 30\n")
        return fleet_ssh.status([t], lim(sshd, timeout_s=3.0))
    C["health_prints_half_then_hangs"] = half_then_hang

    def rollback_deep():
        t = sshd.host("rbdeep")
        vb = Path(t.venv) / "bin" / "ddtree-ops"
        text = vb.read_text().replace("echo '{\"ok\": true, \"current\": \"r1\", \"previous\": \"r2\"}'",
                                      "printf '%s' '" + DEEP + "'")
        vb.write_text(text)
        return fleet_ssh.rolling([t], lim(sshd, gate_s=4.0), rollback=True)
    C["rollback_json_nested_100k"] = rollback_deep

    def rollback_lies():
        t = sshd.host("rblie")
        vb = Path(t.venv) / "bin" / "ddtree-ops"
        vb.write_text(vb.read_text().replace("\"current\": \"r1\"", "\"current\": {\"\\u001b[31m\": [1e999]}"))
        return fleet_ssh.rolling([t], lim(sshd, gate_s=4.0), rollback=True)
    C["rollback_json_lies"] = rollback_lies

    def rollback_huge_output():
        """The host's release rollback switches current, then prints more than OUTPUT_CAP."""
        t = sshd.host("rbhuge")
        vb = Path(t.venv) / "bin" / "ddtree-ops"
        vb.write_text(vb.read_text().replace("echo '{\"ok\": true, \"current\": \"r1\", \"previous\": \"r2\"}'",
                                             "head -c 400000 /dev/zero | tr '\\0' x"))
        res = fleet_ssh.rolling([t], lim(sshd, gate_s=4.0), rollback=True)
        cur = os.readlink(Path(t.config_dir) / "releases" / "current")
        calls = (sshd.state / "rbhuge" / "calls").read_text()
        return f"{res[0].ok} {res[0].detail[:120]!r}; current now {cur}; restarted: {'restart' in calls}"
    C["rollback_switches_then_prints_too_much"] = rollback_huge_output

    def kh_bad_base64():
        kh = tmp / "kh_bad"
        kh.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 AAAA!!notbase64\n")
        return fleet_ssh.status([sshd.host("good")], Limits(known_hosts=kh, timeout_s=5))
    C["known_hosts_bad_base64"] = kh_bad_base64

    def kh_garbage():
        kh = tmp / "kh_garb"
        kh.write_bytes(os.urandom(4096))
        return fleet_ssh.status([sshd.host("good")], Limits(known_hosts=kh, timeout_s=5))
    C["known_hosts_binary_garbage"] = kh_garbage

    def kh_bad_key_type():
        kh = tmp / "kh_type"
        kh.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQC7\n")
        return fleet_ssh.status([sshd.host("good")], Limits(known_hosts=kh, timeout_s=5))
    C["known_hosts_truncated_key"] = kh_bad_key_type

    def kh_missing_file():
        return fleet_ssh.status([sshd.host("good")], Limits(known_hosts=tmp / "nope", timeout_s=5))
    C["known_hosts_missing_lib"] = kh_missing_file

    def thousand_down():
        base = sshd.host("good")
        ports = []
        for _ in range(1000):
            ports.append(tf._free_port())
        ts = [Target(**{**base.__dict__, "host": f"d{i}", "port": p}) for i, p in enumerate(ports)]
        res = fleet_ssh.status(ts, Limits(known_hosts=sshd.known_hosts, timeout_s=5, parallel=8, deadline_s=120))
        return f"{sum(not r.ok for r in res)} failed of {len(res)}; first: {res[0].error[:100]}"
    C["thousand_hosts_down"] = thousand_down

    def many_hanging():
        ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(512)
        base = sshd.host("good")
        ts = [Target(**{**base.__dict__, "host": f"h{i}", "port": ls.getsockname()[1]}) for i in range(40)]
        try:
            res = fleet_ssh.status(ts, Limits(known_hosts=sshd.known_hosts, timeout_s=3, parallel=8, deadline_s=60))
        finally:
            ls.close()
        return f"{sum(not r.ok for r in res)} failed of {len(res)}; first: {res[0].error[:100]}"
    C["forty_hosts_hanging_banner"] = many_hanging

    # ---- the CLI with a hostile inventory
    good = sshd.host("cligood")

    def inv(hosts, **group):
        d = Path(tempfile.mkdtemp(dir=tmp))
        p = tf._inventory(d, sshd, hosts)
        if group:
            import yaml
            g = p / "group_vars" / "b300.yml"
            doc = yaml.safe_load(g.read_text()); doc.update(group); g.write_text(yaml.safe_dump(doc))
        return str(p)

    def clirun(*extra, hosts=None, **group):
        i = inv(hosts or {"cligood": tf._host_entry(good)}, **group)
        rc, o, e = cli("fleet", *extra[:1], "-i", i, "--known-hosts", str(sshd.known_hosts), *extra[1:])
        lines = [ln for ln in (o + e).splitlines() if ln.strip()]
        return f"rc={rc} lines={len(lines)} {'TRACEBACK ' if 'Traceback' in o + e else ''}| {(e or o).strip()[:260]!r}"

    for opt, vals in (("--timeout", ["0", "-1", "nan", "inf", "1e308"]), ("--batch", ["0", "-1", "100000"]),
                      ("--deadline", ["0", "nan", "-5", "1e400"]), ("--parallel", ["0", "9999"]),
                      ("--gate-timeout", ["nan", "0"])):
        for v in vals:
            cmd = "restart" if opt in ("--batch", "--gate-timeout") else "status"
            C[f"cli_{cmd}{opt}={v}"] = (lambda cmd=cmd, opt=opt, v=v: clirun(cmd, opt, v))
    C["cli_logs_lines=-1"] = lambda: clirun("logs", "--lines", "-1")
    C["cli_logs_max_bytes=1e12"] = lambda: clirun("logs", "--max-bytes", "1000000000000")
    for hostile in ("/srv/x$(touch /tmp/atk7-pwned)", "/srv/x`id`", "/srv/x;id", "/srv/x'\"", "/srv/x\nid",
                    "relative/dir"):
        C[f"cli_config_dir={hostile!r}"] = (lambda h=hostile: clirun("status", hosts={"cligood": {
            **tf._host_entry(good), "ddtree_service": {"name": "cligood", "venv": good.venv, "config_dir": h}}}))
    for hostile in ("sg;id", "sg$(id)", "sg'x", "SG", "a" * 300):
        C[f"cli_service_name={hostile[:20]!r}"] = (lambda h=hostile: clirun("status", hosts={"cligood": {
            **tf._host_entry(good), "ddtree_service": {"name": h, "venv": good.venv, "config_dir": good.config_dir}}}))
    for hostile in ("127.0.0.1;id", "-oProxyCommand=id", "$(id)", "127.0.0.1 extra", "[::1]"):
        C[f"cli_ansible_host={hostile!r}"] = (lambda h=hostile: clirun("status", hosts={"cligood": {
            **tf._host_entry(good), "ansible_host": h}}))
    for hostile in ("22;id", "0", "-1", "22.5", True, "1e3"):
        C[f"cli_ansible_port={hostile!r}"] = (lambda h=hostile: clirun("status", hosts={"cligood": {
            **tf._host_entry(good), "ansible_port": h}}))
    for hostile in ("root;id", "root$(id)", "r\noot", "-oProxyCommand=id"):
        C[f"cli_ansible_user={hostile!r}"] = (lambda h=hostile: clirun("status", hosts={"cligood": {
            **tf._host_entry(good), "ansible_user": h}}))
    C["cli_known_hosts_fifo"] = lambda: (os.mkfifo(tmp / "khfifo"), cli("fleet", "status", "-i", inv(
        {"cligood": tf._host_entry(good)}), "--known-hosts", str(tmp / "khfifo")))[1]
    C["cli_known_hosts_dir"] = lambda: cli("fleet", "status", "-i", inv({"cligood": tf._host_entry(good)}),
                                           "--known-hosts", str(tmp))[:1] + (cli("fleet", "status", "-i", inv(
                                               {"cligood": tf._host_entry(good)}), "--known-hosts", str(tmp))[2][:200],)
    def cli_kh(data: bytes):
        kh = tmp / f"kh{len(data)}"
        kh.write_bytes(data)
        rc, o, e = cli("fleet", "status", "-i", inv({"cligood": tf._host_entry(good)}), "--known-hosts", str(kh))
        return rc, (o + e)[:300]
    C["cli_known_hosts_bad_base64"] = lambda: cli_kh(f"[127.0.0.1]:{sshd.port} ssh-ed25519 AAAA!!notbase64\n".encode())
    C["cli_known_hosts_binary"] = lambda: cli_kh(b"\xfa\xfb" * 100)

    def cli_hanging():
        ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(8)
        try:
            i = inv({"cligood": {**tf._host_entry(good), "ansible_port": ls.getsockname()[1]}})
            rc, o, e = cli("fleet", "status", "-i", i, "--known-hosts", str(sshd.known_hosts), "--timeout", "3")
        finally:
            ls.close()
        print(e); return rc, f"stderr lines={len(e.splitlines())} stdout lines={len(o.splitlines())}"
    C["cli_hanging_host_stderr"] = cli_hanging
    C["cli_status_json_deep_health"] = lambda: (lambda r: (r[0], r[2][:300]))(cli(
        "fleet", "status", "-i", inv({"deep2": tf._host_entry(sshd.host("deep2", **{"health.json": DEEP}))}),
        "--known-hosts", str(sshd.known_hosts), "--json"))
    return C


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="atk7-fleet-", dir="/srv" if os.path.isdir("/srv") else "/opt"))
    sshd = tf.Sshd(root)
    try:
        C = cases(sshd, root)
        for n in (sys.argv[1:] or list(C)):
            run(n, C[n])
    finally:
        sshd.stop()
        shutil.rmtree(root, ignore_errors=True)
    print("pwned file exists:", os.path.exists("/tmp/atk7-pwned"))


if __name__ == "__main__":
    main()
