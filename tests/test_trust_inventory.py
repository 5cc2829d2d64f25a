"""Trust no inventory: a generated corpus of hostile inventories, each run through
``validate``, ``validate --json``, ``plan`` and ``render --out`` (in-process; a few through a
subprocess). Every one must be refused with exit 2, one clear line per error naming the field,
no traceback, no secret, bounded output, and nothing written anywhere.

The corpus is generated here (no fixture files): each case is one hostile value for one field,
or one hostile inventory layout, written as ``hosts.yml`` + ``group_vars/`` like the shipped
``inventory/example``. Run ``pytest -s tests/test_trust_inventory.py -k summary`` for the
results table (kind -> count -> all refused).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers import REPO, base_hostvars, role_tasks, role_text

from ddtree_ops.cli import main
from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.errors import Finding
from ddtree_ops.render import render_prometheus

CANARY = "hf_CANARYsecret0123456789abc"
MAX_OUTPUT = 20_000
BIG = "m" * (5 * 1024 * 1024)


@dataclass
class Case:
    kind: str
    name: str
    field: str  # a string every run's output must name (the field, or the host)
    host: str = "h1"
    group_vars: dict | None = None  # sglang_servers group vars (default: the base deployment)
    group_vars_text: str | None = None  # raw YAML instead (anchors, broken YAML)
    hosts_text: str | None = None  # raw hosts.yml
    host_vars: dict = field(default_factory=dict)
    extra: str = ""  # layout tweak: dual-class, dangling-group-vars, ...


def _base() -> dict:
    gv = copy.deepcopy(base_hostvars())
    gv.pop("ddtree_host_class")  # from the host-class group (b300.yml), as inventory/example does
    return gv


def _with(section: str, key: str | None, value) -> dict:
    gv = _base()
    if key is None:
        gv[section] = value
    else:
        gv[section] = {**gv.get(section, {}), key: value}
    return gv


STRING_FIELDS = [
    ("ddtree_model", "path"), ("ddtree_model", "served_model_name"),
    ("ddtree_speculative", "draft_model_path"), ("ddtree_speculative", "draft_attention_backend"),
    ("ddtree_server", "attention_backend"), ("ddtree_server", "host"),
    ("ddtree_service", "name"), ("ddtree_service", "user"), ("ddtree_service", "venv"),
    ("ddtree_service", "config_dir"), ("ddtree_ops", "scrape_host"), ("ddtree_sglang", "version"),
    ("ddtree_toolchain", "cuda"),
]
HOSTILE_STRINGS = {"newline": "a\nExecStartPre=/x", "nul": "a\0b", "percent": "a%nb", "dollar": "a$HOME",
                   "dquote": 'a"b', "squote": "a'b", "space": "a b", "list": ["a", "b"], "dict": {"a": 1}}

NUMERIC = [  # (section, key, bad value) — every numeric field, below and above its range
    ("ddtree_speculative", "block_size", 1000), ("ddtree_speculative", "block_size", 65),
    ("ddtree_speculative", "block_size", 1), ("ddtree_speculative", "budget", 513),
    ("ddtree_speculative", "budget", 0), ("ddtree_speculative", "num_steps", 33),
    ("ddtree_speculative", "num_steps", 0), ("ddtree_speculative", "topk", 33),
    ("ddtree_speculative", "num_draft_tokens", 2000), ("ddtree_speculative", "draft_window_size", 0),
    ("ddtree_speculative", "verify_tokens_per_req", -1),
    ("ddtree_model", "context_length", 0), ("ddtree_model", "context_length", 1 << 30),
    ("ddtree_model", "vision_min_pixels", 0),
    ("ddtree_server", "port", 80), ("ddtree_server", "port", 70000), ("ddtree_server", "port", True),
    ("ddtree_server", "tp_size", 16), ("ddtree_server", "tp_size", 0), ("ddtree_server", "dp_size", 0),
    ("ddtree_server", "dp_size", 4), ("ddtree_server", "mem_fraction_static", 1.5),
    ("ddtree_server", "max_running_requests", 5000), ("ddtree_server", "max_running_requests", 0),
    ("ddtree_server", "cuda_graph_max_bs", 5000), ("ddtree_server", "cuda_graph_bs", [0, 1]),
    ("ddtree_server", "cuda_graph_bs", list(range(1, 600))), ("ddtree_server", "page_size", 2048),
    ("ddtree_server", "page_size", 0),
    ("ddtree_ops", "exporter_port", 22), ("ddtree_ops", "exporter_port", 30000),
    ("ddtree_ops", "health_timeout_s", 0), ("ddtree_ops", "health_timeout_s", float("nan")),
    ("ddtree_ops", "health_failures", 0), ("ddtree_ops", "ready_timeout_s", 0),
    ("ddtree_ops", "warmup_deadline_s", 5), ("ddtree_ops", "accept_length_floor", 0.5),
    ("ddtree_ops", "accept_length_floor", float("inf")),
    ("ddtree_service", "start_timeout_s", 10), ("ddtree_service", "restart_sec", 0),
    ("ddtree_service", "start_limit_burst", 0), ("ddtree_service", "start_limit_interval_s", 1),
]

BAD_HOSTS = {
    "yaml-injection": 'q"\n      - targets:\n        - "attacker.example:80"',
    "unit-injection": "h1\n[Service]\nExecStartPre=/nonexistent/x",
    "dotdot": "../../../escape", "absolute": "/tmp/abs", "root": "/", "space": "h 1",
    "unicode": "hóst", "quote": "h'1", "percent": "h%n", "dollar": "h$x", "underscore": "h_1",
    "leading-dash": "-h1", "trailing-dash": "h1-", "empty-label": "a..b", "label-64": "a" * 64,
    "total-254": ".".join(["a" * 50] * 5) + ".abc", "tab": "h\t1", "backslash": "h\\1",
    # the last label all digits: resolvers read it as an IPv4 address (RFC 1123 §2.1)
    "all-digits": "1234", "numeric-tld": "b300.10", "ip-as-name-octal": "010.0.0.5",
}


def _bomb(depth: int = 9, width: int = 9) -> str:
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, depth):
        lines.append(f"l{i}: &l{i} [{', '.join(['*l' + str(i - 1)] * width)}]")
    return "\n".join(lines)


def _base_yaml() -> str:
    return yaml.safe_dump(_base(), sort_keys=False)


def _plan_bound_cases() -> list[Case]:
    """Values the writer would put into plan.json that the host's readers refuse, and credentials in argv."""
    cases: list[Case] = []
    # the host's plan readers' bounds (ddtree_ops/_core/plandoc.py: strict JSON, |int| < 2**63, 4 MiB):
    # values the writer would put into plan.json and the host would refuse
    risks = [{"rule": "sm103-ddtree-graph-capture", "reason": f"reason {i} of at least twenty characters"}
             for i in range(1000)]
    for label, (section, key, value, named) in {
        "risks-1000": ("ddtree_accepted_risks", None, risks, "ddtree_accepted_risks"),
        "extra-int-2**64": ("ddtree_server", "extra_args", {"--foo": 2 ** 64}, "ddtree_server.extra_args"),
        "extra-int-2**63": ("ddtree_server", "extra_args", {"--foo": 2 ** 63}, "ddtree_server.extra_args"),
        "extra-inf": ("ddtree_server", "extra_args", {"--foo": float("inf")}, "ddtree_server.extra_args"),
        "extra--inf-in-list": ("ddtree_server", "extra_args", {"--foo": [1, float("-inf")]},
                               "ddtree_server.extra_args"),
        "extra-nan": ("ddtree_server", "extra_args", {"--foo": float("nan")}, "ddtree_server.extra_args"),
    }.items():
        cases.append(Case("plan.json bounds", label, named, group_vars=_with(section, key, value)))
    # a credential in argv lands in the process list, the 0644 unit and plan.json
    for label, value in {"bearer-colon": f"Bearer:{CANARY}", "basic-colon": f"Basic:{CANARY}",
                         "token-eq": f"token={CANARY}", "apikey-eq": f"apikey={CANARY}"}.items():
        cases.append(Case("canary secret", f"argv-{label}", "ddtree_server.extra_args",
                          group_vars=_with("ddtree_server", "extra_args", {"--tokenizer-path": value})))
    return cases


