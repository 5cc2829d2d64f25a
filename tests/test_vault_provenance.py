"""A vaulted value of the inventory is a secret wherever its text turns up, not only where Jinja
carries it: reused by hand as plain text in a deployment field (a substring of the model path, an
``extra_args`` value, ``served_model_name``) it would land in the 0644 plan.json, the unit and the
Prometheus labels. ``validate`` refuses such a field with one line (field, value redacted, rule,
fix). And a token-shaped value under a harmless name is never written to a world-readable file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import base_hostvars

from ddtree_ops.cli import main

VAULT_PLAIN = "VCANARYprov3nance"  # what the vault holds (17 characters)
SHORT_PLAIN = "qw3n7"  # a short vaulted value (5 characters: checked as a whole word)


@pytest.fixture(autouse=True)
def _fresh_secret_registry(monkeypatch):
    import ddtree_ops._core.scrub as core_scrub

    monkeypatch.setattr(core_scrub, "_known_secrets", set())


def _encrypt(pw: Path, name: str, plain: str) -> str:
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-vault"), "encrypt_string", "--vault-password-file",
                        str(pw), "--name", name, plain], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _inventory(tmp_path: Path, host_vars: dict) -> tuple[Path, Path]:
    """group_vars/all.yml: three vaulted variables no deployment variable refers to (an unrelated role's
    secrets; one the plain word ``sglang``); host_vars/h1.yml: ``host_vars`` (plain YAML, no Jinja)."""
    pw = tmp_path / "vault-pw"
    pw.write_text("vpass-provenance\n")
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "host_vars").mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"sglang_servers": {"children": {"b300": {"hosts": {"h1": {}}}}}}))
    gv = base_hostvars()
    gv.pop("ddtree_host_class")
    (inv / "group_vars" / "b300.yml").write_text("ddtree_host_class: b300\n")
    (inv / "group_vars" / "sglang_servers.yml").write_text(yaml.safe_dump(gv, sort_keys=False))
    (inv / "group_vars" / "all.yml").write_text(_encrypt(pw, "other_role_api_password", VAULT_PLAIN) + "\n"
                                                + _encrypt(pw, "other_role_short", SHORT_PLAIN) + "\n"
                                                + _encrypt(pw, "become_password", "sglang") + "\n")
    (inv / "host_vars" / "h1.yml").write_text(yaml.safe_dump(host_vars, sort_keys=False))
    return inv, pw


@pytest.mark.parametrize("host_vars, field", [
    ({"ddtree_model": {"path": f"moonshotai/kimi-{VAULT_PLAIN}"}}, "ddtree_model.path"),  # a substring
    ({"ddtree_server": {**base_hostvars()["ddtree_server"], "extra_args": ["--tokenizer-path", VAULT_PLAIN]}},
     "ddtree_server.extra_args"),
    ({"ddtree_model": {**base_hostvars()["ddtree_model"], "served_model_name": VAULT_PLAIN}},
     "ddtree_model.served_model_name"),
    ({"ddtree_model": {**base_hostvars()["ddtree_model"], "served_model_name": f"kimi-{SHORT_PLAIN}"}},
     "ddtree_model.served_model_name"),  # a short vaulted value as a whole word
    ({"ddtree_service": {"env": {"MY_SETTING": f"x{VAULT_PLAIN}y"}}}, "ddtree_service.env.MY_SETTING"),
])
def test_a_vaulted_value_reused_as_plain_text_is_refused(tmp_path, capsys, host_vars, field):
    inv, pw = _inventory(tmp_path, host_vars)
    out = tmp_path / "OUT"
    for argv in (["validate", "-i", str(inv)], ["validate", "-i", str(inv), "--json"], ["plan", "-i", str(inv)],
                 ["render", "-i", str(inv), "--out", str(out)]):
        assert main([*argv, "--vault-password-file", str(pw)]) == 2, argv
        cap = capsys.readouterr()
        text = cap.out + cap.err
        assert VAULT_PLAIN not in text and SHORT_PLAIN not in text and "Traceback" not in text, text
        assert field in text and "vault" in text and "(redacted)" in text, text
    assert not out.exists()
    [line] = [ln for ln in cap.err.splitlines() if ln.startswith("error")]  # one line for the one field
    assert "ddtree_secret_env" in line, line


def test_unrelated_plain_text_beside_vaulted_values_is_accepted(tmp_path, capsys):
    """Text holding no vaulted value passes; a short vaulted value inside a longer word (qw3n7 in
    "aqw3n7b") is no reuse: short values count only as whole words. An unused vaulted plain word
    (the become password ``sglang``) refuses neither ``ddtree_source: sglang-pr-...`` nor the service
    user ``sglang``, and is not scrubbed out of messages: 4-7 characters count only credential-shaped."""
    inv, pw = _inventory(tmp_path, {"ddtree_model": {**base_hostvars()["ddtree_model"],
                                                     "served_model_name": f"kimi-a{SHORT_PLAIN}b"}})
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(pw)]) == 0, capsys.readouterr()
    assert main(["plan", "-i", str(inv), "--vault-password-file", str(pw)]) == 0
    assert "sglang-pr-29907" in capsys.readouterr().out


@pytest.mark.parametrize("env", [
    {"MY_SETTING": "hf_CANARYnewcomer3xyz"},  # the issuer's prefix, shorter than an issued token
    {"MY_SETTING": "hf_Ab3xyz"},  # shorter still
    {"CACHE_HINT": "ghp_X1y2Z3w4"},
])
def test_a_short_token_shaped_value_under_a_harmless_name_is_refused(tmp_path, capsys, env):
    inv, pw = _inventory(tmp_path, {"ddtree_service": {"env": env}})
    out = tmp_path / "OUT"
    assert main(["render", "-i", str(inv), "--out", str(out), "--vault-password-file", str(pw)]) == 2
    cap = capsys.readouterr()
    value = next(iter(env.values()))
    assert value not in cap.out + cap.err and f"ddtree_service.env.{next(iter(env))}" in cap.err
    assert not out.exists()


@pytest.mark.parametrize("env", [{"HF_HUB_ENABLE_HF_TRANSFER": "hf_transfer"}, {"X": "hf_xet"}])
def test_prefixed_words_that_are_no_tokens_are_accepted(tmp_path, capsys, env):
    inv, pw = _inventory(tmp_path, {"ddtree_service": {"env": env}})
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(pw)]) == 0, capsys.readouterr()


def test_the_deploy_action_refuses_a_vaulted_value_reused_as_plain_text(tmp_path):
    """The same rule in ansible-playbook's path (action ddtree_render, the play's task variables): vault_v is
    referenced by no Jinja, its text is written into ddtree_model.path by hand."""
    from test_trust_inventory import _render_action, _vault_task_vars

    plain = "VCANARYreuse9in_play"
    loader, task_vars = _vault_task_vars(tmp_path, plain, {"ddtree_model": {"path": f"moonshotai/kimi-{plain}"}})
    result = _render_action(loader, task_vars)
    dumped = json.dumps(result, default=str)
    assert result.get("failed") and "ddtree_model.path" in result["msg"] and "vaulted" in result["msg"], result
    assert plain not in dumped


@pytest.mark.parametrize("vaulted, reused", [
    ("TCANARYtrail9nl\n", "TCANARYtrail9nl"),  # `echo X | ansible-vault encrypt_string --stdin-name` vaults "X\n"
    ("  SCANARYspace9lead  ", "SCANARYspace9lead"),
])
def test_a_vaulted_value_with_surrounding_space_is_recognised_trimmed(tmp_path, capsys, vaulted, reused):
    """The text as vaulted and as it is pasted: whitespace around the vaulted value is not part of
    what an operator copies into a field, so the trimmed text counts as the secret too."""
    inv, pw = _inventory(tmp_path, {"ddtree_model": {**base_hostvars()["ddtree_model"],
                                                     "served_model_name": f"m-{reused}"}})
    gv = inv / "group_vars" / "all.yml"
    gv.write_text(gv.read_text() + _encrypt(pw, "stdin_vaulted", vaulted) + "\n")
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(pw)]) == 2
    text = "".join(capsys.readouterr())
    assert reused not in text and "ddtree_model.served_model_name" in text and "(redacted)" in text, text


@pytest.mark.parametrize("value, refused", [("1", False), ("true", False), ("Off", False),
                                            ("abcdef", True), ("2", True)])
def test_a_switch_under_a_secret_looking_env_name_is_no_secret(value, refused):
    """huggingface_hub's HF_HUB_DISABLE_IMPLICIT_TOKEN=1 is a switch (huggingface_hub/constants.py):
    a boolean value under a name holding "token" is accepted; any other value there still is not."""
    from ddtree_ops.config import ConfigError, validate_hostvars

    hv = base_hostvars()
    hv["ddtree_service"] = {"env": {"HF_HUB_DISABLE_IMPLICIT_TOKEN": value}}
    if refused:
        with pytest.raises(ConfigError, match="looks like a secret"):
            validate_hostvars("h1", hv)
    else:
        assert validate_hostvars("h1", hv).deployment.service.env == {"HF_HUB_DISABLE_IMPLICIT_TOKEN": value}
