"""Controller wheelhouse for SGLang (``ddtree_ops.sglang.wheelhouse``) and the pin model.

git: a local repository (``tests/sglang_git.py``) at an exact commit, patches verified by
sha256 and applied as a whole series; wheel: sha256 verified; every refusal leaves the
cache as it was. (pypi with a real lock is proven by the role test on the test host.)
"""

from __future__ import annotations

import copy
import json
import zipfile
from pathlib import Path

import pytest
from helpers import base_hostvars
from sglang_git import GitSource, make_git_source

from ddtree_ops import python_tag
from ddtree_ops.config import ConfigError, build_id, validate_hostvars
from ddtree_ops.sglang import wheelhouse as wh
from ddtree_ops.sglang.wheelhouse import WheelhouseError, build


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> GitSource:
    return make_git_source(tmp_path_factory.mktemp("git"))


@pytest.fixture(scope="module")
def built(src, tmp_path_factory):
    out = tmp_path_factory.mktemp("wh")
    pin = {"source": "git", "repo": str(src.repo), "commit": src.commit,
           "patches": [{"path": str(src.good_patch), "sha256": src.sha(src.good_patch)}]}
    return out, pin, build(pin, out)


def listing(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name != ".lock")


def test_git_commit_built_with_patch(built):
    out, _pin, r = built
    assert r["changed"] and r["requirement"] == "sglang==0.5.23"
    whl = Path(r["dir"]) / r["wheel"]
    with zipfile.ZipFile(whl) as z:
        assert b"--speculative-ddtree-budget" in z.read("sglang/ddtree.py")
    assert (Path(r["dir"]) / "wheelhouse.json").is_file()


def test_same_pin_reuses_the_wheelhouse(built):
    out, pin, first = built
    again = build(pin, out)
    assert not again["changed"] and again["dir"] == first["dir"]


def test_patch_changes_the_key(built, src):
    out, pin, first = built
    other = {**pin, "patches": []}
    r = build(other, out)
    assert r["dir"] != first["dir"]
    with zipfile.ZipFile(Path(r["dir"]) / r["wheel"]) as z:
        assert b"BUDGET_FLAG = None" in z.read("sglang/ddtree.py")


def test_patch_series_refused_whole(built, src):
    out, pin, _ = built
    before = listing(out)
    bad = {**pin, "patches": [*pin["patches"], {"path": str(src.bad_patch), "sha256": src.sha(src.bad_patch)}]}
    with pytest.raises(
        WheelhouseError, match=r"ddtree_sglang.patches = .*does not apply to .*none was applied. Fix: rebase"
    ):
        build(bad, out)
    assert listing(out) == before


def test_patch_checksum_mismatch(built, src):
    out, pin, _ = built
    before = listing(out)
    bad = {**pin, "patches": [{"path": str(src.good_patch), "sha256": "0" * 64}]}
    with pytest.raises(WheelhouseError, match=r"patches\[0\].path = .*SHA-256 is [0-9a-f]{64}, not the pinned 0{64}"):
        build(bad, out)
    assert listing(out) == before


def test_unknown_commit_and_branch_refused(built, src):
    out, pin, _ = built
    before = listing(out)
    with pytest.raises(WheelhouseError, match="no such commit"):
        build({**pin, "commit": "1" * 40}, out)
    with pytest.raises(WheelhouseError, match="not a branch or tag name"):
        build({**pin, "commit": "main"}, out)
    assert listing(out) == before


def test_wheel_source_sha256(built, tmp_path):
    _, _, r = built
    wheel = Path(r["dir"]) / r["wheel"]
    out = tmp_path / "wh"
    good = {"source": "wheel", "path": str(wheel), "sha256": GitSource.sha(wheel), "version": "0.5.23"}
    assert build(good, out)["requirement"] == "sglang==0.5.23"
    before = listing(out)
    with pytest.raises(
        WheelhouseError, match=r"ddtree_sglang.path = .*: SHA-256 is [0-9a-f]{64}, but ddtree_sglang.sha256 = f{64}"
    ):
        build({**good, "sha256": "f" * 64}, out)
    with pytest.raises(WheelhouseError, match=r"version = '0.5.22': the wheel is sglang 0.5.23"):
        build({**good, "version": "0.5.22"}, out)
    assert listing(out) == before


def test_changed_or_missing_patch_refused_even_on_a_cache_hit(built, src, tmp_path):
    """The pin's patch files are verified before the cache is looked up: an edited patch whose
    sha256 was not re-pinned (or a vanished one) is refused as on a clean controller, not served
    from the old wheelhouse."""
    out, pin, _ = built
    before = listing(out)
    edited = tmp_path / "0001-ddtree-flag.patch"
    edited.write_text(src.good_patch.read_text() + "\n")
    with pytest.raises(WheelhouseError, match=r"patches\[0\].path = .*SHA-256 is [0-9a-f]{64}, not the pinned"):
        build({**pin, "patches": [{**pin["patches"][0], "path": str(edited)}]}, out)
    with pytest.raises(WheelhouseError, match=r"patches\[0\].path = .*no such file on the controller"):
        build({**pin, "patches": [{**pin["patches"][0], "path": str(tmp_path / "gone.patch")}]}, out)
    assert listing(out) == before


