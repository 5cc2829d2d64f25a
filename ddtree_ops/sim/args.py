"""Argv parsing and server-args resolution of the SGLang SIMULATOR (a test double).

Mirrors ``sglang.srt.server_args`` closely enough that a launch argv that SGLang of the
simulated version would reject is rejected here too (argparse error, exit 2, or a
``ValueError`` during resolution), and that the resolved fields carry SGLang's names.

Environment:

``SGLANG_SIM_VERSION``  simulated SGLang version (default ``0.5.23``). Selects the
    CUDA-graph flag dialect:

    * ``<= 0.5.13``: ``--cuda-graph-max-bs``, ``--cuda-graph-bs``; fields
      ``cuda_graph_max_bs``, ``cuda_graph_bs`` (resolved capture list).
    * ``0.5.14 .. 0.5.19``: ``--cuda-graph-max-bs-decode``, ``--cuda-graph-bs-decode``,
      ``--cuda-graph-max-bs-prefill``, ``--cuda-graph-bs-prefill``; the old names are
      deprecated aliases of the ``-decode`` ones (a warning is logged).
    * ``>= 0.5.20``: the old names are gone; since they are prefixes of the ``-decode``
      and ``-prefill`` names, argparse answers "ambiguous option" (exit 2).

    ``--disable-cuda-graph`` exists in all of them.
``SGLANG_SIM_BUILD``  ``ddtree`` (default; DDTree build sizing verify graphs at
    budget+1), ``ddtree-unpatched`` (DDTree build of the 0.5.11-0.5.13 generation that
    sizes verify graphs from num_draft_tokens == block_size), ``release`` (no DDTree:
    ``--speculative-ddtree-budget`` is unrecognized and DDTREE is no valid algorithm).
"""

from __future__ import annotations

import json
import logging
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config.sim_parser import (
    DEFAULT_BUILD,
    DEFAULT_VERSION,
    algorithms_for,
    build_parser,
    graph_dialect,
    parse_version,
)

logger = logging.getLogger("ddtree_ops.sim")

# Accept lengths (tokens per request per verify pass, bonus token included) used when
# neither SGLANG_SIM_ACCEPT_LENGTH nor /_sim/accept_length says otherwise. Capped at
# what one verify pass can accept (see SimConfig.max_accept_length).
DEFAULT_ACCEPT_LENGTH = {
    None: 1.0,
    "DDTREE": 6.0,
    "DFLASH": 4.5,
    "EAGLE": 3.0,
    "EAGLE3": 3.0,
    "STANDALONE": 3.0,
    "NGRAM": 2.0,
}

# Sizes the sim uses where real SGLang would read the GPU or the model config.
DEFAULT_CONTEXT_LENGTH = 32768
DEFAULT_MEM_FRACTION_STATIC = 0.88  # SGLang's fallback when GPU memory is unknown
DEFAULT_CHUNKED_PREFILL_SIZE = 4096  # idem
NO_GPU_CUDA_GRAPH_MAX_BS = 160  # idem (no speculation)
SPEC_CUDA_GRAPH_MAX_BS = 48  # sim choice under speculation: = the max_running_requests cap
SPEC_MAX_RUNNING_REQUESTS = 48  # SGLang: "Max running requests is reset to 48 ..."
NON_SPEC_RUNNING_LIMIT = 1024  # sim's scheduler limit when max_running_requests is unset
REQ_POOL_SIZE_UNSET = 4096  # req_to_token_pool size the capture runner clamps to


class SimArgumentError(ValueError):
    """Raised by resolution for argv that SGLang would refuse after parsing."""


def _config_file_argv(argv: list[str]) -> list[str]:
    """Expand ``--config FILE.yaml`` like SGLang: the file's args go first, the CLI wins."""
    path = None
    for i, tok in enumerate(argv):
        if tok == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif tok.startswith("--config="):
            path = tok.split("=", 1)[1]
    if path is None:
        return argv
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError as exc:  # pragma: no cover - PyYAML is a project dependency
        raise SimArgumentError("--config needs PyYAML installed") from exc
    data = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(data, dict):
        raise SimArgumentError(f"--config {path}: expected a mapping of argument names to values")
    extra: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if isinstance(value, bool):
            if value:
                extra.append(flag)
        elif isinstance(value, list):
            extra += [flag, *map(str, value)]
        elif value is not None:
            extra += [flag, str(value)]
    return extra + argv


