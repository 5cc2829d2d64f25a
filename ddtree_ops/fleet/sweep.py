"""``ddtree-ops sweep``: benchmark a grid of deployment settings.

A sweep file (YAML) names one inventory host whose ``ddtree_*`` variables are the base, and
the points to try::

    host: b300-01
    points:                                   # explicit points ...
      - name: budget16
        set: {ddtree_speculative.budget: 16}
        url: http://10.0.0.5:30000            # an endpoint already serving this point
    grid:                                     # ... and/or a grid (every combination)
      ddtree_speculative.budget: [16, 32]
      ddtree_speculative.block_size: [8, 16]
    urls: {budget16-block_size8: http://...}  # endpoints of grid points, by point name

Each point is, in order: its ``set`` applied to a copy of the host's variables (dotted paths:
the first part is the inventory variable); **validated** with the same validator as
``ddtree-ops validate`` (an invalid point is reported with the validator's findings and
skipped, never run); **rendered** with the same renderer (its ``plan.json`` document and the
SGLang argv are recorded); then **deployed** when the sweep is given a playbook
(:class:`Deployer`: ``ansible-playbook -i INVENTORY -l HOST PLAYBOOK -e @<out>/<name>/deploy-vars.json``,
the same play and renderer as any deploy; the play returns once the unit is warm) and
**benchmarked** (:mod:`ddtree_ops.runtime.bench`) at the deployed server's address, or at the
point's ``url`` (an endpoint already serving it), with its result in ``<out>/<name>/``. A point
with neither is validated and rendered only. After a deploying sweep the host is deployed once
more with the inventory's own settings (``restore``), so the sweep leaves what it found.

Resumable: ``<out>/sweep.json`` is rewritten after each point; a re-run skips every point
whose key (its settings, URL and the bench options) has a complete result already.
``<out>/sweep.md`` ranks the benchmarked points by aggregate tok/s at each concurrency, with
the acceptance length beside it.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddtree_ops._core.write import check_out_dir, make_out_dir, write_file
from ddtree_ops.config.errors import is_secret_name, looks_like_token, registered_secret_in, type_name
from ddtree_ops.runtime.bench import BenchInputError, BenchOptions, Prompt, load_result, run, write_results
from ddtree_ops.sglang.client import preview

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A point's name: it is a directory name under the output directory."""

PATH = re.compile(r"^ddtree_[a-z0-9_]+(\.[A-Za-z0-9_]+)*$")
"""A ``set`` key: an inventory variable (``ddtree_*``) and keys inside it."""

MAX_POINTS = 1000
"""Most points one sweep file may expand to."""

MAX_STATE_BYTES = 16 << 20
"""Largest ``sweep.json`` a resumed run reads (bytes); a bigger one is ignored (every point runs again)."""

MAX_SWEEP_FILE = 1 << 20
"""Largest sweep file read (bytes): a sweep of MAX_POINTS points is a few hundred KB."""


MAX_SWEEP_NODES = 100_000
"""Most values (scalars, list items, mapping entries, YAML aliases expanded) one sweep file may hold."""

_JINJA = ("{{", "{%", "{#")
_USERINFO = re.compile(r"://[^/@\s]*@")


class SweepError(ValueError):
    """A bad sweep file: one line naming the field, the value, the rule and the fix."""


def value_problem(path: str, value: Any) -> str | None:
    """Why a value may not be swept or passed to Ansible as an extra variable, or None.

    - Jinja markers (``{{``, ``{%``, ``{#``) in any string or key: the validator checks values as
      literals, while Ansible templates extra variables when a task reads them — a swept value would
      deploy something other than what was validated, and could run lookups on the controller;
    - a secret: a key with a secret-looking name (:func:`is_secret_name`) at any depth, a string shaped
      like a token (:func:`looks_like_token`), URL user info, or a secret registered from the inventory
      (vault, ``ddtree_hf_token``) — it would be written to ``sweep.json`` / ``deploy-vars.json``.
    The walk is bounded by :data:`MAX_SWEEP_NODES` (a YAML alias bomb stops it).
    """
    stack, budget = [(path, value)], MAX_SWEEP_NODES
    while stack:
        where, v = stack.pop()
        budget -= 1
        if budget < 0:
            return f"{path}: more than {MAX_SWEEP_NODES} values (a YAML alias bomb?); sweep plain values"
        if isinstance(v, dict):
            for k, x in v.items():
                key = str(k)
                if is_secret_name(key):
                    return f"{where}.{key[:64]}: a secret; secrets are not swept: keep them in the inventory"
                if any(m in key for m in _JINJA):
                    return f"{where}: a key holds Jinja ({preview(key, 40)}); sweep plain values"
                stack.append((f"{where}.{key[:64]}", x))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{where}.{i}", x) for i, x in enumerate(v))
        elif isinstance(v, str):
            if any(m in v for m in _JINJA):
                return (f"{where} holds Jinja ({preview(v, 40)}): the validator checks literals, Ansible would "
                        "template it at deploy; sweep plain values")
            if looks_like_token(v) or _USERINFO.search(v) or registered_secret_in(v):
                return f"{where}: (redacted) looks like a secret; secrets are not swept: keep them in the inventory"
    return None


