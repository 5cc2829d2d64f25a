"""Releases: the content key (``ddtree_ops.render.release``), the host-side
``ddtree-ops release`` commands (``ddtree_ops.host.release``) on a temporary release root,
hostile ids and symlinks, prune rules, and the gate against the simulator on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import REPO, base_hostvars
from test_sim import Sim
from test_warmup_health import _launch

from ddtree_ops import python_tag
from ddtree_ops.cli import main
from ddtree_ops.config import validate_hostvars
from ddtree_ops.host import release as hr
from ddtree_ops.render.files import plan_document
from ddtree_ops.render.release import MANIFEST, build_release, live_links, release_result


def _validated(**service):
    hv = base_hostvars()
    hv.setdefault("ddtree_service", {}).update(service)
    return validate_hostvars("h1", hv)


def _install(root: Path, v) -> str:
    """Install a release the way the role does (files under root/<id>/), returning its id."""
    res = release_result(v)
    for f in res["files"]:
        rel = Path(f["path"]).relative_to(res["root"])
        p = root / rel
        p.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        p.write_text(f["content"])
        p.chmod(int(f["mode"], 8))
    return res["id"]


@pytest.fixture
def root(tmp_path):
    r = tmp_path / "releases"
    r.mkdir(mode=0o755)
    r.chmod(0o755)
    return r


def _versions(n: int) -> list:
    """n validated deployments with n different release ids (budget varies)."""
    out = []
    for budget in (32, 24, 16, 12, 40, 48, 20)[:n]:
        hv = base_hostvars()
        hv["ddtree_speculative"]["budget"] = budget
        out.append(validate_hostvars("h1", hv))
    return out


def _deploy_all(root: Path, versions: list, keep: int = 3) -> list[str]:
    """Install and activate each version in turn (as deploys do); their ids."""
    ids = []
    for v in versions:
        ids.append(_install(root, v))
        hr.activate(root, ids[-1], keep=keep)
    return ids


# --- the id ---------------------------------------------------------------------------------

def test_release_id_is_deterministic_and_content_keyed():
    a, b = build_release(_validated()), build_release(_validated())
    assert a.id == b.id and a.manifest == b.manifest and hr.ID_RE.fullmatch(a.id)
    assert build_release(_validated(keep_releases=5)).id != a.id  # plan.json bytes changed
    hv = base_hostvars()
    hv["ddtree_speculative"]["budget"] = 16
    assert build_release(validate_hostvars("h1", hv)).id != a.id
    doc = json.loads(a.manifest)
    assert hr.compute_id(doc["files"], doc["identity"]) == a.id == doc["id"]
    assert [e["name"] for e in doc["files"]] == ["ddtree-sglang.service", "sglang.env", "plan.json"]


def test_release_leaves_secrets_out():
    hv = base_hostvars()
    hv["ddtree_hf_token"] = "hf_abcdefghijklmnopqrstuvwxyz012345"
    v = validate_hostvars("h1", hv)
    res = release_result(v)
    assert "hf_abcdefghij" not in json.dumps(res)
    assert not any(f["path"].endswith("secrets.env") for f in res["files"])
    assert build_release(v).id == build_release(_validated()).id  # a secret is no new release


def test_live_links_go_through_current():
    links = {ln["path"]: ln["src"] for ln in live_links(build_release(_validated()))}
    assert links == {
        "/etc/systemd/system/ddtree-sglang.service": "/etc/ddtree-ops/sglang/releases/current/ddtree-sglang.service",
        "/etc/ddtree-ops/sglang/sglang.env": "releases/current/sglang.env",
        "/etc/ddtree-ops/sglang/plan.json": "releases/current/plan.json",
    }


def test_render_prints_the_same_id_as_the_play(tmp_path, capsys):
    """`ddtree-ops render` prints the id the ddtree_render action (the play) returns for the host."""
    import sys
    from types import SimpleNamespace

    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.task import Task
    from ansible.template import Templar

    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("sglang_servers:\n  children:\n    b300:\n      hosts:\n        h1: {}\n")
    hv = base_hostvars()
    (inv / "group_vars" / "all.yml").write_text(json.dumps(hv))
    assert main(["render", "--out", str(tmp_path / "out"), "-i", str(inv)]) == 0
    printed = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("release")]
    sys.path.insert(0, str(REPO / "action_plugins"))
    try:
        from ddtree_render import ActionModule
    finally:
        sys.path.pop(0)
    task = Task()
    task.args = {}
    loader = DataLoader()
    task_vars = {**hv, "inventory_hostname": "h1", "group_names": ["b300", "sglang_servers"]}
    result = ActionModule(task=task, connection=SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")),
                          play_context=None, loader=loader, templar=Templar(loader=loader, variables=task_vars),
                          shared_loader_obj=None).run(task_vars=task_vars)
    assert not result.get("failed"), result.get("msg")
    assert printed == [["release", "h1:", result["release"]["id"]]]
    # the sglang role installs into the build the release's unit runs
    from ddtree_ops.render.argv import sglang_build_path

    assert result["paths"]["sglang_build"] == sglang_build_path(validate_hostvars("h1", hv).deployment)
    unit = next(f["content"] for f in result["release"]["files"] if f["path"].endswith(".service"))
    assert f"ExecStart={result['paths']['sglang_build']}/bin/python " in unit
    assert result["release"]["dir"] == f"/etc/ddtree-ops/sglang/releases/{result['release']['id']}"
    assert result["release"]["keep"] == 3


def test_keep_releases_validated(capsys):
    from ddtree_ops.config import ConfigError

    for bad in (0, 51, True, "many"):
        with pytest.raises(ConfigError) as exc:
            _validated(keep_releases=bad)
        assert "keep_releases" in str(exc.value)


# --- activate / rollback / prune on a tmp root ------------------------------------------------

def test_activate_switches_current_and_records_history(root):
    v1, v2 = _versions(2)
    i1 = _install(root, v1)
    r = hr.activate(root, i1)
    assert r == {"root": str(root), "id": i1, "from": None, "changed": True, "pruned": [], "prune_failed": {}}
    assert os.readlink(root / "current") == i1
    assert hr.activate(root, i1)["changed"] is False
    i2 = _install(root, v2)
    r = hr.activate(root, i2)
    assert r["from"] == i1 and r["changed"] and os.readlink(root / "current") == i2
    info = hr.list_releases(root)
    assert info["current"] == i2 and info["previous"] == i1 and info["history"] == [i1, i2]
    assert not [p for p in os.listdir(root) if p.endswith(".tmp")]


def test_rollback_goes_back_and_then_further_back(root):
    ids = _deploy_all(root, _versions(3))
    r = hr.rollback(root)
    assert (r["from"], r["to"]) == (ids[2], ids[1]) and os.readlink(root / "current") == ids[1]
    assert (root / ids[2]).is_dir()  # kept until the next activation prunes it
    r = hr.rollback(root)
    assert (r["from"], r["to"]) == (ids[1], ids[0])
    with pytest.raises(hr.ReleaseError, match="no previous release"):
        hr.rollback(root)
    assert os.readlink(root / "current") == ids[0]


def test_rollback_without_anything_refused(root):
    with pytest.raises(hr.ReleaseError, match="no current release"):
        hr.rollback(root)


def test_prune_removes_releases_never_activated(root):
    """A directory left by an interrupted install (never activated) is garbage: pruned."""
    ids = _deploy_all(root, _versions(2))
    stray = _install(root, _versions(3)[2])
    assert hr.activate(root, ids[0])["pruned"] == [stray]


def test_prune_keeps_current_and_newest_previous(root):
    ids, pruned = [], []
    for v in _versions(6):
        ids.append(_install(root, v))
        pruned += hr.activate(root, ids[-1], keep=2)["pruned"]
    on_disk = set(hr.release_ids(os.open(root, os.O_RDONLY)))
    assert on_disk == set(ids[-3:]) and sorted(pruned) == sorted(ids[:3])
    (root / "not-a-release").mkdir()
    hr.activate(root, ids[-1], keep=1)
    assert (root / "not-a-release").is_dir()  # names that are no id are never touched
    assert set(hr.release_ids(os.open(root, os.O_RDONLY))) == set(ids[-2:])  # current + previous
    with pytest.raises(hr.ReleaseError, match="--keep 0"):
        hr.prune(os.open(root, os.O_RDONLY), root, 0, ids[-1], ids)


def test_rolled_back_release_is_pruned_first(root):
    ids = _deploy_all(root, _versions(3), keep=1)  # ids[0] pruned: current ids[2], previous ids[1]
    hr.rollback(root, keep=1)  # back to ids[1]; ids[2] stays (newest) until the next activation
    again = _install(root, _versions(4)[3])
    r = hr.activate(root, again, keep=1)
    assert r["from"] == ids[1] and r["pruned"] == [ids[2]]


@pytest.mark.parametrize("bad", ["../etc", "ABCDEF012345", "abc", "0123456789abc", "/etc/passwd", "01234567890g",
                                 "0123456789ab\n", ""])
def test_hostile_ids_refused(root, bad, capsys):
    with pytest.raises(hr.ReleaseError, match="not a release id"):
        hr.activate(root, bad)
    assert main(["release", "activate", "--root", str(root), "--id", bad, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "not a release id" in doc["checks"][0]["detail"]
    assert not (root / "current").exists()


@pytest.mark.parametrize("target", ["/etc", "../x", "../../tmp/evil", "0123456789ab/../..", "."])
def test_current_pointing_outside_refused(root, target):
    i1 = _install(root, _versions(1)[0])
    os.symlink(target, root / "current")
    for op in (lambda: hr.activate(root, i1), lambda: hr.rollback(root), lambda: hr.list_releases(root)):
        with pytest.raises(hr.ReleaseError, match="points outside"):
            op()
    assert os.readlink(root / "current") == target  # refused, not followed or replaced


def test_current_that_is_a_directory_refused(root):
    i1 = _install(root, _versions(1)[0])
    (root / "current").mkdir()
    with pytest.raises(hr.ReleaseError, match="not a symlink"):
        hr.activate(root, i1)


def test_release_dir_that_is_a_symlink_refused(root, tmp_path):
    v = _versions(1)[0]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rid = _install(elsewhere, v)
    os.symlink(elsewhere / rid, root / rid)
    with pytest.raises(hr.ReleaseError, match="symlink or not a directory"):
        hr.activate(root, rid)
    hr.activate(root, _install(root, _versions(2)[1]))
    assert (elsewhere / rid).is_dir()  # prune never follows a symlinked "release" (it is no release dir)


def test_root_that_is_a_symlink_or_group_writable_refused(root, tmp_path):
    link = tmp_path / "link"
    os.symlink(root, link)
    with pytest.raises(hr.ReleaseError, match="is a symlink"):
        hr.list_releases(link)
    root.chmod(0o777)
    with pytest.raises(hr.ReleaseError, match="lets other users write"):
        hr.list_releases(root)
    with pytest.raises(hr.ReleaseError, match="no such directory"):
        hr.list_releases(tmp_path / "missing")


def test_tampered_or_incomplete_release_refused(root):
    rid = _install(root, _versions(1)[0])
    plan = root / rid / "plan.json"
    plan.write_text(plan.read_text().replace("32", "31"))
    with pytest.raises(hr.ReleaseError, match="changed since it was installed"):
        hr.activate(root, rid)
    plan.unlink()
    with pytest.raises(hr.ReleaseError, match="missing"):
        hr.activate(root, rid)
    os.symlink("/etc/hostname", plan)
    with pytest.raises(hr.ReleaseError, match="is a symlink"):
        hr.activate(root, rid)
    (root / rid / MANIFEST).unlink()
    with pytest.raises(hr.ReleaseError, match="missing"):
        hr.activate(root, rid)
    assert not (root / "current").exists()


@pytest.mark.parametrize(("what", "mode", "match"), [
    ("plan.json", 0o666, "lets other users write it"),  # anyone could edit the unit systemd reads through current
    ("ddtree-sglang.service", 0o600, "the manifest says '0644'"),
    (MANIFEST, 0o646, "lets other users write it"),
    (".", 0o777, "could be swapped after this check"),
])
def test_release_files_writable_by_others_or_of_another_mode_refused(root, what, mode, match):
    """verify checked bytes but not modes: a world-writable unit in a release was
    activated (and read by systemd on every daemon-reload)."""
    rid = _install(root, _versions(1)[0])
    os.chmod(root / rid / what, mode)
    with pytest.raises(hr.ReleaseError, match=match):
        hr.activate(root, rid)
    assert not (root / "current").exists()


def test_manifest_of_another_release_refused(root):
    a, b = (_install(root, v) for v in _versions(2))
    (root / a / MANIFEST).write_bytes((root / b / MANIFEST).read_bytes())
    for name in ("ddtree-sglang.service", "sglang.env", "plan.json"):
        (root / a / name).write_bytes((root / b / name).read_bytes())
    with pytest.raises(hr.ReleaseError, match="content key is not"):
        hr.activate(root, a)


def test_manifest_with_hostile_names_refused(root):
    rid = _install(root, _versions(1)[0])
    m = root / rid / MANIFEST
    doc = json.loads(m.read_text())
    doc["files"][0]["name"] = "../../outside"
    m.write_text(json.dumps(doc))
    with pytest.raises(hr.ReleaseError, match="not one plain name"):
        hr.activate(root, rid)


def test_hostile_history_refused(root):
    rid = _install(root, _versions(1)[0])
    (root / "history").write_text("../../etc\n")
    with pytest.raises(hr.ReleaseError, match="history line 1"):
        hr.activate(root, rid)


def test_concurrent_activates_and_rollbacks_leave_the_root_consistent(root):
    """Two activates at once used to interleave switch, history and prune, so one
    pruned the release the other had just made current (current dangling, both exit 0). The
    root's lock serialises them: after every round current names a release on disk and is the
    history's last id."""
    import threading

    vs = _versions(3)
    ids = [_install(root, v) for v in vs[:1]]
    hr.activate(root, ids[0], keep=1)
    errors: list[BaseException] = []

    def run(op) -> None:
        try:
            op()
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    for n in range(12):
        a, b = _install(root, vs[(n + 1) % 3]), _install(root, vs[(n + 2) % 3])
        ops = [lambda a=a: hr.activate(root, a, keep=1), lambda b=b: hr.activate(root, b, keep=1)]
        if n % 3 == 2:
            ops[0] = lambda: hr.rollback(root, keep=1)
        threads = [threading.Thread(target=run, args=(op,)) for op in ops]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        cur = os.readlink(root / "current")
        assert (root / cur).is_dir(), (n, cur, errors)
        assert (root / "history").read_text().split()[-1] == cur
    # a release that the other activate pruned before this one verified it is a clean refusal
    assert all(isinstance(e, hr.ReleaseError) and "no directory" in str(e) or "no previous" in str(e)
               for e in errors), errors