def spec_capture_bs(max_bs: int) -> list[int]:
    """SGLang's decode capture list under speculation (``_generate_cuda_graph_batch_sizes``):
    1..8, 10..32 step 2, 40..64 step 4, 72..256 step 8, 272.. step 16, all <= max_bs."""
    bs = (
        list(range(1, 9))
        + list(range(10, 33, 2))
        + list(range(40, 65, 4))
        + list(range(72, 257, 8))
        + list(range(272, max_bs + 1, 16))
    )
    return [b for b in bs if b <= max_bs]


def plain_capture_bs(max_bs: int) -> list[int]:
    """SGLang's decode capture list without speculation, all <= max_bs."""
    bs = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    return [b for b in bs if b <= max_bs]


def prefill_capture_tokens(max_tokens: int) -> list[int]:
    """SGLang 0.5.2x prefill (piecewise) capture sizes, all <= max_tokens."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_tokens + 1, 512))
    )
    return [s for s in sizes if s <= max_tokens]


def runner_capture_bs(server_bs: list[int], pool_size: int, width: int, alignment: int) -> list[int]:
    """What the CUDA-graph runner actually captures (``get_batch_sizes_to_capture``).

    Adds ``pool_size`` (max running requests) when the list goes beyond it, drops sizes
    above it, and keeps a size only when ``bs * width`` is a multiple of ``alignment``.
    """
    bs = list(server_bs)
    if bs and max(bs) > pool_size:
        bs.append(pool_size)
    bs = [b for b in bs if 0 < b <= pool_size and (b * width) % alignment == 0]
    return sorted(set(bs))


@dataclass
class SimConfig:
    """Everything the simulator needs, resolved from argv and env.

    ``server_args``: flat dict with SGLang's field names (what /server_info shows).
    Widths are tokens per request: ``verify_tokens_per_req`` is what a verify pass
    needs, ``captured_verify_tokens_per_req`` what the "captured" graphs were sized for.
    """

    version: str
    build: str
    server_args: dict[str, Any]
    algorithm: str | None
    block_size: int | None
    budget: int | None
    verify_tokens_per_req: int
    draft_tokens_per_req: int | None
    captured_verify_tokens_per_req: int
    cuda_graph_enabled: bool
    cuda_graph_max_bs: int
    server_capture_bs: list[int]
    capture_bs: list[int]
    max_running_requests: int
    max_accept_length: int
    context_length: int
    max_total_num_tokens: int
    warnings: list[str] = field(default_factory=list)

    @property
    def model_name(self) -> str:
        return self.server_args["served_model_name"]

    @property
    def speculative(self) -> bool:
        return self.algorithm is not None

    def padded_bs(self, bs: int) -> int | None:
        """Smallest captured batch size >= bs, or None when the batch runs eagerly."""
        if not self.cuda_graph_enabled:
            return None
        for b in self.capture_bs:
            if b >= bs:
                return b
        return None


def _warn(cfg_warnings: list[str], msg: str, *args: Any) -> None:
    text = msg % args if args else msg
    cfg_warnings.append(text)
    logger.warning(text)


def _draft_block_size_from_config(path: str | None) -> int | None:
    """Block size from a local draft ``config.json`` (``block_size`` or ``dflash_config``)."""
    if not path:
        return None
    cfg = Path(path) / "config.json"
    try:
        data = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    for src in (data, data.get("dflash_config") or {}):
        if isinstance(src, dict) and isinstance(src.get("block_size"), int):
            return src["block_size"]
    return None


def _model_context_length(path: str) -> int | None:
    try:
        data = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    value = data.get("max_position_embeddings")
    return value if isinstance(value, int) else None


def parse_args(
    argv: list[str],
    version: str | None = None,
    build: str | None = None,
) -> SimConfig:
    """Parse and resolve argv like ``prepare_server_args`` + ServerArgs.__post_init__.

    ``version``/``build`` default to env ``SGLANG_SIM_VERSION``/``SGLANG_SIM_BUILD``.
    Raises ``SystemExit(2)`` on argparse errors (message on stderr, as SGLang) and
    ``SimArgumentError`` (a ValueError) on semantic errors SGLang raises after parsing.

    Resolution runs in SGLang's order, one step per helper: plain defaults, speculative
    decoding (per algorithm family), per-request widths, CUDA graphs, derived fields.
    """
    version = version or os.environ.get("SGLANG_SIM_VERSION", DEFAULT_VERSION)
    build = build or os.environ.get("SGLANG_SIM_BUILD", DEFAULT_BUILD)
    ver = parse_version(version)
    dialect = graph_dialect(ver)
    parser = build_parser(version, build)
    ns = parser.parse_args(_config_file_argv(list(argv)))
    sa: dict[str, Any] = vars(ns).copy()
    sa.pop("config", None)
    warnings: list[str] = []

    _resolve_defaults(sa, ver, build)
    algo, block_size, budget = _resolve_speculative(sa, ver, build, warnings)
    if sa["page_size"] is None:
        sa["page_size"] = 1
    if sa["attention_backend"] is None:
        sa["attention_backend"] = "triton"
    if algo in ("DFLASH", "DDTREE") and ver >= (0, 5, 17):
        _resolve_dflash_draft_attention_backend(sa)
    verify_w, draft_w, max_accept = _widths(sa, algo, block_size, budget)
    captured_w = verify_w
    if algo == "DDTREE" and build == "ddtree-unpatched":
        captured_w = int(sa["speculative_num_draft_tokens"])  # the bug: block_size, not budget + 1
    graphs = _resolve_cuda_graphs(sa, dialect, algo, captured_w)

    context_length = sa["context_length"] or _model_context_length(sa["model_path"]) or DEFAULT_CONTEXT_LENGTH
    max_total = sa["max_total_tokens"] or int(500_000 * sa["mem_fraction_static"])
    running_limit = sa["max_running_requests"] or NON_SPEC_RUNNING_LIMIT
    _resolve_info_fields(sa, ver)

    return SimConfig(
        version=version,
        build=build,
        server_args=sa,
        algorithm=algo,
        block_size=block_size,
        budget=budget,
        verify_tokens_per_req=verify_w,
        draft_tokens_per_req=draft_w,
        captured_verify_tokens_per_req=captured_w,
        cuda_graph_enabled=not graphs.decode_disabled,
        cuda_graph_max_bs=graphs.max_bs,
        server_capture_bs=graphs.server_bs,
        capture_bs=[] if graphs.decode_disabled else graphs.captured,
        max_running_requests=running_limit,
        max_accept_length=max_accept,
        context_length=context_length,
        max_total_num_tokens=max_total,
        warnings=warnings,
    )


def _resolve_defaults(sa: dict[str, Any], ver: tuple[int, int, int], build: str) -> None:
    """Plain ServerArgs defaults (tokenizer, names, seed, memory) and the TP/DP shape check."""
    sa["tokenizer_path"] = sa["tokenizer_path"] or sa["model_path"]
    sa["served_model_name"] = sa["served_model_name"] or sa["model_path"]
    if sa["random_seed"] is None:
        sa["random_seed"] = random.randint(0, 2**30)
    if sa["mem_fraction_static"] is None:
        sa["mem_fraction_static"] = DEFAULT_MEM_FRACTION_STATIC
    if sa["chunked_prefill_size"] is None:
        sa["chunked_prefill_size"] = DEFAULT_CHUNKED_PREFILL_SIZE
    sa.setdefault("speculative_dflash_block_size", None)
    sa.setdefault("speculative_draft_window_size", None)
    if build != "release" and ver >= (0, 5, 11):
        sa.setdefault("speculative_ddtree_budget", None)
    if sa["tp_size"] < 1 or sa["dp_size"] < 1 or sa["tp_size"] % sa["dp_size"]:
        raise SimArgumentError(f"tp_size={sa['tp_size']} must be a positive multiple of dp_size={sa['dp_size']}.")
    # the first as ServerArgs.check_server_args (sglang/srt/server_args.py); the rank bound is the simulator's own
    if sa["nnodes"] < 1 or sa["tp_size"] * sa["pp_size"] % sa["nnodes"]:
        raise SimArgumentError("tp_size must be divisible by number of nodes")
    if not 0 <= sa["node_rank"] < sa["nnodes"]:
        raise SimArgumentError(f"node_rank={sa['node_rank']} must be less than nnodes={sa['nnodes']}.")


def _resolve_speculative(
    sa: dict[str, Any], ver: tuple[int, int, int], build: str, warnings: list[str]
) -> tuple[str | None, int | None, int | None]:
    """Speculative decoding (``sglang/srt/arg_groups/speculative_hook.py``): ``(algorithm,
    block_size, budget)``; the last two are set for DFLASH/DDTREE (budget for DDTREE only)."""
    algo = sa["speculative_algorithm"]
    if algo is not None:
        algo = sa["speculative_algorithm"] = algo.upper()
        if algo not in algorithms_for(ver, build):
            raise SimArgumentError(f"Unknown speculative algorithm name: {sa['speculative_algorithm']}")
    if algo == "NEXTN":
        algo = sa["speculative_algorithm"] = "EAGLE"
    if sa["speculative_draft_model_path"] is not None and sa["speculative_draft_model_revision"] is None:
        sa["speculative_draft_model_revision"] = "main"
    window = sa["speculative_draft_window_size"]
    if window is not None and window <= 0:
        raise SimArgumentError(f"--speculative-draft-window-size must be positive, got {window}.")

    block_size: int | None = None
    budget: int | None = None
    if algo is not None and sa["max_running_requests"] is None:
        sa["max_running_requests"] = SPEC_MAX_RUNNING_REQUESTS
        _warn(warnings, "Max running requests is reset to 48 for speculative decoding. "
              "You can override this by explicitly setting --max-running-requests.")

    if algo in ("DFLASH", "DDTREE"):
        block_size = _resolve_dflash(sa, algo, ver, window, warnings)
        if algo == "DDTREE":
            budget = _resolve_ddtree_budget(sa, block_size)
    elif algo in ("EAGLE", "EAGLE3", "STANDALONE"):
        _resolve_eagle(sa, algo, ver, warnings)
    elif algo == "NGRAM":
        _resolve_ngram(sa, warnings)
    if window is not None and algo not in ("EAGLE3", "DFLASH", "DDTREE"):
        _warn(warnings, "--speculative-draft-window-size has no effect with speculative_algorithm=%s "
              "(honored by Llama EAGLE-3 and DFLASH only).", algo)
    return algo, block_size, budget


def _resolve_dflash(
    sa: dict[str, Any], algo: str, ver: tuple[int, int, int], window: int | None, warnings: list[str]
) -> int:
    """DFLASH and DDTREE (DDTree builds on DFlash): checks, one step, top-k 1; returns block_size."""
    if sa["enable_dp_attention"]:
        raise SimArgumentError(f"Currently {algo} speculative decoding does not support dp attention.")
    if sa["pp_size"] != 1:
        raise SimArgumentError(f"Currently {algo} speculative decoding only supports pp_size == 1.")
    if sa["speculative_draft_model_path"] is None:
        raise SimArgumentError(f"{algo} speculative decoding requires setting --speculative-draft-model-path.")
    for name, flag in (("speculative_num_steps", "num_steps"), ("speculative_eagle_topk", "eagle_topk")):
        if sa[name] is None:
            sa[name] = 1
        elif sa[name] != 1:
            _warn(warnings, "%s only supports speculative_%s == 1; overriding speculative_%s=%s to 1.",
                  algo, flag, flag, sa[name])
            sa[name] = 1
    dbs = sa["speculative_dflash_block_size"]
    if dbs is not None:
        if dbs <= 0:
            raise SimArgumentError(f"{algo} requires --speculative-dflash-block-size to be positive, got {dbs}.")
        ndt = sa["speculative_num_draft_tokens"]
        if ndt is not None and ndt != dbs:
            raise SimArgumentError(
                "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                f"but they differ. For {algo} they must match. speculative_num_draft_tokens={ndt}, "
                f"speculative_dflash_block_size={dbs}."
            )
        sa["speculative_num_draft_tokens"] = dbs
    if sa["speculative_num_draft_tokens"] is None:
        inferred = _draft_block_size_from_config(sa["speculative_draft_model_path"])
        if inferred is None:
            inferred = 16
            _warn(warnings, "speculative_num_draft_tokens is not set; defaulting to %d for %s.", inferred, algo)
        sa["speculative_num_draft_tokens"] = inferred
    block_size = int(sa["speculative_num_draft_tokens"])
    if window is not None and window < block_size:
        raise SimArgumentError(
            "--speculative-draft-window-size must be >= --speculative-num-draft-tokens (block_size). "
            f"window_size={window}, block_size={block_size}."
        )
    if algo == "DDTREE" or ver <= (0, 5, 13):
        # v1 DFlash worker (<= 0.5.13) and DDTree's own decode loop have no overlap;
        # DFlashWorkerV2 (0.5.23: resolved disable_overlap_schedule False) has.
        sa["disable_overlap_schedule"] = True
        _warn(warnings, "Overlap scheduler is disabled when using %s speculative decoding "
              "(spec v2 is not supported yet).", algo)
    sa["enable_mixed_chunk"] = False
    return block_size


DFLASH_DRAFT_BACKENDS = ("flashinfer", "fa3", "fa4", "triton", "trtllm_mha", "ascend")


def _resolve_dflash_draft_attention_backend(sa: dict[str, Any]) -> None:
    """0.5.17 ``_resolve_dflash_draft_attention_backend``: the draft runs the given backend, else
    the target's, falling back to flashinfer (CUDA) when that one is none of the supported."""
    draft = sa["speculative_draft_attention_backend"] or sa["decode_attention_backend"] or sa["attention_backend"]
    if draft is None or draft not in DFLASH_DRAFT_BACKENDS:
        draft = "flashinfer"
    sa["speculative_draft_attention_backend"] = draft


