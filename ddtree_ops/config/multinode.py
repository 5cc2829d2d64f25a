"""One SGLang server over several machines (``ddtree_server.multinode``).

SGLang spreads one server over ``--nnodes`` machines with ``--node-rank`` and
``--dist-init-addr`` (alias ``--nccl-init-addr``): SGLang 0.5.13.post1
``python/sglang/srt/server_args.py`` (``ServerArgs.add_cli_args``, "Multi-node distributed
serving") and 0.5.23 ``python/sglang/srt/arg_groups/fields/parallel.py`` (``ParallelArgs``:
``nnodes``, ``node_rank``, ``dist_init_addr``, ``dist_timeout``, "Set timeout for
torch.distributed initialization", default None). What SGLang does with them, read off
``sgl-project/sglang`` ``python/sglang/srt``:

* ``tp_size`` is the total over the nodes; each node runs ``tp_size // nnodes`` TP ranks on
  its own GPUs from ``base_gpu_id`` (``entrypoints/engine.py`` ``_launch_subprocesses``:
  ``tp_size_per_node = tp_size // nnodes``, ``gpu_id = base_gpu_id + tp_rank % tp_size_per_node``);
  ``ServerArgs.check_server_args`` asserts "tp_size must be divisible by number of nodes";
* every rank meets in torch.distributed's TCP store at ``tcp://<dist_init_addr>``, which
  global rank 0 (node 0, TP rank 0) listens on (``model_executor/model_runner.py``
  ``init_torch_distributed``: ``dist_init_method = f"tcp://{dist_init_addr}"``); the other
  nodes wait there until rank 0 is up, and rank 0 waits for all of them (``dist_timeout``,
  else torch's default: 10 min for NCCL, ``torch/distributed/constants.py``);
* only node 0 runs the tokenizer, detokenizer and the HTTP API; a node of rank >= 1 waits
  for its schedulers to be ready, then serves ``launch_dummy_health_check_server`` on its
  ``--port`` (``/health``, ``/health_generate``, ``/ping``; ``/metrics`` with
  ``--enable-metrics``; ``srt/utils/common.py``) and blocks on its scheduler processes;
* DFLASH (and DDTree on it) runs only with ``pp_size == 1`` (0.5.23
  ``arg_groups/speculative_hook.py`` ``_handle_dflash``: "Currently DFLASH speculative decoding
  only supports pp_size == 1"; :data:`~.sglang_checks.CHECKS`, which applies to every node).

ddtree-ops models that as one deployment of several inventory hosts (each node its own SSH
target, unit and release), listed in ``ddtree_server.multinode.nodes``: GPUs are accounted per
machine (:func:`~.instance.rank_gpus`), rank 0's store port per machine
(:mod:`~.fleet`), every node must carry the same pinned build and settings
(:func:`~.multinode_fleet.multinode_findings`), the router fronts rank 0 only, and only rank 0 gets the
warmup, the deployed-settings health check and the exporter (:mod:`ddtree_ops.render.files`).

The SGLang flags themselves are refused in ``ddtree_server.extra_args`` in every spelling
argparse accepts: the option, a unique prefix (SGLang's parser keeps ``allow_abbrev=True``)
and ``--flag=VALUE`` (the ``extra_args`` field validator of :class:`~.service_models.Server`, ahead of
its spelling check, so ``--nnodes=2`` gets this rule rather than the generic "no =VALUE").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .errors import Finding
from .multinode_flags import DIST_INIT_PORT_OFFSET, SOURCE

if TYPE_CHECKING:  # the models import this module lazily; no circle at run time
    from .models import Deployment
    from .plan import Plan

ENGINE_SOURCE = ("sglang/srt/entrypoints/engine.py _launch_subprocesses (tp_size_per_node, node_rank >= 1: "
                 "launch_dummy_health_check_server); ServerArgs.check_server_args")
SRV = "ddtree_server.multinode"


def dist_timeout_s(d: Deployment) -> int:
    """``--dist-timeout`` rendered for a multi-node server: ``multinode.dist_timeout_s``, else the
    unit's start window (``ddtree_service.start_timeout_s``)."""
    mn = d.server.multinode
    if mn is not None and mn.dist_timeout_s is not None:
        return mn.dist_timeout_s
    return d.service.start_timeout_s


