"""Reading the rolling gate's verdict, and the rollout's summary lines.

One definition of the gate is the host-side command (:func:`ddtree_ops.host.release.gate`)::

    <ops venv>/bin/python -m ddtree_ops release gate --plan <config>/plan.json --deadline S --json

``playbooks/rolling.yml`` runs it with ``ansible.builtin.command`` and ``ddtree-ops fleet
restart|rollback`` over SSH (:mod:`ddtree_ops.fleet.ssh`); both read its output here
(:func:`read_gate`), and the playbook's summary line, failure reason and rollout summary are
built here too (the filters of ``filter_plugins/ddtree_rollout.py``), so the play only moves data.

The gate's JSON (``_print_checks`` of ``ddtree_ops/cli/__init__.py``): ``{"ok": bool, "checks": [{name,
ok, detail}], "url", "accept_length": float|null, "floor": float|null, "elapsed_s"}``. Whatever a
host prints is untrusted: at most :data:`GATE_OUTPUT_CAP` bytes are read, anything that is not
that document (malformed, huge, nested past the parser's limit, numbers that are no finite
floats) is a failed gate with one clean line, never an exception.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

GATE_OUTPUT_CAP = 64 << 10
"""Bytes of the gate's output read at most (its JSON is ~1-2 KB: 5-8 checks of <= 300 chars)."""
DETAIL_CAP = 300
"""Characters of a failure reason shown in a summary line."""
NOT_UPGRADED = "not upgraded (the rollout stopped before its batch, or it failed before its gate)"
"""Summary of a host that has no line of its own."""


def _clean(value: object, limit: int = 200) -> str:
    """A host's text as one safe line (terminal escapes and control characters removed, secrets
    scrubbed, cut): :func:`ddtree_ops.config.errors.one_line`."""
    from ..config.errors import one_line

    return one_line(value if isinstance(value, bytes | str) else str(value), limit)


