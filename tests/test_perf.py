"""The controller's speed-ups change no output: template skipping, the one Jinja environment, the
plain-line fast path of ``say`` and lazy imports (figures: ``scripts/bench-controller.py``)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import REPO
from rich.console import Console
from rich.text import Text

from ddtree_ops._core.write import OpenDirs, UnsafeOutput, write_under
from ddtree_ops.cli import main
from ddtree_ops.cli.common import say
from ddtree_ops.config import inventory as inventory_mod
from ddtree_ops.config import validate_hostvars
from ddtree_ops.render import files as files_mod
from ddtree_ops.render import render_host, render_prometheus
from ddtree_ops.render.monitoring import render_rules

SHIPPED = ["inventory/example", "inventory/dflash-example", "inventory/test"]


def _templated_inventory(tmp_path: Path) -> Path:
    """inventory/example plus host_vars whose values hold template markers (an expression, a
    variable reference in a nested list, a ``#jinja2:`` header), so both paths of the gate run."""
    inv = tmp_path / "inv"
    shutil.copytree(REPO / "inventory" / "example", inv)
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "b300-01.yml").write_text(
        "model_dir: /models\n"
        "ddtree_host_class: \"{{ 'b3' ~ '00' }}\"\n"
        "ddtree_model:\n"
        "  path: \"{{ model_dir }}/target\"\n"
        "  served_model_name: tgt\n"
        "ddtree_server:\n"
        "  port: \"{{ 30000 + 1 }}\"\n"
        "  tp_size: 8\n"
        "  max_running_requests: 32\n"
        "  cuda_graph: true\n"
        "ddtree_accepted_risks:\n"
        "  - rule: sm103-ddtree-graph-capture\n"
        "    reason: \"{{ 'pinned build' }} captured budget 32 in staging for 24 h\"\n"
        "ddtree_service:\n"
        "  name: \"#jinja2:variable_start_string:'[[', variable_end_string:']]'\\nddtree-[[ 'x' ]]\"\n")
    return inv


def _render_all(inv: Path | str) -> dict[str, str]:
    hostvars = inventory_mod.load_hostvars(str(inv))
    validated = [validate_hostvars(h, hv) for h, hv in sorted(hostvars.items())]
    out = {f"{v.deployment.host}:{f.path}:{f.mode}:{f.secret}": f.content for v in validated for f in render_host(v)}
    out["prometheus"] = render_prometheus(validated, rule_files=["/etc/prometheus/rules.yml"])
    out["rules"] = render_rules(validated=validated)
    return out


@pytest.mark.parametrize("inv", [*SHIPPED, "templated"])
def test_template_skip_and_cached_environment_render_identically(inv, tmp_path, monkeypatch):
    """Every file of every host is the same with the gate, the cached environment and libyaml's
    emitter as with Ansible's Templar on every value, a fresh Jinja environment per render and
    PyYAML's pure-Python ``safe_dump`` (the code before these speed-ups)."""
    path = _templated_inventory(tmp_path) if inv == "templated" else REPO / inv
    fast = _render_all(path)
    with monkeypatch.context() as m:
        m.setattr(inventory_mod, "_template_if_marked", lambda templar, memo=None: templar.template)
        m.setattr(files_mod, "_env", files_mod._env.__wrapped__)  # uncached: one environment per call
        m.setattr(files_mod, "YAML_DUMPER", yaml.SafeDumper)
        slow = _render_all(path)
    assert fast == slow
    if inv == "templated":
        b300 = inventory_mod.load_hostvars(str(path), "b300-01")["b300-01"]
        assert b300["ddtree_model"]["path"] == "/models/target" and b300["ddtree_server"]["port"] == 30001
        assert b300["ddtree_accepted_risks"][0]["reason"].startswith("pinned build captured")
        assert b300["ddtree_service"]["name"] == "ddtree-x" and b300["ddtree_host_class"] == "b300"


def test_gate_passes_plain_values_through_and_templates_the_rest(tmp_path):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar  # inventory files' strings are trusted
    from ansible.template import trust_as_template as t

    templar = Templar(loader=DataLoader(), variables={"x": "X"})
    template = inventory_mod._template_if_marked(templar)
    plain = {"a": [t("b"), 1, 2.5, None, True, {t("c"): t("d # no marker { }")}]}
    assert template(plain) is plain  # the Templar is not called
    assert template({"a": [t("{{ x }}")]}) == {"a": ["X"]}
    assert template({t("{{ x }}"): 1}) == templar.template({t("{{ x }}"): 1})  # keys are checked too
    assert template(t("{# c #}y")) == "y"


