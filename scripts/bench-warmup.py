#!/usr/bin/env python3
"""Benchmark the warmup client against the SGLang simulator: per batch size, the server wait
(wall seconds of the rounds) beside the client's own CPU per request (figures: docs/performance.md).

The simulator (``python -m ddtree_ops.sim``, a DDTree 8/32 deployment, fast load/warmup) runs
in its own process on loopback; :func:`ddtree_ops.runtime.warmup.warmup` runs in this one, and its
CPU (``time.process_time``: every thread of this process, user + system) is read after each
batch size. The client's CPU is what ddtree-ops costs per request on the host; the rest of
the wall time is the server's (here: the simulator's step time, not a GPU).

Usage: .venv/bin/python scripts/bench-warmup.py [--batch-sizes 1,2,4,8,16] [--repeat 3]
Prints figures; it is not a test.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's ddtree_ops

SIM_ARGS = ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "models/draft",
            "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget", "32",
            "--cuda-graph-max-bs-decode", "16"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"bench-warmup: the simulator exited {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    sys.exit(f"bench-warmup: the simulator did not get ready in {timeout:g} s")


def hide_sniffio() -> None:
    """Fail ``import sniffio`` the way a missing module fails: the path finders search every
    ``sys.path`` entry (for a name that is nowhere), then ``ModuleNotFoundError``."""
    import importlib.abc
    import importlib.machinery

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "sniffio" or name.startswith("sniffio."):
                importlib.machinery.PathFinder.find_spec("sniffio_not_installed_probe")
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.modules.pop("sniffio", None)
    sys.meta_path.insert(0, Hide())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-sizes", default="1,2,4,8,16", help="within the captured 1..16")
    ap.add_argument("--repeat", type=int, default=3, help="warmups (median per batch size)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--without-sniffio", action="store_true",
                    help="make `import sniffio` fail as when it is not installed (a full sys.path search, then "
                         "ModuleNotFoundError): the cost measured before sniffio was pinned")
    args = ap.parse_args()
    if args.without_sniffio:
        hide_sniffio()
    sizes = [int(x) for x in args.batch_sizes.split(",")]

    from ddtree_ops.runtime.warmup import WarmupPlan, warmup

    try:
        import sniffio  # noqa: F401  (httpcore searches sys.path per request without it)
        have_sniffio = "installed"
    except ImportError:
        have_sniffio = "NOT installed" + (" (hidden: --without-sniffio)" if args.without_sniffio else "")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SGLANG_SIM_LOAD_SECONDS": "0.2", "SGLANG_SIM_WARMUP_SECONDS": "0.2",
           "PYTHONPATH": str(REPO)}
    sim = subprocess.Popen([sys.executable, "-m", "ddtree_ops.sim", "--model-path", "models/target", "--port",
                            str(port), *SIM_ARGS], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    rows: dict[int, list[tuple[float, float, int]]] = {}
    try:
        wait_ready(url, sim)
        for _ in range(args.repeat):
            marks = [time.process_time()]

            def progress(r, marks=marks) -> None:
                now = time.process_time()
                rows.setdefault(r.batch_size, []).append((r.latency_s, now - marks[-1], r.requests))
                marks.append(now)

            warmup(url, WarmupPlan(sizes, "bench"), 300.0, args.max_new_tokens, progress)
    finally:
        sim.terminate()
        try:
            sim.wait(10)
        except subprocess.TimeoutExpired:
            sim.kill()
            sim.wait()
    print(f"warmup client vs simulator (DDTree 8/32), {args.max_new_tokens} new tokens a request, "
          f"median of {args.repeat} warmups, sniffio {have_sniffio}")
    print(f"{'bs':>4} {'requests':>8} {'server wait s':>14} {'per request ms':>15} {'client CPU ms':>14} "
          f"{'CPU ms/request':>15} {'CPU/wait':>9}")
    for bs, samples in sorted(rows.items()):
        wall = statistics.median(w for w, _, _ in samples)
        cpu = statistics.median(c for _, c, _ in samples)
        n = samples[0][2]
        print(f"{bs:4d} {n:8d} {wall:14.3f} {wall / n * 1e3:15.2f} {cpu * 1e3:14.1f} {cpu / n * 1e3:15.3f} "
              f"{cpu / wall:8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