def dist_init_addr(d: Deployment) -> str | None:
    """``--dist-init-addr`` (``HOST:PORT``; an IPv6 address in brackets, as SGLang's
    ``configure_ipv6`` parses it); None on one machine."""
    mn = d.server.multinode
    if mn is None:
        return None
    host = f"[{mn.dist_init_addr}]" if ":" in mn.dist_init_addr else mn.dist_init_addr
    return f"{host}:{d.server.dist_init_port}"


def node_argv(d: Deployment) -> list[str]:
    """The multi-node flags of this node's argv (empty on one machine)."""
    if d.server.multinode is None:
        return []
    return ["--nnodes", str(d.server.nnodes), "--node-rank", str(d.node_rank),
            "--dist-init-addr", str(dist_init_addr(d)), "--dist-timeout", str(dist_timeout_s(d))]


def rule_multinode(d: Deployment, p: Plan) -> Iterator[Finding]:
    """One node's own view of its multi-node server: it is one of the nodes, ``tp_size``
    divides over them (SGLang's assertion), data parallelism stays on one machine (not modelled:
    SGLang places DP replicas across nodes through its DP controller), the store port is free
    of the node's other ports, and ``dist_timeout`` covers the start window. Sources: the module
    docstring (0.5.23 ``entrypoints/engine.py``, ``server_args.py`` ``check_server_args``,
    ``arg_groups/fields/parallel.py``)."""
    mn = d.server.multinode
    if mn is None:
        return
    n = len(mn.nodes)
    if d.host not in mn.nodes:
        yield Finding("error", f"{SRV}.nodes", mn.nodes,
                      f"does not list this host ({d.host}): its node rank is its position in the list",
                      f"add {d.host} to {SRV}.nodes (rank 0 first), or move it out of this deployment's group",
                      SOURCE)
    if d.server.tp_size % n:
        yield Finding("error", "ddtree_server.tp_size", d.server.tp_size,
                      f"tp_size must be divisible by number of nodes ({n}, SGLang's own check): tp_size is the "
                      "total over all nodes", f"use tp_size = {n} x the GPUs each node gives (e.g. {n * 8})",
                      ENGINE_SOURCE)
    if d.server.dp_size > 1:
        yield Finding("error", "ddtree_server.dp_size", d.server.dp_size,
                      "data parallelism across nodes is not modelled (ddtree-ops accounts a multi-node server as "
                      "tp_size / nnodes GPUs per node)",
                      "use dp_size 1 with multinode, or deploy one server per machine (dp on each) behind a router",
                      ENGINE_SOURCE)
    for flag in d.server.extra_args:
        if len(flag) > len("--dist-") and "--dist-timeout".startswith(flag):  # the option or its unique prefix
            yield Finding("error", f"ddtree_server.extra_args.{flag}", d.server.extra_args[flag],
                          "a multi-node server renders --dist-timeout from ddtree_server.multinode.dist_timeout_s "
                          "(default: the start window); the flag twice is ambiguous",
                          f"move the value to {SRV}.dist_timeout_s", SOURCE)
    port = d.server.dist_init_port
    for field, other in (("ddtree_server.port", d.server.port), ("ddtree_ops.exporter_port", d.ops.exporter_port),
                         ("ddtree_server.nccl_port", d.server.rendezvous_port)):
        if port == other:
            how = "" if mn.dist_init_port is not None else f" (derived: port + {DIST_INIT_PORT_OFFSET})"
            yield Finding("error", f"{SRV}.dist_init_port", port,
                          f"rank 0's torch.distributed store port{how} is also {field}; the store would not bind",
                          f"set {SRV}.dist_init_port to a free port", SOURCE)
    if mn.dist_timeout_s is not None and mn.dist_timeout_s < d.service.start_timeout_s:
        yield Finding("warning", f"{SRV}.dist_timeout_s", mn.dist_timeout_s,
                      f"shorter than the start window (ddtree_service.start_timeout_s = {d.service.start_timeout_s}): "
                      "rank 0 gives up on a node that joins later than this (model load and graph capture of the "
                      "slowest node included), and a collective that waits longer aborts the server",
                      f"raise it to at least {d.service.start_timeout_s}, or remove it (default: the start window)",
                      SOURCE)
