"""What every ``ddtree-ops`` command group shares: the consoles and :func:`say`, the common
options (inventory, limit, ``--json``, vault files, ``--hub``, ``--plan``, the server URL), the
inventory loading behind validate/plan/render, the deployment a runtime command targets, and
the error table that maps what no command handled to one line and an exit code
(:data:`KNOWN_ERRORS`). The command groups import it; it imports none of them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

if TYPE_CHECKING:
    from ..config import Validated
    from ..config.errors import Finding
    from ..config.plandoc_model import PlanDoc

out = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

DEFAULT_INVENTORY = os.environ.get("DDTREE_INVENTORY", "inventory/example")
InventoryOpt = Annotated[str, typer.Option("--inventory", "-i", help="Ansible inventory file or directory.")]
LimitOpt = Annotated[str | None, typer.Option("--limit", "-l", help="Ansible host pattern, e.g. b300.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
VaultOpt = Annotated[list[str] | None, typer.Option(
    "--vault-password-file", help="Vault password file ([id@]path; repeatable). ANSIBLE_VAULT_PASSWORD_FILE and "
    "ansible.cfg are honoured too, as by ansible-inventory.", callback=lambda v: _vault_files(v))]
HubOpt = Annotated[bool, typer.Option(
    "--hub", help="Read the model's and draft's config files (config.json, preprocessor_config.json, the "
    "safetensors index; never weights) from the Hugging Face Hub when they are not local (also DDTREE_HUB=1). "
    "Offline otherwise: those checks are reported as not done.")]


class CheckFailed(Exception):
    """A check ran and failed (exit 1)."""



def say(console: Console, label: str, style: str, message: str) -> None:
    """Print ``label message`` with no rich markup parsing of ``message`` (user input).

    When ``console`` is not a terminal (no colour: a pipe, a file, CI) and the line holds no
    control character (which rich would strip, or expand, as tabs), the line is written to
    the console's file directly: the same bytes rich writes (``tests/test_perf.py``
    compares them), without rich's ~40-150 µs of rendering a line, which was 0.6 s of a
    1000-host ``validate`` (``scripts/bench-controller.py`` measures it). Otherwise rich prints it.
    """
    line = f"{label} {message}"
    if not console.is_terminal and line.isprintable():
        console.file.write(line + "\n")
        console.file.flush()  # as rich does after each print: keeps stdout/stderr order
        return
    console.print(Text.assemble((label, style), " ", message), highlight=False)


def _shown_url(url: object) -> str:
    """A URL as messages may echo it, quoted (``repr``): user info and any query/fragment replaced
    by ``(redacted)``, secrets scrubbed, cut to 200 characters; a value that is no string (a
    plan.json ``url`` of null, a number) as its ``repr``, cut."""
    from ..config.errors import scrub, shorten

    if not isinstance(url, str):
        return shorten(repr(url))
    text = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)?[^/?#]*@", r"\1(redacted)@", url)
    text = re.sub(r"[?#].*", "?(redacted)", text, flags=re.S)
    return repr(shorten(scrub(text)))


def _url(url: str) -> str:
    """``url`` if it is ``http(s)://HOST[:PORT][/path]`` without credentials, query or fragment.

    A URL with user info (``http://user:pass@host``) or a query (``?access_token=...``) is
    refused: a server's base URL needs neither, and either would be echoed in the report
    (``url``), in bench's result files, in logs and in shell history; the message shows it with
    those parts replaced by ``(redacted)`` (:func:`_shown_url`)."""
    import httpx

    try:
        u = httpx.URL(url)
        ok = u.scheme in ("http", "https") and bool(u.host) and (u.port is None or 0 < u.port < 65536)
        has_userinfo = bool(u.userinfo)
        has_query = bool(u.query) or bool(u.fragment) or "?" in url or "#" in url
    except Exception:  # httpx raises several types for malformed URLs
        ok, has_userinfo, has_query = False, "@" in url, "?" in url or "#" in url
    if has_userinfo:
        raise typer.BadParameter(f"URL {_shown_url(url)}: holds credentials (user info); give http(s)://HOST:PORT "
                                 "without them")
    if has_query:
        raise typer.BadParameter(f"URL {_shown_url(url)}: holds a query or fragment; give the server's base URL "
                                 "http(s)://HOST:PORT (credentials go in DDTREE_API_KEY, never in the URL)")
    if not ok:
        raise typer.BadParameter(f"URL {_shown_url(url)}: give http(s)://HOST:PORT, e.g. http://127.0.0.1:30000")
    return url


def _vault_files(files: list[str] | None) -> list[str] | None:
    """``--vault-password-file`` values (``[id@]path``) whose path is a regular file (a password
    file, or an executable script Ansible runs); anything else is a usage error naming it (a FIFO,
    a directory or ``/dev/zero`` otherwise surfaced as "no such file" or hung the read)."""
    from ..config.errors import shorten

    for spec in files or []:
        path = spec.split("@", 1)[1] if "@" in spec and not spec.startswith("/") else spec
        try:
            st = os.stat(path)
        except OSError as exc:
            raise typer.BadParameter(f"--vault-password-file {shorten(path)!r}: {exc.strerror or exc}") from None
        if not stat.S_ISREG(st.st_mode):
            raise typer.BadParameter(f"--vault-password-file {shorten(path)!r}: not a regular file (a password file "
                                     "or an executable script that prints the password)")
    return files


def _positive(name: str, value: float, hi: float = 86400.0, zero_ok: bool = False) -> float:
    if math.isnan(value) or value > hi or value < 0 or (value == 0 and not zero_ok):
        raise typer.BadParameter(f"{name} {value!r}: must be {'>= 0' if zero_ok else '> 0'} and <= {hi:g}")
    return value


@contextlib.contextmanager
def _fewer_gc_passes(gen0: int = 100_000) -> Iterator[None]:
    """Run the cyclic garbage collector's youngest generation every ``gen0`` allocations (instead of
    Python's 700) while loading and checking, then restore the thresholds: a 1000-host load
    allocates millions of objects and each pass walks the young ones (~5-10 % of validate's CPU
    at 1000 hosts, whose CPU ``scripts/bench-controller.py`` prints; the price is ~6 MB more peak
    memory). Cycles are still collected."""
    import gc

    saved = gc.get_threshold()
    gc.set_threshold(max(gen0, saved[0]), *saved[1:])
    try:
        yield
    finally:
        gc.set_threshold(*saved)


def _validate_all(inventory: str, limit: str | None, vault: list[str] | None = None,
                  hub: bool = False) -> tuple[list[Validated], list[Finding]]:
    with _fewer_gc_passes():
        return _validate_all_hosts(inventory, limit, vault, hub)


def _validate_all_hosts(inventory: str, limit: str | None, vault: list[str] | None,
                        hub: bool) -> tuple[list[Validated], list[Finding]]:
    from ..config import ConfigError, validate_hostvars
    from ..config.checkpoint import CheckpointReader, hub_allowed
    from ..config.fleet import fleet_findings
    from ..config.inventory import load_hostvars
    from ..config.shared import validate_hosts

    hostvars = load_hostvars(inventory, limit, vault or ())
    # once per distinct deployment, each host bound to its own name and address (config/shared.py)
    ok, errors = validate_hosts(hostvars, CheckpointReader(hub=hub_allowed(hub)))
    ok, errors = _readable_plans(ok, errors)
    # clashes on one machine (config/fleet.py); with --limit, against the whole inventory's valid hosts
    peers: list[Validated] = []
    if limit:
        for host, hv in sorted(load_hostvars(inventory, None, vault or ()).items()):
            if host not in hostvars:
                try:
                    peers.append(validate_hostvars(host, hv))
                except ConfigError:
                    pass  # an invalid host outside --limit is its own run's error
    errors.extend(fleet_findings(ok + peers, focus=set(hostvars) if limit else None))
    if not limit:  # routers front the whole fleet (config/router.py); none: nothing changes
        from ..config.router import load_router_vars, validate_routers

        errors.extend(validate_routers(load_router_vars(inventory, vault or ()), ok)[1])
    return ok, errors


def _readable_plans(ok: list[Validated], errors: list[Finding]) -> tuple[list[Validated], list[Finding]]:
    """The hosts whose plan.json the host's readers accept (:func:`ddtree_ops.render.files.plan_json`);
    the others' findings join ``errors``: validate refuses what the host would."""
    from ..config import ConfigError
    from ..render.files import plan_json

    kept = []
    for v in ok:
        try:
            plan_json(v)
            kept.append(v)
        except ConfigError as exc:
            errors = [*errors, *exc.findings]
    return kept, errors


def _require_valid(inventory: str, limit: str | None, vault: list[str] | None = None,
                   hub: bool = False) -> list[Validated]:
    from ..config import ConfigError

    ok, errors = _validate_all(inventory, limit, vault, hub)
    if errors:
        raise ConfigError(errors)
    return ok


def _print_checks(checks: list[dict], as_json: bool, extra: dict | None = None) -> None:
    """Print the checks (and ``extra``, JSON only), every text scrubbed (``config.errors.scrub_all``): details
    quote servers, logs and commands; exit 1 (:class:`CheckFailed`) when one failed."""
    from ..config.errors import scrub_all

    checks, extra = scrub_all(checks), scrub_all(extra)
    ok = all(c["ok"] for c in checks)
    if as_json:
        print(json.dumps({"ok": ok, "checks": checks, **(extra or {})}, indent=2, allow_nan=False))
    else:
        for c in checks:
            say(out, "ok  " if c["ok"] else "FAIL", "green" if c["ok"] else "red", f"{c['name']}: {c['detail']}")
    if not ok:
        raise CheckFailed()


def _deployed(plan_file: Path | None, inventory: str | None, limit: str | None,
              vault: list[str] | None = None) -> tuple[PlanDoc | None, str | None]:
    """The deployed plan (:class:`~ddtree_ops.config.plandoc_model.PlanDoc`) and its default URL,
    from ``--plan`` or ``-i/-l`` (one host).

    Returns ``(None, None)`` when neither is given. Raises ``PlanDocError`` (exit 2) for a
    plan.json that cannot be used, ``typer.BadParameter`` (exit 2) for a pattern that does not
    name exactly one host, and ``ConfigError`` for an invalid inventory.
    """
    if plan_file is not None and inventory is not None:
        raise typer.BadParameter("give --plan or --inventory, not both")
    if plan_file is not None:
        from ..config.plandoc_model import load_plan

        doc = load_plan(plan_file)
        return doc, doc.url
    if inventory is not None:
        from ..config.plandoc_model import PlanDoc
        from ..render.files import plan_document, scrape_address, sglang_target

        validated = _require_valid(inventory, limit, vault)
        if len(validated) != 1:
            names = ", ".join(v.deployment.host for v in validated) or "none"
            raise typer.BadParameter(
                f"--limit {limit!r} selects {len(validated)} hosts ({names}); name exactly one host"
            )
        # where SGLang answers from here: its bound address; bound to loopback on another machine it answers
        # nowhere from here (validate warned), and the host's address at least never reaches a server of this one
        v = validated[0]
        url = f"http://{sglang_target(v) or f'{scrape_address(v)}:{v.deployment.server.port}'}"
        return PlanDoc.of(plan_document(validated[0])), url
    return None, None


def _target(url: str | None, default: str | None) -> str:
    if url is None:
        if default is None:
            raise typer.BadParameter("give the server URL, or --plan / --inventory to take it from the deployment")
        try:
            return _url(default)
        except typer.BadParameter:
            raise typer.BadParameter(
                f"the deployment's url = {_shown_url(default)} is not http(s)://HOST:PORT. Fix: re-render "
                "plan.json, or give the server URL"
            ) from None
    return _url(url)


PlanOpt = Annotated[
    Path | None, typer.Option("--plan", help="The host's plan.json (/etc/ddtree-ops/<name>/plan.json).")
]
DeployInvOpt = Annotated[
    str | None, typer.Option("--inventory", "-i", help="Take the deployment from this inventory (with -l HOST).")
]
UrlArg = Annotated[
    str | None, typer.Argument(help="Server base URL, e.g. http://127.0.0.1:30000 (default: from --plan/--inventory).")
]


EXIT_INTERNAL = 70  # sysexits.h EX_SOFTWARE
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def _missing_module(exc: BaseException) -> str | None:
    name = (getattr(exc, "name", None) or "").split(".")[0]
    if name == "ansible":
        return (
            "this command reads Ansible inventory and needs ansible-core on the controller: "
            "pip install 'ddtree-ops[controller]'"
        )
    return f"a dependency is missing: {name or exc}; reinstall ddtree-ops (pip install 'ddtree-ops[controller]')"


def _os_error(exc: BaseException) -> str:
    what = getattr(exc, "strerror", None) or type(exc).__name__
    where = getattr(exc, "filename", None)
    return f"{where}: {what}" if where else f"{what}: {exc}"


KNOWN_ERRORS: tuple[tuple[type[BaseException], Any], ...] = (
    (ModuleNotFoundError, _missing_module),
    (FileNotFoundError, _os_error),
    (PermissionError, lambda exc: f"{_os_error(exc)} (run as a user who may read/write it)"),
    (IsADirectoryError, _os_error),
    (NotADirectoryError, _os_error),
)
"""Exceptions users cause (environment, files), in the order they are matched: each maps to
its one-line message and exit 2. Anything else is an internal error (exit 70)."""


def _unexpected(argv: list[str] | None, exc: Exception) -> int:
    """One line for an exception no command handled: a known kind (exit 2) or a bug (exit 70).
    ``DDTREE_DEBUG=1`` prints the traceback first. The text goes through the secrets scrub."""
    from ..config.errors import scrub

    if os.environ.get("DDTREE_DEBUG") == "1":
        import traceback

        traceback.print_exception(exc, file=sys.stderr)
    for kind, message in KNOWN_ERRORS:
        if isinstance(exc, kind):
            return _usage(argv, scrub(message(exc)))
    msg = scrub(f"internal error: {type(exc).__name__}: {exc}"[:400])
    hint = " (a bug in ddtree-ops: please report it with the output of DDTREE_DEBUG=1 and the same arguments)"
    if _wants_json(argv):
        print(json.dumps({"ok": False, "checks": [{"name": "internal-error", "ok": False, "detail": msg}]}, indent=2,
            allow_nan=False))
    say(err, "error:", "red", msg + hint)
    return EXIT_INTERNAL


class _NotRaised(Exception):
    """Stands in for ConfigError in :func:`main` while its module is not loaded."""


def _config_error() -> type[Exception]:
    """:class:`ddtree_ops.config.ConfigError` for :func:`main`'s ``except`` clause (evaluated only
    when an exception gets there). A ConfigError exists only once its module is loaded, so
    while it is not, nothing is imported (pydantic: ~40 ms) and a stand-in never matches."""
    errors = sys.modules.get(f"{__name__.partition('.')[0]}.config.errors")
    return errors.ConfigError if errors is not None else _NotRaised


def _wants_json(argv: list[str] | None) -> bool:
    return "--json" in (sys.argv[1:] if argv is None else argv)


def _usage(argv: list[str] | None, msg: str) -> int:
    if msg:
        if _wants_json(argv):
            print(json.dumps({"ok": False, "checks": [{"name": "usage", "ok": False, "detail": msg}]}, indent=2,
                allow_nan=False))
        say(err, "error:", "red", msg)
    return 2


