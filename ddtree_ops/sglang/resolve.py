"""Run the pinned SGLang build's OWN server-args resolution, and diff it against our plan.

Why SGLang's own resolver: in SGLang 0.5.23 ``prepare_server_args`` returns the raw arguments;
resolution happens later, in ``ServerArgs.resolve_once()`` (``run_resolution_pipeline``:
the hooks under ``sglang/srt/arg_groups/`` and the per-architecture overrides under
``arg_groups/model_overrides/``). That is where SGLang rewrites settings silently, e.g. on
b300 (sm_103) a Qwen3.5 MoE target with EAGLE topk 1 and ``--page-size 16`` and no
``--attention-backend`` becomes triton attention with page size 1
(``_qwen3_5_hybrid_overrides`` in ``model_overrides/qwen3_5.py``).

Two halves in one file:

* **Child** (:func:`child_main`, run as ``SGLANG_PYTHON -I resolve.py --request -``): the
  standard library and SGLang only, so it runs in any SGLang venv whether or not ddtree-ops
  is installed there. It writes config-only model directories (``config.json`` of target
  and draft, no weights), parses our argv with ``prepare_server_args`` and calls
  ``resolve_once()`` + ``resolved_dict()`` (0.5.2x), or, for builds without
  ``resolve_once`` (0.5.13.post1), lets ``prepare_server_args`` run ``ServerArgs``'
  post-init resolution. One JSON object on the last stdout line (see :func:`resolve_in_build`).
* **Controller** (:func:`run_resolution`, :func:`diff_plan`): runs the child with a total
  deadline and turns the resolved settings into finding lines
  ``SGLang <ver> will change <field> <planned> → <resolved> (<why>)``.

Pretending to be the target GPU (no GPU on the controller): when the child finds no CUDA
device and the request names an arch (the host class's, ``sm_103`` for b300, ``sm_120`` for
ct200), it makes SGLang's device probes answer for that arch. The patch is the narrowest
that reaches every reader the 0.5.23 resolver has, and is exactly this (nothing else
changes): in ``sglang.srt.utils.common`` the two base probes ``is_cuda`` (True) and
``get_device_sm`` (e.g. 103), from which every ``is_sm*_supported`` / ``is_blackwell``
probe derives (their ``lru_cache`` is cleared), and ``get_nvgpu_memory_capacity`` (the host
class's GPU memory, MiB) which ``nvidia-smi`` would answer; ``torch.cuda.get_device_capability``
(e.g. ``(10, 3)``), which a few hooks read directly; and SGLang's own scoped platform
override ``runtime_context.override_platform(has_flashinfer=True)`` (a real install has
``flashinfer-python``: it is a dependency of the SGLang wheel; the resolver venv has none).
``--device cuda`` is added when the argv names no device. The result says so
(``pretend``); a real GPU is never overridden.

Over 600 lines: the bounded child run of the pinned build's own resolver and the diff of its
answer against the plan, which share the result's shape. Not yet split further.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
from typing import Any

RESOLVE_MARK = "ddtree-resolve:"
"""Prefix of the child's result line on stdout (import-time chatter goes before it)."""

FIELDS = (
    "attention_backend", "page_size", "max_running_requests", "disable_overlap_schedule", "disable_cuda_graph",
    "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens",
    "speculative_dflash_block_size", "speculative_draft_window_size", "speculative_draft_attention_backend",
    "tp_size", "dp_size",
)
"""Resolved ``ServerArgs`` fields reported (plus ``decode_capture_bs`` / ``decode_max_bs``)."""

ARCH_CAPABILITY = {"sm_90": (9, 0), "sm_100": (10, 0), "sm_103": (10, 3), "sm_120": (12, 0)}
"""CUDA compute capability of each arch the resolver can pretend to be (host classes'
arches, ``ddtree_ops/config/hosts.py``, plus sm_90/sm_100 for comparison)."""

_MODEL_FLAGS = (("--model-path", "target"), ("--speculative-draft-model-path", "draft"))


# ---------------------------------------------------------------- child (SGLang venv) ----

