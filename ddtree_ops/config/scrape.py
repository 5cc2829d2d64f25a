"""Where Prometheus (and ddtree-ops run from the controller) reaches a host's SGLang and exporter.

The exporter listens on every address (:attr:`~.service_models.Ops.exporter_url`); SGLang listens where
``ddtree_server.host`` says (its ``--host``: uvicorn binds that one address). A server bound to one
address answers nowhere else, so the ``sglang`` job's target is that address, not ``ansible_host``;
one bound to loopback answers only on its own machine, so a Prometheus elsewhere cannot scrape it
(the sglang job's ``up`` would stay 0 and ``DDTreeSGLangDown`` fire forever): the job leaves it out and
validation says so (:func:`rule_sglang_scrape`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

from .errors import Finding
from .models import Deployment

LOOPBACK = "localhost"
"""Machine name of every loopback address and of ``localhost`` (RFC 6761 §6.3)."""
SOURCE = "SGLang --host (uvicorn binds that address only); Prometheus static_configs targets"


def machine_name(address: str) -> str:
    """A machine name for comparison: IP addresses canonical (``[::1]``, ``0:0::1`` -> ``::1``),
    names lower-case (DNS names compare case-insensitively, RFC 4343), loopback -> :data:`LOOPBACK`."""
    bare = address[1:-1] if address.startswith("[") and address.endswith("]") else address
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        name = bare.lower().rstrip(".")
        return LOOPBACK if name == LOOPBACK or name.endswith("." + LOOPBACK) else name
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:10.0.0.5 is 10.0.0.5 (RFC 4291 §2.5.5.2)
    ip = mapped or ip
    return LOOPBACK if ip.is_loopback else ip.compressed


def url_host(host: str) -> str:
    """``host`` as the host part of a URL or ``host:port`` target: IPv6 addresses bracketed."""
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def scrape_host(d: Deployment) -> str:
    """The host's address for Prometheus: ``ddtree_ops.scrape_host``, else ``ansible_host``, else the
    inventory name (each already validated as an IP address or RFC 1123 host name)."""
    return d.ops.scrape_host or d.address or d.host


def sglang_scrape_host(d: Deployment) -> str | None:
    """Where Prometheus reaches SGLang's ``/metrics``: :func:`scrape_host` when SGLang listens on every
    address (``0.0.0.0`` / ``::``); the address it is bound to otherwise, since it answers nowhere else;
    None when that is a loopback address and Prometheus is not on the same machine (its scrape host is
    not loopback)."""
    ip = ipaddress.ip_address(d.server.host)
    if ip.is_unspecified:
        return scrape_host(d)
    if ip.is_loopback and machine_name(scrape_host(d)) != LOOPBACK:
        return None
    return d.server.host


def rule_sglang_scrape(d: Deployment, p: object) -> Iterator[Finding]:
    """SGLang bound to loopback with Prometheus elsewhere: its ``/metrics`` cannot be scraped, so the
    ``sglang`` job leaves the host out (warning; :func:`sglang_scrape_host`)."""
    if sglang_scrape_host(d) is None:
        yield Finding("warning", "ddtree_server.host", d.server.host,
                      f"SGLang listens on loopback only, so Prometheus (which reaches this host at "
                      f"{scrape_host(d)}) cannot scrape its /metrics: the sglang job leaves this host out and "
                      "DDTreeSGLangDown does not cover it (the exporter, which reads SGLang over loopback, still "
                      "does: DDTreeServiceDown, and DDTreeExporterDown when the node dies)",
                      "listen on 0.0.0.0 (or the address Prometheus reaches) to have SGLang scraped directly, or set "
                      "ddtree_ops.scrape_host: 127.0.0.1 when Prometheus runs on this machine", SOURCE)
