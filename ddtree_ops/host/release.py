"""Host-side releases: ``ddtree-ops release list | activate | rollback | gate``.

Runs ON the host, from the service's ops venv, as root (the ``ddtree_service`` role, the
rolling playbook and ``ddtree-ops fleet rollback`` over SSH call it). The release layout and
the id are defined in :mod:`ddtree_ops.render.release` (the controller renders a release;
this module only switches between releases already on disk). The content key itself
(:func:`compute_id`) lives here, so these commands import no pydantic, Jinja or Ansible.

Interface other tools rely on (keep it stable)::

    <ops venv>/bin/ddtree-ops release list     --root R [--json]
    <ops venv>/bin/ddtree-ops release activate --root R --id ID [--keep N] [--json]
    <ops venv>/bin/ddtree-ops release rollback --root R [--keep N] [--json]
    <ops venv>/bin/ddtree-ops release gate     --plan P [--deadline S] [--requests N] [--concurrency C] [--json]
    <ops venv>/bin/ddtree-ops release prune-builds --root R --builds B [--keep NAME ...] [--json]

``R`` is the release root (``{config_dir}/releases``, e.g. ``/etc/ddtree-ops/sglang/releases``).
``activate`` and ``rollback`` only switch the ``current`` symlink (and record the history);
the caller then runs ``systemctl daemon-reload`` and restarts the unit (the role's handler,
``playbooks/rolling.yml``, ``ddtree-ops fleet rollback``), and should gate it again.

``--json`` prints one object: ``{"ok", "checks": [{name, ok, detail}], "root", ...}`` with, per
command: ``list``: ``current``, ``previous``, ``history`` (ids, newest last), ``releases``
(``{id, current, in_history, sglang_build}``); ``activate``: ``id``, ``from`` (the previous current or
null), ``changed``, ``pruned``, ``prune_failed`` (``{id: why}`` of releases that could not be
removed: the switch stands); ``rollback``: ``from``, ``to``, ``changed``, ``pruned``, ``prune_failed``;
``gate``: ``url``, ``accept_length``, ``floor``, ``elapsed_s``; ``prune-builds``: ``builds``,
``in_use``, ``removed``, ``changed``, ``other_roots`` (:func:`prune_builds`).

Exit codes as every ddtree-ops command: 0 ok, 1 refused or failed (one line naming what, the
rule and the fix: an id of the wrong shape, a symlink pointing outside the root, a release
whose files do not match its manifest, no previous release, a failed gate), 2 usage.

Safety (every path stays inside ``R``):

* ``R`` must be a real directory (not a symlink), owned by the caller, not writable by group
  or others (the same rule as ``ddtree-ops render --out``: :mod:`ddtree_ops._core.write`);
  every operation goes through a descriptor of ``R`` (``dir_fd``), never a path re-resolved later;
* an id must match :data:`ID_RE` (12 lower-case hex digits) before it names anything;
* ``current`` must be a symlink whose target is one id (no ``/``, no ``..``): anything else
  (an absolute target, a path out of ``R``, a directory in its place) is refused, not followed;
* a release is activated only when its directory is a real directory, its manifest and files
  are regular files (opened ``O_NOFOLLOW``), every file's sha256 and mode match the manifest,
  the directory and its files are ours and writable by nobody else, and the id recomputed from
  the manifest is the directory's name;
* ``current`` is switched atomically: a symlink made under a temporary name, then ``rename``
  over ``current`` (rename(2) replaces atomically: readers see the old or the new, never none).
* ``activate`` and ``rollback`` hold the root's exclusive lock (``flock`` on its descriptor,
  waited for at most :data:`LOCK_WAIT_S`) from reading ``current`` to the end of the prune, so
  two of them at once never prune the release the other just made current.

Prune rule (after each activate and rollback): keep the current release and the newest
``keep`` other releases of the history (the previous one always among them, ``keep >= 1``);
remove every other directory of ``R`` whose name is an id. Names that are no id are never
touched.

Over 600 lines: every host-side release operation (list, activate, rollback, gate, prune)
works on the same layout and manifest checks; the layout itself is
:mod:`ddtree_ops.config.release_layout`. Not yet split further.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._core.plandoc import shown
from ..config.release_layout import (
    CURRENT,
    FORMAT,
    HISTORY,
    ID_LENGTH,
    ID_RE,
    MANIFEST,
    MANIFEST_MODE,
    compute_id,
)

if TYPE_CHECKING:
    from ..config.plandoc_model import PlanDoc

MAX_FILE_BYTES = 4 << 20
"""Largest manifest, history or release file read (plan.json's own cap: :data:`ddtree_ops._core.plandoc.MAX_BYTES`)."""
MAX_HISTORY = 1000
"""Most ids kept in the history file (older lines dropped when it is rewritten)."""
KEEP_MAX = 50
"""Largest ``--keep`` (``ddtree_service.keep_releases`` has the same bound)."""


class ReleaseError(Exception):
    """A refused or failed release operation (one line: what, the rule, the fix)."""


class MissingManifest(ReleaseError):
    """A release directory without its manifest (:data:`MANIFEST`)."""


def _shown(value: object, limit: int = 200) -> str:
    return shown(repr(value), limit)


def check_id(rid: object, what: str = "--id") -> str:
    """``rid`` if it has the shape of a release id, else :class:`ReleaseError`."""
    if not isinstance(rid, str) or not ID_RE.fullmatch(rid):
        raise ReleaseError(f"{what} {_shown(rid)}: not a release id (must be {ID_LENGTH} lower-case hex digits, "
                           "as `ddtree-ops render` and `ddtree-ops release list` print them)")
    return rid


# --- the root and what is in it -------------------------------------------------------------

def open_root(root: Path, flag: str = "--root") -> int:
    """A descriptor of the release root, checked (see the module docstring). The caller closes it.

    Raises:
        ReleaseError: missing, a symlink, not a directory, not ours, or writable by group/others.
    """
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        raise ReleaseError(f"{flag} {root}: no such directory (no release was ever installed here; deploy first, "
                           "or give the service's {config_dir}/releases)") from None
    except OSError as exc:  # a path too long, a file where a directory should be, no permission
        raise ReleaseError(f"--root {root}: cannot be looked at: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ReleaseError(f"{flag} {root}: is a symlink; give the real directory (releases are never switched "
                           "through a symlink)")
    if not stat.S_ISDIR(st.st_mode):
        raise ReleaseError(f"{flag} {root}: not a directory")
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise ReleaseError(f"{flag} {root}: cannot open: {exc.strerror or exc}") from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid():
        problem = (f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()}): its owner could swap releases. "
                   "Fix: run as the root's owner (root on a host)")
    elif st.st_mode & 0o022:
        problem = (f"mode {stat.S_IMODE(st.st_mode):04o} lets other users write in it. "
                   f"Fix: chmod go-w {root}")
    if problem:
        os.close(fd)
        raise ReleaseError(f"{flag} {root}: {problem}")
    return fd


