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
