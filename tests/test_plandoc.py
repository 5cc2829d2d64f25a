"""The bounded plan.json reader (``ddtree_ops/_core/plandoc.py``) and every command that takes
``--plan``: a hostile file is one line, exit 2 (deep nesting gave
RecursionError / exit 70 in diagnose, health, exporter, probe-sglang; a FIFO hung diagnose;
10**400 overflowed the memory text)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import base_hostvars

from ddtree_ops._core import plandoc
from ddtree_ops._core.plandoc import MAX_BYTES, MAX_DEPTH, PlanFileError, read_plan_doc
from ddtree_ops.cli import main
from ddtree_ops.config.load import validate_hostvars
from ddtree_ops.host import preflight as pf
from ddtree_ops.render.files import plan_document

GOOD = plan_document(validate_hostvars("h1", base_hostvars()))


def write(tmp_path: Path, text: str | bytes, name: str = "plan.json") -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def refused(path: Path, needle: str) -> str:
    with pytest.raises(PlanFileError) as ei:
        read_plan_doc(path)
    msg = str(ei.value)
    assert needle in ei.value.problem and msg.startswith("--plan ") and "\n" not in msg and "Fix:" in msg, msg
    return msg


def test_a_rendered_plan_reads_back_equal(tmp_path):
    assert read_plan_doc(write(tmp_path, json.dumps(GOOD, indent=2))) == GOOD


def test_fifo_refused_without_blocking(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    refused(fifo, "a FIFO, not a regular file")
    assert time.monotonic() - t0 < 2


def test_dev_zero_link_and_directory_refused(tmp_path):
    link = tmp_path / "plan.json"
    link.symlink_to("/dev/zero")
    refused(link, "a device, not a regular file")
    refused(tmp_path, "a directory, not a regular file")
    refused(tmp_path / "missing.json", "cannot read it (No such file or directory)")


def test_huge_file_refused(tmp_path):
    p = write(tmp_path, b'{"plan": {}, "pad": "' + b"x" * MAX_BYTES + b'"}')
    refused(p, "larger than 4 MiB")


def test_deep_nesting_refused_without_recursion(tmp_path):
    refused(write(tmp_path, "[" * 200_000), f"nested deeper than {MAX_DEPTH}")
    refused(write(tmp_path, '{"plan": ' + '{"a": ' * 100 + "1" + "}" * 101), f"nested deeper than {MAX_DEPTH}")
    # brackets inside strings do not count
    assert read_plan_doc(write(tmp_path, json.dumps({"plan": {"s": "[" * 1000 + '\\"{'}})))["plan"]["s"].startswith(
        "[["
    )


@pytest.mark.parametrize("const", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_refused(tmp_path, const):
    refused(write(tmp_path, '{"plan": {"port": ' + const + "}}"), "RFC 8259 has no NaN/Infinity")


def test_float_overflow_refused(tmp_path):
    refused(write(tmp_path, '{"plan": {"gib": 1e400}}'), "is not finite")


def test_duplicate_keys_refused(tmp_path):
    refused(write(tmp_path, '{"plan": {"port": 1, "port": 2}}'), "duplicate key 'port'")


@pytest.mark.parametrize("digits", [20, 401, 5000])
def test_big_ints_refused(tmp_path, digits):
    refused(write(tmp_path, '{"plan": {"weights_per_gpu": ' + "9" * digits + "}}"), f"integer of {digits} digits")


def test_int_just_inside_the_bound_kept(tmp_path):
    assert read_plan_doc(write(tmp_path, '{"plan": {"b": ' + str(2**63 - 1) + "}}"))["plan"]["b"] == 2**63 - 1
    refused(write(tmp_path, '{"plan": {"b": ' + str(2**63) + "}}"), "out of range")


@pytest.mark.parametrize("text,needle", [("[]", "top level is list"), ("null", "top level is null"),
                                         ("3", "top level is int"), ('{"deployment": {}}', "no 'plan' object"),
                                         ('{"plan": [1]}', "no 'plan' object"), ("{not json", "not JSON"),
                                         (b'{"plan": {"x": "\xff"}}', "not UTF-8")])
def test_not_a_plan_document(tmp_path, text, needle):
    refused(write(tmp_path, text), needle)


def test_path_shown_cleaned_and_cut(tmp_path):
    p = tmp_path / ("a\x1b]52;c;x\x07" + "b" * 300)
    msg = refused(p, "cannot read it")
    assert "\x1b" not in msg and "\x07" not in msg and "…" in msg


def test_depth_scan_is_flat_and_fast():
    t0 = time.monotonic()
    assert plandoc.depth(b"[]" * (MAX_BYTES // 2)) == 1
    assert plandoc.depth(b"[" * 1_000_000) == MAX_DEPTH + 1
    assert time.monotonic() - t0 < 5


# --- every command that reads --plan: a deep plan.json is exit 2 with one line, not 70 ------

@pytest.mark.parametrize("argv", [
    ["health", "--plan", "PLAN"],
    ["warmup", "--plan", "PLAN"],
    ["bench", "--plan", "PLAN"],
    ["exporter", "--plan", "PLAN"],
    ["probe-sglang", "--plan", "PLAN"],
    ["diagnose", "--file", "PLAN", "--plan", "PLAN"],
    ["preflight", "--plan", "PLAN", "--host-class", "b300"],
], ids=lambda a: a[0])
def test_cli_deep_plan_is_one_line_exit_2(tmp_path, capsys, argv):
    deep = write(tmp_path, '{"plan": ' + "[" * 200_000)
    rc = main([str(deep) if a == "PLAN" else a for a in argv])
    out, err = capsys.readouterr()
    text = (out + err).strip()
    assert rc == 2, text
    assert "nested deeper than 64" in text and "Traceback" not in text
    assert len([ln for ln in err.splitlines() if ln.strip()]) == 1, err


def test_zipapp_carries_the_reader(tmp_path):
    """The preflight zipapp (standard library only) refuses a deep plan with its usage exit."""
    app = pf.build_zipapp(str(tmp_path / "preflight.pyz"))
    deep = write(tmp_path, "[" * 200_000)
    r = subprocess.run([sys.executable, "-I", "-S", app, "--host-class", "b300", "--plan", str(deep), "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nested deeper than 64" in r.stdout + r.stderr and "Traceback" not in r.stderr, r
