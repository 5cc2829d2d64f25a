"""Config model, rules and derived plan (the single source of truth for sizes and flags)."""

from .errors import ConfigError, Finding
from .load import Validated, check, deployment_from_hostvars, validate_hostvars
from .models import Deployment
from .plan import Plan, default_capture_bs, make_plan

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
