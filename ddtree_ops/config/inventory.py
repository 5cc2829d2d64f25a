"""Read deployment variables from an Ansible inventory with Ansible's own loader.

Using :mod:`ansible.inventory` (not our own YAML walk) gives exactly the variable
precedence Ansible applies (``all`` < parent groups < child groups < host_vars), so
``ddtree-ops render`` and ``ansible-playbook deploy.yml`` see the same values.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigError, Finding, scrub, shorten, type_name
from .hostvars import deployment_vars, host_vault_texts, vaulted_host_name

TEMPLATE_DEADLINE_S = 10.0
"""Longest the Jinja of one host's variables may take to template (a loop, a ``pipe`` lookup),
seconds; enforced with ``SIGALRM`` when loading on the main thread (the CLI)."""

SERVER_GROUP = "sglang_servers"
"""Inventory group whose hosts run an SGLang instance (``deploy.yml`` targets it)."""


def load_hostvars(inventory: str | Path, limit: str | None = None,
                  vault_password_files: Sequence[str] = (),
                  extra_vars: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Return ``{host: {ddtree_var: value}}`` for the server hosts of an inventory.

    Args:
        inventory: inventory file or directory (as given to ``ansible-playbook -i``).
        limit: an Ansible host pattern (``-l``), e.g. ``b300`` or ``host1,host2``.
        vault_password_files: vault password files (``--vault-password-file``; ``[id@]path``,
            a script is run as Ansible runs it); ``ANSIBLE_VAULT_PASSWORD_FILE`` /
            ``ansible.cfg``'s ``vault_password_file`` and ``vault_identity_list`` are used as well,
            as ``ansible-inventory`` does.
        extra_vars: further variables to template and return where a host sets them (e.g. the
            connection variables ``ansible_user``, ``ansible_port`` that ``ddtree-ops fleet`` reads),
            under the same deadline; their values are the caller's to validate.

    Inventory Jinja is code that Ansible runs (lookups included), as ``ansible-playbook`` would:
    templating one host may take at most :data:`TEMPLATE_DEADLINE_S` seconds (on the main thread);
    past it, the processes templating started (a ``pipe`` lookup's shell and command, their
    children) are killed, so none keeps the caller's stdout/stderr open.
    Ansible's warnings during the load (e.g. a duplicate YAML key) are printed to stderr after
    it, as one line each (message and origin, never the source line) with secrets scrubbed.

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
    warnings: list[str] = []
    try:
        with _ansible_failures(causes, warnings):
            return _load(path, limit, list(vault_password_files), causes, tuple(extra_vars))
    except AnsibleError as exc:
        first = _first_line(str(exc)) or type(exc).__name__
        cause = f" ({causes[0]})" if causes else ""
        raise ConfigError(
            [
                Finding(
                    "error",
                    "inventory",
                    str(inventory),
                    f"Ansible cannot read it: {first}{cause}",
                    "fix the YAML or Jinja expression it names (ansible-inventory -i INV --list shows the same)",
                )
            ]
        ) from None
    finally:  # after the load: every secret of the inventory is registered, so scrub() removes it
        for w in dict.fromkeys(warnings):
            print(f"[WARNING] {shorten(scrub(w), 400)}", file=sys.stderr)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    origin = next((ln for ln in lines if ln.startswith("Origin: /")), "")
    return shorten(f"{first} {origin}".strip(), 400)


def _warning_line(msg: Any, help_text: Any = None, obj: Any = None) -> str:
    """Ansible's warning as one line: message, help text and origin (file:line), without the
    source-context lines Ansible would print (they may hold a secret)."""
    origin = ""
    try:
        from ansible._internal._datatag._tags import Origin

        tag = Origin.get_tag(obj) if obj is not None else None
        origin = f" Origin: {tag}" if tag is not None else ""
    except ImportError:  # ansible-core < 2.19
        pass
    first = next((ln.strip() for ln in str(msg).splitlines() if ln.strip()), "")
    return f"{first} {help_text or ''}".strip() + origin


@contextlib.contextmanager
def _ansible_failures(causes: list[str], warnings: list[str] | None = None) -> Iterator[None]:
    """Fail on any unparsable inventory source, and collect the parse failures Ansible
    reports (as warnings) into ``causes``: the YAML plugin's first (the one that says why).
    Ansible's other warnings go to ``warnings`` (:func:`_warning_line`), not to the terminal."""
    import ansible.constants as C
    from ansible.utils.display import Display

    display = Display()
    saved = C.INVENTORY_ANY_UNPARSED_IS_FAILED, C.INVENTORY_UNPARSED_IS_FAILED
    had_own = "error_as_warning" in vars(display)
    had_warning = "warning" in vars(display)

    def collect(msg: str = "", exception: BaseException | None = None, *args: Any, **kw: Any) -> None:
        text = _first_line(str(exception.__cause__ or exception)) if exception is not None else ""
        entry = f"{msg} {text}".strip()
        if "no root 'plugin' key" in text:  # the auto plugin: "not a plugin config", never the cause
            return
        causes.insert(0 if "'yaml'" in msg else len(causes), entry)

    C.INVENTORY_ANY_UNPARSED_IS_FAILED = C.INVENTORY_UNPARSED_IS_FAILED = True

    def warn(
        msg: str = "", formatted: bool = False, *args: Any, help_text: Any = None, obj: Any = None, **kw: Any
    ) -> None:
        if warnings is not None:
            warnings.append(_warning_line(msg, help_text, obj))

    display.error_as_warning = collect  # type: ignore[method-assign]
    if warnings is not None and not had_warning:
        display.warning = warn  # type: ignore[method-assign]
    try:
        yield
    finally:
        C.INVENTORY_ANY_UNPARSED_IS_FAILED, C.INVENTORY_UNPARSED_IS_FAILED = saved
        if not had_own:
            del display.error_as_warning
        if warnings is not None and not had_warning:
            del display.warning