@dataclass
class Point:
    """One setting to try: ``set`` (dotted path -> value) and the URL serving it, if any."""

    name: str
    set: dict[str, Any]
    url: str | None = None
    status: str = "pending"
    detail: str = ""
    plan: dict[str, Any] | None = None
    argv: list[str] = field(default_factory=list)

    def key(self, opts: BenchOptions) -> str:
        """Identity of this point's result: its settings, URL and the bench options (hex)."""
        o = {k: v for k, v in opts.as_dict().items() if k != "url"}
        raw = json.dumps({"set": self.set, "url": self.url, "options": o}, sort_keys=True, default=str, allow_nan=False)
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _url_ok(url: Any) -> bool:
    import httpx

    try:
        u = httpx.URL(url)
        return u.scheme in ("http", "https") and bool(u.host) and not u.userinfo
    except Exception:  # httpx raises several types for malformed URLs
        return False


def _too_big(doc: Any) -> bool:
    """Whether ``doc`` holds more than :data:`MAX_SWEEP_NODES` values (aliases counted each time they
    are used; the walk stops as soon as the budget is spent)."""
    stack, budget = [doc], MAX_SWEEP_NODES
    while stack:
        v = stack.pop()
        budget -= 1
        if budget < 0:
            return True
        if isinstance(v, dict):
            if len(v) > budget:
                return True
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            if len(v) > budget:
                return True
            stack.extend(v)
    return False


def _point_name(combo: dict[str, Any]) -> str:
    parts = [f"{k.rsplit('.', 1)[-1]}{v}" for k, v in combo.items()]
    return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(parts))[:64] or "point"


def load_sweep(path: Path) -> tuple[str, list[Point]]:
    """``(host, points)`` of a sweep file (see the module docstring).

    Raises:
        SweepError: not a mapping, no host, a bad point name, a ``set`` key that is not a
            ``ddtree_*`` path, duplicate names, a URL for no point, more than :data:`MAX_POINTS`.
        OSError: the file cannot be read.
    """
    where = f"sweep file {preview(str(path))}"
    doc = _read_doc(path, where)
    host = doc.get("host")
    if not isinstance(host, str) or not host:
        raise SweepError(f"{where}: host = {preview(repr(host), 80)}; must name one inventory host, e.g. b300-01")
    points, urls = _points_of(doc, where)
    seen: set[str] = set()
    for i, p in enumerate(points):
        _check_point(p, i, seen, where)
        seen.add(p.name)
    unknown = set(urls) - seen
    if unknown:
        raise SweepError(f"{where}: urls for no point: {sorted(unknown)[:5]}; point names are {sorted(seen)[:10]}")
    return host, points


