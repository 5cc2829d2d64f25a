"""Warmup and health (``ddtree_ops.runtime.warmup``, ``ddtree_ops.runtime.health``) against the SGLang
simulator on loopback (free ports), started with the argv our renderer builds; faults come
from the simulator's ``/_sim/fault`` controls."""

from __future__ import annotations

import copy
import json
import struct
import threading
import time
import zlib

import httpx
import pytest
from helpers import base_hostvars
from test_sim import Sim, http, post_json

from ddtree_ops.cli import main
from ddtree_ops.config.load import validate_hostvars
from ddtree_ops.config.plandoc_model import PlanSizes
from ddtree_ops.render.argv import build_argv
from ddtree_ops.render.files import plan_document, render_host
from ddtree_ops.runtime.health import CHECK_NAMES, HealthOptions, bound_s, check_health
from ddtree_ops.runtime.warmup import (
    WarmupError,
    image_data_url,
    image_side,
    make_png,
    warmup,
    warmup_batch_sizes,
    warmup_plan,
)

MIN_PIXELS = 3136


def _validated(budget: int = 32, vision: bool = True, **server):
    hv = base_hostvars()
    hv["ddtree_sglang"] = {"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree"}
    hv["ddtree_speculative"]["budget"] = budget
    hv["ddtree_server"].update(server)
    if vision:
        hv["ddtree_model"] = {**hv["ddtree_model"], "vision": True, "vision_min_pixels": MIN_PIXELS}
    return validate_hostvars("h1", hv)


def _launch(v) -> list[str]:
    argv = build_argv(v.deployment, v.plan)
    launch = argv[argv.index("--model-path"):]
    i = launch.index("--port")  # the Sim helper picks a free port
    del launch[i:i + 2]
    return launch