def _pretend(arch: str, gpu_memory_gib: float | None) -> str:
    """Make SGLang's device probes answer for ``arch`` (see the module docstring)."""
    import torch
    from sglang.srt.utils import common

    major, minor = ARCH_CAPABILITY[arch]
    common.is_cuda = lambda: True
    common.get_device_sm = lambda: major * 10 + minor
    if gpu_memory_gib:
        common.get_nvgpu_memory_capacity = lambda: float(gpu_memory_gib) * 1024
    for name in dir(common):
        fn = getattr(common, name)
        if name.startswith(("is_sm", "is_blackwell", "is_hopper", "is_ampere")) and hasattr(fn, "cache_clear"):
            fn.cache_clear()
    torch.cuda.get_device_capability = lambda device=None: (major, minor)
    done = [f"SM {major * 10 + minor}"]
    if gpu_memory_gib:
        done.append(f"{gpu_memory_gib:g} GiB per GPU")
    try:
        from sglang.srt.runtime_context import override_platform
    except ImportError:  # builds before the platform context (0.5.13.post1)
        pass
    else:
        override_platform(has_flashinfer=True).install()
        done.append("flashinfer installed")
    return f"no GPU here: SGLang's device probes patched to answer for {arch} ({', '.join(done)})"


def _model_dirs(argv: list[str], models: dict[str, Any], root: str) -> tuple[list[str], str | None]:
    """Point the model flags at config-only directories; (argv, why not) ."""
    out = list(argv)
    for flag, role in _MODEL_FLAGS:
        if flag not in out or out.index(flag) + 1 >= len(out):
            continue
        i = out.index(flag) + 1
        config = models.get(role)
        if isinstance(config, dict):
            d = os.path.join(root, role)
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f, allow_nan=False)
            out[i] = d
        elif not os.path.isfile(os.path.join(out[i], "config.json")):
            cached = _hf_cached_config(out[i])
            if cached is None:
                return out, (f"no config.json for {flag} {out[i][:200]} (the request carries none, it is not a "
                             "local model directory and the Hugging Face cache has none)")
            d = os.path.join(root, role)
            os.makedirs(d, exist_ok=True)
            with open(cached, "rb") as src, open(os.path.join(d, "config.json"), "wb") as dst:
                dst.write(src.read())
            out[i] = d
    return out, None


