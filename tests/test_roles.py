"""Every role's ``meta/argument_specs.yml`` documents exactly its ``defaults/main.yml``
(same names, same defaults), and role variables carry the role's name as prefix."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ddtree_ops.config.models import is_deployment_var

ROLES = sorted(p.parent.parent.name for p in (Path(__file__).resolve().parents[1] / "roles").glob("*/defaults/main.yml"))


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_match_defaults(role):
    base = Path(__file__).resolve().parents[1] / "roles" / role
    defaults = yaml.safe_load((base / "defaults" / "main.yml").read_text()) or {}
    options = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert sorted(defaults) == sorted(options)
    for name, value in defaults.items():
        assert options[name].get("default") == value, name
        assert options[name].get("description"), name
        assert name.startswith(f"{role}_"), name
        assert not is_deployment_var(name), f"{name} would be read as deployment config"