def corpus() -> list[Case]:
    cases: list[Case] = []
    for label, host in BAD_HOSTS.items():
        # Ansible itself refuses some (a newline ends its host pattern): then the error names the inventory
        cases.append(Case("host name", label, "inventory", host=host))
    for section, key in STRING_FIELDS:
        for label, value in HOSTILE_STRINGS.items():
            cases.append(Case("string field", f"{section}.{key}-{label}", f"{section}.{key}",
                              group_vars=_with(section, key, value)))
    for section, key in (("ddtree_model", "path"), ("ddtree_service", "venv"), ("ddtree_server", "attention_backend")):
        cases.append(Case("5 MB string", f"{section}.{key}", f"{section}.{key}", group_vars=_with(section, key, BIG)))
    cases.append(Case("5 MB string", "env-name", "ddtree_service.env",
                      group_vars=_with("ddtree_service", "env", {"A" * (5 << 20): "x"})))
    bomb = _bomb()
    for where, body in {
        "model-extra": "ddtree_model:\n  path: a/b\n  junk: *l8\n",
        "env": "ddtree_service:\n  env: {X: *l8}\n",
        "risks": "ddtree_accepted_risks: *l8\n",
        "unknown-var": "ddtree_junk: *l8\n",
        "cuda-graph-bs": "ddtree_server:\n  cuda_graph_bs: *l8\n",
    }.items():
        gv = {k: v for k, v in _base().items() if not body.startswith(k + ":")}
        text = "__bomb:\n" + "\n".join("  " + ln for ln in bomb.splitlines()) + "\n"
        text = bomb + "\n" + yaml.safe_dump(gv, sort_keys=False) + body
        cases.append(Case("alias bomb", where, where.split("-")[0] if where != "unknown-var" else "ddtree_junk",
                          group_vars_text=text))
    for section, value in (("ddtree_server", "x"), ("ddtree_model", [1]), ("ddtree_speculative", 5),
                           ("ddtree_ops", True), ("ddtree_service", ["a"]), ("ddtree_accepted_risks", {"a": 1}),
                           ("ddtree_sglang", "0.5.23"), ("ddtree_toolchain", 13)):
        cases.append(Case("wrong type", section, section, group_vars=_with(section, None, value)))
    for section, key, value in NUMERIC:
        # dp_size 4 (x tp_size 8 > 8 GPUs) is reported by the GPU-count rule on tp_size, naming both
        cases.append(
            Case(
                "out of range",
                f"{section}.{key}={value!r}"[:60],
                key if key == "dp_size" else f"{section}.{key}",
                group_vars=_with(section, key, value),
            )
        )
    for label, value in {"argv": "fe80::1%eth0 --x", "long": "fe80::1%" + "e" * 16, "newline": "fe80::1%eth0\n",
                         "dollar": "fe80::1%$x", "slash": "fe80::1%a/b"}.items():
        cases.append(Case("scope id", label, "ddtree_server.host", group_vars=_with("ddtree_server", "host", value)))
    for label, value in {"comma": "10.0.0.1,10.0.0.2", "port": "10.0.0.1:22", "url": "http://10.0.0.1",
                         "space": "10.0.0.1 10.0.0.2", "scoped": "fe80::1%eth0", "empty": "",
                         "octal": "0177.0.0.1", "all-digits": "1234", "numeric-tld": "h1.example.10"}.items():
        cases.append(Case("address", f"ansible_host-{label}", "ansible_host", host_vars={"ansible_host": value}))
        cases.append(Case("address", f"scrape_host-{label}", "ddtree_ops.scrape_host",
                          group_vars=_with("ddtree_ops", "scrape_host", value)))
    for section, key in (("ddtree_model", "path"), ("ddtree_model", "served_model_name"),
                         ("ddtree_speculative", "draft_model_path"), ("ddtree_server", "attention_backend")):
        cases.append(Case("argv option", f"{section}.{key}", f"{section}.{key}", group_vars=_with(section, key, "-x")))
    for key, value in (("state_dir", "/etc"), ("state_dir", "/run/ddtree-ops/sglang"), ("cache_dir", "/opt/ddtree-ops"),
                       ("config_dir", "/usr"), ("user", "nobody"), ("group", "shadow"), ("group", "docker")):
        cases.append(Case("system dir/account", f"{key}={value}", f"ddtree_service.{key}",
                          group_vars=_with("ddtree_service", key, value)))
    cases.append(Case("host class", "two-groups", "group_names", extra="dual-class"))
    cases.append(Case("host class", "group-vs-var", "ddtree_host_class", host_vars={"ddtree_host_class": "ct200"}))
    cases.append(Case("unreadable", "broken-hosts-yml", "inventory", hosts_text="sglang_servers:\n  children: {\n"))
    cases.append(Case("unreadable", "broken-group-vars", "inventory", group_vars_text="ddtree_model: [\n"))
    cases.append(Case("unreadable", "dangling-group-vars", "dangling symlink", extra="dangling-group-vars"))
    cases.append(Case("unreadable", "dangling-host-vars", "dangling symlink", extra="dangling-host-vars"))
    cases.append(Case("unreadable", "hosts-yml-is-dir", "inventory", extra="hosts-dir"))
    secret_cases = {
        "hf_token-invalid": ("ddtree_hf_token", None, CANARY + " x"),
        "hf_token-list": ("ddtree_hf_token", None, [CANARY]),
        "env-HF_TOKEN": ("ddtree_service", "env", {"HF_TOKEN": CANARY}),
        "env-WANDB_API_KEY": ("ddtree_service", "env", {"WANDB_API_KEY": CANARY}),
        "env-DB_PASSWORD": ("ddtree_service", "env", {"DB_PASSWORD": CANARY}),
        "env-MY_SECRET": ("ddtree_service", "env", {"MY_SECRET": CANARY}),
        "env-AUTH_HEADER": ("ddtree_service", "env", {"AUTH_HEADER": CANARY}),
        "model-hf_token": ("ddtree_model", "hf_token", CANARY),
        "service-token": ("ddtree_service", "token", CANARY),
        "ops-credentials": ("ddtree_ops", "credentials", {"user": CANARY}),
        "secret_env-bad-name": ("ddtree_secret_env", None, {"bad-name": CANARY}),
        "secret_env-newline": ("ddtree_secret_env", None, {"API_KEY": CANARY + "\nX=1"}),
        "secret_env-derived": ("ddtree_secret_env", None, {"DDTREE_OPS_ALGORITHM": CANARY}),
        "secret_env-HF_TOKEN": ("ddtree_secret_env", None, {"HF_TOKEN": CANARY}),
        "secret_env-list": ("ddtree_secret_env", None, [CANARY]),
        "unknown-var-token": ("ddtree_hf_tokn", None, CANARY),
        # URL credentials, plural secret names, env given as a string
        "sglang-repo-userinfo": ("ddtree_sglang", "repo", f"https://oauth2:{CANARY}@gitlab.example.com/x.git"),
        "sglang-repo-token-user": ("ddtree_sglang", "repo", f"https://{CANARY}@github.com/x/y.git"),
        "sglang-repo-invalid": ("ddtree_sglang", "repo", f"https://oauth2:{CANARY}@gitlab.example.com/x y.git"),
        "sglang-url-userinfo": ("ddtree_sglang", "url", f"https://u:{CANARY}@example.com/sglang.whl"),
        "env-url-userinfo": ("ddtree_service", "env", {"DATABASE_URL": f"postgres://u:{CANARY}@db/x"}),
        "env-API_TOKENS": ("ddtree_service", "env", {"API_TOKENS": CANARY}),
        "env-SSH_KEYS": ("ddtree_service", "env", {"SSH_KEYS": CANARY}),
        "env-as-string": ("ddtree_service", "env", f"X_API_KEY={CANARY}"),
    }
    for label, (section, key, value) in secret_cases.items():
        cases.append(Case("canary secret", label, section if key in (None, "env") else f"{section}.{key}",
                          group_vars=_with(section, key, value)))
    # a template that fails echoes no literal (nor name) of a secret's Jinja source
    for label, expr in {"attr": "{{ {'a': 1}.%s }}", "key": "{{ {'a': 1}['%s'] }}", "undefined": "{{ %s }}",
                        "lookup-file": "{{ lookup('file', '%s') }}", "mandatory": "{{ undefined_x | mandatory('%s') }}",
                        "int-base": "{{ '%s' | int(base='zz') }}"}.items():
        text = _base_yaml() + "ddtree_hf_token: " + json.dumps(expr % CANARY) + "\n"
        cases.append(Case("template error", label, "ddtree_hf_token", group_vars_text=text))
    # Ansible's INI plugin reads a broken hosts.yml after the YAML plugin failed
    cases.append(
        Case("unreadable", "hosts-yml-list", "should be a dictionary", hosts_text="- sglang_servers\n- b300\n")
    )
    cases.append(
        Case("unreadable", "hosts-yml-binary", "hosts.yml is not valid YAML", hosts_text="\x00\x01\x02garbage\n")
    )
    cases += _plan_bound_cases()
    return cases


