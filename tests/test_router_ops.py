"""The router in operation: a worker's drain and re-add through smg 1.13.0's worker API
(``ddtree_ops.fleet.router_worker``), ``fleet status``'s router column
(``ddtree_ops.fleet.router_status``), the facts the ``router`` role copies (byte-identical to
``ddtree-ops render``) and the router wheelhouse's install commands.

The stand-in router below answers as the real smg 1.13.0 did in front of the simulator and on an
H200 (``tests/fixtures/gpu/router-smg-1.13.0-sglang-0.5.17-h200-2026-12-02/workers.json``: the
worker objects; ``DELETE /workers/{id}`` 202 then ``draining`` for the settle window then gone;
``POST /workers`` 202 then ``ready``). The real smg itself runs in tests/hosts/test_router_host.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import FIXTURES
from test_router import _instance, _one

from ddtree_ops.fleet import router_status, router_worker
from ddtree_ops.fleet.router_worker import Api, RouterError, state_of

GPU = FIXTURES / "gpu" / "router-smg-1.13.0-sglang-0.5.17-h200-2026-12-02"
RECORDED = json.loads((GPU / "workers.json").read_text())
KEY = "k3y-for-the-workers-0123456789"


class StandInSmg:
    """smg 1.13.0's worker registry over HTTP, with its drain settle window (``--drain-settle-secs``)."""

    def __init__(self, urls: list[str], settle_s: float = 0.6, ready_after_s: float = 0.3):
        template = RECORDED["workers"][0]
        self.settle_s, self.ready_after_s = settle_s, ready_after_s
        self.lock = threading.Lock()
        self.workers: dict[str, dict] = {}
        self.auth: list[str | None] = []
        for u in urls:
            self._put(u, "ready")
        srv = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                srv.auth.append(self.headers.get("Authorization"))
                if self.path != "/workers":
                    return self._send(404, {"error": "not found"})
                with srv.lock:
                    srv._advance()
                    ws = [{**template, **w} for w in srv.workers.values()]
                self._send(200, {"workers": ws, "total": len(ws), "stats": {"regular_count": len(ws)}})

            def do_DELETE(self):  # noqa: N802
                wid = self.path.removeprefix("/workers/")
                with srv.lock:
                    w = srv.workers.get(wid)
                    if w is None:
                        return self._send(404, {"error": "worker not found"})
                    w.update(status="draining", is_healthy=False, _until=time.monotonic() + srv.settle_s)
                self._send(202, {"status": "accepted", "worker_id": wid,
                                 "message": "Worker removal queued for background processing"})

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length", 0))
                url = json.loads(self.rfile.read(n))["url"]
                with srv.lock:
                    wid = srv._put(url, "pending", time.monotonic() + srv.ready_after_s)
                self._send(202, {"status": "accepted", "worker_id": wid, "url": url, "location": f"/workers/{wid}"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.api = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def _put(self, url: str, status: str, until: float | None = None) -> str:
        wid = str(uuid.uuid4())
        self.workers[wid] = {"id": wid, "url": url, "status": status, "is_healthy": status == "ready", "_until": until}
        return wid

    def _advance(self) -> None:
        now = time.monotonic()
        for wid, w in list(self.workers.items()):
            if w["_until"] is not None and now >= w["_until"]:
                if w["status"] == "draining":
                    del self.workers[wid]
                else:
                    w.update(status="ready", is_healthy=True, _until=None)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def smg():
    s = StandInSmg(["http://10.0.0.5:30000", "http://10.0.0.6:30000"])
    yield s
    s.close()


def test_states_of_the_recorded_registries():
    """smg's answers on the H200: both ready before the crash; the restarted worker back after."""
    assert state_of(RECORDED["workers"], "http://127.0.0.1:30003") == "ready"
    assert state_of(RECORDED["workers"], "http://127.0.0.1:30003/") == "ready"
    assert state_of(RECORDED["workers"], "http://127.0.0.1:30009") == "absent"
    sick = [{**w, "is_healthy": False} for w in RECORDED["workers"]]
    assert state_of(sick, "http://127.0.0.1:30001") == "unhealthy"
    after = json.loads((GPU / "workers_after_crash.json").read_text())["workers"]
    assert {state_of(after, w["url"]) for w in after} == {"ready"}


def test_drain_waits_out_the_settle_window_and_add_waits_until_ready(smg):
    api = Api(smg.api)
    t0 = time.monotonic()
    out = router_worker.drain(api, "http://10.0.0.6:30000", deadline_s=10)
    assert out["was_listed"] and time.monotonic() - t0 >= smg.settle_s
    reg = router_worker.workers(api, time.monotonic() + 5)
    assert state_of(reg, "http://10.0.0.6:30000") == "absent" and state_of(reg, "http://10.0.0.5:30000") == "ready"
    assert router_worker.drain(api, "http://10.0.0.6:30000", deadline_s=5)["was_listed"] is False  # idempotent
    out = router_worker.add(api, "http://10.0.0.6:30000", deadline_s=10)
    assert out["was"] == "absent" and out["seconds"] >= smg.ready_after_s - 0.05
    assert state_of(router_worker.workers(api, time.monotonic() + 5), "http://10.0.0.6:30000") == "ready"
    assert router_worker.add(api, "http://10.0.0.6:30000", deadline_s=5)["was"] == "ready"  # no second entry
    assert len(smg.workers) == 2


def test_every_call_has_a_total_deadline(smg):
    smg.settle_s = 30
    t0 = time.monotonic()
    with pytest.raises(RouterError, match=r"still draining at the router after 1\.5 s"):
        router_worker.drain(Api(smg.api), "http://10.0.0.5:30000", deadline_s=1.5)
    assert time.monotonic() - t0 < 4
    with pytest.raises(RouterError, match="readiness not ready after 1 s"):
        router_worker.wait_ready(smg.api, deadline_s=1)  # the stand-in has no /readiness: 404 until the deadline
    with pytest.raises(RouterError, match="must be http"):
        Api("file:///etc/passwd")


def test_key_comes_from_a_0600_file_and_is_never_printed(smg, tmp_path, capsys):
    key = tmp_path / "api-key"
    key.write_text(KEY + "\n")
    key.chmod(0o644)
    rc = router_worker.main(["list", "--api", smg.api, "--api-key-file", str(key)])
    assert rc == 1 and "mode 0644" in capsys.readouterr().out
    key.chmod(0o600)
    assert router_worker.main(["list", "--api", smg.api, "--api-key-file", str(key), "--deadline", "5"]) == 0
    assert router_worker.main(["drain", "--api", smg.api, "--worker", "http://10.0.0.5:30000",
                               "--api-key-file", str(key), "--deadline", "10"]) == 0
    out = capsys.readouterr()
    assert KEY not in out.out + out.err
    assert f"Bearer {KEY}" in smg.auth and None not in smg.auth
    assert json.loads(out.out.splitlines()[0])["workers"][0]["state"] == "ready"
    os.symlink(key, tmp_path / "link")
    assert router_worker.main(["list", "--api", smg.api, "--api-key-file", str(tmp_path / "link")]) == 1


def test_router_column_per_instance(smg):
    fleet = [_instance("gpu-a", "10.0.0.5", 30000), _instance("gpu-b", "10.0.0.6", 30000),
             _instance("gpu-c", "10.0.0.7", 30000)]
    (r,), errors = _one(fleet, {"instances": ["gpu-a", "gpu-b"]}, address="127.0.0.1")
    assert not errors
    port = int(smg.api.rsplit(":", 1)[1])
    r = type(r)(r.host, r.address, r.settings.model_copy(update={"port": port}), r.workers, r.dp_aware, None)
    router_worker.drain(Api(smg.api), "http://10.0.0.6:30000", deadline_s=10)
    cells = router_status.cells([r], router_status.registries([r], 5), fleet)
    assert cells == {"gpu-a": "gw-1: ready", "gpu-b": "gw-1: absent"}  # gpu-c is not behind it
    smg.close()
    t0 = time.monotonic()
    assert router_status.cells([r], router_status.registries([r], 2), fleet)["gpu-a"] == "gw-1: unreachable"
    assert time.monotonic() - t0 < 5


def test_fleet_status_shows_the_router_column(monkeypatch, capsys):
    from ddtree_ops import cli
    from ddtree_ops.cli import fleet as fleet_cli
    from ddtree_ops.fleet import ssh as fleet_ssh

    rows = [fleet_ssh.HostStatus("gpu-a", ok=True, release="abc", active_state="active", sub_state="running"),
            fleet_ssh.HostStatus("gpu-b", ok=True, release="abc", active_state="active", sub_state="running")]
    monkeypatch.setattr(fleet_cli, "_targets", lambda *a: ([], "/dev/null"))
    monkeypatch.setattr(fleet_cli, "_limits", lambda *a, **k: type("L", (), {"deadline_s": 1.0})())
    monkeypatch.setattr(fleet_ssh, "status", lambda targets, limits: rows)
    monkeypatch.setattr(router_status, "fleet_cells", lambda inv, vault: {"gpu-b": "gw-1: draining"})
    def run(*args: str) -> str:
        rc = cli.main(["fleet", "status", "-i", "inventory/example", *args])
        text = capsys.readouterr().out
        assert rc == 0, text
        return text

    assert [h["router"] for h in json.loads(run("--json"))["hosts"]] == [None, "gw-1: draining"]
    lines = run().splitlines()
    assert any("router" in line and "drift" in line for line in lines), lines
    assert "gw-1: draining" in next(line for line in lines if "gpu-b" in line)


def test_role_copies_the_rendered_unit_bytes(tmp_path):
    """ddtree_prometheus' router facts carry the unit exactly as `ddtree-ops render` writes it;
    the key's value is not among them (the role writes it under no_log)."""
    from test_fleet import _hostvars, _prometheus_action

    from ddtree_ops.render.router import render_router

    hv = {"h1": _hostvars("h1", "10.0.0.5"),
          "gw": {"inventory_hostname": "gw", "ansible_host": "10.0.0.9",
                 "ddtree_router": {"api_key_secret": "K"}, "ddtree_secret_env": {"K": KEY}}}
    result = _prometheus_action({"hostvars": hv}, ["h1"], routers=["gw"], fleet_only=True)
    assert not result.get("failed"), result.get("msg")
    facts = result["routers"]["gw"]
    from ddtree_ops.config import validate_hostvars
    from ddtree_ops.config.router import validate_routers

    h1 = {k: v for k, v in hv["h1"].items() if k not in ("inventory_hostname", "group_names")}
    (router,), errors = validate_routers({"gw": hv["gw"]}, [validate_hostvars("h1", h1)])
    assert not errors
    files = {f.path: f for f in render_router(router)}
    assert facts["unit_content"] == files[facts["unit_path"]].content
    assert facts["key_path"] == "/etc/ddtree-router/api-key" and files[facts["key_path"]].mode == "0600"
    assert KEY not in json.dumps(result)
    assert (facts["api"], facts["health"]) == ("http://127.0.0.1:30080", "http://127.0.0.1:30081")
    (front,) = result["router_fronts"]["h1"]
    assert front["router"] == "gw" and front["worker"] == facts["workers"][0]


def test_router_install_steps_are_offline():
    from ddtree_ops.config.router import SMG_VERSION
    from ddtree_ops.fleet.router_wheelhouse import RouterWheelhouseError, install_steps, wheelhouse_id
    from ddtree_ops.sglang.wheelhouse import WheelhouseError

    steps = install_steps({"requirement": f"smg=={SMG_VERSION}"}, "/opt/r/venv", "/opt/wh/smg", "/opt/wh/ops")
    assert [s["argv"][-1] for s in steps] == [f"smg=={SMG_VERSION}", "ddtree-ops"]
    assert all("--no-index" in s["argv"] and s["argv"][0] == "/opt/r/venv/bin/python" for s in steps)
    with pytest.raises(RouterWheelhouseError, match="smg==0.9"):
        install_steps({"requirement": "smg==0.9"}, "/opt/r/venv", "/opt/wh/smg", "/opt/wh/ops")
    with pytest.raises(WheelhouseError, match="find_links"):
        install_steps({"requirement": f"smg=={SMG_VERSION}"}, "/opt/r/venv", "https://example.com/", "/opt/wh/ops")
    assert wheelhouse_id("cp311") != wheelhouse_id("cp312") and len(wheelhouse_id("cp311")) == 16
