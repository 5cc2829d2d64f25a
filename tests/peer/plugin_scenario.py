"""Runs INSIDE a cached real-SGLang venv, with ddtree-ops installed ``--no-deps`` on
``PYTHONPATH`` (see ``conftest.plugin_site``): drives SGLang's own plugin loader against
our entry point and reports what the hooked width functions answer.

Usage: ``python plugin_scenario.py SCENARIO`` -> one JSON object on stdout's last line.

What is REAL here: SGLang's ``load_plugins()`` (entry-point discovery through
``importlib.metadata``, ``HookRegistry.apply_hooks()`` monkey-patching), SGLang's
``SpeculativeAlgorithm`` enum and its ``CustomSpecAlgo`` registry
(``SpeculativeAlgorithm.register``), the release's own width functions (0.5.13.post1:
``get_num_tokens_per_bs_for_target_verify``; 0.5.23: ``get_num_tokens_per_req_for_target_verify``
reached through ``spec_utils.resolve_num_tokens_per_req``, the function the decode CUDA-graph
runner calls), and 0.5.23's ``prepare_server_args`` / runtime context.

What is CONSTRUCTED, because no release has DDTree: the ``DDTREE`` algorithm is registered
through the release's plugin-algorithm registry (a ``CustomSpecAlgo`` named ``DDTREE``, the
way a DDTree build's enum member answers ``.name``), and the server's arguments carry
``speculative_algorithm = "DDTREE"`` and ``speculative_ddtree_budget`` as the DDTree pull
requests add them (0.5.13.post1: a namespace set with the release's own
``set_global_server_args_for_scheduler``, since constructing ServerArgs there needs an
accelerator; 0.5.23: a real ``prepare_server_args`` result for the DFLASH argv, with those two
attributes set). The correctly sized case stands in for a build that sizes correctly
(sgl-project/sglang#29907): its target-verify graph runner passes ``budget + 1`` as the
runner's ``speculative_num_draft_tokens`` override (a parameter both releases' graph runners
have), so the release's width function already answers ``budget + 1``.

Scenarios: ``all`` (describe() before loading, the release as is, then DDTREE registered:
the block_size-sized build and the correctly sized one), ``ddtree`` (DDTREE registered before
loading; used with disagreeing sizes), ``no-ddtree`` (release as is).
"""

from __future__ import annotations

import json
import logging
import sys
import types


def _width_name(obj) -> str:
    for name in ("get_num_tokens_per_req_for_target_verify", "get_num_tokens_per_bs_for_target_verify"):
        if hasattr(obj, name):
            return name
    raise AssertionError("no width function")


def _set_server_args(block: int, budget: int | None, algorithm: str) -> str:
    """Make the server's own arguments visible the way the running server does."""
    try:
        from sglang.srt.runtime_context import get_context  # 0.5.23 layout
    except ImportError:
        get_context = None
    if get_context is not None:
        from sglang.srt.server_args import prepare_server_args

        sa = prepare_server_args(["--model-path", "m", "--speculative-algorithm", "DFLASH",
                                  "--speculative-draft-model-path", "d",
                                  "--speculative-num-draft-tokens", str(block), "--device", "cuda"])
        sa.speculative_algorithm = algorithm
        sa.speculative_ddtree_budget = budget
        get_context().set_server_args(sa)
        return "0.5.23: prepare_server_args + runtime_context.set_server_args"
    from sglang.srt.server_args import set_global_server_args_for_scheduler

    set_global_server_args_for_scheduler(types.SimpleNamespace(
        speculative_algorithm=algorithm, speculative_num_draft_tokens=block,
        speculative_dflash_block_size=None, speculative_ddtree_budget=budget))
    return "0.5.13: set_global_server_args_for_scheduler(namespace)"


def _call(fn):
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the refusal is part of the answer
        return f"{type(exc).__name__}: {exc}"


def main() -> int:
    scenario = sys.argv[1]
    block = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    budget = int(sys.argv[3]) if len(sys.argv) > 3 else 32
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    import sglang

    from ddtree_ops.sglang import plugin

    out: dict = {"sglang": sglang.__version__, "plugin_file": plugin.__file__}
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    width = _width_name(SpeculativeAlgorithm)
    out["width_function"] = width

    def w(name, is_draft, n=block):
        alg = SpeculativeAlgorithm.from_string(name)
        return _call(lambda: getattr(alg, width)(n, is_draft))

    def ddtree_widths(target_n):
        res = {"DDTREE/target": w("DDTREE", False, target_n), "DDTREE/draft": w("DDTREE", True)}
        try:
            from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req  # 0.5.23 caller
        except ImportError as exc:
            out["resolve_import_error"] = str(exc)
            return res
        alg = SpeculativeAlgorithm.from_string("DDTREE")
        res["DDTREE/target via resolve_num_tokens_per_req"] = _call(lambda: resolve_num_tokens_per_req(
            phase="target_verify", spec_algorithm=alg, is_draft_worker=False, num_draft_tokens=target_n))
        res["DDTREE/draft via resolve_num_tokens_per_req"] = _call(lambda: resolve_num_tokens_per_req(
            phase="target_verify", spec_algorithm=alg, is_draft_worker=True, num_draft_tokens=block))
        return res

    def register_ddtree():
        SpeculativeAlgorithm.register("DDTREE")(lambda server_args: None)
        out["server_args_from"] = _set_server_args(block, budget, "DDTREE")

    if scenario == "ddtree":
        register_ddtree()
    out["before"] = plugin.describe()  # outside a loaded process: what the probe sees
    load_plugins()  # SGLang's own loader: discovers our entry point, runs it, applies hooks
    out["patched"] = sorted(t for t in HookRegistry._patched if "target_verify" in t)
    out["describe"] = plugin.describe()
    out["widths"] = {
        "DFLASH/target": w("DFLASH", False), "DFLASH/draft": w("DFLASH", True),
        "EAGLE/target": w("EAGLE", False, 4),
    }
    if scenario == "ddtree":
        out["widths"].update(ddtree_widths(block))
    elif scenario == "all":
        # 1) the release as it is (no DDTREE): pass-through; 2) DDTree build sizing from
        # block_size (sglang-pr-27509): corrected; 3) build that sizes right: untouched.
        register_ddtree()
        out["ddtree_widths"] = ddtree_widths(block)
        out["ddtree_events"] = plugin.describe()["events"]
        out["fixed_widths"] = ddtree_widths(budget + 1)
        out["fixed_events"] = plugin.describe()["events"][len(out["ddtree_events"]):]
    out["events"] = plugin.describe()["events"]
    print("\n" + json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