def _resolve_ddtree_budget(sa: dict[str, Any], block_size: int) -> int:
    """DDTree's node budget (default block_size - 1) and what full-tree mode requires."""
    budget = sa["speculative_ddtree_budget"]
    if budget is None:
        budget = sa["speculative_ddtree_budget"] = block_size - 1
    if budget < 1:
        raise SimArgumentError(f"--speculative-ddtree-budget must be >= 1, got {budget}.")
    if budget > block_size - 1:  # full-tree mode
        attn = sa["attention_backend"]
        if attn is None:
            sa["attention_backend"] = "triton"
            logger.info("DDTree full-tree mode (budget %d > block_size - 1 = %d): "
                        "using the triton attention backend.", budget, block_size - 1)
        elif attn != "triton":
            raise SimArgumentError(
                f"DDTree full-tree mode (budget {budget} > block_size - 1 = {block_size - 1}) "
                f"requires --attention-backend triton, got {attn!r}."
            )
        if sa["page_size"] not in (None, 1):
            raise SimArgumentError(
                f"DDTree full-tree mode requires --page-size 1, got {sa['page_size']}."
            )
        if sa.get("speculative_use_rejection_sampling"):
            raise SimArgumentError(
                "DDTree full-tree mode does not support --speculative-use-rejection-sampling."
            )
    return budget