def test_a_held_lock_makes_activate_wait_then_refuse(root, monkeypatch):
    import fcntl

    rid = _install(root, _versions(1)[0])
    monkeypatch.setattr(hr, "LOCK_WAIT_S", 0.3)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(hr.ReleaseError, match="another release activate/rollback"):
            hr.activate(root, rid)
        assert not (root / "current").exists() and not (root / "history").exists()
    finally:
        os.close(fd)
    assert hr.activate(root, rid)["changed"]  # the lock went with its descriptor


def test_long_history_is_read_in_linear_time(root, capsys):
    """100 000 distinct ids in history hung list/activate (quadratic dedupe)."""
    import time

    rid = _install(root, _versions(1)[0])
    (root / "history").write_text("".join(f"{i:012x}\n" for i in range(300_000)) + "000000000005\n")
    t0 = time.monotonic()
    info = hr.list_releases(root)
    assert len(info["history"]) == 300_000 and info["history"][-1] == "000000000005"
    assert hr.activate(root, rid)["changed"]
    assert time.monotonic() - t0 < 5
    assert len((root / "history").read_text().split()) == hr.MAX_HISTORY  # rewritten to its bound


def test_history_line_with_a_unicode_line_separator_refused(root):
    i1 = _install(root, _versions(1)[0])
    (root / "history").write_text(f"{i1}\u2028{i1}\n")
    with pytest.raises(hr.ReleaseError, match="history line 1"):
        hr.list_releases(root)