def test_gate_sends_vaulted_values_to_the_templar(tmp_path):
    """A vaulted value holds no visible marker but must be decrypted by the Templar."""
    from ansible.template import Templar
    from test_trust_inventory import _vaulted

    loader, enc = _vaulted(tmp_path, "plain-looking secret")
    templar = Templar(loader=loader, variables={})
    out = inventory_mod._template_if_marked(templar)({"ddtree_hf_token": enc})
    assert out == {"ddtree_hf_token": "plain-looking secret"} and out["ddtree_hf_token"] is not enc


@pytest.mark.parametrize("message", [
    "b300-01", "h: ddtree_model.path = 'é ü → 模型' is refused. Fix: x", "x" * 5000, "[red]markup[/red] :smile:",
    "tab\there", "cr\rhere", "bell\x07", "nl\nline", "zero\u200bwidth", "",
])
@pytest.mark.parametrize("label,style", [("ok  ", "green"), ("error", "red"), ("wrote", "")])
def test_say_writes_the_bytes_rich_writes(message, label, style):
    """The fast path (not a terminal, printable line) gives rich's bytes; the rest goes to rich."""
    fast, ref = io.StringIO(), io.StringIO()
    say(Console(file=fast, soft_wrap=True), label, style, message)
    Console(file=ref, soft_wrap=True).print(Text.assemble((label, style), " ", message), highlight=False)
    assert fast.getvalue() == ref.getvalue()


def test_say_on_a_terminal_goes_through_rich():
    buf = io.StringIO()
    say(Console(file=buf, soft_wrap=True, force_terminal=True, color_system="standard"), "ok  ", "green", "h1")
    assert "\x1b[" in buf.getvalue() and "h1" in buf.getvalue()


