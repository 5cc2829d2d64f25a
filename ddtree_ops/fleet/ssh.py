"""``ddtree-ops fleet``: status, logs, restart and rollback of the inventory's hosts over SSH (fabric).

Connections: one :class:`fabric.Connection` per host, to ``ansible_host`` (else the inventory
name), ``ansible_port`` (22), as ``ansible_user`` (else the local user, as ``ssh`` does) with
``ansible_ssh_private_key_file`` (else the user's default keys and agent, as ``ssh`` does);
neither ``~/.ssh/config`` nor fabric's own config files are read, so the inventory alone says
where a command goes. Host keys are checked against a known_hosts file
(``~/.ssh/known_hosts`` or ``--known-hosts``) and never accepted on first sight
(:class:`paramiko.RejectPolicy`): an unknown or a changed key fails that host, naming it and
the fix.

Deadlines: every host has a total deadline (connect, banner, authentication and each command
together, :attr:`Limits.timeout_s`); a watchdog closes the connection when it passes, so a
host that accepts TCP and never speaks SSH, or a command that never returns, ends that host's
work without holding the others. The run has a total deadline too (:attr:`Limits.deadline_s`);
hosts run in a bounded pool (:attr:`Limits.parallel`).

Output: commands run through our own bounded reader (:func:`HostSession.run`), not invoke's
runner, which keeps everything a command prints in memory: at most :data:`OUTPUT_CAP` bytes
are read from a command, and every string from a host is cleaned of terminal escapes and
control characters, scrubbed of secrets (:func:`ddtree_ops.config.errors.scrub`) and cut
(:data:`FIELD_CAP` characters per field, :data:`LOG_LINE_CAP` per log line) before anyone
prints it.

On the host, ``status`` runs one SSH command: ``systemctl show`` of the unit, ``readlink`` of
``<config dir>/releases/current`` (release "-" when absent), the host's own ``ddtree-ops
health --plan <config dir>/plan.json --warm-marker <marker> --json`` and one read of its
exporter's ``/metrics`` (``ddtree_accept_length``, ``ddtree_generation_tokens_per_second``).
``restart`` and ``rollback`` gate each host like ``playbooks/rolling.yml``: the unit active in a
new invocation, health passing, then the very command the playbook runs, ``<venv>/bin/python -m
ddtree_ops release gate --plan <config dir>/plan.json --deadline S --json`` (:func:`run_gate`,
read by :func:`ddtree_ops.fleet.rollout.read_gate`): its acceptance length must reach the floor.

Over 600 lines: the SSH transport (connections, bounded commands, host-key policy) and the
fleet commands built on it (status, logs, restart, rollback); the rolling policy is
:mod:`.rollout`. The transport is the first candidate for a module of its own.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import secrets
import shlex
import socket
import stat
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# paramiko logs a transport failure (e.g. a host that accepts TCP but sends no SSH banner) with a
# traceback through the logging module; with no handler configured Python prints it to stderr.
# Every failure is reported as the host's one line instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False

if TYPE_CHECKING:
    from ..config import Validated

OUTPUT_CAP = 256 << 10
"""Bytes read from one command at most (health's JSON is ~2 KB; 200 journal lines ~40 KB)."""
LOGS_CAP_DEFAULT = 64 << 10
"""Bytes of journal read per host by ``fleet logs`` unless ``--max-bytes`` says otherwise."""
FIELD_CAP = 200
"""Characters of one value from a host (unit state, release id, a check's detail) shown."""
LOG_LINE_CAP = 1000
"""Characters of one journal line shown."""
POLL_S = 2.0
"""Seconds between two looks at a restarting unit."""
GATE_DEADLINE_S = 120.0
"""Default ``--deadline`` of the host-side gate (``rolling_gate_deadline_s`` in playbooks/rolling.yml)."""
GATE_MARGIN_S = 15.0
"""Seconds past the gate's own ``--deadline`` before fleet stops waiting for its output (process start, JSON)."""
CONNECT_STEP_S = 15.0
"""Longest single connect, banner or authentication wait (each also within the host's deadline)."""

CONNECTION_VARS = ("ansible_user", "ansible_ssh_user", "ansible_port", "ansible_ssh_port",
                   "ansible_ssh_private_key_file", "ansible_private_key_file", "ansible_ssh_common_args",
                   "ansible_ssh_extra_args", "ansible_ssh_args", "ansible_host_key_checking",
                   "ansible_ssh_host_key_checking")
"""Inventory variables fleet reads besides the deployment's (Ansible's ssh connection plugin
names; the ``ansible_ssh_*`` user/port spellings are its older aliases)."""

_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_RELEASE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_CHECKING_OFF = re.compile(r"(?i)StrictHostKeyChecking\s*=?\s*(no|off|false|accept-new)\b"
                           r"|UserKnownHostsFile\s*=?\s*/dev/null")


def clean(data: bytes | str, limit: int = FIELD_CAP) -> str:
    """Host-controlled text as one safe line (:func:`ddtree_ops.config.errors.one_line`), at most
    :data:`FIELD_CAP` characters unless told."""
    from ..config.errors import one_line

    return one_line(data, limit)


class FleetError(Exception):
    """One host's failure: a message naming the host's problem and, where one exists, the fix."""


class CommandTimeout(FleetError):
    """One command passed its own deadline (:meth:`HostSession.run` ``until``); the host's session lives on."""


class UnknownHostKey(Exception):
    """The host offered a key that the known_hosts file does not hold for it."""


# ---------------------------------------------------------------------------------------
# Targets: where and how to reach each host, from the inventory.


@dataclass(frozen=True)
class Target:
    """One inventory host as fleet reaches it.

    Attributes:
        host: inventory name (RFC 1123, validated by the config loader).
        address: ``ansible_host`` (IP or RFC 1123 name, validated), else ``host``.
        port: ``ansible_port`` (1-65535), default 22.
        user: ``ansible_user``, or None (the local user, as ssh does).
        key_file: ``ansible_ssh_private_key_file`` (a readable regular file), or None.
        unit: the SGLang unit, ``ddtree-<name>.service``.
        config_dir, venv: the deployment's config directory and ops venv (absolute).
        warm_marker: the unit's warm marker path.
        exporter_port: the exporter's port on the host.
        gate_s: longest a restart may take to be warm, seconds (the unit's ``TimeoutStartSec``).
        nodes: every node of the multi-node server this host is a node of, rank 0 first
            (``ddtree_server.multinode.nodes``); empty on one machine. :func:`rolling` restarts them
            as one unit.
    """

    host: str
    address: str
    port: int
    user: str | None
    key_file: str | None
    unit: str
    config_dir: str
    venv: str
    warm_marker: str
    exporter_port: int
    gate_s: float
    nodes: tuple[str, ...] = ()

    @property
    def releases_root(self) -> str:
        return f"{self.config_dir}/releases"

    @property
    def ddtree_ops(self) -> str:
        return f"{self.venv}/bin/ddtree-ops"

    @property
    def where(self) -> str:
        """``user@address:port`` for messages."""
        return f"{self.user + '@' if self.user else ''}{self.address}:{self.port}"


def _finding(host: str, var: str, value: Any, rule: str, fix: str):
    from ..config.errors import ConfigError, Finding

    return ConfigError([Finding("error", var, value, rule, fix, host=host)])


def _first(hv: dict[str, Any], *names: str) -> tuple[str, Any]:
    for n in names:
        if hv.get(n) is not None:
            return n, hv[n]
    return names[0], None


def target_of(v: Validated, hv: dict[str, Any]) -> Target:
    """The :class:`Target` of a validated deployment and its host's variables (with
    :data:`CONNECTION_VARS`).

    Raises:
        ConfigError: ``ansible_port`` is no integer 1-65535, ``ansible_user`` no user name,
            or ``ansible_ssh_private_key_file`` no readable regular file (one finding each).
    """
    from ..render.files import timeout_start_s

    d = v.deployment
    var, port = _first(hv, "ansible_port", "ansible_ssh_port")
    if port is None:
        port = 22
    elif isinstance(port, bool) or not re.fullmatch(r"[0-9]{1,5}", str(port)) or not 1 <= int(port) <= 65535:
        raise _finding(d.host, var, port, "must be a TCP port 1-65535", "set the host's ssh port, e.g. 22")
    var, user = _first(hv, "ansible_user", "ansible_ssh_user")
    if user is not None and (not isinstance(user, str) or not _USER.fullmatch(user)):
        raise _finding(d.host, var, user, "must be a user name (letters, digits, _ . -; at most 64; not starting "
                       "with - or .)", "set the remote account, e.g. root or deploy")
    var, key = _first(hv, "ansible_ssh_private_key_file", "ansible_private_key_file")
    if key is not None:
        if not isinstance(key, str) or not key or "\n" in key or len(key) > 4096:
            raise _finding(d.host, var, key, "must be the path of a private key file", "set the key's path")
        key = os.path.expanduser(key)
        try:
            st = os.stat(key)
        except OSError as exc:
            raise _finding(d.host, var, key, f"cannot be read ({exc.strerror})",
                           "give the path of the private key that logs in to the host") from None
        if not stat.S_ISREG(st.st_mode) or not os.access(key, os.R_OK):
            raise _finding(d.host, var, key, "is not a readable regular file",
                           "give the path of the private key file (not a directory or device)")
    return Target(host=d.host, address=d.address or d.host, port=int(port), user=user, key_file=key,
                  unit=d.service.unit_name, config_dir=d.service.config_path, venv=d.service.venv,
                  warm_marker=d.service.warm_marker_path, exporter_port=d.ops.exporter_port,
                  gate_s=float(timeout_start_s(v)),
                  nodes=tuple(d.server.multinode.nodes) if d.server.multinode is not None else ())


def host_key_checking_off(hv: dict[str, Any]) -> str | None:
    """The variable (and value) by which a host's inventory turns host-key checking off for
    Ansible (``StrictHostKeyChecking=no``/``accept-new``, ``UserKnownHostsFile=/dev/null`` in the
    ssh args, ``ansible_host_key_checking: false``), or None. Fleet never follows it."""
    for name in ("ansible_host_key_checking", "ansible_ssh_host_key_checking"):
        if hv.get(name) is not None and str(hv[name]).strip().lower() in ("false", "no", "0", "off"):
            return f"{name}: {hv[name]}"
    for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args"):
        m = _CHECKING_OFF.search(str(hv.get(name) or ""))
        if m:
            return f"{name}: {m.group(0)}"
    return None


# ---------------------------------------------------------------------------------------
# One host's SSH session with a total deadline.


@dataclass(frozen=True)
class Limits:
    """How hard to try.

    Attributes:
        known_hosts: the known_hosts file host keys are checked against.
        timeout_s: total seconds per host (connect + every command); for restart/rollback the
            gate's time (:attr:`Target.gate_s`, or ``gate_s`` here) comes on top.
        parallel: hosts worked on at once.
        deadline_s: total seconds for the whole run.
        gate_s: restart gate bound (None: each target's :attr:`Target.gate_s`).
        gate_deadline_s: the ``--deadline`` of the host-side ``ddtree-ops release gate`` run once
            the unit is healthy again (health, a short synthetic load, acceptance length >= the
            floor; :data:`GATE_DEADLINE_S`, as ``rolling_gate_deadline_s`` of the playbook).
        gate_margin_s: seconds past ``gate_deadline_s`` before fleet stops reading the gate.
    """

    known_hosts: Path
    timeout_s: float = 60.0
    parallel: int = 8
    deadline_s: float = 600.0
    gate_s: float | None = None
    gate_deadline_s: float = GATE_DEADLINE_S
    gate_margin_s: float = GATE_MARGIN_S


class HostSession:
    """An open fabric connection to one host that ends by ``deadline`` (``time.monotonic()``).

    Use as a context manager; a watchdog closes the connection at the deadline, which ends any
    wait inside paramiko (banner, key exchange, authentication, a command's output)."""

    def __init__(self, target: Target, known_hosts: Path, deadline: float, cancel: threading.Event | None = None):
        self.target = target
        self.known_hosts = known_hosts
        self.deadline = deadline
        self.cancel = cancel or threading.Event()
        self._conn: Any = None
        self._timer: threading.Timer | None = None
        self._expired = False
        self.step = "connecting"

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0 or self.cancel.is_set():
            raise self._timeout()
        return left

    def _timeout(self) -> FleetError:
        why = "the run's deadline passed" if self.cancel.is_set() else "no answer within the host's deadline"
        return FleetError(f"{why} ({self.step}); the host hangs or is overloaded: check it on its console "
                          f"(or raise --timeout)")

    def _expire(self) -> None:
        self._expired = True
        self.close()

    def __enter__(self) -> HostSession:
        import paramiko
        from fabric import Config, Connection

        t = self.target
        left = self.remaining()
        self._timer = threading.Timer(left, self._expire)
        self._timer.daemon = True
        self._timer.start()
        step = min(left, CONNECT_STEP_S)
        kwargs: dict[str, Any] = {"banner_timeout": step, "auth_timeout": step, "channel_timeout": step,
                                  "allow_agent": t.key_file is None, "look_for_keys": t.key_file is None}
        if t.key_file:
            kwargs["key_filename"] = [t.key_file]
        # no ~/.ssh/config, no fabric config files: the inventory alone says where a command goes
        config = Config(lazy=True, ssh_config=paramiko.SSHConfig())
        conn = Connection(t.address, user=t.user, port=t.port, config=config, connect_timeout=max(1, math.ceil(step)),
                          connect_kwargs=kwargs, gateway=False, forward_agent=False)
        conn.client.set_missing_host_key_policy(_reject_policy())
        try:
            conn.client.load_system_host_keys(str(self.known_hosts))
        except (OSError, paramiko.SSHException, paramiko.hostkeys.InvalidHostKey, ValueError) as exc:
            # ValueError: undecodable bytes (UnicodeDecodeError) or a line paramiko cannot parse
            self.close()
            raise FleetError(f"known_hosts {self.known_hosts}: cannot be read ({clean(str(exc), 120)}). Fix: "
                             "give a known_hosts file in OpenSSH's format (ssh-keyscan HOST >> FILE, keys checked)"
                             ) from None
        self._conn = conn
        try:
            conn.open()
        except BaseException as exc:
            self.close()
            if self._expired or self.cancel.is_set():
                raise self._timeout() from None
            raise self._connect_error(exc) from None
        self.step = "connected"
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._timer is not None and not self._expired:
            self._timer.cancel()
        conn = self._conn
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001,S110 - closing a broken connection: nothing more to do
                pass

    def _connect_error(self, exc: BaseException) -> FleetError:
        import paramiko

        t = self.target
        hostport = t.address if t.port == 22 else f"[{t.address}]:{t.port}"
        scan = f"ssh-keyscan -p {t.port} {t.address} >> {self.known_hosts}"
        if isinstance(exc, UnknownHostKey):
            return FleetError(f"host key of {hostport} is not in {self.known_hosts}: refused (never accepted "
                              f"unseen). Fix: {scan}, then compare `ssh-keygen -lf {self.known_hosts}` with the "
                              "fingerprint the host shows on its console (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub)")
        if isinstance(exc, paramiko.BadHostKeyException):
            return FleetError(f"host key of {hostport} CHANGED: it differs from the one in {self.known_hosts} "
                              "(a reinstalled host, or someone in between): refused. Fix: verify the new fingerprint "
                              f"on the host's console, then ssh-keygen -R '{hostport}' -f {self.known_hosts} "
                              f"and {scan}")
        if isinstance(exc, paramiko.PasswordRequiredException):
            return FleetError(f"the private key {t.key_file} is encrypted: fleet cannot ask for its passphrase. Fix: "
                              "give ansible_ssh_private_key_file a key without one, or leave it unset and load the "
                              "key into ssh-agent")
        if isinstance(exc, paramiko.AuthenticationException):
            key = f"key {t.key_file}" if t.key_file else "the default keys and agent"
            return FleetError(f"authentication as {t.user or 'the local user'} with {key} failed at {t.where}. "
                              "Fix: check ansible_user / ansible_ssh_private_key_file (the key must be in the "
                              "account's authorized_keys)")
        if isinstance(exc, ConnectionRefusedError):
            return FleetError(f"down: {t.where} refused the connection (no sshd listening)")
        if isinstance(exc, socket.timeout | TimeoutError):
            return FleetError(f"unreachable: no TCP connection to {t.where} within {CONNECT_STEP_S:g} s")
        if isinstance(exc, paramiko.SSHException) and "banner" in str(exc).lower():
            return FleetError(f"hangs: {t.where} accepted TCP but sent no SSH banner (a hung sshd or not SSH)")
        if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
            errnos = {e.errno for e in exc.errors.values() if isinstance(e, OSError)} if exc.errors else set()
            import errno

            if errnos and errnos <= {errno.ECONNREFUSED}:
                return FleetError(f"down: {t.where} refused the connection (no sshd listening)")
            return FleetError(f"unreachable: {t.where}: {clean(str(exc), 160)}")
        if isinstance(exc, OSError):
            return FleetError(f"unreachable: {t.where}: {clean(exc.strerror or str(exc), 160)}")
        if isinstance(exc, paramiko.SSHException | EOFError):
            return FleetError(f"SSH to {t.where} failed: {clean(str(exc) or type(exc).__name__, 160)}")
        if isinstance(exc, Exception):
            return FleetError(f"SSH to {t.where} failed: {type(exc).__name__}: {clean(str(exc), 160)}")
        raise exc

    def run(self, command: str, what: str, cap: int = OUTPUT_CAP,
            until: float | None = None) -> tuple[int | None, bytes, bool]:
        """Run ``command`` (a POSIX shell line; every value in it quoted) with stdout and stderr
        together; returns ``(exit status, output, cut)``. At most ``cap`` bytes are read: past
        them the command's channel is closed, ``cut`` is true and the status None. ``until``
        (``time.monotonic()``): the command's own deadline, within the host's.

        Raises:
            CommandTimeout: ``until`` passed first (the channel is closed; the session stays usable).
            FleetError: the host's deadline passed (``what`` names the step) or the
                connection broke.
        """
        import paramiko

        self.step = what
        chan = None

        def left() -> float:
            host_left = self.remaining()
            if until is None:
                return host_left
            own = until - time.monotonic()
            if own <= 0:
                raise CommandTimeout(f"{what}: no end within its deadline (the command hangs or trickles output)")
            return min(host_left, own)

        try:
            chan = self._conn.client.get_transport().open_session(timeout=min(left(), CONNECT_STEP_S))
            chan.set_combine_stderr(True)
            chan.settimeout(left())
            chan.exec_command(command)
            buf = bytearray()
            cut = False
            while True:
                chan.settimeout(left())
                data = chan.recv(65536)
                if not data:
                    break
                room = cap - len(buf)
                buf += data[:room]
                if len(data) > room:
                    cut = True
                    chan.close()
                    return None, bytes(buf), True
            while not chan.exit_status_ready():
                chan.status_event.wait(min(left(), 0.5))
            return chan.recv_exit_status(), bytes(buf), cut
        except CommandTimeout:
            if chan is not None:
                chan.close()
            raise
        except TimeoutError:
            if until is not None and time.monotonic() >= until and not self._expired and not self.cancel.is_set():
                if chan is not None:
                    chan.close()
                raise CommandTimeout(f"{what}: no end within its deadline (the command hangs or trickles "
                                     "output)") from None
            raise self._timeout() from None
        except (paramiko.SSHException, EOFError, OSError, AttributeError) as exc:
            if self._expired or self.cancel.is_set():
                raise self._timeout() from None
            why = clean(str(exc) or type(exc).__name__, 160)
            raise FleetError(f"the connection broke while {what}: {why}") from None


def _reject_policy() -> Any:
    """paramiko's ``RejectPolicy`` raising its own exception type, so an unknown key is told
    apart from other SSH failures (paramiko raises a bare ``SSHException``)."""
    import paramiko

    class Reject(paramiko.RejectPolicy):
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            raise UnknownHostKey(hostname)

    return Reject()


# ---------------------------------------------------------------------------------------
# What is asked of a host.


@dataclass
class HostStatus:
    """One host's row of ``fleet status``.

    ``ok``: connected, the unit active and every health check passed. ``error``: why the host
    could not be asked (connection, deadline), else the first failing check. Numbers are None
    when not known (no verify pass yet, no exporter)."""

    host: str
    ok: bool = False
    release: str = "-"
    active_state: str = "-"
    sub_state: str = "-"
    invocation: str = ""
    ready: bool | None = None
    warm: bool | None = None
    accept_length: float | None = None
    tokens_per_s: float | None = None
    drift: str = "-"
    error: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("invocation")
        return d


def _q(value: str) -> str:
    return shlex.quote(value)


def status_command(t: Target, nonce: str) -> str:
    """The one shell line ``status`` runs on a host; each section starts with a line
    ``@@<nonce> <name>`` and ends with ``@@<nonce> rc <status>`` (the nonce is fresh per run,
    so nothing a host prints can fake a section)."""
    metrics_py = ("import sys,urllib.request as u;"
                  "sys.stdout.buffer.write(u.urlopen(sys.argv[1],timeout=3).read(1<<20))")
    from ..config.fields import loopback_url

    url = f"{loopback_url(t.exporter_port)}/metrics"
    parts = [
        ("show", f"systemctl show {_q(t.unit)} -p ActiveState -p SubState -p InvocationID --no-pager"),
        ("release", f"readlink {_q(t.releases_root + '/current')}"),
        ("health", f"{_q(t.ddtree_ops)} health --plan {_q(t.config_dir + '/plan.json')} "
                   f"--warm-marker {_q(t.warm_marker)} --json"),
        ("metrics", f"{_q(t.venv + '/bin/python')} -c {_q(metrics_py)} {_q(url)}"),
    ]
    return "; ".join(f"echo; echo '@@{nonce} {name}'; {cmd} </dev/null 2>&1; r=$?; "
                     f"echo; echo \"@@{nonce} rc $r\"" for name, cmd in parts)


def split_sections(data: bytes, nonce: str) -> dict[str, tuple[int | None, bytes]]:
    """``{section: (exit status, body)}`` of :func:`status_command`'s output."""
    out: dict[str, tuple[int | None, bytes]] = {}
    marker = f"@@{nonce} ".encode()
    name: str | None = None
    body = bytearray()
    for line in data.split(b"\n"):
        if line.startswith(marker):
            rest = line[len(marker):].decode("ascii", "replace").strip()
            if rest.startswith("rc "):
                if name is not None:
                    rc = rest[3:].strip()
                    out[name] = (int(rc) if rc.isdigit() else None, bytes(body).strip(b"\n"))
                name = None
            else:
                name, body = rest, bytearray()
        elif name is not None:
            body += line + b"\n"
    return out


def _metric(text: str, name: str) -> float | None:
    from ..sglang.client import SGLangError, select_samples

    try:
        samples = select_samples(text, [name]).get(name) or []
    except SGLangError:
        return None
    values = [v for _, v in samples if math.isfinite(v)]
    return values[0] if values else None


def parse_status(t: Target, data: bytes, nonce: str) -> HostStatus:
    """A :class:`HostStatus` from :func:`status_command`'s output (every string cleaned)."""
    s = HostStatus(t.host)
    sec = split_sections(data, nonce)
    rc, body = sec.get("show", (None, b""))
    props = dict(line.split("=", 1) for line in body.decode("utf-8", "replace").splitlines() if "=" in line)
    s.active_state = clean(props.get("ActiveState", "") or "-", 40)
    s.sub_state = clean(props.get("SubState", "") or "-", 40)
    s.invocation = clean(props.get("InvocationID", ""), 64)
    if rc != 0 or "ActiveState" not in props:
        s.error = f"systemctl show {t.unit} failed: {clean(body) or 'no output'}"
    rc, body = sec.get("release", (None, b""))
    if rc == 0 and body.strip():
        name = body.strip().decode("utf-8", "replace").rstrip("/").rsplit("/", 1)[-1]
        s.release = name if _RELEASE.fullmatch(name) else repr(clean(name, 64))
    rc, body = sec.get("health", (None, b""))
    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text[text.find("{"):] if "{" in text else "")
        checks = doc["checks"]
        if not isinstance(checks, list):
            raise TypeError
        s.checks = [{"name": clean(str(c.get("name")), 40), "ok": c.get("ok") is True,
                     "detail": clean(str(c.get("detail")))} for c in checks[:20] if isinstance(c, dict)]
    except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested past the stack
        s.checks = [{"name": "health", "ok": False,
                     "detail": f"no JSON from {t.ddtree_ops} health (exit {rc}): {clean(body) or 'no output'}"}]
    by = {c["name"]: c for c in s.checks}
    s.ready = by["ready"]["ok"] if "ready" in by else (False if "reachable" in by else None)
    s.warm = by["warm"]["ok"] if "warm" in by else None
    if "drift" in by:
        s.drift = "none" if by["drift"]["ok"] else f"drift: {by['drift']['detail']}"
    _, body = sec.get("metrics", (None, b""))
    text = body[:OUTPUT_CAP].decode("utf-8", "replace")
    s.accept_length = _metric(text, "ddtree_accept_length")
    s.tokens_per_s = _metric(text, "ddtree_generation_tokens_per_second")
    if s.accept_length is None and "accept_length" in by:
        m = re.match(r"([0-9]+(?:\.[0-9]+)?) tokens per verify pass", by["accept_length"]["detail"])
        s.accept_length = float(m.group(1)) if m else None
    failing = [c for c in s.checks if not c["ok"]]
    if not s.error and s.active_state != "active":
        s.error = f"unit {t.unit} is {s.active_state} ({s.sub_state})"
    if not s.error and failing:
        s.error = f"{failing[0]['name']}: {failing[0]['detail']}"
    s.ok = not s.error and bool(s.checks) and not failing
    return s


