"""The prometheus_targets role's readiness waits (the reload handler's and tasks/configure.yml's),
as written, under a real ansible-playbook against loopback fake Prometheus servers: each attempt is
bounded as a whole (a server trickling header lines held the task forever: the uri ``timeout`` is
per socket read), a redirect is not followed (ready must be the Prometheus the reload signals), and
the worst case of each wait is (retries + 1) x (task timeout + delay)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import REPO

PLAYBOOK = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(PLAYBOOK is None, reason="ansible-playbook not installed next to this Python")

ROLE = REPO / "roles" / "prometheus_targets"


def _waits() -> dict[str, dict]:
    handlers = yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())
    handler = next(t for t in handlers if "ansible.builtin.uri" in t)
    task = next(t for t in yaml.safe_load((ROLE / "tasks" / "configure.yml").read_text()) if "ansible.builtin.uri" in t)
    return {"handler": handler, "configure": task}


def _serve(answer) -> tuple[int, socket.socket]:
    """A loopback server that calls ``answer(conn)`` for each connection (in a thread)."""
    srv = socket.create_server(("127.0.0.1", 0))

    def loop():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=_guard, args=(answer, c), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return srv.getsockname()[1], srv


def _guard(answer, c):
    try:
        c.recv(65536)
        answer(c)
    except OSError:
        pass
    finally:
        c.close()


def _run(tmp_path: Path, task: dict, url: str) -> tuple[subprocess.CompletedProcess, float]:
    task = {k: v for k, v in task.items() if k != "listen"}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "mon": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (tmp_path / "pb.yml").write_text(yaml.safe_dump([{"hosts": "all", "gather_facts": False, "tasks": [task]}]))
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    r = subprocess.run([PLAYBOOK, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "pb.yml"),
                        "-e", f"prometheus_targets_web_url={url}"], capture_output=True, text=True, timeout=120,
                       cwd=REPO, env=env)
    return r, time.monotonic() - t0


@pytest.mark.parametrize("name", ["handler", "configure"])
def test_each_wait_is_bounded_as_a_whole(name):
    t = _waits()[name]
    uri = t["ansible.builtin.uri"]
    assert uri["follow_redirects"] == "none" and uri["timeout"] < t["timeout"]
    worst = (t["retries"] + 1) * (t["timeout"] + t["delay"])
    assert worst <= {"handler": 488, "configure": 248}[name]  # 61 x 8 s and 31 x 8 s, measured bound of one attempt


def test_a_server_that_trickles_headers_fails_the_wait_at_the_task_timeout(tmp_path):
    """Before: one header line every 2 s kept the uri module reading past its 5 s timeout for good
    (the role's handler, as written with retries 2, was still waiting when killed after 100 s)."""
    stop = threading.Event()

    def trickle(c):
        c.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(1):
            c.sendall(b"X-Slow: 1\r\n")

    port, srv = _serve(trickle)
    try:
        task = {**_waits()["handler"], "retries": 0}  # one attempt: the bound under test is per attempt
        r, took = _run(tmp_path, task, f"http://127.0.0.1:{port}")
    finally:
        stop.set()
        srv.close()
    assert r.returncode == 2, r.stdout[-2000:]
    assert f"Timed out after {task['timeout']} second" in r.stdout
    assert took < task["timeout"] + 8  # the task's timeout plus ansible-playbook's start


def test_a_redirect_is_not_taken_for_ready(tmp_path):
    """A /-/ready that redirects to another server answering 200 is not this Prometheus being ready
    (uri followed it before, and the handler then signalled a Prometheus that had not said ready)."""
    ok_port, ok = _serve(lambda c: c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"))
    loc = f"http://127.0.0.1:{ok_port}/-/ready".encode()
    port, srv = _serve(lambda c: c.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + loc +
                                           b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
    try:
        r, _ = _run(tmp_path, {**_waits()["configure"], "retries": 0}, f"http://127.0.0.1:{port}")
    finally:
        srv.close()
        ok.close()
    assert r.returncode == 2 and "302" in r.stdout, r.stdout[-2000:]


def test_a_prometheus_ready_after_a_while_passes_the_wait_as_written(tmp_path):
    seen: list[int] = []

    def answer(c):  # 503 twice (starting up), then ready
        seen.append(1)
        code = b"200 OK" if len(seen) > 2 else b"503 Service Unavailable"
        c.sendall(b"HTTP/1.1 " + code + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    port, srv = _serve(answer)
    try:
        r, _ = _run(tmp_path, _waits()["handler"], f"http://127.0.0.1:{port}")
    finally:
        srv.close()
    assert r.returncode == 0, r.stdout[-2000:]
    assert r.stdout.count("FAILED - RETRYING") == 2 and len(seen) == 3  # it waited through the 503s