def _hf_cached_config(repo_id: str) -> str | None:
    """``config.json`` of ``repo_id`` in the local Hugging Face cache (never the network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(repo_id=repo_id, filename="config.json")
    except Exception:  # noqa: BLE001 - not an HF id, no huggingface_hub: no cached config
        return None
    return path if isinstance(path, str) and os.path.isfile(path) else None


def _mapping(value: Any) -> dict[str, Any]:
    """A CUDA-graph config level as a dict: 0.5.2x's ``resolved_dict()`` gives dicts, while
    0.5.17's ``vars(ServerArgs)`` holds the dataclasses themselves (``CudaGraphConfig`` with
    ``PhaseConfig`` per phase, ``sglang/srt/model_executor/cuda_graph_config.py``; seen when the
    probe met real 0.5.17 on an H200: "'CudaGraphConfig' object has no attribute 'get'")."""
    if isinstance(value, dict):
        return value
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return {}


def _picked(d: dict[str, Any]) -> dict[str, Any]:
    out = {k: d.get(k) for k in FIELDS}
    decode = _mapping(_mapping(d.get("cuda_graph_config")).get("decode"))
    if decode:
        out["decode_capture_bs"] = decode.get("bs")
        out["decode_max_bs"] = decode.get("max_bs")
        if decode.get("backend") == "disabled":
            out["disable_cuda_graph"] = True
    else:  # 0.5.13.post1: flat fields
        out["decode_capture_bs"] = d.get("cuda_graph_bs")
        out["decode_max_bs"] = d.get("cuda_graph_max_bs")
    return json.loads(json.dumps(out, default=str, allow_nan=False))


def _sources(sa: Any) -> dict[str, str]:
    """Compared field -> the resolution step that last declared it (0.5.2x
    ``ServerArgs._resolved_overrides``, the stash ``arg_groups/overrides.declare_resolution`` fills)."""
    out: dict[str, str] = {}
    for item in getattr(sa, "_resolved_overrides", None) or []:
        try:
            source, fields = item
            for k in fields:
                if k in FIELDS or str(k).startswith("cuda_graph"):
                    out[str(k)] = str(source)
        except (TypeError, ValueError):
            continue
    return out


def resolve_in_build(req: dict[str, Any]) -> dict[str, Any]:
    """Run this interpreter's SGLang resolution for request ``req``.

    Request: ``{"argv": [...], "arch": "sm_103" | null, "gpu_memory_gib": 288 | null,
    "models": {"target": {config.json}, "draft": {config.json}}}``.

    Returns:
        ``{"state", "version", "how", "detail", "resolved", "sources", "pretend"}`` where
        ``state`` is ``resolved`` (``resolved`` holds :data:`FIELDS` plus
        ``decode_capture_bs``/``decode_max_bs``; ``sources`` names the SGLang step behind
        each rewritten field), ``refused`` (``detail`` is SGLang's own message: argparse's,
        or the exception its resolver raised) or ``not-run`` (``detail`` says why).
        ``cannot_run_here`` is True only where SGLang's own resolver cannot run on a machine
        without a GPU (no arch to pretend for; the 0.5.2x path that loads ``sgl_kernel``, which
        needs libcuda; 0.5.13.post1's ``ServerArgs`` post-init): a documented limit, not a
        fault of the venv or the request (those are ``not-run`` with ``cannot_run_here``
        False, e.g. SGLang not importable, a CPU-only torch, no ``config.json``).
    """
    out: dict[str, Any] = {"state": "not-run", "version": None, "how": None, "detail": "", "resolved": None,
                           "sources": {}, "pretend": None, "cannot_run_here": False}
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            import sglang
            import torch
            from sglang.srt import server_args as sa_mod
        except Exception as exc:  # noqa: BLE001 - an unimportable build is "not run", not a crash
            out["detail"] = f"SGLang is not importable by {sys.executable}: {type(exc).__name__}: {exc}"
            return out
    version = out["version"] = str(getattr(sglang, "__version__", "unknown"))
    staged = hasattr(sa_mod.ServerArgs, "resolve_once")
    out["how"] = "resolve_once" if staged else "ServerArgs post-init"
    argv = [str(a) for a in req.get("argv") or []]
    arch = req.get("arch")
    try:
        has_gpu = bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001
        has_gpu = False
    if not has_gpu:
        if arch not in ARCH_CAPABILITY:
            out["detail"] = (f"no GPU here and no known arch to resolve for ({arch!r}; known: "
                             f"{', '.join(ARCH_CAPABILITY)})")
            out["cannot_run_here"] = True
            return out
        if not getattr(torch.version, "cuda", None):
            out["detail"] = (f"no GPU here, and this venv's torch {torch.__version__} is a CPU build: SGLang's arch "
                             "probes need a CUDA build of torch to answer for the host's GPU (use the resolver venv, "
                             "scripts/sglang-resolve-venv.sh)")
            return out
        with contextlib.redirect_stderr(io.StringIO()):
            out["pretend"] = _pretend(arch, req.get("gpu_memory_gib"))
        if not any(a == "--device" or a.startswith("--device=") for a in argv):
            argv += ["--device", "cuda"]
    with tempfile.TemporaryDirectory(prefix="ddtree-resolve-") as root:
        argv, why = _model_dirs(argv, req.get("models") or {}, root)
        if why:
            out["detail"] = why
            return out
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                sa = sa_mod.prepare_server_args(argv)
        except SystemExit:
            last = [ln for ln in err.getvalue().splitlines() if ln.strip()]
            out.update(state="refused", how="argparse", detail=last[-1] if last else "argparse rejected the argv")
            return out
        except Exception as exc:  # noqa: BLE001 - SGLang raises anything
            _prepare_failed(out, exc, staged, version, has_gpu)
            return out
        if staged:
            ok, d = _resolve_staged(out, sa, version)
            if not ok:
                return out
        else:
            d = dict(vars(sa))
        out.update(state="resolved", resolved=_picked(d), sources=_sources(sa))
    return out


def _prepare_failed(out: dict[str, Any], exc: Exception, staged: bool, version: str, has_gpu: bool) -> None:
    """Record in ``out`` why ``prepare_server_args`` raised ``exc``: SGLang refusing the argv, a
    post-init that needs an accelerator, or a package missing from this venv."""
    msg = f"{type(exc).__name__}: {exc}"
    if staged and not isinstance(exc, ImportError):  # 0.5.2x constructs without resolving: SGLang refuses the argv
        out.update(state="refused", detail=msg)
    elif not staged:  # 0.5.13.post1 resolves in post-init and needs an accelerator for it
        out.update(detail=f"SGLang {version}'s ServerArgs post-init stopped on this host: {msg}",
                   cannot_run_here=not has_gpu)
    else:  # 0.5.2x: the venv lacks a package SGLang's argument parsing imports
        out["detail"] = (f"this venv cannot run SGLang {version}'s argument parsing: {msg} (use the resolver "
                         "venv, scripts/sglang-resolve-venv.sh)")


def _resolve_staged(out: dict[str, Any], sa: Any, version: str) -> tuple[bool, Any]:
    """0.5.2x: ``(True, resolve_once() then resolved_dict())``, or ``(False, None)`` with ``out``
    saying why when SGLang refuses or this venv/host cannot run its resolver."""
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            sa.resolve_once()
            return True, sa.resolved_dict()
    except ImportError as exc:  # the venv lacks a package the resolver imports: not SGLang's verdict
        if out["pretend"] and getattr(exc, "name", "") == "sgl_kernel":
            out["detail"] = (f"SGLang {version}'s resolver imports its CUDA kernels (sgl_kernel) on this "
                             "path, which need a GPU driver (libcuda) to load: resolve on a GPU host (the "
                             "capability probe does)")
            out["cannot_run_here"] = True
        else:
            out["detail"] = (f"this venv cannot run SGLang {version}'s resolver: {type(exc).__name__}: {exc} "
                             "(use the resolver venv, scripts/sglang-resolve-venv.sh)")
        return False, None
    except Exception as exc:  # noqa: BLE001
        out.update(state="refused", detail=f"{type(exc).__name__}: {exc}")
        return False, None


def child_main(argv: list[str] | None = None) -> int:
    """``python -I resolve.py --request FILE|-``: print ``ddtree-resolve: {json}``; exit 0
    (the state is in the JSON), 2 for a bad request."""
    ap = argparse.ArgumentParser(prog="resolve.py", description="Run this SGLang build's server-args resolution.")
    ap.add_argument("--request", required=True, help="request JSON file ('-' for stdin)")
    args = ap.parse_args(argv)
    try:
        text = sys.stdin.read() if args.request == "-" else open(args.request, encoding="utf-8").read()
        req = json.loads(text)
        if not isinstance(req, dict) or not isinstance(req.get("argv"), list):
            raise ValueError("the request must be a JSON object with an 'argv' list")
    except (OSError, ValueError) as exc:
        print(f"resolve: --request {args.request}: {exc}", file=sys.stderr)
        return 2
    import logging

    logging.disable(logging.WARNING)
    result = resolve_in_build(req)
    sys.stdout.write("\n" + RESOLVE_MARK + " " + json.dumps(result, allow_nan=False) + "\n")
    return 0


# ------------------------------------------------------------------- controller side ----

STDOUT_MAX_BYTES = 4 * 1024 * 1024
"""The child's stdout is read up to this (its result is one line of a few KiB after SGLang's
import chatter); past it the child's process group is killed: a flood, not a result."""
STDERR_TAIL_BYTES = 64 * 1024
"""Only the last this-many bytes of the child's stderr are kept (its last line is the reason
shown when the child fails)."""
STDERR_MAX_BYTES = 64 * 1024 * 1024
"""Past this much stderr in all, the child's process group is killed (a flood)."""
DRAIN_S = 1.0
"""After the child exited (and its process group was killed), seconds its pipes may stay open
(a descendant that left the group with setsid holds them) before they are closed unread."""
SHOWN_MAX = 200
"""Characters of foreign text (the child's stderr line, a path, a value) shown, plus ``…``."""
DETAIL_MAX = 400
"""Characters of the child's ``detail`` shown (our own reasons with their fix, or SGLang's
refusal message), plus ``…``."""


