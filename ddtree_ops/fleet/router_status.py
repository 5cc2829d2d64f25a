"""Each instance's state at the routers in front of it, for ``ddtree-ops fleet status``'s
``router`` column.

Source: smg 1.13.0's ``GET /workers`` (``status`` and ``is_healthy`` per worker; the answer of
the real router is recorded in
``tests/fixtures/gpu/router-smg-1.13.0-sglang-0.5.17-h200-2026-12-02/workers.json``), read
through :mod:`ddtree_ops.fleet.router_worker` from the controller at each router's client port
(``ddtree_router.port`` at its ``ansible_host``), one bounded call per router.

A cell reads ``ROUTER: STATE`` per router that lists (or should list) the instance, joined with
``, ``: ``ready``, ``draining``, ``pending``, ``not_ready``, ``failed``, ``unhealthy`` (``ready``
but failing smg's health check), ``unknown`` (a ``status`` smg 1.13.0 does not have: the router's
own text is never shown), ``absent`` (not registered: drained, or never re-added), or
``unreachable`` (the router did not answer). No router in the inventory: no cell.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

from ..config.router import Router, worker_url
from .router_worker import Api, RouterError, state_of, workers

DEFAULT_DEADLINE_S = 10.0


def router_api(r: Router) -> str:
    """The URL the controller reaches router ``r``'s API at (its address, else its name)."""
    from ..config.scrape import url_host

    return f"http://{url_host(r.address or r.host)}:{r.settings.port}"


def registries(routers: Iterable[Router], deadline_s: float = DEFAULT_DEADLINE_S) -> dict[str, list[dict] | None]:
    """Router host -> its ``GET /workers`` list (None when it did not answer in ``deadline_s``)."""
    routers = list(routers)
    end = time.monotonic() + deadline_s

    def one(r: Router) -> list[dict] | None:
        try:
            return workers(Api(router_api(r), r.api_key), end)
        except (RouterError, RecursionError):  # no answer by the deadline, or not smg's (too deep to read)
            return None

    if not routers:
        return {}
    with ThreadPoolExecutor(max_workers=min(16, len(routers))) as pool:
        return dict(zip((r.host for r in routers), pool.map(one, routers), strict=True))


def cells(routers: Iterable[Router], regs: dict[str, list[dict] | None], validated: Iterable) -> dict[str, str]:
    """Instance host -> its router cell (only instances some router fronts)."""
    out: dict[str, list[str]] = {}
    routers = sorted(routers, key=lambda r: r.host)
    for v in validated:
        url = worker_url(v)
        for r in routers:
            if url not in r.workers:
                continue
            reg = regs.get(r.host)
            state = "unreachable" if reg is None else state_of(reg, url)
            out.setdefault(v.deployment.host, []).append(f"{r.host}: {state}")
    return {h: ", ".join(parts) for h, parts in out.items()}


def fleet_cells(inventory: str, vault: Iterable[str] = (), deadline_s: float = DEFAULT_DEADLINE_S) -> dict[str, str]:
    """Instance host -> router cell for the inventory's routers (``{}`` without group routers).

    The routers are validated against every instance of the inventory (a router fronts the whole
    fleet, whatever ``--limit`` selects)."""
    from ..config import ConfigError, validate_hostvars
    from ..config.inventory import load_hostvars
    from ..config.router import load_router_vars, validate_routers

    router_vars = load_router_vars(inventory, vault)
    if not router_vars:
        return {}
    validated = []
    for host, hv in sorted(load_hostvars(inventory, None, vault).items()):
        try:
            validated.append(validate_hostvars(host, hv))
        except ConfigError:
            continue
    routers = validate_routers(router_vars, validated)[0]
    return cells(routers, registries(routers, deadline_s), validated)
