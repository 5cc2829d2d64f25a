"""The shipped fixtures (``tests/fixtures``) are the recorded files, byte for byte."""

from __future__ import annotations

import hashlib

from helpers import FIXTURES


def test_fixtures_match_their_recorded_checksums():
    recorded = dict(reversed(line.split("  ", 1)) for line in (FIXTURES / "SHA256SUMS").read_text().splitlines())
    files = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*") if p.is_file()} - {"README.md", "SHA256SUMS"}
    assert files == set(recorded), "a fixture was added or removed without updating SHA256SUMS"
    for name, digest in recorded.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == digest, name


def test_no_test_or_code_reads_outside_the_checkout():
    from helpers import REPO

    needles = ("../" + "shared", "DESIGN" + ".md", "/wo" + "rk/" + "shared", '"shared" / "fix' + 'tures"')
    hits = []
    for base in ("ddtree_ops", "tests", "scripts", "roles", "action_plugins", "filter_plugins", "inventory",
                 "playbooks"):
        for p in (REPO / base).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".sh", ".yml", ".yaml", ".j2", ".md", ".cfg", ".txt"):
                text = p.read_text(errors="replace")
                hits += [f"{p.relative_to(REPO)}: {n}" for n in needles if n in text]
    assert not hits, hits
