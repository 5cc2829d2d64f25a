"""``ddtree-ops diagnose``: recognise this stack's known failure signatures in a log.

Input is the text of a unit's journal (``journalctl -u UNIT -b --no-pager -o cat``, with the same
boot's kernel journal ``journalctl -k -b`` beside it: the NVIDIA driver's Xid lines), a log
file or stdin, bounded (:data:`DEFAULT_MAX_BYTES`, :data:`DEFAULT_LINES`, each line cut
to :data:`MAX_LINE`); invalid UTF-8 is replaced, ANSI escapes and control characters are
removed. :data:`SIGNATURES` is the one table of what is recognised: each row has a stable
``name``, the regexes that find it, the cause and the fix (templates filled from the
matched line and, when given, the deployed ``plan.json``), and the upstream source of the
signature. A finding prints as one line; quoted log text passes through
:func:`ddtree_ops.config.errors.scrub` and is cut to :data:`QUOTE_CHARS` characters.

Every regex runs on lines of at most :data:`MAX_LINE` characters, after a plain substring
pre-filter (:attr:`Signature.needles`), and has no nested or adjacent unbounded
quantifiers, so a hostile 1 MB line costs a bounded, linear amount of work
(``tests/test_diagnose.py`` times one).

Over 600 lines: most of it is the signature catalogue (each signature with its pattern, phase,
fix and source, the Xid table among them), which is data read as one table; the bounded readers
and the matcher are the rest. Kept in one module so a signature and the code that reads it are
reviewed together.
"""

from __future__ import annotations

import math
import os
import re
import selectors
import signal
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .._core.bounded import read_at_most
from .._core.scrub import strip_controls as _clean

DEFAULT_MAX_MIB = 16
"""MiB of input read by default (the last ones: a journal's latest entries are at its end)."""
DEFAULT_MAX_BYTES = DEFAULT_MAX_MIB << 20
DEFAULT_LINES = 50_000
"""Lines examined by default (the last ones), and the entries asked of ``journalctl -n``."""
MAX_LINE = 4096
"""Characters of one line the regexes see (SGLang's and torch's failure lines are far shorter)."""
QUOTE_CHARS = 200
"""Characters of a matched log line quoted in a finding."""
STDIN_CAP = 1 << 30
"""Bytes read from stdin at most (an endless pipe stops there; the last DEFAULT_MAX_BYTES count)."""
JOURNAL_TIMEOUT_S = 30.0
"""Total seconds ``journalctl`` may run."""
CONTEXT_LINES = 80
"""Lines before a match searched for its context (traceback frames precede the error line)."""
AFTER_LINES = 5
"""Lines after a match searched too (a summary that names the frame below the error, a hint)."""

UNIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9:_.@\\-]{0,254}")
"""A systemd unit name (systemd.unit(5): ASCII letters, digits, ``:-_.\\``, ``@`` for templates;
256 characters at most); it may not start with ``-`` (it would read as an option)."""

class DiagnoseError(Exception):
    """Input that cannot be read (exit 2): a bad unit name, a missing file, journalctl failing."""


# ---------------------------------------------------------------------------------------
# The deployed plan (optional): widths and memory settings the fixes quote.


@dataclass(frozen=True)
class PlanFacts:
    """What the fixes quote from ``plan.json`` (all optional; None when absent or malformed).

    Attributes:
        algorithm: speculative algorithm (``DDTREE``, ``DFLASH``, ``EAGLE``, ``none``).
        block_size, budget: DFlash block size / DDTree budget (tokens).
        draft_width, verify_width: tokens per request of draft / verify graphs.
        cuda_graph_max_bs: largest captured batch size (requests).
        max_running_requests: the effective running-request limit (requests).
        mem_fraction_static: the deployment's ``ddtree_server.mem_fraction_static``.
        memory: the plan's memory estimate as one short text (when the plan has one).
        unit: the SGLang unit name; port: its port; ptxas_env: the Triton ptxas override.
        target: the PTX target (``sm_103a``); cuda: the toolkit version.
    """

    algorithm: str | None = None
    block_size: int | None = None
    budget: int | None = None
    draft_width: int | None = None
    verify_width: int | None = None
    cuda_graph_max_bs: int | None = None
    max_running_requests: int | None = None
    mem_fraction_static: float | None = None
    memory: str | None = None
    unit: str | None = None
    port: int | None = None
    ptxas_env: dict[str, str] = field(default_factory=dict)
    target: str | None = None
    cuda: str | None = None
    given: bool = False
    """True when these facts come from a plan.json (fixes then quote its values, defaults included)."""


def _int(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < 1 << 31 else None


def _text(v: Any, limit: int = 120) -> str | None:
    if not isinstance(v, str) or not v:
        return None
    return _clean(v)[:limit]


def _memory_text(plan: dict) -> str | None:
    """The plan's per-GPU memory estimate as one short text, if the plan has one.

    ``plan.checkpoint.memory`` (the checkpoint reader's estimate: ``gib`` figures per GPU,
    ``kv_for``, ``error_bound``) is quoted as ``weights_per_gpu 74.2 GiB, kv_needed 31.5 GiB
    (48 requests x 8192 tokens), ... (error bound)``; otherwise any plan key naming ``memory``
    (a string as it is, a mapping as ``key=value`` of its first 8 scalar entries)."""
    ck = plan.get("checkpoint")
    est = ck.get("memory") if isinstance(ck, dict) else None
    if isinstance(est, dict) and isinstance(est.get("gib"), dict):
        gib = est["gib"]
        parts = []
        for k in ("weights_per_gpu", "kv_needed", "graph_bound", "budget", "gpu_memory"):
            v = _figure(gib.get(k))
            if v is not None:
                kv_for = est.get("kv_for") if k == "kv_needed" and isinstance(est.get("kv_for"), str) else None
                parts.append(f"{k} {v:g} GiB" + (f" ({_clean(kv_for)[:80]})" if kv_for else ""))
        bound = est.get("error_bound")
        if parts:
            return (", ".join(parts) + (f" ({_clean(bound)[:120]})" if isinstance(bound, str) and bound else ""))[:400]
    for key, v in plan.items():
        if "memory" not in str(key).lower() or v in (None, "", {}, []):
            continue
        if isinstance(v, str):
            return _clean(v)[:300]
        if isinstance(v, dict):
            parts = [f"{_clean(str(k))[:40]}={v[k]}" for k in list(v)[:40]
                     if _figure(v[k]) is not None or isinstance(v[k], str)][:8]
            if parts:
                return _clean(", ".join(parts))[:300]
        if _figure(v) is not None:
            return f"{_clean(str(key))[:40]}={v}"
    return None


def _figure(v: Any) -> float | None:
    """A plan's number as a float when it is one a memory figure can be (finite, below 10^12 in
    magnitude), else None: a malformed optional field is ignored, never an OverflowError
    (``float(10**400)``) or ``nan GiB``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, int):
        return float(v) if -10**12 < v < 10**12 else None
    return v if math.isfinite(v) and abs(v) < 1e12 else None


def plan_facts(doc: Any) -> PlanFacts:
    """Facts of a ``plan.json`` document (as ``ddtree-ops render`` writes it).

    Raises:
        DiagnoseError: ``doc`` is not an object with a ``plan`` object.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("plan"), dict):
        raise DiagnoseError("--plan: not a plan.json rendered by ddtree-ops (no plan object). Fix: use the "
                            "host's /etc/ddtree-ops/<name>/plan.json")
    p = doc["plan"]
    dep = doc.get("deployment") if isinstance(doc.get("deployment"), dict) else {}
    srv = dep.get("server") if isinstance(dep.get("server"), dict) else {}
    tc = p.get("toolchain") if isinstance(p.get("toolchain"), dict) else {}
    mfs = srv.get("mem_fraction_static")
    env = tc.get("ptxas_env") if isinstance(tc.get("ptxas_env"), dict) else {}
    capture = p.get("capture_bs")
    max_bs = _int(p.get("cuda_graph_max_bs"))
    if max_bs is None and isinstance(capture, list) and capture and all(_int(x) is not None for x in capture):
        max_bs = max(capture)
    unit = doc.get("unit")
    return PlanFacts(
        algorithm=_text(p.get("algorithm"), 20),
        block_size=_int(p.get("block_size")),
        budget=_int(p.get("budget")),
        draft_width=_int(p.get("draft_tokens_per_req")),
        verify_width=_int(p.get("verify_tokens_per_req")),
        cuda_graph_max_bs=max_bs,
        max_running_requests=_int(p.get("max_running_requests")),
        mem_fraction_static=float(mfs)
        if isinstance(mfs, (int, float)) and not isinstance(mfs, bool) and 0 < mfs <= 1
        else None,
        memory=_memory_text(p),
        unit=unit if isinstance(unit, str) and UNIT_NAME.fullmatch(unit) else None,
        port=_int(srv.get("port")),
        ptxas_env={
            str(k): _clean(str(v))[:200]
            for k, v in list(env.items())[:2]
            if k in ("TRITON_PTXAS_PATH", "TRITON_PTXAS_BLACKWELL_PATH") and isinstance(v, str)
        },
        target=_text(tc.get("target"), 20),
        cuda=_text(tc.get("cuda"), 20),
        given=True,
    )