def probe(session: HostSession) -> HostStatus:
    """One status look at the session's host (one SSH command)."""
    nonce = secrets.token_hex(8)
    t = session.target
    rc, data, cut = session.run(status_command(t, nonce), "reading status (systemctl, release, health)")
    s = parse_status(t, data, nonce)
    if cut:
        s.ok = False
        s.error = s.error or f"the host printed more than {OUTPUT_CAP} bytes for status: cut, not trusted"
    return s


# ---------------------------------------------------------------------------------------
# Running over the fleet.


def run_pool(targets: Sequence[Target], work: Callable[[Target, float, threading.Event], Any],
             failed: Callable[[Target, str], Any], limits: Limits, parallel: int | None = None) -> list[Any]:
    """``work(target, deadline, cancel)`` for every target, ``parallel`` at a time, in the
    targets' order; a host's deadline is its start + ``limits.timeout_s``, never past the run's
    (start + ``limits.deadline_s``). A host whose work raises :class:`FleetError`, or that has
    not finished (or started) by the run's deadline, gets ``failed(target, why)``."""
    run_end = time.monotonic() + limits.deadline_s
    cancel = threading.Event()

    def one(t: Target) -> Any:
        if cancel.is_set():
            raise FleetError("not started: the run's deadline passed")
        try:
            return work(t, min(time.monotonic() + limits.timeout_s, run_end), cancel)
        except FleetError as exc:
            return failed(t, str(exc))

    pool = ThreadPoolExecutor(max_workers=max(1, min(parallel or limits.parallel, len(targets) or 1)),
                              thread_name_prefix="ddtree-fleet")
    futures = {pool.submit(one, t): i for i, t in enumerate(targets)}
    results: list[Any] = [None] * len(targets)
    pending = set(futures)
    try:
        while pending:
            left = run_end - time.monotonic()
            if left <= 0:
                break
            done, pending = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
            for f in done:
                exc = f.exception()
                if exc is None:
                    results[futures[f]] = f.result()
                elif isinstance(exc, FleetError):
                    results[futures[f]] = failed(targets[futures[f]], str(exc))
                else:  # one host's surprise never costs the others their results
                    results[futures[f]] = failed(targets[futures[f]], f"internal error on this host: "
                                                 f"{type(exc).__name__}: {clean(str(exc), 200)} (please report)")
    finally:
        cancel.set()  # sessions still open see it at their next wait; the watchdogs close them
        pool.shutdown(wait=False, cancel_futures=True)
    for f in pending:
        results[futures[f]] = failed(targets[futures[f]], f"not finished within the run's deadline "
                                                          f"({limits.deadline_s:g} s; raise --deadline)")
    return results