CORPUS = corpus()


@pytest.fixture(autouse=True)
def _fresh_secret_registry(monkeypatch):
    """Each test starts with no registered secret: a leak cannot hide behind a canary that an
    earlier test registered (register_secret is process-wide)."""
    import ddtree_ops._core.scrub as core_scrub

    monkeypatch.setattr(core_scrub, "_known_secrets", set())
RESULTS: dict[str, list[bool]] = defaultdict(list)


def write_inventory(root: Path, case: Case) -> Path:
    inv = root / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    classes = {"b300": {"hosts": {case.host: case.host_vars or {}}}}
    if case.extra == "dual-class":
        classes["ct200"] = {"hosts": {case.host: {}}}
    hosts = case.hosts_text or yaml.safe_dump({"sglang_servers": {"children": classes}}, sort_keys=False)
    if case.extra == "hosts-dir":
        (inv / "hosts.yml").mkdir()
        (inv / "hosts.yml" / "x.yml").write_text(": : :\n")
    else:
        (inv / "hosts.yml").write_text(hosts)
    (inv / "group_vars" / "b300.yml").write_text("ddtree_host_class: b300\n")
    (inv / "group_vars" / "ct200.yml").write_text("ddtree_host_class: ct200\n")
    gv = case.group_vars_text if case.group_vars_text is not None else \
        yaml.safe_dump(case.group_vars if case.group_vars is not None else _base(), sort_keys=False)
    (inv / "group_vars" / "sglang_servers.yml").write_text(gv)
    if case.extra == "dangling-group-vars":
        (inv / "group_vars" / "all.yml").symlink_to(root / "missing.yml")
    if case.extra == "dangling-host-vars":
        (inv / "host_vars" / f"{case.host}.yml").symlink_to(root / "missing.yml")
    return inv


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run_all(inv: Path, out: Path, capsys) -> list[tuple[str, int, str]]:
    runs = []
    for argv in (["validate", "-i", str(inv)], ["validate", "-i", str(inv), "--json"], ["plan", "-i", str(inv)],
                 ["render", "-i", str(inv), "--out", str(out)]):
        rc = main(argv)
        cap = capsys.readouterr()
        runs.append((" ".join(argv[:1] + argv[3:4]), rc, cap.out + cap.err))
    return runs


def check_refused(runs: list[tuple[str, int, str]], case: Case) -> None:
    for cmd, rc, text in runs:
        where = f"{case.kind}/{case.name}: {cmd}"
        assert rc == 2, f"{where}: exit {rc}\n{text[:2000]}"
        assert "Traceback" not in text, where
        assert CANARY not in text, f"{where}: secret leaked\n{text[:2000]}"
        assert len(text) < MAX_OUTPUT, f"{where}: {len(text)} bytes of output"
        assert case.field in text, f"{where}: does not name {case.field!r}\n{text[:2000]}"
        if "--json" in cmd:
            doc = json.loads(text[: text.rindex("}") + 1])
            assert doc["ok"] is False and doc["errors"], where
            for e in doc["errors"]:
                assert e["field"] and e["rule"] and e["fix"], where
        else:
            lines = [ln for ln in text.splitlines() if ln.startswith("error")]
            assert lines, where
            for ln in lines:  # one line per error: "error host: field = value: rule. Fix: fix"
                assert " = " in ln and "Fix: " in ln, f"{where}: {ln[:300]}"


@pytest.mark.parametrize("case", CORPUS, ids=[f"{c.kind}:{c.name}" for c in CORPUS])
def test_hostile_inventory_refused(case: Case, tmp_path, monkeypatch, capsys):
    sandbox = tmp_path / "sandbox"
    (sandbox / "cwd").mkdir(parents=True)
    monkeypatch.chdir(sandbox / "cwd")
    inv = write_inventory(tmp_path, case)
    out = sandbox / "cwd" / "OUT"
    before = _tree(tmp_path)
    t0 = time.monotonic()
    ok = False
    try:
        check_refused(_run_all(inv, out, capsys), case)
        assert _tree(tmp_path) == before, f"files appeared: {sorted(_tree(tmp_path) - before)[:5]}"
        assert not Path("/tmp/abs").exists() or case.name != "absolute"
        ok = True
    finally:
        RESULTS[case.kind].append(ok)
    assert time.monotonic() - t0 < 10, f"{case.name}: too slow"


@pytest.mark.parametrize("name", ["yaml-injection", "dotdot"])
def test_hostile_inventory_subprocess(name, tmp_path):
    """The console entry point behaves the same (exit 2, one line, no traceback) in a real process."""
    case = next(c for c in CORPUS if c.kind == "host name" and c.name == name)
    inv = write_inventory(tmp_path, case)
    before = _tree(tmp_path)
    for args in (["validate"], ["render", "--out", str(tmp_path / "OUT")]):
        r = subprocess.run([sys.executable, "-m", "ddtree_ops", *args, "-i", str(inv)], capture_output=True,
                           text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert r.returncode == 2 and "Traceback" not in r.stderr and "inventory_hostname" in r.stderr, r.stderr
        assert len([ln for ln in r.stderr.splitlines() if ln.startswith("error")]) == 1, r.stderr
    assert _tree(tmp_path) == before


def test_alias_bomb_fails_fast():
    """The size walk stops at the bound: a billion-laughs value fails in well under a second."""
    from ddtree_ops.config.hostvars import deployment_vars

    lol: list = ["lol"] * 9
    for _ in range(9):
        lol = [lol] * 9
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as exc:
        deployment_vars({"ddtree_model": {"path": "a/b", "x": lol}}, lambda v: v, "h1")
    assert time.monotonic() - t0 < 0.5
    [f] = exc.value.findings
    assert f.field.startswith("ddtree_model.x") and len(f.message()) < 1000


# ---- secrets on success paths -------------------------------------------------------------------

def _valid_with_secrets(tmp_path: Path) -> Path:
    gv = _base()
    gv["ddtree_hf_token"] = CANARY
    gv["ddtree_secret_env"] = {"WANDB_API_KEY": CANARY + "w"}
    return write_inventory(tmp_path, Case("ok", "ok", "", group_vars=gv))


def test_secrets_only_in_secrets_env(tmp_path, capsys):
    inv = _valid_with_secrets(tmp_path)
    out = tmp_path / "OUT"
    texts = []
    for argv in (["validate", "-i", str(inv)], ["validate", "-i", str(inv), "--json"], ["plan", "-i", str(inv)],
                 ["plan", "-i", str(inv), "--json"], ["render", "-i", str(inv), "--out", str(out)]):
        assert main(argv) == 0, argv
        cap = capsys.readouterr()
        texts.append(cap.out + cap.err)
    assert not any(CANARY in t for t in texts)
    files = [p for p in out.rglob("*") if p.is_file()]
    secrets = [p for p in files if p.name == "secrets.env"]
    assert len(secrets) == 1 and oct(secrets[0].stat().st_mode & 0o777) == "0o600"
    body = secrets[0].read_text()
    assert f"HF_TOKEN={CANARY}\n" in body and f"WANDB_API_KEY={CANARY}w\n" in body
    for p in files:
        if p != secrets[0]:
            assert CANARY not in p.read_text(), p
    assert oct((out / "h1/etc/ddtree-ops/sglang/plan.json").stat().st_mode & 0o777) == "0o644"


def test_secret_env_name_in_plain_env_is_refused_with_the_fix():
    hv = base_hostvars()
    hv["ddtree_service"] = {"env": {"WANDB_API_KEY": CANARY}}
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hv)
    [f] = exc.value.findings
    assert "ddtree_secret_env" in f.fix and CANARY not in f.message() and CANARY not in json.dumps(f.as_dict())