def _unsafe_owner(st: os.stat_result) -> str | None:
    """Why a release file or directory could be changed by someone other than its owner (us), or None."""
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by you (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"mode {stat.S_IMODE(st.st_mode):04o} lets other users write it"
    return None


def _read_file(dir_fd: int, name: str, shown: str, limit: int = MAX_FILE_BYTES, mode: str | None = None) -> bytes:
    """A regular file of at most ``limit`` bytes under ``dir_fd``, opened without following a
    symlink and without blocking on a FIFO. With ``mode`` (a release file's manifest mode, such
    as ``"0644"``) the file must have exactly that mode, be ours and be writable by nobody else:
    systemd reads the unit through ``current`` on every daemon-reload, so a file others may write
    is someone else's unit."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ReleaseError(f"{shown}: is a symlink; release files are never read through one") from None
        raise ReleaseError(f"{shown}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ReleaseError(f"{shown}: not a regular file")
        if mode is not None:
            why = _unsafe_owner(st)
            if why is None and (not isinstance(mode, str) or not re.fullmatch(r"0?[0-7]{3}", mode)
                                or stat.S_IMODE(st.st_mode) != int(mode, 8)):
                why = f"mode {stat.S_IMODE(st.st_mode):04o}, the manifest says {_shown(mode, 20)}"
            if why:
                raise ReleaseError(f"{shown}: {why}; a release file must be as installed. Fix: deploy again")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise ReleaseError(f"{shown}: larger than {limit} bytes; not a release file")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_current(root_fd: int, root: Path) -> str | None:
    """The id ``current`` points at, or None when there is no ``current``.

    Raises:
        ReleaseError: ``current`` is no symlink, or points anywhere but one id inside the root.
    """
    try:
        st = os.stat(CURRENT, dir_fd=root_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISLNK(st.st_mode):
        raise ReleaseError(f"{root}/{CURRENT}: not a symlink (a {stat.filemode(st.st_mode)[0]} entry); remove it "
                           "and activate a release")
    target = os.readlink(CURRENT, dir_fd=root_fd)
    if not ID_RE.fullmatch(target):
        raise ReleaseError(f"{root}/{CURRENT} -> {_shown(target)}: points outside the release root or at no release "
                           f"id (it must name one <id> directory inside {root}); refusing to follow it. Fix: "
                           "`ddtree-ops release activate --id <id>` with an id from `release list`")
    return target


def read_history(root_fd: int, root: Path) -> list[str]:
    """The activation history (ids, newest last; duplicates keep their last place).

    Raises:
        ReleaseError: the file is no regular file or holds a line that is no id.
    """
    try:
        raw = _read_file(root_fd, HISTORY, f"{root}/{HISTORY}")
    except FileNotFoundError:
        return []
    out: dict[str, None] = {}  # insertion-ordered: linear in the file's lines, however many (up to its byte cap)
    for n, line in enumerate(raw.decode("utf-8", "replace").split("\n"), 1):
        if not line.strip():
            continue
        if not ID_RE.fullmatch(line.strip()):
            raise ReleaseError(f"{root}/{HISTORY} line {n} = {_shown(line)}: not a release id. Fix: remove the file "
                               "(the next activation starts a new history)")
        rid = line.strip()
        out.pop(rid, None)
        out[rid] = None
    return list(out)


def _write_history(root_fd: int, ids: list[str]) -> None:
    data = "".join(f"{i}\n" for i in ids[-MAX_HISTORY:]).encode()
    tmp = f".{HISTORY}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=root_fd)
    try:
        os.fchmod(fd, 0o644)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=root_fd)
        raise
    os.close(fd)
    os.replace(tmp, HISTORY, src_dir_fd=root_fd, dst_dir_fd=root_fd)


def release_ids(root_fd: int) -> list[str]:
    """Names in the root that are ids and real directories (symlinks and other names ignored), sorted."""
    out = []
    for name in os.listdir(root_fd):
        if ID_RE.fullmatch(name):
            try:
                st = os.stat(name, dir_fd=root_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                out.append(name)
    return sorted(out)


def verify(root_fd: int, root: Path, rid: str) -> dict:
    """Check release ``rid`` is complete and unchanged (see the module docstring); its manifest.

    Raises:
        ReleaseError: what is wrong, naming the file.
    """
    check_id(rid)
    where = f"{root}/{rid}"
    try:
        dfd = os.open(rid, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except FileNotFoundError:
        raise ReleaseError(f"release {rid}: no directory {where} (never installed here, or pruned); "
                           "`ddtree-ops release list` shows what is there") from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ReleaseError(f"{where}: a symlink or not a directory; a release is a real directory inside "
                               f"{root}. Fix: remove it and deploy again") from None
        raise
    try:
        why = _unsafe_owner(os.fstat(dfd))
        if why:
            raise ReleaseError(f"{where}: {why}; its files could be swapped after this check. Fix: deploy again")
        try:
            raw = _read_file(dfd, MANIFEST, f"{where}/{MANIFEST}", mode=MANIFEST_MODE)
        except FileNotFoundError:
            raise ReleaseError(f"{where}/{MANIFEST}: missing (an interrupted install?). Fix: deploy again") from None
        try:
            doc = json.loads(raw)
            entries, ident, fmt = doc["files"], doc["identity"], doc["format"]
            if fmt != FORMAT or not isinstance(entries, list) or not isinstance(ident, dict) or not entries:
                raise ValueError(f"format {fmt!r}, {len(entries) if isinstance(entries, list) else 0} files")
        except (ValueError, KeyError, TypeError, RecursionError) as exc:
            raise ReleaseError(f"{where}/{MANIFEST}: not a release manifest of format {FORMAT} "
                               f"({_shown(str(exc), 120)}). Fix: deploy again") from None
        seen = set()
        for e in entries:
            name = e.get("name") if isinstance(e, dict) else None
            if (not isinstance(name, str) or "/" in name or name in (".", "..", MANIFEST, "") or "\0" in name
                    or name in seen):
                raise ReleaseError(f"{where}/{MANIFEST}: file name {_shown(name)} is not one plain name inside the "
                                   "release. Fix: deploy again")
            seen.add(name)
            try:
                data = _read_file(dfd, name, f"{where}/{name}", mode=e.get("mode"))
            except FileNotFoundError:
                raise ReleaseError(f"{where}/{name}: missing (an interrupted install?). Fix: deploy again") from None
            if hashlib.sha256(data).hexdigest() != e.get("sha256"):
                raise ReleaseError(f"{where}/{name}: changed since it was installed (sha256 differs from the "
                                   f"manifest). Fix: deploy again; never edit a release in place")
        try:
            key = compute_id(entries, ident)
        except (RecursionError, ValueError, TypeError):  # nested deeper than the encoder goes, or no JSON value
            key = None
        if key != rid or doc.get("id") != rid:
            raise ReleaseError(f"{where}/{MANIFEST}: its content key is not {rid} (a manifest of another release, "
                               "or edited). Fix: deploy again")
        return doc
    finally:
        os.close(dfd)


def _switch(root_fd: int, rid: str) -> None:
    """Point ``current`` at ``rid`` atomically (symlink under a temporary name, then rename)."""
    tmp = f".{CURRENT}.{secrets.token_hex(6)}.tmp"
    os.symlink(rid, tmp, dir_fd=root_fd)
    try:
        os.replace(tmp, CURRENT, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    except OSError:
        os.unlink(tmp, dir_fd=root_fd)
        raise
    os.fsync(root_fd)


def prune(root_fd: int, root: Path, keep: int, current: str | None, history: list[str],
          failed: dict[str, str] | None = None) -> list[str]:
    """Remove releases beyond the prune rule (module docstring); the ids removed, sorted.

    Never removes ``current``, nor the newest ``keep`` other ids of ``history`` (so never the
    previous one: ``keep >= 1``). A release that cannot be removed (an immutable file, a
    read-only mount) is left and recorded in ``failed`` (id -> why) when given, else raises
    :class:`ReleaseError`; it never undoes the switch that came before."""
    import shutil

    if not 1 <= keep <= KEEP_MAX:
        raise ReleaseError(f"--keep {keep}: must be 1..{KEEP_MAX} (ddtree_service.keep_releases)")
    others = [i for i in history if i != current]
    kept = set(others[-keep:]) | ({current} if current else set())
    removed = []
    for rid in release_ids(root_fd):
        if rid in kept:
            continue
        # rmtree with dir_fd never follows a symlink inside (shutil's fd-based walk)
        try:
            shutil.rmtree(rid, dir_fd=root_fd)
        except OSError as exc:
            why = f"{exc.filename or rid}: {exc.strerror or exc}"
            if failed is None:
                raise ReleaseError(f"{root}/{rid}: cannot be pruned ({_shown(why, 160)})") from None
            failed[rid] = why
            continue
        removed.append(rid)
    return removed


# --- the operations -------------------------------------------------------------------------

def list_releases(root: Path) -> dict:
    """``{root, current, previous, history, releases: [{id, current, in_history}]}``."""
    fd = open_root(root)
    try:
        current = read_current(fd, root)
        history = read_history(fd, root)
        others = [i for i in history if i != current]
        ids = release_ids(fd)
        in_history = set(history)
        return {"root": str(root), "current": current, "previous": others[-1] if others else None,
                "history": history,
                "releases": [{"id": i, "current": i == current, "in_history": i in in_history,
                              "sglang_build": _build_or_none(fd, root, i)} for i in ids]}
    except OSError as exc:
        raise _os_failure(root, "listing", exc) from None
    finally:
        os.close(fd)


LOCK_WAIT_S = 30.0
"""Longest wait for another activate/rollback on the same root to finish (total, seconds)."""


def _lock(root_fd: int, root: Path, wait_s: float | None = None) -> None:
    """Take the root's exclusive lock (``flock`` on the root's own descriptor; released when it
    is closed), so two activates/rollbacks never interleave their switch, history and prune.

    Raises:
        ReleaseError: another operation held it for ``wait_s`` seconds."""
    import fcntl

    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    end = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(root_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= end:
                raise ReleaseError(f"{root}: another release activate/rollback has held it for {wait_s:g} s; "
                                   "nothing changed. Fix: wait for it to finish (a deploy or fleet rollback in "
                                   "progress), then run again") from None
            time.sleep(0.05)


def _os_failure(root: Path, what: str, exc: OSError) -> ReleaseError:
    where = exc.filename if isinstance(exc.filename, str) and exc.filename else str(root)
    return ReleaseError(f"{root}: {what} failed at {_shown(where, 120)}: {exc.strerror or exc} (see `release list`; "
                        "current is switched atomically, so it names the old or the new release)")


def activate(root: Path, rid: str, keep: int = 3) -> dict:
    """Make ``rid`` (already installed under ``root``) the current release; prune.

    Returns:
        ``{root, id, from, changed, pruned}``; ``changed`` False when it already was current.

    Raises:
        ReleaseError: a bad id, root, ``current`` or release (see :func:`verify`).
    """
    check_id(rid)
    fd = open_root(root)
    try:
        _lock(fd, root)
        old = read_current(fd, root)
        history = read_history(fd, root)
        verify(fd, root, rid)
        if old is not None and (not history or history[-1] != old):
            history = [i for i in history if i != old] + [old]  # a current that predates the history file
        changed = old != rid
        if changed:
            _switch(fd, rid)
        history = [i for i in history if i != rid] + [rid]
        _write_history(fd, history)
        failed: dict[str, str] = {}
        pruned = prune(fd, root, keep, rid, history, failed)
        return {"root": str(root), "id": rid, "from": old, "changed": changed, "pruned": pruned,
                "prune_failed": failed}
    except OSError as exc:
        raise _os_failure(root, "activate", exc) from None
    finally:
        os.close(fd)


def rollback(root: Path, keep: int = 3) -> dict:
    """Switch ``current`` back to the release activated before it; the rolled-back release
    leaves the history (a second rollback goes one further back) and is pruned later.

    Returns:
        ``{root, from, to, changed, pruned}``.

    Raises:
        ReleaseError: no current or no previous release still on disk, or a bad root or release.
    """
    fd = open_root(root)
    try:
        _lock(fd, root)
        current = read_current(fd, root)
        if current is None:
            raise ReleaseError(f"{root}: no current release; nothing to roll back (deploy first)")
        history = [i for i in read_history(fd, root) if i != current]
        on_disk = set(release_ids(fd))
        candidates = [i for i in history if i in on_disk]
        if not candidates:
            raise ReleaseError(f"{root}: no previous release on disk to roll back to (current {current}; history "
                               f"{history[-5:] or 'empty'}). Fix: deploy the previous configuration")
        target = candidates[-1]
        verify(fd, root, target)
        _switch(fd, target)
        history = history[:history.index(target) + 1]
        _write_history(fd, history)
        failed: dict[str, str] = {}
        pruned = prune(fd, root, keep, target, history + [current], failed)  # the rolled-back one stays until next
        return {"root": str(root), "from": current, "to": target, "changed": True, "pruned": pruned,
                "prune_failed": failed}
    except OSError as exc:
        raise _os_failure(root, "rollback", exc) from None
    finally:
        os.close(fd)


# --- the rolling upgrade's inputs -----------------------------------------------------------

GATE_DEADLINE_MAX_S = 3600.0
"""Longest ``release gate --deadline`` (and ``rolling_gate_deadline_s``), seconds."""
GATE_HEALTH_SHARE = 0.5
"""Share of the gate's deadline its health checks may take when their configured timeouts would
not fit (:func:`gate_health_options`); the synthetic load gets the rest."""
GATE_HEALTH_PROBE_SHARE = 0.5
"""Share of the health checks' request time (their share of the deadline less the local-work
allowances and the progress window) that the ``/health`` probe gets when the configured timeouts
do not fit (:func:`gate_health_options`): ``/health`` runs a 1-token generation (SGLang's own
health timeout is 20 s: ``HEALTH_CHECK_TIMEOUT``, ``http_server.py`` 0.5.13.post1 .. 0.5.23,
``sglang.health_probe.DEFAULT_HEALTH_CHECK_TIMEOUT_S``), the other requests (``/server_info``
twice, ``/metrics`` twice) read state, so an equal split gave ``/health`` 0.39 s of an 8 s deadline."""
GATE_MIN_TIMEOUT_S = 0.2
"""Shortest per-request timeout the gate's health checks are cut to: below it no real server
answers ``/health`` (which generates a token)."""
GATE_DEADLINE_MIN_S = 6.0
"""Shortest ``release gate --deadline`` (and ``rolling_gate_deadline_s``), seconds: the one where
:func:`gate_health_options` still gives every health request :data:`GATE_MIN_TIMEOUT_S` in its
share (health's ``bound_s``: 5 requests of timeout + 0.25 s local work and one progress window of
a tenth of the deadline, i.e. 5.6 s; at 6 s ``/health`` gets 0.35 s, the others 0.2 s; a test recomputes it).
A shorter deadline cannot be honoured, so it is refused before anything runs instead of being overrun."""
ROLLING_DEFAULTS: dict[str, Any] = {"rolling_batches": [1, "50%"], "rolling_max_fail_percentage": 0,
                                    "rolling_gate_deadline_s": 120, "rolling_router_deadline_s": 60,
                                    "rolling_router_in_flight_s": 5}
"""``playbooks/rolling.yml``'s defaults (its second play's ``vars``; a test keeps them equal)."""
ROLLING_BATCH_MAX = 10_000
"""Largest batch given as a host count (and most batches listed)."""
_PERCENT_RE = re.compile(r"^([0-9]{1,3})%$")


def _rolling_value(name: str, value: Any, rule: str) -> ReleaseError:
    return ReleaseError(f"{name} = {_shown(value)}: {rule} (playbooks/rolling.yml; README \"Rolling upgrades and "
                        "rollback\"). Fix: pass it with -e as JSON, e.g. -e '{\"rolling_batches\": [1, \"50%\"], "
                        "\"rolling_max_fail_percentage\": 0, \"rolling_gate_deadline_s\": 120}'")


def _plain_number(value: Any) -> float | None:
    """``value`` as a finite number when it is one (int/float, or a string of digits), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,6})?", value.strip()):
        return float(value)
    return None