def _resolve_eagle(sa: dict[str, Any], algo: str, ver: tuple[int, int, int], warnings: list[str]) -> None:
    """EAGLE, EAGLE3 and STANDALONE: steps / top-k / draft tokens and the spec v1/v2 overlap rule."""
    if algo == "STANDALONE" and sa["enable_dp_attention"]:
        raise SimArgumentError("Currently standalone speculative decoding does not support dp attention.")
    if sa["speculative_num_steps"] is None:
        if sa["speculative_eagle_topk"] is not None or sa["speculative_num_draft_tokens"] is not None:
            raise SimArgumentError(
                "Set --speculative-num-steps together with --speculative-eagle-topk and "
                "--speculative-num-draft-tokens (SGLang asserts this)."
            )
        # auto_choose_speculative_params for a plain Llama-like target
        sa["speculative_num_steps"], sa["speculative_eagle_topk"], sa["speculative_num_draft_tokens"] = 3, 1, 4
    if sa["speculative_eagle_topk"] is None:
        sa["speculative_eagle_topk"] = 1
    if sa["speculative_num_draft_tokens"] is None:
        sa["speculative_num_draft_tokens"] = sa["speculative_num_steps"] + 1
    if sa["speculative_eagle_topk"] == 1 and sa["speculative_num_draft_tokens"] != sa["speculative_num_steps"] + 1:
        _warn(warnings, "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
              "when speculative_eagle_topk == 1")
        sa["speculative_num_draft_tokens"] = sa["speculative_num_steps"] + 1
    # speculative_hook._handle_eagle_family: the V2 worker runs overlapped unless the overlap
    # scheduler is turned off: by --disable-overlap-schedule, a CPU device, or (0.5.13.post1 only)
    # SGLANG_ENABLE_SPEC_V2=0 (default on); 0.5.17 and 0.5.23 removed that switch. Read in
    # 0.5.13.post1, 0.5.17 and 0.5.23 (any topk); releases before 0.5.13 are not read: spec v1.
    if ver < (0, 5, 13):
        if not sa["disable_overlap_schedule"]:
            sa["disable_overlap_schedule"] = True
            _warn(warnings, "Spec v1 is used for eagle/eagle3/standalone speculative decoding "
                  "because overlap schedule is disabled.")
    else:
        spec_v2_env = os.environ.get("SGLANG_ENABLE_SPEC_V2", "1").strip().lower() not in ("0", "false", "no", "off")
        if (sa["device"] == "cpu" or (ver < (0, 5, 17) and not spec_v2_env)) and not sa["disable_overlap_schedule"]:
            sa["disable_overlap_schedule"] = True
        if sa["disable_overlap_schedule"]:
            _warn(warnings, "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone "
                  "speculative decoding.")
    sa["enable_mixed_chunk"] = False


