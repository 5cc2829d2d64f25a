"""Shared test constants and inputs."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
"""Real outputs read off machines and released packages (``tests/fixtures/README.md``)."""


def base_hostvars() -> dict:
    """A valid b300 DDTree deployment (graphs on, risk recorded) as inventory variables."""
    return {
        "ddtree_host_class": "b300",
        "ddtree_sglang": {"source": "git", "ddtree_source": "sglang-pr-29907", "version": "0.5.23"},
        "ddtree_model": {"path": "moonshotai/Kimi-K2.6"},
        "ddtree_speculative": {"algorithm": "DDTREE", "draft_model_path": "z-lab/Kimi-K2.6-DFlash",
                               "block_size": 8, "budget": 32},
        "ddtree_server": {"tp_size": 8, "max_running_requests": 16, "attention_backend": "triton", "page_size": 1},
        "ddtree_accepted_risks": [{"rule": "sm103-ddtree-graph-capture", "reason": "validated in staging for 24 h"}],
    }


def role_text(role: str) -> str:
    """Every task file of ``roles/<role>/tasks/`` as one text (main.yml first, then the files it
    imports: preflight / install / configure ...), for tests that look for what a role runs."""
    tasks = REPO / "roles" / role / "tasks"
    files = [tasks / "main.yml"] + sorted(p for p in tasks.glob("*.yml") if p.name != "main.yml")
    return "\n".join(p.read_text() for p in files)


def role_tasks(role: str) -> list[dict]:
    """Every task of ``roles/<role>/tasks/*.yml``, blocks flattened (a block's own entry kept too)."""
    import yaml

    out: list[dict] = []

    def walk(items: list) -> None:
        for t in items or []:
            out.append(t)
            for key in ("block", "rescue", "always"):
                if isinstance(t.get(key), list):
                    walk(t[key])

    for p in sorted((REPO / "roles" / role / "tasks").glob("*.yml")):
        walk(yaml.safe_load(p.read_text()))
    return out


def gate_document(acc: float | None, floor: float | None = 1.5, ok: bool | None = None, extra_checks=(),
                  elapsed_s: float = 2.5) -> str:
    """What ``ddtree-ops release gate --json`` prints for a gate that measured ``acc`` against
    ``floor`` (the floor check from :func:`ddtree_ops.host.release.floor_check`, the one the gate
    uses), after a passing ``ready`` check and ``extra_checks``; ``ok`` overrides the verdict (a
    host that lies)."""
    import json

    from ddtree_ops.host.release import floor_check

    checks = [{"name": "ready", "ok": True, "detail": "/health answered 200"}, *extra_checks]
    if acc is not None and floor is not None:
        checks.append(floor_check(acc, floor))
    ok = all(c["ok"] for c in checks) if ok is None else ok
    return json.dumps({"ok": ok, "checks": checks, "url": "http://127.0.0.1:30000", "accept_length": acc,
                       "floor": floor, "elapsed_s": elapsed_s}, indent=2)