def _number(value: object) -> float | None:
    """A finite float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


@dataclass(frozen=True)
class GateVerdict:
    """The gate's result as read from its output.

    Attributes:
        ok: the command exited 0, its document says ok, every check passed and (when a floor
            is set) the acceptance length is a number >= the floor.
        accept_length: tokens per verify pass under the gate's load, or None (not measured).
        floor: ``ddtree_ops.accept_length_floor``, or None (the deployment does not speculate).
        detail: one clean line: ``accept length A vs floor F`` when passed, else why it failed.
        elapsed_s: the gate's own seconds, or None.
    """

    ok: bool
    accept_length: float | None
    floor: float | None
    detail: str
    elapsed_s: float | None = None

    @property
    def versus(self) -> str:
        """``accept length 3.10 >= floor 1.50`` (``-`` for what is unknown)."""
        sign = ">=" if (self.accept_length is not None and self.floor is not None
                        and self.accept_length >= self.floor) else ("<" if self.floor is not None
                                                                     and self.accept_length is not None else "vs")
        return f"accept length {_num(self.accept_length)} {sign} floor {_num(self.floor)}"


def gate_document(output: bytes | str) -> dict[str, Any] | None:
    """The gate's JSON object from its output (stdout and stderr may be mixed: the object starts
    at the first ``{``), or None when it is none (bounded: see the module docstring)."""
    if isinstance(output, str):
        output = output.encode("utf-8", "replace")
    if len(output) > GATE_OUTPUT_CAP:
        return None
    text = output.decode("utf-8", "replace")
    start = text.find("{")
    if start < 0:
        return None
    try:
        doc, _end = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def read_gate(output: bytes | str | None, rc: int | None, cut: bool = False) -> GateVerdict:
    """The :class:`GateVerdict` of one gate run: its combined output, exit status (None: unknown,
    e.g. the output was cut) and whether the reader cut it at :data:`GATE_OUTPUT_CAP`. Never raises."""
    raw = output if output is not None else b""
    size = len(raw.encode("utf-8", "replace") if isinstance(raw, str) else raw)
    if cut or size > GATE_OUTPUT_CAP:
        return GateVerdict(False, None, None, f"the gate printed more than {GATE_OUTPUT_CAP} bytes: cut, not trusted")
    doc = gate_document(raw)
    if doc is None:
        return GateVerdict(False, None, None, f"no JSON result from `ddtree-ops release gate` (exit {rc}): "
                                              f"{_clean(raw) or 'no output'}")
    checks = doc.get("checks")
    if not isinstance(checks, list) or not checks or not all(isinstance(c, dict) for c in checks):
        return GateVerdict(False, None, None, f"the gate's JSON has no list of checks (exit {rc}): {_clean(raw)}")
    acc, floor = _number(doc.get("accept_length")), _number(doc.get("floor"))
    elapsed = _number(doc.get("elapsed_s"))
    failing = [c for c in checks[:50] if c.get("ok") is not True]
    why = "; ".join(f"{_clean(c.get('name'), 40)}: {_clean(c.get('detail'))}" for c in failing[:3])
    if failing or doc.get("ok") is not True or rc != 0:
        why = why or f"the gate failed (exit {rc}, ok {_clean(repr(doc.get('ok')), 20)})"
        return GateVerdict(False, acc, floor, _clean(why, DETAIL_CAP), elapsed)
    if doc.get("floor") is not None and floor is None:
        return GateVerdict(False, acc, None, f"the gate's floor {_clean(repr(doc.get('floor')), 40)} is no number")
    if floor is not None and (acc is None or acc < floor):
        return GateVerdict(False, acc, floor, f"acceptance length {_num(acc)} under the floor {floor:g} "
                                              "(ddtree_ops.accept_length_floor)", elapsed)
    v = GateVerdict(True, acc, floor, "", elapsed)
    return GateVerdict(True, acc, floor, v.versus, elapsed)


# --- playbooks/rolling.yml's lines (filter_plugins/ddtree_rollout.py) --------------------------

def _result(r: Any) -> dict:
    """An Ansible task result as a dict (an unset/undefined/skipped one as ``{}``)."""
    return r if isinstance(r, dict) else {}


def _elapsed(t0: Any) -> str:
    try:
        return f"{time.time() - float(t0):.1f}"
    except (TypeError, ValueError):
        return "?"


def release_current(result: Any) -> str | None:
    """The ``current`` release id of a registered ``ddtree-ops release list --json`` result, or
    None (no release yet, the command missing or failed, or no id of the right shape)."""
    from ..host.release import ID_RE

    r = _result(result)
    doc = gate_document(r.get("stdout") or "") if r.get("rc") == 0 else None
    cur = doc.get("current") if doc else None
    return cur if isinstance(cur, str) and ID_RE.fullmatch(cur) else None


def roll_why(task_name: Any, result: Any) -> str:
    """Why a host failed in the rolling play's block: ``<task name>: <reason>``, the reason being
    the gate's failing checks (when the failed task printed the gate's JSON), else the task's
    ``msg`` (``ansible_failed_task.name``, ``ansible_failed_result``)."""
    r = _result(result)
    stdout = r.get("stdout")
    if isinstance(stdout, str) and stdout.lstrip().startswith("{"):
        reason = read_gate(stdout, r.get("rc")).detail
    else:
        reason = _clean(r.get("msg") or "failed", DETAIL_CAP)
    return " ".join(f"{_clean(task_name or 'a task', 120)}: {reason}".split())


def roll_line(host: str, release_from: Any, release_to: Any, t0: Any, gate: Any = None, *, failed: bool = False,
              why: Any = None, back: Any = None, regate: Any = None) -> str:
    """One host's summary line of ``playbooks/rolling.yml``.

    Passed: ``host: FROM -> TO: gate passed (accept length A, floor F) in S s``. Failed:
    ``host: FROM -> TO: gate FAILED (WHY); rolled back to X | not rolled back: WHY; serving again
    (gate passed) | NOT serving (gate after rollback failed) in S s``. ``gate``, ``back`` and
    ``regate`` are the registered results of the gate, ``release rollback`` and the second gate
    (skipped or unset ones are ``{}``/None); ``t0`` the play's start (epoch seconds)."""
    head = f"{host}: {release_from or 'none'} -> {release_to}:"
    secs = _elapsed(t0)
    if not failed:
        v = read_gate(_result(gate).get("stdout"), _result(gate).get("rc"))
        return f"{head} gate passed (accept length {_num(v.accept_length)}, floor {_num(v.floor)}) in {secs} s"
    b = _result(back)
    if b.get("rc") == 0:
        doc = gate_document(b.get("stdout") or "") or {}
        to = doc.get("to")
        back_text = f"rolled back to {_clean(to, 64) if isinstance(to, str) else '?'}"
    elif release_from is None:
        back_text = "not rolled back: no previous release"
    elif b.get("skipped") or not b:
        back_text = "not rolled back: the new release was never activated"
    else:
        checks = (gate_document(b.get("stdout") or "") or {}).get("checks")
        first = checks[0] if isinstance(checks, list) and checks and isinstance(checks[0], dict) else {}
        back_text = f"not rolled back: {_clean(first.get('detail') or 'rollback failed')}"
    again = ("serving again (gate passed)" if _result(regate).get("rc") == 0
             else "NOT serving (gate after rollback failed)")
    reason = " ".join(str(why or "failed").split())
    if len(reason) > DETAIL_CAP:
        reason = reason[:DETAIL_CAP] + "…"
    return f"{head} gate FAILED ({reason}); {back_text}; {again} in {secs} s"