def test_manifest_nested_to_the_recursion_limit_is_refused_not_a_crash(root):
    """A manifest nested just shallow enough for json.loads but too deep for
    compute_id's json.dumps ended in RecursionError (exit 70)."""
    import sys

    rid = _install(root, _versions(1)[0])
    m = root / rid / MANIFEST
    good = m.read_text()
    for depth in range(sys.getrecursionlimit() - 400, sys.getrecursionlimit() + 5):  # wherever the stack is
        m.write_text(good.replace('"identity": {', '"identity": {"z": ' + "[" * depth + "]" * depth + ", ", 1))
        with pytest.raises(hr.ReleaseError, match="not a release manifest|content key is not"):
            hr.activate(root, rid)
    assert not (root / "current").exists()


def test_a_release_that_cannot_be_pruned_does_not_fail_the_switch(root, monkeypatch, capsys):
    import shutil

    ids = _deploy_all(root, _versions(2))
    stray = _install(root, _versions(3)[2])
    real = shutil.rmtree

    def rmtree(path, *a, **kw):
        if path == stray:
            raise PermissionError(1, "Operation not permitted", "sub")
        return real(path, *a, **kw)

    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert main(["release", "activate", "--root", str(root), "--id", ids[0]]) == 0
    out = capsys.readouterr().out
    assert f"could not prune 1 release(s), e.g. {stray}" in out and "Operation not permitted" in out, out
    assert os.readlink(root / "current") == ids[0] and (root / stray).is_dir()


