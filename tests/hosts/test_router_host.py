"""The real smg 1.13.0 in front of two simulator instances, on three booted test hosts
(``scripts/testhost.sh up 3``; the router on ddt-th1, the instances on ddt-th2 and ddt-th3):

1. ``deploy.yml`` installs the router with the ``router`` role (offline wheelhouse, own account,
   the rendered unit) and requests through it reach both instances;
2. a rolling upgrade (``playbooks/rolling.yml``, one host per batch) under steady load through the
   router: each host is drained at the router before its restart and re-added after its gate;
   every request is counted and none may be lost;
3. a SIGKILLed instance is taken out by the router (smg ``--remove-unhealthy-workers`` drops it from
   the registry) and is back ``ready`` there only once its unit is active (warm): its host
   registers it after the warmup (the join unit, docs/router.md, Readiness), while the load keeps
   being served by the other one (none lost).

The hosts live in separate network namespaces (10.213.I.2, each a veth to the root namespace).
For the router to reach the instances, the fixture routes 10.213.0.0/16 through each host's
veth end in the root namespace (``ip netns exec ddt-thI``: the containers cannot change their
routes themselves) and turns on IPv4 forwarding there for the duration of the module (restored to
its previous value afterwards). The load comes from this process, at most
:data:`CLIENTS` requests in flight, to the router only.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from hostutil import KEY, REPO_ROOT, TEST_INVENTORY, VENV_BIN, deploy, ssh

pytestmark = [pytest.mark.hosts]

ROUTER, WORKERS = "ddt-th1", ("ddt-th2", "ddt-th3")
UNIT = "ddtree-sglang.service"
JOIN_UNIT = "ddtree-sglang-router-join.service"
JOIN_CONFIG = "/etc/ddtree-router-join/ddtree-sglang.json"
ROUTER_UNIT = "ddtree-router.service"
PORT, METRICS = 30080, 29000
CLIENTS = 4
API_KEY = "rt-Key-0f-the-host-test-9c2e"
"""The router's key: smg sends it to the workers and asks every client for it (requests and /workers)."""
AUTH = {"Authorization": f"Bearer {API_KEY}"}
FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


def _inventory(root: Path, addresses: dict[str, str], **changes) -> Path:
    """inventory/test with ddt-th2/3 as instances and ddt-th1 as group routers (no monitoring)."""
    inv = root / "inv"
    shutil.rmtree(inv, ignore_errors=True)
    shutil.copytree(TEST_INVENTORY, inv)
    hosts = yaml.safe_load((TEST_INVENTORY / "hosts.yml").read_text())
    th = hosts["all"]["children"]["testhosts"]
    th["hosts"] = {h: {"ansible_host": addresses[h]} for h in WORKERS}
    th["vars"]["ansible_ssh_private_key_file"] = str(KEY)
    conn = dict(th["vars"])
    hosts["all"]["children"].pop("monitoring", None)
    hosts["all"]["children"]["routers"] = {
        "hosts": {ROUTER: {"ansible_host": addresses[ROUTER]}},
        "vars": {**conn, "ddtree_router": {"policy": "round_robin", "port": PORT, "metrics_port": METRICS,
                                           "api_key_secret": "ROUTER_API_KEY",
                                           "health": {"interval_secs": 1, "timeout_secs": 1,
                                                      "failure_threshold": 2, "success_threshold": 1}},
                 "ddtree_secret_env": {"ROUTER_API_KEY": API_KEY}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    (inv / "group_vars" / "monitoring.yml").unlink(missing_ok=True)
    (inv / "host_vars").mkdir()
    for h in WORKERS:
        gw = re.sub(r"\.2$", ".1", addresses[h])
        (inv / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump({"cuda_toolkit_repo_url": f"http://{gw}:8765"}))
    gv = inv / "group_vars" / "testhosts.yml"
    data = yaml.safe_load(gv.read_text())
    data["ddtree_sglang"] = {**data["ddtree_sglang"], "install_release": False}  # the router is under test here
    data["ddtree_sglang"].pop("requirements", None)
    for key, value in changes.items():
        data[key] = {**data.get(key, {}), **value}
    gv.write_text(yaml.safe_dump(data))
    return inv


class Load:
    """``CLIENTS`` threads, each one ``/generate`` after the other through the router, every
    answer counted (status 200 with text: ok; anything else, or no answer: lost)."""

    def __init__(self, url: str):
        self.url, self.stop, self.ok, self.lost, self.errors = url, threading.Event(), 0, 0, []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(CLIENTS)]

    def _run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(30.0), headers=AUTH) as c:
            while not self.stop.is_set():
                try:
                    r = c.post(f"{self.url}/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 4}})
                    good = r.status_code == 200 and "text" in r.json()
                    why = f"HTTP {r.status_code} {r.text[:120]}"
                except (httpx.HTTPError, ValueError) as exc:
                    good, why = False, repr(exc)[:160]
                with self.lock:
                    if good:
                        self.ok += 1
                    else:
                        self.lost += 1
                        self.errors.append(why)
                time.sleep(0.02)

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=40)


