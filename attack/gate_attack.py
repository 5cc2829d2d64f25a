"""Attack corpus (attack pass 7): `ddtree-ops release gate` against hostile servers on 127.0.0.1
and hostile plan.json files.

A real simulator (ddtree_ops.sim) serves a DDTree deployment; a hostile proxy in front of it
forwards everything but tampers with one path per mode. Each case runs the gate in a subprocess
with --deadline 8 and a hard 30 s timeout, and prints exit code, seconds, the checks.
Expected: exit 1 (or 0 for an honest server) within ~the deadline, one line per check, never 70.
Run: cd <worktree> && .venv/bin/python attack/gate_attack.py [MODE...]
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
from ddtree_ops.config import validate_hostvars  # noqa: E402
from ddtree_ops.render.files import plan_document  # noqa: E402
from helpers import base_hostvars  # noqa: E402
from test_sim import Sim  # noqa: E402
from test_warmup_health import _launch  # noqa: E402

PY = str(REPO / ".venv/bin/python")
MODE = {"name": "honest"}
UPSTREAM = {"base": ""}
INFLATE = {"n": 0}


def tamper_event(obj: dict, mode: str) -> dict:
    meta = obj.get("meta_info") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        if mode == "lie_verify_ct":  # 64 tokens in one verify pass: acceptance length 64
            meta["spec_verify_ct"] = 1 if meta.get("completion_tokens") else 0
        elif mode == "verify_ct_string":
            meta["spec_verify_ct"] = str(meta.get("spec_verify_ct", 1))
        elif mode == "accept_nan":
            meta["spec_accept_length"] = float("nan")
        elif mode == "accept_inf":
            meta["spec_accept_length"] = float("inf")
        elif mode == "verify_ct_zero":
            meta["spec_verify_ct"] = 0
        elif mode == "completion_negative":
            meta["completion_tokens"] = -5
        elif mode == "metrics_gen_inflated":  # no per-request figure: the gate falls back to /metrics
            meta.pop("spec_verify_ct", None); meta.pop("spec_accept_length", None)
    return obj


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):  # quiet
        pass

    def _forward(self, body: bytes | None):
        req = urllib.request.Request(UPSTREAM["base"] + self.path, data=body, method=self.command,
                                     headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
        try:
            r = urllib.request.urlopen(req, timeout=30)
            return r.status, r.headers.get("Content-Type", ""), r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read()

    def _send(self, status: int, ctype: str, data: bytes):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._handle(None)

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        self._handle(self.rfile.read(n))

    def _handle(self, body):
        mode, path = MODE["name"], self.path.split("?")[0]
        gen = path == "/generate"
        if mode == "hang_generate" and gen:
            time.sleep(40); return
        if mode == "trickle_generate" and gen:
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            try:
                for _ in range(400):
                    self.wfile.write(b":"); self.wfile.flush(); time.sleep(0.1)
            except OSError:
                pass
            return
        if mode == "huge_generate" and gen:
            self.send_response(200); self.send_header("Content-Type", "text/event-stream"); self.end_headers()
            try:
                chunk = b"data: " + b'{"text": "' + b"A" * 60000 + b'"}\n\n'
                for _ in range(5000):  # 300 MB
                    self.wfile.write(chunk)
            except OSError:
                pass
            return
        if mode == "malformed_generate" and gen:
            return self._send(200, "text/event-stream", b"data: {not json\n\ndata: [DONE]\n\n")
        if mode == "deep_generate" and gen:
            return self._send(200, "text/event-stream", b"data: " + b"[" * 200000 + b"\n\ndata: [DONE]\n\n")
        if mode == "trickle_health" and path == "/health":
            self.send_response(200); self.send_header("Content-Length", "1000"); self.end_headers()
            try:
                for _ in range(400):
                    self.wfile.write(b"x"); self.wfile.flush(); time.sleep(0.1)
            except OSError:
                pass
            return
        if (mode == "hang_server_info" and path in ("/server_info", "/get_server_info")) or (
                mode == "hang_metrics" and path == "/metrics"):
            time.sleep(40); return
        if mode == "huge_server_info" and path in ("/server_info", "/get_server_info"):
            return self._send(200, "application/json", b'{"a": "' + b"x" * (50 << 20) + b'"}')
        if mode == "deep_server_info" and path in ("/server_info", "/get_server_info"):
            return self._send(200, "application/json", b"[" * 500000)
        if mode == "server_info_nan" and path in ("/server_info", "/get_server_info"):
            st, ct, data = self._forward(body)
            doc = json.loads(data)
            for k in list(doc)[:50]:
                if isinstance(doc[k], (int, float)) and not isinstance(doc[k], bool):
                    doc[k] = float("nan")
            return self._send(st, ct, json.dumps(doc).encode())
        if mode in ("metrics_nan", "metrics_huge_counts") and path == "/metrics":
            st, ct, data = self._forward(body)
            lines = []
            for ln in data.decode().splitlines():
                if ln and not ln.startswith("#") and ("spec" in ln or "accept" in ln or "verify" in ln):
                    name = ln.rsplit(" ", 1)[0]
                    ln = f"{name} {'NaN' if mode == 'metrics_nan' else '1e308'}"
                lines.append(ln)
            return self._send(st, ct, ("\n".join(lines) + "\n").encode())
        if mode == "metrics_gen_inflated" and path == "/metrics":
            st, ct, data = self._forward(body)
            INFLATE["n"] += 1
            out = []
            for ln in data.decode().splitlines():
                if ln.startswith("sglang:generation_tokens_total"):
                    name, val = ln.rsplit(" ", 1)
                    ln = f"{name} {float(val) + INFLATE['n'] * 1e6}"
                out.append(ln)
            return self._send(st, ct, ("\n".join(out) + "\n").encode())
        st, ct, data = self._forward(body)
        if gen and mode not in ("honest",):
            out = []
            for ln in data.split(b"\n"):
                if ln.startswith(b"data: {"):
                    obj = tamper_event(json.loads(ln[6:]), mode)
                    ln = b"data: " + json.dumps(obj).encode()
                out.append(ln)
            data = b"\n".join(out)
        self._send(st, ct, data)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


def gate(plan: Path, url: str, deadline: str = "8") -> tuple:
    t0 = time.monotonic()
    try:
        p = subprocess.run([PY, "-c", "import sys; from ddtree_ops.cli import main; sys.exit(main())", "release", "gate",
                            "--plan", str(plan), "--url", url, "--deadline", deadline, "--requests", "4",
                            "--max-new-tokens", "64"], capture_output=True, text=True, timeout=30, cwd=REPO)
        rc, text = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        rc, text = "TIMEOUT", ""
    return rc, round(time.monotonic() - t0, 1), text


SERVER_MODES = ["honest", "lie_verify_ct", "verify_ct_string", "accept_nan", "accept_inf", "verify_ct_zero",
                "completion_negative", "hang_generate", "trickle_generate", "huge_generate", "malformed_generate",
                "deep_generate", "trickle_health", "huge_server_info", "deep_server_info", "server_info_nan",
                "metrics_nan", "metrics_huge_counts", "metrics_gen_inflated", "hang_server_info", "hang_metrics"]


def plan_cases(tmp: Path, good: dict) -> dict[str, Path]:
    out = {}

    def w(name, data: bytes):
        p = tmp / f"plan-{name}.json"; p.write_bytes(data); out[name] = p

    w("deep", b'{"a":' + b"[" * 100000 + b"]" * 100000 + b"}")
    w("huge", b'{"a": "' + b"x" * (6 << 20) + b'"}')
    w("nan_floor", json.dumps({**good, "deployment": {**good["deployment"], "ops": {
        **good["deployment"]["ops"], "accept_length_floor": float("nan")}}}).encode())
    w("floor_string", json.dumps({**good, "deployment": {**good["deployment"], "ops": {
        **good["deployment"]["ops"], "accept_length_floor": "3"}}}).encode())
    w("url_evil", json.dumps({**good, "url": "http://127.0.0.1:1/\x1b]0;x\x07"}).encode())
    w("marker_dev_zero", json.dumps({**good, "paths": {**good["paths"], "warm_marker": "/dev/zero"}}).encode())
    fifo = tmp / "marker.fifo"; os.mkfifo(fifo)
    w("marker_fifo", json.dumps({**good, "paths": {**good["paths"], "warm_marker": str(fifo)}}).encode())
    w("binary", os.urandom(2048))
    w("list", b"[]")
    pf = tmp / "plan-fifo.json"; os.mkfifo(pf); out["plan_is_fifo"] = pf
    return out


def main() -> None:
    only = sys.argv[1:]
    tmp = Path(tempfile.mkdtemp(prefix="atk7-gate-"))
    hv = base_hostvars()
    hv["ddtree_sglang"] = {"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree"}
    hv["ddtree_ops"] = {**hv.get("ddtree_ops", {}), "accept_length_floor": 3.0}
    v = validate_hostvars("h1", hv)
    sim = Sim(tmp, _launch(v), env={"SGLANG_SIM_ACCEPT_LENGTH": "1.2"})  # a collapsed acceptance: must FAIL
    sim.wait_ready()
    UPSTREAM["base"] = sim.base
    doc = plan_document(v)
    marker = tmp / "warm.json"
    marker.write_text(json.dumps({"batch_sizes": [1], "elapsed_s": 0.1}))
    doc["paths"]["warm_marker"] = str(marker)
    plan = tmp / "plan.json"
    plan.write_text(json.dumps(doc))
    port = free_port()
    srv = ThreadingHTTPServer(("127.0.0.1", port), Proxy)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{port}"
    try:
        for mode in SERVER_MODES:
            if only and mode not in only:
                continue
            MODE["name"] = mode
            rc, s, text = gate(plan, proxy)
            show(f"server:{mode}", rc, s, text)
        MODE["name"] = "honest"
        # a TCP socket that never answers
        with socket.socket() as ls:
            ls.bind(("127.0.0.1", 0)); ls.listen(16)
            if not only or "silent_socket" in only:
                rc, s, text = gate(plan, f"http://127.0.0.1:{ls.getsockname()[1]}")
                show("server:silent_socket", rc, s, text)
        for name, p in plan_cases(tmp, doc).items():
            if only and name not in only:
                continue
            rc, s, text = gate(p, proxy)
            show(f"plan:{name}", rc, s, text)
    finally:
        srv.shutdown()
        sim.stop()


def show(name, rc, s, text):
    fails = [ln.strip()[:150] for ln in text.splitlines() if ln.startswith(("FAIL", "error"))]
    tb = " TRACEBACK" if "Traceback" in text else ""
    print(f"{name:32s} rc={rc!s:8s} {s:>5}s{tb} | {' || '.join(fails)[:400] or text.strip()[:200]!r}", flush=True)


if __name__ == "__main__":
    main()