@pytest.mark.parametrize(("given", "rc", "what"), [
    ("a\x1b]0;pwn\x07\nok   forged line", 2, "without control characters"),
    ("/tmp/\u202erelease", 2, "without control characters"),
    ("/tmp/a\u2028b", 2, "without control characters"),
    ("/" + "a" * 5000, 2, "at most 4096"),
    ("/" + "a" * 300 + "/r", 1, "cannot be looked at: File name too long"),
])
def test_root_that_cannot_be_named_in_one_line_is_refused(tmp_path, capsys, given, rc, what):
    assert main(["release", "list", "--root", given]) == rc
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert what in text and "\x1b" not in text and "Traceback" not in text, text
    (tmp_path / "f").write_text("x")
    assert main(["release", "list", "--root", str(tmp_path / "f" / "r")]) == 1
    assert "cannot be looked at: Not a directory" in capsys.readouterr().out


def test_cli_list_activate_rollback_json(root, capsys):
    ids = []
    for v in _versions(2):
        ids.append(_install(root, v))
        assert main(["release", "activate", "--root", str(root), "--id", ids[-1], "--keep", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.split("\n}\n")[-2] + "\n}")["id"] == ids[1]
    assert main(["release", "list", "--root", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["ok"] and info["current"] == ids[1] and info["previous"] == ids[0]
    assert main(["release", "rollback", "--root", str(root), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and (doc["from"], doc["to"]) == (ids[1], ids[0])
    assert main(["release", "rollback", "--root", str(root), "--json"]) == 1
    assert "no previous release" in json.loads(capsys.readouterr().out)["checks"][0]["detail"]
    assert main(["release", "activate", "--root", str(root), "--id", ids[0], "--keep", "0"]) == 2


# --- SGLang builds: pinned by the release, pruned only when no release runs them ---------------

def _pinned(sglang_venv: str, commit: str):
    """A deployment on a git SGLang pin at ``commit`` whose SGLang venv is ``sglang_venv``."""
    hv = base_hostvars()
    hv["ddtree_sglang"] = {**hv["ddtree_sglang"], "repo": "https://github.com/sgl-project/sglang.git",
                           "commit": commit * 40}
    hv["ddtree_service"] = {**hv.get("ddtree_service", {}), "sglang_venv": sglang_venv}
    return validate_hostvars("h1", hv)


def _exec_python(root: Path) -> str:
    """The interpreter the current release's unit runs (ExecStart's first word)."""
    unit = (root / "current" / "ddtree-sglang.service").read_text()
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))[len("ExecStart="):].split()[0]


@pytest.fixture
def opt_dir():
    """A directory outside /tmp (a unit's SGLang venv may not live under its PrivateTmp)."""
    import shutil
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="ddtree-relkeep-", dir="/srv" if os.path.isdir("/srv") else "/opt"))
    base.chmod(0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def test_the_unit_and_the_role_name_the_same_content_keyed_build(opt_dir):
    from ddtree_ops.config import build_id
    from ddtree_ops.render.argv import sglang_build_path
    from ddtree_ops.sglang import wheelhouse as wh

    v = _pinned(f"{opt_dir}/sglang-venv", "a")
    build = sglang_build_path(v.deployment)
    name = wh.build_name(v.deployment.sglang.model_dump(mode="json"), wh.PROJECT_ROOT, python_tag.current(),
                         wh.ops_source_id(wh.PROJECT_ROOT))
    assert build == f"{opt_dir}/sglang-venv.builds/{name}" and build_id.BUILD_RE.fullmatch(name)
    rel = build_release(v)
    assert json.loads(rel.manifest)["identity"]["sglang_build"] == build
    unit = next(f for n, _live, f in rel.files if n.endswith(".service")).content
    assert f"ExecStart={build}/bin/python -m sglang.launch_server" in unit
    other = build_release(_pinned(f"{opt_dir}/sglang-venv", "b"))
    assert other.id != rel.id and json.loads(other.manifest)["identity"]["sglang_build"] != build
    # a simulator deployment installs no build and pins none; with install_release the role
    # installs one for the probe, but the unit runs the ops venv, so the release pins none
    hv = base_hostvars()
    hv["ddtree_sglang"] = {"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree"}
    assert sglang_build_path(validate_hostvars("h1", hv).deployment) is None
    hv["ddtree_sglang"]["install_release"] = True
    hv["ddtree_sglang"]["version"] = "0.5.23"
    v = validate_hostvars("h1", hv)
    assert sglang_build_path(v.deployment) is not None
    assert json.loads(build_release(v).manifest)["identity"]["sglang_build"] is None


def test_a_missing_lock_file_is_one_finding():
    from ddtree_ops.config import ConfigError
    from ddtree_ops.render.argv import sglang_build_path

    hv = base_hostvars()
    hv["ddtree_sglang"] = {**hv["ddtree_sglang"], "requirements": "requirements/no-such.lock"}
    with pytest.raises(ConfigError) as exc:
        sglang_build_path(validate_hostvars("h1", hv).deployment)
    text = str(exc.value)
    assert "ddtree_sglang.requirements" in text and "no-such.lock" in text and "no such file" in text, text


def test_build_wheelhouse_script_names_its_dir_with_the_one_ops_id(tmp_path):
    """scripts/build-wheelhouse.sh asks ops_wheelhouse_id for its directory name: with that directory
    already complete it prints it and builds nothing."""
    import subprocess
    import sys

    from ddtree_ops.sglang import wheelhouse as wh

    done = tmp_path / f"{python_tag.current()}-{wh.ops_wheelhouse_id(REPO)}"
    done.mkdir()
    (done / ".complete").touch()
    r = subprocess.run(["bash", str(REPO / "scripts" / "build-wheelhouse.sh"), str(tmp_path), sys.executable],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == str(done) and "building" not in r.stderr


def test_rollback_after_a_pin_change_runs_the_old_build_and_prune_keeps_it(root, opt_dir):
    """Deploys as the roles do them (sglang role: install the build, prune builds; ddtree_service:
    install and activate the release, keep 1 previous), across three SGLang pins."""
    from ddtree_ops.render.argv import sglang_build_path

    builds = opt_dir / "sglang-venv.builds"
    builds.mkdir(mode=0o755)
    orphan = builds / "cp311-0123456789abcdef-0123456789ab"  # an old build no release runs
    orphan.mkdir()
    (builds / "not-a-build").mkdir()  # other names are never touched
    elsewhere = opt_dir / "elsewhere"
    elsewhere.mkdir()
    (builds / "cp311-1111111111111111-111111111111").symlink_to(elsewhere)  # neither are symlinks
    vs = [_pinned(f"{opt_dir}/sglang-venv", c) for c in "abc"]
    paths = [sglang_build_path(v.deployment) for v in vs]
    names = [Path(p).name for p in paths]
    assert len(set(names)) == 3
    ids, removed = [], []
    for v, p in zip(vs, paths, strict=True):
        Path(p).mkdir()  # the sglang role installs the build ...
        res = hr.prune_builds(root, builds, [Path(p).name])  # ... and prunes before the release is activated
        removed.append(res["removed"])
        ids.append(_install(root, v))
        hr.activate(root, ids[-1], keep=1)
    assert removed == [[orphan.name], [], []]  # the builds of releases still on disk stay
    assert _exec_python(root) == f"{paths[2]}/bin/python"
    assert [r["sglang_build"] for r in hr.list_releases(root)["releases"]] == [
        paths[i] for i in sorted(range(1, 3), key=lambda i: ids[i])]  # release 0 was pruned at activation
    # rollback across the pin change: the unit runs the old build again, and it is there
    assert hr.rollback(root, keep=1)["to"] == ids[1]
    assert _exec_python(root) == f"{paths[1]}/bin/python" and Path(paths[1]).is_dir()
    # the next deploy's prune: build 0 (no release left) goes, 1 (current) and 2 (on disk) stay
    res = hr.prune_builds(root, builds, [names[1]])
    assert res["removed"] == [names[0]] and set(res["in_use"]) == {names[1], names[2]}
    assert Path(paths[1]).is_dir() and Path(paths[2]).is_dir() and not Path(paths[0]).exists()
    assert (builds / "not-a-build").is_dir() and elsewhere.is_dir()
    assert (builds / "cp311-1111111111111111-111111111111").is_symlink()


def test_another_instance_sharing_the_venv_keeps_its_builds(root, opt_dir, tmp_path):
    builds = opt_dir / "sglang-venv.builds"
    builds.mkdir(mode=0o755)
    v_mine, v_other = _pinned(f"{opt_dir}/sglang-venv", "a"), _pinned(f"{opt_dir}/sglang-venv", "b")
    from ddtree_ops.render.argv import sglang_build_path

    mine, other = Path(sglang_build_path(v_mine.deployment)), Path(sglang_build_path(v_other.deployment))
    mine.mkdir()
    other.mkdir()
    root2 = tmp_path / "other-releases"
    root2.mkdir(mode=0o755)
    root2.chmod(0o755)
    hr.activate(root2, _install(root2, v_other))
    assert hr.prune_builds(root2, builds, [other.name])["removed"] == [mine.name]  # nothing of root's yet
    mine.mkdir()
    res = hr.prune_builds(root, builds, [mine.name])
    assert res["removed"] == [] and other.is_dir() and res["other_roots"] == [str(root2)]
    # a record that cannot be read: nothing is removed, one line naming it and the fix
    import hashlib

    rec = builds / hr.IN_USE / (hashlib.sha256(str(root2).encode()).hexdigest()[:16] + ".json")  # the other's
    assert rec.is_file()
    rec.write_text('{"root": "/x", "builds": ["../../etc"]}')
    with pytest.raises(hr.ReleaseError, match=r"not a record of builds in use.*Fix: remove"):
        hr.prune_builds(root, builds, [mine.name])
    assert other.is_dir()


@pytest.mark.parametrize("bad", ["../etc", "cp311-xyz", "cp311-0123456789abcdef-0123456789ab/../x", ""])
def test_prune_builds_refuses_a_bad_keep_name(root, opt_dir, bad):
    with pytest.raises(hr.ReleaseError, match="not an SGLang build name"):
        hr.prune_builds(root, opt_dir, [bad])


def test_prune_builds_refuses_a_release_whose_build_it_cannot_read(root, opt_dir):
    builds = opt_dir / "b.builds"
    builds.mkdir(mode=0o755)
    keep = builds / "cp311-0123456789abcdef-0123456789ab"
    keep.mkdir()
    rid = _install(root, _validated())
    man = root / rid / MANIFEST
    doc = json.loads(man.read_text())
    doc["identity"]["sglang_build"] = "relative/path"
    man.write_text(json.dumps(doc))
    with pytest.raises(hr.ReleaseError, match="no absolute path"):
        hr.prune_builds(root, builds)
    assert keep.is_dir()


def test_prune_builds_passes_over_an_install_cut_off_before_its_manifest(root, opt_dir):
    """A deploy killed while copying a new release's files leaves a directory without its
    manifest; the next deploy's prune (which runs before the install) must not stop on it, or no
    re-run could ever repair the host. A release that is current or in the history without its
    manifest is still refused: its build cannot be told, so nothing is removed."""
    builds = opt_dir / "c.builds"
    builds.mkdir(mode=0o755)
    orphan = builds / "cp311-0123456789abcdef-0123456789ab"
    orphan.mkdir()
    rid = _install(root, _validated())
    hr.activate(root, rid)
    cut = root / ("f" * 12)  # the half-installed release: its unit copied, the manifest not yet
    cut.mkdir()
    (cut / "ddtree-sglang.service").write_text("[Unit]\n")
    res = hr.prune_builds(root, builds)
    assert res["removed"] == [orphan.name] and cut.is_dir()
    orphan.mkdir()
    (root / rid / MANIFEST).unlink()  # the current release's manifest gone: refused, nothing removed
    with pytest.raises(hr.ReleaseError, match=f"{rid}/{MANIFEST}: missing"):
        hr.prune_builds(root, builds)
    assert orphan.is_dir()


def test_cli_prune_builds_json(root, opt_dir, capsys):
    builds = opt_dir / "v.builds"
    builds.mkdir(mode=0o755)
    (builds / "cp311-0123456789abcdef-0123456789ab").mkdir()
    (builds / "cp311-fedcba9876543210-0123456789ab").mkdir()
    assert main(["release", "prune-builds", "--root", str(root), "--builds", str(builds),
                 "--keep", "cp311-fedcba9876543210-0123456789ab", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] and doc["changed"] and doc["removed"] == ["cp311-0123456789abcdef-0123456789ab"]
    assert main(["release", "prune-builds", "--root", str(root), "--builds", str(builds), "--keep", "x/y",
                 "--json"]) == 1
    assert "not an SGLang build name" in json.loads(capsys.readouterr().out)["checks"][0]["detail"]


# --- the gate against the simulator -----------------------------------------------------------

def _sim_deployment(tmp_path, accept: str | None):
    hv = base_hostvars()
    hv["ddtree_sglang"] = {"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree"}
    hv["ddtree_ops"] = {**hv.get("ddtree_ops", {}), "accept_length_floor": 3.0}
    v = validate_hostvars("h1", hv)
    env = {"SGLANG_SIM_ACCEPT_LENGTH": accept} if accept else {}
    sim = Sim(tmp_path, _launch(v), env=env)
    sim.wait_ready()
    doc = plan_document(v)
    marker = tmp_path / "warm.json"
    marker.write_text(json.dumps({"batch_sizes": [1], "elapsed_s": 0.1}))
    doc["paths"]["warm_marker"] = str(marker)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    return sim, plan


@pytest.mark.parametrize(("accept", "ok"), [(None, True), ("1.2", False)])
def test_gate_passes_a_good_server_and_catches_collapsed_acceptance(tmp_path, capsys, accept, ok):
    sim, plan = _sim_deployment(tmp_path, accept)
    try:
        rc = main(["release", "gate", "--plan", str(plan), "--url", sim.base, "--requests", "8", "--deadline", "30",
                   "--max-new-tokens", "32", "--json"])
    finally:
        sim.stop()
    doc = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in doc["checks"]}
    assert rc == (0 if ok else 1), doc
    assert checks["drift"]["ok"] and checks["warm"]["ok"] and checks["load"]["ok"]
    assert checks["accept_length_floor"]["ok"] is ok and doc["floor"] == 3.0
    assert doc["elapsed_s"] < 30


def test_gate_fails_an_acceptance_length_no_verify_pass_can_reach(tmp_path, capsys, monkeypatch):
    """A server whose meta_info says 64 tokens came from one verify pass
    (spec_verify_ct 1) passed the floor; a pass verifies plan.verify_tokens_per_req tokens
    (33 here) and cannot accept more, so the gate fails it."""
    import dataclasses

    from ddtree_ops.runtime import bench

    real = bench.run_async

    async def lying(*a, **kw):
        res = await real(*a, **kw)
        return dataclasses.replace(res, levels=[dataclasses.replace(res.levels[0], accept_length=64.0)])

    monkeypatch.setattr(bench, "run_async", lying)
    sim, plan = _sim_deployment(tmp_path, None)
    try:
        rc = main(["release", "gate", "--plan", str(plan), "--url", sim.base, "--requests", "4", "--deadline", "30",
                   "--json"])
    finally:
        sim.stop()
    doc = json.loads(capsys.readouterr().out)
    check = {c["name"]: c for c in doc["checks"]}["accept_length_floor"]
    assert rc == 1 and not check["ok"] and "64.00 is impossible" in check["detail"] and "33 tokens" in check["detail"]


def test_gate_on_a_dead_server_fails_within_its_deadline(tmp_path, capsys):
    from test_sim import free_port

    hv = base_hostvars()
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(plan_document(validate_hostvars("h1", hv))))
    rc = main(["release", "gate", "--plan", str(plan), "--url", f"http://127.0.0.1:{free_port()}",
               "--deadline", "6", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["checks"][0]["name"] == "reachable" and not doc["checks"][0]["ok"]
    assert doc["elapsed_s"] < 6


def test_health_wait_ends_when_the_units_main_process_is_gone(monkeypatch, capsys):
    """Under systemd, `health --wait` (the unit's first ExecStartPost) stops waiting once $MAINPID
    is gone: a server that crashed during start-up fails the start (and a rolling canary) at once,
    not after start_timeout_s."""
    import subprocess
    import sys
    import time

    from test_sim import free_port

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.setenv("MAINPID", str(dead.pid))
    t0 = time.monotonic()
    rc = main(["health", f"http://127.0.0.1:{free_port()}", "--wait", "60", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and time.monotonic() - t0 < 10
    assert doc["checks"][0]["name"] == "reachable" and "exited before it was ready" in doc["checks"][0]["detail"]
    monkeypatch.setenv("MAINPID", str(os.getpid()))  # alive: waits for the deadline as before
    t0 = time.monotonic()
    assert main(["health", f"http://127.0.0.1:{free_port()}", "--wait", "2", "--json"]) == 1
    assert time.monotonic() - t0 >= 0.9  # probed until (about) the deadline
    assert "exited" not in capsys.readouterr().out


# --- playbooks/rolling.yml's inputs -------------------------------------------

@pytest.mark.parametrize(("name", "value", "rule"), [
    ("rolling_batches", 0, "every host at once"),  # Ansible's serial 0: the whole fleet, no canary
    ("rolling_batches", [1, -1], "every host at once"),
    ("rolling_batches", "1000%", "every host at once"),
    ("rolling_batches", "abc", "host count"),  # ansible-core crashed ("Unexpected Exception") on it
    ("rolling_batches", [], "list of 1..100"),
    ("rolling_batches", [1.5], "host count"),
    ("rolling_batches", True, "host count"),
    ("rolling_batches", "{{ 7 * 7 }}", "Jinja"),
    ("rolling_max_fail_percentage", -5, "0..100"),
    ("rolling_max_fail_percentage", 1000, "0..100"),
    ("rolling_max_fail_percentage", "abc", "0..100"),
    ("rolling_gate_deadline_s", "abc", "<= 3600"),  # the gate exited 2 after the upgrade: canary rolled back
    ("rolling_gate_deadline_s", -5, "> 0"),
    ("rolling_gate_deadline_s", 0, "> 0"),
    ("rolling_gate_deadline_s", 1e9, "<= 3600"),
    ("rolling_gate_deadline_s", float("nan"), "<= 3600"),
    ("rolling_gate_deadline_s", "{{ lookup('pipe', 'id') }}", "Jinja"),
])
def test_rolling_settings_refuse_hostile_values(name, value, rule):
    with pytest.raises(hr.ReleaseError, match=rule) as exc:
        hr.rolling_settings({name: value})
    assert str(exc.value).startswith(f"{name} = ") and "\n" not in str(exc.value) and "Fix: " in str(exc.value)


def test_rolling_settings_normalise_good_values():
    assert hr.rolling_settings({}) == {"rolling_batches": [1, "50%"], "rolling_max_fail_percentage": 0.0,
                                       "rolling_gate_deadline_s": 120.0, "rolling_router_deadline_s": 60.0,
                                       "rolling_router_in_flight_s": 5.0}
    assert hr.rolling_settings({"rolling_batches": "5", "rolling_max_fail_percentage": "25",
                                "rolling_gate_deadline_s": 30})["rolling_batches"] == [5]
    assert hr.rolling_settings({"rolling_batches": [1, " 100% "]})["rolling_batches"] == [1, "100%"]


def test_rolling_playbook_checks_its_settings_before_anything_changes(tmp_path):
    """The first task of rolling.yml (before any host is touched) is the ddtree_rolling action on the
    controller; its defaults are the playbook's (one definition each, kept equal here); the action
    reads the variables as given, so a Jinja value is refused, not run."""
    from types import SimpleNamespace

    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.playbook.task import Task
    from ansible.template import Templar

    plays = yaml.safe_load((REPO / "playbooks" / "rolling.yml").read_text())
    first = plays[0]["tasks"][0]
    assert "ddtree_rolling" in first and first["run_once"] is True and first["delegate_to"] == "localhost"
    assert plays[0]["any_errors_fatal"] is True
    assert {k: v for k, v in plays[1]["vars"].items() if k.startswith("rolling_")} == hr.ROLLING_DEFAULTS
    sys_path = str(REPO / "action_plugins")
    import sys

    sys.path.insert(0, sys_path)
    try:
        from ddtree_rolling import ActionModule
    finally:
        sys.path.remove(sys_path)
    loader = DataLoader()
    marker = tmp_path / "ran"

    def run(task_vars):
        task = Task()
        task.args = {}
        return ActionModule(task=task, connection=SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")),
                            play_context=None, loader=loader, templar=Templar(loader=loader, variables=task_vars),
                            shared_loader_obj=None).run(task_vars=task_vars)

    ok = run({"rolling_batches": [1, "100%"]})
    assert not ok.get("failed") and ok["rolling_batches"] == [1, "100%"], ok
    bad = run({"rolling_gate_deadline_s": f"{{{{ lookup('pipe', 'touch {marker}') }}}}"})
    assert bad["failed"] and "Jinja" in bad["msg"] and not marker.exists()
    assert "rolling_batches = 0" in run({"rolling_batches": 0})["msg"]
    # the router drain's waits: bounded, and the in-flight wait inside the drain's deadline
    for bad, name in (({"rolling_router_deadline_s": 0}, "rolling_router_deadline_s"),
                      ({"rolling_router_deadline_s": 1e9}, "rolling_router_deadline_s"),
                      ({"rolling_router_in_flight_s": -1}, "rolling_router_in_flight_s"),
                      ({"rolling_router_deadline_s": 10, "rolling_router_in_flight_s": 30},
                       "rolling_router_in_flight_s"),
                      ({"rolling_router_in_flight_s": "5; reboot"}, "rolling_router_in_flight_s")):
        got = run(bad)
        assert got["failed"] and got["msg"].startswith(f"{name} = "), (bad, got)
    assert run({"rolling_router_deadline_s": "30", "rolling_router_in_flight_s": 0})["rolling_router_deadline_s"] == 30


def test_prune_builds_runs_without_the_cli_dependencies(root, opt_dir):
    """The sglang role runs `python -m ddtree_ops.host.release prune-builds` with the SGLang build's
    python, where ddtree-ops is installed without its dependencies (no typer, rich, httpx, yaml)."""
    import subprocess
    import sys

    builds = opt_dir / "s.builds"
    builds.mkdir(mode=0o755)
    (builds / "cp311-0123456789abcdef-0123456789ab").mkdir()
    block = ("import sys\nfor m in ('typer', 'rich', 'click', 'httpx', 'yaml', 'jinja2', 'prometheus_client', "
             "'fabric', 'paramiko'): sys.modules[m] = None\nimport runpy\n"
             "sys.argv = ['x', 'prune-builds', '--root', sys.argv[1], '--builds', sys.argv[2]]\n"
             "runpy.run_module('ddtree_ops.host.release', run_name='__main__')\n")
    r = subprocess.run([sys.executable, "-c", block, str(root), str(builds)], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["removed"] == ["cp311-0123456789abcdef-0123456789ab"] and doc["changed"]
    r = subprocess.run([sys.executable, "-m", "ddtree_ops.host.release", "prune-builds", "--root", str(root),
                        "--builds", str(builds), "--keep", "../x"], capture_output=True, text=True, timeout=60,
                       cwd=REPO)
    assert r.returncode == 1 and "not an SGLang build name" in json.loads(r.stdout)["checks"][0]["detail"]


def test_ops_ids_same_in_a_checkout_and_an_installed_copy(tmp_path):
    """The build name's ops part hashes the package's own files only (an installed wheel has no
    pyproject.toml); the ops wheelhouse id adds pyproject.toml (its dependencies)."""
    import shutil

    from ddtree_ops.sglang import wheelhouse as wh

    site = tmp_path / "site"
    shutil.copytree(REPO / "ddtree_ops", site / "ddtree_ops", ignore=shutil.ignore_patterns("__pycache__"))
    assert wh.ops_source_id(site) == wh.ops_source_id(REPO)
    assert wh.ops_wheelhouse_id(site) != wh.ops_wheelhouse_id(REPO)
    (site / "pyproject.toml").write_bytes((REPO / "pyproject.toml").read_bytes() + b"# another dependency\n")
    assert wh.ops_wheelhouse_id(site) != wh.ops_wheelhouse_id(REPO)
    (site / "ddtree_ops" / "extra.py").write_text("x = 1\n")
    wh.ops_source_id.cache_clear()  # cached per process (a deploy renders many times)
    assert wh.ops_source_id(site) != wh.ops_source_id(REPO)
