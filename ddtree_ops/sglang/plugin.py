"""SGLang plugin of ddtree-ops: make DDTree target-verify CUDA graphs ``budget + 1`` wide.

Runs INSIDE SGLang's processes, so this module imports only the standard library at
module level (ddtree-ops is installed ``--no-deps`` into the SGLang venv; SGLang itself is
imported lazily, inside the functions SGLang calls).

How it is loaded
    SGLang (0.5.13.post1 and 0.5.23 both have the mechanism: ``sglang/srt/plugins``) calls
    ``load_plugins()`` early in every server process (engine, scheduler, and in 0.5.23 also
    the DP controller and detokenizer). It runs each callable registered under the
    entry-point group ``sglang.srt.plugins`` -- ours is ``ddtree_ops_verify_graph =
    ddtree_ops.sglang.plugin:register`` (``pyproject.toml``) -- then
    ``HookRegistry.apply_hooks()`` patches the registered targets. ``SGLANG_PLUGINS`` (a
    comma-separated whitelist of entry-point names) can exclude it. SGLang logs and swallows
    exceptions raised by a plugin callable, so our refusal is raised later, from the hooked
    function, when a worker sizes its graphs -- before the server serves anything.

What it hooks (version-aware; whichever exists in the running build)
    * <= 0.5.13 layout: ``SpeculativeAlgorithm.get_num_tokens_per_bs_for_target_verify``
      (``sglang/srt/speculative/spec_info.py``; called by ``CudaGraphRunner.__init__`` and
      the model runner's warmup with ``server_args.speculative_num_draft_tokens``), and the
      same method of ``CustomSpecAlgo`` (``spec_registry.py``, plugin-registered algorithms).
    * 0.5.23 layout: the method was renamed ``get_num_tokens_per_req_for_target_verify``;
      it is reached through ``spec_utils.resolve_num_tokens_per_req(phase="target_verify")``
      from ``ModelRunner.decode_num_tokens_per_req`` (decode CUDA-graph runner, attention
      backends).

    The hook wraps the original (``AROUND``): for any algorithm other than ``DDTREE`` it
    returns the original's answer untouched. For ``DDTREE`` it compares the server's own
    arguments (block size = ``speculative_dflash_block_size`` or
    ``speculative_num_draft_tokens``; ``speculative_ddtree_budget``) with the sizes the
    systemd unit passes from the validated ddtree-ops config
    (``DDTREE_OPS_DRAFT_TOKENS_PER_REQ`` = block_size, ``DDTREE_OPS_VERIFY_TOKENS_PER_REQ``
    = budget + 1, ``DDTREE_OPS_ALGORITHM``; rendered by ``render/files.py:service_env``)
    and raises :class:`DDTreeSizeMismatch` when they disagree. Then:

    * draft worker: the width is ``block_size`` (the original's answer is kept when it is);
    * target worker: if the build already answers ``budget + 1`` (DDTree on
      ``DFlashWorkerV2``, sgl-project/sglang#29907) nothing changes and the plugin says so;
      if it answers ``block_size`` (DDTree on the v1 DFlash worker, sgl-project/sglang#27509,
      the "size of tensor a (8) must match ... (33)" crash) it returns ``budget + 1`` and
      logs the correction; any other answer is refused (unknown sizing).

Which builds need it: DDTree builds whose source sizes target-verify graphs from
``block_size`` (``sizes_verify_at_budget_plus_one=False`` in
:data:`ddtree_ops.config.versions.DDTREE_SOURCES`, e.g. ``sglang-pr-27509``). On other
builds it is installed anyway and is a logged no-op.
"""

from __future__ import annotations

import logging
import os
from importlib import metadata
from typing import Any

logger = logging.getLogger("ddtree_ops.sglang.plugin")

ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_NAME = "ddtree_ops_verify_graph"
ENTRY_POINT_VALUE = "ddtree_ops.sglang.plugin:register"

ENV_ALGORITHM = "DDTREE_OPS_ALGORITHM"
ENV_DRAFT = "DDTREE_OPS_DRAFT_TOKENS_PER_REQ"
ENV_VERIFY = "DDTREE_OPS_VERIFY_TOKENS_PER_REQ"

DDTREE = "DDTREE"

