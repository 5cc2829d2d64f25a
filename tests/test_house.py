"""House rules for the text of the repository: no tracker numbers.

Comments, docstrings, docs, scripts, tests and messages say why in their own words. A pointer
into our internal tracker (an issue number, a numbered item or finding, a numbered review pass)
names something no reader of this repository can open, so every tracked text file outside
``tests/fixtures/`` (recorded upstream data, kept as recorded) is scanned for those shapes and
each hit is reported as ``path:line: text``.

Upstream references are sources, not tracker numbers, and stay: ``owner/repo#N``,
``owner/repo issue N``, ``owner/repo pull/N`` and GitHub issue or pull URLs are taken out of a
line (:data:`UPSTREAM`) before the tracker patterns are applied to it.

This file is scanned too. Its patterns and examples are written so that their own source text
never matches: in each pattern the word is followed by regex syntax (``?``, ``(``, ``[``) where
the pattern wants a space and a digit, and each example is two string literals joined with
``+``, so the source holds a quote between the word and its number
(:func:`test_this_file_does_not_trip_on_its_own_patterns` checks that).
"""

from __future__ import annotations

import re
import subprocess

import pytest
from helpers import REPO

# What a tracker reference looks like. Case-insensitive; each word must not follow a letter, which
# keeps "tissue" or "reattack" out but catches a test name such as test_<word><number>; a word
# alone ("an issue with", "the finding") never matches: each shape needs a number.
TRACKER = re.compile(
    r"(?<![a-z])issues? ?#?[0-9]+"                  # a tracker issue number, with or without '#'
    r"|(?<![a-z])items? [0-9]+[a-z]?\b"             # a numbered item of one, a letter for a sub-item
    r"|(?<![a-z])findings? #?[0-9]+"                # a numbered finding
    r"|(?<![a-z])attacks? ?(?:pass )?[a-z]?[0-9]+"  # a numbered review pass, run together or lettered
    r"|(?<![a-z])attack[ ]pass\b",                  # ... and that phrase without its number
    re.IGNORECASE,
)

# Upstream references: a repository (owner/name) with an issue or pull request number, and
# GitHub issue / pull URLs. Taken out of a line before TRACKER runs, so an upstream repository's
# own numbers are never flagged, whether written owner/name#N or with the word between.
UPSTREAM = re.compile(
    r"\bhttps?://github\.com/[\w.-]+/[\w.-]+/(?:issues|pull)/[0-9]+"
    r"|\b[\w.-]+/[\w.-]+(?:#| issues? #?| pull/| PR #?)[0-9]+",
    re.IGNORECASE,
)

EXCLUDED = ("tests/fixtures/",)


def tracker_refs(line: str) -> list[str]:
    """The tracker references of one line, upstream references taken out first."""
    return [m.group(0) for m in TRACKER.finditer(UPSTREAM.sub(" ", line))]


def tracked_text_files() -> list[str]:
    """Tracked files, and new ones git does not ignore (``git ls-files --cached --others
    --exclude-standard``: a file is checked before its first commit), outside :data:`EXCLUDED`.
    A tracked path missing from the work tree (deleted, not yet committed) and symlinks are
    skipped; :func:`read_text` skips binary files."""
    out = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, check=True, timeout=60).stdout
    files = []
    for rel in dict.fromkeys(out.decode().split("\0")):  # --cached and --others may both list one
        if not rel or rel.startswith(EXCLUDED):
            continue
        path = REPO / rel
        if path.is_symlink() or not path.is_file():
            continue
        files.append(rel)
    return files


def read_text(rel: str) -> str | None:
    """The file's text, or None for a binary file (a NUL byte, or not UTF-8), as ``git grep -I``."""
    data = (REPO / rel).read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


@pytest.mark.parametrize("line", [
    "see issue" + " 26 for the numbers",
    "Issue" + " 3: pins",
    "# --- attack" + " pass 2: values that got through",
    "touched (issue" + " 10 item" + " 1c).",
    "Shapes from finding" + " 4",
    "(issue" + " 12 items" + " 1, 2)",
    "issue" + "#7",
    "Attack" + " F1 #3: URL credentials",
    "def test_attack" + "5_shapes():",
    "attack" + " 4 rs-flood",
    "Attack" + " pass: values",
    "sgl-project/sglang#31600; our issue" + " 26 too",
])
def test_tracker_references_are_caught(line):
    assert tracker_refs(line), line


@pytest.mark.parametrize("line", [
    "sgl-project/sglang#31600: the health check",
    "NVIDIA/gpu-operator#2781 (the driver container)",
    "pytest-dev/pytest-xdist#1386, worksteal",
    "sgl-project/sglang#5029, #1467 (Capture cuda graph failed)",
    "sgl-project/sglang issue" + " 31600",
    "NVIDIA/gpu-operator issue" + " #2781",
    "https://github.com/sgl-project/sglang/" + "issues/31600",
    "there is an issue with the port",
    "the issue here is that systemd restarts it",
    "a finding names the field; the findings of each host",
    "each item of the list; the attacker's label",
    "tissue" + " 3, reattack" + " 2",
])
def test_ordinary_words_and_upstream_references_are_not_flagged(line):
    assert tracker_refs(line) == [], line


def test_this_file_does_not_trip_on_its_own_patterns():
    """The scan below covers this file like any other; this says so on its own when it does not."""
    text = (REPO / "tests" / "test_house.py").read_text()
    assert [ln for ln in text.splitlines() if tracker_refs(ln)] == []


def test_no_tracker_numbers_in_tracked_files():
    files = tracked_text_files()
    assert "tests/test_house.py" in files and "README.md" in files  # the scan sees the checkout
    hits = []
    for rel in files:
        text = read_text(rel)
        if text is None:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if tracker_refs(line):
                hits.append(f"{rel}:{n}: {line.strip()[:160]}")
    assert not hits, ("tracker numbers readers cannot open; say why in words (upstream owner/repo#N "
                      "references are fine):\n" + "\n".join(hits))
