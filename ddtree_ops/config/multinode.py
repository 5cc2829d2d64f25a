"""Multi-node SGLang flags are not modelled: refused in ``ddtree_server.extra_args``.

SGLang spreads one server over several machines with ``--nnodes`` / ``--node-rank`` /
``--dist-init-addr`` (alias ``--nccl-init-addr``): SGLang 0.5.13.post1
``python/sglang/srt/server_args.py`` (``ServerArgs.add_cli_args``, "Multi-node distributed
serving") and 0.5.23 ``python/sglang/srt/arg_groups/fields/parallel.py`` (fields
``dist_init_addr``, ``nnodes``, ``node_rank``). ddtree-ops accounts every instance as one
machine's: its GPUs (tp x dp on this host), its ports and its health (one server, one
``/health``). Passing those flags through ``extra_args`` would deploy a server that the
GPU, port and readiness checks describe wrongly, so they are refused at validate time, in
every spelling argparse accepts: the option itself, a unique prefix (SGLang's parser keeps
``allow_abbrev=True``), and ``--flag=VALUE``. The check runs in the ``extra_args`` field
validator (:class:`~.service_models.Server`), ahead of its spelling check, so ``--nnodes=2`` gets this
rule rather than the generic "no =VALUE"; the error is one finding on
``ddtree_server.extra_args``.
"""

from __future__ import annotations

MULTINODE_FLAGS: tuple[str, ...] = ("--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr")
"""Option strings of SGLang's multi-node destinations (``nnodes``, ``node_rank``,
``dist_init_addr``) in both pinned releases' parsers; no other option of those parsers is a
prefix of one of them (read off both packages), so every prefix abbreviates one of these."""

SOURCE = ("sglang/srt/server_args.py (SGLang 0.5.13.post1, add_cli_args: multi-node distributed serving); "
          "sglang/srt/arg_groups/fields/parallel.py (0.5.23)")
RULE = "multi-node deployments are not modelled: the instance would be accounted as single-node (GPUs, ports, health)"
FIX = ("remove it; deploy one instance per machine (each its own inventory host, tp x dp on its own GPUs) and put "
       "a router (group routers) in front of them")


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