HOOK_CANDIDATES: tuple[tuple[str, str, str, str], ...] = (
    # (layout, module, class, method): the width function per SGLang layout.
    ("<=0.5.13", "sglang.srt.speculative.spec_info", "SpeculativeAlgorithm", "get_num_tokens_per_bs_for_target_verify"),
    ("<=0.5.13", "sglang.srt.speculative.spec_registry", "CustomSpecAlgo", "get_num_tokens_per_bs_for_target_verify"),
    ("0.5.23", "sglang.srt.speculative.spec_info", "SpeculativeAlgorithm", "get_num_tokens_per_req_for_target_verify"),
    ("0.5.23", "sglang.srt.speculative.spec_registry", "CustomSpecAlgo", "get_num_tokens_per_req_for_target_verify"),
)
"""Where SGLang computes the per-request token width of target-verify CUDA graphs."""


class DDTreeSizeMismatch(RuntimeError):
    """The sizes ddtree-ops rendered disagree with the server's own arguments, or the
    build sizes DDTree graphs in a way the plugin does not know. The server must not start."""


# Per-process state (SGLang loads the plugin once per process).
_STATE: dict[str, Any] = {
    "loaded": False,  # register() ran in this process
    "active": None,  # True: hooks registered; False: decided no-op; None: not loaded
    "detail": "",
    "targets": [],  # dotted names hooked
    "layout": None,
    "sizes": None,  # {"algorithm", "draft_tokens_per_req", "verify_tokens_per_req"}
    "events": [],  # what the hook did, one line each (deduplicated)
}


def _note(level: int, msg: str) -> None:
    if msg not in _STATE["events"]:
        _STATE["events"].append(msg)
        logger.log(level, "ddtree-ops plugin: %s", msg)


