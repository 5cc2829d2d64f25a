"""``ddtree-ops sweep --deploy`` on the booted test host: four points -- DDTree budget 16,
an autoregressive baseline (no speculation), one refused by the validator, the inventory's own
DDTree 8/32 last (so the host is left as the inventory says without a fourth deploy) -- deployed
through the real ``deploy.yml`` and benchmarked at the host's address; the report ranks the three,
and ``bench-compare`` of the inventory's point against the baseline gives the speedup report and
plots."""

from __future__ import annotations

import json
import re

import pytest
from hostutil import HOST, REPO_ROOT, TEST_INVENTORY, ssh

from ddtree_ops.cli import main

pytestmark = [pytest.mark.hosts, pytest.mark.slow]  # four deploys, ~1 min: scripts/test.sh --slow (CI)


def _deployed_budget(address: str, unit: str) -> int:
    r = ssh(address, f"systemctl cat {unit}")
    assert r.returncode == 0, r.stderr
    m = re.search(r"--speculative-ddtree-budget[ '\"=]+(\d+)", r.stdout)
    assert m, r.stdout[-2000:]
    return int(m.group(1))


def test_sweep_deploys_points_through_the_real_play(deployed, tmp_path, capsys):
    address = deployed["address"]
    spec = tmp_path / "sweep.yml"
    spec.write_text(f"""host: {HOST}
points:
  - {{name: budget16, set: {{ddtree_speculative.budget: 16}}}}
  - {{name: budget0, set: {{ddtree_speculative.budget: 0}}}}
  - {{name: autoregressive, set: {{ddtree_speculative: {{algorithm: none}}}}}}
  - {{name: inventory, set: {{}}}}
""")
    out = tmp_path / "out"
    rc = main(["sweep", str(spec), "-i", str(TEST_INVENTORY), "--out", str(out), "--deploy",
               str(REPO_ROOT / "deploy.yml"), "--deploy-timeout", "600", "--concurrency", "1,4", "--requests", "4",
               "--max-new-tokens", "17", "--warmup", "1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    status = {c["name"]: c["detail"].split(":")[0] for c in doc["checks"]}
    assert rc == 0 and status == {"point budget16": "done", "point budget0": "invalid",
                                  "point autoregressive": "done", "point inventory": "done"}, doc
    state = json.loads((out / "sweep.json").read_text())
    assert state["restore"]["ok"] and "last deployed point" in state["restore"]["detail"]
    assert not (out / "budget0").exists()  # never deployed, never run
    for name, budget in (("budget16", 16), ("inventory", 32)):
        res = json.loads((out / name / "bench.json").read_text())
        assert res["plan"]["deployment"]["speculative"]["budget"] == budget
        assert res["options"]["url"] == f"http://{address}:30000"
        assert all(lv["failed"] == 0 and lv["accept_length_server"] for lv in res["levels"]), res["levels"]
    base = json.loads((out / "autoregressive" / "bench.json").read_text())
    assert base["plan"]["deployment"]["speculative"]["algorithm"] == "none"
    assert all(lv["failed"] == 0 and lv["accept_length"] is None for lv in base["levels"]), base["levels"]
    md = (out / "sweep.md").read_text()
    assert "## concurrency 4" in md and "| budget0 | invalid |" in md
    assert len(re.findall(r"^\| [123] \| (budget16|autoregressive|inventory) \|", md, re.M)) == 6, md
    unit = json.loads((out / "inventory" / "bench.json").read_text())["plan"]["unit"]
    assert _deployed_budget(address, unit) == 32  # the host is left with the inventory's settings
    # the speculative deployment against its autoregressive baseline, as measured on the host
    rc = main(["bench-compare", str(out / "inventory"), str(out / "autoregressive"), "--out", str(out / "report"),
               "--json"])
    cmp = json.loads(capsys.readouterr().out)
    assert rc == 0, cmp
    report = (out / "report" / "report.md").read_text()
    speedups = [float(x) for x in re.findall(r"\| (\d+\.\d+)x \|", report)]
    assert speedups and min(speedups) > 1.5, report
    assert {p.name for p in (out / "report").glob("*.png")} == {"tok_s.png", "accept_length.png", "itl.png"}
