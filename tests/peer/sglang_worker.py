"""Runs INSIDE a cached real-SGLang venv (not the project venv): answers the peer tier's
questions with SGLang's own code. Standard library + SGLang only.

Usage: ``VENV/bin/python sglang_worker.py JOBS.json`` -> one JSON object on stdout's last
line: ``{"results": [...]}``, one result per job, in order. Jobs:

* ``{"kind": "parse", "argv": [...]}``: ``prepare_server_args(argv)`` (SGLang's own parser
  and ServerArgs construction). Result ``{"ok": bool, "error": str}``; argparse errors
  (``unrecognized arguments``, ``ambiguous option``, invalid choice) come from SystemExit
  with the message argparse printed.
* ``{"kind": "resolve", "argv": [...]}``: parse, then ``resolve_once()`` and
  ``resolved_dict()`` (0.5.2x; needs the resolver venv). Result ``{"ok", "error",
  "resolved": {...}}`` with the fields the peer tier compares.
* ``{"kind": "introspect"}``: the parser's option strings, the choices of
  ``--attention-backend`` / ``--speculative-algorithm`` / ``--speculative-draft-attention-backend``,
  the ServerArgs field names, the ``sglang:`` metric names in
  ``sglang/srt/observability/metrics_collector.py`` and the SGLang version.
* ``{"kind": "buildfacts", "set_env": {NAME: VALUE}}`` (first job of its run: it sets
  ``set_env`` before SGLang is imported): the ``Envs`` registry names and their
  ``deprecated_name`` aliases, the environment variables SGLang's import added (its
  renames of deprecated names) and the warnings it gave, ``Requires-Dist`` of the
  installed ``sglang``, the site-packages directory, every parser action's ``dest`` with
  its option strings, and ``server_args``' ``ATTENTION_BACKEND_CHOICES`` /
  ``DRAFT_ATTENTION_BACKEND_CHOICES`` (None where the release has none).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import re
import sys
import traceback
from pathlib import Path

COMPARED = (
    "max_running_requests", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_dflash_block_size", "speculative_draft_window_size",
    "attention_backend", "page_size", "disable_overlap_schedule", "disable_cuda_graph", "tp_size", "dp_size",
    "cuda_graph_max_bs", "cuda_graph_bs", "cuda_graph_max_bs_decode", "cuda_graph_bs_decode",
)


def _parser():
    """SGLang's parser, built exactly as ``prepare_server_args`` builds it."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def _argparse_only(argv):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            _parser().parse_args(list(argv))
    except SystemExit as exc:
        return (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
    return ""


def _parse(argv):
    """``prepare_server_args(argv)``: parser + ServerArgs construction (post-init checks)."""
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            sa = prepare_server_args(list(argv))
    except SystemExit as exc:
        return None, (err.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
    except Exception as exc:  # noqa: BLE001 - report SGLang's own refusal
        return None, f"{type(exc).__name__}: {exc}"
    return sa, ""


def job_parse(job):
    """Flags first (argparse: unrecognized / ambiguous / invalid choice), then, when the
    job asks, the whole ``prepare_server_args`` (ServerArgs construction)."""
    error = _argparse_only(job["argv"])
    out = {"ok": not error, "error": error}
    if job.get("construct") and not error:
        sa, cerr = _parse(job["argv"])
        out.update(construct_ok=sa is not None, construct_error=cerr)
    return out


def job_resolve(job):
    sa, error = _parse(job["argv"])
    if sa is None:
        return {"ok": False, "error": error, "resolved": None}
    try:
        sa.resolve_once()
        d = sa.resolved_dict()
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:],
                "resolved": None}
    out = {k: d.get(k) for k in COMPARED if k in d}
    decode = (d.get("cuda_graph_config") or {}).get("decode") or {}
    out["decode_capture_bs"] = decode.get("bs")
    out["decode_max_bs"] = decode.get("max_bs")
    out["decode_backend"] = decode.get("backend")
    return {"ok": True, "error": "", "resolved": json.loads(json.dumps(out, default=str))}


def _field_names(cls):
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    names = cls.__dict__.get("__struct_fields__")  # msgspec.Struct
    if isinstance(names, (tuple, list)):
        return list(names)
    ann = cls.__dict__.get("__annotations__")
    return list(ann) if isinstance(ann, dict) else []


