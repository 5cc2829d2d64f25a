"""The argv contract of the SGLang simulator source (``ddtree_sglang.source: simulator``): the
parser a simulator host's server runs (:mod:`ddtree_ops.sim` implements it), so validate parses
a simulator host's ``extra_args`` with the very parser the host will run
(:func:`ddtree_ops.config.build_rules.rule_extra_args`) without the product importing the
simulator.

The flag names and dialects are SGLang's own (``sglang/srt/server_args.py`` of the simulated
release: ``ServerArgs.add_cli_args``; the CUDA-graph dialects from
:data:`ddtree_ops.config.versions.DIALECT_SINCE`); the simulator models a subset of them.
"""

from __future__ import annotations

import argparse
import logging
import re

logger = logging.getLogger("ddtree_ops.sim")

DEFAULT_VERSION = "0.5.23"
BUILDS = ("ddtree", "ddtree-unpatched", "release")
DEFAULT_BUILD = "ddtree"

LOAD_FORMAT_CHOICES = [
    "auto", "pt", "safetensors", "npcache", "dummy", "sharded_state", "presharded", "gguf", "bitsandbytes",
    "mistral", "layered", "flash_rl", "remote", "remote_instance", "fastsafetensors", "private", "runai_streamer",
]
"""``--speculative-draft-load-format`` choices of SGLang 0.5.17 (``LOAD_FORMAT_CHOICES``; 0.5.13.post1
lacks ``presharded``)."""


def parse_version(text: str) -> tuple[int, int, int]:
    """``"0.5.13.post1"`` -> ``(0, 5, 13)``. Raises ValueError when no x.y.z is found."""
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", text)
    if not m:
        raise ValueError(f"SGLANG_SIM_VERSION={text!r} is not a version like 0.5.23")
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def graph_dialect(version: tuple[int, int, int]) -> str:
    """``legacy`` (<= 0.5.13), ``transition`` (0.5.14-0.5.19) or ``split`` (>= 0.5.20),
    read from the versions table (:data:`ddtree_ops.config.versions.DIALECT_SINCE`)."""
    from .versions import DIALECT_SINCE, GraphFlagDialect

    found = GraphFlagDialect.LEGACY
    for first, dialect in DIALECT_SINCE:
        if parse_version(str(first)) <= version:
            found = dialect
    return {GraphFlagDialect.LEGACY: "legacy", GraphFlagDialect.SPLIT: "transition",
            GraphFlagDialect.SPLIT_STRICT: "split"}[found]


def algorithms_for(version: tuple[int, int, int], build: str) -> list[str]:
    """Valid ``--speculative-algorithm`` choices for a version and build kind."""
    algos = ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"]
    if version >= (0, 5, 11):  # DFlash is in releases from 0.5.11; DDTree builds on it
        algos.append("DFLASH")
        if build != "release":
            algos.append("DDTREE")
    return algos


class _DeprecatedAlias(argparse.Action):
    """Like SGLang's DeprecatedAliasStoreAction: store under the new dest and warn."""

    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        logger.warning(
            "'%s' is deprecated and will be removed in a future release.%s",
            option_string,
            replacement,
        )
        setattr(namespace, self.dest, values)


