"""Every role keeps ``meta/argument_specs.yml`` in sync with ``defaults/main.yml``:
same variables, same defaults, every variable prefixed with the role name."""

from __future__ import annotations

import pytest
import yaml

from helpers import REPO

ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def test_roles_found():
    assert {"ddtree_service", "cuda_toolkit", "triton", "sglang", "ddtree_exporter", "prometheus_targets"} <= set(ROLES)
    # every role directory is a complete role with specs
    for p in (REPO / "roles").iterdir():
        if p.is_dir():
            assert p.name in ROLES and (p / "meta" / "argument_specs.yml").is_file(), p.name


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_match_defaults(role):
    base = REPO / "roles" / role
    defaults = yaml.safe_load((base / "defaults" / "main.yml").read_text()) or {}
    options = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options), f"{role}: defaults and argument_specs list different variables"
    for name, value in defaults.items():
        assert name.startswith(role + "_"), f"{role}: {name} is not prefixed with the role name"
        assert options[name].get("default") == value, f"{role}: {name} default differs"
        assert options[name].get("description"), f"{role}: {name} has no description"


@pytest.mark.parametrize("role", ROLES)
def test_role_vars_not_read_as_deployment_config(role):
    from ddtree_ops.config.models import is_deployment_var

    defaults = yaml.safe_load((REPO / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    assert not any(is_deployment_var(k) for k in defaults)
