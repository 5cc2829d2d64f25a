"""Checks across the nodes of each multi-node server (:mod:`~.multinode` has the per-node rules and
the sources): one module above :mod:`~.load`, because it reads validated deployments, while the
per-node rules run inside validation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .errors import Finding
from .multinode import SRV
from .multinode_flags import SOURCE

if TYPE_CHECKING:
    from .load import Validated
    from .service_models import MultiNode


SAME = ("sglang", "host_class", "model", "speculative", "server")
"""Deployment fields every node of one server must hold alike: the pinned build (one build on
every rank, or the collectives of different code meet), the host class (per-node GPU count and
arch), and everything the argv renders except the node rank."""


def _block(mn: MultiNode) -> str:
    """One multi-node block as a comparable key (every field, in declaration order)."""
    return mn.model_dump_json()


def _shown(mn: MultiNode) -> str:
    return (f"nodes [{', '.join(mn.nodes)}], dist_init_addr {mn.dist_init_addr}, dist_init_port "
            f"{mn.dist_init_port if mn.dist_init_port is not None else 'unset'}, dist_timeout_s "
            f"{mn.dist_timeout_s if mn.dist_timeout_s is not None else 'unset'}")


def _listed_nodes(host: str, mn: MultiNode, unique: dict[str, Validated], report: Callable[..., None]) -> None:
    """Each node ``host``'s block lists (but itself) is a valid host carrying the identical block."""
    block = _block(mn)
    for node in mn.nodes:
        if node == host:
            continue
        if node not in unique:
            report(("missing", block, node), [host, *mn.nodes], f"{SRV}.nodes", node,
                   f"node {node} of {host}'s server is not a valid host of this inventory (the server "
                   "would wait for it forever)", f"add {node} to the inventory, or remove it from the "
                   "list (and lower tp_size)")
            continue
        theirs = unique[node].deployment.server.multinode
        if theirs is None:
            report(("plain", block, node), [host, node], f"{SRV}.nodes", node,
                   f"node {node} of {host}'s server is an ordinary one-machine server (no {SRV}): it never "
                   f"joins, and {host}'s server waits for it until --dist-timeout",
                   f"give {node} the same {SRV} as {host} (set it in one group's group_vars), or remove "
                   f"{node} from the list (and lower tp_size)")
        elif _block(theirs) != block:
            report(("block", frozenset((host, node))), [host, node], f"{SRV}.nodes", node,
                   f"node {node} of {host}'s server carries another {SRV} ({node}: {_shown(theirs)}; {host}: "
                   f"{_shown(mn)}): every node of one server carries the identical block (same nodes in the "
                   "same order, dist_init_addr, dist_init_port, dist_timeout_s) and a host belongs to one "
                   "server only", f"give every node of the server one {SRV} (set it in one group's "
                   "group_vars), and list each host in one server's nodes only")


def multinode_findings(validated: Iterable[Validated], addresses: dict[str, str],
                       focus: set[str] | None = None) -> list[Finding]:
    """Checks across the nodes of each multi-node server, made from every declaring host's side,
    so neither the order of the hosts nor ``--limit`` hides one.

    Args:
        validated: deployments that each passed validation.
        addresses: inventory host -> its machine name (:func:`~.fleet.machine_names`' first).
        focus: report only on problems that concern these hosts (``--limit``): a server whose
            nodes include one of them; None: all.

    Returns:
        One error per problem: a node listed but not in the inventory (or not valid), a listed
        node that carries no or another multi-node block (every node carries the identical block,
        so each host belongs to one server), a node whose pinned build / class / settings differ
        from rank 0's, two nodes on one machine, ``dist_init_addr`` not rank 0's address.
        Sources: the module docstring (one store at rank 0's ``--dist-init-addr``,
        ``model_runner.py`` ``init_torch_distributed``; every node's ``--nnodes`` and
        ``--node-rank`` come from its own block).
    """
    from .scrape import machine_name

    unique = {v.deployment.host: v for v in validated}
    out: list[Finding] = []
    seen: set[object] = set()

    def report(key: object, about: list[str], field: str, value: object, rule: str, fix: str) -> None:
        """Once per ``key``, on the first host of ``about`` in focus (none in focus: not at all)."""
        shown = [h for h in about if focus is None or h in focus]
        if key in seen or not shown:
            return
        seen.add(key)
        out.append(Finding("error", field, value, rule, fix, SOURCE, host=shown[0]))

    for host in sorted(unique):
        d = unique[host].deployment
        mn = d.server.multinode
        if mn is None:
            continue
        block = _block(mn)
        _listed_nodes(host, mn, unique, report)
        rank0 = unique.get(mn.nodes[0])
        if rank0 is None:
            continue
        r0 = rank0.deployment
        theirs = addresses.get(r0.host)
        if theirs is not None and machine_name(mn.dist_init_addr) != theirs:
            report(("addr", block), [host, *mn.nodes], f"{SRV}.dist_init_addr", mn.dist_init_addr,
                   f"is not rank 0's address ({r0.host}: {theirs}); the other nodes would wait for a store "
                   "nobody listens on", f"set it to {theirs} (rank 0's ansible_host)")
        if r0.host == host or r0.server.multinode is None or _block(r0.server.multinode) != block:
            continue  # rank 0 itself, or rank 0's block differs (reported above)
        for field in SAME:
            if getattr(d, field) != getattr(r0, field):
                report((field, host), [host, r0.host], f"ddtree_{field}", "...",
                       f"differs between {host} and rank 0 ({r0.host}) of one multi-node server: every node must "
                       "run the same pinned build and settings", f"give every node of {SRV}.nodes the same "
                       f"ddtree_{field} (set it in one group's group_vars)")
        mine = addresses.get(host)
        if mine is not None and mine == theirs:
            report(("machine", host), [host, r0.host], f"{SRV}.nodes", host,
                   f"{host} and {r0.host} reach one machine ({mine}); each node is its own machine",
                   "give each node its own ansible_host")
    return out


def server_nodes(validated: Iterable[Validated]) -> dict[str, list[str]]:
    """Inventory host -> every node of the multi-node server it is a node of, rank 0 first (its
    ``ddtree_server.multinode.nodes``); a one-machine server has no entry. What the rolling
    restarts (``playbooks/rolling.yml``, ``ddtree-ops fleet restart``) treat as one unit: the ranks
    need each other, so a node restarted alone takes the whole server down (the module docstring
    of :mod:`~.multinode`: a node that stops breaks the NCCL communicator)."""
    out: dict[str, list[str]] = {}
    for v in validated:
        mn = v.deployment.server.multinode
        if mn is not None:
            out[v.deployment.host] = list(mn.nodes)
    return out