def build_parser(version: str = DEFAULT_VERSION, build: str = DEFAULT_BUILD) -> argparse.ArgumentParser:
    """argparse parser with SGLang's flag names for ``version`` and ``build``.

    ``prog`` is ``launch_server.py`` like ``python -m sglang.launch_server``; errors exit 2.
    Abbreviations are allowed (argparse default, as in SGLang), which is what turns the
    removed ``--cuda-graph-max-bs`` into "ambiguous option" from 0.5.20 on.
    """
    if build not in BUILDS:
        raise ValueError(f"SGLANG_SIM_BUILD={build!r}: expected one of {', '.join(BUILDS)}")
    ver = parse_version(version)
    dialect = graph_dialect(ver)
    p = argparse.ArgumentParser(prog="launch_server.py")
    a = p.add_argument

    a("--config", type=str, default=None, help="YAML file of arguments (CLI wins).")
    # Model and tokenizer
    a("--model-path", "--model", type=str, required=True, dest="model_path")
    a("--tokenizer-path", type=str, default=None)
    a("--tokenizer-mode", type=str, default="auto", choices=["auto", "slow"])
    a("--skip-tokenizer-init", action="store_true")
    a("--load-format", type=str, default="auto")
    a("--trust-remote-code", action="store_true")
    a("--context-length", type=int, default=None)
    a("--is-embedding", action="store_true")
    a("--revision", type=str, default=None)
    a("--dtype", type=str, default="auto")
    a("--quantization", type=str, default=None)
    a("--kv-cache-dtype", type=str, default="auto")
    a("--json-model-override-args", type=str, default="{}")
    # HTTP server
    a("--host", type=str, default="127.0.0.1")
    a("--port", type=int, default=30000)
    a("--skip-server-warmup", action="store_true")
    a("--warmups", type=str, default=None)
    a("--api-key", type=str, default=None)
    a("--served-model-name", type=str, default=None)
    a("--chat-template", type=str, default=None)
    a("--reasoning-parser", type=str, default=None)
    a("--tool-call-parser", type=str, default=None)
    a("--enable-cache-report", action="store_true")
    a("--stream-interval", type=int, default=1)
    # Memory and scheduling
    a("--mem-fraction-static", type=float, default=None)
    a("--max-running-requests", type=int, default=None)
    a("--max-queued-requests", type=int, default=None)
    a("--max-total-tokens", type=int, default=None)
    a("--chunked-prefill-size", type=int, default=None)
    a("--max-prefill-tokens", type=int, default=16384)
    a("--schedule-policy", type=str, default="fcfs", choices=["lpm", "random", "fcfs", "dfs-weight", "lof", "priority"])
    a("--schedule-conservativeness", type=float, default=1.0)
    a("--page-size", type=int, default=None)
    a("--disable-radix-cache", action="store_true")
    a("--disable-overlap-schedule", action="store_true")
    a("--enable-mixed-chunk", action="store_true")
    if ver >= (0, 5, 17):  # in 0.5.17 and 0.5.23, not in 0.5.13.post1
        a("--mm-feature-transport", type=str, default=None, choices=["cpu", "cuda_ipc"])
    # Parallelism
    a("--tensor-parallel-size", "--tp-size", type=int, default=1, dest="tp_size")
    a("--pipeline-parallel-size", "--pp-size", type=int, default=1, dest="pp_size")
    a("--data-parallel-size", "--dp-size", type=int, default=1, dest="dp_size")
    a("--expert-parallel-size", "--ep-size", "--ep", type=int, default=1, dest="ep_size")
    a("--enable-dp-attention", action="store_true")
    a("--enable-two-batch-overlap", action="store_true")
    a("--nnodes", type=int, default=1)
    a("--node-rank", type=int, default=0)
    a("--dist-init-addr", "--nccl-init-addr", type=str, default=None, dest="dist_init_addr")
    a("--dist-timeout", type=int, default=None)
    a("--device", type=str, default="cuda")
    a("--base-gpu-id", type=int, default=0)
    a("--nccl-port", type=int, default=None)
    a("--random-seed", type=int, default=None)
    a("--watchdog-timeout", type=float, default=300)
    # Logging and metrics
    a("--log-level", type=str, default="info")
    a("--log-level-http", type=str, default=None)
    a("--log-requests", action="store_true")
    a("--show-time-cost", action="store_true")
    a("--enable-metrics", action="store_true")
    a("--enable-metrics-for-all-schedulers", action="store_true")
    a("--decode-log-interval", type=int, default=40)
    # Kernel backends
    a("--attention-backend", type=str, default=None)
    a("--decode-attention-backend", type=str, default=None)
    a("--prefill-attention-backend", type=str, default=None)
    a("--sampling-backend", type=str, default=None)
    a("--grammar-backend", type=str, default=None)
    a("--moe-runner-backend", type=str, default="auto")
    a("--enable-torch-compile", action="store_true")
    a("--torch-compile-max-bs", type=int, default=32)
    a("--disable-custom-all-reduce", action="store_true")
    a("--enable-nccl-nvls", action="store_true")
    # Speculative decoding
    # No argparse choices, as in SGLang: an unknown name parses and is refused when
    # ServerArgs resolves it (SpeculativeAlgorithm.from_string: "Unknown speculative
    # algorithm name"), see parse_args.
    a("--speculative-algorithm", type=str, default=None)
    a("--speculative-draft-model-path", "--speculative-draft-model", type=str, default=None,
      dest="speculative_draft_model_path")
    a("--speculative-draft-model-revision", type=str, default=None)
    if ver >= (0, 5, 13):  # in 0.5.13.post1, 0.5.17 and 0.5.23 (earlier releases not read)
        a("--speculative-draft-load-format", type=str, default=None, choices=LOAD_FORMAT_CHOICES)
    a("--speculative-num-steps", type=int, default=None)
    a("--speculative-eagle-topk", type=int, default=None)
    a("--speculative-num-draft-tokens", type=int, default=None)
    a("--speculative-accept-threshold-single", type=float, default=1.0)
    a("--speculative-accept-threshold-acc", type=float, default=1.0)
    a("--speculative-token-map", type=str, default=None)
    a("--speculative-attention-mode", type=str, default="prefill", choices=["prefill", "decode"])
    a("--speculative-draft-attention-backend", type=str, default=None)
    if ver > (0, 5, 13):  # absent in 0.5.13.post1, present in 0.5.23 (tests/peer checks both)
        a("--speculative-use-rejection-sampling", action="store_true")
    a("--speculative-ngram-max-bfs-breadth", type=int, default=10)
    if ver >= (0, 5, 11):
        a("--speculative-dflash-block-size", type=int, default=None)
        a("--speculative-draft-window-size", type=int, default=None)
        if ver <= (0, 5, 13):  # 0.5.13.post1 has both names; 0.5.23 only the new one (tests/peer)
            a("--speculative-dflash-draft-window-size", type=int, dest="speculative_draft_window_size",
              help=argparse.SUPPRESS)
    if build != "release" and ver >= (0, 5, 11):
        a("--speculative-ddtree-budget", type=int, default=None,
          help="DDTree node budget (default block_size - 1); > block_size - 1 is full-tree mode.")
    # CUDA graphs, in the dialect of the version
    a("--disable-cuda-graph", action="store_true")
    a("--disable-cuda-graph-padding", action="store_true")
    if dialect == "legacy":
        a("--cuda-graph-max-bs", type=int, default=None)
        a("--cuda-graph-bs", type=int, nargs="+", default=None)
    else:
        a("--cuda-graph-max-bs-decode", type=int, default=None)
        a("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
        a("--cuda-graph-max-bs-prefill", type=int, default=None)
        a("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
        if dialect == "transition":
            a("--cuda-graph-max-bs", type=int, dest="cuda_graph_max_bs_decode", action=_DeprecatedAlias,
              new_flag="--cuda-graph-max-bs-decode", help=argparse.SUPPRESS)
            a("--cuda-graph-bs", type=int, nargs="+", dest="cuda_graph_bs_decode", action=_DeprecatedAlias,
              new_flag="--cuda-graph-bs-decode", help=argparse.SUPPRESS)
        else:
            a("--disable-decode-cuda-graph", action="store_true")
            a("--disable-prefill-cuda-graph", action="store_true")
    return p
