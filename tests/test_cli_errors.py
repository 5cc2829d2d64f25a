"""How the CLI reports what no command handled (``ddtree_ops.cli.common.KNOWN_ERRORS``).

Exit codes: 2 usage / environment (named), 70 internal error (a bug: "please report"),
130 interrupted; never a traceback unless DDTREE_DEBUG=1 asks for one; secrets scrubbed."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

from ddtree_ops import cli
from ddtree_ops.cli import common as cli_common
from ddtree_ops.cli import inventory as cli_inventory


def _boom(exc: BaseException):
    def raiser(*_a, **_k):
        raise exc
    return raiser


def test_internal_error_is_exit_70_one_line_and_asks_for_a_report(monkeypatch, capsys):
    monkeypatch.delenv("DDTREE_DEBUG", raising=False)
    monkeypatch.setattr(cli_inventory, "_validate_all", _boom(RuntimeError("the impossible happened")))
    rc = cli.main(["validate", "-i", "inventory/example"])
    io = capsys.readouterr()
    assert rc == cli_common.EXIT_INTERNAL == 70
    lines = [ln for ln in io.err.splitlines() if ln.strip()]
    assert len(lines) == 1, io.err
    assert "internal error: RuntimeError: the impossible happened" in lines[0]
    assert "please report" in lines[0] and "DDTREE_DEBUG=1" in lines[0]
    assert "Traceback" not in io.err + io.out


def test_debug_prints_the_traceback(monkeypatch, capsys):
    monkeypatch.setenv("DDTREE_DEBUG", "1")
    monkeypatch.setattr(cli_inventory, "_validate_all", _boom(RuntimeError("kaboom")))
    assert cli.main(["validate", "-i", "inventory/example"]) == 70
    e = capsys.readouterr().err
    assert "Traceback (most recent call last)" in e and "RuntimeError: kaboom" in e


def test_internal_error_json_has_a_stable_check_name(monkeypatch, capsys):
    monkeypatch.delenv("DDTREE_DEBUG", raising=False)
    monkeypatch.setattr(cli_inventory, "_validate_all", _boom(ValueError("bad state")))
    assert cli.main(["validate", "-i", "inventory/example", "--json"]) == 70
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and doc["checks"][0]["name"] == "internal-error"
    assert "ValueError: bad state" in doc["checks"][0]["detail"]


def test_secrets_in_an_unexpected_exception_are_scrubbed(monkeypatch, capsys):
    monkeypatch.delenv("DDTREE_DEBUG", raising=False)
    leak = "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz012345 and https://user:pa55w0rd@example.com/x"
    monkeypatch.setattr(cli_inventory, "_validate_all", _boom(RuntimeError(leak)))
    assert cli.main(["validate", "-i", "inventory/example"]) == 70
    e = capsys.readouterr().err
    assert "hf_abcdefghijklmnopqrstuvwxyz012345" not in e and "pa55w0rd" not in e
    assert "(redacted)" in e


@pytest.mark.parametrize("exc, expect", [
    (FileNotFoundError(2, "No such file or directory", "/nonexistent/plan.json"),
     "/nonexistent/plan.json: No such file or directory"),
    (PermissionError(13, "Permission denied", "/etc/shadow"), "/etc/shadow: Permission denied (run as a user"),
    (IsADirectoryError(21, "Is a directory", "/tmp"), "/tmp: Is a directory"),
])
def test_environment_errors_are_named_exit_2(monkeypatch, capsys, exc, expect):
    monkeypatch.setattr(cli_inventory, "_validate_all", _boom(exc))
    assert cli.main(["validate", "-i", "inventory/example"]) == 2
    e = capsys.readouterr().err
    assert expect in e and "internal error" not in e and "Traceback" not in e


def test_interrupt_is_130(monkeypatch, capsys):
    monkeypatch.setattr(cli_inventory, "_validate_all", _boom(KeyboardInterrupt()))
    assert cli.main(["validate", "-i", "inventory/example"]) == cli_common.EXIT_INTERRUPTED == 130
    assert "Traceback" not in capsys.readouterr().err


def test_usage_error_stays_exit_2(capsys):
    assert cli.main(["validate", "--no-such-option"]) == 2
    e = capsys.readouterr().err
    assert "No such option" in e and "internal error" not in e


def test_without_ansible_a_controller_command_says_what_to_install():
    """ansible-core absent (the wheel installed without the controller extra): one line naming
    the extra, exit 2 — not an internal error, not a traceback."""
    code = ("import sys; sys.modules['ansible'] = None\n"
            "from ddtree_ops.cli import main\n"
            "sys.exit(main(['validate', '-i', 'inventory/example']))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "needs ansible-core on the controller: pip install 'ddtree-ops[controller]'" in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


# --- URLs with secrets: refused, and never echoed whole

@pytest.mark.parametrize("argv", [
    ["health", "http://127.0.0.1:9/?access_token=SEKRITq", "--failures", "1", "--json"],
    ["warmup", "http://127.0.0.1:9/x?token=SEKRITq", "--deadline", "2", "--json"],
    ["health", "http://127.0.0.1:9/#SEKRITq", "--failures", "1"],
    ["bench", "http://127.0.0.1:9", "--baseline", "http://127.0.0.1:8/?access_token=SEKRITq", "--requests", "1"],
])
def test_a_server_url_with_a_query_is_refused_and_not_echoed(capsys, argv):
    assert cli.main(argv) == 2
    io = capsys.readouterr()
    assert "SEKRIT" not in io.out + io.err and "holds a query or fragment" in io.out + io.err


def _plan_with_url(tmp_path, url: str):
    out = tmp_path / "out"
    assert cli.main(["render", "-i", str(REPO / "inventory" / "test"), "-o", str(out)]) == 0
    [plan] = out.glob("*/etc/ddtree-ops/*/plan.json")
    doc = json.loads(plan.read_text())
    doc["url"] = url
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize("cmd", [["health", "--failures", "1"], ["exporter", "--listen", "127.0.0.1:0"]])
def test_a_plan_url_with_credentials_or_huge_is_shown_redacted_and_cut(tmp_path, capsys, cmd):
    p = _plan_with_url(tmp_path, "http://admin:SEKRITpw@127.0.0.1:9")
    capsys.readouterr()
    assert cli.main([cmd[0], "--plan", str(p), *cmd[1:]]) == 2
    err = capsys.readouterr().err
    assert "SEKRITpw" not in err and "(redacted)@" in err
    p = _plan_with_url(tmp_path, "http://" + "x" * 3_000_000)
    capsys.readouterr()
    assert cli.main([cmd[0], "--plan", str(p), *cmd[1:]]) == 2
    assert len(capsys.readouterr().err) < 2000
