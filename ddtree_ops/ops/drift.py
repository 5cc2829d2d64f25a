"""Config drift: does the running server run what was deployed?

The deployed side is the host's ``plan.json`` (:func:`ddtree_ops.render.files.plan_document`:
``{"deployment": ..., "plan": ...}``); the running side is SGLang's ``/server_info`` (older
builds: ``/get_server_info``), whose top level holds the resolved ``ServerArgs`` fields
(``sglang/srt/server_args.py``). Field names differ between versions — the decode capture
list is ``cuda_graph_bs`` up to 0.5.13, ``cuda_graph_bs_decode`` from 0.5.14, and 0.5.20+
also reports the resolved list under ``cuda_graph_config.decode.bs`` — so each comparison
names the keys it reads, in order of preference, and a key the build does not report is
"not reported", never drift.

Used by ``ddtree-ops health`` (deep check) and ``ddtree-ops exporter`` (drift gauge).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Drift:
    """One setting where the running server differs from the deployed config.

    Attributes:
        name: stable name of the setting (e.g. ``budget``, ``capture_bs``).
        key: the ``/server_info`` key that was read.
        expected: value the deployed config implies.
        running: value the server reports.
    """

    name: str
    key: str
    expected: Any
    running: Any

    def __str__(self) -> str:
        return f"{self.name}: deployed {self.expected!r}, running {self.running!r} (server_info.{self.key})"


_MISSING = object()


def _lookup(info: dict[str, Any], key: str) -> Any:
    """``a.b.c`` path lookup in nested dicts; :data:`_MISSING` when any step is absent."""
    cur: Any = info
    for part in key.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _first(info: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, Any]:
    for key in keys:
        value = _lookup(info, key)
        if value is not _MISSING and value is not None:
            return key, value
    return keys[0], _MISSING


def _algorithm(value: Any) -> str:
    return "none" if value in (None, "", "NONE", "none") else str(value).upper()


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return sorted(set(value))
    return None


@dataclass(frozen=True)
class _Setting:
    name: str
    keys: tuple[str, ...]
    expected: Callable[[dict, dict], Any]  # (deployment, plan) -> expected value, _MISSING to skip
    normalize: Callable[[Any], Any] = lambda v: v


_SETTINGS: tuple[_Setting, ...] = (
    _Setting("algorithm", ("speculative_algorithm",), lambda d, p: p["algorithm"], _algorithm),
    _Setting("block_size", ("speculative_dflash_block_size", "speculative_num_draft_tokens"),
             lambda d, p: p["block_size"] if p.get("block_size") is not None else _MISSING),
    _Setting("budget", ("speculative_ddtree_budget",),
             lambda d, p: p["budget"] if p.get("budget") is not None else _MISSING),
    _Setting("tp_size", ("tp_size",), lambda d, p: d["server"]["tp_size"]),
    _Setting("max_running_requests", ("max_running_requests",),
             lambda d, p: p["max_running_requests"] if p.get("max_running_requests") is not None else _MISSING),
    _Setting("cuda_graphs", ("disable_cuda_graph",), lambda d, p: p["cuda_graphs"],
             lambda v: not v if isinstance(v, bool) else v),
    _Setting("capture_bs", ("cuda_graph_config.decode.bs", "cuda_graph_bs_decode", "cuda_graph_bs"),
             lambda d, p: sorted(p["capture_bs"]) if p["cuda_graphs"] and p["capture_bs"] else _MISSING,
             lambda v: _int_list(v) if _int_list(v) is not None else v),
    # SGLang may rewrite both during resolution (e.g. 0.5.23 on sm_103: a Qwen3.5 MoE with
    # page_size 16 and no attention backend runs triton with page size 1); /server_info
    # reports the resolved values at its top level (build_server_info -> resolved_dict,
    # sglang/srt/utils/common.py in 0.5.23). Compared only where the plan sets them.
    _Setting("attention_backend", ("attention_backend",),
             lambda d, p: p["attention_backend"] if p.get("attention_backend") is not None else _MISSING),
    _Setting("page_size", ("page_size",),
             lambda d, p: p["page_size"] if p.get("page_size") is not None else _MISSING),
    _Setting("model_path", ("model_path",), lambda d, p: d["model"]["path"]),
)


def compared_settings() -> list[str]:
    """Stable names of every setting :func:`find_drift` compares."""
    return [s.name for s in _SETTINGS]


def find_drift(plan_doc: dict[str, Any], server_info: dict[str, Any]) -> tuple[list[Drift], list[str]]:
    """Compare a deployed ``plan.json`` with a running server's ``/server_info``.

    Args:
        plan_doc: the host's plan document (``deployment`` and ``plan`` keys).
        server_info: JSON object from ``/server_info``.

    Returns:
        ``(drifts, not_reported)``: the settings that differ, and the names of settings the
        server did not report (older builds, or DDTree-only keys on a release build).

    Raises:
        KeyError: ``plan_doc`` lacks ``deployment`` or ``plan`` (not a plan document).
    """
    deployment, plan = plan_doc["deployment"], plan_doc["plan"]
    drifts: list[Drift] = []
    missing: list[str] = []
    for s in _SETTINGS:
        expected = s.expected(deployment, plan)
        if expected is _MISSING:
            continue
        key, running = _first(server_info, s.keys)
        if running is _MISSING:
            # disable_cuda_graph absent means graphs on (the SGLang default)
            if s.name == "cuda_graphs" and key in server_info:
                running = server_info[key]
            else:
                missing.append(s.name)
                continue
        running = s.normalize(running)
        if s.name == "algorithm":
            expected = _algorithm(expected)
        if running != expected:
            drifts.append(Drift(s.name, key, expected, running))
    return drifts, missing