MAX_VARS_ENTRIES = 10_000
"""Most files and directories the group_vars/host_vars check walks (a link to ``/`` would walk the disk)."""


MAX_VARS_FILE_BYTES = 16 << 20
"""Largest group_vars/host_vars file read, bytes (a deployment's variables are a few KB; vaulted
ones a few times that)."""


def _check_vars_files(path: Path) -> None:
    """Check every file the load reads before Ansible reads it: the inventory file given (``-i
    FILE``) or every file under the inventory directory (``-i DIR``: Ansible parses each as a
    source and reads group_vars/host_vars in it), and the group_vars/host_vars next to an
    inventory file.

    Refused: a dangling symlink (Ansible's ``host_group_vars`` plugin skips one silently, which
    would read as "ddtree_host_class = None"), an unreadable file or directory, a file that is
    not a regular file (a FIFO blocks the read forever, a link to ``/dev/zero`` never ends and
    fills memory) or is over :data:`MAX_VARS_FILE_BYTES`; linked directories are followed (Ansible
    reads them too; each directory once, so a link loop ends), at most :data:`MAX_VARS_ENTRIES`
    entries in each tree."""
    if path.is_dir():
        _check_sources(path, set(), [0])
        return
    _check_one(path, is_file_entry=True)
    for sub in ("group_vars", "host_vars"):
        if (path.parent / sub).is_dir():
            _check_tree(path.parent / sub, path.parent / sub)


def _refuse(f: str | Path, why: str) -> None:
    raise ConfigError([Finding("error", "inventory", str(f), why,
                               "fix or remove the file (its variables would be missing, or the load would hang)")])


def _check_one(f: Path, is_file_entry: bool) -> None:
    """The checks of one entry (see :func:`_check_vars_files`); ``os.stat`` follows a link, so a
    link to a device is judged by what it points at."""
    if f.is_symlink() and not f.exists():
        _refuse(f, f"is a dangling symlink (to {shorten(os.readlink(f), 200)}); Ansible would skip it silently")
    if not is_file_entry:
        return
    try:
        st = f.stat()
    except OSError as exc:
        _refuse(f, f"cannot be read: {exc.strerror or exc}")
    if not stat.S_ISREG(st.st_mode):  # a FIFO, socket or device blocks or never ends
        _refuse(f, "is not a regular file (a FIFO, socket or device: reading it would block or never end)")
    if not os.access(f, os.R_OK):
        _refuse(f, "is not readable by this user; Ansible would skip its variables")
    if st.st_size > MAX_VARS_FILE_BYTES:
        _refuse(f, f"is larger than {MAX_VARS_FILE_BYTES >> 20} MiB (not an inventory or variables file?)")


