"""Read deployment variables from an Ansible inventory with Ansible's own loader.

Using :mod:`ansible.inventory` (not our own YAML walk) gives exactly the variable
precedence Ansible applies (``all`` < parent groups < child groups < host_vars), so
``ddtree-ops render`` and ``ansible-playbook deploy.yml`` see the same values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ConfigError, Finding
from .models import deployment_vars

SERVER_GROUP = "sglang_servers"
"""Inventory group whose hosts run an SGLang instance (``deploy.yml`` targets it)."""


def load_hostvars(inventory: str | Path, limit: str | None = None) -> dict[str, dict[str, Any]]:
    """Return ``{host: {ddtree_var: value}}`` for the server hosts of an inventory.

    Args:
        inventory: inventory file or directory (as given to ``ansible-playbook -i``).
        limit: an Ansible host pattern (``-l``), e.g. ``b300`` or ``host1,host2``.

    Raises:
        ConfigError: the inventory cannot be read, or the pattern matches no server host.
    """
    from ansible.errors import AnsibleError

    path = Path(inventory)
    if not path.exists():
        raise ConfigError([Finding("error", "--inventory", str(inventory), "inventory not found",
                                   "pass an inventory file or directory, e.g. inventory/example")])
    try:
        return _load(path, limit)
    except AnsibleError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError([Finding("error", "inventory", str(inventory), f"Ansible cannot read it: {first}",
                                   "fix the YAML or Jinja expression it names (ansible-inventory -i INV --list shows the same)")]) from None


def _load(path: Path, limit: str | None) -> dict[str, dict[str, Any]]:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(path)])
    vm = VariableManager(loader=loader, inventory=inv)
    pattern = SERVER_GROUP if not limit else f"{SERVER_GROUP}:&{limit}"
    hosts = inv.get_hosts(pattern)
    if not hosts:
        raise ConfigError([Finding("error", "--limit" if limit else "inventory", limit or str(path),
                                   f"no host of group {SERVER_GROUP} matches",
                                   f"add hosts under {SERVER_GROUP} (children b300 / ct200) or fix the pattern")])
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        all_vars = vm.get_vars(host=host, include_hostvars=False)
        templar = Templar(loader=loader, variables=all_vars)
        out[host.name] = deployment_vars(all_vars, templar.template)
    return out