class Resolution(dict):
    """The child's result (:func:`resolve_in_build`), or ``state`` ``failed`` when the child
    itself failed (not executable, deadline, output flood, non-zero exit, no or a malformed
    result line); ``detail`` says why."""

    @property
    def ran(self) -> bool:
        return self.get("state") in ("resolved", "refused")


def passes(res: dict[str, Any]) -> bool:
    """Whether ``plan --resolve-with`` passes a host's resolution: ``resolved``, or
    ``not-run`` with ``cannot_run_here`` (SGLang's own resolver cannot run on a machine
    without a GPU, :func:`resolve_in_build`). ``refused``, ``failed`` and every other
    ``not-run`` (the venv or the request is at fault) fail: the operator asked for a
    resolution and did not get one."""
    state = res.get("state")
    return state == "resolved" or (state == "not-run" and res.get("cannot_run_here") is True)


def shown(text: Any, limit: int = SHOWN_MAX) -> str:
    """``text`` as the controller prints it: terminal escapes and control characters removed
    (:func:`ddtree_ops._core.scrub.strip_controls`), secrets redacted
    (:func:`ddtree_ops.config.errors.scrub`), cut to ``limit`` characters plus ``…``.
    Controller side only (imports ddtree-ops' dependencies)."""
    from .._core.scrub import strip_controls
    from ..config.errors import scrub, shorten

    return shorten(scrub(strip_controls(scrub(str(text)))), limit)  # scrubbed first: a format character splits no token


