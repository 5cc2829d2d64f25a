"""Device side: measurements of the real router (smg) in front of real SGLang workers.

    router_measure.py latency ROUTER DIRECT[,DIRECT...] LEVELS ROUNDS OUT.json
        the same requests direct to the workers (the client spreads them round-robin, so both
        paths load the same workers) and through the router, side by side: for each concurrency
        level, ROUNDS alternating rounds (direct, router, direct, ...), every request timed on its
        own; p50/p99 per path and level, and the router's added latency.
    router_measure.py crash ROUTER WORKER KILL_CMD RESTART_CMD OUT.json [JOIN_CMD]
        traffic through the router while the worker is SIGKILLed: seconds from the kill until the
        router's /workers says it is unhealthy, then the restart command (which returns when the
        worker answers /health, or once it is warm when it runs the warmup too), and seconds from
        then until the router says it is healthy again; requests sent, failed and their status codes
        over the whole time. With JOIN_CMD (what the join unit runs once the SGLang unit is warm),
        the router is polled from the kill on: when it dropped the worker, whether it listed it again
        before the join ran (it must not, with --remove-unhealthy-workers), then seconds from the
        join until it is healthy.

Standard library only; every wait has a deadline (the device call ends at 600 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

BODY = json.dumps({"text": "The quick brown fox jumps over the lazy dog. " * 4,
                   "sampling_params": {"max_new_tokens": 16, "temperature": 0}}).encode()


def one(url: str, timeout: float = 60.0) -> tuple[float, int]:
    """Seconds and HTTP status of one /generate (0: no answer)."""
    t = time.perf_counter()
    req = urllib.request.Request(url + "/generate", data=BODY, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read(1 << 20)
            code = r.status
    except urllib.error.HTTPError as e:
        code = e.code
    except (OSError, ValueError):
        code = 0
    return time.perf_counter() - t, code


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def latency(router: str, direct: str, levels: str, rounds: str, out: str) -> None:
    workers = direct.split(",")
    res: dict[str, object] = {"router": router, "direct": workers, "levels": {}}
    for c in (int(x) for x in levels.split(",")):
        per: dict[str, list[float]] = {"direct": [], "router": []}
        fails: dict[str, int] = {"direct": 0, "router": 0}
        n = max(4 * c, 32)
        with ThreadPoolExecutor(c) as pool:
            for _ in range(int(rounds)):
                for name in ("direct", "router"):
                    urls = workers if name == "direct" else [router]
                    for s, code in pool.map(lambda i, u=urls: one(u[i % len(u)]), range(n)):
                        (per[name].append(s) if code == 200 else None)
                        fails[name] += code != 200
        lv = {name: {"n": len(v), "failed": fails[name], "p50_ms": round(pct(v, 0.5) * 1e3, 2),
                     "p99_ms": round(pct(v, 0.99) * 1e3, 2)} for name, v in per.items() if v}
        if len(lv) == 2:
            lv["added_p50_ms"] = round(lv["router"]["p50_ms"] - lv["direct"]["p50_ms"], 2)
            lv["added_p99_ms"] = round(lv["router"]["p99_ms"] - lv["direct"]["p99_ms"], 2)
        res["levels"][str(c)] = lv  # type: ignore[index]
        print(f"concurrency {c}: {json.dumps(lv)}", flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def healthy(router: str, worker: str) -> bool | None:
    """The router's view of one worker: True/False, None when absent or unreadable."""
    try:
        with urllib.request.urlopen(router + "/workers", timeout=5) as r:
            doc = json.loads(r.read(4 << 20))
    except (OSError, ValueError):
        return None
    for w in doc.get("workers", []) if isinstance(doc, dict) else []:
        if isinstance(w, dict) and w.get("url") == worker:
            return bool(w.get("is_healthy"))
    return None


def wait_for(router: str, worker: str, want: bool, deadline_s: float) -> float | None:
    """Seconds until the router sees the worker healthy (``want``) or out of rotation (not ``want``:
    unhealthy, or no longer listed at all once it left)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        h = healthy(router, worker)
        if h is True if want else h is not True:
            return time.monotonic() - t0
        time.sleep(0.2)
    return None


def crash(router: str, worker: str, kill_cmd: str, restart_cmd: str, out: str, join_cmd: str = "") -> None:
    stop = threading.Event()
    seen: list[tuple[float, bool | None]] = []  # (seconds since the kill, the router's view) on every change

    def watch(t_kill: float) -> None:
        last: object = object()
        while not stop.is_set() and time.monotonic() - t_kill < 400:
            h = healthy(router, worker)
            if h != last:
                seen.append((round(time.monotonic() - t_kill, 2), h))
                last = h
            time.sleep(0.25)

    codes: dict[int, int] = {}
    lock = threading.Lock()

    def load() -> None:
        while not stop.is_set():
            _s, code = one(router, timeout=30)
            with lock:
                codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=load, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(3)
    res: dict[str, object] = {"worker": worker, "healthy_before": healthy(router, worker)}
    res["kill_cmd"], res["restart_cmd"] = kill_cmd, restart_cmd
    t_kill = time.monotonic()
    watcher = threading.Thread(target=watch, args=(t_kill,), daemon=True)
    watcher.start()
    subprocess.run(["bash", "-c", kill_cmd], check=False, timeout=30)
    res["s_kill_to_unhealthy"] = wait_for(router, worker, False, 120)
    t = time.monotonic()
    rc = subprocess.run(["bash", "-c", restart_cmd], check=False, timeout=300).returncode
    res["restart_rc"], res["s_restart_to_warm"] = rc, round(time.monotonic() - t, 2)
    if join_cmd:
        res["join_cmd"] = join_cmd
        t_join = time.monotonic() - t_kill
        res["s_kill_to_join"] = round(t_join, 2)
        res["listed_healthy_before_join"] = any(h is True and at < t_join for at, h in seen[1:])
        res["s_kill_to_dropped"] = next((at for at, h in seen if h is None and at > 0), None)
        j = subprocess.run(["bash", "-c", join_cmd], check=False, timeout=120, capture_output=True, text=True)
        res["join_rc"], res["join_output"] = j.returncode, (j.stdout + j.stderr)[-2000:]
        t = time.monotonic()
    res["s_warm_to_healthy" if not join_cmd else "s_join_to_healthy"] = wait_for(router, worker, True, 120)
    time.sleep(2)
    stop.set()
    for t in threads:
        t.join(40)
    watcher.join(5)
    res["router_view"] = seen
    res["requests"] = {str(k): v for k, v in sorted(codes.items())}
    res["failed"] = sum(v for k, v in codes.items() if k != 200)
    print(json.dumps(res), flush=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    {"latency": latency, "crash": crash}[cmd](*rest)