def status(targets: Sequence[Target], limits: Limits) -> list[HostStatus]:
    """``fleet status``: one :class:`HostStatus` per target, in order."""

    def work(t: Target, deadline: float, cancel: threading.Event) -> HostStatus:
        t0 = time.monotonic()
        with HostSession(t, limits.known_hosts, deadline, cancel) as s:
            st = probe(s)
        st.seconds = round(time.monotonic() - t0, 2)
        return st

    return run_pool(targets, work, lambda t, why: HostStatus(t.host, error=why), limits)


@dataclass
class HostLogs:
    """The last journal lines of one host's unit (cleaned), or why there are none."""

    host: str
    ok: bool
    lines: list[str]
    error: str = ""
    cut: bool = False


def logs(targets: Sequence[Target], limits: Limits, lines: int, max_bytes: int = LOGS_CAP_DEFAULT) -> list[HostLogs]:
    """``fleet logs``: the last ``lines`` journal lines of each target's unit
    (``journalctl -u UNIT -n N --no-pager``), at most ``max_bytes`` bytes read per host."""

    def work(t: Target, deadline: float, cancel: threading.Event) -> HostLogs:
        with HostSession(t, limits.known_hosts, deadline, cancel) as s:
            rc, data, cut = s.run(f"journalctl -u {_q(t.unit)} -n {int(lines)} --no-pager </dev/null 2>&1",
                                  "reading the journal", cap=max_bytes)
        shown = [clean(ln, LOG_LINE_CAP) for ln in data.decode("utf-8", "replace").splitlines()[-lines:]]
        if rc not in (0, None):
            return HostLogs(t.host, False, shown[-5:], f"journalctl exited {rc}")
        return HostLogs(t.host, True, shown, cut=cut)

    return run_pool(targets, work, lambda t, why: HostLogs(t.host, False, [], why), limits)