def test_help_and_light_commands_do_not_import_the_config_models_or_httpx():
    """``--help`` loads neither pydantic, the config models, httpx nor Ansible (target <= 0.3 s CPU;
    ``scripts/bench-controller.py`` measures it)."""
    code = (
        "import sys\nfrom ddtree_ops.cli import main\nrc = main(['--help'])\n"
        "heavy = [m for m in ('pydantic', 'ddtree_ops.config.models', 'httpx', 'ansible', 'jinja2') if m in "
        "sys.modules]\n"
        "print('HEAVY', heavy)\nsys.exit(rc)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout, r.stdout[-500:]


def test_lazy_config_package_keeps_its_names():
    import ddtree_ops.config as config

    assert config.__all__ == sorted(config._WHERE)
    for name in config.__all__:
        assert getattr(config, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        config.nope  # noqa: B018


def test_config_error_still_maps_to_one_line_exit_2(tmp_path, capsys):
    """``main`` resolves ConfigError lazily in its except clause: still exit 2, one line."""
    assert main(["validate", "-i", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "inventory not found" in err and "Traceback" not in err


TRICKY = ["x: y", "'q'", '"d"', "#c", "é", "\u2028", "a" * 300, "", "null", "1.0", "yes", " lead", "trail ",
          "k\tt", "multi\nline", "- x", "@x", "*x", "!x", "%x", "`x", "{x", "[x", "~", "0o17", "2026-11-30"]


@pytest.mark.parametrize("allow_unicode,width", [(False, 1 << 16), (True, 1000)])
def test_yaml_dumper_emits_what_safe_dump_emits(allow_unicode, width):
    doc = {"k": TRICKY, "nested": [{"a": s, "b": [s, 1, 2.5, None, True]} for s in TRICKY]}
    kw = {"sort_keys": False, "default_flow_style": False, "allow_unicode": allow_unicode, "width": width}
    assert yaml.dump(doc, Dumper=files_mod.YAML_DUMPER, **kw) == yaml.safe_dump(doc, **kw)


def test_open_dirs_write_many_files_and_never_follow_a_symlink(tmp_path):
    out = tmp_path / "out"
    with OpenDirs() as dirs:
        for i in range(3):
            write_under(out, f"h{i % 2}/etc/ddtree-ops/f{i}", f"c{i}\n", 0o640, dirs)
        (tmp_path / "elsewhere").mkdir()
        (out / "h2").symlink_to(tmp_path / "elsewhere")  # appears while writing
        with pytest.raises(UnsafeOutput, match="symlink"):
            write_under(out, "h2/x", "no", 0o644, dirs)
        # a kept directory replaced by a symlink: the write lands in the directory opened, under OUT
        (out / "h0" / "etc").rename(out / "h0" / "etc-moved")
        (out / "h0" / "etc").symlink_to(tmp_path / "elsewhere")
        write_under(out, "h0/etc/ddtree-ops/f9", "kept\n", 0o644, dirs)
    assert (out / "h1/etc/ddtree-ops/f1").read_text() == "c1\n"
    assert oct((out / "h0/etc-moved/ddtree-ops/f0").stat().st_mode & 0o777) == "0o640"
    assert (out / "h0/etc-moved/ddtree-ops/f9").read_text() == "kept\n"
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_control_pattern_is_the_old_character_test():
    """``files._CONTROL`` (one regex search) refuses exactly what the per-character test did."""
    old = {i for i in range(0x110000) if i < 0x20 or i == 0x7F}
    new = {i for i in range(0x110000) if not 0xD800 <= i < 0xE000 and files_mod._CONTROL.search(chr(i))}
    assert new == old


def test_open_dirs_keeps_a_bounded_number_of_descriptors(tmp_path):
    """1000 hosts are ~6000 directories (80 here: ~400); OpenDirs keeps at most MAX_OPEN of them open (the usual
    limit is 1024 open files), and every file still lands where it belongs."""
    import os

    before = len(os.listdir("/proc/self/fd"))
    out = tmp_path / "out"
    with OpenDirs() as dirs:
        for h in range(80):  # ~400 directories
            for f in ("etc/systemd/system/a.service", "etc/ddtree-ops/x/plan.json"):
                write_under(out, f"h{h}/{f}", f"{h}\n", 0o644, dirs)
            assert len(os.listdir("/proc/self/fd")) - before <= OpenDirs.MAX_OPEN
        write_under(out, "h0/etc/ddtree-ops/x/again", "0\n", 0o644, dirs)  # an evicted directory, reopened
    assert len(os.listdir("/proc/self/fd")) == before
    assert (out / "h79/etc/ddtree-ops/x/plan.json").read_text() == "79\n"
    assert (out / "h0/etc/ddtree-ops/x/again").read_text() == "0\n"


def _reference_scrub(text: str) -> str:
    """``scrub`` without its fast paths: every regex on every text (no substring
    pre-checks), ``_NAMED_VALUE`` without its look-ahead for a secret word."""
    from ddtree_ops._core import scrub as core

    lookahead = "(?=[A-Za-z0-9_.-]*?(?i:" + "|".join(core._SECRET_WORDS) + "))"
    named = re.compile(core._NAMED_VALUE.pattern.replace(lookahead, "", 1))
    assert named.pattern != core._NAMED_VALUE.pattern
    for s in sorted(core._known_secrets, key=len, reverse=True):
        text = text.replace(s, core.REDACTED)
    text = core._redact_folded_tokens(text)  # (its own fast path: a text NFKC leaves alone is returned unread)
    text = core._URL_USERINFO.sub(core._redact_userinfo, text)
    text = core._AUTH_SCHEME.sub(core._redact_auth, text)  # its credential-or-prose decision, not a fast path
    text = core._SECRET_QUERY.sub(lambda m: f"{m['pre']}{core.REDACTED}", text)
    text = core._TOKEN_SHAPE.sub(core.REDACTED, text)
    return core._redact_named_values(text, named)


SCRUB_CASES = [
    "b300-01: ddtree_sglang.commit = None: source git needs repo and commit. Fix: set repo (git rev-parse HEAD)",
    "https://tok123@github.com/x",
    "socks5://u:p4ss@proxy:1080",
    "Authorization: Bearer abcd.efgh",
    "BASIC QWxhZGRpbg==",
    "Token\tsecretvalue1",
    "\u212aey token: x",
    "to\u212aen abcdef",
    "ba\u017fic QWxhZGRpbg==",
    "digeſt AAAA1234",
    "x?token=abc&sig=def",
    "HF_TOKEN=hf_abc WANDB_API_KEY=k1 draft_tokens_per_req=4",
    "9token=v",
    "_key=v",
    "a.b-c: v",
    "api-key=X,auth: y",
    "(redacted)",
    "name=(redacted)",
    "X_API_KEY: 'q'",
    "é_token=é",
    "tokens: 5",
    "API_TOKENS=a",
    "CANARY-registered-secret in text",
    "",
    "x hf_AbCdEfGhIjKlMnOpQrStUvWxYz0123 y",
    "--api-key SEK1 --port 1",
    'export OPENAI_API_KEY="q1"',
    "ServerArgs(api_key='k1', port=1)",
    '{"hf_token": "v1"}',
    "HF_TOKEN = v1",
    "token: SEKRIT1",
    "a secret: it",
    '\\"hf_token\\": \\"v1\\"',
    "sk-proj-abcdefghijklmnopqrstu1",
]


def test_scrub_fast_paths_redact_what_the_plain_regexes_redact(monkeypatch):
    """The cheap tests before the regexes and ``_NAMED_VALUE``'s look-ahead change no text: the
    cases above (URLs, schemes in any case, Unicode case folding, names inside words, token shapes,
    argv, quoted and JSON values) and 20,000 random strings over the characters the patterns care about."""
    import random

    from ddtree_ops._core import scrub as core
    from ddtree_ops.config import errors

    monkeypatch.setattr(core, "_known_secrets", set())
    errors.register_secret("CANARY-registered-secret")
    rng = random.Random(15)
    alphabet = list("aZk_9.-=:/@?&; \t'\",{}()…xTOKENbearerbasicdigestsig\u212a\u017f\\") + [
        "://", "token", "Key", "hf_", "sk-", "ghp_", "xoxb-", "AbCd0123456789", "--", "api_key", "export ", "pass"]
    randoms = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(20_000)]
    for text in SCRUB_CASES + randoms:
        assert errors.scrub(text) == _reference_scrub(text), repr(text)
    assert "hf_abc" not in errors.scrub(SCRUB_CASES[11]) and "QWxhZGRpbg" not in errors.scrub(SCRUB_CASES[8])
    leaks = dict(
        zip(
            SCRUB_CASES[-10:],
            ("hf_AbCd", "SEK1", "q1", "k1", "v1", "v1", "SEKRIT1", None, "v1", "sk-proj"),
            strict=True,
        )
    )
    assert all(errors.scrub(t) == t if v is None else v not in errors.scrub(t) for t, v in leaks.items())


def test_a_kept_message_is_built_again_once_a_secret_is_registered(monkeypatch):
    from ddtree_ops._core import scrub as core_scrub
    from ddtree_ops.config import errors

    monkeypatch.setattr(core_scrub, "_known_secrets", set())
    f = errors.Finding("warning", "ddtree_model.path", "/models/CANARY-late-secret", "a rule", "a fix", host="h1")
    assert "CANARY-late-secret" in f.message() and f.message() is f.message()  # kept
    errors.register_secret("CANARY-late-secret")
    assert "CANARY-late-secret" not in f.message() and errors.REDACTED in f.message()
    monkeypatch.setattr(core_scrub, "_known_secrets", {"CANARY-late-secret"})  # a new registry (as tests do)
    assert "CANARY-late-secret" not in f.message()


def _host_vars(i: int, shared: dict, own: dict | None = None) -> dict:
    """One host's variables as Ansible hands them out: the group's values are the same objects."""
    return {"inventory_hostname": f"h{i}", "ansible_host": f"10.0.0.{i}", **shared, **(own or {})}


def test_load_memo_still_checks_every_host(tmp_path, monkeypatch):
    """The hosts of a group share their group_vars objects; with one load's memo, a vaulted value in
    a plain field is refused (and its plaintext registered) for every host, not only the first, and
    the size bound still counts each host's own values on top of the shared ones."""
    from ansible.template import Templar
    from test_trust_inventory import _vaulted

    from ddtree_ops._core import scrub as core_scrub
    from ddtree_ops.config.errors import ConfigError
    from ddtree_ops.config.hostvars import MAX_VAR_NODES, deployment_vars

    monkeypatch.setattr(core_scrub, "_known_secrets", set())
    loader, enc = _vaulted(tmp_path, "CANARY-shared-vault-value")
    shared = {"ddtree_host_class": "b300", "ddtree_model": {"path": "/models/m", "served_model_name": "m"},
              "ddtree_service": {"env": {"FOO": enc, "BAR": "plain"}}}
    memo: dict = {}
    for i in range(3):
        hv = _host_vars(i, shared)
        with pytest.raises(ConfigError) as exc:
            deployment_vars(
                hv, inventory_mod._template_if_marked(Templar(loader=loader, variables=hv), memo), f"h{i}", memo
            )
        assert [f.field for f in exc.value.findings] == ["ddtree_service.env.FOO"], i
        assert "CANARY" not in str(exc.value)
        assert "CANARY-shared-vault-value" in core_scrub._known_secrets  # registered by this host's load
        core_scrub._known_secrets.clear()
    big = {"ddtree_host_class": "b300", "ddtree_server": {"a": list(range(MAX_VAR_NODES - 5000))}}
    memo = {}
    outcomes = []
    for i, own in enumerate([None, {"ddtree_model": {"path": list(range(6000))}}, None]):
        hv = _host_vars(i, big, own)
        try:
            deployment_vars(
                hv, inventory_mod._template_if_marked(Templar(loader=loader, variables=hv), memo), f"h{i}", memo
            )
            outcomes.append("ok")
        except ConfigError as exc:
            outcomes.append(exc.findings[0].rule.split(" (")[0])
    assert outcomes == [
        "ok",
        f"the host's deployment variables exceed {MAX_VAR_NODES} values or 1024 KiB of text",
        "ok",
    ]


@pytest.mark.parametrize("inv", SHIPPED)
def test_load_memo_gives_what_each_host_alone_gives(inv, monkeypatch):
    """One load with the memo and one without (every walk done for every host) give the same variables."""
    from ddtree_ops.config import hostvars

    with_memo = inventory_mod.load_hostvars(str(REPO / inv))
    plain = hostvars.deployment_vars
    monkeypatch.setattr(inventory_mod, "deployment_vars",
                        lambda a, t, h="", memo=None, **kw: plain(a, t, h, None, **kw))
    assert inventory_mod.load_hostvars(str(REPO / inv)) == with_memo


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o027, 0o077])
def test_created_directories_are_0755_under_any_umask(tmp_path, umask):
    """``_open_dir`` skips its ``fchmod`` when ``mkdir`` already gave 0755; under a
    umask that takes bits away it still sets 0755, with and without :class:`OpenDirs`."""
    import os

    out = tmp_path / "out"
    old = os.umask(umask)
    try:
        with OpenDirs() as dirs:
            write_under(out, "h1/etc/ddtree-ops/x/plan.json", "{}\n", 0o644, dirs)
            write_under(out, "h1/etc/ddtree-ops/x/secrets.env", "A=b\n", 0o600, dirs)
        write_under(out, "h2/etc/systemd/system/a.service", "[Unit]\n", 0o644)
    finally:
        os.umask(old)
    dirs_made = [p for p in out.rglob("*") if p.is_dir()]
    assert len(dirs_made) == 8 and {oct(p.stat().st_mode & 0o7777) for p in dirs_made} == {"0o755"}
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in out.rglob("*") if p.is_file()} == {
        "plan.json": "0o644", "secrets.env": "0o600", "a.service": "0o644"}