@pytest.mark.parametrize("bad, words", [
    ({"patches": [{"path": "p.patch"}]}, "ddtree_sglang.patches.0.sha256 = None: this setting is required"),
    ({"patches": "p.patch"}, "ddtree_sglang.patches = 'p.patch'"),
    ({"source": "conda"}, "ddtree_sglang.source = 'conda'"),
    ({"commit": 123}, "ddtree_sglang.commit = 123"),
    ({"repo": "--upload-pack=touch /tmp/x"}, "ddtree_sglang.repo = '--upload-pack=touch /tmp/x': must be a git URL"),
])
def test_hand_written_pin_gets_the_model_rules(built, bad, words, tmp_path, capsys):
    """``--pin`` written by hand (not the role's validated dump): one-line refusal, exit 2, never a
    KeyError/TypeError traceback; a repo starting with '-' never reaches git as an option."""
    from ddtree_ops.sglang.wheelhouse import main

    _out, pin, _ = built
    out = tmp_path / "wh"
    assert main(["--pin", json.dumps({**pin, **bad}), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert words in json.loads(captured.out)["error"] and "Traceback" not in captured.err, captured
    assert not out.exists() or listing(out) == []


def test_upper_case_commit_named_as_such():
    hv = pin_vars(source="git", repo="https://example.org/sglang.git", commit="ABCDEF0123" * 4)
    assert any("upper-case hex" in e for e in errors(hv))


# --------------------------------------------------------------------------- config


def pin_vars(**pin) -> dict:
    hv = copy.deepcopy(base_hostvars())
    hv["ddtree_sglang"] = {"ddtree_source": "sglang-pr-29907", **pin}
    return hv


def errors(hv) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hv)
    return [f.message() for f in exc.value.findings]


def test_branch_name_refused_with_fix():
    msgs = errors(pin_vars(source="git", repo="/srv/sglang.git", commit="main"))
    assert msgs == ["h1: ddtree_sglang.commit = 'main': must be a full 40-hex commit SHA, not a branch or tag name, "
                    "which can move under you. Fix: pin the commit itself: git rev-parse main in the repository"]
    assert "abbreviated SHA" in errors(pin_vars(source="git", repo="/srv/sglang.git", commit="abc1234"))[0]


def test_wheel_needs_sha256_and_one_location():
    msgs = errors(pin_vars(source="wheel", path="/srv/sglang-0.5.23-py3-none-any.whl"))
    assert any(m.startswith("h1: ddtree_sglang.sha256 = None: source wheel needs the wheel's SHA-256") for m in msgs)
    msgs = errors(pin_vars(source="wheel", sha256="a" * 64, path="/srv/x.whl", url="https://example.org/x.whl"))
    assert any("exactly one of url and path" in m for m in msgs)
    assert "64 lower-case hex" in errors(pin_vars(source="wheel", path="/srv/x.whl", sha256="XYZ"))[0]


def test_fields_of_another_source_refused():
    msgs = errors(pin_vars(source="pypi", version="0.5.23", commit="a" * 40))
    assert msgs == [
        "h1: ddtree_sglang.commit = '" + "a" * 40 + "': does not apply to source pypi (a PyPI release: "
        "version (+ optional requirements)). Fix: remove it, or set source to the kind of pin it belongs to"
    ]


def test_simulated_build_only_with_the_simulator():
    """An inventory copied from a test host and switched to git keeps simulated_build: refused, not
    silently ignored."""
    msgs = errors(
        pin_vars(source="git", repo="https://example.org/sglang.git", commit="a" * 40, simulated_build="ddtree")
    )
    assert any(m.startswith("h1: ddtree_sglang.simulated_build = 'ddtree': does not apply to source git") for m in msgs)


def test_patches_and_lock_accepted():
    hv = pin_vars(source="git", repo="https://github.com/sgl-project/sglang.git", commit="b" * 40,
                  patches=[{"path": "patches/0001.patch", "sha256": "c" * 64}],
                  requirements="requirements/sglang-0.5.23-import.txt")
    v = validate_hostvars("h1", hv)
    assert v.deployment.sglang.patches[0].path == "patches/0001.patch"
    assert "../etc" in errors(pin_vars(source="git", repo="/r", commit="b" * 40, requirements="../etc/x"))[0]


def test_unpinned_git_is_a_warning_until_install():
    v = validate_hostvars("h1", pin_vars(source="git", version="0.5.23"))
    assert any(w.field == "ddtree_sglang.commit" for w in v.warnings)


def test_sglang_venv_default_and_argv():
    from ddtree_ops.render.argv import build_argv
    from ddtree_ops.render.files import plan_document

    v = validate_hostvars("h1", pin_vars(source="pypi", version="0.5.23"))
    assert plan_document(v)["paths"]["sglang_venv"] == "/opt/ddtree-ops/sglang-venv"
    # the unit runs the release's build (one name: wheelhouse.build_name), never the shared symlink
    name = wh.build_name(v.deployment.sglang.model_dump(mode="json"), wh.PROJECT_ROOT, python_tag.current(),
                         wh.ops_source_id(wh.PROJECT_ROOT))
    assert build_argv(v.deployment, v.plan)[0] == f"/opt/ddtree-ops/sglang-venv.builds/{name}/bin/python"
    assert build_id.BUILD_RE.fullmatch(name) and name.startswith(python_tag.current() + "-")