def rolling_settings(values: dict[str, Any]) -> dict[str, Any]:
    """Check ``playbooks/rolling.yml``'s inputs before anything changes (its first play).

    Args:
        values: ``rolling_batches``, ``rolling_max_fail_percentage``, ``rolling_gate_deadline_s``
            as Ansible holds them (raw: a Jinja expression is refused, not evaluated); a missing
            one takes :data:`ROLLING_DEFAULTS`.

    Rules (Ansible's ``serial`` reads ``0``, a negative count and a percentage above 100 as
    "every host at once", which would skip the canary):

    * ``rolling_batches``: a batch, or a list of 1..100 batches; a batch is a host count
      1..:data:`ROLLING_BATCH_MAX` or a percentage ``"N%"`` with N 1..100;
    * ``rolling_max_fail_percentage``: a number 0..100;
    * ``rolling_gate_deadline_s``: seconds, a number > 0 and <= :data:`GATE_DEADLINE_MAX_S`
      (``release gate --deadline``'s bound);
    * ``rolling_router_deadline_s``: seconds 1..:data:`GATE_DEADLINE_MAX_S`, the total deadline of
      each drain and re-add of a host at a router (``router_worker --deadline``);
    * ``rolling_router_in_flight_s``: seconds 0.. ``rolling_router_deadline_s``, the wait after a
      drained worker left the router for requests still running on it (``--in-flight-s``: smg's
      drain settle window is a fixed delay, not a wait for in-flight requests).

    Returns:
        The values, normalised (batches a list; counts ints; percentages strings).

    Raises:
        ReleaseError: the first value that breaks its rule (one line: name, value, rule, fix).
    """
    v = {k: values[k] if values.get(k) is not None else d for k, d in ROLLING_DEFAULTS.items()}
    for name, value in v.items():
        if any("{{" in str(x) or "{%" in str(x) for x in (value if isinstance(value, list) else [value])):
            raise _rolling_value(name, value, "a Jinja expression; rollout settings are plain values")
    raw = v["rolling_batches"]
    items = raw if isinstance(raw, list) else [raw]
    if not items or len(items) > 100:
        raise _rolling_value("rolling_batches", raw, "must be a batch or a list of 1..100 batches")
    batches: list[int | str] = []
    for item in items:
        m = _PERCENT_RE.match(item.strip()) if isinstance(item, str) else None
        n = _plain_number(item)
        if m and 1 <= int(m.group(1)) <= 100:
            batches.append(f"{int(m.group(1))}%")
        elif n is not None and n == int(n) and 1 <= n <= ROLLING_BATCH_MAX:
            batches.append(int(n))
        else:
            raise _rolling_value("rolling_batches", raw, f"each batch must be a host count 1..{ROLLING_BATCH_MAX} "
                                 "or a percentage \"1%\"..\"100%\" (0, a negative count or more than 100% is "
                                 "every host at once to Ansible: no canary)")
    fail = _plain_number(v["rolling_max_fail_percentage"])
    if fail is None or not 0 <= fail <= 100:
        raise _rolling_value("rolling_max_fail_percentage", v["rolling_max_fail_percentage"],
                             "must be a number 0..100 (percent of a batch that may fail before the rollout stops)")
    deadline = _plain_number(v["rolling_gate_deadline_s"])
    if deadline is None or not GATE_DEADLINE_MIN_S <= deadline <= GATE_DEADLINE_MAX_S:
        raise _rolling_value("rolling_gate_deadline_s", v["rolling_gate_deadline_s"],
                             f"must be seconds > 0 and <= {GATE_DEADLINE_MAX_S:g} (release gate --deadline), and "
                             f"at least {GATE_DEADLINE_MIN_S:g} (the health checks and one request must fit)")
    router = _plain_number(v["rolling_router_deadline_s"])
    if router is None or not 1 <= router <= GATE_DEADLINE_MAX_S:
        raise _rolling_value("rolling_router_deadline_s", v["rolling_router_deadline_s"],
                             f"must be seconds 1..{GATE_DEADLINE_MAX_S:g} (each drain or re-add at a router)")
    in_flight = _plain_number(v["rolling_router_in_flight_s"])
    if in_flight is None or not 0 <= in_flight <= router:
        raise _rolling_value("rolling_router_in_flight_s", v["rolling_router_in_flight_s"],
                             f"must be seconds 0..{router:g} (rolling_router_deadline_s: the wait for requests "
                             "still running on a drained worker fits in the drain's deadline)")
    return {"rolling_batches": batches, "rolling_max_fail_percentage": fail,
            "rolling_gate_deadline_s": deadline, "rolling_router_deadline_s": router,
            "rolling_router_in_flight_s": in_flight}


