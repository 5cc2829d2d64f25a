"""The one bounded reader of a rendered ``plan.json``: its byte-level layer (standard library
only: the preflight zipapp imports it on the GPU host before ddtree-ops is installed).

Every command that takes ``--plan`` (health, warmup, bench, probe-sglang, exporter,
diagnose, preflight) reads the file through :func:`read_plan_doc` (the first five through the
typed contract on top of it, :func:`ddtree_ops.config.plandoc_model.load_plan`), so a hostile or
damaged file is one line (exit 2), never a hang, a traceback or unbounded memory:

* only a regular file (a FIFO, device, socket or directory is refused without blocking:
  the file is opened ``O_NONBLOCK`` and checked with ``fstat``; symlinks are followed);
* at most :data:`MAX_BYTES`; UTF-8;
* strict JSON (RFC 8259): no ``NaN``/``Infinity``, no duplicate keys in one object, numbers
  finite, integers of magnitude below :data:`MAX_INT` (so Python's int-string limit and
  float overflow never fire in a consumer);
* nested at most :data:`MAX_DEPTH` arrays/objects deep (checked by a flat scan before the
  parser runs, so 200 000 ``[`` is no ``RecursionError``);
* the top level an object with a ``plan`` object (what ``ddtree-ops render`` writes:
  :func:`ddtree_ops.render.files.plan_document`).
"""

from __future__ import annotations

import os
import stat
from typing import Any

from .bounded import depth as _depth
from .bounded import read_at_most
from .scrub import CONTROL_CHAR
from .strictjson import StrictJSONError, Words, loads

MAX_BYTES = 4 << 20
"""Largest plan.json read (bytes); rendered ones are a few KiB."""

MAX_DEPTH = 64
"""Deepest nesting of arrays and objects (rendered plans nest < 10 deep)."""

MAX_INT = 1 << 63
"""Integers must satisfy ``-MAX_INT < x < MAX_INT`` (byte counts, ports, sizes fit)."""

_FIX = "Fix: use the host's /etc/ddtree-ops/<name>/plan.json (written by ddtree-ops render / deploy.yml)"
_CONTROL = CONTROL_CHAR
"""Controls and invisible format characters (bidi overrides such as U+202E reorder what a terminal shows):
the scrubber's one table."""


SCHEMA_VERSION = 1
"""The ``schema_version`` this ddtree-ops writes and the newest it reads (the typed contract,
:mod:`ddtree_ops.config.plandoc_model`). Bump it for a change an older reader would misread (a
field removed, renamed or given a new meaning); adding a field keeps it."""


def newer_schema(doc: dict[str, Any]) -> str | None:
    """The refusal of a document written by a newer ddtree-ops (``schema_version`` above
    :data:`SCHEMA_VERSION`), else None. Every reader applies it before reading a field: the typed
    loader, and the standard-library readers of ``preflight`` and ``diagnose``."""
    version = doc.get("schema_version", 1)
    if type(version) is int and version > SCHEMA_VERSION:
        return (f"plan.json schema_version {version} is newer than this ddtree-ops ({SCHEMA_VERSION}): "
                "upgrade ddtree-ops on this host")
    return None


def schema_problem(doc: dict[str, Any]) -> str | None:
    """:func:`newer_schema`, or a ``schema_version`` that is no integer >= 1, else None (absent:
    version 1, written before the field existed)."""
    version = doc.get("schema_version", 1)
    if type(version) is not int or version < 1:
        return (f"schema_version = {shown(repr(version), 40)}: must be an integer >= 1: "
                "not a plan.json rendered by ddtree-ops")
    return newer_schema(doc)


class PlanFileError(ValueError):
    """A plan.json that cannot be used. ``str()`` is one line: ``OPTION PATH: problem. Fix: ...``.

    Attributes:
        problem: what is wrong (no path, no fix), for callers that word their own line.
    """

    def __init__(self, option: str, path: str, problem: str):
        self.problem = problem
        super().__init__(f"{option} {shown(path)}: {problem}. {_FIX}")


def shown(text: object, limit: int = 200) -> str:
    """``text`` for a message: control characters as ``?``, cut to ``limit`` characters + "…"."""
    s = _CONTROL.sub("?", str(text))
    return s if len(s) <= limit else s[:limit] + "…"


