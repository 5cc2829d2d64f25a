"""Who listens on a TCP port: the deploy-time check that a service's port is free or
already held by its own systemd unit (``ddtree-ops port-check``).

Reads the kernel's tables only (proc(5)): ``/proc/net/tcp`` and ``/proc/net/tcp6``
(state ``0A`` = LISTEN, local port in hex, socket inode), ``/proc/<pid>/fd/*`` links
``socket:[<inode>]`` (which process holds the socket), ``/proc/<pid>/comm`` and
``/proc/<pid>/cgroup`` (the systemd unit: the last ``*.service`` component of its cgroup
path, cgroup v2 ``0::/system.slice/<unit>`` or v1 ``name=systemd``). Run as root to see
every process; a socket whose holder cannot be read is reported as held by an unknown process.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

LISTEN = "0A"
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]+\.service$")


@dataclass(frozen=True)
class Holder:
    """A process holding a listening socket.

    Attributes:
        pid: process id.
        comm: its ``comm`` (executable name, at most 15 characters), ``?`` if unreadable.
        unit: its systemd service unit, or None (not in a service's cgroup, or unreadable).
    """

    pid: int
    comm: str
    unit: str | None


@dataclass(frozen=True)
class PortCheck:
    """Outcome of :func:`check_port`.

    Attributes:
        ok: the port is free, or every holder runs in ``unit``.
        port: the TCP port checked.
        holders: processes listening on it (empty: free, or holders unreadable).
        inodes: socket inodes listening on it.
        detail: one line for the operator (names the holders and the fix when not ok).
    """

    ok: bool
    port: int
    holders: list[Holder] = field(default_factory=list)
    inodes: list[int] = field(default_factory=list)
    detail: str = ""


def listening_inodes(port: int, proc: Path = Path("/proc")) -> list[int]:
    """Inodes of TCP sockets in LISTEN on ``port`` (any address, IPv4 and IPv6)."""
    out: list[int] = []
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text(encoding="ascii", errors="replace").splitlines()[1:]
        except OSError:  # no IPv6 in this kernel/namespace
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] != LISTEN:
                continue
            try:
                local_port = int(cols[1].rsplit(":", 1)[1], 16)
                inode = int(cols[9])
            except (IndexError, ValueError):
                continue
            if local_port == port and inode:
                out.append(inode)
    return sorted(set(out))


def unit_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The systemd service unit of ``pid`` from ``/proc/<pid>/cgroup``, or None."""
    try:
        text = (proc / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (hier == "0" and controllers == "") or controllers == "name=systemd":
            units = [p for p in path.split("/") if _UNIT.match(p)]
            if units:
                return units[-1]
    return None


def holders(inodes: list[int], proc: Path = Path("/proc")) -> list[Holder]:
    """Processes with an fd on one of ``inodes`` (each pid once)."""
    want = {f"socket:[{i}]" for i in inodes}
    found: list[Holder] = []
    if not want:
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target in want:
                try:
                    comm = (entry / "comm").read_text(encoding="utf-8", errors="replace").strip() or "?"
                    comm = "".join(c if c.isprintable() else "?" for c in comm)[:32]  # any process names itself
                except OSError:
                    comm = "?"
                found.append(Holder(int(entry.name), comm, unit_of(int(entry.name), proc)))
                break
    return sorted(found, key=lambda h: h.pid)


def check_port(port: int, unit: str, proc: Path = Path("/proc")) -> PortCheck:
    """Is TCP ``port`` free, or held only by processes of ``unit`` (the service about to be
    (re)started)? Anything else would make the start fail with EADDRINUSE.

    Raises:
        ValueError: ``port`` outside 1-65535 or ``unit`` not a ``*.service`` name.
    """
    if isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"port {port!r}: must be 1-65535")
    if not _UNIT.match(unit):
        raise ValueError(f"unit {unit[:200]!r}: must be a systemd service name such as ddtree-sglang.service")
    inodes = listening_inodes(port, proc)
    if not inodes:
        return PortCheck(True, port, detail=f"port {port} is free")
    hs = holders(inodes, proc)
    others = [h for h in hs if h.unit != unit]
    if hs and not others:
        return PortCheck(True, port, hs, inodes, f"port {port} is held by {unit} itself")
    who = ", ".join(f"pid {h.pid} ({h.comm}{', unit ' + h.unit if h.unit else ', no service unit'})" for h in others)
    if not hs:
        who = f"a process this user cannot see (socket inode {', '.join(map(str, inodes))}; run as root)"
    return PortCheck(False, port, hs, inodes,
                     f"port {port} is already in use by {who}, not by {unit}. Fix: stop that process or set "
                     "another port in the inventory (ddtree_server.port / ddtree_ops.exporter_port)")
