"""Who listens on a TCP port: the deploy-time check that a service's port is free or
already held by its own systemd unit (``ddtree-ops port-check``).

Reads the kernel's tables only (proc(5)): ``/proc/net/tcp`` and ``/proc/net/tcp6``
(local address and port in hex, state, socket inode), ``/proc/<pid>/fd/*`` links
``socket:[<inode>]`` (which process holds the socket), ``/proc/<pid>/comm`` and
``/proc/<pid>/cgroup`` (the systemd unit, see :func:`unit_of`). Run as root to see every
process; a socket whose holder cannot be read is reported as held by an unknown process.

A port is taken by every socket bound to it, not only a listener: a process that ``bind()``s
and never listens (state ``07`` CLOSE) or a connection using it as its local port makes the
server's own ``bind()`` fail with EADDRINUSE as well (Linux ``inet_csk_bind_conflict``: two
sockets share a port only when both set ``SO_REUSEADDR`` and neither listens). So every TCP
socket of the tables with that local port counts, except ``06`` TIME_WAIT (no owner;
``SO_REUSEADDR``, which SGLang's uvicorn and the exporter set, binds over it) and sockets no
process holds (inode 0: orphans closing down after their owner exited), on a local address
that overlaps ours. A socket that is only bound is in none of the tables (the kernel lists the
listen and established hashes; only Linux >= 6.9's sock_diag dumps bound-inactive sockets), so
on the real ``/proc`` the check also binds the port itself for an instant, with
``SO_REUSEADDR`` as the server does: EADDRINUSE with no socket in the tables is such a socket.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

TIME_WAIT = "06"
_UNIT = re.compile(r"^[A-Za-z0-9:_.@\\-]+\.service$")
_SLICE = re.compile(r"^[A-Za-z0-9:_.@\\-]+\.slice$")


@dataclass(frozen=True)
class Holder:
    """A process holding a socket bound to the port.

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
        holders: processes holding a socket bound to it (empty: free, or holders unreadable).
        inodes: inodes of the sockets bound to it (:func:`bound_inodes`).
        detail: one line for the operator (names the holders and the fix when not ok).
    """

    ok: bool
    port: int
    holders: list[Holder] = field(default_factory=list)
    inodes: list[int] = field(default_factory=list)
    detail: str = ""


def _address(hexaddr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A ``/proc/net/tcp*`` address: 8 or 32 hex digits, each 32-bit word in host byte order."""
    raw = bytes.fromhex(hexaddr)
    if len(raw) not in (4, 16):
        raise ValueError(hexaddr)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    addr = ipaddress.ip_address(raw)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _overlaps(bound: ipaddress.IPv4Address | ipaddress.IPv6Address,
              ours: ipaddress.IPv4Address | ipaddress.IPv6Address | None) -> bool:
    """Would a socket on ``bound`` stop a bind to ``ours`` (None: any address) on the same port?
    A wildcard overlaps every address of its family (``::`` both families: dual-stack unless the
    holder set IPV6_V6ONLY, which /proc does not show)."""
    if ours is None or ours.is_unspecified or bound == ours:
        return True
    if bound.is_unspecified:
        return bound.version == 6 or ours.version == 4
    return False


def bound_inodes(port: int, host: str | None = None, proc: Path = Path("/proc")) -> list[int]:
    """Inodes of the TCP sockets (IPv4 and IPv6) that a bind to ``host``:``port`` conflicts with:
    local port ``port``, any state but TIME_WAIT, held by a process (inode not 0), on a local
    address overlapping ``host`` (None: any address).

    Raises:
        ValueError: ``host`` is not an IP address.
    """
    ours = None if host is None else ipaddress.ip_address(host)
    if isinstance(ours, ipaddress.IPv6Address) and ours.ipv4_mapped is not None:
        ours = ours.ipv4_mapped
    out: list[int] = []
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (proc / table).read_text(encoding="ascii", errors="replace").splitlines()[1:]
        except OSError:  # no IPv6 in this kernel/namespace
            continue
        for line in lines:
            cols = line.split()
            if len(cols) < 10 or cols[3] == TIME_WAIT:
                continue
            try:
                addr, hexport = cols[1].rsplit(":", 1)
                local_port = int(hexport, 16)
                inode = int(cols[9])
                if local_port != port or not inode or not _overlaps(_address(addr), ours):
                    continue
            except ValueError:
                continue
            out.append(inode)
    return sorted(set(out))