def _workers(addr: str) -> list[dict]:
    r = httpx.get(f"http://{addr}:{PORT}/workers", timeout=10, headers=AUTH)
    r.raise_for_status()
    return r.json()["workers"]


def _served(addr: str) -> dict[str, float]:
    """smg_worker_requests_total per worker URL from the router's metrics port."""
    text = httpx.get(f"http://{addr}:{METRICS}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for m in re.finditer(r'^smg_worker_requests_total\{[^}]*worker="([^"]+)"[^}]*\} ([0-9.e+]+)$', text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0) + float(m.group(2))
    return out


def _fail(r: subprocess.CompletedProcess[str], addrs: dict[str, str]) -> str:
    journal = ssh(addrs[ROUTER], f"journalctl --no-pager -n 30 -u {ROUTER_UNIT}").stdout
    return r.stdout[-6000:] + r.stderr[-1500:] + "\n--- router journal ---\n" + journal


@pytest.fixture(scope="module")
def fleet(hosts, tmp_path_factory):
    missing = [h for h in (ROUTER, *WORKERS) if h not in hosts]
    if missing:
        pytest.fail(f"{missing} not up ({hosts}): scripts/testhost.sh up 3", pytrace=False)
    addrs = {h: hosts[h] for h in (ROUTER, *WORKERS)}
    before = FORWARD.read_text().strip()
    FORWARD.write_text("1\n")
    try:
        for h, a in addrs.items():  # the containers have no CAP_NET_ADMIN: set it in their namespace
            gw = re.sub(r"\.2$", ".1", a)
            r = subprocess.run(["ip", "netns", "exec", h, "ip", "route", "replace", "10.213.0.0/16", "via", gw],
                               capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
        reach = ssh(addrs[ROUTER], f"timeout 5 bash -c '</dev/tcp/{addrs[WORKERS[0]]}/22' && echo reached")
        assert reach.stdout.strip() == "reached", reach.stdout + reach.stderr  # router host -> instance host
        tmp = tmp_path_factory.mktemp("router")
        r, t = deploy(_inventory(tmp, addrs), limit=",".join((ROUTER, *WORKERS)))
        assert r.returncode == 0, _fail(r, addrs)
        print(f"\ndeploy.yml, router + 2 instances: {t:.1f} s")
        yield {"tmp": tmp, "addrs": addrs, "deploy": r}
    finally:
        FORWARD.write_text(before + "\n")


def test_router_is_installed_and_requests_reach_both_instances(fleet):
    a = fleet["addrs"]
    assert re.search(r"TASK \[router : The router is ready[^\n]*\n\s*ok: \[ddt-th1\]", fleet["deploy"].stdout)
    unit = ssh(a[ROUTER], f"systemctl show -p User -p ActiveState --value {ROUTER_UNIT}; "
                          f"systemd-analyze verify --man=no /etc/systemd/system/{ROUTER_UNIT} && echo verified")
    assert unit.stdout.split() == ["ddtree-router", "active", "verified"], unit.stdout + unit.stderr
    urls = {f"http://{a[h]}:30000" for h in WORKERS}
    assert {w["url"] for w in _workers(a[ROUTER])} == urls
    # the key guards the router: without it (or with another) no request is served and nobody lists,
    # adds or drains workers
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        assert httpx.get(f"http://{a[ROUTER]}:{PORT}/workers", timeout=10, headers=headers).status_code == 401
        assert httpx.post(f"http://{a[ROUTER]}:{PORT}/workers", timeout=10, headers=headers,
                          json={"url": "http://192.0.2.1:30000"}).status_code == 401
        assert httpx.post(f"http://{a[ROUTER]}:{PORT}/generate", timeout=10, headers=headers,
                          json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 401
    cmdline = ssh(a[ROUTER], f"cat /proc/$(systemctl show -p MainPID --value {ROUTER_UNIT})/cmdline | tr '\\0' ' '; "
                             f"cat /etc/systemd/system/{ROUTER_UNIT}").stdout
    assert "ddtree_ops.router_launch" in cmdline and API_KEY not in cmdline
    assert "--remove-unhealthy-workers" in cmdline
    for h in WORKERS:  # each worker's host registers it once warm: its join unit ran, the key only in the 0600 file
        end = time.monotonic() + 60
        while True:
            j = ssh(a[h], f"systemctl is-active {JOIN_UNIT}; stat -c %a:%U {JOIN_CONFIG}; "
                          f"grep -c {API_KEY} /etc/systemd/system/{JOIN_UNIT} || true").stdout.split()
            if j[0] != "activating" or time.monotonic() > end:
                break
            time.sleep(1)
        assert j == ["active", "600:root", "0"], (h, j)
    before = _served(a[ROUTER])
    with httpx.Client(timeout=30, headers=AUTH) as c:
        for _ in range(20):
            assert c.post(f"http://{a[ROUTER]}:{PORT}/generate",
                          json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    after = _served(a[ROUTER])
    for u in urls:
        assert after.get(u, 0) - before.get(u, 0) >= 5, (u, before, after)  # round robin: both serve


@pytest.mark.slow  # two restarts one after the other, each with its warmup and gate: over a minute
def test_rolling_upgrade_through_the_router_loses_no_request(fleet):
    a = fleet["addrs"]
    inv = _inventory(fleet["tmp"], a, ddtree_service={"env": {"SGLANG_SIM_HEALTH_SECONDS": "0.04"}})
    with Load(f"http://{a[ROUTER]}:{PORT}") as load:
        time.sleep(2)
        t0 = time.monotonic()
        r = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inv), "-l", ",".join((ROUTER, *WORKERS)),
                            "-e", '{"rolling_batches": [1, 1]}', "playbooks/rolling.yml"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL)
        took = time.monotonic() - t0
        time.sleep(2)
    print(f"\nrolling upgrade of 2 instances through the router: {took:.1f} s, {load.ok} requests answered, "
          f"{load.lost} lost")
    assert r.returncode == 0, _fail(r, a)
    for task in ("Drain the instance at its routers", "Re-add the instance at its routers (warm"):
        lines = re.findall(rf"TASK \[{re.escape(task)}[^\n]*\n((?:(?!TASK).*\n)*)", r.stdout)
        print(task, lines)
        for h in WORKERS:  # each host drained / re-added at the router (delegated: "[host -> router(address)]")
            assert any(re.search(rf"changed: \[{h} -> {ROUTER}[\](]", block) for block in lines), (task, h, lines)
    assert load.ok > 50 and load.lost == 0, load.errors[:5]
    assert {w["status"] for w in _workers(a[ROUTER])} == {"ready"} and len(_workers(a[ROUTER])) == 2


def test_killed_instance_is_taken_out_and_back(fleet):
    a = fleet["addrs"]
    victim = WORKERS[1]
    url = f"http://{a[victim]}:30000"

    def state() -> str:
        w = next((w for w in _workers(a[ROUTER]) if w["url"] == url), None)
        return "absent" if w is None else ("ready" if w["status"] == "ready" and w["is_healthy"] else "out")

    assert state() == "ready"
    seen: list[tuple[float, str, str]] = []
    with Load(f"http://{a[ROUTER]}:{PORT}") as load:
        t0 = time.monotonic()
        k = ssh(a[victim], f"systemctl kill --kill-whom=main -s KILL {UNIT}")  # the server, not ExecStartPost's
        assert k.returncode == 0, k.stderr
        end = t0 + 240
        while time.monotonic() < end:
            at, st = round(time.monotonic() - t0, 1), state()  # the router first, then the unit: a worker
            active = ssh(a[victim], f"systemctl is-active {UNIT}").stdout.strip()  # ready before its unit is caught
            seen.append((at, st, active))
            if len(seen) > 2 and any(s[1] == "out" for s in seen) and seen[-1][1] == "ready":
                break
            time.sleep(0.5)
    out_at = next((t for t, s, _ in seen if s in ("out", "absent")), None)
    absent_at = next((t for t, s, _ in seen if s == "absent"), None)
    back = next(((t, act) for t, s, act in seen if out_at is not None and t > out_at and s == "ready"), None)
    print(f"\nSIGKILL -> out of rotation {out_at} s (dropped from the registry {absent_at} s), back ready {back}; "
          f"{load.ok} answered, {load.lost} lost")
    print(json.dumps(seen[-12:]))
    joined = ssh(a[victim], f"journalctl --no-pager -o cat -u {JOIN_UNIT} | tail -n 3").stdout
    print(joined)
    fleet["kill"] = {"out_at": out_at, "back": back, "seen": seen}
    assert out_at is not None, seen  # smg's health checks took it out of rotation
    assert back is not None, seen  # and back once it answers again
    assert load.lost == 0, load.errors[:5]  # smg retried what met the dead worker on the other one


def test_killed_instance_rejoins_only_once_warm(fleet):
    kill = fleet.get("kill")
    assert kill and kill["back"] is not None, "needs test_killed_instance_is_taken_out_and_back first"
    assert kill["back"][1] == "active", kill["seen"]  # back at the router only once the unit is active (warm)
    early = [x for x in kill["seen"] if x[0] > kill["out_at"] and x[1] == "ready" and x[2] != "active"]
    assert early == [], kill["seen"]  # never ready at the router while the unit was still warming up
