"""``hostvars[...]`` in inventory Jinja works in the CLI as in ansible-playbook: a read-only, lazy
view of the other hosts' variables (ansible-core's HostVars, as its task queue manager builds it),
so ``ddtree-ops validate``/``render`` and the play see the same values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import base_hostvars

from ddtree_ops.config import ConfigError
from ddtree_ops.config.inventory import load_hostvars


def _inventory(tmp: Path, first: dict, second: dict) -> Path:
    inv = tmp / "inv"
    (inv / "host_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump(
        {"sglang_servers": {"children": {"b300": {"hosts": {"b300-01": {}, "b300-02": {}}}}}}))
    (inv / "host_vars" / "b300-01.yml").write_text(yaml.safe_dump({**base_hostvars(), **first}))
    (inv / "host_vars" / "b300-02.yml").write_text(yaml.safe_dump({**base_hostvars(), **second}))
    return inv


def test_hostvars_of_another_host_resolve_as_in_ansible(tmp_path):
    inv = _inventory(tmp_path, {"ddtree_model": {"path": "{{ hostvars['b300-02'].shared_model }}"}},
                     {"shared_model": "moonshotai/Kimi-K2.6"})
    got = load_hostvars(inv)
    assert got["b300-01"]["ddtree_model"]["path"] == "moonshotai/Kimi-K2.6"


def test_hostvars_dot_and_templated_values_of_the_other_host(tmp_path):
    """The other host's own Jinja is templated with its variables (lazy HostVarsVars)."""
    inv = _inventory(tmp_path, {"ddtree_speculative": {
        "algorithm": "DDTREE", "draft_model_path": "z-lab/Kimi-K2.6-DFlash",
        "block_size": "{{ hostvars['b300-02'].bs }}", "budget": 32}},
        {"bs": "{{ half * 2 }}", "half": 4})
    assert int(load_hostvars(inv)["b300-01"]["ddtree_speculative"]["block_size"]) == 8


def test_hostvars_of_an_unknown_host_is_one_finding(tmp_path):
    inv = _inventory(tmp_path, {"ddtree_model": {"path": "{{ hostvars['nope'].shared_model }}"}}, {})
    with pytest.raises(ConfigError) as info:
        load_hostvars(inv)
    (f,) = info.value.findings
    assert f.field == "ddtree_model" and "\n" not in f.message()
