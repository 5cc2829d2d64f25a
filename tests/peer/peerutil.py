"""Helpers of the peer test tier: find the cached real-SGLang venvs, run code in them.

Peer test tier: our rendered output checked against REAL released SGLang.

Needs the cached venvs of ``scripts/sglang-venv.sh`` (0.5.13.post1, 0.5.23) and, for the
0.5.23 resolver, ``scripts/sglang-resolve-venv.sh 0.5.23``. ``make peer`` builds/reuses
them and runs this directory with ``DDTREE_PEER=1``.

Without ``DDTREE_PEER=1`` a test whose venv is missing is SKIPPED (the ordinary unit run
stays fast and works on machines without the venvs); with ``DDTREE_PEER=1`` a missing venv
FAILS the test. Venvs are found by the same key the scripts use (version + sha256 of the
lock), never built from here.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers import REPO

PEER_VERSIONS = ("0.5.13.post1", "0.5.23")
VENV_ROOT = Path(os.environ.get("DDTREE_SGLANG_VENV_ROOT", "/var/cache/ddtree-ops/sglang-venv"))
WORKER = Path(__file__).with_name("sglang_worker.py")
REQUIRED = os.environ.get("DDTREE_PEER") == "1"


def _key(lock: Path) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:12]


def import_venv_dir(version: str) -> Path:
    """Where ``scripts/sglang-venv.sh VERSION`` puts (or would put) its venv."""
    lock = REPO / "requirements" / f"sglang-{version}-import.txt"
    return VENV_ROOT / f"{version}-{_key(lock)}"


def resolve_venv_dir(version: str) -> Path | None:
    """Where ``scripts/sglang-resolve-venv.sh VERSION`` put its venv (same key formula)."""
    lock = REPO / "requirements" / f"sglang-{version}-resolve.txt"
    if not lock.exists():
        return None
    base = import_venv_dir(version)
    donor = ""
    for line in lock.read_text().splitlines():
        if line.startswith("# torch-from:"):
            donor = str(import_venv_dir(line.split(":", 1)[1].strip()))
            break
    digest = hashlib.sha256(lock.read_bytes()).hexdigest()
    key = hashlib.sha256(f"{digest}\n{base}\n{donor}\n".encode()).hexdigest()[:12]
    return VENV_ROOT / f"resolve-{version}-{key}"


def _need(venv: Path | None, what: str, how: str) -> Path:
    if venv is not None and (venv / ".ddtree-sglang-venv-complete").exists():
        return venv / "bin" / "python"
    msg = f"{what} venv missing ({venv}); build it with: {how} (or run: make peer)"
    if REQUIRED:
        pytest.fail(msg + " [DDTREE_PEER=1: missing venvs fail the tier]")
    pytest.skip(msg)


def sglang_python(version: str) -> Path:
    """Python of the cached import-only venv of SGLang ``version`` (skip/fail if absent)."""
    return _need(import_venv_dir(version), f"SGLang {version}", f"bash scripts/sglang-venv.sh {version}")


def resolver_python(version: str) -> Path:
    """Python of the resolver child venv of SGLang ``version`` (skip/fail if absent)."""
    return _need(resolve_venv_dir(version), f"SGLang {version} resolver",
                 f"bash scripts/sglang-resolve-venv.sh {version}")


def run_worker(python: Path, jobs: list[dict[str, Any]], tmp: Path, env: dict[str, str] | None = None,
               timeout: float = 300) -> list[dict[str, Any]]:
    """Run :mod:`sglang_worker` jobs in a real-SGLang venv; return one result per job."""
    tmp.mkdir(parents=True, exist_ok=True)
    jobs_file = tmp / f"jobs-{len(list(tmp.glob('jobs-*')))}.json"
    jobs_file.write_text(json.dumps(jobs))
    r = subprocess.run([str(python), str(WORKER), str(jobs_file)], capture_output=True, text=True,
                       timeout=timeout, env={**_clean_env(), **(env or {})}, cwd=tmp)
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    if r.returncode != 0 or not last.startswith("{"):
        raise AssertionError(f"worker failed in {python} (rc {r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(last)["results"]


def _clean_env() -> dict[str, str]:
    """Environment for SGLang subprocesses: no project-venv PYTHONPATH, no GPUs, no network."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "DDTREE_OPS_", "SGLANG_"))}
    env.update(CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1")
    return env