def _resolve_ngram(sa: dict[str, Any], warnings: list[str]) -> None:
    """NGRAM: no overlap, top-k from the BFS breadth, 12 draft tokens by default."""
    sa["disable_overlap_schedule"] = True
    sa["enable_mixed_chunk"] = False
    sa["speculative_eagle_topk"] = sa["speculative_ngram_max_bfs_breadth"]
    if sa["speculative_num_draft_tokens"] is None:
        sa["speculative_num_draft_tokens"] = 12
        _warn(warnings, "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
              "You can override this by explicitly setting --speculative-num-draft-tokens.")
    if sa["enable_dp_attention"]:
        raise SimArgumentError("Currently ngram speculative decoding does not support dp attention.")


def _widths(
    sa: dict[str, Any], algo: str | None, block_size: int | None, budget: int | None
) -> tuple[int, int | None, int]:
    """Tokens per request: ``(verify width, draft width or None, max accept length)``."""
    if algo is None:
        return 1, None, 1
    if algo == "DDTREE":
        assert block_size is not None and budget is not None
        return budget + 1, block_size, min(block_size, budget + 1)
    if algo == "DFLASH":
        assert block_size is not None
        return block_size, block_size, block_size
    ndt = int(sa["speculative_num_draft_tokens"])
    if algo == "NGRAM":
        return ndt, None, ndt
    # EAGLE family
    return ndt, int(sa["speculative_eagle_topk"]), int(sa["speculative_num_steps"]) + 1