_WORDS = Words(
    max_int_digits=19,
    long_int=lambda digits: f"integer of {digits} digits is out of range (|x| < 2**63)",
    max_int=MAX_INT,
    big_int=lambda x: f"integer {x} is out of range (|x| < 2**63)",
    not_finite=lambda s: f"number {shown(s, 40)} is not finite (overflows a float)",
    constant=lambda s: f"{s} is not JSON (RFC 8259 has no NaN/Infinity)",
    duplicate=lambda k: f"duplicate key {shown(k, 60)!r} in one object (JSON parsers disagree on which wins)",
)
"""plan.json's limits and wording of the strict parser (:mod:`ddtree_ops._core.strictjson`)."""


def depth(data: bytes) -> int:
    """Deepest nesting of ``[``/``{`` in JSON text ``data`` (strings skipped), stopping early
    once past :data:`MAX_DEPTH` (:func:`ddtree_ops._core.bounded.depth`)."""
    return _depth(data, MAX_DEPTH)


def parse_plan_doc(data: bytes) -> dict[str, Any]:
    """The plan document in ``data`` (see the module docstring for the rules).

    Raises:
        ValueError: with the problem (no path) as its message.
    """
    if len(data) > MAX_BYTES:
        raise ValueError(f"larger than {MAX_BYTES >> 20} MiB: not a plan.json")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 (byte {exc.start})") from None
    if depth(data) > MAX_DEPTH:
        raise ValueError(f"nested deeper than {MAX_DEPTH} arrays/objects: not a plan.json")
    try:
        doc = loads(text, _WORDS)
    except StrictJSONError as exc:
        raise ValueError(str(exc)) from None
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_DEPTH} arrays/objects: not a plan.json") from None
    except ValueError as exc:  # JSONDecodeError: "msg: line L column C (char N)", no content
        raise ValueError(f"not JSON ({shown(exc, 120)})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"the top level is {type(doc).__name__ if doc is not None else 'null'}, not an object: "
                         "not a plan.json")
    if not isinstance(doc.get("plan"), dict):
        raise ValueError("no 'plan' object at the top level: not a plan.json rendered by ddtree-ops")
    return doc


def read_plan_doc(path: str | os.PathLike[str], option: str = "--plan") -> dict[str, Any]:
    """Read and check the plan.json at ``path`` (see the module docstring).

    Args:
        path: the file (symlinks followed).
        option: the option that named it, for the message.

    Returns:
        The document (a dict with a dict under ``plan``).

    Raises:
        PlanFileError: unreadable, not a regular file, over :data:`MAX_BYTES`, not strict
            JSON, too deep, an out-of-range number, or not a plan document.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:  # ValueError: NUL in the path
        raise PlanFileError(option, str(path), f"cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a socket or other")
            raise PlanFileError(option, str(path), f"{kind}, not a regular file")
        if st.st_size > MAX_BYTES:
            raise PlanFileError(option, str(path), f"larger than {MAX_BYTES >> 20} MiB: not a plan.json")
        data = read_at_most(fd, MAX_BYTES + 1)
    except OSError as exc:
        raise PlanFileError(option, str(path), f"cannot read it ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    try:
        return parse_plan_doc(data)
    except ValueError as exc:
        raise PlanFileError(option, str(path), str(exc)) from None


class PlanSchemaError(PlanFileError):
    """A plan.json of a ``schema_version`` this ddtree-ops cannot read (:func:`schema_problem`);
    ``str()`` is ``OPTION PATH: problem`` (the problem names its own fix)."""

    def __init__(self, option: str, path: str, problem: str):
        ValueError.__init__(self, f"{option} {shown(path)}: {problem}")
        self.problem = problem


def load_plan_doc(path: str | os.PathLike[str], option: str = "--plan") -> dict[str, Any]:
    """:func:`read_plan_doc`, then :func:`schema_problem`: the loader of the standard-library
    readers (``preflight``, ``diagnose``); the typed one is
    :func:`ddtree_ops.config.plandoc_model.load_plan`, on :func:`read_plan_doc` too.

    Raises:
        PlanFileError: what :func:`read_plan_doc` refuses; :class:`PlanSchemaError` for a
            ``schema_version`` that is no integer >= 1 or newer than :data:`SCHEMA_VERSION`.
    """
    doc = read_plan_doc(path, option)
    problem = schema_problem(doc)
    if problem:
        raise PlanSchemaError(option, str(path), problem)
    return doc
