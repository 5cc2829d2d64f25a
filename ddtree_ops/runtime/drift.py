"""Config drift: does the running server run what was deployed?

The deployed side is the host's ``plan.json`` as typed by
:class:`ddtree_ops.config.plandoc_model.PlanDoc`; the running side is SGLang's ``/server_info`` (older
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
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config.plandoc_model import PlanDoc


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
    expected: Callable[[PlanDoc], Any]  # the deployed value, None to skip
    normalize: Callable[[Any], Any] = lambda v: v


_SETTINGS: tuple[_Setting, ...] = (
    _Setting("algorithm", ("speculative_algorithm",), lambda d: d.plan.algorithm, _algorithm),
    _Setting("block_size", ("speculative_dflash_block_size", "speculative_num_draft_tokens"),
             lambda d: d.plan.block_size),
    _Setting("budget", ("speculative_ddtree_budget",), lambda d: d.plan.budget),
    _Setting("tp_size", ("tp_size",), lambda d: d.deployment.server.tp_size),
    _Setting("max_running_requests", ("max_running_requests",), lambda d: d.plan.max_running_requests),
    _Setting("cuda_graphs", ("disable_cuda_graph",), lambda d: d.plan.cuda_graphs,
             lambda v: not v if isinstance(v, bool) else v),
    _Setting("capture_bs", ("cuda_graph_config.decode.bs", "cuda_graph_bs_decode", "cuda_graph_bs"),
             lambda d: sorted(d.plan.capture_bs) if d.plan.cuda_graphs and d.plan.capture_bs else None,
             lambda v: _int_list(v) if _int_list(v) is not None else v),
    # SGLang may rewrite both during resolution (e.g. 0.5.23 on sm_103: a Qwen3.5 MoE with
    # page_size 16 and no attention backend runs triton with page size 1); /server_info
    # reports the resolved values at its top level (build_server_info -> resolved_dict,
    # sglang/srt/utils/common.py in 0.5.23). Compared only where the plan sets them.
    _Setting("attention_backend", ("attention_backend",), lambda d: d.plan.attention_backend),
    _Setting("page_size", ("page_size",), lambda d: d.plan.page_size),
    _Setting("model_path", ("model_path",), lambda d: d.deployment.model.path),
)


RESOLVED_BY_SGLANG: dict[str, str] = {
    "attention_backend": "ddtree_server.attention_backend",
    "page_size": "ddtree_server.page_size",
    "capture_bs": "ddtree_server.cuda_graph_bs",
    "max_running_requests": "ddtree_server.max_running_requests",
    "cuda_graphs": "ddtree_server.cuda_graph",
    "block_size": "ddtree_speculative.block_size",
    "budget": "ddtree_speculative.budget",
}
"""Compared settings SGLang's own argument resolution may rewrite from what the argv says, and the
inventory field that sets each: 0.5.23 ``ServerArgs`` resolution (``resolve_once``,
``arg_groups/overrides.py``, ``model_overrides/qwen3_5.py``: attention backend and page size per
model and arch; the decode capture list and ``max_running_requests`` sized from memory and
speculation; CUDA graphs turned off for combinations that cannot capture; the DFlash block size from
the draft's ``config.json``), the rewrites ``ddtree-ops plan --resolve-with`` lists. The model and
``tp_size`` are never rewritten: when they match, the server was started from the deployed argv."""


def drift_fix(drifts: list[Drift], version: str | None = None) -> str:
    """What to do about ``drifts``: when the server runs the deployed model and ``tp_size`` and only
    settings of :data:`RESOLVED_BY_SGLANG` differ, SGLang's resolution made the difference and a
    restart reproduces it, so the fix names the inventory field to set to the value that runs; any
    other drift is a server not started from the deployed config (redeploy or restart)."""
    if not drifts or any(d.name not in RESOLVED_BY_SGLANG for d in drifts):
        return "redeploy, or restart the unit (the server was not started from the deployed config)"
    build = f"SGLang {version}" if version else "SGLang"
    sets = ", ".join(f"{RESOLVED_BY_SGLANG[d.name]}: {_yaml(d.running)}" for d in drifts)
    return (f"{build} rewrote these itself while resolving the deployed arguments, so a restart or redeploy "
            f"starts the same; set {sets} in the inventory so the plan says what runs (or choose values the "
            "build keeps: ddtree-ops plan --resolve-with PYTHON lists each rewrite), then redeploy")


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def compared_settings() -> list[str]:
    """Stable names of every setting :func:`find_drift` compares."""
    return [s.name for s in _SETTINGS]


def find_drift(plan_doc: PlanDoc | dict[str, Any], server_info: dict[str, Any]) -> tuple[list[Drift], list[str]]:
    """Compare a deployed ``plan.json`` with a running server's ``/server_info``.

    Args:
        plan_doc: the host's plan document (:class:`~ddtree_ops.config.plandoc_model.PlanDoc`,
            or a rendered document, which is checked into one).
        server_info: JSON object from ``/server_info``.

    Returns:
        ``(drifts, not_reported)``: the settings that differ, and the names of settings the
        server did not report (older builds, or DDTree-only keys on a release build).

    Raises:
        PlanDocError: ``plan_doc`` is a dict that is no plan document.
    """
    from ..config.plandoc_model import as_plan_doc

    doc = as_plan_doc(plan_doc)
    drifts: list[Drift] = []
    missing: list[str] = []
    for s in _SETTINGS:
        expected = s.expected(doc)
        if expected is None:
            continue
        key, running = _first(server_info, s.keys)
        if running is _MISSING:
            # A key that is there with null is a value for these two: disable_cuda_graph null
            # means graphs on (the SGLang default), and speculative_algorithm null means no
            # speculation (real 0.5.17 without --speculative-algorithm reports null): a DDTREE
            # deployment restarted without speculation is drift, not "not reported".
            if s.name in ("cuda_graphs", "algorithm") and key in server_info:
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
