"""Issue 15's speed-ups change no output: template skipping, the one Jinja environment, the
plain-line fast path of ``say`` and lazy imports (figures: ``scripts/bench-controller.py``)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from rich.text import Text

from ddtree_ops.cli import main, say
from ddtree_ops.config import inventory as inventory_mod
from ddtree_ops.config import validate_hostvars
from ddtree_ops.render import files as files_mod
from ddtree_ops.render import render_host, render_prometheus
from ddtree_ops.render.monitoring import render_rules
from ddtree_ops.render.write import OpenDirs, UnsafeOutput, write_under

from helpers import REPO

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
    PyYAML's pure-Python ``safe_dump`` (the code before issue 15)."""
    path = _templated_inventory(tmp_path) if inv == "templated" else REPO / inv
    fast = _render_all(path)
    with monkeypatch.context() as m:
        m.setattr(inventory_mod, "_template_if_marked", lambda templar: templar.template)
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
    from ansible.template import Templar, trust_as_template as t  # inventory files' strings are trusted

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
    """``--help`` loads neither pydantic, the config models, httpx nor Ansible (issue 15: 0.87 s -> < 0.3 s)."""
    code = ("import sys\nfrom ddtree_ops.cli import main\nrc = main(['--help'])\n"
            "heavy = [m for m in ('pydantic', 'ddtree_ops.config.models', 'httpx', 'ansible', 'jinja2') if m in sys.modules]\n"
            "print('HEAVY', heavy)\nsys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout, r.stdout[-500:]


def test_lazy_config_package_keeps_its_names():
    import ddtree_ops.config as config

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