def test_known_secret_scrubbed_from_rule_and_fix():
    """A registered secret is scrubbed out of every text field, whatever a rule interpolates."""
    from ddtree_ops.config.errors import register_secret

    register_secret(CANARY)
    f = Finding("error", "ddtree_model.path", f"x{CANARY}", f"rule {CANARY}", f"fix {CANARY}", source=CANARY)
    assert CANARY not in f.message() and CANARY not in json.dumps(f.as_dict())


def _vaulted(tmp_path: Path, plaintext: str):
    """An ansible-core 2.19 vaulted value, decrypted the way a play sees it (tagged VaultedValue)."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.parsing.vault import VaultLib, VaultSecret, VaultSecretsContext

    secret = VaultSecret(b"test-vault-password")
    try:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets=[("default", secret)]))
    except Exception:  # already initialised in this process
        VaultSecretsContext.current().secrets[:] = [("default", secret)]
    cipher = VaultLib([("default", secret)]).encrypt(plaintext).decode()
    src = tmp_path / "v.yml"
    src.write_text("v: !vault |\n" + "".join(f"  {ln}\n" for ln in cipher.splitlines()))
    loader = DataLoader()
    loader.set_vault_secrets([("default", secret)])
    return loader, loader.load_from_file(str(src))["v"]


def test_vaulted_value_redacted_in_action_plugin(tmp_path):
    """A vaulted value in a non-secret field (ddtree_model.path) that breaks a rule: the action
    plugin's msg and findings never carry the decrypted text."""
    from ansible.playbook.task import Task
    from ansible.template import Templar

    sys.path.insert(0, str(REPO / "action_plugins"))
    try:
        from ddtree_render import ActionModule
    finally:
        sys.path.pop(0)
    vault_canary = "vaultCANARY 77"  # a space: refused by the argv rule, so the value would be echoed
    loader, enc = _vaulted(tmp_path, vault_canary)
    task_vars = {**base_hostvars(), "inventory_hostname": "h1", "group_names": ["b300", "sglang_servers"]}
    task_vars["ddtree_model"] = {"path": enc}
    task = Task()
    task.args = {}
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))  # never used: runs on the controller
    action = ActionModule(task=task, connection=connection, play_context=None, loader=loader,
                          templar=Templar(loader=loader, variables=task_vars), shared_loader_obj=None)
    result = action.run(task_vars=task_vars)
    assert result["failed"] and "ddtree_model.path" in result["msg"]
    dumped = json.dumps(result, default=str)
    assert vault_canary not in dumped and "(redacted)" in dumped


# ---- render safety ----------------------------------------------------------------------------

def _render_inv(tmp_path: Path) -> Path:
    return write_inventory(tmp_path, Case("ok", "ok", "", group_vars=_base()))


def test_render_refuses_symlink_inside_out(tmp_path, capsys):
    inv = _render_inv(tmp_path)
    out, elsewhere = tmp_path / "OUT", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "h1").symlink_to(elsewhere)
    assert main(["render", "-i", str(inv), "--out", str(out)]) == 2
    assert "symlink" in capsys.readouterr().err
    assert list(elsewhere.iterdir()) == []


def test_render_replaces_a_symlinked_target_file(tmp_path, capsys):
    inv = _render_inv(tmp_path)
    out, victim = tmp_path / "OUT", tmp_path / "victim"
    victim.write_text("keep\n")
    target = out / "prometheus" / "prometheus.yml"
    target.parent.mkdir(parents=True)
    target.symlink_to(victim)
    assert main(["render", "-i", str(inv), "--out", str(out)]) == 0
    capsys.readouterr()
    assert victim.read_text() == "keep\n" and not target.is_symlink() and "scrape_configs" in target.read_text()