def roll_summary(hosts: Any, lines: Any) -> str:
    """The rollout summary: one line per host of the play, in order (``lines``: each host's
    line or None, same order; a host without one is :data:`NOT_UPGRADED`)."""
    hosts = list(hosts or [])
    lines = list(lines or [])
    out = []
    for i, h in enumerate(hosts):
        line = lines[i] if i < len(lines) and isinstance(lines[i], str) and lines[i].strip() else None
        out.append(" ".join(line.split()) if line else f"{h}: {NOT_UPGRADED}")
    return "\n".join(out)


# --- which hosts restart together ---------------------------------------------------------------

def serial_batches(hosts: Any, batches: Any) -> list[list[str]]:
    """``hosts`` (the play's, in order) cut as Ansible's ``serial`` cuts them: each batch a count or a
    percentage of all the play's hosts (at least 1), the last batch size repeating until every host is
    in one. Source: ansible-core 2.19 ``executor/playbook_executor.py`` ``_get_serialized_batches``
    and ``utils/helpers.py`` ``pct_to_int``. ``batches`` as :func:`ddtree_ops.host.release.rolling_settings`
    normalised them (counts >= 1, ``"N%"`` 1..100)."""
    left = [str(h) for h in (hosts or [])]
    sizes = list(batches) if isinstance(batches, list | tuple) else [batches]
    total, out, i = len(left), [], 0
    while left:
        size = sizes[min(i, len(sizes) - 1)] if sizes else -1
        n = (int(int(size[:-1]) / 100.0 * total) or 1) if isinstance(size, str) and size.endswith("%") else int(size)
        if n <= 0:
            out.append(left)
            break
        out.append(left[:n])
        left = left[n:]
        i += 1
    return out


def unit_split(hosts: Any, batches: Any, nodes: Any) -> str:
    """Why the rolling play cannot restart the multi-node servers of this run as units, in one line,
    or ``""`` when it can: every node of a server must be in the run (``-l``) and in one ``serial``
    batch (:func:`serial_batches`), since the play restarts the nodes together, gates rank 0 once
    and rolls them back together (docs/rolling-upgrades.md). ``nodes``: host -> the nodes of its
    server (:func:`ddtree_ops.config.multinode_fleet.server_nodes`)."""
    hosts = [str(h) for h in (hosts or [])]
    nodes = nodes if isinstance(nodes, dict) else {}
    batch_of = {h: i for i, batch in enumerate(serial_batches(hosts, batches)) for h in batch}
    for host in hosts:
        server = [str(n) for n in nodes.get(host) or []]
        missing = [n for n in server if n not in batch_of]
        if missing:
            return (f"rolling: node(s) {', '.join(missing)} of the multi-node server of {host} (nodes "
                    f"{', '.join(server)}) are not in this run: its nodes restart together or not at all (one node "
                    "restarted alone stops the whole server). Fix: limit the run (-l) to all of its nodes or none")
        if len({batch_of[n] for n in server}) > 1:
            split = "; ".join(f"{n} in batch {batch_of[n] + 1}" for n in server)
            return (f"rolling_batches {list(batches) if isinstance(batches, list | tuple) else batches} splits the "
                    f"multi-node server of {host} over batches ({split}): its nodes restart together, gated once "
                    "on rank 0. Fix: make the batches hold all of its nodes (e.g. a first batch of "
                    f"{len(server)} with them listed together in the inventory), or order the inventory so they "
                    "fall in one batch")
    return ""