def unit_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The systemd unit that owns ``pid``'s cgroup (``/proc/<pid>/cgroup``), or None.

    As systemd's own ``cg_path_get_unit``: the first component of the cgroup path that is not a
    ``*.slice`` — ``0::/system.slice/ddtree-sglang.service`` (v2; v1 ``name=systemd:``) is
    ``ddtree-sglang.service``, also for a cgroup below it. Anything under that first unit is
    the unit's own business: ``user@1000.service/app.slice/ddtree-sglang.service`` is a unit of
    user 1000's service manager (a delegated subtree where any user names cgroups as they
    like), owned by ``user@1000.service`` — never the system unit of the same name (taking the
    last ``*.service`` component would let any user's unit pass as ours). A path whose first
    non-slice component is no service (``session-3.scope``, ``init.scope``) gives None.
    """
    try:
        text = (proc / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if (hier == "0" and controllers == "") or controllers == "name=systemd":
            for part in (p for p in path.split("/") if p):
                if not _SLICE.match(part):
                    return part if _UNIT.match(part) else None
            return None
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


def bind_refused(port: int, host: str | None = None) -> bool:
    """Does a bind to ``host``:``port`` (None: ``0.0.0.0``) with ``SO_REUSEADDR``, as the server
    binds, fail with EADDRINUSE right now? The socket is closed at once (never listens)."""
    addr = ipaddress.ip_address(host or "0.0.0.0")
    fam = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((str(addr), port))
    except OSError as exc:  # EADDRNOTAVAIL, EACCES, EAFNOSUPPORT (no IPv6): not a holder's doing
        return exc.errno == errno.EADDRINUSE
    return False


_FIELD = re.compile(r"[a-z][a-z0-9_]{0,63}(\.[a-z][a-z0-9_]{0,63}){0,3}")
"""An inventory field name as the fix may name it."""
PORT_FIELDS = "ddtree_server.port / ddtree_ops.exporter_port"
"""What the fix names when the caller does not say which inventory field set the port."""


def check_port(port: int, unit: str, proc: Path = Path("/proc"), host: str | None = None,
               field_name: str | None = None) -> PortCheck:
    """Is TCP ``port`` free, or held only by processes of ``unit`` (the service about to be
    (re)started)? Anything else would make the start fail with EADDRINUSE. ``host``: the IP
    address the service binds (None: any address, the strictest check). ``field_name``: the
    inventory field that sets this port (``ddtree_server.nccl_port`` for the rendezvous port),
    named in the fix; None names :data:`PORT_FIELDS`.

    Raises:
        ValueError: ``port`` outside 1-65535, ``unit`` not a ``*.service`` name, ``host`` no IP address.
    """
    if isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"port {port!r}: must be 1-65535")
    if not _UNIT.match(unit):
        raise ValueError(f"unit {unit[:200]!r}: must be a systemd service name such as ddtree-sglang.service")
    if host is not None:
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"host {host[:200]!r}: must be an IP address such as 0.0.0.0 or 127.0.0.1") from None
    fields = field_name if field_name and _FIELD.fullmatch(field_name) else PORT_FIELDS
    inodes = bound_inodes(port, host, proc)
    if not inodes:
        if proc == Path("/proc") and bind_refused(port, host):
            return PortCheck(False, port, detail=(
                f"port {port} is already in use by a socket that is bound but not listening (the kernel's "
                "tables do not name its process; `ss -tanp` neither): the service's bind would fail with "
                f"EADDRINUSE. Fix: stop that process or set another port in the inventory ({fields})"))
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
                     f"another port in the inventory ({fields})")
