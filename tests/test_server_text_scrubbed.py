"""Text a server sends reaches the operator only scrubbed: a hostile or misconfigured server that
answers with credentials in its error body (a proxy echoing the request's ``Authorization`` header,
a debug page with the process environment) never gets them into ``bench``'s stdout, ``requests.csv``
or ``bench.json``, nor into ``warmup``'s output. The servers are the loopback ones of
``tests/test_hostile_servers.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_hostile_servers import Hostile, fixed

from ddtree_ops.cli import main

BEARER = "sk-" + "proxyEcho0123456789abcdefXYZ"
HF = "hf_" + "ServerLeak0123456789abcdefghijklmn"
LOWER_BEARER = "abcdefghijklmnopqrstuvw"  # an all-lower-case credential (no digit, no capital)
BODIES = {
    "auth header echoed": (500, "text/plain", f"upstream failed; request headers: Authorization: Bearer {BEARER}"),
    "hf token in json": (500, "application/json", json.dumps({"error": {"message": f"repo denied for token {HF}"}})),
    "env dump": (502, "text/html", f"<pre>HF_TOKEN={HF}\nX_API_KEY=plainsecretvalue</pre>"),
    "lower-case bearer": (401, "text/plain", f"rejected: bearer {LOWER_BEARER}"),
    "glued token": (500, "text/plain", f"\x1b[2J{HF} and x{HF}"),
}
SECRETS = (BEARER, HF, "plainsecretvalue", LOWER_BEARER, HF[3:])


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.mark.parametrize("name", sorted(BODIES))
def test_bench_never_writes_a_secret_of_a_server_error_body(name, tmp_path: Path, capsys) -> None:
    status, ctype, body = BODIES[name]
    srv = Hostile(fixed(status, ctype, body.encode()), {"/generate"})
    try:
        rc = main(["bench", srv.url, "--concurrency", "1", "--requests", "2", "--warmup", "0",
                   "--out", str(tmp_path / "out"), "--json"])
    finally:
        srv.close()
    cap = capsys.readouterr()
    assert rc == 1 and f"HTTP {status}" in cap.out, cap.out
    assert not _leaks(cap.out + cap.err), cap.out
    files = {p.name: p.read_text() for p in (tmp_path / "out").iterdir()}
    assert {"bench.json", "requests.csv"} <= set(files)
    for fname, text in files.items():
        assert not _leaks(text), (fname, text[:2000])
    assert "(redacted)" in files["requests.csv"]


@pytest.mark.parametrize("name", sorted(BODIES))
def test_warmup_never_prints_a_secret_of_a_server_error_body(name, capsys) -> None:
    status, ctype, body = BODIES[name]
    srv = Hostile(fixed(status, ctype, body.encode()), {"/generate"})
    try:
        rc = main(["warmup", srv.url, "--json", "--deadline", "5", "--batch-sizes", "1"])
        out = capsys.readouterr()
        rc_text = main(["warmup", srv.url, "--deadline", "5", "--batch-sizes", "1"])
        text = capsys.readouterr()
    finally:
        srv.close()
    assert rc == 1 and rc_text == 1
    assert f"HTTP {status}" in out.out and "(redacted)" in out.out, out.out
    assert not _leaks(out.out + out.err + text.out + text.err), out.out + text.out + text.err


def test_a_server_text_cut_inside_a_token_leaks_no_part_of_it() -> None:
    """preview() scrubs before it cuts: a cut through the middle of a token would leave a piece the
    token shapes no longer recognise."""
    from ddtree_ops.sglang.client import preview

    text = "x" * 150 + " " + HF
    shown = preview(text, 160)
    assert HF[:9] not in shown and len(shown) <= 161


@pytest.mark.parametrize("as_json", [True, False])
def test_every_printed_check_is_scrubbed_whatever_built_it(as_json, capsys) -> None:
    """The last sink of every check-printing command (health, warmup, bench, release gate): a detail or an
    extra field built from server text by any path prints scrubbed."""
    from ddtree_ops.cli.common import CheckFailed, _print_checks

    with pytest.raises(CheckFailed):
        _print_checks([{"name": "x", "ok": False, "detail": f"server said Authorization: Bearer {BEARER}"}],
                      as_json, {"server": {"served_model_name": f"m-{HF}", "note": "health_timeout_s: 1"}})
    out = capsys.readouterr().out
    assert not _leaks(out) and "(redacted)" in out
    if as_json:
        assert json.loads(out)["server"]["note"] == "health_timeout_s: 1"