def load_plan(path: str | Path) -> PlanFacts:
    """:func:`plan_facts` of a plan.json file (a regular file of at most 4 MiB). It is opened
    non-blocking and checked before it is read, so a FIFO or a device never blocks.

    Raises:
        DiagnoseError: unreadable, not a regular file, too large, not JSON (nested too deeply
            included), not a plan.
    """
    from .._core.plandoc import PlanFileError, load_plan_doc

    try:
        doc = load_plan_doc(path)
    except PlanFileError as exc:
        raise DiagnoseError(str(exc)) from None
    return plan_facts(doc)


def _read_regular(path: str | Path, option: str, max_bytes: int, tail: bool = False) -> bytes:
    """The first (or, with ``tail``, the last) ``max_bytes`` bytes of a regular file, opened
    ``O_NONBLOCK`` (a FIFO opens at once) and checked with ``fstat`` before anything is read.

    Raises:
        DiagnoseError: naming ``option`` and the path: missing, unreadable, a directory, a FIFO,
            a device (they could block or never end)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise DiagnoseError(f"{option} {_shown_path(path)}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            isdir = stat.S_ISDIR(st.st_mode)
            what = "a directory, not a file" if isdir else "not a regular file"
            fileish = option in ("--file", "FILE")
            hint = "; pipe it in instead (ddtree-ops diagnose - < …)" if fileish and not isdir else ""
            raise DiagnoseError(f"{option} {_shown_path(path)}: {what}{hint}")
        start = max(0, st.st_size - max_bytes) if tail else 0
        os.lseek(fd, start, os.SEEK_SET)
        data = read_at_most(fd, max_bytes)
    except OSError as exc:
        raise DiagnoseError(f"{option} {_shown_path(path)}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return _drop_partial_first(data, start > 0) if tail else data


# ---------------------------------------------------------------------------------------
# Lines: bounded, decoded, cleaned.


def _shown_path(path: str | Path) -> str:
    from ..config.errors import scrub, shorten

    return shorten(repr(scrub(_clean(str(path)))))


def split_lines(data: bytes, max_lines: int = DEFAULT_LINES) -> list[str]:
    """The last ``max_lines`` lines of ``data`` (split at ``\\n``, so a finding's line number is
    the input's; a trailing ``\\r`` is dropped, an inner one, as progress bars write, becomes a
    space), decoded (invalid UTF-8 replaced), cleaned (:func:`_clean`) and each cut to
    :data:`MAX_LINE` characters."""
    end = len(data) - 1 if data.endswith(b"\n") else len(data)
    start = end
    for _ in range(max_lines):  # only the last max_lines lines are split (16 MiB of newlines stays cheap)
        start = data.rfind(b"\n", 0, start)
        if start < 0:
            break
    raw = data[start + 1:end].split(b"\n") if data else []
    return [_line(b) for b in raw]


_NULS = re.compile(rb"\x00+")


def _line(b: bytes) -> str:
    """One raw line decoded, cleaned and cut to :data:`MAX_LINE`. A run of NULs (a hole a truncated log
    file leaves) counts as one space, so a line written after the hole is not cut away behind it. A
    line redrawn with ``\\r`` (a progress bar) keeps its end, the state last shown, when it is too long."""
    if b"\x00" in b:
        b = _NULS.sub(b" ", b)
    b = b.rstrip(b"\r")
    if b"\r" in b:
        return _clean(b[-MAX_LINE * 4:].decode("utf-8", "replace"))[-MAX_LINE:]
    return _clean(b[: MAX_LINE * 4].decode("utf-8", "replace"))[:MAX_LINE]


def _read_tail(stream: IO[bytes], max_bytes: int, cap: int | None = None) -> tuple[bytes, bool]:
    """The last ``max_bytes`` bytes of ``stream`` read to EOF (or ``cap`` bytes), and whether
    anything was dropped. Memory stays within ~2 x ``max_bytes``."""
    buf = bytearray()
    total = 0
    dropped = False
    while True:
        chunk = stream.read(1 << 20)
        if not chunk:
            break
        total += len(chunk)
        buf += chunk
        if len(buf) > 2 * max_bytes:
            del buf[: len(buf) - max_bytes]
            dropped = True
        if cap is not None and total >= cap:
            dropped = True
            break
    if len(buf) > max_bytes:
        del buf[: len(buf) - max_bytes]
        dropped = True
    return bytes(buf), dropped


def _drop_partial_first(data: bytes, dropped: bool) -> bytes:
    """``data`` without its first line when the read began inside one. A run of NUL bytes ends that
    partial line too: a file truncated under a writer that keeps its offset (logrotate's copytruncate)
    has a hole of NULs, and the writer's next line starts right after it."""
    if not dropped:
        return data
    nl = data.find(b"\n")
    nul = data.rfind(b"\x00", 0, nl if nl >= 0 else len(data))
    if nul >= 0:
        return data[nul + 1:]
    return data[nl + 1:] if nl >= 0 else data


def read_file(path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES, option: str = "--file") -> bytes:
    """The last ``max_bytes`` bytes of a regular file (a partial first line dropped).

    Raises:
        DiagnoseError: missing, unreadable, a directory, or not a regular file (a FIFO, a
            device: they could block or never end); the message names ``option`` and the path.
    """
    return _read_regular(path, option, max_bytes, tail=True)


def read_stream(stream: IO[bytes], max_bytes: int = DEFAULT_MAX_BYTES, cap: int = STDIN_CAP) -> bytes:
    """The last ``max_bytes`` bytes of a stream (stdin), reading at most ``cap`` bytes."""
    data, dropped = _read_tail(stream, max_bytes, cap)
    return _drop_partial_first(data, dropped)


def read_kernel_journal(lines: int = DEFAULT_LINES, max_bytes: int = DEFAULT_MAX_BYTES,
                        timeout_s: float = JOURNAL_TIMEOUT_S, journalctl: str = "journalctl") -> bytes:
    """``journalctl -k -b --no-pager -o cat -n LINES``: this boot's kernel messages (the NVIDIA driver's
    ``NVRM: Xid`` lines, module load failures), bounded like :func:`read_journal`.

    Raises:
        DiagnoseError: journalctl is missing, fails, or runs past the deadline.
    """
    return _journal([journalctl, "-k", "-b", "--no-pager", "-o", "cat", "-n", str(int(lines))], "journalctl -k",
                    max_bytes, timeout_s)


def read_kernel_lines(lines: int = DEFAULT_LINES, max_bytes: int = DEFAULT_MAX_BYTES,
                      timeout_s: float = JOURNAL_TIMEOUT_S,
                      journalctl: str = "journalctl") -> tuple[list[str] | None, str]:
    """:func:`read_kernel_journal` split into lines, and ``""``; or None and a note saying why it could not
    be read (no permission to the kernel journal is no usage error: the unit's journal still counts)."""
    try:
        return split_lines(read_kernel_journal(lines, max_bytes, timeout_s, journalctl), lines), ""
    except DiagnoseError as exc:
        return None, f"; kernel journal not read ({exc})"


def kernel_source(kernel: list[str] | None) -> str:
    """What the report's ``source`` adds for the kernel journal (``""`` when it was not read)."""
    if kernel is None:
        return ""
    return f" + journalctl -k -b ({len(kernel)} line{'' if len(kernel) == 1 else 's'})"


def read_journal(unit: str, lines: int = DEFAULT_LINES, max_bytes: int = DEFAULT_MAX_BYTES,
                 timeout_s: float = JOURNAL_TIMEOUT_S, journalctl: str = "journalctl") -> bytes:
    """``journalctl -u UNIT -b --no-pager -o cat -n LINES`` (this boot's entries of the unit,
    messages only), its last ``max_bytes`` bytes, killed after ``timeout_s`` seconds in all.

    Raises:
        DiagnoseError: the unit name is not a systemd unit name (:data:`UNIT_NAME`),
            journalctl is missing, fails, or runs past the deadline.
    """
    from ..config.errors import scrub, shorten

    if not UNIT_NAME.fullmatch(unit):
        raise DiagnoseError(f"--unit {shorten(repr(scrub(unit)))}: not a systemd unit name (letters, digits, "
                            "':_.@\\-', not starting with '-', <= 256 characters), e.g. ddtree-sglang.service")
    argv = [journalctl, "-u", unit, "-b", "--no-pager", "-o", "cat", "-n", str(int(lines))]
    return _journal(argv, f"journalctl -u {unit}", max_bytes, timeout_s)


def _journal(argv: list[str], what: str, max_bytes: int, timeout_s: float) -> bytes:
    """The last ``max_bytes`` of ``argv``'s output, killed (with its group) after ``timeout_s`` in all."""
    from ..config.errors import scrub, shorten

    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
    except OSError as exc:
        raise DiagnoseError(f"cannot run journalctl: {exc.strerror or exc}. Fix: run on the host that runs the "
                            "unit, or save the journal and pass --file") from None
    try:
        data, dropped, err, timed_out = _read_bounded(proc, max_bytes, timeout_s)
    finally:
        _kill_group(proc)
    if timed_out:
        raise DiagnoseError(f"{what} ran past {timeout_s:g} s and was stopped. Fix: save the journal "
                            f"({' '.join(argv[1:-2])} > FILE) and pass FILE")
    if proc.returncode != 0:
        msg = _clean(err.decode("utf-8", "replace")).strip()
        raise DiagnoseError(f"{what} failed (exit {proc.returncode}): {shorten(scrub(msg)) or 'no message'}")
    return _drop_partial_first(data, dropped)


def _read_bounded(proc: subprocess.Popen[bytes], max_bytes: int, timeout_s: float) -> tuple[bytes, bool, bytes, bool]:
    """Read ``proc``'s stdout (its last ``max_bytes`` bytes) and stderr (its first 64 KiB; the rest is
    read and dropped so the process never blocks on it) until both reach EOF and ``proc`` exits, or
    ``timeout_s`` seconds pass in all: ``(stdout tail, dropped, stderr head, timed_out)``. Reading
    stops at the deadline even when a child that escaped the process group still holds a pipe."""
    deadline = time.monotonic() + timeout_s
    buf = bytearray()
    err = bytearray()
    dropped = False
    with selectors.DefaultSelector() as sel:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                os.set_blocking(stream.fileno(), False)
                sel.register(stream, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(buf[-max_bytes:]), True, bytes(err), True
            for key, _ in sel.select(left):
                try:
                    chunk = os.read(key.fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.fileobj is proc.stdout:
                    buf += chunk
                    if len(buf) > 2 * max_bytes:
                        del buf[: len(buf) - max_bytes]
                        dropped = True
                elif len(err) < 64 << 10:
                    err += chunk[: (64 << 10) - len(err)]
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return bytes(buf[-max_bytes:]), True, bytes(err), True
    if len(buf) > max_bytes:
        del buf[: len(buf) - max_bytes]
        dropped = True
    return bytes(buf), dropped, bytes(err), False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s whole process group (it was started in its own session, so the group is
    its and its children's: a background child never outlives the deadline), then reap ``proc``
    and close its pipes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:  # (SIGKILL is not refused; a process in D state may linger)
        pass
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


# ---------------------------------------------------------------------------------------
# Signatures.


class _Lines:
    """The examined lines with each one's context flags (:data:`_FLAG_PATTERNS`), computed at most
    once a line and only for lines near a match: a log of 200k matching lines costs each line's
    flag regexes once, not once per neighbouring match."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self._flags: list[int] = [-1] * len(lines)

    def flags(self, j: int) -> int:
        f = self._flags[j]
        if f < 0:
            line = evidence(self.lines[j][:MAX_LINE])
            f = sum(bit for bit, pat in _FLAG_PATTERNS if pat.search(line)) if line else 0
            self._flags[j] = f
        return f


@dataclass
class Scan:
    """What a signature sees at a matching line: the flags of the lines around it and the phase."""

    src: _Lines
    index: int
    """0-based index of the matching line."""
    capturing: bool
    """A ``Capture ... cuda graph begin`` was seen and no ``... end`` (nor a restart) after it."""
    verify_capture_width: int | None = None
    """``num_tokens_per_req`` of the last ``Capture target verify CUDA graph begin`` line (SGLang 0.5.23)."""
    capture_phase: str | None = None
    """The graph the last ``Capture ... graph begin`` line names (``target verify``, ``draft decode``;
    ``decode`` for the unnamed ``Capture cuda graph begin`` of older builds)."""
    capture_size: str | None = None
    """The size being captured when the log stopped progressing (``batch size 4``, ``8192 tokens``)."""

    def before(self, flag: int, n: int = CONTEXT_LINES) -> bool:
        """Whether one of the ``n`` lines before the match has ``flag``."""
        return any(self.src.flags(j) & flag for j in range(max(0, self.index - n), self.index))

    def after(self, flag: int, n: int = AFTER_LINES) -> bool:
        """Whether one of the ``n`` lines after the match has ``flag``."""
        return any(
            self.src.flags(j) & flag for j in range(self.index + 1, min(len(self.src.lines), self.index + 1 + n))
        )


@dataclass(frozen=True)
class Signature:
    """One known failure.

    Attributes:
        name: stable identifier (``--json`` ``findings[].name``).
        needles: lower-case substrings; a line holding none of them is not tried (speed).
        patterns: regexes tried on a line (bounded: :data:`MAX_LINE`); the first match counts.
        cause, fix: one-sentence templates, ``str.format`` with :meth:`values`.
        source: upstream source of the signature (issue, source file).
        values: ``(match, scan, plan) -> dict`` of template values, or None when the line is
            not this failure after all (context decides; e.g. capture vs replay).
    """

    name: str
    needles: tuple[str, ...]
    patterns: tuple[re.Pattern[str], ...]
    cause: str
    fix: str
    source: str
    values: Callable[[re.Match[str], Scan, PlanFacts], dict[str, Any] | None] = lambda m, s, p: {}


_CAPTURE_FRAME = re.compile(r"(?i)capture cuda graph failed|in capture(?:_one_batch_size)?\b|init_cuda_graph|"
                            r"capture_one_batch_size|cuda_graph_runner\.py\", line \d{1,6}, in __init__|"
                            r"init_device_graphs|in capture_graph")
_REPLAY_FRAME = re.compile(r"(?i)in replay\b|in replay_prepare\b|\.replay\(|in forward_batch_generation\b|"
                           r"in run_batch\b|in event_loop|in verify\b|TARGET_VERIFY|Decode batch")
_SPEC_WORDS = re.compile(r"(?i)eagle|dflash|ddtree|speculative|spec_info|draft|verify")
_GRAPH_WORDS = re.compile(r"(?i)cuda_graph|cuda graph|graph_runner|replay|capture")
GRAPH, SPEC, CAPTURE, REPLAY, SAMPLER = 1, 2, 4, 8, 16
"""Context flags of a line: graph words, speculative-decoding words, capture frames, replay frames,
the DFlash sampler frame."""
_SAMPLER_FRAME = re.compile(r"stage_sampling_params")
_FLAG_PATTERNS = ((GRAPH, _GRAPH_WORDS), (SPEC, _SPEC_WORDS), (CAPTURE, _CAPTURE_FRAME), (REPLAY, _REPLAY_FRAME),
                  (SAMPLER, _SAMPLER_FRAME))
_PHASE_MARK = re.compile(r"(?i)\bcapture ((?:[\w-]{1,24} ){0,4})(?:cuda|npu|xpu|cpu) graph (begin|end)")
"""SGLang's capture start/end lines: ``Capture cuda graph begin`` (<= 0.5.13), ``Capture draft cuda graph
begin``, ``Capture draft extend cuda graph begin (step 0)``, ``Capture target verify CUDA graph begin.
backend=..., num_tokens_per_req=33`` (0.5.23 ``model_runner_components/cuda_graph_setup.py``)."""
_VERIFY_CAPTURE = re.compile(r"(?i)capture target verify cuda graph begin\.[^\n]{0,200}?num_tokens_per_req=(\d{1,6})")
"""0.5.23 logs the width its target-verify graphs are captured at: the width the mismatch compares."""
_CAPTURE_SIZE = re.compile(r"Capturing (batches \(bs=|num tokens \(num_tokens=)(\d{1,9})")
"""SGLang's capture progress (tqdm) lines, one per size as it starts capturing it: ``Capturing batches
(bs=4 avail_mem=120.86 GB)`` (decode and verify graphs: batch size) and ``Capturing num tokens
(num_tokens=8192 avail_mem=...)`` (prefill graphs: tokens); 0.5.17 ``model_executor/runner/
decode_cuda_graph_runner.py`` and ``prefill_cuda_graph_runner.py``. The last one before a failure is
the size whose capture failed."""


_ABS_PATH = re.compile(r"(?<![\w.])/(?:[\w.@+~-]{1,255}/){1,64}[\w.@+~-]{0,255}")
"""An absolute path (``/opt/ddtree-ops/venv/lib/python3.12/site-packages/sglang/srt/...``)."""
_UPSTREAM_ROOTS = (("/site-packages/", False), ("/dist-packages/", False), ("/sglang/", True))
"""Where the part of a path that names upstream code starts: after an install's package directory,
or at an ``sglang/`` source tree (``/sgl-workspace/sglang/python/sglang/srt/...``); True keeps the marker."""
_OWN_NAMES = re.compile(r"(?i)\bddtree[-_]ops\b|\bddtree-[\w@.:-]{1,255}")
"""This product's names: the ``ddtree-ops`` command and ``ddtree_ops`` package, its units and files
(``ddtree-sglang.service``, ``ddtree-nvidia-devices.service``, ``/etc/ddtree-ops/...``). SGLang names its
own DDTree code without a hyphen (``DDTREE``, ``speculative/ddtree_worker.py``), which stays evidence."""
_SPEC_ARG = re.compile(r"\bspeculative_algorithm=(?:'|\\?\")?(?P<alg>[A-Za-z]\w{0,30})")


_FRAME_FILE = re.compile(r'File "(?P<path>/[^"]{1,2048})", line \d{1,7}, in ')
"""A Python traceback frame (``File "/…/x.py", line 12, in fn``)."""


def _upstream(path: str) -> str | None:
    """The part of an absolute path that names upstream code, or None (:data:`_UPSTREAM_ROOTS`)."""
    start = -1
    for marker, keep in _UPSTREAM_ROOTS:
        i = path.rfind(marker)
        if i >= 0:
            start = max(start, i + 1 if keep else i + len(marker))
    return path[start:] if start >= 0 else None


def _upstream_part(m: re.Match[str]) -> str:
    part = _upstream(m.group(0))
    return " " + part if part is not None else " "


def evidence(line: str) -> str:
    """The part of ``line`` a signature may take as context: never this product's own install paths
    or names. An absolute path keeps only what names upstream code (``sglang/srt/speculative/...``
    after ``site-packages/``; an install prefix such as ``/opt/ddtree-ops/venv``, a model directory
    or ``/tmp`` counts for nothing), then :data:`_OWN_NAMES` are dropped. SGLang's ``server_args=``
    dump names every option (``speculative_algorithm=None``, ``cuda_graph_max_bs``, ``draft`` paths):
    it is evidence of speculative decoding only when ``speculative_algorithm`` is set, of nothing else."""
    if "server_args=" in line or "ServerArgs(" in line:
        m = _SPEC_ARG.search(line)
        return f"speculative {m['alg']}" if m and m["alg"] != "None" else ""
    frame = _FRAME_FILE.search(line) if "File \"" in line else None
    if frame:  # a frame of our own code (or of no package at all) says nothing by its function's name either
        part = _upstream(frame["path"])
        if part is None or _OWN_NAMES.match(part):
            return ""
    if "/" in line:
        line = _ABS_PATH.sub(_upstream_part, line)
    if "ddtree" in line.lower():
        line = _OWN_NAMES.sub(" ", line)
    return line


def _spec_off(p: PlanFacts) -> bool:
    """The deployed plan says the server runs without speculative decoding (``algorithm: none``): no
    draft/verify widths exist, so no log line may be blamed on them."""
    return p.given and (p.algorithm or "").lower() == "none"


def _plan_widths(p: PlanFacts) -> str:
    if p.draft_width is None or p.verify_width is None:
        return ""
    how = (f"block_size {p.block_size}, budget {p.budget} + 1" if p.algorithm == "DDTREE" and p.budget is not None
           else f"block_size {p.block_size}" if p.block_size is not None else (p.algorithm or "?"))
    return f"; this plan: draft {p.draft_width}, verify {p.verify_width} tokens/req ({how})"


def _graph_mismatch(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any] | None:
    if _spec_off(p):
        return None
    a, b = int(m["a"]), int(m["b"])
    dw, vw = p.draft_width, p.verify_width
    # the captured width against the needed one: a multiple of one plan width against a multiple of the other
    plan_fit = bool(dw and vw and dw != vw and ((a % dw == 0 and b % vw == 0) or (a % vw == 0 and b % dw == 0)))
    if _batch_overflow(m, s, p) is not None:
        return None  # a batch past the captured batch size, not a width: graph-batch-overflow
    context = s.before(GRAPH, 40) and (s.before(SPEC, 40) or p.algorithm not in (None, "none"))
    # widths of a draft block / tree are small: vocabulary (32000 vs 151936) or hidden-size mismatches are not this
    if min(a, b) > 4096:
        return None
    if context or plan_fit:
        where = "during capture" if s.capturing or s.before(CAPTURE, 40) else "at replay (first verify)"
    elif not p.given and _block_vs_budget(a, b):
        where = ("likely (the phase is unconfirmed: no CUDA-graph or speculative-decoding lines near it; pass "
                 "--plan and more of the log to confirm)")
    else:
        return None
    logged = (f"; the log's verify graphs were captured at num_tokens_per_req={s.verify_capture_width}"
              if s.verify_capture_width is not None else "")
    return {"a": a, "b": b, "dim": m["dim"] or "?", "where": where, "plan": _plan_widths(p), "logged": logged}


def _block_vs_budget(a: int, b: int) -> bool:
    """The two widths read as a DFlash block size (a power of two, 2..64) against a DDTree verify
    width budget + 1 whose budget is a multiple of that block (8 vs 33, 16 vs 17): the headline alone
    is then likely this stack's mismatch (a pipeline's 4 vs 8 or an unrelated 32 vs 99 is not)."""
    lo, hi = min(a, b), max(a, b)
    return 2 <= lo <= 64 and lo & (lo - 1) == 0 and lo < hi <= 1025 and (hi - 1) % lo == 0


def _batch_overflow(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any] | None:
    """``a`` = the largest captured batch, ``b`` = a larger running batch: DFlash's graph-folded sampler
    stages ``b`` requests into buffers sized for ``a`` (sgl-project/sglang#37531). Recognised by its
    frame (``stage_sampling_params``) around the line, or by the plan (``a`` = cuda_graph_max_bs < ``b``
    <= max_running_requests)."""
    if _spec_off(p):
        return None
    a, b = int(m["a"]), int(m["b"])
    by_frame = b > a and (s.before(SAMPLER, 40) or s.after(SAMPLER))
    by_plan = (p.cuda_graph_max_bs is not None and a == p.cuda_graph_max_bs and b > a
               and (p.max_running_requests is None or b <= p.max_running_requests)
               and p.algorithm in ("DFLASH", "DDTREE"))
    if not (by_frame or by_plan):
        return None
    mrr = p.max_running_requests if p.max_running_requests is not None else "?"
    plan = f" (this plan: max_running_requests {mrr}, cuda_graph_max_bs {p.cuda_graph_max_bs})" if p.given else ""
    return {"a": a, "b": b, "plan": plan}


def _ima(phase: str) -> Callable[[re.Match[str], Scan, PlanFacts], dict[str, Any] | None]:
    def values(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any] | None:
        line = m.string
        capture = ("capture cuda graph failed" in line.lower() or s.capturing
                   or (s.before(CAPTURE, 30) and not s.before(REPLAY, 30)))
        if (phase == "capture") != capture:
            return None
        spec = not _spec_off(p) and (s.before(SPEC) or _SPEC_WORDS.search(evidence(line)) is not None
                                     or p.algorithm not in (None, "none"))
        if phase == "replay" and not spec:
            return None  # an illegal access without speculative decoding is no signature of this stack
        return {"spec": f"speculative decoding ({p.algorithm})" if p.algorithm not in (None, "none")
                else "speculative decoding", "unit": p.unit or "the SGLang unit"}
    return values


def _ima_unknown(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any] | None:
    """An illegal memory access neither the capture nor the replay signature claims (no capture,
    replay or speculative-decoding context): still a crash worth naming, its phase unknown."""
    if _ima("capture")(m, s, p) is not None or _ima("replay")(m, s, p) is not None:
        return None
    return {"unit": p.unit or "the SGLang unit"}


def _oom(capture_wanted: bool) -> Callable[[re.Match[str], Scan, PlanFacts], dict[str, Any] | None]:
    def values(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any] | None:
        capture = "capture cuda graph failed" in m.string.lower() or s.capturing or s.before(CAPTURE, 30)
        if capture != capture_wanted:
            return None
        mb = p.cuda_graph_max_bs
        mfs = p.mem_fraction_static
        plan = ""
        if p.given:
            plan = (f"; this plan: cuda_graph_max_bs {mb if mb is not None else '(SGLang default)'}, "
                    f"mem_fraction_static {mfs if mfs is not None else '(SGLang default)'}"
                    + (f", memory estimate: {p.memory}" if p.memory else ""))
        lower = (f"lower ddtree_server.cuda_graph_max_bs (e.g. {max(1, mb // 2)})" if mb and mb > 1
                 else "lower ddtree_server.cuda_graph_max_bs")
        return {"tried": (m.groupdict().get("tried") or "").strip() or "?", "plan": plan, "lower": lower}
    return values


def _ptxas(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any]:
    from ..config.toolchain import ARCHS

    arch = m["arch"]
    base = re.sub(r"[af]$", "", arch)
    need = ARCHS[base].min_cuda if base in ARCHS else None
    env = (", ".join(f"{k}={v}" for k, v in p.ptxas_env.items()) if p.ptxas_env
           else "TRITON_PTXAS_PATH (Triton <= 3.5, or below sm_100) / TRITON_PTXAS_BLACKWELL_PATH (Triton >= 3.6 on "
           "sm_100+) set to that toolkit's ptxas in the unit's env")
    return {"arch": arch, "need": f"CUDA >= {need}" if need else "a CUDA toolkit that knows it", "env": env,
            "base": base if base in ARCHS else "sm_XYZ"}


def _nccl(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any]:
    d = m.groupdict()
    what = (f"{d.get('op') or d.get('code') or 'a collective'}"
            + (f" after {int(d['ms']) // 1000} s" if d.get("ms") else ""))
    return {"what": what}


def _port(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any]:
    port = m.groupdict().get("port")
    unit = p.unit or "ddtree-sglang.service"
    return {"port": f"port {port}" if port else "its port", "portnum": port or (p.port or "PORT"), "unit": unit}


def _devices(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any] | None:
    if "nvidia-uvm" in m.group(0).lower():
        return None  # the uvm module and its node: nvidia-uvm-missing
    return {"what": m.group(0)[:80]}


def _health(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any]:
    d = m.groupdict()
    phase = (d.get("phase") or "").lower()
    return {"what": (f"SGLang's /health got no scheduler response for {d['secs']} s" if d.get("secs")
                     else "the unit's readiness checks and warmup (ExecStartPost) ran past TimeoutStartSec"
                     if phase == "start-post"
                     else "the unit's start (load and graph capture) ran past TimeoutStartSec" if phase
                     else "/health did not answer 200 in consecutive probes")}


def _warmup(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any]:
    detail = (m.groupdict().get("detail") or "").strip()
    deadline = "deadline of" in detail
    return {"fix_more": ("raise ddtree_ops.warmup_deadline_s (it bounds the whole warmup)" if deadline
                         else "read the SGLang lines just before it (a crash signature above names the cause)")}


_ERROR_LINE = re.compile(r"\b(?P<exc>[A-Z]\w{0,40}(?:Error|Exception)): (?P<msg>[^\n]{1,300})")
"""A Python exception line (``RuntimeError: ...``): what a capture failure quotes as its cause."""
_PDL_HANDLE = re.compile(r"(?i)invalid resource handle")


def _capture_failed(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any] | None:
    """SGLang's own capture-failure message, whatever the error: the decode/draft runners raise
    ``Capture cuda graph failed: {e}`` (0.5.17 ``model_executor/runner/decode_cuda_graph_runner.py``,
    ``speculative/eagle_draft_cuda_graph_runner.py``), the prefill runners log the error and then
    ``Fail when using backend: {backend} for prefill runner.`` (``runner_backend_utils``). An OOM or an
    illegal access has its own signature (capture-oom, illegal-memory-access-capture)."""
    err = (m.groupdict().get("err") or "").strip()
    if not err:  # the error itself is on a line just before (the prefill hint, a bare ``Capture ... failed``)
        for j in range(s.index - 1, max(-1, s.index - 12), -1):
            e = _ERROR_LINE.search(s.src.lines[j][:MAX_LINE])
            if e:
                err = f"{e['exc']}: {e['msg']}".strip()
                break
    if _OOM.search(err) or _IMA.search(err) or _OOM.search(m.string) or _IMA.search(m.string):
        return None
    tm = _TENSOR_MISMATCH.search(err)
    if tm and (_graph_mismatch(tm, s, p) is not None or _batch_overflow(tm, s, p) is not None):
        return None  # the draft/verify width (or batch) signature names this one
    backend = m.groupdict().get("backend")
    phase = s.capture_phase or ("prefill" if backend else None)
    where = f"the {phase} graph" if phase else "a CUDA graph (the log names no capture phase)"
    size = s.capture_size or "a size the log does not name"
    pdl = _PDL_HANDLE.search(err) is not None
    sm120 = (p.target or "").startswith("sm_120")
    hint = ("sgl-kernel sets its PDL launch attribute while the stream is capturing, which the driver "
            "refuses on sm_120 (RTX PRO 6000 / RTX 5090) with 'invalid resource handle' (sgl-project/sglang#18596)"
            + ("; this plan's target is sm_120" if sm120 else "") + ": pin an sgl-kernel with that fix, or "
            if pdl else "")
    return {"where": where, "size": size, "err": _clean(err)[:200] or "no error text logged",
            "hint": hint}


def _xid_values(bucket: str) -> Callable[[re.Match[str], Scan, PlanFacts], dict[str, Any] | None]:
    def values(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any] | None:
        xid = int(m["xid"])
        rest = m["rest"] or ""
        entry = XID_CATALOG.get(xid)
        if entry is None:
            meaning, action = "not in this table: look it up in NVIDIA's Xid catalog", "other"
        else:
            meaning = f"{entry.meaning} ({entry.mnemonic}; NVIDIA's immediate action {entry.immediate})"
            action = entry.action
        if xid == 154:  # the driver names the recovery it needs
            rec = re.search(r"(?i)to 0x[0-9a-f]{1,4} \((?P<what>[^)]{1,60})\)", rest)
            what = rec["what"].lower() if rec else ""
            action = ("reboot" if "reboot" in what else "reset" if "reset" in what or "drain" in what else "other")
            meaning = f"GPU recovery action changed to {rec['what'] if rec else 'an action the line does not name'}"
        if action != bucket:
            return None
        bus = m["bus"]
        return {"xid": xid, "bus": bus, "meaning": meaning, "unit": p.unit or "the SGLang unit"}
    return values


def _uvm(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any]:
    # torch's 'CUDA unknown error' is cudaErrorUnknown at init: the usual cause, not the only one
    unknown = "unknown error" in m.group(0).lower()
    return {"what": _clean(m.group(0))[:100], "unit": p.unit or "the SGLang unit",
            "missing": "is most likely missing" if unknown else "is missing"}


_HEALTH_FAILED = re.compile(r"Health check failed|FAIL ready: /health")


def _qo_indptr(m: re.Match[str], s: Scan, p: PlanFacts) -> dict[str, Any]:
    """``q.shape[0] (1) does not match qo_indptr[-1] (5)`` (flashinfer's paged-prefill check): timed-out
    /health probes left their one-token requests in the scheduler, which batched them
    (sgl-project/sglang#35884). A /health failure earlier in the log confirms it."""
    seen = any(_HEALTH_FAILED.search(s.src.lines[j][:MAX_LINE]) for j in range(0, s.index))
    why = ("/health probes timed out earlier in this log, and each abandoned probe's request stayed in the "
           "scheduler" if seen else "the known cause is /health probes abandoned at their timeout whose requests "
           "stay in the scheduler (no /health failure is in the examined lines: give diagnose more of the log)")
    return {"q": m["q"], "qo": m["qo"], "why": why, "unit": p.unit or "the SGLang unit"}


_OOM = re.compile(
    r"(?:^|[:(]\s{0,4}['\"]?|\]\s)\s{0,4}CUDA\s{1,4}(?:driver\s{1,4})?(?:error:\s{0,4})?out\s{1,4}of\s{1,4}"
    r"memory(?=[.\s]|$)\.?(?:\s{1,4}Tried\s{1,4}to\s{1,4}allocate\s{1,4}(?P<tried>[\d.]{1,12} ?[KMGT]?i?B))?"
)
"""torch's allocator (``torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 448.00 MiB``), the
CUDA runtime's ``cudaErrorMemoryAllocation`` (``CUDA error: out of memory``) and the driver API's
``CUDA_ERROR_OUT_OF_MEMORY`` as torch words it (``CUDA driver error: out of memory``), any run of blanks
between the words. Anchored on those shapes: the text starts the line or follows an exception's
``: `` / ``('`` (a log-prefix ``] ``), and ends the sentence, so prose quoting it (``see docs for 'CUDA
out of memory' tips``) is no finding."""

_IMA = re.compile(r"(?i)an\s{1,4}illegal\s{1,4}memory\s{1,4}access\s{1,4}was\s{1,4}encountered|cudaErrorIllegalAddress")
"""``cudaErrorIllegalAddress`` as the CUDA runtime words it (``CUDA error: an illegal memory access
was encountered``)."""

_TENSOR_MISMATCH = re.compile(r"The size of tensor a \((?P<a>\d{1,9})\) must match the size of tensor b "
                              r"\((?P<b>\d{1,9})\)(?: at non-singleton dimension (?P<dim>\d{1,3}))?")
"""torch's broadcast/copy shape error (``RuntimeError: The size of tensor a (8) must match ...``)."""

_CAT = "NVIDIA Xid catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)"
_CAT_CSV = ("NVIDIA Xid catalog's Immediate Action column as NVIDIA/NVSentinel ships it "
            "(distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv)")
_DPR = "NVIDIA dynamic page retirement guide (docs.nvidia.com/deploy/dynamic-page-retirement, Visibility: XIDs)"


@dataclass(frozen=True)
class XidEntry:
    """One Xid of :data:`XID_CATALOG`.

    Attributes:
        meaning: what the Xid reports, in words.
        action: the diagnose bucket (``app``, ``reset``, ``reboot``, ``other``).
        mnemonic: the driver's name of the Xid (the catalog's Mnemonic column).
        immediate: the catalog's Resolution Bucket (Immediate Action).
        source: where ``mnemonic`` and ``immediate`` were read.
    """

    meaning: str
    action: str
    mnemonic: str
    immediate: str
    source: str


def _x(meaning: str, action: str, mnemonic: str, immediate: str, source: str = _CAT_CSV) -> XidEntry:
    return XidEntry(meaning, action, mnemonic, immediate, source)


XID_CATALOG: dict[int, XidEntry] = {
    8: _x("GPU stopped processing", "app", "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", "RESTART_APP", _CAT),
    13: _x("Graphics Engine Exception", "app", "ROBUST_CHANNEL_GR_EXCEPTION", "RESTART_APP", _CAT),
    31: _x("GPU memory page fault (an MMU fault: an illegal address, most often the application's)", "app",
           "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", "RESTART_APP"),
    # logged when a channel is torn down after its application's own error: nothing to do about the Xid itself
    43: _x("a channel was reset after an error of its application (informational: act on that error, logged "
           "before it)", "other", "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", "IGNORE"),
    45: _x("preemptive cleanup after a previous error (the channel was torn down)", "other",
           "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", "WORKFLOW_XID_45"),
    46: _x("GPU timeout", "reset", "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", "RESET_GPU"),
    48: _x("Double Bit ECC Error (uncorrectable memory error)", "reset", "ROBUST_CHANNEL_GPU_ECC_DBE",
           "WORKFLOW_XID_48"),
    # the catalog sends this one to NVIDIA support rather than naming a reset
    61: _x("internal micro-controller breakpoint/warning (the catalog's action: contact NVIDIA support)", "other",
           "PMU_BREAKPOINT", "CONTACT_SUPPORT"),
    62: _x("internal micro-controller halt", "reset", "PMU_HALT_ERROR", "RESET_GPU"),
    63: _x("ECC page retirement or row remapping recorded (takes effect at the next GPU reset)", "other",
           "INFOROM_DRAM_RETIREMENT_EVENT", "IGNORE", f"{_CAT_CSV}; {_DPR}"),
    64: _x("ECC page retirement or row remapper recording failure", "reset", "INFOROM_DRAM_RETIREMENT_FAILURE",
           "RESET_GPU", f"{_CAT_CSV}; {_DPR}"),
    69: _x("Graphics Engine class error", "app", "ROBUST_CHANNEL_GR_CLASS_ERROR", "RESTART_APP"),
    74: _x("NVLink error", "reset", "NVLINK_ERROR", "WORKFLOW_NVLINK_ERR"),
    79: _x("GPU has fallen off the bus", "reboot", "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", "RESTART_BM"),
    92: _x("high single-bit ECC error rate (corrected)", "other", "EXCESSIVE_SBE_INTERRUPTS", "IGNORE"),
    94: _x("contained ECC error (only the application that touched the memory is affected)", "app",
           "ROBUST_CHANNEL_CONTAINED_ERROR", "RESTART_APP"),
    95: _x("uncontained ECC error", "reset", "ROBUST_CHANNEL_UNCONTAINED_ERROR", "RESET_GPU"),
    109: _x("context switch timeout", "reset", "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", "RESET_GPU"),
    119: _x("GSP RPC timeout (the GPU's system processor did not answer the driver)", "reset", "GSP_RPC_TIMEOUT",
            "RESET_GPU"),
    120: _x("GSP error", "reset", "GSP_ERROR", "RESET_GPU"),
    136: _x("NVLink link training (ALI) failed", "reset", "ALI_TRAINING_FAIL", "RESET_GPU"),
    140: _x("unrecovered ECC error", "reset", "UNRECOVERABLE_ECC_ERROR_ESCAPE", "RESET_GPU"),
    143: _x("GPU initialization error", "reset", "GPU_INIT_ERROR", "RESET_GPU"),
    **{n: _x(f"NVLink5 error ({name})", "reset", f"NVLINK_{name}_ERROR", "WORKFLOW_NVLINK5_ERR")
       for n, name in ((144, "SAW"), (145, "RLW"), (146, "TLW"), (147, "TREX"), (148, "NVLPW_CTRL"),
                       (149, "NETIR"), (150, "MSE"))},
    155: _x("NVLink software-defined error", "reset", "NVLINK_SW_DEFINED_ERROR", "RESET_GPU"),
    156: _x("resource retirement event (takes effect at a GPU reset)", "reset", "RESOURCE_RETIREMENT_EVENT",
            "RESET_GPU"),
    158: _x("GPU fatal timeout", "reset", "GPU_FATAL_TIMEOUT", "RESET_GPU"),
    160: _x("channel retirement event (a reboot of the machine applies it)", "reboot", "CHANNEL_RETIREMENT_EVENT",
            "RESTART_BM"),
}
"""Xid -> :class:`XidEntry` for the Xids this stack meets, after NVIDIA's Xid catalog for Ampere and newer
GPUs ("Analyzing Xid Errors with the Xid Catalog": the Mnemonic, Description and "Resolution Bucket
(Immediate Action)" columns; the rows past the page's opening are read from the same columns as NVIDIA
ships them machine-readable in NVIDIA/NVSentinel). Buckets: RESTART_APP -> ``app``; RESET_GPU and the
XID_48 / NVLink / NVLink5 workflows -> ``reset``; RESTART_BM (a reboot of the machine) -> ``reboot``;
IGNORE, CONTACT_SUPPORT and follow-on events -> ``other``. Xid 154 names its own recovery action in the
line (``GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)``), one of NVML's
``nvmlDeviceGpuRecoveryAction_t``: none, GPU reset, node reboot, drain P2P, drain and reset (drain P2P
is read as a reset: stopping the unit drains it)."""

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.\d)?)\): "
                  r"(?P<xid>\d{1,4})\b(?P<rest>[^\n]{0,300})")
"""The NVIDIA driver's kernel-log line: ``NVRM: Xid (PCI:0000:2b:00): 79, pid=..., GPU has fallen off the
bus.`` (older drivers print the bus without ``PCI:``)."""

_SRC_XID = (f"{_CAT}, Mnemonic and Resolution Bucket (Immediate Action) columns; rows past the page's opening "
            "from the same columns in NVIDIA/NVSentinel's xiderrorsmapping.csv")

_SRC_PLAN = "sgl-project/sglang#29907 (DDTree verify graphs sized at budget + 1); ddtree_ops/config/plan.py"

SIGNATURES: tuple[Signature, ...] = (
    Signature(
        "graph-batch-overflow",
        ("must match the size of tensor",),
        (_TENSOR_MISMATCH,),
        "a batch of {b} requests ran past the largest captured CUDA-graph batch ({a}) and overflowed the DFlash "
        "sampler's graph buffers (sized for {a})",
        "keep ddtree_server.max_running_requests <= cuda_graph_max_bs{plan}, or pin an SGLang build with the eager "
        "fallback above the graph batch limit (sgl-project/sglang#37531)",
        "sgl-project/sglang#37531 (DFlash sampler: The size of tensor a (8) must match the size of tensor b (9))",
        _batch_overflow,
    ),
    Signature(
        "graph-size-mismatch",
        ("must match the size of tensor",),
        (_TENSOR_MISMATCH,),
        "draft/verify CUDA-graph width mismatch {where}: captured width a ({a}) vs needed b ({b}), dimension {dim}"
        "{logged}",
        "the rule is: draft graphs use block_size tokens per request, DDTree target-verify graphs budget + 1{plan}; "
        "this SGLang build sized verify graphs from block_size: pin ddtree_sglang.ddtree_source sglang-pr-29907 "
        "(or install the ddtree-ops plugin), check with `ddtree-ops probe-sglang` (verify-graph-sizing), "
        "or run eagerly (ddtree_server.cuda_graph: false)",
        _SRC_PLAN,
        _graph_mismatch,
    ),
    Signature(
        "ptxas-unknown-arch",
        ("ptxas",),
        (
            re.compile(
                r"ptxas fatal\s{0,8}:\s{0,8}Value\s{1,4}(?:'|\\?\"|\\u0027)(?P<arch>sm_\d{2,4}[af]?)(?:'|\\?\"|\\u0027)"
                r"\s{1,4}is not defined for option\s{1,4}(?:'|\\?\"|\\u0027)gpu-name"
            ),
        ),
        "Triton's ptxas does not know {arch} (too old for this GPU)",
        "point Triton at a ptxas of {need}: {env}; check with `ddtree-ops check-ptxas --arch {base} --python "
        "<sglang venv>/bin/python`",
        "triton-lang/triton#8539 (ptxas fatal: Value 'sm_121a' is not defined); ddtree_ops/config/toolchain.py "
        "(which ptxas each Triton uses)",
        _ptxas,
    ),
    Signature(
        "illegal-memory-access-capture",
        ("illegal",),
        (_IMA,),
        "CUDA illegal memory access while capturing CUDA graphs",
        "a kernel faults at capture: A/B eagerly (ddtree_server.cuda_graph: false) to confirm; lower "
        "cuda_graph_max_bs or mem_fraction_static; for DDTree check the plan's widths and the attention backend",
        "sgl-project/sglang#5029, #1467 (Capture cuda graph failed: ... illegal memory access)",
        _ima("capture"),
    ),
    Signature(
        "illegal-memory-access-replay",
        ("illegal",),
        (_IMA,),
        "CUDA illegal memory access at graph replay / decode under {spec}",
        "A/B it eagerly: restart {unit} with ddtree_server.cuda_graph: false; if eager runs clean it is the "
        "captured-graph replay (padding raw_bs to a captured bs), so pin a build with the fix or keep it eager; "
        "add CUDA_LAUNCH_BLOCKING=1 to the env for the exact kernel",
        "sgl-project/sglang#28569, #10892, #25512 (EAGLE graph replay illegal memory access)",
        _ima("replay"),
    ),
    Signature(
        "illegal-memory-access",
        ("illegal",),
        (_IMA,),
        "CUDA illegal memory access (phase unknown: no graph capture, replay or speculative-decoding lines near it)",
        "read the lines before it for the failing kernel; restart {unit} with CUDA_LAUNCH_BLOCKING=1 in the env "
        "for the exact kernel; A/B eagerly (ddtree_server.cuda_graph: false); give diagnose more of the log "
        "(--lines) or --plan to tell capture from replay",
        "CUDA runtime cudaErrorIllegalAddress; sgl-project/sglang#5029, #28569",
        _ima_unknown,
    ),
    Signature(
        "capture-oom",
        ("memory",),
        (_OOM,),
        "GPU out of memory while capturing CUDA graphs (tried to allocate {tried})",
        "{lower} or lower ddtree_server.mem_fraction_static (leaves more for graph buffers){plan}",
        "sgl-project/sglang#5285, #3430; CUDA_GRAPH_CAPTURE_FAILED_MSG in sglang/srt/model_executor/"
        "runner_backend_utils (0.5.23)",
        _oom(True),
    ),
    Signature(
        "cuda-graph-capture-failed",
        ("capture cuda graph failed", "for prefill runner"),
        (
            re.compile(r"(?i)Capture cuda graph failed(?::[ \t]{0,4}(?P<err>[^\n]{1,400}))?"),
            re.compile(r"Fail when using backend: (?P<backend>[\w-]{1,40}) for prefill runner"),
        ),
        "CUDA graph capture failed in {where} at {size}: {err}",
        "{hint}A/B it eagerly (ddtree_server.cuda_graph: false) to confirm it is the capture; the kernel named in "
        "the error is the one to pin or report; lower ddtree_server.cuda_graph_max_bs to skip the failing size",
        "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py and runner_backend_utils (0.5.17: "
        "'Capture cuda graph failed', 'Fail when using backend'); sgl-project/sglang#18596 (sm_120 PDL: invalid "
        "resource handle during init_device_graphs)",
        _capture_failed,
    ),
    Signature(
        "cuda-oom",
        ("memory",),
        (_OOM,),
        "GPU out of memory outside graph capture (weights, KV cache or a large batch; tried to allocate {tried})",
        "lower ddtree_server.mem_fraction_static, max_running_requests or context_length, or raise tp_size{plan}",
        "PyTorch CUDA caching allocator (torch.OutOfMemoryError); sgl-project/sglang server arguments",
        _oom(False),
    ),
    Signature(
        "nccl-timeout",
        ("watchdog caught collective operation timeout", "nccl"),
        (
            re.compile(
                r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=\d{1,12}, OpType=(?P<op>\w{1,40})"
                r"[^\n]{0,300}?\) ran for (?P<ms>\d{1,12}) milliseconds"
            ),
            re.compile(r"Process group watchdog thread terminated with exception"),
            re.compile(r"NCCL (?:WARN|ERROR)[^\n]{0,200}(?:[Tt]imeout|timed out)"),
            re.compile(r"\b(?P<code>nccl(?:UnhandledCuda|System|Internal|Remote|InvalidUsage)Error)(?:: |\s{0,4}$)"),
            re.compile(
                r"NCCL error in: [^\n]{0,300}?(?P<code>unhandled (?:cuda|system) error|internal error|remote "
                r"process exited or there was a network error)"
            ),
            re.compile(r"NCCL communicator was aborted"),
        ),
        "NCCL collective timed out or failed ({what}): a rank stalled or the interconnect failed",
        "check every GPU and link (nvidia-smi topo -m, nvidia-smi nvlink -s, dmesg for Xid), run with NCCL_DEBUG=INFO; "
        "a rank that crashed first (see the earliest error above) stalls the rest",
        "pytorch ProcessGroupNCCL watchdog; sgl-project/sglang#1693, #3784",
        _nccl,
    ),
    Signature(
        "scheduler-watchdog",
        ("watchdog timeout",),
        (re.compile(r"\b(?P<who>[A-Za-z]\w{0,39}) watchdog timeout \(self\.watchdog_timeout=(?P<t>[\d.]{1,12})"),),
        "SGLang's {who} watchdog fired: a forward batch made no progress for {t} s (a hang: often a collective)",
        "py-spy dump the scheduler if it recurs, check NCCL/GPUs (nvidia-smi, dmesg Xid); raise "
        "--watchdog-timeout only for legitimately long batches",
        "sglang/srt/utils/watchdog.py (0.5.23)",
        lambda m, s, p: {"who": m["who"].strip(), "t": m["t"]},
    ),
    Signature(
        "port-in-use",
        ("address already in use", "eaddrinuse", "is already in use", "held by"),
        (
            re.compile(
                r"(?i)\[Errno 98\] error while attempting to bind on address \(\s{0,4}'[^']{0,100}',\s{0,4}"
                r"(?P<port>\d{1,5})[^)]{0,40}\):(?: \[errno 98\])? address already in use"
            ),
            re.compile(
                r"(?i)failed to listen on any local network address\. port: (?P<port>\d{1,5})[^\n]{0,120}EADDRINUSE"
            ),
            re.compile(r"(?i)\[Errno 98\] Address already in use"),
            re.compile(r"FAIL port: port (?P<port>\d{1,5}) (?:is already in use|is held by)"),
        ),
        "{port} is already in use by another process: the server cannot bind",
        "`ddtree-ops port-check --port {portnum} --unit {unit}` names the holder; stop it, or set another port "
        "(ddtree_server.port / ddtree_ops.exporter_port)",
        "uvicorn bind error (sgl-project/sglang#2361); torch TCPStore EADDRINUSE; ddtree_ops/host/ports.py",
        _port,
    ),
    Signature(
        "xid-node-reboot",
        ("nvrm: xid",),
        (_XID,),
        "the NVIDIA driver logged Xid {xid} on GPU {bus}: {meaning}",
        "a unit restart or GPU reset will not bring it back: drain this host and reboot the machine (power-cycle "
        "it if the GPU is still missing after the reboot); if it recurs, have the GPU, its slot/riser and power "
        "serviced",
        _SRC_XID,
        _xid_values("reboot"),
    ),
    Signature(
        "xid-gpu-reset",
        ("nvrm: xid",),
        (_XID,),
        "the NVIDIA driver logged Xid {xid} on GPU {bus}: {meaning}",
        "restarting the unit is not enough: stop {unit}, reset the GPU (`nvidia-smi -r -i {bus}`: no process may "
        "hold it), check it (`nvidia-smi -q -d ECC,ROW_REMAPPER`, `nvidia-smi nvlink -s`), then start the unit; if "
        "the reset fails or the Xid recurs, reboot the machine and have the GPU serviced",
        _SRC_XID,
        _xid_values("reset"),
    ),
    Signature(
        "xid-app-fault",
        ("nvrm: xid",),
        (_XID,),
        "the NVIDIA driver logged Xid {xid} on GPU {bus}: {meaning}; the GPU stays usable",
        "an application-level fault: read the unit's own error at that time (a signature above names it), "
        "restart {unit}; if it recurs, restart with CUDA_LAUNCH_BLOCKING=1 and A/B eagerly "
        "(ddtree_server.cuda_graph: false) for the faulting kernel",
        _SRC_XID,
        _xid_values("app"),
    ),
    Signature(
        "xid-other",
        ("nvrm: xid",),
        (_XID,),
        "the NVIDIA driver logged Xid {xid} on GPU {bus}: {meaning}",
        "Xid 43 and 45 follow another error (act on the first Xid or error before them); Xid 63 needs a GPU reset "
        "at the next maintenance to apply the remapping; Xid 92 needs watching (`nvidia-smi -q -d ECC`); Xid 61: "
        "report it to NVIDIA support with `nvidia-bug-report.sh`; any other: look it up in NVIDIA's Xid catalog "
        "before restarting anything",
        _SRC_XID,
        _xid_values("other"),
    ),
    Signature(
        "nvidia-uvm-missing",
        ("nvidia-uvm", "nvidia_uvm", "cuda unknown error"),
        (
            re.compile(r"(?i)(?:failed to open|cannot open|could not open|open failed:?|lstat|stat)[ \t]{1,4}"
                       r"(?:device )?['\"]?/dev/nvidia-uvm\b"),
            re.compile(r"(?i)/dev/nvidia-uvm\b[^\n]{0,80}(?:No such file|not found|ENOENT|cannot open)"),
            re.compile(r"(?i)\bnvidia[-_]uvm\b[^\n]{0,80}(?:not found|Unknown symbol|failed to load|could not insert)"),
            re.compile(r"CUDA unknown error - this may be due to an incorrectly set up environment"),
        ),
        "CUDA cannot initialise: the nvidia_uvm kernel module or its /dev/nvidia-uvm node {missing} ({what})",
        "check `lsmod | grep nvidia_uvm` and `ls -l /dev/nvidia-uvm`; load it and create the node (`nvidia-modprobe "
        "-u -c=0`, or `modprobe nvidia-uvm`), `systemctl restart ddtree-nvidia-devices.service`, then restart "
        "{unit}; if both are present, this 'CUDA unknown error' has another cause (`nvidia-smi`, the kernel log's "
        "Xid lines)",
        "NVIDIA/nvidia-docker#139 (lstat /dev/nvidia-uvm); torch's cudaErrorUnknown text ('CUDA unknown error - "
        "this may be due to an incorrectly set up environment'); ddtree_ops/templates/nvidia-devices.service.j2",
        _uvm,
    ),
    Signature(
        "batch-qo-indptr-mismatch",
        ("qo_indptr",),
        (re.compile(r"q\.shape\[0\] \((?P<q>\d{1,9})\) does not match qo_indptr\[-1\] \((?P<qo>\d{1,9})\)"),),
        "the scheduler crashed batching a paged prefill (q.shape[0] {q} vs qo_indptr[-1] {qo}): {why}",
        "probe /health no more often than its timeout and never abandon a probe before SGLang's own "
        "SGLANG_HEALTH_CHECK_TIMEOUT (ddtree_ops.health_timeout_s above it), or set "
        "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false in the unit's env; pin an SGLang with "
        "sgl-project/sglang#35896; restart {unit}",
        "sgl-project/sglang#35884 (orphaned /health probes crash paged-prefill batching), PR #35896",
        _qo_indptr,
    ),
    Signature(
        "device-nodes-missing",
        (
            "nvidia-uvm",
            "cuda-capable device",
            "no cuda gpus",
            "cuda_error_no_device",
            "no nvidia driver",
            "/dev/nvidia",
        ),
        (
            re.compile(
                r"(?i)/dev/nvidia(?:-uvm|ctl|\d{1,2})\b[^\n]{0,80}(?:No such file|not found|ENOENT|cannot open)"
            ),
            re.compile(
                r"(?i)(?:No such file or directory|cannot open|ENOENT)[^\n]{0,80}/dev/nvidia(?:-uvm|ctl|\d{1,2})\b"
            ),
            re.compile(r"(?i)no CUDA-capable device is detected|CUDA_ERROR_NO_DEVICE"),
            re.compile(r"No CUDA GPUs are available"),
            re.compile(r"Found no NVIDIA driver on your system"),
        ),
        "the process sees no GPU: NVIDIA device nodes are missing or not allowed ({what})",
        "systemctl status ddtree-nvidia-devices.service (it creates /dev/nvidia-uvm and the nodes before the "
        "sandboxed unit starts), check nvidia-smi on the host and the unit's DeviceAllow=, then restart the unit",
        "NVIDIA/nvidia-docker#139, #997 (missing /dev/nvidia-uvm); ddtree_ops/templates/nvidia-devices.service.j2",
        _devices,
    ),
    Signature(
        "health-timeout",
        ("health check failed", "/health", "operation timed out"),
        (
            re.compile(
                r"Health check failed\. Server couldn't get a response from detokenizer for last (?P<secs>\d{1,6}) "
                r"seconds"
            ),
            re.compile(r"FAIL ready: /health failed \d{1,6} consecutive probe"),
            re.compile(r"(?i)(?P<phase>start|start-post) operation timed out"),
        ),
        "health check timed out: {what}",
        "if the scheduler crashed, a signature above says why; a slow start/warmup needs ddtree_service."
        "start_timeout_s / ddtree_ops.ready_timeout_s raised, a busy server SGLANG_HEALTH_CHECK_TIMEOUT or "
        "ddtree_ops.health_timeout_s; check with `ddtree-ops health --plan plan.json`",
        "sglang/srt/entrypoints/http_server.py health (0.5.23; sgl-project/sglang#10856, #22511); "
        "ddtree_ops/runtime/health.py; systemd.service(5) TimeoutStartSec",
        _health,
    ),
    Signature(
        "warmup-failed",
        ("fail warmup",),
        (re.compile(r"FAIL warmup: warmup failed: (?P<detail>[^\n]{0,400})"),),
        "the unit's warmup (every captured batch size) failed, so the unit never became active",
        "{fix_more}; re-run by hand: `ddtree-ops warmup --plan plan.json`",
        "ddtree_ops/runtime/warmup.py (ExecStartPost warmup of the unit)",
        _warmup,
    ),
)
"""Every recognised failure, in the order findings print."""

NAMES = tuple(s.name for s in SIGNATURES)


@dataclass
class Finding:
    """One signature found: where first, how often, and its cause and fix filled in.

    ``line`` is 1-based in the examined input (the tail that was read: the last ``--max-mib`` /
    ``--lines`` of a file, the journal's output for ``--unit``)."""

    name: str
    line: int
    count: int
    cause: str
    fix: str
    source: str
    quote: str
    values: dict[str, Any]
    count_capped: bool = False
    """The signature matched :data:`MAX_EVALUATIONS` times and was not tried further: ``count`` is a lower bound."""
    origin: str = ""
    """Which input ``line`` counts in when there are two: ``kernel`` for the kernel journal that
    ``--unit`` reads beside the unit's (``""``: the one input)."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe: the values extracted from the log (numbers as numbers; text scrubbed and cut)."""
        from ..config.errors import scrub, shorten

        values = {k: v if isinstance(v, (int, float)) else shorten(scrub(_clean(str(v))))
                  for k, v in self.values.items() if k not in ("plan", "logged")}
        return {"name": self.name, "line": self.line, "origin": self.origin or "log", "count": self.count,
                "count_capped": self.count_capped, "cause": self.cause, "fix": self.fix, "source": self.source,
                "quote": self.quote, "values": values}

    def message(self) -> str:
        """One line: ``name (line N[, xK]): cause: "quote". Fix: fix [source]``."""
        times = f", {self.count}{'+' if self.count_capped else ''}x" if self.count > 1 else ""
        where = f"{self.origin} line" if self.origin else "line"
        return (f"{self.name} ({where} {self.line}{times}): {self.cause}: \"{self.quote}\". Fix: {self.fix} "
                f"[{self.source}]")


def _quote(line: str) -> str:
    from ..config.errors import scrub, shorten

    return shorten(scrub(_clean(line).strip()), QUOTE_CHARS).replace('"', "'")


MAX_EVALUATIONS = 1000
"""Matches of one signature whose context is examined; past that the signature is not tried again
and its count is a lower bound (``count_capped``): a log of 100k matching lines costs bounded time."""


def diagnose(lines: list[str], plan: PlanFacts | None = None, origin: str = "") -> list[Finding]:
    """Findings in ``lines`` (already bounded and cleaned: :func:`split_lines`), one per
    signature (first line, count), in :data:`SIGNATURES` order. A signature's context is the
    :data:`CONTEXT_LINES` lines before a match and the :data:`AFTER_LINES` after it, and the
    capture phase at the match (SGLang's ``Capture ... graph begin/end`` lines). ``origin`` names the
    input in each finding (``kernel`` for the kernel journal)."""
    plan = plan or PlanFacts()
    src = _Lines(lines)
    found: dict[str, Finding] = {}
    evaluations = dict.fromkeys(NAMES, 0)
    capturing = False
    verify_width: int | None = None
    phase: str | None = None
    size: str | None = None
    for i, full in enumerate(lines):
        line = full[:MAX_LINE]
        lower = line.lower()
        if "load weight begin" in lower or "server_args=" in lower:  # a (re)start: no capture under way yet
            capturing, phase, size = False, None, None
        mark = _PHASE_MARK.search(line) if " graph " in lower and "capture" in lower else None
        if mark:
            capturing = mark[2].lower() == "begin"
            width = _VERIFY_CAPTURE.search(line) if capturing else None
            if width:
                verify_width = int(width[1])
            if capturing:
                phase, size = " ".join(mark[1].lower().split()) or "decode", None
        if capturing and "capturing " in lower:
            sizes = _CAPTURE_SIZE.findall(line)
            if sizes:
                kind, n = sizes[-1]
                size = f"batch size {n}" if kind.startswith("batches") else f"{n} tokens"
        for sig in SIGNATURES:
            if evaluations[sig.name] >= MAX_EVALUATIONS or not any(n in lower for n in sig.needles):
                continue
            for pat in sig.patterns:
                m = pat.search(line)
                if m is None:
                    continue
                evaluations[sig.name] += 1
                vals = sig.values(m, Scan(src, i, capturing, verify_width, phase, size), plan)
                if vals is None:
                    break
                if sig.name in found:
                    found[sig.name].count += 1
                else:
                    found[sig.name] = Finding(sig.name, i + 1, 1, _fill(sig.cause, vals), _fill(sig.fix, vals),
                                              sig.source, _quote(line), vals, origin=origin)
                break
    for f in found.values():
        f.count_capped = evaluations[f.name] >= MAX_EVALUATIONS
    return [found[n] for n in NAMES if n in found]


def _fill(template: str, values: dict[str, Any]) -> str:
    from ..config.errors import scrub

    return scrub(template.format(**{k: _clean(str(v)) for k, v in values.items()}))


def report(findings: list[Finding], n_lines: int, source: str) -> dict[str, Any]:
    """The ``--json`` document: ``ok`` (no finding), ``checks`` (the CLI's shape), ``findings``,
    ``lines`` examined, ``source`` (what was read) and ``signatures`` (every known name)."""
    checks = ([{"name": f"diagnose:{f.name}", "ok": False, "detail": f.message()} for f in findings]
              or [{"name": "diagnose", "ok": True, "detail": no_finding_text(n_lines)}])
    return {"ok": not findings, "checks": checks, "findings": [f.as_dict() for f in findings], "lines": n_lines,
            "source": source, "signatures": list(NAMES)}


def no_finding_text(n_lines: int) -> str:
    return f"no known failure signature in {n_lines} line{'' if n_lines == 1 else 's'}"