@dataclass(frozen=True)
class _Graphs:
    """Resolved decode CUDA graphs: max batch, the server's list, what the runner captures."""

    max_bs: int
    server_bs: list[int]
    captured: list[int]
    decode_disabled: bool


def _resolve_cuda_graphs(sa: dict[str, Any], dialect: str, algo: str | None, captured_w: int) -> _Graphs:
    """CUDA graphs (``server_args._handle_gpu_memory_settings`` + the capture runner), in the
    version's flag dialect; writes the resolved fields into ``sa``."""
    if dialect == "legacy":
        explicit_bs, explicit_max = sa["cuda_graph_bs"], sa["cuda_graph_max_bs"]
        decode_disabled = sa["disable_cuda_graph"]
    else:
        explicit_bs, explicit_max = sa["cuda_graph_bs_decode"], sa["cuda_graph_max_bs_decode"]
        decode_disabled = sa["disable_cuda_graph"] or sa.get("disable_decode_cuda_graph", False)
    if explicit_bs:
        max_bs = max(explicit_bs)
    elif explicit_max is not None:
        max_bs = explicit_max
    elif algo is not None:
        max_bs = min(SPEC_CUDA_GRAPH_MAX_BS, sa["max_running_requests"])
    else:
        max_bs = min(NO_GPU_CUDA_GRAPH_MAX_BS, sa["max_running_requests"] or NO_GPU_CUDA_GRAPH_MAX_BS)
    if explicit_bs:
        server_bs = sorted(set(explicit_bs))
    elif sa["disable_cuda_graph_padding"]:
        server_bs = list(range(1, max_bs + 1))
    elif algo is not None:
        server_bs = spec_capture_bs(max_bs)
    else:
        server_bs = plain_capture_bs(max_bs)
    pool = sa["max_running_requests"] or REQ_POOL_SIZE_UNSET
    alignment = 1
    if sa["enable_two_batch_overlap"]:
        alignment *= 2
    if sa["enable_dp_attention"]:
        alignment *= sa["tp_size"] // sa["dp_size"]
    captured = runner_capture_bs(server_bs, pool, 1 if sa["enable_two_batch_overlap"] else captured_w, alignment)
    if not captured and not decode_disabled:
        raise SimArgumentError(f"No CUDA graph batch size survives the filters (list {server_bs}, "
                               f"max running requests {pool}, alignment {alignment}).")
    if dialect == "legacy":
        sa["cuda_graph_max_bs"] = max_bs
        sa["cuda_graph_bs"] = server_bs
    else:
        _resolve_split_graph_config(sa, max_bs, server_bs, decode_disabled, dialect)
    return _Graphs(max_bs, server_bs, captured, decode_disabled)


