"""``ddtree-ops fleet status | logs | restart | rollback``: the inventory's hosts over SSH.

The work is in :mod:`ddtree_ops.fleet.ssh` (fabric, loaded only when a command runs);
this module parses options, loads the hosts from the Ansible inventory (the ``-i``/``-l`` the
other commands read, with the connection variables ``ansible_user``, ``ansible_port``,
``ansible_ssh_private_key_file``) and prints. It imports nothing heavy at module level:
``ddtree-ops --help`` starts without fabric, paramiko or Ansible.

Exit codes: 0 every host ok, 1 a host failed (unreachable, refused key, unhealthy, a failed
gate), 2 usage or configuration error.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from ..fleet.ssh import Limits, Target

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Status, logs, rolling restart and rollback of the inventory's hosts over SSH (fabric).")

MAX_PARALLEL = 256
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"


def _vault(v: list[str] | None) -> list[str] | None:
    from .common import _vault_files

    return _vault_files(v)


InventoryOpt = Annotated[str | None, typer.Option("--inventory", "-i", help="Ansible inventory file or directory "
                                                  "(default: DDTREE_INVENTORY, else inventory/example).")]
LimitOpt = Annotated[str | None, typer.Option("--limit", "-l", help="Ansible host pattern, e.g. b300.")]
VaultOpt = Annotated[list[str] | None, typer.Option("--vault-password-file", help="Vault password file (PATH or "
                                                    "ID@PATH; repeatable).", callback=_vault)]
KnownHostsOpt = Annotated[Path | None, typer.Option(
    "--known-hosts", help=f"known_hosts file the hosts' keys are checked against (default {DEFAULT_KNOWN_HOSTS}; "
    "required when the inventory turns Ansible's host-key checking off). Unknown keys are refused, never added.")]
ParallelOpt = Annotated[int, typer.Option("--parallel", help=f"Hosts worked on at once (1-{MAX_PARALLEL}).")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Total seconds per host: connect, authenticate and "
                                           "every command (the restart gate's time comes on top).")]
DeadlineOpt = Annotated[float | None, typer.Option("--deadline", help="Total seconds for the whole run (default: "
                                                   "enough for every host's timeout, and gate, in turn).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]


def _range(name: str, value: float, lo: float, hi: float) -> float:
    if math.isnan(value) or not lo <= value <= hi:
        raise typer.BadParameter(f"{name} {value!r}: must be {lo:g}..{hi:g}")
    return value


def _known_hosts(given: Path | None, off: dict[str, str]) -> Path:
    """The known_hosts file to check keys against; refuses to fall back to the default file
    where the inventory turns host-key checking off for Ansible (``off``: host -> why)."""
    from ..config.errors import shorten

    if given is None and off:
        host, why = next(iter(sorted(off.items())))
        more = f" (and {len(off) - 1} more host{'s' if len(off) > 2 else ''})" if len(off) > 1 else ""
        raise typer.BadParameter(
            f"the inventory turns host-key checking off for Ansible on {host}{more} ({shorten(why, 120)}); fleet "
            "never skips it. Fix: give --known-hosts FILE holding the hosts' keys (ssh-keyscan -p PORT ADDRESS >> "
            "FILE, then compare `ssh-keygen -lf FILE` with the fingerprints the hosts show on their consoles)")
    path = Path(os.path.expanduser(str(given or DEFAULT_KNOWN_HOSTS)))
    try:
        st = path.stat()
    except OSError as exc:
        raise typer.BadParameter(f"--known-hosts {shorten(str(path))!r}: {exc.strerror}. Fix: collect the hosts' keys "
                                 "with ssh-keyscan -p PORT ADDRESS >> FILE and verify their fingerprints") from None
    import stat

    if not stat.S_ISREG(st.st_mode) or not os.access(path, os.R_OK):
        raise typer.BadParameter(f"--known-hosts {shorten(str(path))!r}: not a readable regular file")
    return path


def _targets(inventory: str | None, limit: str | None, vault: list[str] | None,
             known_hosts: Path | None) -> tuple[list[Target], Path]:
    """The selected hosts (validated deployments, connection variables checked) and the
    known_hosts file. Raises ConfigError (exit 2) for an invalid inventory."""
    import fabric  # noqa: F401 - missing: one line naming the extra (cli._missing_module), before any work

    from ..config import ConfigError, validate_hostvars
    from ..config.inventory import load_hostvars
    from ..fleet.ssh import CONNECTION_VARS, host_key_checking_off, target_of
    from .common import DEFAULT_INVENTORY

    hostvars = load_hostvars(inventory or DEFAULT_INVENTORY, limit, vault or (), CONNECTION_VARS)
    targets, errors, off = [], [], {}
    for host, hv in sorted(hostvars.items()):
        try:
            v = validate_hostvars(host, {k: x for k, x in hv.items() if k not in CONNECTION_VARS})
            targets.append(target_of(v, hv))
        except ConfigError as exc:
            errors.extend(exc.findings)
        why = host_key_checking_off(hv)
        if why:
            off[host] = why
    if errors:
        raise ConfigError(errors)
    return targets, _known_hosts(known_hosts, off)


def _limits(known: Path, targets: list[Target], parallel: int, timeout: float, deadline: float | None,
            gate: float | None = None, batch: int | None = None, gate_deadline: float | None = None) -> Limits:
    from ..fleet.ssh import GATE_DEADLINE_S, GATE_MARGIN_S, Limits

    _range("--parallel", parallel, 1, MAX_PARALLEL)
    _range("--timeout", timeout, 1, 3600)
    gate_deadline = GATE_DEADLINE_S if gate_deadline is None else gate_deadline
    _range("--gate-deadline", gate_deadline, 3, 3600)
    if deadline is None:
        if batch is None:  # every host in turn, `parallel` at a time
            deadline = timeout * math.ceil(len(targets) / parallel) + 10
        else:
            worst = max((gate if gate is not None else t.gate_s) for t in targets) if targets else 0
            deadline = (timeout + worst + gate_deadline + GATE_MARGIN_S + 30) * math.ceil(len(targets) / batch) + 10
    _range("--deadline", deadline, 1, 7 * 86400)
    return Limits(known_hosts=known, timeout_s=timeout, parallel=parallel, deadline_s=deadline, gate_s=gate,
                  gate_deadline_s=gate_deadline)


def _fail_if(bad: bool) -> None:
    from .common import CheckFailed

    if bad:
        raise CheckFailed()


def _cell(v: Any) -> Any:
    from rich.text import Text

    if v is None:
        return Text("-")
    if isinstance(v, bool):
        return Text("yes" if v else "no", style="green" if v else "red")
    return Text(f"{v:.2f}" if isinstance(v, float) else str(v))


@app.command("status")
def status_cmd(inventory: InventoryOpt = None, limit: LimitOpt = None, vault: VaultOpt = None,
               known_hosts: KnownHostsOpt = None, parallel: ParallelOpt = 8, timeout: TimeoutOpt = 60.0,
               deadline: DeadlineOpt = None, as_json: JsonOpt = False) -> None:
    """One row per host: release, unit state, ready, warm, accept length, tok/s, drift, router.

    One SSH command per host (systemctl show, readlink of the release's ``current`` link, the
    host's own ``ddtree-ops health --json`` and its exporter's /metrics); with group routers,
    one bounded ``GET /workers`` per router (``router``: the instance's state there,
    :mod:`ddtree_ops.fleet.router_status`). Exit 0 all hosts ok, 1 a host failed or is unhealthy,
    2 usage or configuration error.
    """
    from ..fleet import ssh as fleet_ssh

    targets, known = _targets(inventory, limit, vault, known_hosts)
    limits = _limits(known, targets, parallel, timeout, deadline)
    rows = fleet_ssh.status(targets, limits)
    from ..fleet.router_status import fleet_cells
    from .common import DEFAULT_INVENTORY

    router = fleet_cells(inventory or DEFAULT_INVENTORY, vault or ())  # each instance at its routers (smg)
    ok = all(r.ok for r in rows)
    if as_json:
        print(json.dumps({"ok": ok, "hosts": [{**r.as_dict(), "router": router.get(r.host)} for r in rows],
                          "checks": [{"name": r.host, "ok": r.ok, "detail": r.error or "healthy"} for r in rows],
                          "known_hosts": str(known), "deadline_s": limits.deadline_s}, indent=2, allow_nan=False))
    else:
        from rich.table import Table

        from .common import out

        table = Table("host", "release", "unit", "ready", "warm", "accept len", "tok/s", "drift", "router", "problem")
        for r in rows:
            table.add_row(_cell(r.host), _cell(r.release), _cell(f"{r.active_state}/{r.sub_state}"), _cell(r.ready),
                          _cell(r.warm), _cell(r.accept_length), _cell(r.tokens_per_s), _cell(r.drift),
                          _cell(router.get(r.host)), _cell(r.error or ""))
        if out.is_terminal:
            out.print(table)
        else:  # a pipe or a file: one line per host, not wrapped into rich's default 80 columns
            from rich.console import Console

            Console(file=out.file, width=240, color_system=None).print(table)
    _fail_if(not ok)


@app.command("logs")
def logs_cmd(inventory: InventoryOpt = None, limit: LimitOpt = None, vault: VaultOpt = None,
             known_hosts: KnownHostsOpt = None, parallel: ParallelOpt = 8, timeout: TimeoutOpt = 60.0,
             deadline: DeadlineOpt = None,
             lines: Annotated[int, typer.Option("--lines", "-n", help="Journal lines per host (1-10000).")] = 50,
             max_bytes: Annotated[int, typer.Option("--max-bytes", help="Bytes read per host at most "
                                                    "(1024-16777216); the rest is cut.")] = 64 << 10,
             as_json: JsonOpt = False) -> None:
    """The last journal lines of each host's unit (``journalctl -u UNIT -n N``), prefixed by host.

    Lines are cleaned of terminal escapes and secrets and cut. Exit 1 if a host could not be read.
    """
    from ..fleet import ssh as fleet_ssh

    _range("--lines", lines, 1, 10_000)
    _range("--max-bytes", max_bytes, 1024, 16 << 20)
    targets, known = _targets(inventory, limit, vault, known_hosts)
    limits = _limits(known, targets, parallel, timeout, deadline)
    got = fleet_ssh.logs(targets, limits, lines, max_bytes)
    ok = all(g.ok for g in got)
    if as_json:
        print(json.dumps({"ok": ok, "hosts": [g.__dict__ for g in got],
                          "checks": [{"name": g.host, "ok": g.ok, "detail": g.error or f"{len(g.lines)} lines"}
                                     for g in got]}, indent=2, allow_nan=False))
    else:
        from .common import err, out, say

        for g in got:
            for line in g.lines:
                say(out, f"{g.host} |", "cyan", line)
            if g.cut:
                say(err, f"{g.host}:", "yellow", f"output cut at {max_bytes} bytes (--max-bytes)")
            if not g.ok:
                say(err, f"{g.host}:", "red", g.error)
    _fail_if(not ok)


BatchOpt = Annotated[int, typer.Option("--batch", help="Hosts restarted at once (1-100; the nodes of one multi-node "
                                       "server count as one and restart together, gated on rank 0); the next batch "
                                       "starts only when every host of this one passed its gate.")]
GateOpt = Annotated[float | None, typer.Option("--gate-timeout", help="Seconds a restarted host has to be active, "
                                               "warm and healthy (default: its unit's TimeoutStartSec).")]
GateDeadlineOpt = Annotated[float | None, typer.Option(
    "--gate-deadline", help="Seconds (3-3600, default 120) for the host's own `ddtree-ops release gate` once it is "
    "healthy again: health, a short synthetic load, acceptance length >= ddtree_ops.accept_length_floor (the "
    "gate of playbooks/rolling.yml).")]


def _rolling(rollback: bool, inventory: str | None, limit: str | None, vault: list[str] | None,
             known_hosts: Path | None, batch: int, gate: float | None, timeout: float, deadline: float | None,
             as_json: bool, gate_deadline: float | None = None) -> None:
    from ..fleet import ssh as fleet_ssh
    from .common import err, out, say

    _range("--batch", batch, 1, 100)
    if gate is not None:
        _range("--gate-timeout", gate, 1, 86400)
    targets, known = _targets(inventory, limit, vault, known_hosts)
    try:  # a multi-node server restarts as one unit: all of its nodes selected, or none
        fleet_ssh.units(targets)
    except fleet_ssh.FleetError as exc:
        raise typer.BadParameter(str(exc), param_hint="--limit") from None
    limits = _limits(known, targets, batch, timeout, deadline, gate, batch, gate_deadline)

    def show(r: fleet_ssh.HostChange) -> None:
        if not as_json:
            say(out if r.ok else err, "ok  " if r.ok else "FAIL", "green" if r.ok else "red",
                f"{r.host} {r.step} {r.release_from} -> {r.release_to} in {r.seconds:g} s: {r.detail}")

    done = fleet_ssh.rolling(targets, limits, batch=batch, rollback=rollback, on_host=show)
    ok = all(r.ok for r in done)
    if as_json:
        print(json.dumps({"ok": ok, "hosts": [r.as_dict() for r in done],
                          "checks": [{"name": r.host, "ok": r.ok, "detail": r.detail} for r in done]}, indent=2,
                              allow_nan=False))
    else:
        for r in done:
            if r.step == "skipped":
                say(err, "skip", "yellow", f"{r.host}: {r.detail}")
        n_ok = sum(r.ok for r in done)
        say(out if ok else err, "summary", "green" if ok else "red",
            f"{n_ok}/{len(done)} hosts {'rolled back' if rollback else 'restarted'} and healthy")
    _fail_if(not ok)


@app.command("restart")
def restart_cmd(inventory: InventoryOpt = None, limit: LimitOpt = None, vault: VaultOpt = None,
                known_hosts: KnownHostsOpt = None, batch: BatchOpt = 1, gate_timeout: GateOpt = None,
                gate_deadline: GateDeadlineOpt = None, timeout: TimeoutOpt = 60.0, deadline: DeadlineOpt = None,
                as_json: JsonOpt = False) -> None:
    """Rolling restart: ``systemctl restart`` one host (or ``--batch N``) at a time, each gated on
    the unit active again and the host's ``ddtree-ops health`` passing (warm, ready, no drift), then
    the host's ``ddtree-ops release gate`` (the playbook's: a short synthetic load, acceptance
    length >= the floor); stops at the first host that fails its gate. Exit 1 then."""
    _rolling(False, inventory, limit, vault, known_hosts, batch, gate_timeout, timeout, deadline, as_json,
             gate_deadline)


@app.command("rollback")
def rollback_cmd(inventory: InventoryOpt = None, limit: LimitOpt = None, vault: VaultOpt = None,
                 known_hosts: KnownHostsOpt = None, batch: BatchOpt = 1, gate_timeout: GateOpt = None,
                 gate_deadline: GateDeadlineOpt = None, timeout: TimeoutOpt = 60.0, deadline: DeadlineOpt = None,
                 as_json: JsonOpt = False) -> None:
    """Rolling rollback: on one host (or ``--batch N``) at a time, ``ddtree-ops release rollback
    --root <config dir>/releases --json`` (switch ``current`` to the previous release), then
    ``systemctl restart`` and the same gate as ``restart``; stops at the first failing host."""
    _rolling(True, inventory, limit, vault, known_hosts, batch, gate_timeout, timeout, deadline, as_json,
             gate_deadline)
