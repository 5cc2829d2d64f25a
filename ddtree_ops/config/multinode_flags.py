"""The multi-node flags of SGLang's parser and their refusal in ``ddtree_server.extra_args``: the
part of :mod:`~.multinode` the field models (:mod:`~.service_models`) use, apart from the rules over
deployments (which import the models: this module imports nothing of the package).

Source: SGLang 0.5.13.post1 ``python/sglang/srt/server_args.py`` (``ServerArgs.add_cli_args``,
"Multi-node distributed serving") and 0.5.23 ``python/sglang/srt/arg_groups/fields/parallel.py``.
"""

from __future__ import annotations

MULTINODE_FLAGS: tuple[str, ...] = ("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr")
"""Option strings of SGLang's multi-node destinations (``nnodes``, ``node_rank``,
``dist_init_addr``) in both pinned releases' parsers; no other option of those
parsers is a prefix of one of them (read off both packages), so every prefix abbreviates one of these."""

SOURCE = ("sglang/srt/server_args.py (SGLang 0.5.13.post1, add_cli_args: multi-node distributed serving); "
          "sglang/srt/arg_groups/fields/parallel.py (0.5.23)")
RULE = ("ddtree-ops renders the multi-node flags from ddtree_server.multinode (GPUs, ports and health are "
        "accounted per node from it)")
FIX = ("remove it; list the machines in ddtree_server.multinode.nodes (rank 0 first, each its own inventory host), "
       "set ddtree_server.multinode.dist_init_addr to rank 0's ansible_host and tp_size to the GPUs of all nodes")

DIST_INIT_PORT_OFFSET = 200
"""``--dist-init-addr`` port of a multi-node server without ``ddtree_server.multinode.dist_init_port``:
its SGLang port plus this (30000 -> 30200), apart from the ``--nccl-port`` default (+100)."""


def multinode_flag(flag: str) -> str | None:
    """The multi-node option ``flag`` is, abbreviates or sets with ``=VALUE``; None otherwise."""
    bare = flag.split("=", 1)[0]
    if len(bare) <= 2 or not bare.startswith("--"):
        return None
    for option in MULTINODE_FLAGS:
        if option.startswith(bare):
            return option
    return None


def describe(flag: str, option: str) -> str:
    """The rule for ``flag`` (which sets ``option``), naming how argparse reads it."""
    bare = flag.split("=", 1)[0]
    how = "is" if bare == option else f"abbreviates (argparse accepts unique prefixes) {option}, which is"
    return f"{flag} {how} a multi-node flag; {RULE}"