def _resolve_split_graph_config(sa: dict[str, Any], max_bs: int, server_bs: list[int], decode_disabled: bool,
                                dialect: str) -> None:
    """The ``-decode``/``-prefill`` dialect's resolved fields and ``cuda_graph_config``."""
    sa["cuda_graph_max_bs_decode"] = max_bs
    prefill_max = sa["cuda_graph_max_bs_prefill"] or sa["chunked_prefill_size"]
    prefill_bs = (
        sorted(set(sa["cuda_graph_bs_prefill"]))
        if sa["cuda_graph_bs_prefill"]
        else prefill_capture_tokens(prefill_max)
    )
    sa.setdefault("disable_decode_cuda_graph", False)
    sa.setdefault("disable_prefill_cuda_graph", False)
    decode = {"backend": "disabled" if decode_disabled else "full", "max_bs": max_bs, "bs": server_bs,
              "tc_compiler": "eager", "max_context_size": None, "full_prefill_max_req": None,
              "full_prefill_prefix_chunk_tokens": None, "max_seq_len": None}
    prefill = {"backend": "disabled", "max_bs": prefill_max, "bs": prefill_bs,
               "tc_compiler": "eager", "max_context_size": None, "full_prefill_max_req": None,
               "full_prefill_prefix_chunk_tokens": None, "max_seq_len": None}
    if dialect == "transition":
        # 0.5.17 (recorded, tests/fixtures/gpu): no max_context_size / max_seq_len, and prefill runs
        # "breakable" CUDA graphs up to chunked_prefill_size tokens unless they are turned off
        for phase in (decode, prefill):
            del phase["max_context_size"], phase["max_seq_len"]
        prefill_off = sa["disable_cuda_graph"] or sa["disable_prefill_cuda_graph"]
        prefill["backend"] = "disabled" if prefill_off else "breakable"
    sa["cuda_graph_config"] = {"decode": decode, "prefill": prefill}


def _resolve_info_fields(sa: dict[str, Any], ver: tuple[int, int, int]) -> None:
    """A few more resolved fields real ``/server_info`` carries."""
    sa.update({
        "nccl_port": sa["nccl_port"], "decrypted_config_file": None, "enable_lora": None,
        "disable_chunked_prefix_cache": False, "skip_tokenizer_init": sa["skip_tokenizer_init"],
        "sampling_backend": sa["sampling_backend"] or "pytorch",
        "grammar_backend": sa["grammar_backend"] or "xgrammar",
    })
    if ver >= (0, 5, 20):  # a ServerArgs field in 0.5.23; not in 0.5.13.post1 nor in the recorded 0.5.17
        sa["attn_dp_size"] = sa["dp_size"] if sa["enable_dp_attention"] else 1
    if "mm_feature_transport" in sa and sa["mm_feature_transport"] is None:
        # 0.5.17 _handle_multimodal_feature_transport: unset resolves to cuda_ipc on one CUDA node
        # (the simulator stands for a CUDA host), else cpu
        single_cuda = sa["device"] == "cuda" and sa["nnodes"] == 1
        sa["mm_feature_transport"] = "cuda_ipc" if single_cuda else "cpu"