def _check_sources(d: Path, seen: set[tuple[int, int]], entries: list[int]) -> None:
    """Check the inventory directory ``d`` as Ansible reads it (``InventoryManager`` of
    ansible-core 2.19, ``ansible/inventory/manager.py``): every entry its ``IGNORED`` pattern
    does not skip (hidden names, ``.md``, ``.txt``, ``~`` ... are never opened) is a source, a
    directory recursively; group_vars/host_vars at any level wholly (the vars plugin reads them)."""
    from ansible.inventory.manager import IGNORED

    try:
        st = os.stat(d)
        names = sorted(os.listdir(d))
    except OSError as exc:
        _refuse(d, f"cannot be listed by this user: {exc.strerror or exc}")
    if (st.st_dev, st.st_ino) in seen:  # a symlink loop, or one directory linked twice
        return
    seen.add((st.st_dev, st.st_ino))
    entries[0] += len(names)
    if entries[0] > MAX_VARS_ENTRIES:
        _refuse(d, f"holds more than {MAX_VARS_ENTRIES} files and directories (a link to a large tree?)")
    for name in names:
        f = d / name
        if name in ("group_vars", "host_vars") and f.is_dir():
            _check_tree(f, f)
        elif IGNORED.search(os.fsencode(name)):
            continue
        elif f.is_dir():
            _check_one(f, is_file_entry=False)
            _check_sources(f, seen, entries)
        else:
            _check_one(f, is_file_entry=True)


