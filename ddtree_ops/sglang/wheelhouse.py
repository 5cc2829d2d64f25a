"""Controller-side SGLang wheelhouse: fetch or build the pinned SGLang once, so GPU hosts
install it with ``pip --no-index --find-links`` and need no internet.

Called by the ``sglang`` role (``delegate_to: localhost``)::

    python -m ddtree_ops.sglang.wheelhouse --pin '<ddtree_sglang as JSON>' --out DIR [--root PROJECT]

and prints one JSON object on stdout: ``{"ok", "dir", "id", "changed", "requirement",
"lock", "files", "size_bytes"}``; on refusal ``{"ok": false, "error": ...}`` and exit 2.

The wheelhouse directory is ``DIR/<cpXY>-<id>``, where ``id`` hashes everything that
determines its bytes: source, version / wheel sha256 / repo + commit, each patch's
sha256, the lock file's sha256 and the Python tag. It is built in a temporary directory
and renamed into place only when complete (under a lock), so an interrupted or refused
build leaves the cache as it was. Sources:

* ``pypi``: ``pip download sglang==VERSION`` (with a lock: ``--no-deps`` plus exactly the
  lock's packages; without one: SGLang's full dependency set);
* ``wheel``: copy the controller file or download the URL, then verify its sha256;
* ``git``: clone, check out the exact commit, verify each patch's sha256, ``git apply
  --check`` the whole series (refused whole if one does not apply), apply, build the wheel.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._core.plandoc import shown
from ..config.build_id import (
    LOCK_NAME,
    MANIFEST,
    PROJECT_ROOT,
    WheelhouseError,
    _need_file,
    _resolve,
    build_name,
    ops_source_id,
    ops_wheelhouse_id,
    sha256_file,
    wheelhouse_id,
)
from ..python_tag import PYTHON_TAG_CODE


def _run(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise WheelhouseError(f"{what} failed: {tail}")
    return proc.stdout


def _pip(python: str) -> list[str]:
    return [python, "-m", "pip", "--disable-pip-version-check", "-q"]


HOST_PATH_MAX = 4096
"""Longest host path :func:`host_dir` accepts (Linux ``PATH_MAX``, ``<linux/limits.h>``)."""

FILE_NAME_MAX = 255
"""Longest file name :func:`install_steps` accepts (Linux ``NAME_MAX``, ``<linux/limits.h>``)."""


def _shown(value: Any) -> str:
    """``repr(value)`` for one-line refusals, cut to 200 characters + "…" (:func:`ddtree_ops._core.plandoc.shown`)."""
    return shown(repr(value))


def host_dir(field: str, value: Any) -> str:
    """``value`` if it is a directory path pip and the roles can take as one argument on a host:
    a ``str``, absolute (so never a URL, which pip's ``--find-links`` would fetch from the
    network, nor an option), normalized (no ``.``/``..``/``//`` parts, not ``/`` itself), no
    control characters, at most :data:`HOST_PATH_MAX` characters.

    Raises:
        WheelhouseError: one line naming ``field``, the value (cut to 200 characters), the rule
            and the fix.
    """
    import posixpath

    ok = (isinstance(value, str) and value.startswith("/") and value != "/" and len(value) <= HOST_PATH_MAX
          and posixpath.normpath(value) == value and not value.startswith("//")
          and not any(ord(c) < 32 or ord(c) == 127 for c in value))
    if not ok:
        raise WheelhouseError(f"{field} = {_shown(value)}: must be a normalized absolute directory path on the host "
                              f"(starts with /, not / itself, no . or .. parts, no control characters, at most "
                              f"{HOST_PATH_MAX} characters). Fix: set it to a directory such as "
                              "/opt/ddtree-ops/wheelhouse")
    return value


def offline_pip_args(find_links: str) -> list[str]:
    """The arguments of every offline ``pip install`` on a host: no index, no version check, only
    the wheels in ``find_links`` (a directory on the host). One definition for the ``sglang``
    role's build (:func:`install_steps`) and ``ddtree_service``'s ops venv (``ansible.builtin.pip``
    ``extra_args``, through the ``ddtree_pip_offline_args`` filter).

    Raises:
        WheelhouseError: ``find_links`` is not a host directory (:func:`host_dir`): a URL there
            would make pip fetch from the network despite ``--no-index``.
    """
    return ["--no-index", "--disable-pip-version-check", "--find-links", host_dir("find_links", find_links)]


def install_steps(build: str, wheelhouse: str, ops_wheelhouse: str, lock: str | None,
                  wheel: str) -> list[dict[str, Any]]:
    """The pip commands that install an SGLang build offline, in order, for the ``sglang`` role
    (``ddtree_sglang_install_steps`` filter; the role runs each ``argv`` with
    ``ansible.builtin.command``).

    Args:
        build: the build's venv on the host (``<sglang_venv>.builds/<name>``, :func:`build_name`).
        wheelhouse: the SGLang wheelhouse's copy on the host.
        ops_wheelhouse: the ddtree-ops wheelhouse's copy on the host (its plugin and probe).
        lock: the lock file's name inside ``wheelhouse`` (:data:`LOCK_NAME`), or None for a pin
            without one.
        wheel: the SGLang wheel's file name inside ``wheelhouse``.

    Raises:
        WheelhouseError: a path that is not a host directory (:func:`host_dir`), or a lock / wheel
            that is not a plain file name (``/``, a leading ``-`` or ``.``, control characters, over
            :data:`FILE_NAME_MAX` characters), or a wheel not ending ``.whl``.

    Returns:
        ``[{"what", "argv"}]``: with a lock, the lock's exact versions (``--no-deps -r``, no
        resolver), then SGLang ``--no-deps``; without one, SGLang with the dependencies pip
        resolves from the wheelhouse; then ddtree-ops ``--no-deps`` (its dependencies are
        SGLang's). ``argv`` is a list of strings, run without a shell.
    """
    for field, path in (("build", build), ("wheelhouse", wheelhouse), ("ops_wheelhouse", ops_wheelhouse)):
        host_dir(f"install_steps: {field}", path)
    for field, name in (("lock", lock), ("wheel", wheel)):
        if field == "lock" and name is None:
            continue
        if (not isinstance(name, str) or not name or name.startswith(("-", ".")) or "/" in name
                or len(name) > FILE_NAME_MAX or any(ord(c) < 32 or ord(c) == 127 for c in name)):
            raise WheelhouseError(f"install_steps: {field} = {_shown(name)}: must be a file name inside the wheelhouse "
                                  f"(no /, no leading - or ., no control characters, at most {FILE_NAME_MAX} "
                                  "characters). Fix: rebuild the wheelhouse (python -m ddtree_ops.sglang.wheelhouse)")
    if not wheel.endswith(".whl"):
        raise WheelhouseError(f"install_steps: wheel = {_shown(wheel)}: must be a .whl file name. "
                              "Fix: rebuild the wheelhouse (python -m ddtree_ops.sglang.wheelhouse)")
    pip = [f"{build}/bin/python", "-m", "pip", "install", "-q"]
    steps = []
    if lock is not None:
        steps.append({"what": "the lock (exact versions, no resolver)",
                      "argv": [*pip, *offline_pip_args(wheelhouse), "--no-deps", "-r", f"{wheelhouse}/{lock}"]})
    steps.append({"what": "SGLang",
                  "argv": [*pip, *offline_pip_args(wheelhouse), *(["--no-deps"] if lock is not None else []),
                           f"{wheelhouse}/{wheel}"]})
    steps.append({"what": "ddtree-ops without its dependencies (probe and SGLang plugin)",
                  "argv": [*pip, *offline_pip_args(ops_wheelhouse), "--no-deps", "ddtree-ops"]})
    return steps


def _check_pin(pin: dict[str, Any]) -> None:
    from pydantic import ValidationError

    from ..config.errors import findings_from_validation_error
    from ..config.models import SGLangPin

    try:  # the role passes a validated dump; a hand-written --pin gets the same field rules
        model = SGLangPin.model_validate(pin)
    except ValidationError as exc:
        raise WheelhouseError(f"ddtree_sglang.{findings_from_validation_error(exc, '', {})[0].message()}") from None
    src = pin.get("source")
    if not model.installs_sglang:
        raise WheelhouseError("ddtree_sglang.source = 'simulator': nothing to install. "
                              "Fix: set install_release: true to install the real release as well")
    if src == "simulator":
        return
    if src == "wheel" and not (pin.get("sha256") and (pin.get("url") or pin.get("path"))):
        raise WheelhouseError("ddtree_sglang.sha256: source wheel needs url or path and sha256. "
                              "Fix: add sha256: the output of sha256sum on the wheel")
    if src == "git":
        commit = pin.get("commit")
        if not pin.get("repo") or not commit:
            raise WheelhouseError(f"ddtree_sglang.commit = {commit!r}: source git needs repo and a full 40-hex "
                                  "commit SHA to install. Fix: set repo and commit (git rev-parse HEAD of the build "
                                  "you tested)")
        if not re.fullmatch(r"[0-9a-f]{40}", commit):
            raise WheelhouseError(f"ddtree_sglang.commit = {commit!r}: must be a full 40-hex commit SHA, not a "
                                  "branch or tag name. Fix: pin the commit itself (git rev-parse REF)")


def _fetch_wheel(pin: dict[str, Any], root: Path, dest: Path) -> Path:
    want = pin["sha256"]
    if pin.get("path"):
        src = _need_file("path", pin["path"], root)
        if not src.name.endswith(".whl"):
            raise WheelhouseError(f"ddtree_sglang.path = {pin['path']!r}: not a .whl file. Fix: point at the wheel")
        target = dest / src.name
        shutil.copyfile(src, target)
        where = f"path = {pin['path']!r}"
    else:
        url = pin["url"]
        target = dest / url.rsplit("/", 1)[-1].split("#", 1)[0]
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(target, "wb") as f:  # noqa: S310 - pinned by sha256
                shutil.copyfileobj(r, f)
        except OSError as exc:
            raise WheelhouseError(f"ddtree_sglang.url = {url!r}: download failed ({exc}). "
                                  "Fix: check the URL, or download it once and give path") from None
        where = f"url = {url!r}"
    got = sha256_file(target)
    if got != want:
        raise WheelhouseError(f"ddtree_sglang.{where}: SHA-256 is {got}, but ddtree_sglang.sha256 = {want}: the file "
                              "is not the wheel that was pinned. Fix: check where the file came from; if it is the "
                              "right build, pin its sha256")
    return target


def _patch_files(pin: dict[str, Any], root: Path) -> list[Path]:
    """The pin's patch files, each verified against its pinned sha256 (WheelhouseError if not)."""
    patches = []
    for i, p in enumerate(pin.get("patches") or []):
        f = _need_file(f"patches[{i}].path", p["path"], root)
        got = sha256_file(f)
        if got != p["sha256"]:
            raise WheelhouseError(f"ddtree_sglang.patches[{i}].path = {p['path']!r}: SHA-256 is {got}, not the pinned "
                                  f"{p['sha256']}. Fix: restore the reviewed patch, or pin the new file's sha256")
        patches.append(f)
    return patches


def _build_git(pin: dict[str, Any], root: Path, dest: Path, work: Path, python: str) -> Path:
    repo, commit = pin["repo"], pin["commit"]
    patches = _patch_files(pin, root)
    src = work / "src"
    repo_arg = str(_resolve(repo, root)) if repo.startswith("/") else repo
    _run(
        ["git", "clone", "--quiet", "--no-checkout", "--", repo_arg, str(src)],
        f"ddtree_sglang.repo = {repo!r}: git clone",
    )
    kind = subprocess.run(["git", "-C", str(src), "cat-file", "-t", commit], capture_output=True, text=True)
    if kind.returncode != 0 or kind.stdout.strip() != "commit":
        raise WheelhouseError(f"ddtree_sglang.commit = {commit!r}: no such commit in {repo}. Fix: pin a commit that "
                              "the repository has (git log), or point repo at the fork that holds it")
    _run(["git", "-C", str(src), "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", commit],
         f"git checkout {commit}")
    if patches:
        check = subprocess.run(["git", "-C", str(src), "apply", "--check", *map(str, patches)],
                               capture_output=True, text=True)
        if check.returncode != 0:
            why = " / ".join(check.stderr.strip().splitlines()[:3])
            raise WheelhouseError(f"ddtree_sglang.patches = {[p['path'] for p in pin['patches']]}: the series does not "
                                  f"apply to {commit[:12]} ({why}); none was applied. Fix: rebase the patches onto "
                                  "this commit, or pin the commit they were made for")
        _run(["git", "-C", str(src), "apply", *map(str, patches)], "git apply")
    project = src if (src / "pyproject.toml").is_file() or (src / "setup.py").is_file() else src / "python"
    if not ((project / "pyproject.toml").is_file() or (project / "setup.py").is_file()):
        raise WheelhouseError(f"ddtree_sglang.repo = {repo!r}: no pyproject.toml at the top or in python/ at "
                              f"{commit[:12]}. Fix: pin the SGLang repository (or a fork of it)")
    before = set(dest.glob("*.whl"))
    _run([*_pip(python), "wheel", "--no-deps", "-w", str(dest), str(project)], f"building the wheel of {commit[:12]}")
    built = [w for w in dest.glob("*.whl") if w not in before]
    if len(built) != 1:
        raise WheelhouseError(f"building {repo}@{commit[:12]} gave {len(built)} wheels, expected one")
    return built[0]


def _requirement_of(wheel: Path) -> tuple[str, str]:
    m = re.match(r"([A-Za-z0-9_.]+)-([^-]+)-", wheel.name)
    if not m:
        raise WheelhouseError(f"{wheel.name}: not a wheel file name")
    return m.group(1).replace("_", "-").lower(), m.group(2)


def build(pin: dict[str, Any], out: Path, root: Path = PROJECT_ROOT, python: str = sys.executable) -> dict[str, Any]:
    """Build (or reuse) the wheelhouse for ``pin`` under ``out``.

    Args:
        pin: ``ddtree_sglang`` as validated (:class:`ddtree_ops.config.models.SGLangPin` dump).
        out: cache directory on the controller.
        root: where relative lock/patch/wheel paths start (the project root).
        python: interpreter whose pip downloads/builds (its CPython tag must match the hosts').

    Returns:
        ``{"ok", "dir", "id", "changed", "build", "pin", "requirement", "wheel", "lock",
        "file_count", "size_bytes"}`` (``build``: :func:`build_name`; ``wheelhouse.json`` in the
        directory also lists every file's sha256).

    Raises:
        WheelhouseError: the pin cannot be fetched, verified, patched or built; the cache
            is left as it was.
    """
    _check_pin(pin)
    if pin["source"] == "git":
        _patch_files(pin, root)  # also on a cache hit: a patch file that changed or vanished is refused
    tag = _run([python, "-c", PYTHON_TAG_CODE],
               "reading the Python tag").strip()
    wid = wheelhouse_id(pin, root, tag)
    final = out / f"{tag}-{wid}"
    out.mkdir(parents=True, exist_ok=True)
    changed = publish_locked(out, final, ".lock", lambda work: _populate(pin, root, python, work, wid))
    manifest = json.loads((final / MANIFEST).read_text())
    files = manifest.pop("files")
    return {"ok": True, "dir": str(final), "id": final.name, "changed": changed,
            "build": build_name(pin, root, tag, ops_source_id(root)), **manifest,
            "file_count": len(files), "size_bytes": sum(f.stat().st_size for f in final.iterdir() if f.is_file())}


def publish_locked(out: Path, final: Path, lock_name: str, populate: Callable[[Path], None]) -> bool:
    """Build a content-keyed wheelhouse directory once, under an exclusive lock of ``out/lock_name``.

    When ``final`` has no manifest yet, ``populate(work)`` fills ``work/wheels`` (manifest included) in
    a fresh temporary directory beside it, which then replaces ``final`` by one rename: a build killed
    half-way leaves no ``final`` a later run would take for complete. The lock file is opened without
    O_TRUNC or following a symlink (a link planted at it truncates nothing). Returns whether it built.
    """
    lock_fd = os.open(out / lock_name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(lock_fd, "r+b") as lockf:
        fcntl.flock(lockf, fcntl.LOCK_EX)
        if (final / MANIFEST).is_file():
            return False
        work = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=out))
        try:
            populate(work)
            if final.exists():
                shutil.rmtree(final)
            (work / "wheels").rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return True


