"""Every relative link of README.md and docs/**/*.md resolves to a file of the repository, and a
``#fragment`` to a heading of the target page (GitHub's anchor rule: lower case, punctuation
other than ``-`` and ``_`` dropped, spaces to ``-``). Links with a scheme (``https:``,
``mailto:``) are not followed."""

from __future__ import annotations

import re

import pytest
from helpers import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def links(text: str) -> list[str]:
    """Markdown link targets of ``text``, outside fenced code blocks and inline code."""
    text = FENCE.sub("", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def anchors(text: str) -> set[str]:
    """GitHub's anchors of the headings of a Markdown page."""
    out = set()
    for line in FENCE.sub("", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_link_parser_sees_links_and_skips_code():
    text = "see [a](docs/a.md#x) and ![img](p.png)\n```\n[no](b.md)\n```\n`[no](c.md)`\n"
    assert links(text) == ["docs/a.md#x", "p.png"]
    assert anchors("# Readiness under systemd\n## The `sglang` role (x)\n") == {
        "readiness-under-systemd", "the-sglang-role-x"}


def test_the_docs_pages_exist():
    assert (REPO / "docs").is_dir() and len(PAGES) > 5


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    bad = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # https:, mailto:
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(REPO) or not dest.exists():
            bad.append(f"{target}: no such file in the repository")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading #{fragment} in {dest.relative_to(REPO)}")
    assert not bad, f"{page.relative_to(REPO)}: " + "; ".join(bad)