def _internal_state_keys(source: str) -> set:
    """Keys the scheduler's ``get_internal_state`` (and, in 0.5.2x, its ``_add_*`` helpers)
    assign into the dict it returns: ``ret["k"] = ...`` / ``state["k"] = ...``."""
    import ast

    keys = set()
    for cls in ast.walk(ast.parse(source)):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = [f for f in cls.body if isinstance(f, ast.FunctionDef)]
        if not any(f.name == "get_internal_state" for f in methods):
            continue
        for f in methods:
            if f.name != "get_internal_state" and not f.name.startswith("_add_"):
                continue
            for node in ast.walk(f):
                if isinstance(node, ast.Assign):
                    for t in node.targets:
                        if (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                                and isinstance(t.slice.value, str)):
                            keys.add(t.slice.value)
    return keys


def job_introspect(_job):
    import sglang
    from sglang.srt import server_args as sa_mod

    parser = argparse.ArgumentParser()
    sa_mod.ServerArgs.add_cli_args(parser)
    options, choices = [], {}
    for action in parser._actions:
        options += [o for o in action.option_strings if o.startswith("--")]
        if action.choices is not None:
            for o in action.option_strings:
                choices[o] = [str(c) for c in action.choices]
    fields = set()
    for klass in type.mro(sa_mod.ServerArgs):
        fields.update(_field_names(klass))
    metrics_src = Path(sglang.__file__).parent / "srt" / "observability" / "metrics_collector.py"
    metric_names = sorted(set(re.findall(r'"(sglang:[A-Za-z0-9_]+)"', metrics_src.read_text())))
    sched_src = []
    state_keys = set()
    for rel in ("srt/managers/scheduler.py", "srt/managers/scheduler_components/internal_state.py",
                "srt/entrypoints/http_server.py", "srt/managers/tokenizer_manager.py",
                "srt/managers/data_parallel_controller.py"):
        p = Path(sglang.__file__).parent / rel
        if p.exists():
            sched_src.append(p.read_text())
            state_keys |= _internal_state_keys(p.read_text())
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return {
        "version": getattr(sglang, "__version__", None),
        "spec_algorithms": [m for m in SpeculativeAlgorithm.__members__ if m != "NONE"],
        "options": sorted(set(options)),
        "choices": {k: choices[k] for k in ("--attention-backend", "--speculative-algorithm",
                                            "--speculative-draft-attention-backend") if k in choices},
        "fields": sorted(fields),
        "metric_names": metric_names,
        "internal_state_keys": sorted(state_keys),
        "string_literals": sorted(set(re.findall(r'"([a-z_][a-z0-9_]*)"', "\n".join(sched_src)))),
    }


def job_buildfacts(job):
    import os
    import warnings
    from importlib import metadata

    before = dict(os.environ)
    os.environ.update({str(k): str(v) for k, v in job.get("set_env", {}).items()})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import sglang
        from sglang.srt import environ

    added = {k: v for k, v in os.environ.items() if k not in before and k not in job.get("set_env", {})}
    names, aliases = [], {}
    for attr, value in vars(environ.Envs).items():
        if isinstance(value, environ.EnvField):
            names.append(getattr(value, "name", None) or attr)
            dep = getattr(value, "deprecated_name", None)
            if dep:
                aliases[dep] = getattr(value, "name", None) or attr
    from sglang.srt import server_args as sa_mod

    draft = getattr(sa_mod, "DRAFT_ATTENTION_BACKEND_CHOICES", None)
    parser = _parser()
    dests = {}
    for action in parser._actions:
        if action.option_strings:
            dests.setdefault(action.dest, []).extend(action.option_strings)
    return {
        "env_registry": sorted(names),
        "env_aliases": aliases,
        "env_added": added,
        "warnings": [str(w.message) for w in caught],
        "requires": metadata.requires("sglang") or [],
        "site_packages": str(Path(sglang.__file__).resolve().parent.parent),
        "dests": dests,
        "attention_choices": list(sa_mod.ATTENTION_BACKEND_CHOICES),
        "draft_attention_choices": list(draft) if draft is not None else None,
    }