@dataclass
class HostChange:
    """One host's restart or rollback: what was done, the gate's verdict and the time taken."""

    host: str
    ok: bool
    step: str
    detail: str
    release_from: str = "-"
    release_to: str = "-"
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def unit_state(s: HostSession) -> tuple[str, str, str]:
    """``(ActiveState, SubState, InvocationID)`` of the session's unit (``systemctl show``), cleaned."""
    t = s.target
    rc, out, _ = s.run(f"systemctl show {_q(t.unit)} -p ActiveState -p SubState -p InvocationID --no-pager "
                       "</dev/null 2>&1", "reading the unit's state")
    props = dict(line.split("=", 1) for line in out.decode("utf-8", "replace").splitlines() if "=" in line)
    if rc != 0 or "ActiveState" not in props:
        raise FleetError(f"systemctl show {t.unit} failed (exit {rc}): {clean(out) or 'no output'}")
    return (clean(props["ActiveState"], 40) or "-", clean(props.get("SubState", ""), 40) or "-",
            clean(props.get("InvocationID", ""), 64))


def gate_command(t: Target, deadline_s: float) -> str:
    """The shell line of the host-side gate, the same command ``playbooks/rolling.yml`` runs:
    ``<venv>/bin/python -m ddtree_ops release gate --plan <config>/plan.json --deadline S --json``."""
    argv = [f"{t.venv}/bin/python", "-m", "ddtree_ops", "release", "gate", "--plan", f"{t.config_dir}/plan.json",
            "--deadline", f"{deadline_s:g}", "--json"]
    return " ".join(_q(a) for a in argv) + " </dev/null 2>&1"