def _populate(pin: dict[str, Any], root: Path, python: str, work: Path, wid: str) -> None:
    dest = work / "wheels"
    dest.mkdir()
    lock = pin.get("requirements")
    version = pin.get("version")
    src = pin["source"]
    if src in ("pypi", "simulator"):
        if not version:
            raise WheelhouseError(
                "ddtree_sglang.version = None: a PyPI pin needs the release. Fix: set version, e.g. 0.5.23"
            )
        spec = f"sglang=={version}"
        _run([*_pip(python), "download", *(["--no-deps"] if lock else []), "-d", str(dest), spec],
             f"pip download {spec}")
        wheel = next(dest.glob("sglang-*.whl"), None) or next(dest.glob("sglang-*"), None)
        if wheel is None:
            raise WheelhouseError(f"pip download {spec} gave no sglang file")
    elif src == "wheel":
        wheel = _fetch_wheel(pin, root, dest)
    else:
        wheel = _build_git(pin, root, dest, work, python)
    name, wheel_version = _requirement_of(wheel)
    if src != "git" and version and wheel_version != version:
        raise WheelhouseError(f"ddtree_sglang.version = {version!r}: the wheel is {name} {wheel_version}. "
                              "Fix: set version to the wheel's, or pin the wheel of that version")
    if lock:
        lock_path = _need_file("requirements", lock, root)
        _run([*_pip(python), "download", "--no-deps", "-d", str(dest), "-r", str(lock_path)],
             f"pip download -r {lock}")
        shutil.copyfile(lock_path, dest / LOCK_NAME)
    files = {f.name: sha256_file(f) for f in sorted(dest.iterdir()) if f.is_file()}
    manifest = {"pin": pin, "requirement": f"{name}=={wheel_version}", "wheel": wheel.name,
                "lock": LOCK_NAME if lock else None, "files": files, "wid": wid}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True, allow_nan=False) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddtree_ops.sglang.wheelhouse",
                                 description="Build (once) the controller wheelhouse of a pinned SGLang build.")
    ap.add_argument("--pin", help="ddtree_sglang as a JSON object")
    ap.add_argument("--out", type=Path, help="cache directory")
    ap.add_argument("--ops-wheelhouse-id", action="store_true", help="only print the ddtree-ops wheelhouse id "
                    "of --root (scripts/build-wheelhouse.sh names its wheelhouse with it)")
    ap.add_argument("--root", type=Path, default=PROJECT_ROOT, help="start of relative paths (project root)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for pip (its CPython tag = the hosts')")
    args = ap.parse_args(argv)
    if args.ops_wheelhouse_id:
        print(ops_wheelhouse_id(args.root.resolve()))
        return 0
    if args.pin is None or args.out is None:
        ap.error("--pin and --out are required (or --ops-wheelhouse-id)")
    try:
        pin = json.loads(args.pin)
        if not isinstance(pin, dict) or "source" not in pin:
            raise WheelhouseError("--pin: a JSON object with 'source' (ddtree_sglang)")
        result = build(pin, args.out, args.root, args.python)
    except (WheelhouseError, ValueError, OSError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}, allow_nan=False))
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, allow_nan=False))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
    sys.exit(130)
