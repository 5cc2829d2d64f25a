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


ROUTER_KEY = "RkeyCANARY9876xyz"  # an API gateway's vaulted key
OTHER_HOST_PLAIN = "HvCANARY24680other"  # vaulted in another server's host_vars


def _two_hosts(tmp_path: Path, h1_vars: dict, host_names: tuple[str, str] = ("h1", "h2")) -> tuple[Path, Path]:
    """The inventory of :func:`_inventory` plus a gateway r1 (host_vars/r1.yml: a vaulted API key)
    and a second server (host_vars: a vaulted variable of its own); ``h1_vars`` for the first server."""
    inv, pw = _inventory(tmp_path, h1_vars)
    first, second = host_names
    (inv / "hosts.yml").write_text(yaml.safe_dump({
        "sglang_servers": {"children": {"b300": {"hosts": {first: {}, second: {}}}}},
        "gateways": {"hosts": {"r1": {}}}}))  # an API gateway ddtree-ops does not manage
    if first != "h1":
        (inv / "host_vars" / "h1.yml").rename(inv / "host_vars" / f"{first}.yml")
    (inv / "host_vars" / "r1.yml").write_text(_encrypt(pw, "router_api_key", ROUTER_KEY) + "\n")
    (inv / "host_vars" / f"{second}.yml").write_text(
        f"ansible_host: 10.0.0.2\n{_encrypt(pw, 'h2_only_secret', OTHER_HOST_PLAIN)}\n")
    return inv, pw


@pytest.mark.parametrize("h1_vars, field, secret", [
    ({"ddtree_model": {**base_hostvars()["ddtree_model"], "served_model_name": ROUTER_KEY}},
     "ddtree_model.served_model_name", ROUTER_KEY),  # the router's key reused on a server
    ({"ddtree_model": {"path": f"moonshotai/kimi-{OTHER_HOST_PLAIN}"}}, "ddtree_model.path",
     OTHER_HOST_PLAIN),  # another server's host_vars
])
@pytest.mark.parametrize("limit", [None, "h1"])
def test_a_vaulted_value_of_another_host_is_a_secret_here(tmp_path, capsys, h1_vars, field, secret, limit):
    inv, pw = _two_hosts(tmp_path, {"ansible_host": "10.0.0.1", **h1_vars})
    out = tmp_path / "OUT"
    sel = ["-l", limit] if limit else []
    for argv in (["validate", "-i", str(inv)], ["render", "-i", str(inv), "--out", str(out)]):
        assert main([*argv, *sel, "--vault-password-file", str(pw)]) == 2, argv
        cap = capsys.readouterr()
        text = cap.out + cap.err
        assert secret not in text and "Traceback" not in text, text
        assert field in text and "(redacted)" in text, text
    assert not out.exists()


def test_other_hosts_vaulted_values_do_not_refuse_unrelated_text(tmp_path, capsys):
    inv, pw = _two_hosts(tmp_path, {"ansible_host": "10.0.0.1"})
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(pw)]) == 0, capsys.readouterr()


@pytest.mark.parametrize("where", ["router", "group_vars"])
def test_a_host_named_as_a_vaulted_value_is_refused_without_naming_it(tmp_path, capsys, where):
    """A host whose name is a vaulted text of the inventory (the router's key, a group_vars secret):
    refused in one line, and neither the name nor the text is echoed."""
    name = "rkeycanary9876xyz" if where == "router" else "vcanaryprov3nance"
    inv, pw = _two_hosts(tmp_path, {"ansible_host": "10.0.0.1"}, host_names=(name, "h2"))
    vault = inv / "host_vars" / "r1.yml" if where == "router" else inv / "group_vars" / "all.yml"
    text = vault.read_text()
    vault.write_text(text + "\n" + _encrypt(pw, "named_like_a_host", name) + "\n")
    assert main(["validate", "-i", str(inv), "--vault-password-file", str(pw)]) == 2
    cap = capsys.readouterr()
    shown = cap.out + cap.err
    assert name not in shown and "Traceback" not in shown, shown
    [line] = [ln for ln in cap.err.splitlines() if ln.startswith("error")]
    assert "inventory host name" in line and "named as a vaulted value" in line and "rename the host" in line, line


@pytest.mark.parametrize("reuse", ["served_model_name", "host_name"])
def test_the_deploy_fleet_check_knows_every_hosts_vaulted_values(tmp_path, reuse):
    """ansible-playbook's path: deploy.yml's and rolling.yml's first play run ddtree_prometheus (fleet_only) over the
    servers before anything changes; a vaulted value of another inventory host (a gateway's key) reused on a
    server, or naming a host, is refused there without echoing it."""
    import copy
    from types import SimpleNamespace

    from ansible.playbook.task import Task
    from ansible.template import Templar
    from helpers import REPO
    from test_trust_inventory import _vaulted

    plain = "GwCANARYkey7531abc" if reuse == "served_model_name" else "gwcanarykey7531abc"
    loader, _ = _vaulted(tmp_path, plain)
    cipher = (tmp_path / "v.yml").read_text().split("\n", 1)[1]
    (tmp_path / "r1.yml").write_text("gateway_api_key: !vault |\n" + cipher)
    gateway = dict(loader.load_from_file(str(tmp_path / "r1.yml"), trusted_as_template=True))
    server = copy.deepcopy(base_hostvars())
    name = "h1"
    if reuse == "served_model_name":
        server["ddtree_model"]["served_model_name"] = plain
    else:
        name = plain
    server = {**server, "inventory_hostname": name, "group_names": ["b300", "sglang_servers"]}
    hostvars = {name: server, "r1": {**gateway, "inventory_hostname": "r1", "group_names": ["gateways"]}}
    task_vars = {"hostvars": hostvars, "groups": {"all": [name, "r1"], "sglang_servers": [name]}}
    sys.path.insert(0, str(REPO / "action_plugins"))
    try:
        from ddtree_prometheus import ActionModule
    finally:
        sys.path.pop(0)
    task = Task()
    task.args = {"servers": [name], "fleet_only": True}
    result = ActionModule(task=task, connection=SimpleNamespace(_shell=SimpleNamespace(tmpdir="/nonexistent")),
                          play_context=None, loader=loader, templar=Templar(loader=loader, variables=task_vars),
                          shared_loader_obj=None).run(task_vars=task_vars)
    dumped = json.dumps(result, default=str)
    assert result.get("failed"), result
    assert ("ddtree_model.served_model_name" if reuse == "served_model_name" else "inventory host name") \
        in result["msg"], result["msg"]
    assert plain not in dumped