def run_gate(s: HostSession, deadline_s: float, margin_s: float = GATE_MARGIN_S) -> Any:
    """Run the host's gate (:func:`gate_command`) and read its verdict
    (:func:`ddtree_ops.fleet.rollout.read_gate`): at most
    :data:`~ddtree_ops.fleet.rollout.GATE_OUTPUT_CAP` bytes, and no longer than ``deadline_s`` +
    ``margin_s`` (within the host's deadline). Malformed, huge, hanging or trickling
    output is a failed :class:`~ddtree_ops.fleet.rollout.GateVerdict`, never an exception, except
    :class:`FleetError` when the host's own deadline passes or the connection breaks."""
    from .rollout import GATE_OUTPUT_CAP, GateVerdict, read_gate

    try:
        rc, out, cut = s.run(gate_command(s.target, deadline_s), "running the gate (ddtree-ops release gate)",
                             cap=GATE_OUTPUT_CAP, until=time.monotonic() + deadline_s + margin_s)
    except CommandTimeout:
        return GateVerdict(False, None, None, f"`ddtree-ops release gate` did not end within {deadline_s:g} s "
                                              f"+ {margin_s:g} s (it hangs or trickles output)")
    return read_gate(out, rc, cut)


def _restart(s: HostSession, before: HostStatus) -> str | None:
    """``systemctl daemon-reload``, then ``systemctl restart --no-block UNIT``; why it failed, or None."""
    t = s.target
    # The live unit is a symlink through releases/current: systemd restarts the unit it loaded
    # last, not the file `current` names now. Without a reload first, a rollback (or a deploy
    # that switched `current` and was cut off before its handler) restarts the release being
    # left with the plan.json of the other one, and the unit's own readiness check fails it.
    rc, out, _ = s.run("systemctl daemon-reload </dev/null 2>&1", "reloading the units (systemctl daemon-reload)")
    if rc != 0:
        return (f"systemctl daemon-reload exited {rc}: {clean(out) or 'no output'}; the unit was NOT "
                "restarted (it runs what it ran before)")
    rc, out, _ = s.run(f"systemctl restart --no-block {_q(t.unit)} </dev/null 2>&1", "restarting the unit")
    if rc != 0:
        return f"systemctl restart {t.unit} exited {rc}: {clean(out) or 'no output'}"
    return None