def _unknown_keys(doc, cls, where="") -> list:
    """Keys of ``doc`` (a JSON object) that pydantic model ``cls`` does not declare, recursively through
    nested models, lists and optionals (``extra="allow"`` models would accept them silently)."""
    import typing

    from pydantic import BaseModel

    def models_of(ann):
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            return [ann]
        return [m for a in typing.get_args(ann) for m in models_of(a)]

    out = []
    if not isinstance(doc, dict):
        return out
    fields = cls.model_fields
    by_name = {(f.alias or n): f for n, f in fields.items()}
    for key, value in doc.items():
        f = by_name.get(key)
        if f is None:
            out.append(where + key)
            continue
        subs = models_of(f.annotation)
        for item in (value if isinstance(value, list) else [value]):
            if isinstance(item, dict) and subs:
                out += _unknown_keys(item, subs[0], f"{where}{key}.")
    return out


def job_openai_stream(job):
    """Each SSE payload validated by the real ``ChatCompletionStreamResponse`` /
    ``CompletionStreamResponse`` (``sglang/srt/entrypoints/openai/protocol.py``)."""
    from sglang.srt.entrypoints.openai import protocol

    cls = protocol.ChatCompletionStreamResponse if job["api"] == "chat" else protocol.CompletionStreamResponse
    results = []
    for payload in job["payloads"]:
        doc = json.loads(payload)
        try:
            cls.model_validate(doc)
            error = None
        except Exception as exc:  # the real model's refusal, quoted
            error = f"{type(exc).__name__}: {str(exc)[:400]}"
        results.append({"error": error, "unknown": _unknown_keys(doc, cls)})
    return {"model": cls.__name__, "results": results}


def job_openai_real_chunks(job):
    """A stream built with the real protocol classes and serialized as ``serving_chat.py`` /
    ``serving_completions.py`` 0.5.23 do (``data: {chunk.model_dump_json()}``; the completions usage
    chunk with ``exclude_none=True``): ``n`` content chunks carrying the running usage
    (``continuous_usage_stats``), a finish chunk, the usage-only chunk (``choices=[]``), ``[DONE]``."""
    from sglang.srt.entrypoints.openai import protocol as p

    n, chat = int(job["n"]), job["api"] == "chat"
    usage = lambda k: p.UsageInfo(prompt_tokens=5, completion_tokens=k, total_tokens=5 + k)  # noqa: E731
    out = []
    for k in range(1, n + 1):
        if chat:
            choice = p.ChatCompletionResponseStreamChoice(index=0, delta=p.DeltaMessage(content=f"t{k}"),
                                                          finish_reason=None)
            chunk = p.ChatCompletionStreamResponse(id="r", created=1, model="m", choices=[choice], usage=usage(k))
        else:
            choice = p.CompletionResponseStreamChoice(index=0, text=f"t{k}", finish_reason=None)
            chunk = p.CompletionStreamResponse(id="r", created=1, model="m", choices=[choice], usage=usage(k))
        out.append(chunk.model_dump_json())
    if chat:
        fin = p.ChatCompletionResponseStreamChoice(index=0, delta=p.DeltaMessage(), finish_reason="length")
        out.append(p.ChatCompletionStreamResponse(id="r", created=1, model="m", choices=[fin]).model_dump_json())
        out.append(p.ChatCompletionStreamResponse(id="r", created=1, model="m", choices=[], usage=usage(n))
                   .model_dump_json())
    else:
        fin = p.CompletionResponseStreamChoice(index=0, text="", finish_reason="length")
        out.append(p.CompletionStreamResponse(id="r", created=1, model="m", choices=[fin]).model_dump_json())
        out.append(p.CompletionStreamResponse(id="r", created=1, model="m", choices=[], usage=usage(n))
                   .model_dump_json(exclude_none=True))
    out.append("[DONE]")
    return {"payloads": out}


def main() -> int:
    logging.disable(logging.WARNING)
    jobs = json.loads(Path(sys.argv[1]).read_text())
    results = []
    for job in jobs:
        fn = {"parse": job_parse, "resolve": job_resolve, "introspect": job_introspect,
              "buildfacts": job_buildfacts, "openai_stream": job_openai_stream,
              "openai_real_chunks": job_openai_real_chunks}[job["kind"]]
        results.append(fn(job))
    sys.stdout.write("\n" + json.dumps({"results": results}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
