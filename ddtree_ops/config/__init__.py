"""Config model, rules and derived plan (the single source of truth for sizes and flags).

The names below are loaded on first use (PEP 562 ``__getattr__``), so importing a light
submodule (``ddtree_ops.config.toolchain``, ``.hosts``, ``.versions``) does not load pydantic
and the config models (each command loads what it uses, so the light ones start fast).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .errors import ConfigError, Finding
    from .load import Validated, check, deployment_from_hostvars, validate_hostvars
    from .models import Deployment
    from .plan import Plan, default_capture_bs, make_plan

_WHERE = {
    "ConfigError": "errors",
    "Finding": "errors",
    "Validated": "load",
    "check": "load",
    "deployment_from_hostvars": "load",
    "validate_hostvars": "load",
    "Deployment": "models",
    "Plan": "plan",
    "default_capture_bs": "plan",
    "make_plan": "plan",
}

# Spelled out (not sorted(_WHERE)) so linters and type checkers see the re-exports;
# tests/test_perf.py checks it names exactly the keys of _WHERE.
__all__ = [
    "ConfigError",
    "Deployment",
    "Finding",
    "Plan",
    "Validated",
    "check",
    "default_capture_bs",
    "deployment_from_hostvars",
    "make_plan",
    "validate_hostvars",
]


def __getattr__(name: str) -> Any:
    """Import ``name`` from its submodule on first access (then cached in this module).

    Raises:
        AttributeError: ``name`` is not one of :data:`__all__`.
    """
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