def run_child(argv: list[str], env: dict[str, str], deadline_s: float,
              cwd: str | None = None) -> tuple[int | None, bytes, bytes, str]:
    """Run ``argv`` in its own session (process group) with a TOTAL deadline and bounded
    output (:func:`ddtree_ops._core.proc.run_capped`); the whole group is killed at the
    deadline, on a flood, and once the child exited (leftover descendants die with it).

    Returns:
        ``(exit status or None when killed, stdout (at most STDOUT_MAX_BYTES + 64 KiB),
        stderr tail (at most 2 * STDERR_TAIL_BYTES), why killed or "")``.

    Args:
        argv, env: the command and its whole environment.
        deadline_s: total seconds.
        cwd: its working directory (default: ours).

    Raises:
        OSError: ``argv[0]`` could not be started (missing, not executable).
    """
    from .._core.proc import run_capped

    r = run_capped(argv, deadline_s, STDOUT_MAX_BYTES, STDERR_MAX_BYTES, env=env, cwd=cwd,
                   stderr_tail=STDERR_TAIL_BYTES, drain_s=DRAIN_S, poll_s=0.2, idle_s=0.05, kill_on_exit=True,
                   reap_s=2.0)
    why = {"deadline": f"did not finish within {deadline_s:g} s (killed with its process group)",
           "stdout": f"printed more than {STDOUT_MAX_BYTES // 2**20} MiB on stdout (killed)",
           "stderr": f"printed more than {STDERR_MAX_BYTES // 2**20} MiB on stderr (killed)"}.get(r.killed, "")
    return (None if why else r.rc), r.stdout, r.stderr[-STDERR_TAIL_BYTES:], why


def _checked(doc: Any) -> Resolution:
    """The child's result object, its shape checked (ValueError naming what is wrong) and
    every text field made printable (:func:`shown`)."""
    if not isinstance(doc, dict):
        raise ValueError(f"the result is a JSON {type(doc).__name__}, not an object")
    state = doc.get("state")
    if state not in ("resolved", "refused", "not-run"):
        raise ValueError(f"state {shown(repr(state), 60)} is not resolved, refused or not-run")
    for k in ("version", "how", "pretend"):
        if doc.get(k) is not None and not isinstance(doc[k], str):
            raise ValueError(f"{k} is a {type(doc[k]).__name__}, not a string")
    if not isinstance(doc.get("detail", ""), str):
        raise ValueError("detail is not a string")
    resolved = doc.get("resolved")
    if state == "resolved" and not isinstance(resolved, dict):
        raise ValueError("a resolved result without a 'resolved' object")
    sources = doc.get("sources") or {}
    if not isinstance(sources, dict):
        raise ValueError("sources is not an object")
    keep = (*FIELDS, "decode_capture_bs", "decode_max_bs")

    def value(v: Any) -> Any:
        if isinstance(v, list):
            return [value(x) for x in v[:64]]
        return v if v is None or isinstance(v, (bool, int, float)) else shown(v, 80)

    return Resolution(
        state=state, version=shown(doc["version"], 40) if doc.get("version") else None,
        how=shown(doc["how"], 40) if doc.get("how") else None, detail=shown(doc.get("detail") or "", DETAIL_MAX),
        resolved={k: value(resolved.get(k)) for k in keep if k in resolved} if isinstance(resolved, dict) else None,
        sources={k: shown(s, 80) for k, s in sources.items() if k in keep or str(k).startswith("cuda_graph")},
        pretend=shown(doc["pretend"]) if doc.get("pretend") else None,
        cannot_run_here=doc.get("cannot_run_here") is True)