def test_gc_thresholds_raised_while_loading_and_restored(monkeypatch, capsys):
    """validate runs the load and the checks with fewer collector passes and gives the
    caller its own thresholds back, also when the inventory is refused."""
    import gc

    seen = []
    real = inventory_mod.load_hostvars

    def spy(*a, **kw):
        seen.append(gc.get_threshold()[0])
        return real(*a, **kw)

    monkeypatch.setattr(inventory_mod, "load_hostvars", spy)
    before = gc.get_threshold()
    assert main(["validate", "-i", str(REPO / "inventory/example")]) == 0
    assert main(["validate", "-i", str(REPO / "no-such-inventory")]) == 2
    assert gc.get_threshold() == before and len(seen) == 2 and min(seen) >= 100_000
    capsys.readouterr()


def test_check_targets_opens_each_existing_directory_once(tmp_path, monkeypatch):
    """Re-rendering into an existing OUT checks every directory on the way once (a tree walk),
    not once per file path, and still finds a bad one anywhere in it."""
    import os

    from ddtree_ops._core import write as write_mod

    out = tmp_path / "out"
    rels = [f"h{h}/etc/{d}/f{i}" for h in range(3) for d in ("systemd/system", "ddtree-ops/x") for i in range(2)]
    for rel in rels:
        write_under(out, rel, "x\n", 0o644)
    opened = []
    real = write_mod._open_nofollow
    monkeypatch.setattr(
        write_mod, "_open_nofollow", lambda name, fd, shown: (opened.append(shown), real(name, fd, shown))[1]
    )
    write_mod.check_targets(out, rels + ["h9/new/f", "prometheus/p.yml"])
    existing = {str(p) for p in [out, *out.rglob("*")] if p.is_dir()}
    assert sorted(opened) == sorted(existing | {str(out / "h9"), str(out / "prometheus")})  # + the missing ones tried
    os.chmod(out / "h2/etc/ddtree-ops/x", 0o757)
    with pytest.raises(write_mod.UnsafeOutput, match=r"h2/etc/ddtree-ops/x: mode 0757"):
        write_mod.check_targets(out, rels)