def test_render_refuses_out_of_another_user(tmp_path, capsys):
    inv = _render_inv(tmp_path)
    out = tmp_path / "OUT"
    out.mkdir()
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    os.chown(out, 12345, 12345)
    assert main(["render", "-i", str(inv), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "owned by uid 12345" in err and list(out.iterdir()) == []


@pytest.mark.parametrize("where", ["h1", "h1/etc/ddtree-ops", "prometheus"])
def test_render_refuses_a_directory_of_another_user_inside_out(tmp_path, capsys, where):
    """OUT was ours but OUT/h1 belonged to nobody; render wrote units and
    secrets.env into it. Now refused before the first file is written."""
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    inv = _render_inv(tmp_path)
    out = tmp_path / "OUT"
    (out / where).mkdir(parents=True)
    os.chown(out / where, 65534, 65534)
    assert main(["render", "-i", str(inv), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out / where}: owned by uid 65534" in err and "Fix: " in err
    assert [p for p in out.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize(("where", "mode"), [("", 0o777), ("", 0o1777), ("", 0o775), ("h1", 0o757),
                                             ("h1/etc", 0o770), ("prometheus", 0o777)])
def test_render_refuses_a_group_or_other_writable_directory(tmp_path, capsys, where, mode):
    inv = _render_inv(tmp_path)
    out = tmp_path / "OUT"
    (out / where).mkdir(parents=True, exist_ok=True)
    os.chmod(out / where, mode)
    assert main(["render", "-i", str(inv), "--out", str(out)]) == 2
    err = " ".join(capsys.readouterr().err.split())  # rich may wrap the line
    assert (
        f"mode {mode & 0o7777:04o} lets other users write in it" in err
        and f"chmod go-w {out / where}".rstrip("/") in err
    )
    assert [p for p in out.rglob("*") if p.is_file()] == []


def test_render_under_umask_000_creates_0755_directories(tmp_path, capsys):
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars={**_base(), "ddtree_hf_token": "hf_abcdefgh123"}))
    out = tmp_path / "new" / "deeper" / "OUT"
    old = os.umask(0)
    try:
        assert main(["render", "-i", str(inv), "--out", str(out)]) == 0
    finally:
        os.umask(old)
    capsys.readouterr()
    dirs = [tmp_path / "new", tmp_path / "new/deeper", out] + [p for p in out.rglob("*") if p.is_dir()]
    assert len(dirs) > 6 and {oct(p.stat().st_mode & 0o7777) for p in dirs} == {"0o755"}
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert modes["secrets.env"] == 0o600 and modes["prometheus.yml"] == 0o644


def test_write_under_checks_every_level(tmp_path):
    from ddtree_ops._core.write import UnsafeOutput, check_targets, write_under

    out = tmp_path / "OUT"
    write_under(out, "a/b/c.txt", "x", 0o644)
    os.chmod(out / "a/b", 0o777)
    for call in (lambda: check_targets(out, ["a/b/c.txt"]), lambda: write_under(out, "a/b/d.txt", "x", 0o644)):
        with pytest.raises(UnsafeOutput, match=r"a/b: mode 0777"):
            call()
    check_targets(out, ["a/x/y/z.txt", "q.txt"])  # missing levels are fine: render creates them 0755
    assert not (out / "a/b/d.txt").exists()


def test_write_under_refuses_escapes(tmp_path):
    from ddtree_ops._core.write import UnsafeOutput, write_under

    for rel in ("../x", "a/../../x", "", "/", "a/./b"):
        with pytest.raises(UnsafeOutput):
            write_under(tmp_path / "OUT", rel, "x", 0o644)
    p = write_under(tmp_path / "OUT", "/etc/x/secrets.env", "s\n", 0o600)
    assert p == tmp_path / "OUT/etc/x/secrets.env" and oct(p.stat().st_mode & 0o777) == "0o600"


# ---- prometheus.yml by construction, local_url ------------------------------------------------

HOSTILE_LABELS = ['q"\n      - targets:\n        - "attacker.example:80"', "a: b\nc: d", "{x: 1}", "- a", "'",
                  "&a *a", "# c", "x\u2028y"]


def test_prometheus_one_target_per_host_with_hostile_labels():
    """Labels and addresses fed straight to the renderer (validation would refuse them)."""
    vs = []
    for i, label in enumerate(HOSTILE_LABELS):
        v = validate_hostvars(f"h{i}", base_hostvars())
        d = v.deployment.model_copy(update={
            "host": label, "model": v.deployment.model.model_copy(update={"served_model_name": label}),
            "ops": v.deployment.ops.model_copy(update={"scrape_host": f"h{i}"})})
        vs.append(type(v)(d, v.plan, v.warnings))
    doc = yaml.safe_load(render_prometheus(vs, rule_files=['r.yml"\nx: 1']))
    assert set(doc) == {"global", "rule_files", "scrape_configs"} and doc["rule_files"] == ['r.yml"\nx: 1']
    for job in doc["scrape_configs"]:
        assert len(job["static_configs"]) == len(HOSTILE_LABELS)
        targets = [t for sc in job["static_configs"] for t in sc["targets"]]
        assert len(targets) == len(HOSTILE_LABELS) and not any("attacker" in t for t in targets)
        assert sorted(sc["labels"]["host"] for sc in job["static_configs"]) == sorted(HOSTILE_LABELS)


@pytest.mark.parametrize("host,url", [("0.0.0.0", "http://127.0.0.1:30000"), ("::", "http://[::1]:30000"),
                                      ("10.0.0.5", "http://10.0.0.5:30000"), ("fd00::5", "http://[fd00::5]:30000"),
                                      ("fe80::1%eth0", "http://[fe80::1%25eth0]:30000")])
def test_local_url_used_everywhere(host, url):
    from ddtree_ops.cli.common import _url
    from ddtree_ops.render.files import exporter_unit, plan_document, ready_commands

    hv = base_hostvars()
    hv["ddtree_server"] = {**hv["ddtree_server"], "host": host}
    v = validate_hostvars("h1", hv)
    assert v.deployment.server.local_url == url == plan_document(v)["url"]
    assert all(url in cmd for cmd in ready_commands(v))
    assert url.replace("%", "%%") in exporter_unit(v).content
    assert _url(url) == url  # the CLI's own URL check (health/warmup/exporter) accepts it
    assert all("127.0.0.1" not in " ".join(c) for c in ready_commands(v)) or host == "0.0.0.0"


def test_roles_use_the_action_result_urls():
    svc = role_text("ddtree_service")
    exp = role_text("ddtree_exporter")
    assert '"{{ _ddtree_service_render.url }}/health"' in svc and "127.0.0.1" not in svc
    assert '"{{ _ddtree_exporter_render.exporter_url }}/metrics"' in exp
    [rm] = [t for t in role_tasks("ddtree_service") if t.get("name", "").startswith("Remove the secrets file")]
    assert rm["ansible.builtin.file"] == {"path": "{{ _ddtree_service_render.paths.secrets }}", "state": "absent"}
    assert rm["when"] == "_ddtree_service_secrets.files | length == 0" and rm["notify"] == "Restart ddtree service"


def test_corpus_summary():
    """Corpus size and the results table (kind -> count -> all refused?) for the closing note."""
    kinds: dict[str, int] = defaultdict(int)
    for c in CORPUS:
        kinds[c.kind] += 1
    assert len(CORPUS) >= 150
    print(f"\ncorpus: {len(CORPUS)} hostile inventories x 4 commands")
    print(f"{'kind':<16} {'count':>5}  all refused?")
    for kind, n in kinds.items():
        ran = RESULTS.get(kind, [])
        status = ("yes" if all(ran) else f"NO ({ran.count(False)} not)") if len(ran) == n else f"ran {len(ran)}/{n}"
        print(f"{kind:<16} {n:>5}  {status}")
    if sum(len(r) for r in RESULTS.values()) == len(CORPUS):
        assert all(all(r) for r in RESULTS.values())


def test_an_inventory_host_named_by_its_canonical_ipv4_address_is_accepted():
    """Ansible inventories often name hosts by address: ``10.0.0.5`` is safe in paths and labels
    (non-canonical numeric names such as ``010.0.0.5`` or ``1234`` stay refused)."""
    v = validate_hostvars("10.0.0.5", base_hostvars())
    assert v.deployment.host == "10.0.0.5"
    with pytest.raises(ConfigError, match="inventory_hostname"):
        validate_hostvars("010.0.0.5", base_hostvars())


@pytest.mark.parametrize("cmd", ["health", "warmup"])
@pytest.mark.parametrize("url", ["http://ops:CANARY-url-pw-7731@127.0.0.1:1", "https://CANARY-url-pw-7731@127.0.0.1:1/x",
                                 "http://ops:CANARY-url-pw-7731@[::1]:1"])
def test_credentials_in_a_server_url_are_refused_and_never_echoed(cmd, url, capsys):
    rc = main([cmd, url, "--json"])
    cap = capsys.readouterr()
    assert rc == 2
    assert "CANARY-url-pw-7731" not in cap.out + cap.err
    assert "credentials" in cap.err and "(redacted)@" in cap.err
    assert json.loads(cap.out)["ok"] is False


# ---- vault, linked group_vars, Ansible warnings, templating time --------------------

def _render_action(loader, task_vars: dict):
    from ansible.playbook.task import Task
    from ansible.template import Templar

    sys.path.insert(0, str(REPO / "action_plugins"))
    try:
        from ddtree_render import ActionModule
    finally:
        sys.path.pop(0)
    task = Task()
    task.args = {}
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent"))  # never used: runs on the controller
    return ActionModule(
        task=task,
        connection=connection,
        play_context=None,
        loader=loader,
        templar=Templar(loader=loader, variables=task_vars),
        shared_loader_obj=None,
    ).run(task_vars=task_vars)


def _vault_task_vars(tmp_path: Path, plaintext: str, extra: dict) -> tuple:
    """Task variables as a play sees them: loaded from YAML (so Ansible trusts their Jinja),
    ``vault_v`` a vaulted value, ``extra`` merged into the base deployment."""
    loader, _ = _vaulted(tmp_path, plaintext)
    cipher = (tmp_path / "v.yml").read_text().split("\n", 1)[1]
    variables = copy.deepcopy(base_hostvars())
    for k, v in extra.items():
        variables[k] = {**variables[k], **v} if isinstance(variables.get(k), dict) else v
    src = tmp_path / "vars.yml"
    src.write_text(yaml.safe_dump(variables, sort_keys=False) + "vault_v: !vault |\n" + cipher)
    task_vars = dict(loader.load_from_file(str(src), trusted_as_template=True))
    return loader, {**task_vars, "inventory_hostname": "h1", "group_names": ["b300", "sglang_servers"]}


@pytest.mark.parametrize("section,value,field", [
    ("ddtree_service", {"env": {"FOO": "{{ vault_v }}"}}, "ddtree_service.env.FOO"),  # vaulted, non-secret name
    ("ddtree_service", {"env": {"FOO": "x {{ vault_v }}"}}, "ddtree_service.env.FOO"),  # concatenation drops the tag
    ("ddtree_service", {"env": {"FOO": "{{ vault_v | replace('_', '-') }}"}}, "ddtree_service.env.FOO"),  # a filter
    ("ddtree_model", {"path": "org/{{ vault_v }} x"}, "ddtree_model.path"),  # breaks a rule: would be echoed
    ("ddtree_model", {"path": "{{ derived }}"}, "ddtree_model.path"),  # through another variable
])
def test_vaulted_value_in_a_plain_field_is_refused(tmp_path, section, value, field):
    """A vaulted value (or text made from it) in any field other than
    ddtree_hf_token / ddtree_secret_env is refused; plan, msg and findings never carry it."""
    vault_canary = "VCANARY_s3cr3t_value"
    loader, task_vars = _vault_task_vars(tmp_path, vault_canary, {"derived": "{{ vault_v | upper }}", section: value})
    result = _render_action(loader, task_vars)
    dumped = json.dumps(result, default=str)
    assert result.get("failed") and field in result["msg"] and "ddtree_secret_env" in result["msg"], result.get("msg")
    assert vault_canary not in dumped and vault_canary.upper() not in dumped and "VCANARY-s3cr3t" not in dumped


def test_vaulted_value_in_the_secret_fields_is_accepted(tmp_path):
    loader, task_vars = _vault_task_vars(tmp_path, "VCANARY_s3cr3t_value", {
        "ddtree_hf_token": "{{ vault_v }}", "ddtree_secret_env": {"WANDB_API_KEY": "{{ vault_v }}"}})
    result = _render_action(loader, task_vars)
    assert not result.get("failed"), result.get("msg")
    assert "VCANARY" not in json.dumps(result, default=str)  # non-secret files only (secrets: false)


def _vault_inventory(tmp_path: Path, extra: str) -> tuple[Path, Path]:
    """An inventory whose group_vars carry ``vault_v`` encrypted by ``ansible-vault encrypt_string``."""
    pw = tmp_path / "vault-pw"
    pw.write_text("vpass-for-tests\n")
    r = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-vault"),
            "encrypt_string",
            "--vault-password-file",
            str(pw),
            "--name",
            "vault_v",
            "VCANARY_s3cr3t_value",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars=_base()))
    (inv / "group_vars" / "all.yml").write_text(r.stdout + "\n")
    (inv / "host_vars" / "h1.yml").write_text(extra)
    return inv, pw


