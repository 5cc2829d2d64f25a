"""Attack corpus (attack pass 7): `ddtree-ops release list|activate|rollback` on hostile roots.

Each case builds a release root under a temp dir, runs the CLI in a subprocess with a hard
timeout (a hang shows as TIMEOUT), and prints: case, exit code, seconds, first output line.
Expected for every case: exit 0/1/2 with one clear line; never 70, a traceback or a hang.
Run: cd <worktree> && .venv/bin/python attack/release_attack.py [CASE...]
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ddtree_ops.ops.release import compute_id, file_entry  # noqa: E402

PY = str(Path(__file__).resolve().parents[1] / ".venv/bin/python")
CLI = [PY, "-c", "import sys; from ddtree_ops.cli import main; sys.exit(main())"]


def mk_release(root: Path, tag: str) -> str:
    files = {"ddtree-x.service": f"[Service]\n# {tag}\n".encode(), "x.env": b"A=1\n", "plan.json": b"{}\n"}
    entries = [file_entry(n, d, "0644") for n, d in files.items()]
    ident = {"ddtree_ops": "0", "tag": tag}
    rid = compute_id(entries, ident)
    d = root / rid
    d.mkdir(mode=0o755)
    for n, data in files.items():
        (d / n).write_bytes(data)
    (d / "release.json").write_text(json.dumps({"format": 1, "id": rid, "files": entries, "identity": ident}))
    return rid


def fresh() -> tuple[Path, list[str]]:
    base = Path(tempfile.mkdtemp(prefix="atk7-"))
    root = base / "releases"
    root.mkdir(mode=0o755)
    root.chmod(0o755)
    ids = [mk_release(root, f"v{i}") for i in range(3)]
    return root, ids


def cli(*args: str, timeout: float = 20) -> tuple[object, float, str]:
    t0 = time.monotonic()
    try:
        p = subprocess.run([*CLI, "release", *args], capture_output=True, text=True, timeout=timeout,
                           cwd=Path(__file__).resolve().parents[1])
        rc, text = p.returncode, (p.stdout + p.stderr)
    except subprocess.TimeoutExpired:
        rc, text = "TIMEOUT", ""
    return rc, round(time.monotonic() - t0, 2), text


def act(root, rid, *extra, timeout=20):
    return cli("activate", "--root", str(root), "--id", rid, *extra, timeout=timeout)


CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def current_to_etc():
    root, ids = fresh(); os.symlink("/etc", root / "current"); return act(root, ids[0])
@case
def current_dangling_id():
    root, ids = fresh(); os.symlink("abcdefabcdef", root / "current"); return cli("rollback", "--root", str(root))
@case
def current_loop():
    root, ids = fresh(); os.symlink("current", root / "current"); return act(root, ids[0])
@case
def current_is_file():
    root, ids = fresh(); (root / "current").write_text(ids[0]); return act(root, ids[0])
@case
def current_is_fifo():
    root, ids = fresh(); os.mkfifo(root / "current"); return act(root, ids[0])
@case
def release_dir_symlink_to_etc():
    root, ids = fresh(); os.symlink("/etc", root / "aaaaaaaaaaaa"); return act(root, "aaaaaaaaaaaa")
@case
def release_dir_no_read_perm_nonroot():  # as root this passes anyway; documents EACCES path
    root, ids = fresh(); (root / ids[0]).chmod(0); return act(root, ids[0])
@case
def history_huge():
    root, ids = fresh(); (root / "history").write_bytes(b"a" * (5 << 20)); return act(root, ids[0])
@case
def history_binary():
    root, ids = fresh(); (root / "history").write_bytes(os.urandom(4096)); return act(root, ids[0])
@case
def history_100k_distinct():
    root, ids = fresh()
    (root / "history").write_text("".join(f"{i:012x}\n" for i in range(100_000)))
    return act(root, ids[0], timeout=30)
@case
def history_300k_distinct_list():
    root, ids = fresh()
    (root / "history").write_text("".join(f"{i:012x}\n" for i in range(300_000)))
    return cli("list", "--root", str(root), timeout=30)
@case
def history_dups():
    root, ids = fresh(); (root / "history").write_text((ids[0] + "\n" + ids[1] + "\n") * 50_000)
    return act(root, ids[2])
@case
def history_wrong_shape():
    root, ids = fresh(); (root / "history").write_text("ABCDEF012345\n"); return act(root, ids[0])
@case
def history_pruned_ids_rollback():
    root, ids = fresh(); (root / "history").write_text("deadbeef0000\n" + ids[0] + "\n")
    os.symlink(ids[0], root / "current"); return cli("rollback", "--root", str(root))
@case
def history_is_fifo():
    root, ids = fresh(); os.mkfifo(root / "history"); return act(root, ids[0])
@case
def history_is_dir():
    root, ids = fresh(); (root / "history").mkdir(); return act(root, ids[0])
@case
def history_unicode_line_sep():
    root, ids = fresh(); (root / "history").write_text(ids[0] + "\u2028" + ids[1] + "\n"); return cli("list", "--root", str(root), "--json")
@case
def manifest_lies_sha():
    root, ids = fresh(); (root / ids[0] / "x.env").write_bytes(b"A=2\n"); return act(root, ids[0])
@case
def manifest_deep_nesting():
    root, ids = fresh()
    m = root / ids[0] / "release.json"
    doc = json.loads(m.read_text())
    (m).write_text(json.dumps(doc)[:-1] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}")
    return act(root, ids[0])
@case
def manifest_identity_deep_just_under_limit():
    root, ids = fresh()
    m = root / ids[0] / "release.json"
    doc = json.loads(m.read_text())
    txt = json.dumps(doc).replace('"identity": {', '"identity": {"z": ' + "[" * 990 + "]" * 990 + ", ", 1)
    m.write_text(txt)
    return act(root, ids[0])
@case
def manifest_not_object():
    root, ids = fresh(); (root / ids[0] / "release.json").write_text("[1,2]"); return act(root, ids[0])
@case
def manifest_entry_name_fifo():
    root, ids = fresh()
    m = root / ids[0] / "release.json"; doc = json.loads(m.read_text())
    os.mkfifo(root / ids[0] / "pipe"); doc["files"].append({"name": "pipe", "sha256": "0", "mode": "0644"})
    m.write_text(json.dumps(doc)); return act(root, ids[0])
@case
def manifest_entry_name_dotdot():
    root, ids = fresh()
    m = root / ids[0] / "release.json"; doc = json.loads(m.read_text())
    doc["files"][0]["name"] = ".."; m.write_text(json.dumps(doc)); return act(root, ids[0])
@case
def manifest_100k_entries():
    root, ids = fresh()
    m = root / ids[0] / "release.json"; doc = json.loads(m.read_text())
    doc["files"] += [{"name": f"f{i}", "sha256": hashlib.sha256(b"").hexdigest(), "mode": "0644"} for i in range(30000)]
    for i in range(30000):
        (root / ids[0] / f"f{i}").write_bytes(b"")
    m.write_text(json.dumps(doc)); return act(root, ids[0], timeout=60)
@case
def manifest_sha_not_string():
    root, ids = fresh()
    m = root / ids[0] / "release.json"; doc = json.loads(m.read_text())
    doc["files"][0]["sha256"] = {"x": 1}; m.write_text(json.dumps(doc)); return act(root, ids[0])
@case
def releases_10000_entries():
    root, ids = fresh()
    for i in range(10000):
        (root / f"{i:012x}").mkdir()
    return act(root, ids[0], timeout=60)
@case
def release_id_dir_unremovable_immutable_sub():  # prune hits a dir it cannot remove: a read-only bind? use a file root cannot unlink
    root, ids = fresh()
    d = root / "bbbbbbbbbbbb"; d.mkdir(); sub = d / "sub"; sub.mkdir()
    r = subprocess.run(["chattr", "+i", str(sub)], capture_output=True)
    if r.returncode != 0:
        return ("SKIP chattr", 0, r.stderr.decode()[:100])
    try:
        return act(root, ids[0])
    finally:
        subprocess.run(["chattr", "-i", str(sub)])
@case
def root_is_file():
    base = Path(tempfile.mkdtemp()); (base / "r").write_text("x"); return cli("list", "--root", str(base / "r"))
@case
def root_is_fifo():
    base = Path(tempfile.mkdtemp()); os.mkfifo(base / "r"); return cli("list", "--root", str(base / "r"))
@case
def root_under_file():
    base = Path(tempfile.mkdtemp()); (base / "f").write_text("x"); return cli("list", "--root", str(base / "f" / "r"))
@case
def root_name_escape():
    base = Path(tempfile.mkdtemp()); return cli("list", "--root", str(base / "a\x1b]0;pwn\x07\nFAKE ok  line"))
@case
def root_name_huge():
    return cli("list", "--root", "/tmp/" + "a" * 5000)
@case
def keep_zero():
    root, ids = fresh(); return act(root, ids[0], "--keep", "0")
@case
def keep_negative():
    root, ids = fresh(); return act(root, ids[0], "--keep", "-1")
@case
def keep_huge():
    root, ids = fresh(); return act(root, ids[0], "--keep", "99999999999999999999999")
@case
def id_dotdot():
    root, ids = fresh(); return act(root, "../../../etc")
@case
def id_unicode_digits():
    root, ids = fresh(); return act(root, "٠١٢٣٤٥٦٧٨٩ab")
@case
def id_fullwidth():
    root, ids = fresh(); return act(root, "０１２３４５６７８９ab")
@case
def id_trailing_newline():
    root, ids = fresh(); return act(root, ids[0] + "\n")
@case
def rollback_no_current():
    root, ids = fresh(); return cli("rollback", "--root", str(root))
@case
def rollback_previous_tampered():
    root, ids = fresh(); act(root, ids[0]); ids[1] = mk_release(root, "v1b"); act(root, ids[1])
    (root / ids[0] / "x.env").write_text("evil"); r = cli("rollback", "--root", str(root))
    return (r[0], r[1], r[2] + f" || current after: {os.readlink(root / 'current')}")


@case
def release_unit_world_writable():
    root, ids = fresh(); (root / ids[0] / "ddtree-x.service").chmod(0o666); return act(root, ids[0])
@case
def release_file_mode_differs_from_manifest():
    root, ids = fresh(); (root / ids[0] / "x.env").chmod(0o600); return act(root, ids[0])
@case
def release_dir_world_writable():
    root, ids = fresh(); (root / ids[0]).chmod(0o777); return act(root, ids[0])
@case
def rollback_prunes_a_release_being_installed():
    """A deploy has installed release X (not yet activated) when a fleet rollback runs: the
    rollback's prune removes X (never activated), so the deploy's activate then fails."""
    root, ids = fresh(); act(root, ids[0]); ids[1] = mk_release(root, "v1b"); act(root, ids[1])
    x = mk_release(root, "being-installed")
    r = cli("rollback", "--root", str(root))
    return (r[0], r[1], r[2].strip() + f" || {x} still there: {(root / x).is_dir()}")


@case
def concurrent_activates():
    """Two activates (of different ids) in a loop for ~6 s; after each round check that current
    names a release directory that still exists and history's last line is current."""
    root, ids = fresh()
    bad = []
    t_end = time.monotonic() + 6
    rounds = 0
    while time.monotonic() < t_end:
        rounds += 1
        procs = [subprocess.Popen([*CLI, "release", "activate", "--root", str(root), "--id", ids[k], "--keep", "1"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (rounds % 3, (rounds + 1) % 3)]
        outs = [(p.wait(timeout=30), p.stdout.read()) for p in procs]
        cur = os.readlink(root / "current")
        hist = (root / "history").read_text().split()
        if not (root / cur).is_dir() or hist[-1] != cur or any(rc not in (0, 1) for rc, _ in outs):
            bad.append((rounds, cur, (root / cur).is_dir(), hist[-3:], [(rc, o.strip()[-200:]) for rc, o in outs]))
            # restore a sane root for the next round
            for i, rid in enumerate(ids):
                if not (root / rid).exists():
                    ids[i] = mk_release(root, f"v{i}")
    return ("BROKEN" if bad else 0, rounds, f"{len(bad)} inconsistent rounds of {rounds}: {bad[:2]}")


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    for n in names:
        rc, s, text = CASES[n]()
        first = next((ln for ln in text.splitlines() if ln.strip()), "")
        tb = " TRACEBACK" if "Traceback" in text else ""
        lines = len([ln for ln in text.splitlines() if ln.strip()])
        print(f"{n:45s} rc={rc!s:8s} {s:>6}s lines={lines}{tb} | {first[:230]!r}", flush=True)


if __name__ == "__main__":
    main()
