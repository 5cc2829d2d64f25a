"""Every role's ``meta/argument_specs.yml`` matches its ``defaults/main.yml`` (names, defaults),
every option is documented, and role variables carry the role's name as prefix; the config
loader must not mistake ``ddtree_*`` role variables for deployment settings."""

from __future__ import annotations

import pytest
import yaml

from ddtree_ops.config.models import ROLE_VAR_PREFIXES, is_deployment_var
from helpers import REPO

ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "meta" / "argument_specs.yml").is_file())


def test_every_role_has_specs() -> None:
    assert {"ddtree_exporter", "prometheus_targets"} <= set(ROLES)
    assert sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir()) == ROLES


@pytest.mark.parametrize("role", ROLES)
def test_argument_specs_match_defaults(role: str) -> None:
    base = REPO / "roles" / role
    defaults = yaml.safe_load((base / "defaults" / "main.yml").read_text()) or {}
    options = yaml.safe_load((base / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) == set(options), f"{role}: defaults and argument_specs differ"
    for name, spec in options.items():
        assert name.startswith(f"{role}_"), f"{role}: {name} lacks the role prefix"
        assert spec.get("description"), f"{role}: {name} is undocumented"
        assert spec.get("default") == defaults[name], f"{role}: {name} default differs"
        if name.startswith("ddtree_"):
            assert name.startswith(ROLE_VAR_PREFIXES) and not is_deployment_var(name), name