def test_vault_password_file_option(tmp_path, capsys, monkeypatch):
    """With --vault-password-file (or ANSIBLE_VAULT_PASSWORD_FILE) the CLI reads a
    vaulted inventory; the token lands only in secrets.env, the canary in no output."""
    inv, pw = _vault_inventory(tmp_path, 'ddtree_hf_token: "{{ vault_v }}"\n')
    out = tmp_path / "OUT"
    texts = []
    for argv in (["validate", "-i", str(inv), "--vault-password-file", str(pw)],
                 ["plan", "-i", str(inv), "--json", "--vault-password-file", str(pw)],
                 ["render", "-i", str(inv), "--out", str(out), "--vault-password-file", str(pw)]):
        assert main(argv) == 0, argv
        cap = capsys.readouterr()
        texts.append(cap.out + cap.err)
    assert not any("VCANARY" in t for t in texts)
    files = {p.name: p.read_text() for p in out.rglob("*") if p.is_file()}
    assert "HF_TOKEN=VCANARY_s3cr3t_value\n" in files.pop("secrets.env")
    assert files and not any("VCANARY" in t for t in files.values())
    import ansible.constants as C

    monkeypatch.setattr(C, "DEFAULT_VAULT_PASSWORD_FILE", None)
    assert main(["validate", "-i", str(inv)]) == 2  # no password: the earlier load's secrets do not carry over
    err = capsys.readouterr().err
    assert "--vault-password-file" in err and "VCANARY" not in err
    # ANSIBLE_VAULT_PASSWORD_FILE (read by Ansible's config into this constant) is honoured as by ansible-inventory
    monkeypatch.setattr(C, "DEFAULT_VAULT_PASSWORD_FILE", str(pw))
    assert main(["validate", "-i", str(inv)]) == 0
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(tmp_path / "missing")]) == 2
    assert "--vault-password-file" in capsys.readouterr().err
    monkeypatch.setattr(C, "DEFAULT_VAULT_PASSWORD_FILE", None)
    assert main(["validate", "-i", str(inv), "--vault-password-file", f"default@{pw}"]) == 0  # [id@]path form


def test_vaulted_value_in_plain_env_refused_by_the_cli(tmp_path, capsys):
    inv, pw = _vault_inventory(tmp_path, 'ddtree_service: {env: {FOO: "{{ vault_v }}"}}\n')
    for argv in (["validate", "-i", str(inv), "--json"], ["render", "-i", str(inv), "--out", str(tmp_path / "OUT")]):
        assert main([*argv, "--vault-password-file", str(pw)]) == 2
        cap = capsys.readouterr()
        assert "VCANARY" not in cap.out + cap.err and "ddtree_service.env.FOO" in cap.out + cap.err
    assert not (tmp_path / "OUT").exists()


def test_dangling_symlink_inside_a_linked_group_vars_dir(tmp_path, capsys):
    """group_vars/sglang_servers -> shared/, shared/vault.yml dangling: refused (Ansible
    would skip it and the role would delete the host's secrets); a directory link loop ends."""
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars=_base()))
    shared = tmp_path / "shared"
    shared.mkdir()
    (inv / "group_vars" / "sglang_servers.yml").rename(shared / "main.yml")
    (inv / "group_vars" / "sglang_servers").symlink_to(shared)
    (shared / "loop").symlink_to(shared)  # a loop: walked once
    assert main(["validate", "-i", str(inv)]) == 0
    capsys.readouterr()
    (shared / "vault.yml").symlink_to(tmp_path / "gone" / "vault.yml")
    assert main(["render", "-i", str(inv), "--out", str(tmp_path / "OUT")]) == 2
    err = capsys.readouterr().err
    assert "vault.yml" in err and "dangling symlink" in err
    assert not (tmp_path / "OUT").exists()


def test_duplicate_key_warning_without_the_secret(tmp_path, capsys):
    """Ansible's duplicate-key warning quotes the source lines; ours is one line with
    the origin, and the secret is in no output."""
    text = _base_yaml() + f"ddtree_hf_token: {CANARY}\nddtree_hf_token: {CANARY}b\n"
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars_text=text))
    for argv in (["validate", "-i", str(inv)], ["plan", "-i", str(inv), "--json"]):
        assert main(argv) == 0
        cap = capsys.readouterr()
        assert CANARY not in cap.out + cap.err
        [warn] = [ln for ln in cap.err.splitlines() if "duplicate" in ln]
        assert "'ddtree_hf_token'" in warn and "sglang_servers.yml:" in warn


@pytest.mark.parametrize("expr", ["{% for i in range(10**8) %}a{% endfor %}", "{{ lookup('pipe', 'sleep 4') }}"])
def test_templating_has_a_deadline(tmp_path, capsys, monkeypatch, expr):
    """Inventory Jinja is bounded per host (10 s; 0.5 s here): one finding naming the variable."""
    import ddtree_ops.config.inventory as inventory

    monkeypatch.setattr(inventory, "TEMPLATE_DEADLINE_S", 0.5)
    gv = _with("ddtree_model", "path", expr)
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars=gv))
    t0 = time.monotonic()
    assert main(["validate", "-i", str(inv)]) == 2
    assert time.monotonic() - t0 < 5
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert "ddtree_model" in line and "longer than 0.5 s" in line


def test_deadline_kills_what_a_lookup_started(tmp_path):
    """Past the deadline the pipe lookup's processes are killed, so a caller that
    captures the output (here subprocess pipes, as Ansible or ``| cat``) gets EOF at once, not
    after the 30 s sleep."""
    gv = _with("ddtree_model", "path", "{{ lookup('pipe', 'sleep 30; echo x') }}")
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars=gv))
    code = ("import sys; import ddtree_ops.config.inventory as i; i.TEMPLATE_DEADLINE_S = 1.0; "
            "from ddtree_ops.cli import main; sys.exit(main(sys.argv[1:]))")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, "validate", "-i", str(inv), "--json"], capture_output=True,
                       text=True, timeout=25, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    took = time.monotonic() - t0
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert took < 1.0 + 6, took  # deadline + start-up; the sleep would hold the pipes for 30 s
    assert "longer than 1 s" in r.stdout and ("was killed" in r.stdout or "were killed" in r.stdout), r.stdout