# --- SGLang builds the releases run ---------------------------------------------------------

IN_USE = ".in-use"
"""Directory inside a builds directory: one record per release root (``<sha256(root)[:16]>.json``:
``{"root", "builds"}``) of the builds that root's releases ran at its last prune, so instances
of one machine that share an SGLang venv never remove each other's builds."""


def release_build(root_fd: int, root: Path, rid: str) -> str | None:
    """``identity.sglang_build`` of release ``rid``'s manifest: the SGLang build directory its
    unit runs (:func:`ddtree_ops.render.argv.sglang_build_path`), or None (a simulator
    release, or one rendered before builds were pinned: it runs whatever ``sglang_venv`` points at).

    Raises:
        ReleaseError: the release directory or its manifest cannot be read as a release.
    """
    check_id(rid)
    where = f"{root}/{rid}"
    try:
        dfd = os.open(rid, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    except OSError as exc:
        raise ReleaseError(f"{where}: cannot be opened as a release directory ({exc.strerror or exc})") from None
    try:
        raw = _read_file(dfd, MANIFEST, f"{where}/{MANIFEST}")
        doc = json.loads(raw)
        build = doc["identity"].get("sglang_build")
    except FileNotFoundError:
        raise MissingManifest(f"{where}/{MANIFEST}: missing") from None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise ReleaseError(f"{where}/{MANIFEST}: not a release manifest") from None
    finally:
        os.close(dfd)
    if build is None:
        return None
    if not isinstance(build, str) or not build.startswith("/") or "\0" in build or len(build) > 4096:
        raise ReleaseError(f"{where}/{MANIFEST}: identity.sglang_build = {_shown(build)} is no absolute path")
    return os.path.normpath(build)


def _build_or_none(root_fd: int, root: Path, rid: str) -> str | None:
    try:
        return release_build(root_fd, root, rid)
    except ReleaseError:
        return None


def _in_use_records(builds_fd: int, builds: Path, own: str) -> tuple[set[str], list[str]]:
    """Build names the other release roots' records hold, and those records' roots."""
    from ..config.build_id import BUILD_RE

    names: set[str] = set()
    roots: list[str] = []
    try:
        rfd = os.open(IN_USE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=builds_fd)
    except FileNotFoundError:
        return names, roots
    except OSError as exc:
        raise ReleaseError(f"{builds}/{IN_USE}: not a directory ({exc.strerror or exc}). Fix: remove it") from None
    try:
        for rec in sorted(os.listdir(rfd)):
            if not re.fullmatch(r"[0-9a-f]{16}\.json", rec) or rec == own:
                continue
            shown = f"{builds}/{IN_USE}/{rec}"
            try:
                doc = json.loads(_read_file(rfd, rec, shown, 1 << 20))
                listed, root = doc["builds"], doc["root"]
                if not isinstance(listed, list) or not all(isinstance(n, str) and BUILD_RE.fullmatch(n)
                                                           for n in listed) or not isinstance(root, str):
                    raise ValueError
            except (ValueError, KeyError, TypeError, RecursionError):
                raise ReleaseError(f"{shown}: not a record of builds in use; cannot tell which builds another "
                                   f"instance runs, so none is removed. Fix: remove {shown} (its instance "
                                   "records it again at its next deploy)") from None
            names.update(listed)
            roots.append(root)
    finally:
        os.close(rfd)
    return names, roots


def _write_record(builds_fd: int, root: Path, names: list[str]) -> None:
    """This root's record of the builds its releases run (atomically: temp file + rename)."""
    try:
        os.mkdir(IN_USE, 0o755, dir_fd=builds_fd)
    except FileExistsError:
        pass
    rfd = os.open(IN_USE, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=builds_fd)
    try:
        name = hashlib.sha256(str(root).encode()).hexdigest()[:16] + ".json"
        data = json.dumps({"root": str(root), "builds": names}, indent=1, allow_nan=False).encode()
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=rfd)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=rfd, dst_dir_fd=rfd)
    finally:
        os.close(rfd)


