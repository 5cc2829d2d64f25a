"""Checks across the nodes of each multi-node server (:mod:`~.multinode` has the per-node rules and
the sources): one module above :mod:`~.load`, because it reads validated deployments, while the
per-node rules run inside validation.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from .errors import Finding
from .multinode import SRV
from .multinode_flags import SOURCE

if TYPE_CHECKING:
    from .load import Validated


SAME = ("sglang", "host_class", "model", "speculative", "server")
"""Deployment fields every node of one server must hold alike: the pinned build (one build on
every rank, or the collectives of different code meet), the host class (per-node GPU count and
arch), and everything the argv renders except the node rank."""


def multinode_findings(validated: Iterable[Validated], addresses: dict[str, str],
                       focus: set[str] | None = None) -> list[Finding]:
    """Checks across the nodes of each multi-node server.

    Args:
        validated: deployments that each passed validation.
        addresses: inventory host -> its machine name (:func:`~.fleet.machine_names`' first).
        focus: report only on these hosts (``--limit``); None: all.

    Returns:
        One error per problem: a node listed but not in the inventory (or not valid), a node
        whose pinned build / class / settings differ from rank 0's, two nodes on one machine,
        ``dist_init_addr`` not rank 0's address. Sources: the module docstring (one store at
        rank 0's ``--dist-init-addr``, ``model_runner.py`` ``init_torch_distributed``).
    """
    from .scrape import machine_name

    unique = {v.deployment.host: v for v in validated}
    out: list[Finding] = []
    for host in sorted(unique):
        d = unique[host].deployment
        mn = d.server.multinode
        if mn is None or (focus is not None and host not in focus):
            continue
        rank0 = unique.get(mn.nodes[0])
        for node in mn.nodes:
            if node not in unique:
                out.append(Finding("error", f"{SRV}.nodes", node,
                                   f"node {node} of {host}'s server is not a valid host of this inventory (the server "
                                   "would wait for it forever)", f"add {node} to the inventory, or remove it from the "
                                   "list (and lower tp_size)", SOURCE, host=host))
        if rank0 is None or rank0.deployment.host == host:
            continue
        r0 = rank0.deployment
        for field in SAME:
            if getattr(d, field) != getattr(r0, field):
                out.append(Finding("error", f"ddtree_{field}", "...",
                                   f"differs between {host} and rank 0 ({r0.host}) of one multi-node server: every "
                                   "node must run the same pinned build and settings", f"give every node of "
                                   f"{SRV}.nodes the same ddtree_{field} (set it in one group's group_vars)",
                                   SOURCE, host=host))
        mine, theirs = addresses.get(host), addresses.get(r0.host)
        if mine is not None and mine == theirs:
            out.append(Finding("error", f"{SRV}.nodes", host,
                               f"{host} and {r0.host} reach one machine ({mine}); each node is its own machine",
                               "give each node its own ansible_host", SOURCE, host=host))
        if host == mn.nodes[-1] and theirs is not None and machine_name(mn.dist_init_addr) != theirs:
            out.append(Finding("error", f"{SRV}.dist_init_addr", mn.dist_init_addr,
                               f"is not rank 0's address ({r0.host}: {theirs}); the other nodes would wait for a "
                               "store nobody listens on", f"set it to {theirs} (rank 0's ansible_host)", SOURCE,
                               host=host))
    return out