def run_resolution(python: str, request: dict[str, Any], deadline_s: float = 180.0) -> Resolution:
    """Run the child in ``python`` (an SGLang venv's interpreter) with a total deadline.

    The child runs in its own session; its output is read bounded (:data:`STDOUT_MAX_BYTES`,
    the last :data:`STDERR_TAIL_BYTES` of stderr); its whole process group is killed at the
    deadline, on a flood and after it exited (:func:`run_child`). The request goes in a
    private temporary file.

    Args:
        python: interpreter of a venv holding the pinned SGLang (ddtree-ops not needed there).
        request: see :func:`resolve_in_build`.
        deadline_s: seconds for the whole run (import of SGLang + resolution; ~10 s measured
            for 0.5.23 without a GPU); the child's group is killed past it.

    Returns:
        A :class:`Resolution` (text fields cleaned, scrubbed, cut: :func:`shown`); never
        raises for a bad interpreter or a misbehaving child: ``state`` ``failed`` with the
        reason in ``detail``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "SGLANG_", "DDTREE_OPS_"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    who = shown(python, 120)
    with tempfile.TemporaryDirectory(prefix="ddtree-resolve-req-") as tmp:
        req_path = os.path.join(tmp, "request.json")
        with open(req_path, "w", encoding="utf-8") as f:
            json.dump(request, f, allow_nan=False)
        try:
            rc, out, err, killed = run_child([python, "-I", os.path.abspath(__file__), "--request", req_path], env,
                                              deadline_s)
        except FileNotFoundError:
            return _failed(f"{who}: no such interpreter (give the python of a venv holding the pinned SGLang)")
        except PermissionError:
            return _failed(f"{who}: not executable (give the python of a venv holding the pinned SGLang)")
        except OSError as exc:
            return _failed(f"{who}: cannot run: {shown(exc.strerror or exc)}")
    err_lines = err.decode("utf-8", "replace").splitlines()
    tail = next((ln for ln in reversed(err_lines) if ln.strip()), "no output on stderr")
    if killed:
        return _failed(f"SGLang's resolution in {who} {killed}")
    lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.startswith(RESOLVE_MARK)]
    if rc != 0:
        return _failed(f"{who} could not run the resolver (exit {rc}): {shown(tail)}")
    if not lines:
        return _failed(f"{who} printed no '{RESOLVE_MARK}' result line (exit 0): {shown(tail)}")
    try:
        return _checked(json.loads(lines[-1][len(RESOLVE_MARK):]))
    except (ValueError, RecursionError) as exc:
        return _failed(f"{who} printed a malformed result line: {shown(exc)}")


def _failed(why: str) -> Resolution:
    return Resolution(state="failed", version=None, how=None, detail=why, resolved=None, sources={}, pretend=None,
                      cannot_run_here=False)


def request_for(v: Any, models: dict[str, Any]) -> dict[str, Any]:
    """The child's request for a validated deployment (``ddtree_ops.config.load.Validated``).

    Args:
        v: the validated deployment (its rendered argv, host class arch and GPU memory).
        models: ``{"target": config.json dict, "draft": config.json dict}`` (either may be
            absent when the model path is a local directory with a ``config.json``).
    """
    from ..render.argv import build_argv

    hc = v.deployment.host_class_def
    return {"argv": build_argv(v.deployment, v.plan)[3:], "arch": hc.arch if hc else None,
            "gpu_memory_gib": hc.gpu_memory_gib if hc else None, "models": models}


class Derived(str):
    """A planned value the deployment leaves unset and the plan derives (compares as its text)."""


class DerivedInt(int):
    """An integer planned value the plan derives (compares as the integer)."""


def _or_derived(p: Any, name: str) -> Any:
    explicit = getattr(p, name)
    if explicit is not None:
        return explicit
    got = (getattr(p, "derived", None) or {}).get(name)
    value = got.get("value") if isinstance(got, dict) else None
    if isinstance(value, str):
        return Derived(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return DerivedInt(value)
    return None


def planned_values(p: Any) -> dict[str, Any]:
    """What our plan (:class:`ddtree_ops.config.plan.Plan`) says for each compared field.

    ``None`` means the plan leaves the field to SGLang and ddtree-ops does not model what SGLang
    derives for it. An unset attention backend or page size that the plan derives
    (:func:`ddtree_ops.config.derived.derive_attention`, shown by ``plan`` with its source) is
    compared as that derived value, tagged :class:`Derived`, so a resolution that lands where the
    plan predicted is no change, and one that lands elsewhere names the prediction it contradicts.
    """
    spec = p.algorithm not in ("none", None)
    return {
        "attention_backend": _or_derived(p, "attention_backend"),
        "page_size": _or_derived(p, "page_size"),
        "decode_capture_bs": (list(p.capture_bs) or None) if p.cuda_graphs else None,
        "decode_max_bs": p.cuda_graph_max_bs if p.cuda_graphs else None,
        "disable_cuda_graph": not p.cuda_graphs,
        "max_running_requests": p.max_running_requests,
        "speculative_algorithm": ("DFLASH" if p.algorithm == "DDTREE" else p.algorithm) if spec else None,
        "speculative_num_steps": p.num_steps if spec else None,
        "speculative_eagle_topk": p.topk if spec else None,
        "speculative_num_draft_tokens": p.num_draft_tokens if spec else None,
        "speculative_dflash_block_size": p.block_size if p.algorithm in ("DFLASH", "DDTREE") else None,
        "disable_overlap_schedule": bool(p.disable_overlap_schedule),
    }


_LABEL = {"decode_capture_bs": "capture list (decode bs)", "decode_max_bs": "cuda_graph_max_bs (decode)",
          "disable_overlap_schedule": "disable_overlap_schedule (overlap scheduling off)"}


def _show(v: Any) -> str:
    if v is None:
        return "unset (SGLang decides)"
    if isinstance(v, (Derived, DerivedInt)):
        return f"unset (ddtree-ops derived {v}, as `plan` shows)"
    if isinstance(v, list):
        return "[" + " ".join(map(str, v)) + "]"
    return str(v)


def diff_plan(planned: dict[str, Any], res: dict[str, Any]) -> list[str]:
    """Finding lines for every compared field SGLang resolved differently from the plan.

    Args:
        planned: :func:`planned_values` of the plan.
        res: a ``resolved`` :class:`Resolution` (``resolved``, ``sources``, ``version``).

    Returns:
        ``["SGLang <ver> will change <field> <planned> → <resolved> (<why>)", ...]`` in the
        order of ``planned``; a field the plan leaves unset is listed when SGLang sets it
        (so the operator sees e.g. the attention backend SGLang picks). Empty when nothing
        differs. ``speculative_algorithm`` DDTREE is compared as DFLASH (DDTree rides on
        the DFlash worker in the resolver's view).
    """
    got = res.get("resolved") or {}
    sources = res.get("sources") or {}
    ver = res.get("version") or "?"
    lines = []
    for field, want in planned.items():
        if field not in got:
            continue
        have = got[field]
        if field == "speculative_algorithm" and have == "DDTREE" and want == "DFLASH":
            continue
        if field == "disable_cuda_graph":
            have = bool(have)
        if have == want or (want is None and have in (None, False)):
            continue
        src = sources.get(field) or sources.get("cuda_graph_config" if field.startswith("decode_") else field)
        why = f" (set by SGLang's {src})" if src else ""
        lines.append(f"SGLang {ver} will change {_LABEL.get(field, field)} {_show(want)} → {_show(have)}{why}")
    return lines


def summary(res: dict[str, Any], parsed: bool = False) -> str:
    """One line: how (or whether) resolution ran. Never says 'resolved' unless it did.

    Args:
        res: a :class:`Resolution` (or the child's dict).
        parsed: the caller already parsed the argv with the build's parser (the probe):
            a resolution that did not run reads "parsed only; resolution not run: <why>".
    """
    ver = res.get("version") or "?"
    if res.get("state") == "resolved":
        how = res.get("how") or "resolve_once"
        return f"resolved by SGLang {ver} ({how})" + (f"; {res['pretend']}" if res.get("pretend") else "")
    if res.get("state") == "refused":
        return f"SGLang {ver} refused the arguments during {res.get('how') or 'resolution'}: {res.get('detail')}"
    if res.get("state") == "failed":
        return f"resolution failed: {res.get('detail') or 'unknown reason'}"
    return f"{'parsed only; ' if parsed else ''}resolution not run: {res.get('detail') or 'unknown reason'}"


if __name__ == "__main__":
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]  # this package directory must not shadow top-level modules
    sys.exit(child_main())