def _await_and_gate(s: HostSession, before: HostStatus, gate_s: float, gate_deadline_s: float = GATE_DEADLINE_S,
                    gate_margin_s: float = GATE_MARGIN_S, gate: bool = True) -> tuple[bool, str, HostStatus]:
    """Poll the restarted unit (``systemctl show``, every :data:`POLL_S`) until it is active in a new
    invocation (its ``ExecStartPost`` warmup done) and then the host's health (warm marker, drift;
    :func:`probe`) passes; fails when the unit fails, or ``gate_s`` passes first. Then, with
    ``gate``, the playbook's gate on the host (:func:`run_gate`: health, a short synthetic load,
    acceptance length >= the deployment's floor) within ``gate_deadline_s``; its verdict decides.
    A node of rank >= 1 of a multi-node server has no gate of its own (``gate=False``): it serves
    no API, rank 0's gate covers the server."""
    t = s.target
    gate_end = time.monotonic() + gate_s
    last = before
    while True:
        active, sub, invocation = unit_state(s)
        fresh = invocation != before.invocation or not before.invocation
        why = f"unit {t.unit} is {active} ({sub})"
        if fresh and active == "failed":
            return False, f"gate: unit {t.unit} failed after the restart ({sub}); see fleet logs", last
        if fresh and active == "active":  # health only once the unit's own warmup let it become active
            last = probe(s)
            if last.ok and last.invocation == invocation:
                if not gate:
                    return True, "gate: active, ready (a node of rank >= 1: the server is gated on rank 0)", last
                v = run_gate(s, gate_deadline_s, gate_margin_s)
                if v.accept_length is not None:
                    last.accept_length = v.accept_length
                if v.ok:
                    return True, f"gate: active, ready, warm, no drift; release gate passed: {v.versus}", last
                return False, f"gate FAILED ({v.versus}): {v.detail}", last
            why = last.error or why
        if time.monotonic() >= gate_end:
            if not fresh:
                why = f"the unit did not restart (still invocation {before.invocation or '?'})"
            return False, f"gate: not healthy within {gate_s:g} s: {why}", last
        time.sleep(min(POLL_S, max(0.0, gate_end - time.monotonic())))