def test_vault_values_the_deployment_does_not_refer_to_are_decrypted_up_to_a_bound(tmp_path, monkeypatch):
    """Each vaulted string costs a key derivation: those the deployment refers to (by name, through
    other variables' Jinja) are always decrypted; the others too (their text may be pasted by hand into
    a plain field), at most MAX_UNREACHED_DECRYPTS per host; every one marks its holder."""
    import ddtree_ops.config.hostvars as models
    from ddtree_ops.config.hostvars import _reachable_vars, _vault_plaintexts

    _, enc = _vaulted(tmp_path, "VCANARY_reachable_secret")
    all_vars = {**base_hostvars(), "junk_vaulted": [enc] * 50, "used": enc, "mid": "{{ used ~ 'x' }}",
                "by_lookup": enc, "unrelated": "{{ junk_vaulted | length }}"}
    all_vars["ddtree_service"] = {"env": {"FOO": "{{ mid }}", "BAR": "{{ lookup('vars', 'by_lookup') }}"}}
    assert {"used", "mid", "by_lookup", "ddtree_service"} <= _reachable_vars(all_vars)
    assert not {"junk_vaulted", "unrelated"} & _reachable_vars(all_vars)
    decrypted = []
    plain, holders = _vault_plaintexts(all_vars, lambda v: decrypted.append(v) or "plain-of-a-vault")
    assert len(decrypted) == 52 and plain == {"plain-of-a-vault"}  # used, by_lookup and the 50
    assert {"junk_vaulted", "used", "mid", "by_lookup", "unrelated", "ddtree_service"} <= holders
    monkeypatch.setattr(models, "MAX_UNREACHED_DECRYPTS", 10)
    decrypted.clear()
    _vault_plaintexts(all_vars, lambda v: decrypted.append(v) or "plain-of-a-vault")
    assert len(decrypted) == 12  # the two reachable ones whatever the bound, 10 of the 50


def test_decryption_past_the_deadline_names_decryption(tmp_path, capsys, monkeypatch):
    """Many vaulted values the deployment refers to, past the (shortened) deadline:
    the finding names decryption and the variable, not "a Jinja loop or a slow lookup"."""
    import ddtree_ops.config.inventory as inventory

    monkeypatch.setattr(inventory, "TEMPLATE_DEADLINE_S", 0.1)
    pw = tmp_path / "pw"
    pw.write_text("vpw-many\n")
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars=_with("ddtree_service", "env",
                                                                            {"FOO": "{{ many | length }}"})))
    # encrypted in another process: Ansible caches derived keys per process, which would make decryption free
    code = ("import sys; from ansible.parsing.vault import VaultLib, VaultSecret; v = VaultLib([('default', "
            "VaultSecret(b'vpw-many'))]); sys.stdout.write('many:\\n' + ''.join('  - !vault |\\n' + ''.join("
            "'      ' + ln + '\\n' for ln in v.encrypt('v%d' % i).decode().splitlines()) for i in range(150)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    (inv / "group_vars" / "all.yml").write_text(r.stdout)
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(pw)]) == 2
    [line] = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error")]
    assert "many" in line and "decrypting the vaulted values" in line and "longer than 0.1 s" in line, line
    assert "Jinja loop" not in line


def test_linked_group_vars_walk_is_bounded(tmp_path, capsys, monkeypatch):
    """A group_vars link to a large tree is refused at MAX_VARS_ENTRIES (5 here), not walked whole."""
    import ddtree_ops.config.inventory as inventory

    monkeypatch.setattr(inventory, "MAX_VARS_ENTRIES", 5)
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars=_base()))
    big = tmp_path / "big"
    big.mkdir()
    for i in range(8):
        (big / f"f{i}.txt").write_text("x")
    (inv / "group_vars" / "all").symlink_to(big)
    assert main(["validate", "-i", str(inv)]) == 2
    assert "more than 5 files" in capsys.readouterr().err


def test_short_unrelated_vaulted_value_is_no_false_alarm(tmp_path):
    """A vaulted word the deployment never uses (a become password 'sglang') does not refuse the
    service user 'sglang': containment counts only for secrets of >= 8 characters."""
    loader, task_vars = _vault_task_vars(tmp_path, "sglang", {"ddtree_service": {"user": "sglang"}})
    result = _render_action(loader, task_vars)
    assert not result.get("failed"), result.get("msg")


@pytest.mark.parametrize("repo", ["git@github.com:sgl-project/sglang.git", "ssh://git@github.com/sgl-project/sglang.git",
                                  "https://github.com/sgl-project/sglang.git"])
def test_ssh_user_in_repo_stays_allowed(repo):
    """URL credentials: user:password@ and http(s) token users; an ssh account name is no secret."""
    hv = base_hostvars()
    hv["ddtree_sglang"] = {**hv["ddtree_sglang"], "repo": repo, "commit": "a" * 40}
    assert validate_hostvars("h1", hv).deployment.sglang.repo == repo


# ---- values that got through the first checks -------------------------------------------
_C2 = "CANARY2tok9q"


@pytest.mark.parametrize("var,value,field", [
    ("ddtree_model", {"path": f"https://user:{_C2}@hf.example/org/m"}, "ddtree_model.path"),
    ("ddtree_speculative", {"algorithm": "DDTREE", "draft_model_path": f"http://{_C2}@x/y", "block_size": 8,
                            "budget": 32}, "ddtree_speculative.draft_model_path"),
    ("ddtree_service", {"env": {"SGLANG_X": f"Authorization: Bearer {_C2}"}}, "ddtree_service.env"),
    ("ddtree_service", {"env": {"HF_ENDPOINT": f"https://{_C2}:x-oauth-basic@h"}}, "ddtree_service.env"),
    ("ddtree_service", {"env": {"PIP_INDEX_URL": f"https://h/simple?token={_C2}"}}, "ddtree_service.env"),
    ("ddtree_service", {"env": {"OTEL_EXPORTER_OTLP_HEADERS": f"api-key={_C2}"}}, "ddtree_service.env"),
    ("ddtree_service", {"env": {"HTTPS_PROXY": f"socks5://{_C2}@p"}}, "ddtree_service.env"),
    ("ddtree_service", {"env": {"GITHUB_PAT": _C2}}, "ddtree_service.env"),
    ("ddtree_service", {"env": {"SESSION_COOKIE": _C2}}, "ddtree_service.env"),
    ("ddtree_service", {"env": {"SIGNING_SALT": _C2}}, "ddtree_service.env"),
    ("ddtree_service", {"state_dir": "/var/lib/" + "a" * 300}, "ddtree_service.state_dir"),
    ("ddtree_service", {"name": "nvidia-devices"}, "ddtree_service.name"),
    ("ddtree_service", {"name": "sglang-exporter"}, "ddtree_service.name"),
    ("ddtree_ops", {"scrape_host": "0x7f000001"}, "ddtree_ops.scrape_host"),
    ("ddtree_ops", {"scrape_host": "0177.1"}, "ddtree_ops.scrape_host"),
    ("ansible_host", "0x0a000005", "ansible_host"),
])
def test_second_attack_values_refused_without_echoing_secrets(var, value, field):
    hv = base_hostvars()
    hv[var] = {**hv[var], **value} if isinstance(hv.get(var), dict) and isinstance(value, dict) else value
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hv)
    text = str(exc.value) + json.dumps([f.as_dict() for f in exc.value.findings])
    assert field in text and _C2 not in text, text


@pytest.mark.parametrize("kind", ["fifo", "dir", "/dev/zero"])
def test_vault_password_file_must_be_a_regular_file(tmp_path, kind, capsys):
    """A FIFO, a directory or /dev/zero was reported as "no such file" (or hung)."""
    path = tmp_path / "pw"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        path = Path("/dev/zero")
    assert main(["validate", "-i", str(REPO / "inventory" / "example"), "--vault-password-file", str(path)]) == 2
    assert "not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["tokens", "api_keys", "lower"])
