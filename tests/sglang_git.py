"""A small local git repository laid out like SGLang's (package under ``python/``), for
the ``git`` source of the sglang role: no GitHub here, so tests pin a local commit."""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "sglang"
version = "0.5.23"
description = "test stand-in laid out like sgl-project/sglang (python/ subdirectory)"
requires-python = ">=3.10"

[tool.setuptools.packages.find]
include = ["sglang*"]
"""


@dataclass
class GitSource:
    repo: Path
    commit: str
    good_patch: Path
    bad_patch: Path

    @staticmethod
    def sha(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def make_git_source(root: Path) -> GitSource:
    """Repository with one commit on ``main``; a patch that applies to it and one that does not."""
    repo = root / "sglang-src"
    pkg = repo / "python" / "sglang"
    pkg.mkdir(parents=True)
    (repo / "python" / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "__init__.py").write_text("from sglang.version import __version__\n")
    (pkg / "version.py").write_text('__version__ = "0.5.23"\n')
    (pkg / "ddtree.py").write_text("BUDGET_FLAG = None\n")
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    commit = _git(repo, "rev-parse", "HEAD")
    good = root / "0001-ddtree-flag.patch"
    good.write_text("""--- a/python/sglang/ddtree.py
+++ b/python/sglang/ddtree.py
@@ -1 +1 @@
-BUDGET_FLAG = None
+BUDGET_FLAG = "--speculative-ddtree-budget"
""")
    bad = root / "0002-does-not-apply.patch"
    bad.write_text("""--- a/python/sglang/ddtree.py
+++ b/python/sglang/ddtree.py
@@ -1 +1 @@
-THIS_LINE_IS_NOT_THERE = 1
+THIS_LINE_IS_NOT_THERE = 2
""")
    return GitSource(repo, commit, good, bad)