def _restart_and_gate(s: HostSession, before: HostStatus, gate_s: float, gate_deadline_s: float = GATE_DEADLINE_S,
                      gate_margin_s: float = GATE_MARGIN_S) -> tuple[bool, str, HostStatus]:
    """:func:`_restart` then :func:`_await_and_gate` on one host."""
    why = _restart(s, before)
    if why is not None:
        return False, why, before
    return _await_and_gate(s, before, gate_s, gate_deadline_s, gate_margin_s)


def units(targets: Sequence[Target]) -> list[list[Target]]:
    """``targets`` as the units :func:`rolling` restarts, in the order of each unit's first host: a
    one-machine host alone; every node of a multi-node server together, rank 0 first (its ranks
    need each other: one node restarted alone stops the whole server, docs/multi-node.md).

    Raises:
        FleetError: a node of a targeted server is not among ``targets`` (one line naming it)."""
    by_host = {t.host: t for t in targets}
    out: list[list[Target]] = []
    placed: set[str] = set()
    for t in targets:
        if t.host in placed:
            continue
        if not t.nodes:
            out.append([t])
            placed.add(t.host)
            continue
        missing = [n for n in t.nodes if n not in by_host]
        if missing:
            raise FleetError(f"node(s) {', '.join(missing)} of the multi-node server of {t.host} (nodes "
                             f"{', '.join(t.nodes)}) are not selected: its nodes restart together or not at all (one "
                             "node restarted alone stops the whole server). Fix: select all of its nodes (-l) or none")
        out.append([by_host[n] for n in t.nodes])
        placed.update(t.nodes)
    return out


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _current_release(s: HostSession) -> str:
    """The host's ``current`` release per ``ddtree-ops release list --json`` (bounded), or "unknown"."""
    from .rollout import release_current

    t = s.target
    try:
        rc, out, _ = s.run(f"{_q(t.ddtree_ops)} release list --root {_q(t.releases_root)} --json "
                           "</dev/null 2>/dev/null", "reading the current release", cap=64 << 10)
    except FleetError:
        return "unknown"
    return release_current({"rc": rc, "stdout": out.decode("utf-8", "replace")}) or "unknown"


