"""Every file ddtree-ops writes goes through one safe writer (:mod:`ddtree_ops._core.write`): the
results of ``bench`` / ``bench-compare`` / ``sweep``, the sweep's deploy log and extra variables,
the warm marker. A symlink planted at a result's name or at any temporary name never carries the
write outside the output directory, and an output directory another user could write is refused.

Also: a crafted ``bench.json`` given to ``bench-compare`` is one line and exit 2, never a traceback.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from ddtree_ops._core import write as write_mod
from ddtree_ops._core.write import UnsafeOutput, write_file
from ddtree_ops.cli import main
from ddtree_ops.fleet.sweep import Deployer, _write_json
from ddtree_ops.runtime.bench import BenchResult, LevelResult, load_result, write_results
from ddtree_ops.runtime.bench_report import write_report
from ddtree_ops.runtime.warmup import WarmupReport, write_marker

STATS = {"mean": 0.01, "p50": 0.01, "p99": 0.02}


def _level(c: int = 1) -> LevelResult:
    return LevelResult(concurrency=c, requests=2, ok=2, failed=0, wall_s=1.0, output_tokens=20, output_tok_s=20.0,
                       ttft_s=dict(STATS), itl_s=dict(STATS), e2e_s=dict(STATS), request_output_tok_s=dict(STATS),
                       request_decode_tok_s=dict(STATS), accept_length=3.0, accept_length_server=None, errors=[],
                       itl_samples_s=[0.01, 0.02])


def _result() -> BenchResult:
    return BenchResult(options={"url": "http://127.0.0.1:1", "api": "generate"}, server={"version": "0.5.23"},
                       client={}, plan=None, started_at=0.0, elapsed_s=1.0, levels=[_level(1), _level(2)], requests=[])


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.write_text("precious\n")
    return v


def _temp_names(name: str) -> list[str]:
    """Every temporary name a writer of ``name`` used before (fixed names a planter can guess)."""
    return [f".{name}.tmp", f".{name}"]


def _plant(out: Path, names: list[str], victim: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        for planted in [name, *_temp_names(name)]:
            (out / planted).unlink(missing_ok=True)
            os.symlink(victim, out / planted)


def _assert_untouched(victim: Path) -> None:
    assert victim.read_text() == "precious\n"


def test_bench_results_never_follow_a_planted_symlink(tmp_path):
    """``ln -s VICTIM OUT/.bench.json.tmp`` (and at bench.json, levels.csv, requests.csv and their
    temporary names): the victim keeps its content; the results are regular files in OUT."""
    victim, out = _victim(tmp_path), tmp_path / "out"
    _plant(out, ["bench.json", "levels.csv", "requests.csv"], victim)
    files = write_results(out, _result())
    _assert_untouched(victim)
    for f in files:
        assert f.is_file() and not f.is_symlink()
    assert load_result(out)["levels"][1]["concurrency"] == 2


def test_hard_link_at_a_result_name_is_replaced_not_written(tmp_path):
    """A hard link to the victim at the final name: the rename replaces the link, the victim's inode is
    never opened (an ``O_TRUNC`` open of the fixed name would have truncated it)."""
    victim, out = _victim(tmp_path), tmp_path / "out"
    out.mkdir()
    os.link(victim, out / "bench.json")
    write_results(out, _result())
    _assert_untouched(victim)


def test_report_and_plots_never_follow_a_planted_symlink(tmp_path):
    pytest.importorskip("matplotlib")
    victim, out = _victim(tmp_path), tmp_path / "report"
    _plant(out, ["report.md", "tok_s.png", "accept_length.png", "itl.png"], victim)
    doc = _result().as_dict()
    path, rows = write_report(out, doc, doc)
    _assert_untouched(victim)
    assert path.read_text().startswith("# Speculative vs baseline") and [r["concurrency"] for r in rows] == [1, 2]
    assert (out / "itl.png").read_bytes()[:4] == b"\x89PNG" and not (out / "itl.png").is_symlink()


def test_sweep_state_deploy_log_and_vars_never_follow_a_planted_symlink(tmp_path):
    victim, out = _victim(tmp_path), tmp_path / "sweep"
    _plant(out, ["sweep.json", "deploy.log", "deploy-vars.json"], victim)
    _write_json(out / "sweep.json", {"points": []})
    play = tmp_path / "deploy.yml"
    play.write_text("- hosts: all\n")
    fake = tmp_path / "ansible-playbook"
    fake.write_text("#!/bin/sh\necho deployed\n")
    fake.chmod(0o755)
    assert Deployer("inv", play, 30.0, (), str(fake)).deploy("h1", {"ddtree_x": 1}, out / "deploy.log") is None
    _assert_untouched(victim)
    assert json.loads((out / "sweep.json").read_text()) == {"points": []}
    assert "deployed" in (out / "deploy.log").read_text()
    assert oct((out / "deploy-vars.json").stat().st_mode & 0o777) == oct(0o600)
    assert oct((out / "deploy.log").stat().st_mode & 0o777) == oct(0o600)


def test_warm_marker_never_follows_a_planted_symlink(tmp_path):
    victim, d = _victim(tmp_path), tmp_path / "run"
    _plant(d, ["warm.json"], victim)
    write_marker(d / "warm.json", WarmupReport(url="http://127.0.0.1:1", batch_sizes=[1]))
    _assert_untouched(victim)
    assert json.loads((d / "warm.json").read_text())["batch_sizes"] == [1]
    assert oct((d / "warm.json").stat().st_mode & 0o777) == oct(0o600)


@pytest.mark.parametrize("writer", ["bench", "report", "sweep", "marker", "write_file"])
def test_an_output_directory_others_can_write_is_refused(tmp_path, writer):
    """Whoever can write the directory can swap our files after we are done: refused, nothing written."""
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, 0o777)
    with pytest.raises(UnsafeOutput, match=r"mode 0777 lets other users write in it"):
        if writer == "bench":
            write_results(out, _result())
        elif writer == "report":
            doc = _result().as_dict()
            write_report(out, doc, doc, plots=False)
        elif writer == "sweep":
            _write_json(out / "sweep.json", {})
        elif writer == "marker":
            write_marker(out / "warm.json", WarmupReport(url="u", batch_sizes=[1]))
        else:
            write_file(out / "x", "y")
    assert os.listdir(out) == []


def test_an_output_directory_that_is_a_symlink_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    with pytest.raises(UnsafeOutput, match="is a symlink"):
        write_results(tmp_path / "link", _result())
    assert os.listdir(real) == []


def test_cli_bench_refuses_an_unsafe_out_before_running(tmp_path, capsys):
    """The check comes first: no benchmark runs (the URL is down: it would fail later) and exit 2."""
    out = tmp_path / "o"
    out.mkdir()
    os.chmod(out, 0o757)
    rc = main(["bench", "http://127.0.0.1:9", "--requests", "1", "--concurrency", "1", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "mode 0757" in err and "chmod go-w" in err


def test_no_writer_in_the_product_bypasses_the_safe_writer():
    """The kind, not the instance: no module of the product writes a file by name itself
    (``write_text``/``write_bytes``, ``open(..., "w")``, ``json.dump`` to a handle) except in a
    private directory it just made (``tempfile.*``) — so a new writer cannot forget the rules."""
    root = Path(__file__).resolve().parents[1] / "ddtree_ops"
    pattern = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*[\"'][wax]b?\+?[\"']|json\.dump\(|\.savefig\(")
    allowed = {  # each writes only inside a directory made private by tempfile.mkdtemp/TemporaryDirectory
        ("host/preflight.py", "script.write_text(_NCCL_CHILD)"),
        ("host/ptxas.py", 'with open(ptx, "w", encoding="ascii") as f:'),
        ("sglang/resolve.py", 'with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:'),
        ("sglang/resolve.py", "json.dump(config, f"),
        ("sglang/resolve.py", 'with open(req_path, "w", encoding="utf-8") as f:'),
        ("sglang/resolve.py", "json.dump(request, f"),
        ("sglang/wheelhouse.py", "(dest / MANIFEST).write_text("),
        ("fleet/router_wheelhouse.py", "(dest / MANIFEST).write_text("),
        ("sglang/wheelhouse.py", 'with urllib.request.urlopen(url, timeout=60) as r, open(target, "wb") as f:'),
        ("runtime/bench_report.py", 'fig.savefig(buf, format="png", dpi=110)'),  # into memory, then write_file
    }
    bypass = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("sim/"):
            continue  # the simulator is a test double, not the product
        for line in path.read_text().splitlines():
            if pattern.search(line) and not any(f == rel and line.strip().startswith(a) for f, a in allowed):
                bypass.append((rel, line.strip()))
    assert bypass == []


def test_write_file_refuses_names_that_are_not_files(tmp_path):
    with pytest.raises(UnsafeOutput):
        write_file(tmp_path / "..", "x")
    assert write_mod.write_file(tmp_path / "a" / "b.txt", b"\x00\x01").read_bytes() == b"\x00\x01"


# ------------------------------------------------------------------ bench-compare on crafted input
def _doc(**level_changes) -> dict:
    doc = _result().as_dict()
    doc["levels"][0].update(level_changes)
    return doc


CRAFTED = {
    "level is a list": {"levels": [[1, 2]]},
    "ok is a string": _doc(ok="2"),
    "failed is negative": _doc(failed=-1),
    "ttft_s is null": _doc(ttft_s=None),
    "itl mean is a string": _doc(itl_s={"mean": "x", "p50": None, "p99": None}),
    "request tok/s missing": {**_doc(), "levels": [{k: v for k, v in _doc()["levels"][0].items()
                                                    if k != "request_output_tok_s"}]},
    "accept_length is a dict": _doc(accept_length={}),
    "itl samples of strings": _doc(itl_samples_s=["a"]),
    "concurrency is a bool": _doc(concurrency=True),
    "duplicate level": {**_doc(), "levels": [_doc()["levels"][0]] * 2},
    "output tok/s infinite": _doc(output_tok_s=float("inf")),
    "server is a list": {**_doc(), "server": [1]},
    "options is a string": {**_doc(), "options": "x"},
    "format of a newer ddtree-ops": {"format": 2},
    "format is a string": {"format": "1"},
    "format missing": {"format": None},
    "accept_length negative": _doc(accept_length=-1.0),
    "accept_length 2**200": _doc(accept_length=2**200),
    "accept_length_server 2**2000 (no float holds it)": _doc(accept_length_server=2**2000),
    "accept_length above every draft": _doc(accept_length=5000.0),
    "ttft negative": _doc(ttft_s={"mean": -1.0, "p50": None, "p99": None}),
    "output tok/s 2**200": _doc(output_tok_s=2**200),
    "ok 10**4000 (written whole into report.md)": _doc(ok=10**4000),
    "failed 2**60": _doc(failed=2**60),
}


@pytest.mark.parametrize("changes, needle", [
    ({"format": 2}, "format = 2: this ddtree-ops reads bench.json format 1 only (a newer ddtree-ops wrote it); "
                    "compare with the ddtree-ops that wrote it, or re-run ddtree-ops bench"),
    ({"levels": _doc(accept_length=-1.0)["levels"]},
     "levels[0]: accept_length -1.0 is not an acceptance length 0..1025 (tokens per verify step) or null; re-run"),
    ({"levels": _doc(accept_length=2**200)["levels"]}, "levels[0]: accept_length 1606938044258990275541962092341162"),
])
def test_bench_compare_names_field_value_rule_and_fix_in_one_line(tmp_path, capsys, changes, needle):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_result().as_dict(), **changes}))
    rc = main(["bench-compare", str(bad), str(bad), "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and needle in " ".join(err.split()), err
    assert not (tmp_path / "r").exists()


def test_the_accept_length_bound_is_every_draft_token_plus_one():
    import typing

    from ddtree_ops.config.models import Speculative
    from ddtree_ops.runtime.bench import MAX_ACCEPT_LENGTH

    inner = typing.get_args(Speculative.model_fields["num_draft_tokens"].annotation)[0]  # Optional[Annotated[int,...]]
    [le] = [m.le for x in inner.__metadata__ for m in getattr(x, "metadata", []) if getattr(m, "le", None)]
    assert MAX_ACCEPT_LENGTH == le + 1


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_bench_compare_of_a_crafted_bench_json_is_one_line_exit_2(tmp_path, capsys, name):
    doc = {"kind": "ddtree-ops-bench", "format": 1, **CRAFTED[name]}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))  # allow_nan: an Infinity in the file is part of the crafted input
    good = tmp_path / "good"
    write_results(good, _result())
    for args in ([str(bad), str(good)], [str(good), str(bad)]):
        rc = main(["bench-compare", *args, "--out", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert rc == 2, (name, err)
        assert "bad.json" in err and "re-run ddtree-ops bench" in err or "not a bench.json" in err, err
        assert "Traceback" not in err


def test_bench_compare_of_a_fifo_is_refused_not_hung(tmp_path, capsys):
    fifo = tmp_path / "bench.json"
    os.mkfifo(fifo)
    rc = main(["bench-compare", str(fifo), str(fifo), "--out", str(tmp_path / "r")])
    assert rc == 2 and "not a regular file" in capsys.readouterr().err
