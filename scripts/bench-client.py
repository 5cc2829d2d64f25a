#!/usr/bin/env python3
"""The bench client's own cost: at concurrency 1, 64 and 256, against the SGLang
simulator, our ``ddtree-ops bench`` client side by side with SGLang's own ``bench_serving``
request function, as ratios.

Per client and concurrency, the figures are:

* **CPU per token**: the client process's CPU (``time.process_time``, all threads, user +
  system; imports excluded) over the tokens it received.
* **ITL error**: the client's mean per-token ITL against the server's own mean per-token ITL
  over the same run (the simulator's ``sglang:inter_token_latency_seconds`` histogram,
  ``sum/count`` deltas: each decode emission's gap / its tokens, taken in the scheduler when
  the tokens are emitted). ``max_new_tokens`` = 1 + 4k and an acceptance length of 4 make
  every decode chunk carry 4 tokens, so the per-emission and per-token means are the same
  quantity. The error includes the simulator's own delivery (its HTTP threads share the
  CPUs with the client), the same for both clients.

Each client runs in its own process (so ``process_time`` is its own): ours with this
checkout's ``ddtree_ops.runtime.bench``; SGLang's ``async_request_sglang_generate`` from
``sglang/benchmark/serving.py`` of the cached real SGLang 0.5.23 venv, driven as
``bench_serving`` drives it (an ``asyncio.Semaphore`` of the concurrency around every
request, all requests gathered). That venv lacks ``transformers`` and ``datasets`` (no model
tokenizer is needed here), so the worker stubs those two imports, SGLang's transformers
patches and ``sglang.srt.disaggregation.utils`` (only its ``FAKE_BOOTSTRAP_HOST`` constant
is used); the request function itself runs unmodified.

Usage: .venv/bin/python scripts/bench-client.py [--concurrency 1,64,256] [--step 0.02]
       [--max-new-tokens 129] [--sglang-python PATH]
Prints figures; it is not a test.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SIM_ARGS = ["--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "models/draft",
            "--speculative-dflash-block-size", "8", "--speculative-ddtree-budget", "32", "--enable-metrics"]
ACCEPT = 4


def sglang_venv_python(version: str = "0.5.23") -> Path:
    """The python of ``scripts/sglang-venv.sh VERSION``'s cached venv (the key formula of
    ``tests/peer/peerutil.py``: the first 12 hex digits of the lock file's SHA-256)."""
    root = Path(os.environ.get("DDTREE_SGLANG_VENV_ROOT", "/var/cache/ddtree-ops/sglang-venv"))
    lock = REPO / "requirements" / f"sglang-{version}-import.txt"
    return root / f"{version}-{hashlib.sha256(lock.read_bytes()).hexdigest()[:12]}" / "bin" / "python"


# ------------------------------------------------------------------ workers (one process each)
def worker_ours(url: str, concurrency: int, requests: int, tokens: int) -> dict:
    sys.path.insert(0, str(REPO))
    from ddtree_ops.runtime.bench import BenchOptions, Prompt, run

    c0, t0 = time.process_time(), time.perf_counter()
    res = run(BenchOptions(url=url, concurrency=(concurrency,), requests=requests, max_new_tokens=tokens,
                           warmup_requests=0), [Prompt("benchmark the client of ddtree-ops please")])
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    lv = res.levels[0]
    return {"cpu_s": cpu, "wall_s": wall, "tokens": lv.output_tokens, "ok": lv.ok, "failed": lv.failed,
            "itl_mean_s": lv.itl_s["mean"], "ttft_mean_s": lv.ttft_s["mean"], "errors": lv.errors,
            "event_loop": res.client["event_loop"]}


