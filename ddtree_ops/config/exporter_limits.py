"""The exporter's descriptor budget: how many scrapes it serves at once and the unit's
``LimitNOFILE=`` that follows from it. One definition for the renderer (the exporter unit's
limit, :func:`ddtree_ops.render.files.render_host`) and the server that lives within it
(:mod:`ddtree_ops.runtime.exporter_http`)."""

from __future__ import annotations

MAX_CONNECTIONS = 64
"""Connections served at once; Prometheus needs one per scrape."""

BASE_DESCRIPTORS = 64
"""Descriptors the process holds besides client connections: interpreter, listening socket,
the upstream clients' sockets and event loops, logging (measured ~20; kept generous)."""

NOFILE_LIMIT = 2 * MAX_CONNECTIONS + BASE_DESCRIPTORS + 64
"""The exporter unit's ``LimitNOFILE=``: every slot and the cut ones still closing, the base,
and room for connections being closed at accept."""