def _check_tree(top: Path, shown: Path) -> None:
    def unlistable(exc: OSError) -> None:
        _refuse(exc.filename or shown, "cannot be listed by this user; Ansible would skip its variables")

    seen: set[tuple[int, int]] = set()
    entries = 0
    for dirpath, dirnames, filenames in os.walk(top, onerror=unlistable, followlinks=True):
        st = os.stat(dirpath)
        if (st.st_dev, st.st_ino) in seen:  # a symlink loop, or one directory linked twice
            dirnames[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        entries += len(dirnames) + len(filenames)
        if entries > MAX_VARS_ENTRIES:
            _refuse(shown, f"holds more than {MAX_VARS_ENTRIES} files and directories (a link to a large tree?)")
        for name in dirnames:
            _check_one(Path(dirpath) / name, is_file_entry=False)
        for name in filenames:
            _check_one(Path(dirpath) / name, is_file_entry=True)


def _yaml_causes(path: Path, loader: Any) -> list[str]:
    """Why the inventory's ``.yml`` / ``.yaml`` / ``.json`` sources are no YAML inventory, for the
    error when no host matches: Ansible tries its yaml plugin, then its ini plugin, and keeps the
    ini result silently (a YAML list, binary garbage), dropping the yaml plugin's failure."""
    files = (
        [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    )
    out: list[str] = []
    for f in files[:100]:
        if f.suffix not in (".yml", ".yaml", ".json"):
            continue
        try:
            data = loader.load_from_file(str(f))
        except Exception as exc:  # noqa: BLE001 - any parse error is the cause we report
            out.append(f"{f.name} is not valid YAML: {_first_line(str(exc))}")
            continue
        if data is not None and not isinstance(data, dict):
            out.append(
                f"{f.name} is a YAML {type_name(data)}, not a mapping of groups (sglang_servers: children: ...)"
            )
    return out


class TemplateTimeout(BaseException):
    """Templating one host ran past :data:`TEMPLATE_DEADLINE_S` (a ``BaseException``, so no
    ``except Exception`` in Ansible or Jinja swallows it)."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise :class:`TemplateTimeout` in the block after ``seconds`` (``SIGALRM``; a no-op off
    the main thread or without ``setitimer``, e.g. inside an Ansible worker)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise TemplateTimeout()

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _descendants(root: int, proc: Path = Path("/proc")) -> set[tuple[int, int]]:
    """``(pid, start time)`` of every live descendant of ``root`` (proc(5) ``/proc/<pid>/stat``:
    field 4 ppid, field 22 start time in clock ticks, which tells a reused pid apart)."""
    parent: dict[int, tuple[int, int]] = {}
    try:
        entries = [e for e in os.listdir(proc) if e.isdigit()]
    except OSError:
        return set()
    for e in entries:
        try:
            stat = (proc / e / "stat").read_text(encoding="ascii", errors="replace")
            fields = stat[stat.rindex(")") + 2:].split()  # comm (field 2) may hold spaces and ")"
            parent[int(e)] = (int(fields[1]), int(fields[19]))
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
    out: set[tuple[int, int]] = set()
    frontier = [root]
    while frontier:
        p = frontier.pop()
        for pid, (ppid, start) in parent.items():
            if ppid == p and (pid, start) not in out:
                out.add((pid, start))
                frontier.append(pid)
    return out


def _kill_started(before: set[tuple[int, int]]) -> int:
    """SIGKILL the descendants of this process that did not exist in ``before`` (what a ``pipe``
    lookup started: its shell, the command, their children), twice (one may fork meanwhile);
    return how many. An orphaned ``sleep`` would keep our stderr open and make every caller that
    captures it (``| cat``, Ansible, ``subprocess``) wait for it."""
    killed: set[tuple[int, int]] = set()
    for _ in range(2):
        for pid, start in _descendants(os.getpid()) - before - killed:
            with contextlib.suppress(OSError):  # ended meanwhile
                os.kill(pid, signal.SIGKILL)
            killed.add((pid, start))
    return len(killed)


def _vault_secrets(loader: Any, files: list[str]) -> None:
    """Give ``loader`` (and ansible-core 2.19's process-wide vault context) the vault secrets of
    ``files``, ``ANSIBLE_VAULT_PASSWORD_FILE`` and ``ansible.cfg``, as ``ansible-inventory`` does
    (``ansible.cli.CLI.setup_vault_secrets``; no prompt)."""
    import ansible.constants as C
    from ansible.cli import CLI

    try:
        from ansible.parsing.vault import VaultSecretsContext
    except ImportError:  # ansible-core < 2.19: the loader is enough
        VaultSecretsContext = None  # noqa: N806
    if not files and not C.DEFAULT_VAULT_PASSWORD_FILE and not C.DEFAULT_VAULT_IDENTITY_LIST:
        current = VaultSecretsContext.current(optional=True) if VaultSecretsContext else None
        if current is not None:  # a long-lived process: no secrets of an earlier load carry over
            current.secrets[:] = []
        return
    # "id@path" is a vault id (ansible-inventory --vault-id); a plain path a password file
    with_id = [f for f in files if "@" in f and not f.startswith("/")]
    plain = [f for f in files if f not in with_id]
    for f in files:
        name = f.split("@", 1)[1] if f in with_id else f
        if not Path(name).is_file():
            raise ConfigError([Finding("error", "--vault-password-file", None, f"no such file: {shorten(f)}",
                                       "give the path of a file holding the vault password (or a script printing it)")])
    try:
        secrets = CLI.setup_vault_secrets(loader, vault_ids=list(C.DEFAULT_VAULT_IDENTITY_LIST) + with_id,
                                          vault_password_files=plain, ask_vault_pass=False,
                                          auto_prompt=False, initialize_context=False)
    except Exception as exc:  # noqa: BLE001 - AnsibleError and OSError alike: one finding
        raise ConfigError(
            [
                Finding(
                    "error",
                    "--vault-password-file",
                    None,
                    f"cannot read the vault password ({shorten(', '.join(files))}): {_first_line(str(exc))}",
                    "check the file (or ANSIBLE_VAULT_PASSWORD_FILE / ansible.cfg)",
                )
            ]
        ) from None
    loader.set_vault_secrets(secrets)
    if VaultSecretsContext is None:
        return
    current = VaultSecretsContext.current(optional=True)
    if current is None:
        VaultSecretsContext.initialize(VaultSecretsContext(secrets))
    else:  # a second load in one process (tests, a long-lived caller)
        current.secrets[:] = secrets


def _load(path: Path, limit: str | None, vault_password_files: list[str] | None = None,
          causes: Sequence[str] = (), extra_vars: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar
    from ansible.vars.manager import VariableManager

    loader = DataLoader()
    _vault_secrets(loader, list(vault_password_files or []))
    from ansible.vars.hostvars import HostVars

    inv = InventoryManager(loader=loader, sources=[str(path)])
    vm = VariableManager(loader=loader, inventory=inv)
    # ``hostvars`` as ansible-playbook gives it (ansible-core 2.19 executor/task_queue_manager.py
    # builds the same HostVars, which registers itself with the variable manager): a read-only,
    # lazy view of the other hosts' variables, each templated with that host's own variables.
    HostVars(inventory=inv, variable_manager=vm, loader=loader)
    pattern = SERVER_GROUP if not limit else f"{SERVER_GROUP}:&{limit}"
    hosts = inv.get_hosts(pattern)
    if not hosts:
        causes = list(causes) + _yaml_causes(path, loader)
        cause = (f"; {causes[0]} (Ansible's ini plugin then read it as INI, without that host group)"
                 if causes else "")
        raise ConfigError([Finding("error", "--limit" if limit else "inventory", limit or str(path),
                                   f"no host of group {SERVER_GROUP} matches{cause}",
                                   f"add hosts under {SERVER_GROUP} (children: host-class groups such as b300, "
                                   "h200x8) or fix the pattern"
                                   + (" and the file the parser names" if causes else ""))])
    out: dict[str, dict[str, Any]] = {}
    before = _descendants(os.getpid())  # once (a /proc scan, ~2 ms per 100 processes): not per host
    memo: dict = {}  # walks over the group_vars objects the hosts share, once per load (hostvars._memo_get)
    # Provenance is inventory-wide: the vault plaintexts of every host (a router's API key, another
    # server's host_vars), not only the loaded ones, count as secrets on each. Each host's walk is
    # bounded as for its own check (hostvars.MAX_VAULT_NODES, MAX_UNREACHED_DECRYPTS), its shared
    # group_vars values decrypted once (memo), all under the same per-host deadline.
    everyone = inv.get_hosts("all")
    secrets: set[str] = set()
    for host in everyone:
        with _templating(host.name, before):
            all_vars = vm.get_vars(host=host, include_hostvars=True)
            templar = Templar(loader=loader, variables=all_vars)
            secrets |= host_vault_texts(all_vars, _template_if_marked(templar, memo), memo)
    named = vaulted_host_name([h.name for h in everyone], secrets)
    if named is not None:
        raise ConfigError([named])
    for host in hosts:
        with _templating(host.name, before):
            all_vars = vm.get_vars(host=host, include_hostvars=True)
            templar = Templar(loader=loader, variables=all_vars)
            out[host.name] = deployment_vars(all_vars, _template_if_marked(templar, memo), host.name, memo,
                                             inventory_secrets=secrets)
            for name in extra_vars:
                if name in all_vars:
                    out[host.name][name] = _template_one(templar, name, all_vars[name], host.name)
    return out


@contextlib.contextmanager
def _templating(host: str, before: set[tuple[int, int]]) -> Iterator[None]:
    """Template one host's variables within :data:`TEMPLATE_DEADLINE_S`; past it, the processes
    templating started are killed and the host gets one finding naming the cause."""
    try:
        with _deadline(TEMPLATE_DEADLINE_S):
            yield
    except TemplateTimeout as exc:
        killed = _kill_started(before)
        what = getattr(exc, "cause", None) or "templating the host's variables"
        why = "" if getattr(exc, "cause", None) else " (a Jinja loop or a slow lookup)"
        fix = getattr(exc, "fix", None) or ("simplify the Jinja in its group_vars/host_vars (inventory Jinja is "
                                            "code Ansible runs, lookups included)")
        ended = (f"; the {killed} process{'es' if killed != 1 else ''} it started "
                 f"{'were' if killed != 1 else 'was'} killed" if killed else "")
        raise ConfigError([Finding("error", getattr(exc, "variable", "inventory"), "…",
                                   f"{what} took longer than {TEMPLATE_DEADLINE_S:g} s{why}{ended}",
                                   fix, host=host)]) from None


def _template_one(templar: Any, name: str, value: Any, host: str) -> Any:
    """``value`` of variable ``name`` templated; a failing template is one finding naming it."""
    from .hostvars import template_error

    try:
        return templar.template(value)
    except Exception as exc:  # noqa: BLE001 - Ansible raises many types; each is one finding
        raise ConfigError([template_error(name, value, exc, host)]) from None


def _template_if_marked(templar: Any, memo: dict | None = None) -> Callable[[Any], Any]:
    """``templar.template``, skipped for a value that cannot template to anything but itself.

    A value is passed through unchanged when every scalar in it (keys included) is ``None``,
    a bool, int or float, or a string that is neither vaulted (``errors._is_vaulted``: vault
    values must be decrypted by the Templar) nor, by Ansible's own test
    (``Templar.is_possibly_template``: a ``{{``/``{%``/``{#`` start string or a ``#jinja2:``
    header), possibly a template. For such values the Templar returns an equal value of the
    same types (``tests/test_perf.py`` checks the rendered output is byte-identical); the
    Templar's walk cost ~1 ms a host, most of ``validate``'s per-host time (``scripts/bench-controller.py``).
    Anything else (a marker, a vaulted string, another type) goes through the Templar.
    ``memo`` (one load's, ``hostvars._memo_get``): the verdict on a container the hosts share
    (their group_vars values), worked out once per load; the test depends on the value alone.
    """
    from .errors import _is_vaulted
    from .hostvars import _memo_get, _memo_put

    def plain(value: Any) -> bool:
        known = _memo_get(memo, "plain", value)
        if known is None:
            known = _plain(value)
            _memo_put(memo, "plain", value, known)
        return known

    def _plain(value: Any) -> bool:
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