def prune_builds(root: Path, builds: Path, keep: list[str] | tuple[str, ...] = ()) -> dict:
    """Remove the SGLang builds under ``builds`` (``<sglang_venv>.builds``) that no release
    keeps: a build stays when a release under ``root`` runs it (:func:`release_build`), when
    it is named in ``keep`` (the build just installed), or when another release root's record
    in ``builds/.in-use/`` names it (:data:`IN_USE`; this root's record is rewritten here).
    Only real directories whose name has the shape of a build
    (:data:`ddtree_ops.config.build_id.BUILD_RE`) are ever removed; a missing ``root`` has no
    releases; a missing ``builds`` nothing to remove.

    Returns:
        ``{root, builds, in_use, removed, changed, other_roots}`` (names sorted).

    Raises:
        ReleaseError: a bad ``keep`` name, an unsafe root or builds directory (:func:`open_root`),
            a release or record that cannot be read (nothing is removed then). A release directory
            that is neither current nor in the history and has no manifest yet (an install cut off
            before its manifest was copied) is skipped: it runs no build.
    """
    import shutil

    from ..config.build_id import BUILD_RE

    for k in keep:
        if not BUILD_RE.fullmatch(k):
            raise ReleaseError(f"--keep {_shown(k)}: not an SGLang build name (cpXY-<16 hex>-<12 hex>, as "
                               "ddtree_ops.config.build_id.build_name makes it)")
    base = os.path.normpath(str(builds))
    in_use = set(keep)
    if os.path.lexists(root):
        fd = open_root(root)
        try:
            live = {read_current(fd, root), *read_history(fd, root)}
            for rid in release_ids(fd):
                try:
                    b = release_build(fd, root, rid)
                except MissingManifest:
                    # A directory never activated whose manifest is missing is an install that was
                    # cut off (the deploy killed while copying the release's files): it runs no build,
                    # and the re-run's install completes it. Refusing here would stop every re-run
                    # before that install, so the host could never be repaired by deploying again.
                    if rid not in live:
                        continue
                    raise
                if b is not None and os.path.dirname(b) == base:
                    in_use.add(os.path.basename(b))
        finally:
            os.close(fd)
    result = {"root": str(root), "builds": base, "in_use": sorted(in_use), "removed": [], "changed": False,
              "other_roots": []}
    if not os.path.lexists(builds):
        return result
    bfd = open_root(builds, "--builds")
    try:
        own = hashlib.sha256(str(root).encode()).hexdigest()[:16] + ".json"
        others, roots = _in_use_records(bfd, builds, own)
        _write_record(bfd, root, sorted(in_use))
        removed = []
        for name in sorted(os.listdir(bfd)):
            if not BUILD_RE.fullmatch(name) or name in in_use or name in others:
                continue
            st = os.stat(name, dir_fd=bfd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                continue
            shutil.rmtree(name, dir_fd=bfd)  # fd-based walk: never follows a symlink inside
            removed.append(name)
    finally:
        os.close(bfd)
    result.update(removed=removed, changed=bool(removed), other_roots=roots, in_use=sorted(in_use | others))
    return result


# --- the gate -------------------------------------------------------------------------------

GATE_MAX_NEW_TOKENS = 64
"""Tokens per request of the gate's synthetic load (short: the gate measures acceptance, not speed)."""


@dataclass(frozen=True)
class GateOptions:
    """The gate's load and bound.

    Attributes:
        deadline_s: total seconds for the whole gate (health checks + load).
        requests: requests of the synthetic load.
        concurrency: requests in flight.
        max_new_tokens: tokens per request.
    """

    deadline_s: float = 120.0
    requests: int = 16
    concurrency: int = 4
    max_new_tokens: int = GATE_MAX_NEW_TOKENS


def floor_check(acc: float, floor: float) -> dict:
    """The gate's ``accept_length_floor`` check for a measured acceptance length ``acc`` (tokens
    per verify pass) against ``floor`` (``ddtree_ops.accept_length_floor``): ``{name, ok, detail}``."""
    return {"name": "accept_length_floor", "ok": acc >= floor,
            "detail": f"acceptance length {acc:.2f} {'>=' if acc >= floor else '<'} the floor "
                      f"{floor:g} (ddtree_ops.accept_length_floor)"}


def gate_health_options(base: Any, deadline_s: float) -> Any:
    """``base`` (:class:`~ddtree_ops.runtime.health.HealthOptions`) when its ``bound_s`` fits in
    :data:`GATE_HEALTH_SHARE` of ``deadline_s``, else the same checks with the progress window cut
    to a tenth of the deadline (at most its own), the ``/health`` probe capped (``health_cap_s``) and
    the other requests' timeout solved from ``bound_s`` (linear in both) so the bound is exactly the
    share: of the request time left in the share (less the local-work allowances and the window),
    ``/health`` gets :data:`GATE_HEALTH_PROBE_SHARE` and the other requests split the rest, each at
    least :data:`GATE_MIN_TIMEOUT_S` (``/health`` then gets what remains, never less than they do).
    ``--deadline 8`` gives ``/health`` 0.98 s and the others 0.24 s each (an equal split gave every
    request 0.39 s); the minimum deadline (:data:`GATE_DEADLINE_MIN_S`, 6 s) 0.35 s and 0.2 s; 20 s:
    3.9 s and 0.97 s (the gate's own checks: one probe, a 1 s progress window). No floor that would
    overrun the deadline: below the minimum the timeouts are what fits (``tests/test_gate_deadline.py``
    recomputes these figures)."""
    from dataclasses import replace

    from ..runtime.health import bound_s

    share = deadline_s * GATE_HEALTH_SHARE
    if bound_s(base) <= share:
        return base
    window = min(base.progress_window_s, deadline_s / 10)

    def bound(timeout: float, cap: float) -> float:
        return bound_s(replace(base, timeout=timeout, progress_window_s=window, health_cap_s=cap))

    # bound = fixed + per_cap * cap + per_timeout * timeout (the /health probe's deadline, SGLang's own
    # health timeout and more, 23 s by default, is cut to the cap: the gate's deadline must hold)
    b11 = bound(1.0, 1.0)
    per_timeout, per_cap = bound(2.0, 1.0) - b11, bound(1.0, 2.0) - b11
    request_time = max(share - (b11 - per_timeout - per_cap), 0.0)
    timeout = max(GATE_MIN_TIMEOUT_S, request_time * (1 - GATE_HEALTH_PROBE_SHARE) / per_timeout)
    cap = (request_time - per_timeout * timeout) / per_cap
    if cap < timeout:  # too short to favour /health: every request gets the same
        timeout = cap = request_time / (per_timeout + per_cap)
    return replace(base, timeout=max(timeout, 0.01), progress_window_s=window, health_cap_s=max(cap, 0.01))


def gate(plan_doc: PlanDoc | dict[str, Any], url: str, o: GateOptions) -> tuple[list[dict], dict]:
    """The rolling upgrade's per-host gate, all within ``o.deadline_s``:

    1. ``ddtree-ops health`` with the deployed plan (drift) and the unit's warm marker
       (``paths.warm_marker`` of plan.json): every check must pass;
    2. a short synthetic load (:func:`ddtree_ops.runtime.bench.run_async`: ``o.requests`` requests
       at ``o.concurrency``, ``o.max_new_tokens`` tokens each), every request answered;
    3. the load's acceptance length (per request ``meta_info``, else the server's counters)
       at least ``deployment.ops.accept_length_floor`` (:class:`ddtree_ops.config.service_models.Ops`)
       when the deployment speculates, and at most ``plan.verify_tokens_per_req`` (a verify
       pass cannot accept more tokens than it verifies: :class:`ddtree_ops.config.plan.Plan`), so
       a server whose counts are impossible fails rather than passes.

    Returns:
        ``(checks, extra)``: the checks (``{name, ok, detail}``) and ``{accept_length, floor, elapsed_s}``.
        Never raises for server faults.
    """
    import asyncio

    from ..config.plandoc_model import as_plan_doc
    from ..runtime.bench import BenchOptions, load_prompts, run_async
    from ..runtime.health import HealthOptions, check_health

    t0 = time.monotonic()
    plan_doc = as_plan_doc(plan_doc)  # the typed contract (PlanDocError for a document that breaks it)
    ops = plan_doc.deployment.ops
    floor = float(ops.accept_length_floor)
    speculative = plan_doc.plan.algorithm != "none"
    marker = (plan_doc.document.get("paths") or {}).get("warm_marker")  # not a typed field: read as written
    if not isinstance(marker, str) or not marker.startswith("/") or "\0" in marker:
        marker = None
    ho = HealthOptions(timeout=float(ops.health_timeout_s), failures=1, interval_s=0.5,
                       progress_window_s=1.0, plan_doc=plan_doc, warm_marker=Path(marker) if marker else None)
    ho = gate_health_options(ho, o.deadline_s)
    checks = [c.as_dict() for c in check_health(url, options=ho)]
    extra: dict[str, Any] = {"accept_length": None, "floor": floor if speculative else None}
    if not all(c["ok"] for c in checks):
        extra["elapsed_s"] = round(time.monotonic() - t0, 3)
        return checks, extra
    left = o.deadline_s - (time.monotonic() - t0)
    try:
        if left <= 0:
            raise TimeoutError
        bo = BenchOptions(url=url, concurrency=(o.concurrency,), requests=o.requests,
                          max_new_tokens=o.max_new_tokens, warmup_requests=0, request_timeout_s=left)
        # run_async cuts every request and side deadline to the time left (deadline_s); wait_for is
        # the guard for the teardown
        result = asyncio.run(asyncio.wait_for(run_async(bo, load_prompts(None), deadline_s=left),
                                              timeout=left + 0.25))
    except TimeoutError:
        checks.append({"name": "load", "ok": False, "detail": f"the synthetic load ({o.requests} requests at "
                       f"concurrency {o.concurrency}) did not finish within the gate's {o.deadline_s:g} s"})
        extra["elapsed_s"] = round(time.monotonic() - t0, 3)
        return checks, extra
    except Exception as exc:  # noqa: BLE001 - a misbehaving server is a failed check, never a crash
        checks.append({"name": "load", "ok": False, "detail": f"the synthetic load failed: {_shown(str(exc), 200)}"})
        extra["elapsed_s"] = round(time.monotonic() - t0, 3)
        return checks, extra
    lv = result.levels[0]
    first = next(iter(lv.errors), "")
    checks.append({"name": "load", "ok": lv.failed == 0,
                   "detail": f"{lv.ok}/{lv.requests} requests answered in {lv.wall_s:.2f} s "
                             f"({lv.output_tok_s:.0f} tok/s)" + (f"; first error: {first}" if lv.failed else "")})
    acc = lv.accept_length if lv.accept_length is not None else lv.accept_length_server
    extra["accept_length"] = acc
    if speculative:
        if acc is None:
            checks.append({"name": "accept_length_floor", "ok": False,
                           "detail": "the server reported no acceptance length under load (speculative decoding "
                                     "off or broken)"})
        elif not acc <= (ceiling := float(plan_doc.plan.verify_tokens_per_req)):
            checks.append({"name": "accept_length_floor", "ok": False,
                           "detail": f"acceptance length {acc:.2f} is impossible: a verify pass checks "
                                     f"{ceiling:g} tokens per request (plan.verify_tokens_per_req) and cannot "
                                     "accept more; the server's counts (meta_info spec_verify_ct, or its "
                                     "/metrics counters) are wrong"})
        else:
            checks.append(floor_check(acc, floor))
    extra["elapsed_s"] = round(time.monotonic() - t0, 3)
    return checks, extra


# --- standard-library entry point (the SGLang build's venv has no typer) ---------------------

def main(argv: list[str] | None = None) -> int:
    """``python -m ddtree_ops.host.release prune-builds --root R --builds B [--keep NAME ...]``:
    :func:`prune_builds`, one JSON object on stdout as ``--json`` everywhere (``{"ok", "checks",
    ...}``). The ``sglang`` role runs it with the python of the build it just installed, so the
    code that decides is the code of this deploy, whatever ops venv the host has. Exit 0 ok,
    1 refused (one line: what, the rule, the fix), 2 usage."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m ddtree_ops.host.release")
    sub = ap.add_subparsers(dest="cmd", required=True)
    pb = sub.add_parser("prune-builds", help="remove SGLang builds no release runs")
    pb.add_argument("--root", type=Path, required=True, help="the release root, {config_dir}/releases")
    pb.add_argument("--builds", type=Path, required=True, help="<sglang_venv>.builds")
    pb.add_argument("--keep", action="append", default=[], help="a build name to keep (repeatable)")
    args = ap.parse_args(argv)
    try:
        res = prune_builds(args.root, args.builds, tuple(args.keep))
        what = f"removed {', '.join(res['removed'])}" if res["removed"] else "nothing to remove"
        check = {"name": "release-prune-builds", "ok": True, "detail": f"{what}; in use: {', '.join(res['in_use'])}"}
        out, rc = {"ok": True, "checks": [check], **res}, 0
    except (ReleaseError, OSError) as exc:
        detail = str(exc) if isinstance(exc, ReleaseError) else f"{args.builds}: {exc.strerror or exc}"
        out = {"ok": False, "checks": [{"name": "release-prune-builds", "ok": False, "detail": detail}],
               "root": str(args.root), "builds": str(args.builds)}
        rc = 1
    sys.stdout.write(json.dumps(out, indent=2, allow_nan=False) + "\n")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