def _stub_imports() -> None:
    import importlib.abc
    import importlib.machinery
    import types

    stubbed = {"transformers", "datasets"}

    class Meta(type):
        def __getattr__(cls, n):
            if n.startswith("__"):
                raise AttributeError(n)
            return Any()

    class Any(metaclass=Meta):
        def __init__(self, *a, **k) -> None:
            pass

        def __call__(self, *a, **k):
            return Any()

        def __getattr__(self, n):
            if n.startswith("__"):
                raise AttributeError(n)
            return Any()

    class Stub(types.ModuleType):
        __path__: list[str] = []

        def __getattr__(self, n):
            if n.startswith("__"):
                raise AttributeError(n)
            return Meta(n, (Any,), {})

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in stubbed:
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return Stub(spec.name)

        def exec_module(self, module) -> None:
            pass

    sys.meta_path.insert(0, Finder())
    patches = types.ModuleType("sglang.srt.utils.hf_transformers_patches")
    patches.apply_all = lambda *a, **k: None
    dis = types.ModuleType("sglang.srt.disaggregation.utils")
    dis.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # its value in SGLang 0.5.23
    sys.modules[patches.__name__] = patches
    sys.modules[dis.__name__] = dis


def worker_sglang(url: str, concurrency: int, requests: int, tokens: int) -> dict:
    import argparse as ap
    import asyncio

    _stub_imports()
    import sglang.benchmark.serving as bs

    bs.args = ap.Namespace(temperature=0.0, disable_ignore_eos=False, top_p=1.0, disable_stream=False,
                           return_logprob=False, return_routed_experts=False, logprob_start_len=-1,
                           top_logprobs_num=0, token_ids_logprob=None, cache_report=False, header=None)
    inp = bs.RequestFuncInput(prompt="benchmark the client of ddtree-ops please", api_url=url + "/generate",
                              prompt_len=7, output_len=tokens, model="m", lora_name=None, image_data=None,
                              extra_request_body={})

    async def main() -> list:
        sem = asyncio.Semaphore(concurrency)

        async def limited():
            async with sem:
                return await bs.async_request_sglang_generate(inp)

        return await asyncio.gather(*(limited() for _ in range(requests)))

    c0, t0 = time.process_time(), time.perf_counter()
    outs = asyncio.run(main())
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    ok = [o for o in outs if o.success]
    itl = [x for o in ok for x in o.itl]
    return {"cpu_s": cpu, "wall_s": wall, "tokens": sum(o.output_len for o in ok), "ok": len(ok),
            "failed": len(outs) - len(ok), "itl_mean_s": sum(itl) / len(itl) if itl else None,
            "ttft_mean_s": sum(o.ttft for o in ok) / len(ok) if ok else None,
            "errors": list({o.error[-200:] for o in outs if not o.success})[:3]}