def _read_doc(path: Path, where: str) -> dict[str, Any]:
    """The sweep file's YAML mapping (a regular UTF-8 file of at most :data:`MAX_SWEEP_FILE` bytes)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SWEEP_FILE:
        raise SweepError(f"{where}: not a regular file of at most {MAX_SWEEP_FILE} bytes; give a YAML sweep file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise SweepError(f"{where}: not UTF-8; save it as UTF-8") from None
    except yaml.YAMLError as exc:
        raise SweepError(f"{where}: not YAML ({preview(str(exc).splitlines()[0], 120)})") from None
    if not isinstance(doc, dict):
        raise SweepError(f"{where}: must be a mapping with host and points/grid")
    if _too_big(doc):
        raise SweepError(f"{where}: more than {MAX_SWEEP_NODES} values once YAML aliases are expanded (an alias "
                         "bomb?); write the points out")
    return doc


def _points_of(doc: dict[str, Any], where: str) -> tuple[list[Point], dict[Any, Any]]:
    """``(points, urls)``: the listed points, then the grid's (named by :func:`_point_name`),
    at most :data:`MAX_POINTS` and at least one; the names are not checked yet."""
    points: list[Point] = []
    raw_points = doc.get("points") or []
    if not isinstance(raw_points, list):
        raise SweepError(f"{where}: points must be a list of {{name, set, url}}")
    for i, p in enumerate(raw_points):
        if not isinstance(p, dict):
            raise SweepError(f"{where}: points[{i}] is a {type_name(p)}; must be a mapping {{name, set, url}}")
        points.append(Point(p.get("name"), p.get("set") or {}, p.get("url")))
    grid = doc.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise SweepError(f"{where}: grid must map each path to a non-empty list of values")
    urls = doc.get("urls") or {}
    if not isinstance(urls, dict):
        raise SweepError(f"{where}: urls must map point names to URLs")
    if grid:
        keys = list(grid)
        combos = itertools.product(*(grid[k] for k in keys))
        for values in itertools.islice(combos, MAX_POINTS + 1):
            combo = dict(zip(keys, values, strict=True))
            name = _point_name(combo)
            points.append(Point(name, combo, urls.get(name)))
    if len(points) > MAX_POINTS:
        raise SweepError(f"{where}: more than {MAX_POINTS} points; split the sweep")
    if not points:
        raise SweepError(f"{where}: no points; give points and/or grid")
    return points, urls


STATE_FILE, REPORT_FILE, RESTORE_LOG = "sweep.json", "sweep.md", "restore.log"
OWN_FILES = frozenset({STATE_FILE, REPORT_FILE, RESTORE_LOG})
"""The files a sweep writes beside its points' directories in OUT: a point named like one would
make its result directory collide with them (a point ``sweep.json`` made the state file a
directory: the sweep aborted and lost its state)."""


def _check_point(p: Point, i: int, seen: set[str], where: str) -> None:
    """Point ``i``: a unique directory-safe name, ``set`` keys that are non-secret inventory
    paths, an optional http(s) URL. Raises :class:`SweepError` naming the point."""
    if not isinstance(p.name, str) or not NAME.match(p.name):
        raise SweepError(f"{where}: point {i} name = {preview(repr(p.name), 80)}; must match {NAME.pattern} "
                         "(it names the result directory)")
    if p.name.lower() in OWN_FILES:  # lower: a case-insensitive file system collides as well
        raise SweepError(f"{where}: point {i} name = {p.name!r}: the sweep writes its own {p.name.lower()} there "
                         f"(its files: {', '.join(sorted(OWN_FILES))}); rename the point")
    if p.name in seen:
        raise SweepError(f"{where}: point name {p.name!r} twice; names must be unique")
    if not isinstance(p.set, dict):
        raise SweepError(f"{where}: point {p.name} set must be a mapping of path: value")
    for k in p.set:
        if not isinstance(k, str) or not PATH.match(k):
            raise SweepError(f"{where}: point {p.name} set key {preview(repr(k), 80)}; must be an inventory "
                             "variable path, e.g. ddtree_speculative.budget")
        if any(is_secret_name(k.rsplit(".", j)[0]) for j in range(k.count(".") + 1)):
            raise SweepError(f"{where}: point {p.name} set key {k}: a secret; secrets are not swept (they "
                             "would be written to sweep.json): keep them in the inventory")
        problem = value_problem(k, p.set[k])
        if problem:
            raise SweepError(f"{where}: point {p.name} set {problem}")
    if p.url is not None and not _url_ok(p.url):
        raise SweepError(f"{where}: point {p.name} url = {preview(repr(p.url), 80)}; must be http(s)://HOST:PORT "
                         "without user info")


def apply(hostvars: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``hostvars`` with each dotted path of ``settings`` set (mappings on the way
    are created; a non-mapping on the way raises :class:`SweepError`)."""
    hv = copy.deepcopy(hostvars)
    for path, value in settings.items():
        parts = path.split(".")
        node = hv
        for i, part in enumerate(parts[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise SweepError(f"set {path}: {'.'.join(parts[:i + 1])} is a {type_name(nxt)}, not a mapping")
            node = nxt
        node[parts[-1]] = copy.deepcopy(value)
    return hv


@dataclass
class Deployer:
    """Deploys a point through Ansible: the inventory's play, limited to the sweep's host, with the
    point's changed inventory variables as extra variables (which take precedence over the inventory).

    Attributes:
        inventory: the inventory path the sweep read (``-i``).
        playbook: the deploy playbook (``deploy.yml``); it runs with its directory as the working
            directory, so that directory's ``ansible.cfg`` applies.
        deadline_s: total seconds for one ``ansible-playbook`` run; at the deadline its whole process
            group is killed and the point fails (:func:`ddtree_ops.sglang.resolve.run_child`).
        vault_password_files: passed as ``--vault-password-file`` (already checked to be files).
        command: the ``ansible-playbook`` executable.
    """

    inventory: str
    playbook: Path
    deadline_s: float = 3600.0
    vault_password_files: tuple[str, ...] = ()
    command: str = field(default_factory=lambda: _ansible_playbook())

    def deploy(self, host: str, extra_vars: dict[str, Any] | None, log: Path) -> str | None:
        """Run the play for ``host`` (``extra_vars`` None: the inventory's own settings).

        The extra variables go to ``log``'s directory as ``deploy-vars.json`` (mode 0600); the play's
        output tail, scrubbed of secrets, to ``log``.

        Returns:
            None when the play succeeded, else one line saying why (exit status, deadline, not found).
        """
        from ddtree_ops.config.errors import scrub
        from ddtree_ops.sglang.resolve import run_child

        argv = [self.command, "-i", self.inventory, "-l", host, str(self.playbook)]
        for f in self.vault_password_files:
            argv += ["--vault-password-file", f]
        if extra_vars is not None:
            vars_file = write_file(log.parent / "deploy-vars.json",
                                   json.dumps(extra_vars, indent=1, allow_nan=False, default=str), 0o600)
            argv += ["-e", f"@{vars_file.resolve()}"]
        env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
        try:
            rc, out, err, why = run_child(argv, env, self.deadline_s, cwd=str(self.playbook.resolve().parent))
        except OSError as exc:
            return f"could not run {Path(self.command).name}: {exc.strerror or exc}"
        text = (out[-256 * 1024:] + b"\n" + err).decode("utf-8", "replace")
        write_file(log, scrub(text), 0o600)  # the play's output: scrubbed, and still only for us
        name = Path(self.command).name
        if why:
            return f"{name} {why}"
        if rc != 0:
            return f"{name} exited {rc} (see {log.name})"
        return None


def _ansible_playbook() -> str:
    """``ansible-playbook`` on PATH, else the one installed beside this Python (the controller venv)."""
    import shutil
    import sys

    found = shutil.which("ansible-playbook")
    if found:
        return found
    beside = Path(sys.executable).with_name("ansible-playbook")
    return str(beside) if beside.is_file() else "ansible-playbook"


def deploy_vars(hostvars: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any]:
    """The inventory variables a point changes, whole (``ddtree_speculative`` with every key, the
    changed ones set): Ansible's extra variables replace a variable, they do not merge into it.

    Raises:
        SweepError: a whole variable holds a secret or Jinja (:func:`value_problem`): it cannot be
            written to ``deploy-vars.json`` and passed as an extra variable.
    """
    applied = apply(hostvars, settings)
    out = {top: applied[top] for top in dict.fromkeys(k.split(".", 1)[0] for k in settings)}
    for top, value in out.items():
        problem = value_problem(top, value)
        if problem:
            raise SweepError(f"cannot deploy through extra variables: {problem}")
    return out


def served_url(v: Any) -> str | None:
    """Where the controller reaches a deployed server: ``http://<scrape address>:<port>`` when SGLang
    listens on every address (``0.0.0.0`` / ``::``), else None (a server bound to one address, e.g.
    loopback, may not be reachable from here: give the point a ``url``)."""
    import ipaddress

    from ddtree_ops.render.files import scrape_address

    srv = v.deployment.server
    if not ipaddress.ip_address(srv.host).is_unspecified:
        return None
    return f"http://{scrape_address(v)}:{srv.port}"


def _write_json(path: Path, doc: Any) -> None:
    write_file(path, json.dumps(doc, indent=1, allow_nan=False, default=str) + "\n")


def run_sweep(host: str, hostvars: dict[str, Any], points: list[Point], opts: BenchOptions, prompts: list[Prompt],
              out_dir: Path, on_point: Callable[[Point], None] | None = None,
              deployer: Deployer | None = None) -> list[Point]:
    """Validate, render and benchmark each point in turn (see the module docstring).

    Args:
        host: the inventory host; hostvars: its ``ddtree_*`` variables (the base of every point).
        points: from :func:`load_sweep`.
        opts: bench options (``url`` is replaced by each point's).
        prompts: as :func:`ddtree_ops.runtime.bench.run`.
        out_dir: ``sweep.json``, ``sweep.md`` and one directory per benchmarked point.
        on_point: called after each point.
        deployer: deploy each valid point without a ``url`` before benchmarking it, and the
            inventory's own settings after the last one (the ``restore`` entry of ``sweep.json``).

    Returns:
        The points with ``status``: ``invalid`` (the validator's findings in ``detail``),
        ``rendered`` (valid, no URL, no deployer), ``done`` (benchmarked now), ``resumed``
        (benchmarked by an earlier run) or ``failed`` (the deploy failed, or some requests failed;
        a result is kept).
    """
    from ddtree_ops.config import ConfigError, validate_hostvars
    from ddtree_ops.render.argv import build_argv
    from ddtree_ops.render.files import plan_document

    make_out_dir(out_dir)
    check_out_dir(out_dir)  # refused before the first point, not after its benchmark
    state_path = out_dir / STATE_FILE
    previous = _previous(state_path)
    last_vars: dict[str, Any] | None = None  # what the last deploy sent; {}: the inventory's own settings
    deployed_any = False
    restore: dict[str, Any] | None = None
    for p in points:
        try:
            v = validate_hostvars(host, apply(hostvars, p.set))
        except ConfigError as exc:
            p.status = "invalid"
            p.detail = "; ".join(f.message() for f in exc.findings)[:2000]
        except SweepError as exc:
            p.status, p.detail = "invalid", str(exc)
        else:
            p.plan = plan_document(v)
            p.argv = build_argv(v.deployment, v.plan)
            url = p.url
            if url is None and deployer is not None:
                url = served_url(v)
            key = p.key(opts)
            prev = previous.get(p.name) or {}
            if url is None:
                p.status, p.detail = "rendered", ("valid; not benchmarked: no url, and the server listens on "
                                                  f"{v.deployment.server.host} only (give the point a url)"
                                                  if deployer is not None else
                                                  "valid; no url: not benchmarked (give its url, or --deploy)")
            elif prev.get("key") == key and prev.get("status") in ("done", "resumed") \
                    and (out_dir / p.name / "bench.json").is_file():
                p.status, p.detail = "resumed", "benchmarked by an earlier run"
            else:
                why = None
                if p.url is None and deployer is not None:
                    why, sent = _deploy_point(p, host, hostvars, deployer, out_dir)
                    deployed_any = deployed_any or sent is not None
                    last_vars = None if why else sent  # after a failed deploy: restore whatever it left
                if not why:
                    _bench_point(p, url, opts, prompts, out_dir)
        _write_json(state_path, {"host": host, "points": [_state(p, opts) for p in points], "restore": restore})
        if on_point:
            on_point(p)
    if deployed_any and last_vars == {}:
        restore = {"ok": True, "detail": "the last deployed point had the inventory's own settings"}
    elif deployed_any:
        why = deployer.deploy(host, None, out_dir / RESTORE_LOG)
        restore = {"ok": why is None, "detail": why or "deployed with the inventory's own settings"}
    if restore is not None:
        _write_json(state_path, {"host": host, "points": [_state(p, opts) for p in points], "restore": restore})
    write_file(out_dir / REPORT_FILE, ranking(points, out_dir))
    return points


def _deploy_point(p: Point, host: str, hostvars: dict[str, Any], deployer: Deployer,
                  out_dir: Path) -> tuple[str | None, dict[str, Any] | None]:
    """Deploy ``p``: ``(why it failed or None, the extra variables sent or None when nothing ran)``;
    a failure sets ``p`` failed."""
    try:
        sent = deploy_vars(hostvars, p.set)
    except SweepError as exc:
        p.status, p.detail = "failed", str(exc)
        return str(exc), None
    why = deployer.deploy(host, sent, out_dir / p.name / "deploy.log")
    if why:
        p.status, p.detail = "failed", f"deploy failed: {why}"
    return why, sent


def _previous(state_path: Path) -> dict[str, Any]:
    """The points of an earlier run's ``sweep.json`` by name ({} when there is none or it is torn)."""
    if not state_path.is_file():
        return {}
    try:
        with open(state_path, "rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
        if len(raw) > MAX_STATE_BYTES:
            return {}  # larger than any state a sweep writes: not ours
        return {p["name"]: p for p in json.loads(raw).get("points", []) if isinstance(p.get("name"), str)}
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return {}  # a torn or foreign state file: every point runs again


def _bench_point(p: Point, url: str, opts: BenchOptions, prompts: list[Prompt], out_dir: Path) -> None:
    """Benchmark ``p`` at ``url`` into ``<out>/<name>/`` and set its status (``done`` / ``failed``)."""
    res = run(BenchOptions(**{**opts.__dict__, "url": url}), prompts, plan=p.plan)
    write_results(out_dir / p.name, res)
    p.status = "failed" if res.failed else "done"
    p.detail = f"{res.failed} requests failed" if res.failed else f"{len(res.requests)} requests"


def _state(p: Point, opts: BenchOptions) -> dict[str, Any]:
    return {"name": p.name, "set": p.set, "url": p.url, "status": p.status, "detail": p.detail,
            "key": p.key(opts), "argv": p.argv}


def _number(v: Any, none_ok: bool = True) -> float | None:
    if v is None and none_ok:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"not a finite number: {preview(repr(v), 40)}")
    return float(v)


def _level_fields(lv: Any) -> dict[str, Any]:
    """The fields :func:`ranking` prints of one level of a ``bench.json`` (typed; raises
    KeyError/TypeError/ValueError for a level that lacks them or holds other types)."""
    itl = lv["itl_s"]
    conc, failed = lv["concurrency"], lv["failed"]
    if not isinstance(conc, int) or isinstance(conc, bool) or not isinstance(failed, int) or isinstance(failed, bool):
        raise TypeError("concurrency and failed must be integers")
    return {"concurrency": conc, "output_tok_s": _number(lv["output_tok_s"], none_ok=False), "failed": failed,
            "accept_length": _number(lv.get("accept_length")),
            "accept_length_server": _number(lv.get("accept_length_server")),
            "itl_s": {"mean": _number(itl.get("mean") if isinstance(itl, dict) else itl["mean"])}}


def ranking(points: list[Point], out_dir: Path) -> str:
    """``sweep.md``: per concurrency, benchmarked points by aggregate tok/s (best first) with
    acceptance length and mean ITL; then the points not benchmarked and why."""
    results: dict[str, dict[str, Any]] = {}
    for p in points:
        if p.status in ("done", "resumed", "failed"):
            try:
                r = load_result(out_dir / p.name)
                r["levels"] = [_level_fields(lv) for lv in r["levels"]]
            except (OSError, BenchInputError, KeyError, TypeError, ValueError, AttributeError):
                if p.status == "resumed":
                    p.detail = "its bench.json could not be read (run it again: delete its directory)"
                continue
            results[p.name] = r
    lines = ["# Sweep", ""]
    levels = sorted({lv["concurrency"] for r in results.values() for lv in r["levels"]})
    for c in levels:
        rows = []
        for name, r in results.items():
            lv = next((x for x in r["levels"] if x["concurrency"] == c), None)
            if lv is not None:
                rows.append((lv["output_tok_s"], name, lv))
        rows.sort(key=lambda x: -x[0])
        lines += [f"## concurrency {c}", "", "| rank | point | tok/s | accept length | ITL mean ms | failed |",
                  "|---:|---|---:|---:|---:|---:|"]
        for i, (tok_s, name, lv) in enumerate(rows, 1):
            acc = lv.get("accept_length") if lv.get("accept_length") is not None else lv.get("accept_length_server")
            itl = lv["itl_s"]["mean"]
            lines.append(f"| {i} | {name} | {tok_s:.1f} | {'-' if acc is None else f'{acc:.3f}'} "
                         f"| {'-' if itl is None else f'{itl * 1000:.2f}'} | {lv['failed']} |")
        lines.append("")
    others = [p for p in points if p.name not in results]
    if others:
        lines += ["## Not benchmarked", "", "| point | status | why |", "|---|---|---|"]
        for p in others:
            lines.append(f"| {p.name} | {p.status} | {p.detail.replace('|', '/')[:400]} |")
    return "\n".join(lines) + "\n"