def _fault(sim: Sim, **faults) -> None:
    post_json(sim.base + "/_sim/fault", faults)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A vision DDTree deployment (block 8, budget 32, 16 requests) served by the simulator."""
    tmp = tmp_path_factory.mktemp("warm")
    v = _validated()
    sim = Sim(tmp, _launch(v), env={"SGLANG_SIM_VISION_MIN_PIXELS": str(MIN_PIXELS)})
    sim.wait_ready()
    plan_json = tmp / "plan.json"
    plan_json.write_text(json.dumps(plan_document(v)))
    yield {"sim": sim, "doc": plan_document(v), "plan_json": plan_json, "tmp": tmp}
    sim.stop()


@pytest.fixture
def sim(deployed):
    yield deployed["sim"]
    _fault(deployed["sim"], health_hang=False, health_503=0, freeze=False)


# ------------------------------------------------------------------ pure parts
def test_batch_sizes_are_the_capture_list_or_an_eager_ladder():
    def sizes_of(**plan):
        return warmup_batch_sizes(PlanSizes(algorithm="none", draft_tokens_per_req=0, verify_tokens_per_req=1, **plan))

    assert sizes_of(cuda_graphs=True, capture_bs=[1, 2, 4, 8, 16])[0] == [1, 2, 4, 8, 16]
    sizes, why = sizes_of(cuda_graphs=False, capture_bs=[], max_running_requests=48)
    assert sizes == [1, 2, 4, 8, 16, 32, 48] and "powers of two" in why and "48" in why
    assert sizes_of(cuda_graphs=False, capture_bs=[], max_running_requests=None,
                    cuda_graph_max_bs=None)[0] == [1, 2, 4, 8]
    v = _validated(vision=False, cuda_graph=False)   # eager deployment: 16 requests
    assert warmup_plan(plan_document(v)).batch_sizes == [1, 2, 4, 8, 16]


@pytest.mark.parametrize("min_pixels", [1, 3136, 3137, 200_704])
def test_generated_png_is_valid_and_large_enough(min_pixels):
    side = image_side(min_pixels)
    assert side * side >= min_pixels and side % 28 == 0
    png = make_png(side, side)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, seen = 8, b"", []
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos:pos + 4])
        kind, data = png[pos + 4:pos + 8], png[pos + 8:pos + 8 + n]
        (crc,) = struct.unpack(">I", png[pos + 8 + n:pos + 12 + n])
        assert crc == zlib.crc32(kind + data) & 0xFFFFFFFF
        seen.append(kind)
        idat += data if kind == b"IDAT" else b""
        pos += 12 + n
    assert seen == [b"IHDR", b"IDAT", b"IEND"]
    w, h = struct.unpack(">II", png[16:24])
    assert (w, h) == (side, side)
    assert len(zlib.decompress(idat)) == h * (1 + 3 * w)   # filter byte + RGB per row


# ------------------------------------------------------------------ warmup
def test_warmup_covers_every_batch_size_of_the_plan(deployed, capsys):
    marker = deployed["tmp"] / "run" / "warm.json"
    rc = main(["warmup", deployed["sim"].base, "--plan", str(deployed["plan_json"]), "--json",
               "--marker", str(marker), "--long-prompt-words", "300"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    report = out["report"]
    capture = deployed["doc"]["plan"]["capture_bs"]
    text = [r for r in report["results"] if r["kind"] == "text"]
    assert [r["batch_size"] for r in text] == capture == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]
    for r in text:
        assert r["requests"] == 2 * r["batch_size"]                 # greedy round + sampled round
        assert set(r["round_latency_s"]) == {"greedy", "sampled"}
        assert r["completion_tokens"] == 2 * r["batch_size"] * 32
        assert r["accept_length"] > 1                               # meta_info.spec_accept_length
        assert r["prompt_tokens"] >= 300                            # the long prompt went in
    vision = [r for r in report["results"] if r["kind"] == "vision"]
    assert len(vision) == 1 and vision[0]["completion_tokens"] > 0
    assert vision[0]["prompt_tokens"] >= MIN_PIXELS // (28 * 28)    # the image's patch tokens counted
    assert json.loads(marker.read_text())["batch_sizes"] == capture


def test_simulator_refuses_images_below_the_minimum_and_text_only_models(deployed):
    url, w, h = image_data_url(MIN_PIXELS)
    ok = post_json(deployed["sim"].base + "/generate", {"text": "<image> describe", "image_data": url,
                                                        "sampling_params": {"max_new_tokens": 4}})
    assert ok["meta_info"]["prompt_tokens"] >= 2 + (w * h) // 784
    small = "data:image/png;base64," + __import__("base64").b64encode(make_png(20, 20)).decode()
    status, body = http(
        "POST",
        deployed["sim"].base + "/v1/chat/completions",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": small}}, {"type": "text", "text": "hi"}],
                }
            ]
        },
    )
    assert status == 400 and b"below the model's minimum" in body


def test_warmup_fails_loudly_when_the_server_is_killed(tmp_path, capsys):
    v = _validated(vision=False)
    s = Sim(tmp_path, _launch(v), env={"SGLANG_SIM_STEP_SECONDS": "0.02"})
    s.wait_ready()
    done = []

    def kill_after_two(res):
        done.append(res.batch_size)
        if len(done) == 2:
            s.proc.kill()

    try:
        with pytest.raises(WarmupError, match=r"batch size 3 \(greedy round\).*(crashed|connection)"):
            warmup(s.base, [1, 2, 3, 4], deadline_s=30, on_progress=kill_after_two)
        assert done == [1, 2]
        rc = main(["warmup", s.base, "--batch-sizes", "1,2", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert rc == 1 and out["checks"][0]["name"] == "warmup" and not out["checks"][0]["ok"]
        assert "batch size 1" in out["checks"][0]["detail"]
    finally:
        s.stop()


def test_warmup_is_bounded_by_its_deadline(sim, capsys):
    _fault(sim, freeze=True)
    t0 = time.monotonic()
    rc = main(["warmup", sim.base, "--batch-sizes", "1,2", "--deadline", "1.5", "--json"])
    elapsed = time.monotonic() - t0
    detail = json.loads(capsys.readouterr().out)["checks"][0]["detail"]
    assert rc == 1 and "deadline of 1.5 s passed during batch size 1" in detail
    assert elapsed < 4
    _fault(sim, freeze=False)


# ------------------------------------------------------------------ health
def test_health_passes_with_the_deep_check(deployed, sim, capsys):
    rc = main(["health", "--plan", str(deployed["plan_json"]), sim.base, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    names = [c["name"] for c in out["checks"]]
    assert names == ["reachable", "ready", "drift", "progress", "accept_length"]
    assert set(names) <= set(CHECK_NAMES) and all(c["ok"] for c in out["checks"])
    assert "match the deployed config" in out["checks"][2]["detail"]
    # the figure says which verify passes it covers: warmup's (its own requests) differs and that is expected
    acc = out["checks"][4]["detail"]
    assert "tokens per verify pass" in acc, acc
    assert "since the server started" in acc and "warmup and bench give their own requests' mean" in acc


def test_single_503_is_not_unhealthy(deployed, sim):
    _fault(sim, health_503=1)
    checks = {c.name: c for c in check_health(sim.base, options=HealthOptions(timeout=3, failures=3, interval_s=0.1))}
    assert checks["ready"].ok and "after 1 failed" in checks["ready"].detail and "503" in checks["ready"].detail
    _fault(sim, health_503=3)  # three in a row with failures=3: unhealthy
    checks = {c.name: c for c in check_health(sim.base, options=HealthOptions(timeout=3, failures=3, interval_s=0.1))}
    assert not checks["ready"].ok and "3 consecutive" in checks["ready"].detail


def test_hanging_health_times_out_within_its_bound(sim, capsys):
    _fault(sim, health_hang=True)
    t0 = time.monotonic()
    # a server whose SGLANG_HEALTH_CHECK_TIMEOUT is 1 s: each probe waits past it (1 + 1 + 2 s)
    rc = main(["health", sim.base, "--timeout", "3", "--failures", "2", "--interval", "0.5",
               "--sglang-health-timeout", "1", "--json"])
    elapsed = time.monotonic() - t0
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    checks = {c["name"]: c for c in out["checks"]}
    assert (
        checks["reachable"]["ok"]
        and not checks["ready"]["ok"]
        and "no complete answer within 4 s" in checks["ready"]["detail"]
    )
    assert 8 <= elapsed < 2 * (4 + 0.5) + 2, elapsed          # two probes of 4 s, then done
    assert elapsed < out["bound_s"]


def test_200_while_counters_frozen_and_requests_queue_is_unhealthy(deployed, sim, capsys):
    _fault(sim, freeze=True)
    errors: list[Exception] = []

    def client() -> None:
        try:
            httpx.post(sim.base + "/generate", json={"text": "hello", "sampling_params": {"max_new_tokens": 4}},
                       timeout=60)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(20)]  # 16 run, 4 queue
    for t in threads:
        t.start()
    from ddtree_ops.sglang.client import select_samples

    deadline = time.monotonic() + 10  # all 20 admitted (on 2 busy cores 0.5 s was not always enough)
    while time.monotonic() < deadline:
        found = select_samples(httpx.get(sim.base + "/metrics", timeout=5).text,
                               ("sglang:num_running_reqs", "sglang:num_queue_reqs"))
        if sum(v for series in found.values() for _, v in series) >= 20:
            break
        time.sleep(0.05)
    assert http("GET", sim.base + "/health")[0] == 200
    rc = main(["health", sim.base, "--plan", str(deployed["plan_json"]), "--failures", "2",
               "--progress-window", "0.5", "--json"])
    out = json.loads(capsys.readouterr().out)
    checks = {c["name"]: c for c in out["checks"]}
    assert rc == 1 and checks["ready"]["ok"] and not checks["progress"]["ok"]
    assert "16 running, 4 queued" in checks["progress"]["detail"]
    _fault(sim, freeze=False)
    for t in threads:
        t.join(30)
    assert not errors
    # the same requests, moving: healthy
    threads = [threading.Thread(target=client) for _ in range(20)]
    for t in threads:
        t.start()
    time.sleep(0.2)
    checks = {
        c.name: c for c in check_health(sim.base, options=HealthOptions(timeout=3, failures=2, progress_window_s=0.3))
    }
    assert checks["progress"].ok, checks["progress"]
    for t in threads:
        t.join(30)


def test_drift_is_unhealthy_and_names_the_setting(tmp_path, capsys):
    running = _validated(budget=16, vision=False)     # the server runs budget 16 ...
    deployed_doc = plan_document(_validated(budget=32, vision=False))   # ... the host's plan says 32
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(deployed_doc))
    s = Sim(tmp_path, _launch(running))
    s.wait_ready()
    try:
        rc = main(["health", s.base, "--plan", str(plan), "--json"])
        out = json.loads(capsys.readouterr().out)
        drift = {c["name"]: c for c in out["checks"]}["drift"]
        assert rc == 1 and not drift["ok"]
        assert "budget: deployed 32, running 16 (server_info.speculative_ddtree_budget)" in drift["detail"]
    finally:
        s.stop()


def test_warm_marker_check(deployed, sim, tmp_path):
    o = HealthOptions(timeout=3, failures=1, warm_marker=tmp_path / "warm.json")
    assert {c.name: c for c in check_health(sim.base, options=o)}["warm"].ok is False
    rep = warmup(sim.base, [1], deadline_s=30)
    from ddtree_ops.runtime.warmup import write_marker
    write_marker(tmp_path / "warm.json", rep)
    assert {c.name: c for c in check_health(sim.base, options=o)}["warm"].ok is True


def test_health_down_server_fails_fast_and_bound_is_documented():
    o = HealthOptions(timeout=1, failures=2, interval_s=0.1)
    t0 = time.monotonic()
    checks = check_health("http://127.0.0.1:9", options=o)
    assert [c.name for c in checks] == ["reachable"] and not checks[0].ok
    assert time.monotonic() - t0 < bound_s(o)


def test_health_usage_errors_exit_2(capsys, tmp_path):
    bad = tmp_path / "plan.json"
    bad.write_text("{}")
    assert main(["health", "--plan", str(bad)]) == 2
    assert main(["health"]) == 2                                  # no URL and no deployment
    assert main(["health", "http://127.0.0.1:9", "--failures", "0"]) == 2
    assert main(["warmup", "http://127.0.0.1:9", "--plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not a plan.json rendered by ddtree-ops" in err and "Traceback" not in err


@pytest.mark.parametrize("ops, key", [(None, None), ({"health_timeout_s": "abc"}, "health_timeout_s"),
                                      ({"health_failures": "x"}, "health_failures"),
                                      ({"health_timeout_s": None}, "health_timeout_s"),
                                      ({"warmup_deadline_s": "10m"}, "warmup_deadline_s"), ([1], "ops")])
def test_plan_with_non_numeric_ops_is_a_usage_error_naming_the_key(ops, key, capsys, tmp_path):
    """A hand-edited plan.json whose deployment.ops values are not numbers is exit 2 naming the key
    (was ``AttributeError: 'NoneType' ...`` / ``ValueError: could not convert ...``); ops: null means defaults."""
    doc = plan_document(_validated(vision=False))
    doc["deployment"]["ops"] = ops
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    cmd = "warmup" if key == "warmup_deadline_s" else "health"
    rc = main([cmd, "http://127.0.0.1:9", "--plan", str(plan), "--batch-sizes", "1"] if cmd == "warmup"
              else [cmd, "http://127.0.0.1:9", "--plan", str(plan), "--failures", "1", "--timeout", "1"]
              if key is None else [cmd, "http://127.0.0.1:9", "--plan", str(plan)])
    err = capsys.readouterr().err
    if key is None:  # defaults apply; the server is down, so the check (not the plan) fails
        assert rc == 1 and "Error:" not in err, err
        return
    assert rc == 2 and f"{key} = {(ops if key == 'ops' else ops[key])!r}" in err, err
    assert "Error:" not in err and "Traceback" not in err


@pytest.mark.parametrize(
    "model, words",
    [
        ({"context_length": "abc"}, "context_length = 'abc'"),
        ({"vision": True, "vision_min_pixels": 10**12}, "vision_min_pixels = 10000"),
        ({"vision": True, "vision_min_pixels": -1}, "vision_min_pixels = -1"),
    ],
)
def test_warmup_refuses_plan_model_values_before_any_request(model, words, capsys, tmp_path):
    """Out-of-bounds context_length / vision_min_pixels in plan.json are exit 2 up front — they used
    to end the run with TypeError, or ValueError after every text step (minutes on a real host)."""
    doc = plan_document(_validated(vision=False))
    doc["deployment"]["model"].update(model)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    assert main(["warmup", "http://127.0.0.1:9", "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert words in err and "Error:" not in err, err


@pytest.mark.parametrize("cmd", ["health", "warmup"])
@pytest.mark.parametrize("url", [None, "garbage"])
def test_bad_url_in_plan_is_named(cmd, url, capsys, tmp_path):
    """A plan.json without a usable url: the message names the file and its url (a missing one
    used to ask for '--plan / --inventory', which were given); the plan.json contract's one line."""
    doc = plan_document(_validated(vision=False))
    doc["url"] = url
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    assert main([cmd, "--plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert f"url = {url!r}: not a plan.json rendered by ddtree-ops: must be http(s)://HOST:PORT" in err, err
    assert err.startswith(f"error --plan {plan}: ") and err.count("\n") == 1, err


class _OddServer:
    """A loopback HTTP server answering /health 200 and fixed bodies for /server_info and /metrics."""

    def __init__(self, server_info: bytes, metrics: bytes) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        bodies = {"/health": b"", "/server_info": server_info, "/metrics": metrics}

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                body = bodies.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.end_headers()
                self.wfile.write(body or b"")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.server.shutdown()


@pytest.mark.parametrize("info, metrics, failed, words", [
    (b"[1, 2]", b"", "accept_length", "answered JSON list, not an object"),
    (b'{"internal_states": [null, 5, {"avg_spec_accept_length": "x"}]}', b"sglang:num_running_reqs 0\n", None, None),
    (b'{"model_path": "m", "tp_size": 8, "internal_states": 5}',
     b"sglang:num_running_reqs 1\nsglang:generation_tokens_total notanumber\n", "progress", "not Prometheus text"),
])
def test_odd_server_answers_are_check_results_not_crashes(info, metrics, failed, words):
    """/server_info that is not an object, non-numeric accept lengths and unparseable /metrics are
    failed checks (exit 1) — they used to escape as AttributeError/ValueError (exit 2, no checks)."""
    with _OddServer(info, metrics) as srv:
        checks = check_health(
            srv.url, options=HealthOptions(timeout=2, failures=1, interval_s=0, progress_window_s=0.1)
        )
    by_name = {c.name: c for c in checks}
    assert by_name["reachable"].ok and by_name["ready"].ok
    if failed is None:
        assert by_name["accept_length"].ok and by_name["accept_length"].detail == "no verify pass yet"
    else:
        assert not by_name[failed].ok and words in by_name[failed].detail, checks


@pytest.mark.parametrize("answer, rc, words", [
    (b"[1, 2]", 1, "no meta_info object"),
    (b'{"text": "x", "meta_info": 5}', 1, "no meta_info object"),
    (b'{"text": "x", "meta_info": {"completion_tokens": "x", "spec_accept_length": "y"}}', 0, "2 steps"),
])
def test_warmup_against_a_server_that_is_not_sglang(answer, rc, words, capsys):
    """/generate answers without a meta_info object fail the warmup (a JSON list used to pass it);
    non-numeric meta_info values are skipped, not an AttributeError/ValueError exit 2."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert main(["warmup", f"http://127.0.0.1:{srv.server_address[1]}", "--batch-sizes", "1,2", "--json"]) == rc
    finally:
        srv.shutdown()
    out = capsys.readouterr().out
    assert words in json.loads(out)["checks"][0]["detail"], out


def test_drift_that_compared_nothing_fails(deployed):
    """A /server_info with none of the deployed settings (no model_path, no tp_size) is not
    'running settings match'."""
    with _OddServer(b'{"internal_states": []}', b"") as srv:
        checks = check_health(srv.url, options=HealthOptions(timeout=2, failures=1, interval_s=0,
                                                             plan_doc=deployed["doc"]))
    drift = next(c for c in checks if c.name == "drift")
    assert not drift.ok and "reports none of the deployed settings" in drift.detail


def test_unit_is_active_only_after_health_and_warmup():
    v = _validated(vision=False)
    unit = next(f.content for f in render_host(v) if f.path.endswith(".service"))
    posts = [line for line in unit.splitlines() if line.startswith("ExecStartPost=")]
    assert len(posts) == 2
    assert (
        " health http://127.0.0.1:30000 --wait 3600 " in posts[0]
        and "--plan /etc/ddtree-ops/sglang/plan.json" in posts[0]
    )
    assert " warmup http://127.0.0.1:30000 --plan /etc/ddtree-ops/sglang/plan.json --deadline 600 " in posts[1]
    assert "--marker /run/ddtree-ops/sglang/warm.json" in posts[1]
    assert "RuntimeDirectory=ddtree-ops/sglang" in unit
    d = v.deployment
    assert f"TimeoutStartSec={d.service.start_timeout_s + d.ops.warmup_deadline_s + 60}" in unit
    hv = copy.deepcopy(base_hostvars())
    hv["ddtree_ops"] = {"warmup_deadline_s": 1200}
    hv["ddtree_service"] = {"start_timeout_s": 900}
    unit2 = next(f.content for f in render_host(validate_hostvars("h1", hv)) if f.path.endswith(".service"))
    assert "TimeoutStartSec=2160" in unit2 and "--deadline 1200 " in unit2


def test_warmup_and_health_take_the_deployment_from_the_inventory(deployed, tmp_path, capsys):
    """``-i INVENTORY -l HOST``: URL (ansible_host + port), plan and defaults from the inventory."""
    import yaml

    hv = base_hostvars()
    hv["ddtree_sglang"] = {"source": "simulator", "ddtree_source": "sglang-pr-29907", "simulated_build": "ddtree"}
    hv["ddtree_model"] = {**hv["ddtree_model"], "vision": True, "vision_min_pixels": MIN_PIXELS}
    hv["ddtree_server"]["port"] = deployed["sim"].port
    hv["ddtree_ops"] = {"health_failures": 2, "warmup_deadline_s": 120}
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump(hv))
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(
        {"all": {"children": {"sglang_servers": {"hosts": {"h1": {"ansible_host": "127.0.0.1"}}}}}}))
    rc = main(["warmup", "-i", str(tmp_path), "-l", "h1", "--json", "--long-prompt-words", "50"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out
    assert out["url"] == deployed["sim"].base
    assert [r["batch_size"] for r in out["report"]["results"]] == deployed["doc"]["plan"]["capture_bs"] + [1]
    rc = main(["health", "-i", str(tmp_path), "-l", "h1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and {c["name"] for c in out["checks"]} >= {"drift", "progress"}, out
    assert main(["health", "-i", str(tmp_path), "-l", "nohost"]) == 2