def sizes_from_env(env: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The sizes the unit passes: ``{"algorithm": str, "draft_tokens_per_req": int,
    "verify_tokens_per_req": int}`` (tokens per request; both None when the algorithm is
    not DDTREE), or None when the unit passes none (not rendered by ddtree-ops).

    Raises:
        DDTreeSizeMismatch: a size is present but not a positive integer.
    """
    env = os.environ if env is None else env
    if ENV_DRAFT not in env and ENV_VERIFY not in env:
        return None
    out: dict[str, Any] = {"algorithm": env.get(ENV_ALGORITHM, "").strip() or None}
    if out["algorithm"] not in (None, DDTREE):  # sizes do not concern the plugin (0 without speculation)
        return {**out, "draft_tokens_per_req": None, "verify_tokens_per_req": None}
    for key, var in (("draft_tokens_per_req", ENV_DRAFT), ("verify_tokens_per_req", ENV_VERIFY)):
        raw = env.get(var, "")
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value < 1:
            raise DDTreeSizeMismatch(
                f"{var}={raw!r}: must be a positive integer (tokens per request); "
                "re-render the unit with ddtree-ops (render/files.py:service_env)"
            )
        out[key] = value
    return out


def find_targets() -> tuple[str | None, list[str]]:
    """``(layout, [dotted targets])`` of the width functions present in the importable SGLang.

    Imports ``sglang.srt.speculative.spec_info`` / ``spec_registry`` (needs torch). Returns
    ``(None, [])`` when SGLang is not importable or has none of :data:`HOOK_CANDIDATES`.
    """
    import importlib

    layout, found = None, []
    for lay, module, cls, method in HOOK_CANDIDATES:
        try:
            owner = getattr(importlib.import_module(module), cls)
        except (ImportError, AttributeError):
            continue
        if callable(getattr(owner, method, None)):
            found.append(f"{module}.{cls}.{method}")
            layout = layout or lay
    return layout, found


def build_has_ddtree() -> bool | None:
    """Whether the running build knows the ``DDTREE`` algorithm (enum member or a
    plugin-registered ``CustomSpecAlgo``); None when SGLang is not importable."""
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    except ImportError:
        return None
    try:
        SpeculativeAlgorithm.from_string(DDTREE)
        return True
    except (ValueError, KeyError):
        return False


def _server_spec() -> dict[str, Any] | None:
    """The server's own speculative arguments in this process, or None when not set yet.

    0.5.23: ``sglang.srt.runtime_context.get_server_args()`` (the operator's input);
    0.5.13: ``sglang.srt.server_args.get_global_server_args()``.
    """
    sa = None
    try:
        from sglang.srt.runtime_context import get_server_args  # 0.5.2x layout

        sa = get_server_args()
    except Exception:  # noqa: BLE001 - older layout or not published yet
        sa = None
    if sa is None:
        try:
            from sglang.srt.server_args import get_global_server_args  # <= 0.5.13 layout

            sa = get_global_server_args()
        except Exception:  # noqa: BLE001 - retired accessor (0.5.23) or not set yet
            sa = None
    if sa is None:
        return None
    block = getattr(sa, "speculative_dflash_block_size", None) or getattr(sa, "speculative_num_draft_tokens", None)
    return {
        "algorithm": getattr(sa, "speculative_algorithm", None),
        "block_size": block,
        "budget": getattr(sa, "speculative_ddtree_budget", None),
        "has_budget_field": hasattr(sa, "speculative_ddtree_budget"),
    }


def check_sizes(sizes: dict[str, Any], server: dict[str, Any] | None, num_draft_tokens: int | None) -> None:
    """Refuse when the unit's sizes disagree with the server's DDTree arguments.

    Args:
        sizes: :func:`sizes_from_env` output.
        server: :func:`_server_spec` output (None: only ``num_draft_tokens`` is known).
        num_draft_tokens: the value SGLang passed to the width function (its
            ``speculative_num_draft_tokens``), used as block size when ``server`` is None.

    Raises:
        DDTreeSizeMismatch: algorithm, block size or budget + 1 disagree.
    """
    fix = ("Fix: render and deploy the unit from the same validated config that builds the argv "
           "(ddtree-ops render / ansible-playbook deploy.yml), so env and argv agree.")
    if sizes.get("algorithm") not in (None, DDTREE):
        raise DDTreeSizeMismatch(
            f"{ENV_ALGORITHM}={sizes['algorithm']} but the server runs DDTREE. {fix}")
    block = server["block_size"] if server and server.get("block_size") else num_draft_tokens
    if block is not None and int(block) != sizes["draft_tokens_per_req"]:
        raise DDTreeSizeMismatch(
            f"{ENV_DRAFT}={sizes['draft_tokens_per_req']} but the server's block size "
            f"(--speculative-num-draft-tokens / --speculative-dflash-block-size) is {block}: "
            f"draft graphs use block_size tokens per request. {fix}")
    if server and server.get("budget") is not None:
        if int(server["budget"]) + 1 != sizes["verify_tokens_per_req"]:
            raise DDTreeSizeMismatch(
                f"{ENV_VERIFY}={sizes['verify_tokens_per_req']} but the server's "
                f"--speculative-ddtree-budget is {server['budget']}: DDTree target-verify graphs "
                f"use budget + 1 = {int(server['budget']) + 1} tokens per request. {fix}")


def _around_width(original: Any, *args: Any, **kwargs: Any) -> int:
    """AROUND hook of the width function ``(self, num_draft_tokens, is_draft_worker)``."""
    result = original(*args, **kwargs)
    algo = args[0] if args else kwargs.get("self")
    if getattr(algo, "name", None) != DDTREE:
        return result
    num_draft_tokens = args[1] if len(args) > 1 else kwargs.get("num_draft_tokens")
    is_draft = bool(args[2] if len(args) > 2 else kwargs.get("is_draft_worker", False))
    sizes = _STATE["sizes"] or sizes_from_env()
    if sizes is None:
        _note(logging.WARNING, "DDTREE server without DDTREE_OPS_* sizes in its environment "
              "(unit not rendered by ddtree-ops): widths left as the build computes them")
        return result
    check_sizes(sizes, _server_spec(), num_draft_tokens)
    draft, verify = sizes["draft_tokens_per_req"], sizes["verify_tokens_per_req"]
    want = draft if is_draft else verify
    worker = "draft" if is_draft else "target"
    if result == want:
        _note(logging.INFO, f"{worker} worker: build already sizes DDTree graphs at {want} tokens per request "
              "(no change)")
        return result
    if (is_draft and result == verify) or (not is_draft and result == draft):
        what = "block_size" if not is_draft else "budget + 1"
        _note(logging.WARNING, f"{worker} worker: build sized DDTree verify graphs from {what} ({result}); "
              f"corrected to {want} tokens per request ("
              + ("budget + 1" if not is_draft else "block_size") + ")")
        return want
    raise DDTreeSizeMismatch(
        f"the build sizes DDTree {worker}-worker graphs at {result} tokens per request; expected "
        f"{want} ({'block_size' if is_draft else 'budget + 1'}) and only know how to correct {draft} "
        f"(block_size) <-> {verify} (budget + 1). Fix: pin a DDTree source listed in "
        "ddtree_ops.config.versions.DDTREE_SOURCES")


def register() -> None:
    """Entry point SGLang's ``load_plugins()`` calls: register the width hooks.

    Idempotent per process. A no-op (logged, ``describe()["active"] is False``) when the unit
    is not a DDTree deployment or SGLang has none of the known width functions.
    """
    if _STATE["loaded"]:
        return
    _STATE["loaded"] = True
    try:
        sizes = sizes_from_env()
    except DDTreeSizeMismatch as exc:
        sizes = None
        _STATE["detail"] = f"bad sizes in the environment: {exc}"
    _STATE["sizes"] = sizes
    if sizes is not None and sizes.get("algorithm") not in (None, DDTREE):
        _STATE["active"] = False
        _STATE["detail"] = f"deployment runs {sizes['algorithm']}, not DDTREE: no-op"
        _note(logging.INFO, _STATE["detail"])
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    layout, targets = find_targets()
    if not targets:
        _STATE["active"] = False
        _STATE["detail"] = "no known target-verify width function in this SGLang build: no-op"
        _note(logging.WARNING, _STATE["detail"])
        return
    for target in targets:
        HookRegistry.register(target, _around_width, HookType.AROUND)
    _STATE.update(active=True, layout=layout, targets=targets)
    has = build_has_ddtree()
    _STATE["detail"] = (
        f"hooked {len(targets)} width function(s) ({layout} layout); "
        + ("sizes draft " + str(sizes["draft_tokens_per_req"]) + " / verify " + str(sizes["verify_tokens_per_req"])
           if sizes else "no DDTREE_OPS_* sizes in env")
        + ("; build knows DDTREE" if has else "; build has no DDTREE (yet): hooks stay pass-through")
    )
    _note(logging.INFO, _STATE["detail"])


def entry_point_installed() -> bool:
    """Whether our entry point is registered in this Python environment (what SGLang's
    ``load_plugins()`` would discover)."""
    try:
        eps = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception:  # noqa: BLE001 - broken metadata: not discoverable
        return False
    return any(ep.name == ENTRY_POINT_NAME and ep.value == ENTRY_POINT_VALUE for ep in eps)


def describe() -> dict[str, Any]:
    """State of the plugin, for the capability probe (``ddtree-ops probe-sglang``).

    Returns:
        ``{"installed": bool, "active": bool | None, "detail": str, "entry_point": str,
        "layout": str | None, "targets": [str], "sizes": dict | None, "events": [str]}``.
        ``installed``: SGLang's ``load_plugins()`` would discover the entry point here.
        ``active``: True when the hooks are registered in THIS process, False when the
        plugin ran and decided it has nothing to do, None when it has not run in this
        process (e.g. the probe's own process): then ``layout``/``targets`` tell which width
        functions it would hook in the importable SGLang.
    """
    installed = entry_point_installed()
    out: dict[str, Any] = {
        "installed": installed,
        "active": _STATE["active"],
        "entry_point": f"{ENTRY_POINT_GROUP}: {ENTRY_POINT_NAME} = {ENTRY_POINT_VALUE}",
        "layout": _STATE["layout"],
        "targets": list(_STATE["targets"]),
        "sizes": _STATE["sizes"],
        "events": list(_STATE["events"]),
    }
    if _STATE["loaded"]:
        out["detail"] = _STATE["detail"]
        return out
    try:
        layout, targets = find_targets()
    except Exception as exc:  # noqa: BLE001 - SGLang present but broken: report, do not raise
        layout, targets = None, []
        out["detail"] = f"SGLang import failed: {exc}"
        return out
    out["layout"], out["targets"] = layout, targets
    if not installed:
        out["detail"] = "entry point not installed: SGLang will not load it (install ddtree-ops into this venv)"
    elif not targets:
        out["detail"] = "installed, but this environment has no SGLang width function to hook"
    else:
        out["detail"] = (f"installed; not loaded in this process (SGLang loads it in each server process); "
                         f"would hook {len(targets)} width function(s), {layout} layout")
    return out
