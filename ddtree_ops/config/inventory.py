"""Read deployment variables from an Ansible inventory with Ansible's own loader.

Using :mod:`ansible.inventory` (not our own YAML walk) gives exactly the variable
precedence Ansible applies (``all`` < parent groups < child groups < host_vars), so
``ddtree-ops render`` and ``ansible-playbook deploy.yml`` see the same values.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigError, Finding
from .errors import shorten
from .models import deployment_vars

SERVER_GROUP = "sglang_servers"
"""Inventory group whose hosts run an SGLang instance (``deploy.yml`` targets it)."""


def load_hostvars(inventory: str | Path, limit: str | None = None) -> dict[str, dict[str, Any]]:
    """Return ``{host: {ddtree_var: value}}`` for the server hosts of an inventory.

    Args:
        inventory: inventory file or directory (as given to ``ansible-playbook -i``).
        limit: an Ansible host pattern (``-l``), e.g. ``b300`` or ``host1,host2``.

    Every inventory source must parse (Ansible's ``INVENTORY_ANY_UNPARSED_IS_FAILED`` is
    turned on for the load), and every file under ``group_vars`` / ``host_vars`` next to it
    must be readable (Ansible's ``host_group_vars`` plugin silently skips a dangling
    symlink, which would read as "ddtree_host_class = None"). The error names Ansible's
    own cause (the parser's message and the file position).

    Raises:
        ConfigError: the inventory cannot be read, or the pattern matches no server host.
    """
    from ansible.errors import AnsibleError

    path = Path(inventory)
    if not path.exists():
        raise ConfigError([Finding("error", "--inventory", str(inventory), "inventory not found",
                                   "pass an inventory file or directory, e.g. inventory/example")])
    _check_vars_files(path)
    causes: list[str] = []
    try:
        with _ansible_failures(causes):
            return _load(path, limit)
    except AnsibleError as exc:
        first = _first_line(str(exc)) or type(exc).__name__
        cause = f" ({causes[0]})" if causes else ""
        raise ConfigError([Finding("error", "inventory", str(inventory), f"Ansible cannot read it: {first}{cause}",
                                   "fix the YAML or Jinja expression it names (ansible-inventory -i INV --list shows the same)")]) from None


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    origin = next((ln for ln in lines if ln.startswith("Origin: /")), "")
    return shorten(f"{first} {origin}".strip(), 400)


@contextlib.contextmanager
def _ansible_failures(causes: list[str]) -> Iterator[None]:
    """Fail on any unparsable inventory source, and collect the parse failures Ansible
    reports (as warnings) into ``causes``: the YAML plugin's first (the one that says why)."""
    import ansible.constants as C
    from ansible.utils.display import Display

    display = Display()
    saved = C.INVENTORY_ANY_UNPARSED_IS_FAILED, C.INVENTORY_UNPARSED_IS_FAILED
    had_own = "error_as_warning" in vars(display)

    def collect(msg: str = "", exception: BaseException | None = None, *args: Any, **kw: Any) -> None:
        text = _first_line(str(exception.__cause__ or exception)) if exception is not None else ""
        entry = f"{msg} {text}".strip()
        if "no root 'plugin' key" in text:  # the auto plugin: "not a plugin config", never the cause
            return
        causes.insert(0 if "'yaml'" in msg else len(causes), entry)

    C.INVENTORY_ANY_UNPARSED_IS_FAILED = C.INVENTORY_UNPARSED_IS_FAILED = True
    display.error_as_warning = collect  # type: ignore[method-assign]
    try:
        yield
    finally:
        C.INVENTORY_ANY_UNPARSED_IS_FAILED, C.INVENTORY_UNPARSED_IS_FAILED = saved
        if not had_own:
            del display.error_as_warning


def _check_vars_files(path: Path) -> None:
    """Refuse a dangling symlink or unreadable file under the inventory's group_vars/host_vars."""
    base = path if path.is_dir() else path.parent
    for sub in ("group_vars", "host_vars"):
        top = base / sub
        if not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                f = Path(dirpath) / name
                if f.is_symlink() and not f.exists():
                    why = f"is a dangling symlink (to {shorten(os.readlink(f), 200)}); Ansible would skip it silently"
                elif f.is_file() and not os.access(f, os.R_OK):
                    why = "is not readable by this user; Ansible would skip its variables"
                else:
                    continue
                raise ConfigError([Finding("error", "inventory", str(f), why,
                                           "fix or remove the file (its variables would be missing)")])


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
        out[host.name] = deployment_vars(all_vars, _template_if_marked(templar), host.name)
    return out


def _template_if_marked(templar: Any) -> Callable[[Any], Any]:
    """``templar.template``, skipped for a value that cannot template to anything but itself.

    A value is passed through unchanged when every scalar in it (keys included) is ``None``,
    a bool, int or float, or a string that is neither vaulted (``errors._is_vaulted``: vault
    values must be decrypted by the Templar) nor, by Ansible's own test
    (``Templar.is_possibly_template``: a ``{{``/``{%``/``{#`` start string or a ``#jinja2:``
    header), possibly a template. For such values the Templar returns an equal value of the
    same types (``tests/test_perf.py`` checks the rendered output is byte-identical); the
    Templar's walk cost ~1 ms a host, most of ``validate``'s per-host time (issue 15).
    Anything else (a marker, a vaulted string, another type) goes through the Templar.
    """
    from .errors import _is_vaulted

    def plain(value: Any) -> bool:
        stack = [value]
        while stack:
            v = stack.pop()
            if v is None or isinstance(v, (bool, int, float)):
                continue
            if isinstance(v, str):
                if _is_vaulted(v) or templar.is_possibly_template(v):
                    return False
            elif isinstance(v, dict):
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, list):
                stack.extend(v)
            else:
                return False
        return True

    def template(value: Any) -> Any:
        return value if plain(value) else templar.template(value)

    return template
