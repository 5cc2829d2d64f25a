"""The one safe writer of every file ddtree-ops writes: ``render --out``, the results of
``bench`` / ``bench-compare`` / ``sweep`` (JSON, CSV, Markdown, plots, deploy logs), the warm
marker. It lives in :mod:`ddtree_ops._core` (stdlib only) so the runtime tools on the hosts use
the same rules as render on the controller; :func:`write_file` writes one file into its own
directory under them.

Every file is created atomically with its final mode: a temporary file in the target
directory opened with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (so no existing file or symlink is
ever opened), ``fchmod`` to the mode before any byte is written, then
``os.replace`` over the target (a symlink or a file of another user at the target is
replaced, never followed or kept). Directories are walked one component at a time with
``O_NOFOLLOW | O_DIRECTORY`` relative to the parent's descriptor, so a symlink anywhere
under OUT (even one created while we run) is refused instead of followed, and a target
path that would leave OUT (``..``, an absolute part) is refused before anything is written.

Every directory render writes into (OUT and each level below it) must be owned by us and
not writable by group or others (checked with ``fstat`` on the descriptor we then write
through): whoever can write a directory can rename our files away and put theirs in place
(secrets.env included) after we are done. Directories render creates (OUT, its missing
parents and every level below) get mode 0755 whatever the umask (``fchmod`` after
``mkdir``): under ``umask 000`` a plain ``mkdir`` would leave them 0777.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections import OrderedDict
from pathlib import Path


class UnsafeOutput(Exception):
    """The output directory or a path under it cannot be written safely (one-line message)."""


DIR_MODE = 0o755
"""Mode of every directory render creates (``fchmod``, so the umask does not matter)."""


def _check_dir_stat(st: os.stat_result, path: str, label: str = "") -> None:
    """Refuse a directory not owned by us or writable by group/others (see the module docstring)."""
    shown = f"{label}{path}"
    if st.st_uid != os.geteuid():
        raise UnsafeOutput(f"{shown}: owned by uid {st.st_uid}, not by you (uid {os.geteuid()}); another user "
                           "could swap files in it. Fix: render into a directory you own")
    if st.st_mode & 0o022:
        raise UnsafeOutput(f"{shown}: mode {stat.S_IMODE(st.st_mode):04o} lets other users write in it (they could "
                           f"swap the rendered files, secrets.env included). Fix: chmod go-w {path}, or render into "
                           "a new directory")


def check_out_dir(out_dir: Path) -> None:
    """Refuse an existing OUT that is not a directory, is a symlink, is not owned by us, or is
    writable by group or others.

    Raises:
        UnsafeOutput: with the rule and the fix.
    """
    try:
        st = os.lstat(out_dir)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeOutput(f"--out {out_dir}: is a symlink; give the real directory (render never writes through "
                           "a symlink)")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeOutput(f"--out {out_dir}: exists and is not a directory; pick a new or empty directory")
    _check_dir_stat(st, str(out_dir), "--out ")


def make_out_dir(out_dir: Path) -> None:
    """Create OUT and its missing parents, each with :data:`DIR_MODE` whatever the umask.

    Raises:
        UnsafeOutput: a component we created was replaced by a symlink or a file meanwhile.
        OSError: the file system refused.
    """
    missing: list[Path] = []
    p = Path(os.path.abspath(out_dir))
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            os.mkdir(d, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by someone else: OUT itself is checked by the caller
        fd = _open_nofollow(str(d), None, str(d))
        try:
            os.fchmod(fd, DIR_MODE)
        finally:
            os.close(fd)


def _open_nofollow(name: str, parent_fd: int | None, shown: str) -> int:
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink, or a file
            raise UnsafeOutput(f"refusing to write under {shown!r}: it is a symlink or not a directory") from None
        raise


def relative_parts(rel: str) -> list[str]:
    """The components of a path that must stay under OUT.

    Raises:
        UnsafeOutput: the path is empty, or holds ``..``, ``.`` or an empty component.
    """
    parts = rel.lstrip("/").split("/")
    if not rel.strip("/") or any(p in ("..", ".", "") or "\0" in p for p in parts):
        raise UnsafeOutput(f"refusing to write {rel!r}: the path would leave the output directory")
    return list(parts)


def _open_dir(parent_fd: int, name: str, shown: str) -> int:
    """Open (creating it 0755 if missing) directory ``name`` under ``parent_fd`` without
    following a symlink, and check it is ours and not group/other-writable.

    A directory created here gets :data:`DIR_MODE` by ``fchmod`` only when ``mkdir`` left it
    another mode (a umask such as 077 or 027, a default ACL): with the usual umask 022 it is
    0755 already and the ``fchmod`` would change nothing (one system call a directory saved,
    ~6000 at 1000 hosts). Either way ``fstat`` checks the directory opened."""
    created = False
    try:
        os.mkdir(name, DIR_MODE, dir_fd=parent_fd)
        created = True
    except FileExistsError:
        pass
    fd = _open_nofollow(name, parent_fd, shown)
    try:
        st = os.fstat(fd)
        if created and stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.fchmod(fd, DIR_MODE)
            st = os.fstat(fd)
        _check_dir_stat(st, shown)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_targets(out_dir: Path, rels: list[str]) -> None:
    """Check, before anything is written, every existing directory the files ``rels`` would be
    written into (OUT and each level below it; missing ones render creates itself): the same
    checks as :func:`write_under`, so a bad directory deep in OUT stops the render before the
    first file rather than half-way.

    Raises:
        UnsafeOutput: a path leaves OUT, or an existing directory on the way is a symlink, not a
            directory, not ours or writable by group/others.
    """
    if not os.path.lexists(out_dir):
        return
    check_out_dir(out_dir)
    tree: dict = {}  # the directories as a tree, so each existing one is opened and checked once
    for rel in rels:
        node = tree
        for name in relative_parts(rel)[:-1]:
            node = node.setdefault(name, {})
    fd = _open_nofollow(str(out_dir), None, str(out_dir))
    try:
        _check_tree(fd, tree, out_dir, ())
    finally:
        os.close(fd)


def _check_tree(fd: int, tree: dict, out_dir: Path, parts: tuple[str, ...]) -> None:
    """Check the existing directories of ``tree`` under ``fd`` (``out_dir/parts``), depth first
    in name order (the order the paths sort in); a missing one ends its branch (render creates it)."""
    for name in sorted(tree):
        shown = str(out_dir.joinpath(*parts, name))
        try:
            nfd = _open_nofollow(name, fd, shown)
        except FileNotFoundError:
            continue
        try:
            _check_dir_stat(os.fstat(nfd), shown)
            _check_tree(nfd, tree[name], out_dir, (*parts, name))
        finally:
            os.close(nfd)


class OpenDirs:
    """The directories under one OUT that :func:`write_under` opened last, kept open for the
    next files (a context manager; closes them on exit).

    Rendering 1000 hosts writes ~5000 files five directories deep; walking each path again
    from OUT cost two system calls a component (``mkdir`` + ``open``), ~40 % of ``render``
    (``scripts/bench-controller.py``). A kept descriptor is the directory opened
    (``O_NOFOLLOW``) under OUT, so a symlink swapped in later is still never followed, as with a fresh walk. At most
    :attr:`MAX_OPEN` are kept (least recently used closed first): far below the usual limit
    of 1024 open files, and files are written host by host, so the recent ones are the ones used.
    """

    MAX_OPEN = 64

    def __init__(self) -> None:
        self._fds: OrderedDict[tuple[Path, tuple[str, ...]], int] = OrderedDict()

    def get(self, out_dir: Path, parts: tuple[str, ...]) -> int | None:
        """The kept descriptor of ``out_dir/parts`` (valid until the next :meth:`keep`; not to
        be closed by the caller), or None."""
        fd = self._fds.get((out_dir, parts))
        if fd is not None:
            self._fds.move_to_end((out_dir, parts))
        return fd

    def keep(self, out_dir: Path, parts: tuple[str, ...], fd: int) -> int:
        """Keep ``fd`` (now owned by this object) as ``out_dir/parts``, closing the least
        recently used beyond :attr:`MAX_OPEN`; returns ``fd``."""
        self._fds[(out_dir, parts)] = fd
        while len(self._fds) > self.MAX_OPEN:
            os.close(self._fds.popitem(last=False)[1])
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> OpenDirs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _dir_fd(out_dir: Path, dir_parts: list[str], dirs: OpenDirs | None) -> tuple[int, bool]:
    """A descriptor of ``out_dir/dir_parts`` (created 0755 as needed, walked with ``O_NOFOLLOW``,
    each level checked by :func:`_check_dir_stat`) and whether the caller must close it (False
    when ``dirs`` keeps it)."""
    key = tuple(dir_parts)
    if dirs is not None:
        kept = dirs.get(out_dir, key)
        if kept is not None:
            return kept, False
        if key:
            parent, _ = _dir_fd(out_dir, dir_parts[:-1], dirs)
            fd = _open_dir(parent, dir_parts[-1], str(out_dir.joinpath(*dir_parts)))
            return dirs.keep(out_dir, key, fd), False
    make_out_dir(out_dir)
    check_out_dir(out_dir)
    fd = _open_nofollow(str(out_dir), None, str(out_dir))
    try:
        _check_dir_stat(os.fstat(fd), str(out_dir))
        if dirs is not None:
            return dirs.keep(out_dir, key, fd), False
        for i, name in enumerate(dir_parts):
            nfd = _open_dir(fd, name, str(out_dir.joinpath(*dir_parts[:i + 1])))
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd, True


def write_file(path: Path, content: str | bytes, mode: int = 0o644) -> Path:
    """Write one file ``path`` under the rules of :func:`write_under`, its directory as OUT
    (created 0755 with its missing parents; refused when it is a symlink, not ours or writable by
    group/others). A symlink, hard link or FIFO planted at ``path`` or at any temporary name is
    replaced or never opened, so nothing outside the directory is ever written.

    Raises:
        UnsafeOutput: the directory cannot be written safely (one line with the fix).
        OSError: the file system refused.
    """
    path = Path(path)
    if path.name in ("", ".", ".."):
        raise UnsafeOutput(f"refusing to write {str(path)!r}: not a file name")
    return write_under(path.parent, path.name, content, mode)


def write_under(out_dir: Path, rel: str, content: str | bytes, mode: int,
                dirs: OpenDirs | None = None) -> Path:
    """Write ``content`` (``str``: as UTF-8) to ``out_dir/rel`` with ``mode``, atomically and without
    following any symlink below ``out_dir`` (see the module docstring).

    ``dirs`` (:class:`OpenDirs`) keeps the directories opened for the next files (render of
    many hosts); without it every call walks from OUT.

    Returns:
        The path written.

    Raises:
        UnsafeOutput: the path leaves OUT, or a directory on the way (OUT included) is a symlink,
            not a directory, not ours or writable by group/others.
        OSError: the file system refused (permissions, space).
    """
    parts = relative_parts(rel)
    fd, own = _dir_fd(out_dir, parts[:-1], dirs)
    try:
        tmp = f".{parts[-1]}.{secrets.token_hex(6)}.tmp"
        tfd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode & 0o600,
                      dir_fd=fd)
        try:
            os.fchmod(tfd, mode)
            data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
            view = memoryview(data)
            while view:
                view = view[os.write(tfd, view):]
            # no fsync: readers never see a partial file (the rename is atomic), and what a crash of
            # the controller mid-render could lose is re-rendered by running render again
        except BaseException:
            os.close(tfd)
            os.unlink(tmp, dir_fd=fd)
            raise
        os.close(tfd)
        try:
            os.replace(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
        except OSError:
            os.unlink(tmp, dir_fd=fd)
            raise
    finally:
        if own:
            os.close(fd)
    return out_dir.joinpath(*parts)
