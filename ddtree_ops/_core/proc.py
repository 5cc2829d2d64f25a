"""The bounded subprocess runner (standard library only): a TOTAL deadline, bounded output,
the command's whole process group killed after every run."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

COMMAND_TIMEOUT_S = 20.0
"""Total seconds for one probing command (nvidia-smi on 8 GPUs answers in ~1-3 s)."""
MAX_OUTPUT = 4 << 20
"""Bytes of output kept from one command; beyond that it is killed and reported."""


@dataclass(frozen=True)
class CmdResult:
    """Outcome of :func:`run_bounded`.

    Attributes:
        rc: exit status; 127 not found / not executable, 124 killed at the deadline,
            125 killed for printing more than ``max_bytes``.
        stdout, stderr: decoded output (UTF-8, undecodable bytes replaced), at most ``max_bytes`` each.
        note: why it was killed or did not start (``""`` otherwise).
    """

    rc: int
    stdout: str
    stderr: str
    note: str = ""


DRAIN_S = 0.5
"""Seconds the output pipes are still read after the command itself exited (a background child
that kept them open is killed with the group after that)."""


def run_bounded(argv: list[str], timeout: float = COMMAND_TIMEOUT_S, max_bytes: int = MAX_OUTPUT,
                env: dict | None = None) -> CmdResult:
    """Run ``argv`` (no shell) with a TOTAL deadline of ``timeout`` seconds and at most
    ``max_bytes`` kept per stream; never raises for the command's sake.

    The command starts a new session (``start_new_session``), so it leads its own process
    group; after EVERY run (normal exit, deadline, flood) that whole group is SIGKILLed, while
    the leader is still unreaped (its id, the group's, cannot be reused meanwhile), so a child
    it left behind (``cmd &``, ``(cmd &)``, ``nohup cmd``) dies with it. A child that calls
    ``setsid()``/``setpgid()`` itself leaves the group and escapes this (best effort: no cgroup
    is set up for a probing command)."""
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True, env=env)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in an argument
        return CmdResult(127, "", "", f"{str(argv[0])[:200]}: {getattr(exc, 'strerror', None) or exc}")
    bufs = {p.stdout: bytearray(), p.stderr: bytearray()}
    note, rc_override = "", None
    end = time.monotonic() + timeout
    exited_at = None
    with selectors.DefaultSelector() as sel:
        for f in bufs:
            sel.register(f, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if now >= end:
                note, rc_override = f"killed after {timeout:g} s (deadline)", 124
                break
            if exited_at is None and _exited(p.pid):
                exited_at = now
            if exited_at is not None and now - exited_at > DRAIN_S:
                break  # a background child holds the pipes open: killed with the group below
            for key, _ in sel.select(min(end - now, 0.1)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = bufs[key.fileobj]
                buf += chunk
                if len(buf) > max_bytes:
                    note, rc_override = f"killed: printed more than {max_bytes} bytes", 125
                    break
            if rc_override is not None:
                break
    while rc_override is None and not _exited(p.pid):  # pipes closed; the command may still run
        if time.monotonic() >= end:
            note, rc_override = f"killed after {timeout:g} s (deadline)", 124
            break
        time.sleep(0.01)
    _kill_group(p)
    rc = p.returncode if p.returncode is not None else -9
    for f in bufs:
        f.close()
    out, err = (bytes(bufs[f][:max_bytes]).decode("utf-8", "replace") for f in (p.stdout, p.stderr))
    return CmdResult(rc_override if rc_override is not None else rc, out, err, note)


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it (``waitid`` with ``WNOWAIT``)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True


def _kill_group(p: subprocess.Popen) -> None:
    """SIGKILL ``p``'s process group (``p`` leads it: ``start_new_session``), then reap ``p``."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