def test_a_refused_env_map_shows_names_never_values(name):
    """``ddtree_service.env: {tokens: CANARY}`` (an invalid name the secret check
    does not flag) echoed the whole map with its values."""
    hv = base_hostvars()
    hv["ddtree_service"] = {"env": {name: "CANARY3envv4l"}}
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hv)
    text = str(exc.value) + json.dumps([f.as_dict() for f in exc.value.findings])
    assert "ddtree_service.env" in text and name in text and "CANARY3envv4l" not in text, text


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_vars_file_that_blocks_or_never_ends_is_refused(tmp_path, kind, capsys):
    """host_vars/h1.yml as a FIFO hung validate; a link to /dev/zero ate 7.8 GB."""
    import shutil

    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "example", inv)
    f = inv / "host_vars" / "h1.yml"
    f.parent.mkdir(exist_ok=True)
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "dev-zero":
        f.symlink_to("/dev/zero")
    else:
        with open(f, "wb") as fh:
            fh.truncate(17 << 20)
    t0 = time.monotonic()
    assert main(["validate", "-i", str(inv)]) == 2
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert "h1.yml" in err and ("not a regular file" in err or "larger than 16 MiB" in err), err


@pytest.mark.parametrize("name, secret", [
    ("DB_PASS", True), ("MYSQL_PASSWORD", True), ("PASSPHRASE", True), ("pass2", True), ("passwords", True),
    # Real SGLang 0.5.23 settings (sglang/srt/environ.py) that only contain the letters "pass".
    ("SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES", False), ("SGLANG_PASSTHROUGH", False), ("bypass", False),
])
def test_pass_words_are_secret_but_passes_is_not(name, secret):
    from ddtree_ops.config.errors import is_secret_name

    assert is_secret_name(name) is secret


# ---- a bare access token as a plain value --------------------------------------
_HF4 = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"  # the shape of a Hugging Face User Access Token (test input)


@pytest.mark.parametrize("var,value,field,kind", [
    ("ddtree_service", {"env": {"SOME_SETTING": _HF4}}, "ddtree_service.env", "Hugging Face token"),
    ("ddtree_service", {"env": {"HF_ENDPOINT": f"https://h.example/{_HF4}/x"}}, "ddtree_service.env",
     "Hugging Face token"),
    ("ddtree_service", {"env": {"NOTE": "ghp_" + "a1" * 18}}, "ddtree_service.env", "GitHub token"),
    ("ddtree_model", {"revision": _HF4}, "ddtree_model.revision", "not a revision"),
])
def test_bare_token_values_refused_without_echoing_them(var, value, field, kind):
    hv = base_hostvars()
    hv[var] = {**hv.get(var, {}), **value}
    with pytest.raises(ConfigError) as exc:
        validate_hostvars("h1", hv)
    text = str(exc.value) + json.dumps([f.as_dict() for f in exc.value.findings])
    assert field in text and kind in text and _HF4 not in text and "a1a1a1a1" not in text, text


def test_looks_like_token_shapes_and_ordinary_values():
    from ddtree_ops.config.errors import looks_like_token

    assert looks_like_token(_HF4) == "a Hugging Face token (hf_...)"
    assert looks_like_token("AKIA" + "ABCDEFGHIJKLMNOP") and looks_like_token("sk-" + "x" * 40)
    for ordinary in ("main", "a" * 40, "hf_transfer", "HF_HUB_ENABLE_HF_TRANSFER", "/opt/hf_cache/models--x",
                     "flashinfer", "1", "sk-learn", 5):
        assert looks_like_token(ordinary) is None, ordinary


def _short_vault_inventory(tmp_path: Path, plaintext: str, host_vars: str, extra_vars: str = "") -> tuple[Path, Path]:
    """An inventory whose group_vars carry ``vault_s`` (``ansible-vault encrypt_string`` of ``plaintext``)."""
    pw = tmp_path / "vault-pw"
    pw.write_text("vpass-for-tests\n")
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "encrypt_string", "--vault-password-file",
                        str(pw), "--name", "vault_s", plaintext], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars=_base()))
    (inv / "group_vars" / "all.yml").write_text(r.stdout + "\n" + extra_vars)
    (inv / "host_vars" / "h1.yml").write_text(host_vars)
    return inv, pw


@pytest.mark.parametrize(("plaintext", "host_vars"), [
    # a vaulted 5-7 character value reused as served_model_name, literally and through Jinja
    ("qw3nX7", "ddtree_hf_token: '{{ vault_s }}'\n"
               "ddtree_model: {path: moonshotai/Kimi-K2.6, served_model_name: qw3nX7}\n"),
    ("Zk9pq", "ddtree_secret_env: {X_API_KEY: '{{ vault_s }}'}\n"
              "ddtree_model: {path: moonshotai/Kimi-K2.6, served_model_name: 'kimi-Zk9pq'}\n"),
    ("s3cr3t", "ddtree_model: {path: moonshotai/Kimi-K2.6, served_model_name: '{{ vault_s }}'}\n"),
])
def test_a_short_vaulted_value_in_a_plain_field_is_refused(tmp_path, capsys, plaintext, host_vars):
    """Short vault plaintexts were only looked for by Jinja name, so one reused as served_model_name reached
    the 0644 plan.json, the unit and prometheus.yml labels: a vaulted value is a secret wherever it is."""
    inv, pw = _short_vault_inventory(tmp_path, plaintext, host_vars)
    out = tmp_path / "OUT"
    assert main(["render", "-i", str(inv), "--out", str(out), "--vault-password-file", str(pw)]) == 2
    cap = capsys.readouterr()
    assert "ddtree_model.served_model_name" in cap.err and "holds a secret" in cap.err
    assert plaintext not in cap.out + cap.err and not out.exists()


def test_a_short_vaulted_word_does_not_flag_words_that_merely_contain_it(tmp_path, capsys):
    inv, pw = _short_vault_inventory(tmp_path, "kimi", "ddtree_model: {path: moonshotai/Kimi-K2.6, "
                                     "served_model_name: kimiserve}\n")
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(pw)]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(("extra_vars", "host_vars", "field"), [
    ("my_api_key: abcDEF123plain\n", "ddtree_service: {env: {MY_SETTING: '{{ my_api_key }}'}}\n",
     "ddtree_service.env.MY_SETTING"),
    ("db_password: hunter22\n",
     "ddtree_model: {path: moonshotai/Kimi-K2.6, served_model_name: 'm-{{ db_password }}'}\n",
     "ddtree_model.served_model_name"),
])
def test_a_plain_variable_with_a_secret_name_used_through_jinja_is_refused(tmp_path, capsys, extra_vars, host_vars,
                                                                          field):
    inv, pw = _short_vault_inventory(tmp_path, "unusedVault1", host_vars, extra_vars)
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(pw)]) == 2
    err = capsys.readouterr().err
    assert field in err and "holds a secret" in err
    assert "abcDEF123plain" not in err and "hunter22" not in err


@pytest.mark.parametrize("expr", ["{{ (vault_s | upper) | int }}", "{{ (vault_s ~ '-x') | int }}"])
def test_a_secret_built_by_jinja_never_reaches_ansibles_error_text(tmp_path, capsys, expr):
    inv, pw = _short_vault_inventory(tmp_path, "VCANARYbuilt9", f"ddtree_server: {{tp_size: \"{expr}\"}}\n")
    main(["validate", "-i", str(inv), "--vault-password-file", str(pw)])
    cap = capsys.readouterr()
    text = cap.out + cap.err
    assert "VCANARYBUILT9" not in text and "VCANARYbuilt9" not in text and "vcanary" not in text.lower()


@pytest.mark.parametrize("value", ["hf_CANARYnewcomer3xyz", "sk-Short1234", "ghp_abc123XYZ"])
def test_a_short_token_shaped_value_under_a_harmless_name_is_refused(tmp_path, capsys, value):
    """'MY_SETTING: hf_CANARYnewcomer3xyz' (shorter than a real Hugging Face token) reached the 0644 env file
    and plan.json."""
    inv = write_inventory(tmp_path, Case("ok", "ok", "", group_vars=_base()))
    (inv / "host_vars" / "h1.yml").write_text(yaml.safe_dump({"ddtree_service": {"env": {"MY_SETTING": value}}}))
    out = tmp_path / "OUT"
    assert main(["render", "-i", str(inv), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "MY_SETTING" in err and value not in err and not out.exists()