# ------------------------------------------------------------------ driver
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def server_itl(url: str) -> tuple[float, float]:
    vals = {}
    for line in http_get(url + "/metrics").splitlines():
        for k in ("sum", "count"):
            if line.startswith(f"sglang:inter_token_latency_seconds_{k}"):
                vals[k] = float(line.rsplit(" ", 1)[1])
    return vals["sum"], vals["count"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,64,256")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: max(8, 2 x concurrency))")
    ap.add_argument("--step", type=float, default=0.02, help="simulator seconds per verify pass")
    ap.add_argument("--max-new-tokens", type=int, default=129, help="1 + 4k: every decode chunk carries 4 tokens")
    ap.add_argument("--repeat", type=int, default=3, help="runs per client and level (medians are compared)")
    ap.add_argument("--sglang-python", default=None,
                    help="python of a real SGLang 0.5.23 venv (default: the one scripts/sglang-venv.sh 0.5.23 caches)")
    ap.add_argument("--pin", action="store_true",
                    help="simulator on CPU 0, clients on CPU 1 (sched_setaffinity): the client's error without "
                         "the simulator's HTTP threads competing for its core")
    ap.add_argument("--worker", choices=["ours", "sglang"], help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    if a.worker:
        fn = worker_ours if a.worker == "ours" else worker_sglang
        print(json.dumps(fn(a.url, levels[0], a.requests, a.max_new_tokens)))
        return 0

    sglang_python = a.sglang_python or str(sglang_venv_python())
    if not os.path.exists(sglang_python):
        sys.exit(f"bench-client: no SGLang 0.5.23 venv at {sglang_python} (bash scripts/sglang-venv.sh 0.5.23), "
                 "or give --sglang-python")
    top = max(levels)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "SGLANG_SIM_LOAD_SECONDS": "0.2",
        "SGLANG_SIM_WARMUP_SECONDS": "0.1",
        "SGLANG_SIM_STEP_SECONDS": str(a.step),
        "SGLANG_SIM_ACCEPT_LENGTH": str(ACCEPT),
        "PYTHONPATH": str(REPO),
    }
    sim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddtree_ops.sim",
            "--model-path",
            "models/target",
            "--port",
            str(port),
            *SIM_ARGS,
            "--max-running-requests",
            str(top),
            "--cuda-graph-max-bs-decode",
            str(top),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=(lambda: os.sched_setaffinity(0, {0})) if a.pin else None,
    )
    try:
        for _ in range(200):
            try:
                http_get(url + "/health")
                break
            except OSError:
                time.sleep(0.05)
        print(
            ("pinned: simulator on CPU 0, clients on CPU 1\n" if a.pin else "")
            + f"simulator: DDTree 8/32, accept length {ACCEPT}, {a.step * 1000:g} ms a pass, "
            f"{a.max_new_tokens} tokens a request; bench_serving from {sglang_python}"
        )
        print(
            f"{'conc':>5} {'client':<20} {'reqs':>5} {'tokens':>7} {'CPU us/token':>12} {'ITL ms':>8} "
            f"{'server ITL':>10} {'ITL error':>9}"
        )
        rows: dict = {}
        for c in levels:
            n = a.requests or max(8, 2 * c)
            for _ in range(a.repeat):
                for who, py in (("ddtree-ops", sys.executable), ("bench_serving", sglang_python)):
                    s0, n0 = server_itl(url)
                    out = subprocess.run(
                        [
                            py,
                            __file__,
                            "--worker",
                            "ours" if who == "ddtree-ops" else "sglang",
                            "--url",
                            url,
                            "--concurrency",
                            str(c),
                            "--requests",
                            str(n),
                            "--max-new-tokens",
                            str(a.max_new_tokens),
                        ],
                        capture_output=True,
                        text=True,
                        timeout=1800,
                        cwd="/tmp",
                        preexec_fn=(lambda: os.sched_setaffinity(0, {1})) if a.pin else None,
                    )
                    s1, n1 = server_itl(url)
                    if out.returncode != 0:
                        sys.exit(f"bench-client: the {who} worker failed:\n{out.stderr[-3000:]}")
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    srv = (s1 - s0) / (n1 - n0) if n1 > n0 else float("nan")
                    r["cpu_us_per_token"] = 1e6 * r["cpu_s"] / max(1, r["tokens"])
                    r["server_itl_s"] = srv
                    r["itl_error"] = abs(r["itl_mean_s"] / srv - 1) if r["itl_mean_s"] else float("nan")
                    rows.setdefault((c, who), []).append(r)
                    who_shown = f"{who} ({r['event_loop']})" if "event_loop" in r else who
                    print(
                        f"{c:>5} {who_shown:<20} {r['ok']:>5} {r['tokens']:>7} {r['cpu_us_per_token']:>12.1f} "
                        f"{1000 * (r['itl_mean_s'] or 0):>8.3f} {1000 * srv:>10.3f} {100 * r['itl_error']:>8.2f}%"
                        + (f"  FAILED {r['failed']}: {r['errors']}" if r["failed"] else ""),
                        flush=True,
                    )
        print(f"\nmedians of {a.repeat} runs, ddtree-ops vs bench_serving (ratio below 1: ours costs less):")
        for c in levels:
            med = {
                who: {k: statistics.median(r[k] for r in rows[(c, who)]) for k in ("cpu_us_per_token", "itl_error")}
                for who in ("ddtree-ops", "bench_serving")
            }
            o, b = med["ddtree-ops"], med["bench_serving"]
            print(
                f"  concurrency {c:>4}: CPU per token {o['cpu_us_per_token']:.1f} vs {b['cpu_us_per_token']:.1f} us "
                f"({o['cpu_us_per_token'] / b['cpu_us_per_token']:.2f}x); ITL error {100 * o['itl_error']:.2f} % vs "
                f"{100 * b['itl_error']:.2f} %"
            )
    finally:
        sim.terminate()
        sim.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
