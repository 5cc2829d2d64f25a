"""The bounded subprocess runner (standard library only): a TOTAL deadline, bounded output,
the command's whole process group killed after every run.

:func:`run_capped` is the one loop; :func:`run_bounded` (the preflight's probing commands:
decoded text, a status for every outcome) and
:func:`ddtree_ops.sglang.resolve.run_child` (the resolver child: raw bytes, a stderr tail) word
its outcome for their callers."""

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


@dataclass(frozen=True)
class Capped:
    """Outcome of :func:`run_capped`.

    Attributes:
        rc: the exit status; None when the command could not be reaped in time after the kill.
        stdout: what it printed, up to the cap (and the last chunk read).
        stderr: what it printed on stderr (its tail, with ``stderr_tail``).
        killed: ``""``, or why the group was killed before it finished: ``deadline``,
            ``stdout`` / ``stderr`` (printed past the cap).
    """

    rc: int | None
    stdout: bytes
    stderr: bytes
    killed: str = ""


def run_capped(argv: list[str], deadline_s: float, stdout_max: int, stderr_max: int, *,
               env: dict | None = None, cwd: str | None = None, stderr_tail: int | None = None,
               drain_s: float = DRAIN_S, poll_s: float = 0.1, idle_s: float = 0.01,
               kill_on_exit: bool = False, reap_s: float = 5.0) -> Capped:
    """Run ``argv`` (no shell, stdin from ``/dev/null``) in a session of its own with a TOTAL
    deadline of ``deadline_s`` seconds, killing its process group once it printed more than
    ``stdout_max`` bytes on stdout or ``stderr_max`` bytes on stderr (in all).

    The command leads its own process group (``start_new_session``); after EVERY run (normal
    exit, deadline, flood) that whole group is SIGKILLed while the leader is still unreaped (its
    id, the group's, cannot be reused meanwhile), so a child it left behind (``cmd &``,
    ``nohup cmd``) dies with it; with ``kill_on_exit`` the group is killed as soon as the leader
    exits too. After the leader exited the pipes are read for ``drain_s`` more seconds (a
    descendant that left the group with ``setsid`` may hold them). ``stderr_tail`` keeps only
    the last that-many bytes of stderr.

    Raises:
        OSError, ValueError: ``argv[0]`` could not be started (missing, not executable, a NUL).
    """
    end = time.monotonic() + deadline_s
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True, env=env, cwd=cwd)
    out, err, err_total, killed, exited_at = bytearray(), bytearray(), 0, "", None
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(p.stdout, selectors.EVENT_READ)
            sel.register(p.stderr, selectors.EVENT_READ)
            while sel.get_map() and not killed:
                now = time.monotonic()
                if now >= end:
                    killed = "deadline"
                    break
                if exited_at is None and _exited(p.pid):
                    exited_at = now
                    if kill_on_exit:
                        _signal_group(p.pid)
                if exited_at is not None and now - exited_at > drain_s:
                    break  # a descendant outside the group holds the pipes: killed with the group below
                for key, _ in sel.select(min(end - now, poll_s)):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                    elif key.fileobj is p.stdout:
                        out += chunk
                        if len(out) > stdout_max:
                            killed = "stdout"
                            break
                    else:
                        err += chunk
                        err_total += len(chunk)
                        if stderr_tail is not None and len(err) > 2 * stderr_tail:
                            del err[:-stderr_tail]
                        if err_total > stderr_max:
                            killed = "stderr"
                            break
        while not killed and exited_at is None and not _exited(p.pid):  # pipes closed; it may still run
            if time.monotonic() >= end:
                killed = "deadline"
            else:
                time.sleep(idle_s)
    finally:
        _signal_group(p.pid)  # before reaping the leader, whose zombie still holds the group id
        try:
            rc: int | None = p.wait(timeout=reap_s)
        except subprocess.TimeoutExpired:  # SIGKILLed but stuck in the kernel: not waited for
            rc = None
        p.stdout.close()
        p.stderr.close()
    return Capped(rc, bytes(out), bytes(err), killed)


def run_bounded(argv: list[str], timeout: float = COMMAND_TIMEOUT_S, max_bytes: int = MAX_OUTPUT,
                env: dict | None = None) -> CmdResult:
    """Run ``argv`` (no shell) with a TOTAL deadline of ``timeout`` seconds and at most
    ``max_bytes`` kept per stream (:func:`run_capped`); never raises for the command's sake."""
    try:
        r = run_capped(argv, timeout, max_bytes, max_bytes, env=env)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in an argument
        return CmdResult(127, "", "", f"{str(argv[0])[:200]}: {getattr(exc, 'strerror', None) or exc}")
    out, err = (b[:max_bytes].decode("utf-8", "replace") for b in (r.stdout, r.stderr))
    if r.killed == "deadline":
        return CmdResult(124, out, err, f"killed after {timeout:g} s (deadline)")
    if r.killed:
        return CmdResult(125, out, err, f"killed: printed more than {max_bytes} bytes")
    return CmdResult(r.rc if r.rc is not None else -9, out, err)


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, without reaping it (``waitid`` with ``WNOWAIT``)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # already reaped
        return True


def _signal_group(pgid: int) -> None:
    """SIGKILL process group ``pgid`` (gone or not ours: nothing to do)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
