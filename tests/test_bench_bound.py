"""``bench`` has a time bound like health and warmup (:func:`ddtree_ops.runtime.bench.bound_s`): it is
printed (``bound_s`` in ``--json``, a line otherwise) and a run never exceeds it, whatever the
server does — a server that never answers anything (side requests included) costs at most it."""

from __future__ import annotations

import json
import time

import pytest
from test_hostile_servers import Hostile, never_answers

from ddtree_ops.cli import main
from ddtree_ops.runtime import bench as bench_mod
from ddtree_ops.runtime.bench import BenchOptions, Prompt, bound_s, run

SLACK_S = 0.5  # event-loop start and teardown on 2 shared cores


@pytest.mark.parametrize("shape", [
    {"concurrency": (1, 2), "requests": 3, "warmup_requests": 1},
    {"concurrency": (2,), "requests": None, "duration_s": 0.4, "warmup_requests": 0},
])
def test_a_server_that_never_answers_costs_at_most_bound_s(shape):
    srv = Hostile(never_answers)
    opts = BenchOptions(url=srv.url, request_timeout_s=0.3, max_new_tokens=4, **shape)
    try:
        t0 = time.monotonic()
        res = run(opts, [Prompt("p")])
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert res.failed == sum(lv.requests for lv in res.levels) > 0
    assert took <= bound_s(opts) + SLACK_S, (took, bound_s(opts))
    # the bound is close to the worst case, not a made-up ceiling: this server costs most of it
    assert took >= 0.5 * bound_s(opts), (took, bound_s(opts))


def test_the_bound_is_enforced_even_when_a_request_deadline_would_outlast_it(monkeypatch):
    """A client slower than the structural bound assumed (here: a bound of 1 s and 5 s requests)
    still ends within it: every deadline is cut to the time left."""
    monkeypatch.setattr(bench_mod, "bound_s", lambda o: 1.0)
    srv = Hostile(never_answers, {"/generate"})  # side requests answered: the levels' requests are cut
    try:
        t0 = time.monotonic()
        res = run(BenchOptions(url=srv.url, concurrency=(1, 2), requests=4, warmup_requests=0, request_timeout_s=5.0),
                  [Prompt("p")])
        took = time.monotonic() - t0
    finally:
        srv.close()
    assert took <= 1.0 + SLACK_S and res.failed >= 1


def test_cli_prints_bound_s(tmp_path, capsys):
    srv = Hostile(never_answers)
    try:
        rc = main(["bench", srv.url, "--concurrency", "1", "--requests", "1", "--warmup", "0",
                   "--request-timeout", "0.3", "--out", str(tmp_path / "o"), "--json"])
        doc = json.loads(capsys.readouterr().out)
        opts = BenchOptions(url=srv.url, concurrency=(1,), requests=1, warmup_requests=0, request_timeout_s=0.3)
        assert rc == 1 and doc["bound_s"] == round(bound_s(opts), 3)
        rc = main(["bench", srv.url, "--concurrency", "1", "--requests", "1", "--warmup", "0",
                   "--request-timeout", "0.3", "--out", str(tmp_path / "p")])
        assert rc == 1 and f"at most {round(bound_s(opts), 3):g} s" in capsys.readouterr().err
    finally:
        srv.close()