def _rollback(s: HostSession) -> str:
    """Run the host's ``ddtree-ops release rollback``; return the release it switched to.

    Raises:
        FleetError: the command is missing on the host or failed (its output, cleaned)."""
    t = s.target
    cmd = f"{_q(t.ddtree_ops)} release rollback --root {_q(t.releases_root)} --json </dev/null 2>&1"
    rc, out, _ = s.run(cmd, "rolling back the release")
    text = clean(out, 400)
    if rc is None:  # output cut at the cap: the switch may have happened; say where `current` is now
        cur = _current_release(s)
        raise FleetError(f"rollback: `ddtree-ops release rollback` printed more than the output cap; `current` is now "
                         f"{cur}; the unit was NOT restarted (it runs what it ran before). Fix: check the host, then "
                         "`ddtree-ops fleet restart -l HOST` to run the current release")
    if rc != 0:
        missing = re.search(r"(?i)no such command[^\n]{0,80}|[^\n]{0,200}: not found", out.decode("utf-8", "replace"))
        if missing:
            raise FleetError(f"rollback failed: the host's ddtree-ops has no `release rollback` "
                             f"({clean(missing.group(0))}). Fix: deploy a ddtree-ops with releases to the host first")
        raise FleetError(f"rollback failed: `ddtree-ops release rollback` exited {rc}: {text or 'no output'}")
    try:
        doc = json.loads(out.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        doc = {}
    to = doc.get("current") or doc.get("to") or doc.get("release") if isinstance(doc, dict) else None
    return clean(str(to), 64) if to else "?"


def _change_unit(unit: list[Target], limits: Limits, run_end: float, rollback: bool, deadline: float,
                 cancel: threading.Event) -> list[HostChange]:
    """Restart (after ``release rollback`` for a rollback) one unit of :func:`units` and gate it. A
    multi-node server, as SGLang needs (docs/multi-node.md; rank 0 alone serves nothing and exits after
    ``--dist-timeout``, the others retry its store: ``tests/fixtures/gpu/multinode-sglang-0.5.17-h200-2026-12-02``):
    every node restarts without waiting, rank >= 1 first, then rank 0; then rank 0 must pass the whole gate and
    every other node be active and healthy. A node that fails fails every node of its server."""
    from contextlib import ExitStack

    t0 = time.monotonic()
    step = "rollback" if rollback else "restart"
    with ExitStack() as stack:
        sessions = [stack.enter_context(HostSession(t, limits.known_hosts, deadline, cancel)) for t in unit]
        befores = [probe(s) for s in sessions]
        tos = [_rollback(s) if rollback else b.release for s, b in zip(sessions, befores, strict=True)]
        results: list[tuple[bool, str, HostStatus]] = [(False, "", b) for b in befores]
        restarted = [False] * len(unit)
        for i in [*range(1, len(unit)), 0]:  # the other nodes first: they wait for rank 0's store
            why = _restart(sessions[i], befores[i])
            results[i] = (False, why or "", befores[i])
            restarted[i] = why is None
        for i, s in enumerate(sessions):  # rank 0 first: its start is the server's
            if restarted[i]:
                gate = limits.gate_s if limits.gate_s is not None else unit[i].gate_s
                results[i] = _await_and_gate(s, befores[i], min(gate, max(1.0, run_end - time.monotonic())),
                                             limits.gate_deadline_s, limits.gate_margin_s, gate=i == 0)
    bad = [(t.host, r[1]) for t, r in zip(unit, results, strict=True) if not r[0]]
    out = []
    for i, t in enumerate(unit):
        ok, detail, after = results[i]
        to = tos[i]
        # `after` is `before` itself when the unit failed before a fresh look: the release
        # it names is the one left, not the one switched to
        if after is not befores[i] and after.release != "-":
            to = after.release
        others = [f"{h}: {clean(why, 160)}" for h, why in bad if h != t.host]
        if others:
            ok = False
            detail = f"{detail}; the multi-node server failed on {'; '.join(others)}"
        out.append(HostChange(t.host, ok, step, detail, befores[i].release, to, round(time.monotonic() - t0, 1)))
    return out


def rolling(targets: Sequence[Target], limits: Limits, batch: int = 1, rollback: bool = False,
            on_host: Callable[[HostChange], None] | None = None) -> list[HostChange]:
    """``fleet restart`` / ``fleet rollback``: ``batch`` units (:func:`units`: a host, or every node of
    a multi-node server) at a time, in order; each restarts (after ``ddtree-ops release rollback``
    for a rollback) and must pass the gate (:func:`_change_unit`: active, healthy, warm, then the
    host's own ``ddtree-ops release gate`` with its acceptance-length floor, on rank 0 only for a
    multi-node server) within its bounds; after a batch with a failing host nothing more is
    started, and the rest are reported as not started.

    Raises:
        FleetError: a node of a selected multi-node server is not selected (:func:`units`), before
            any host is touched."""
    out: list[HostChange] = []
    run_end = time.monotonic() + limits.deadline_s
    all_units = units(targets)
    step = "rollback" if rollback else "restart"
    for i in range(0, len(all_units), batch):
        group = all_units[i:i + batch]
        of = {u[0].host: u for u in group}
        left = run_end - time.monotonic()
        if left <= 0:
            out += [HostChange(t.host, False, "skipped", "not started: the run's deadline passed")
                    for u in group for t in u]
            continue

        def work(t: Target, deadline: float, cancel: threading.Event, of=of) -> list[HostChange]:
            return _change_unit(of[t.host], limits, run_end, rollback, deadline, cancel)

        def failed(t: Target, why: str, of=of) -> list[HostChange]:
            return [HostChange(n.host, False, step, why) for n in of[t.host]]

        hosts = [t for u in group for t in u]
        sub = Limits(limits.known_hosts, limits.timeout_s + max((limits.gate_s or t.gate_s) for t in hosts)
                     + limits.gate_deadline_s + limits.gate_margin_s + 30, batch, left, limits.gate_s,
                     limits.gate_deadline_s, limits.gate_margin_s)
        results = [r for rs in run_pool([u[0] for u in group], work, failed, sub) for r in rs]
        for r in results:
            if on_host:
                on_host(r)
        out += results
        if not all(r.ok for r in results):
            rest = [t for u in all_units[i + batch:] for t in u]
            bad = ", ".join(r.host for r in results if not r.ok)
            out += [HostChange(t.host, False, "skipped", f"not started: stopped after {bad} failed")
                    for t in rest]
            break
    return out
