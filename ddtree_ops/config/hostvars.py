"""One host's Ansible variables, before the models see them: which ones a deployment reads
(:data:`INVENTORY_VARS`), the size bounds walked first (:data:`MAX_VAR_NODES`,
:data:`MAX_VAR_CHARS`: a YAML alias bomb fails in milliseconds), the secrets registered for
the scrub (vault plaintexts, secret-named variables, secrets in plain fields) and
:func:`deployment_vars`, which templates and returns them."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

from .errors import (
    REDACTED,
    ConfigError,
    Finding,
    credential_shaped,
    is_secret_name,
    looks_like_token,
    register_secret,
)

INVENTORY_VARS: dict[str, str] = {
    "address": "ansible_host",
    "host_class": "ddtree_host_class",
    "host_classes": "ddtree_host_classes",
    "sglang": "ddtree_sglang",
    "model": "ddtree_model",
    "speculative": "ddtree_speculative",
    "server": "ddtree_server",
    "service": "ddtree_service",
    "ops": "ddtree_ops",
    "accepted_risks": "ddtree_accepted_risks",
    "hf_token": "ddtree_hf_token",
    "toolchain": "ddtree_toolchain",
    "secret_env": "ddtree_secret_env",
}
"""Model field -> inventory variable name."""

ROLE_VAR_PREFIXES = ("ddtree_service_", "ddtree_exporter_")
"""``ddtree_*`` variables that belong to roles (their defaults), not to the deployment model."""


def is_deployment_var(name: str) -> bool:
    """Variables the config loader looks at: every ``ddtree_*`` except role variables."""
    return name.startswith("ddtree_") and not name.startswith(ROLE_VAR_PREFIXES)


GROUPS_VAR = "group_names"
"""Ansible's magic variable listing a host's groups; :func:`deployment_vars` passes it on so the
loader can refuse a host in two host-class groups."""

MAX_VAR_NODES = 20_000
"""Most values (scalars, list items, mapping entries) one host's deployment variables may hold."""
MAX_VAR_CHARS = 1 << 20
"""Most characters (strings and keys together) one host's deployment variables may hold (1 MiB)."""


def _size_problem(name: str, value: Any, budget: list[int]) -> str | None:
    """Walk ``value`` charging ``budget`` = [nodes, chars]; return the path where it ran out.
    Stops at the first overrun, so an alias bomb costs at most MAX_VAR_NODES steps."""
    stack: list[tuple[str, Any]] = [(name, value)]
    while stack:
        path, v = stack.pop()
        budget[0] -= 1
        if isinstance(v, (str, bytes)):
            budget[1] -= len(v)
        elif isinstance(v, dict):
            for k, x in v.items():
                budget[1] -= len(k) if isinstance(k, str) else 1
                stack.append((f"{path}.{k}" if isinstance(k, str) and len(k) < 64 else f"{path}.<key>", x))
                if budget[0] - len(stack) < 0:
                    break
        elif isinstance(v, (list, tuple, set, frozenset)):
            for i, x in enumerate(v):
                stack.append((f"{path}.{i}", x))
                if budget[0] - len(stack) < 0:
                    break
        if budget[0] < 0 or budget[1] < 0:
            return path
    return None


def _check_size(host: str, variables: dict[str, Any], memo: dict | None = None) -> None:
    budget = [MAX_VAR_NODES, MAX_VAR_CHARS]
    for name in sorted(variables, key=str):
        value = variables[name]
        cost = _memo_get(memo, "size", value)
        # a value walked whole before costs the same again; it cannot overrun while the budget
        # left covers that cost (the walk's early stops test the budget left after pending items)
        if cost is not None and budget[0] >= cost[0] and budget[1] >= cost[1]:
            budget[0] -= cost[0]
            budget[1] -= cost[1]
            continue
        before = tuple(budget)
        where = _size_problem(str(name), value, budget)
        if where is None:
            _memo_put(memo, "size", value, (before[0] - budget[0], before[1] - budget[1]))
        if where is not None:
            raise ConfigError([Finding(
                "error", where, "…", f"the host's deployment variables exceed {MAX_VAR_NODES} values or "
                f"{MAX_VAR_CHARS // 1024} KiB of text (a YAML alias bomb or a runaway value)",
                "shorten it: no deployment setting needs that much (paths are <= 4096 characters)", host=host)])


def _secret_key(name: str) -> bool:
    """:func:`is_secret_name`, remembered for names up to 128 characters: every host repeats
    the same few dozen keys (a long, odd key is checked each time and not kept)."""
    return _secret_key_cached(name) if len(name) <= 128 else is_secret_name(name)


@functools.lru_cache(maxsize=4096)
def _secret_key_cached(name: str) -> bool:
    return is_secret_name(name)


ENTRY_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
"""The shape of a ``ddtree_secret_env`` entry's name (an environment variable: ``ROUTER_API_KEY``)."""
NAME_KEYS = frozenset({"api_key_secret"})
"""Keys whose value is the NAME of a ``ddtree_secret_env`` entry, not a secret
(``ddtree_router.api_key_secret: ROUTER_API_KEY``): a value of :data:`ENTRY_NAME`'s shape under one is not
registered as a secret, so a message can say which entry to add; anything else there (a key pasted in by
mistake) is registered as usual."""


def _register_secrets(name: str, value: Any, secret: bool = False, memo: dict | None = None) -> None:
    """Register every string that is secret: under a secret-looking name or key, or vaulted.
    With ``memo`` (one load's, :func:`deployment_vars`), a container seen before under the same
    name registers the strings its first walk found, without walking it again."""
    from .errors import _is_vaulted

    known = _memo_get(memo, ("secrets", name, secret), value)
    if known is not None:
        for v in known:
            register_secret(v)
        return
    found: list[str] = []
    stack = [(name, value, secret)]
    while stack:
        key, v, sec = stack.pop()
        if (key in NAME_KEYS and not sec and isinstance(v, str) and ENTRY_NAME.fullmatch(v)
                and not _is_vaulted(v)):
            continue  # the name of an entry, no secret
        sec = sec or _secret_key(key) or _is_vaulted(v)
        if isinstance(v, str):
            if sec:
                register_secret(v)
                found.append(v)
        elif isinstance(v, dict):
            stack.extend((str(k), x, sec) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            stack.extend((key, x, sec) for x in v)
    _memo_put(memo, ("secrets", name, secret), value, found)


def _memo_get(memo: dict | None, kind: Any, value: Any) -> Any:
    """What ``kind`` of walk found in the container ``value`` earlier in this load, or None.

    ``memo`` belongs to one inventory load (:func:`deployment_vars`' ``memo``): the hosts of a
    group share their group_vars values as the very same objects, and nothing mutates them while
    loading, so a walk's result is kept per object (the memo holds the object, so its ``id``
    cannot be reused). Strings and scalars are not kept (checking them is as cheap)."""
    if memo is None or not isinstance(value, (dict, list, tuple)):
        return None
    hit = memo.get((kind, id(value)))
    return hit[1] if hit is not None and hit[0] is value else None


def _memo_put(memo: dict | None, kind: Any, value: Any, result: Any) -> None:
    if memo is not None and isinstance(value, (dict, list, tuple)):
        memo[(kind, id(value))] = (value, result)


SECRET_VARS = ("ddtree_hf_token", "ddtree_secret_env")
"""The only deployment variables that may hold a secret (they land in the 0600 secrets.env alone)."""

SKIP_VARS = frozenset({"hostvars", "vars", "groups", "omit", "play_hosts", "ansible_play_hosts",
                       "ansible_play_hosts_all", "ansible_play_batch"})
"""Ansible magic variables the vault walk skips (other hosts' variables, group lists)."""

MAX_VAULT_NODES = 200_000
"""Most values the vault walk over all of one host's variables visits."""

MAX_UNREACHED_DECRYPTS = 300
"""Most vaulted values per host that no deployment variable refers to and that are still decrypted,
so their plaintext reused by hand in a plain field is refused (~3 ms of key derivation each: ~1 s,
a tenth of the templating deadline; reachable ones are always decrypted)."""

_JINJA = re.compile(r"\{\{.*?\}\}|\{%.*?%\}", re.DOTALL)
_LITERAL = re.compile(r"'([^'\\]*)'|\"([^\"\\]*)\"")


def _strings(value: Any, limit: int = MAX_VAR_NODES, keys: bool = True) -> Iterator[tuple[str, Any]]:
    """``(path-suffix, leaf)`` for every leaf of ``value`` (mapping keys included as leaves unless
    ``keys`` is false), bounded."""
    stack: list[tuple[str, Any]] = [("", value)]
    n = 0
    while stack and n < limit:
        path, v = stack.pop()
        n += 1
        if isinstance(v, dict):
            for k, x in v.items():
                if keys:
                    yield path, k
                stack.append((f"{path}.{k}" if isinstance(k, str) and len(k) < 64 else f"{path}.<key>", x))
        elif isinstance(v, (list, tuple)):
            stack.extend((f"{path}.{i}", x) for i, x in enumerate(v))
        else:
            yield path, v


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _nodes(value: Any) -> int:
    """How many values :func:`_strings` pops walking all of ``value`` (its ``limit`` counts these)."""
    n, stack = 0, [value]
    while stack:
        v = stack.pop()
        n += 1
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return n


def _reachable_vars(all_vars: dict[str, Any], memo: dict | None = None) -> set[str]:
    """Names of the variables whose values can reach the loader's output: the deployment
    variables (:data:`INVENTORY_VARS`, ``ddtree_*``) and, transitively, every variable named
    anywhere inside their Jinja (``{{ x }}``, ``hostvars[h]['x']``, ``lookup('vars', 'x')``).
    A name computed at run time (``lookup('vars', 'a' ~ 'b')``) is not followed
    (docs/configuration.md: the limit of the secret check).
    ``memo``: one load's (:func:`_memo_get`); a container walked whole before gives its names again."""
    known = {str(n) for n in all_vars if n not in SKIP_VARS}
    todo = [n for n in known if n in INVENTORY_VARS.values() or is_deployment_var(n)]
    seen = set(todo)
    budget = MAX_VAULT_NODES
    while todo and budget > 0:
        value = all_vars[todo.pop()]
        hit = _memo_get(memo, "names", value)  # (values popped, leaves yielded, names) of a whole walk
        if hit is not None and hit[0] <= budget:
            budget -= hit[1]
            words = hit[2]
        else:
            start = budget
            words = set()
            for _, leaf in _strings(value, budget):
                budget -= 1
                if isinstance(leaf, str) and ("{{" in leaf or "{%" in leaf):
                    words.update(w for expr in _JINJA.findall(leaf) for w in _NAME.findall(expr))
            if memo is not None and isinstance(value, (dict, list, tuple)) and _nodes(value) <= start:
                _memo_put(memo, "names", value, (_nodes(value), start - budget, frozenset(words)))
        for w in (words & known) - seen:
            seen.add(w)
            todo.append(w)
    return seen


def _vault_plaintexts(all_vars: dict[str, Any], template: Callable[[Any], Any],
                      memo: dict | None = None) -> tuple[set[str], set[str]]:
    """Walk every variable of the host (not :data:`SKIP_VARS`; at most :data:`MAX_VAULT_NODES`
    values) for vaulted values; return (the plaintexts of those in :func:`_reachable_vars`,
    registered as secrets; the names of the variables that hold one or whose Jinja refers to
    one, transitively).

    Every vaulted value is decrypted, reachable or not: a value no Jinja carries can still be pasted
    by hand into a plain field (``ddtree_model.path: kimi-<the vaulted text>``), and
    :func:`_secret_in_plain_field` refuses any field holding a vault plaintext. Each vaulted string
    costs a key derivation (PBKDF2, ~3 ms; Ansible keeps derived keys per process, so the other hosts
    of a load pay nothing again), so 2,000 in an unrelated variable cost 7-12 s: reachable values are
    always decrypted, at most :data:`MAX_UNREACHED_DECRYPTS` of the others per host (past that, their
    reuse as plain text is not looked for; docs/configuration.md says so), and of those only plaintexts
    :func:`_counts_unreached` are kept. A deadline firing while decrypting (inventory's
    ``TemplateTimeout``) gets ``cause``, ``variable`` and ``fix`` attributes naming decryption,
    not Jinja, as the cause.

    ``memo`` (one load's, :func:`_memo_get`): a container walked whole before without a vaulted
    value in it is charged to the budget as before and not walked again (the hosts of a group
    share their group_vars values)."""
    from .errors import _is_vaulted

    plain: set[str] = set()
    holders: set[str] = set()
    reachable = _reachable_vars(all_vars, memo)
    budget = MAX_VAULT_NODES
    done = 0
    unreached = 0
    for name, value in list(all_vars.items()):
        if name in SKIP_VARS or budget <= 0:
            continue
        if isinstance(value, (dict, list, tuple)):
            clean = _memo_get(memo, "unvaulted", value)  # (values popped, leaves yielded) of a whole walk
            if clean is not None and clean[0] <= budget:
                budget -= clean[1]
                continue
            leaves: Any = _strings(value, budget)
        elif not _is_vaulted(value):  # a scalar: the walk would yield it alone (most per-host variables)
            budget -= 1
            continue
        else:
            leaves = (("", value),)
        start, vaulted = budget, False
        for _, leaf in leaves:
            budget -= 1
            if _is_vaulted(leaf):
                vaulted = True
                holders.add(str(name))
                if str(name) not in reachable:
                    if unreached >= MAX_UNREACHED_DECRYPTS:
                        continue
                    unreached += 1
                text, fresh = _plaintext(leaf, str(name), template, memo, done)
                done += fresh
                # the text as vaulted and as it is reused: `echo SECRET | ansible-vault encrypt_string`
                # vaults "SECRET\n", and a value pasted by hand into a field carries no surrounding space
                for t in {text, text.strip()} if isinstance(text, str) else ():
                    if t and (str(name) in reachable or _counts_unreached(t)):
                        register_secret(t)
                        plain.add(t)
        if not vaulted and memo is not None and isinstance(value, (dict, list, tuple)) and _nodes(value) <= start:
            _memo_put(memo, "unvaulted", value, (_nodes(value), start - budget))
    if holders:
        _add_jinja_holders(all_vars, holders)
    return plain, holders


def _plaintext(leaf: Any, name: str, template: Callable[[Any], Any], memo: dict | None, done: int) -> tuple[Any, bool]:
    """(the plaintext of the vaulted ``leaf`` of variable ``name``, or None when it cannot be decrypted here;
    whether it was decrypted now). Kept in ``memo`` per vaulted object: decrypting does not depend on the
    host, and the hosts of a group share their group_vars objects (once per load)."""
    known = memo.get(("vault-plain", id(leaf))) if memo is not None else None
    if known is not None and known[0] is leaf:
        return known[1], False
    try:
        text = template(leaf)
    except Exception:  # noqa: BLE001 - undecryptable here: no plaintext to leak
        return None, False
    except BaseException as exc:  # a deadline while decrypting: say so, not "Jinja"
        exc.__dict__.setdefault("variable", name)
        exc.__dict__.setdefault("cause", f"decrypting the vaulted values the deployment variables refer to "
                                         f"({done} done; one key derivation each)")
        exc.__dict__.setdefault("fix", "vault fewer separate values the ddtree_* variables refer to (one "
                                       "vaulted file, ansible-vault encrypt, costs one key derivation)")
        raise
    if memo is not None:
        memo[("vault-plain", id(leaf))] = (leaf, text)
    return text, True


def _counts_unreached(text: str) -> bool:
    """Whether the plaintext of a vaulted value no deployment variable refers to counts as a secret to
    look for in plain fields (and to scrub): 8 characters or more, or 4-7 that read as a credential
    (:func:`~.errors.credential_shaped`: a digit, ``+/=~_``, an inner capital: ``qw3n7``, ``hunter2``).
    A short plain word (a become password ``sglang``) would refuse the service user ``sglang`` and
    scrub the word out of every message, for a value the deployment never uses."""
    return len(text) >= 8 or (len(text) >= 4 and credential_shaped(text))


def _add_jinja_holders(all_vars: dict[str, Any], holders: set[str]) -> None:
    """Add to ``holders`` (names of variables holding a vaulted value) every variable whose Jinja
    refers to one, transitively (a variable whose Jinja names a holder holds the secret too)."""
    jinja_of = {str(n): " ".join(_JINJA.findall(" ".join(x for _, x in _strings(v) if isinstance(x, str))))
                for n, v in all_vars.items() if n not in SKIP_VARS and str(n) not in holders}
    changed = True
    while changed and holders:
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(holders))) + r")\b")
        changed = False
        for n, expr in jinja_of.items():
            if n not in holders and expr and pattern.search(expr):
                holders.add(n)
                changed = True


def _secret_in_plain_field(host: str, raw: dict[str, Any], out: dict[str, Any], plain: set[str],
                           holders: set[str], memo: dict | None = None) -> None:
    """Refuse a non-secret deployment field whose templated value is vaulted, contains a vault
    plaintext (or a registered secret of this host), or whose Jinja refers to a vault-holding variable.
    With no such secret to look for, the vaulted paths of a container are kept in ``memo`` (one
    load's, :func:`_memo_get`)."""
    from .errors import _is_vaulted

    # the secret values only: a ddtree_secret_env name (ROUTER_API_KEY) is no secret, and the fields
    # that point at an entry (ddtree_router.api_key_secret) hold exactly that name
    own = {s for k in SECRET_VARS for _, s in _strings(out.get(k), keys=False) if isinstance(s, str)}
    # a secret is one by provenance, whatever its length: secrets of >= 8 characters anywhere in a value,
    # shorter ones (>= 4, as register_secret keeps) as a whole word of it (a vaulted "qw3n7" reused as
    # served_model_name); Jinja naming a vaulted variable is caught by name below
    secrets = [s for s in plain | own if len(s) >= 8]
    short = [s for s in plain | own if 4 <= len(s) < 8]
    # one scan per text for all of them (an inventory may hold hundreds of vaulted values; the pattern text is
    # the same for every host of a load, so re's cache compiles it once)
    inside = re.compile("|".join(map(re.escape, sorted(secrets)))) if secrets else None
    word = (re.compile(r"(?<![A-Za-z0-9])(?:" + "|".join(map(re.escape, sorted(short))) + r")(?![A-Za-z0-9])")
            if short else None)
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(holders))) + r")\b") if holders else None
    found: list[Finding] = []
    for k, v in out.items():
        if k in SECRET_VARS:
            continue
        hits = None if secrets or short else _memo_get(memo, "vaulted-paths", v)
        if hits is None:
            hits = [path for path, leaf in _strings(v)
                    if _is_vaulted(leaf) or (isinstance(leaf, str) and ((inside is not None and inside.search(leaf))
                                                                       or (word is not None and word.search(leaf))
                                                                       or looks_like_token(leaf)))]
            if not secrets and not short:
                _memo_put(memo, "vaulted-paths", v, tuple(hits))
        hits = list(hits)
        if pattern is not None:  # Jinja naming a vault-holding variable (a filter may have changed the text)
            hits += [path for path, leaf in _strings(raw.get(k))
                     if isinstance(leaf, str) and any(pattern.search(e) for e in _JINJA.findall(leaf))]
        if hits:
            found.append(Finding(
                "error", f"{k}{hits[0]}", REDACTED,
                "holds a secret: a vaulted value of the inventory (carried by Jinja, or its text written in by "
                "hand: any vaulted value of 8+ characters anywhere in the text, of 4-7 as a whole word), the "
                "text of ddtree_hf_token / ddtree_secret_env, or a token-shaped value (hf_..., sk-..., ghp_...); "
                "only ddtree_hf_token and ddtree_secret_env may: this field would land in plan.json / 0644 "
                "files and in messages",
                "put the secret in ddtree_secret_env (or ddtree_hf_token), which land only in the 0600 "
                "secrets.env; text that is no secret must not repeat a vaulted value (un-vault that value "
                "or change the text)", host=host))
    if found:
        raise ConfigError(found)


def _secret_named_vars(all_vars: dict[str, Any]) -> set[str]:
    """Names of the host's variables (not :data:`SKIP_VARS`, not :data:`SECRET_VARS`) whose name looks
    secret (:func:`~.errors.is_secret_name`) and whose value is text or holds text."""
    return {str(n) for n, v in all_vars.items()
            if n not in SKIP_VARS and n not in SECRET_VARS and isinstance(n, str) and len(n) <= 128
            and isinstance(v, (str, dict, list, tuple)) and _secret_key(n)}


_QUOTED = re.compile(r"'[^'\n]*'|\"[^\"\n]*\"")


def template_error(name: str, raw: Any, exc: BaseException, host: str = "",
                   holders: set[str] | None = None) -> Finding:
    """A finding for a variable whose Jinja failed: Ansible's first line, with every quoted
    literal of the template source (and the source itself) replaced by ``…`` (a literal may be
    a secret: ``mandatory('<s>')``, ``lookup('file', '<s>')``). When the Jinja names a variable
    that holds a secret (``holders``: vaulted, or under a secret-looking name), every quoted value
    of Ansible's text goes too: a value the expression computed from the secret (``vault_x | upper``,
    ``vault_x ~ '!'``) is no registered string, and Ansible quotes the value it could not use."""
    from .errors import shorten

    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = lines[0] if lines else type(exc).__name__
    if holders:
        names = re.compile(r"\b(" + "|".join(map(re.escape, sorted(holders))) + r")\b")
        if any(names.search(e) for _, src in _strings(raw) if isinstance(src, str) for e in _JINJA.findall(src)):
            text = _QUOTED.sub("…", text)
    sources = [x for _, x in _strings(raw) if isinstance(x, str)]
    literals = {m[0] or m[1] for src in sources for expr in _JINJA.findall(src) + [src]
                for m in _LITERAL.findall(expr)}
    if name in SECRET_VARS or is_secret_name(name):  # even a name in a secret's Jinja may be the secret
        literals |= {w for src in sources for expr in _JINJA.findall(src) for w in re.findall(r"\w{3,}", expr)}
    for lit in sorted(literals | set(sources) | {lit for src in sources for lit in _JINJA.findall(src)},
                      key=len, reverse=True):
        if len(lit) >= 2 and lit in text:
            text = text.replace(lit, "…")
    fix = ("give the vault password: --vault-password-file FILE (or ANSIBLE_VAULT_PASSWORD_FILE / ansible.cfg)"
           if "undecryptable" in text or "vault" in text.lower() else
           "fix the Jinja expression of this variable (ansible-inventory -i INV --host HOST shows the same)")
    return Finding("error", name, "…", f"templating failed: {shorten(text, 300)}", fix, host=host)


def host_vault_texts(all_vars: dict[str, Any], template: Callable[[Any], Any], memo: dict | None = None) -> set[str]:
    """The vault plaintexts of one host that count as secrets (:func:`_vault_plaintexts`: every
    one its deployment variables reach, the others up to :data:`MAX_UNREACHED_DECRYPTS` and only
    those :func:`_counts_unreached`), registered for the scrub. The loader gathers them over every
    host of the inventory (:func:`~.inventory.load_hostvars`, the deploy's fleet check) and passes
    the union to :func:`deployment_vars` as ``inventory_secrets``: a router's vaulted API key
    reused as a server's ``served_model_name`` is a secret there too. With the load's ``memo``,
    the hosts' shared group_vars values are decrypted once.

    A host whose deployment variables break the size bounds (:func:`_check_size`: an alias bomb)
    is not walked: it gives nothing here, and its own check refuses it when it is loaded."""
    names = [k for k in all_vars if k in INVENTORY_VARS.values() or is_deployment_var(k)]
    try:
        _check_size("", {k: all_vars[k] for k in names}, memo)
    except ConfigError:
        return set()
    return _vault_plaintexts(all_vars, template, memo)[0]


def vaulted_host_name(names: Any, secrets: set[str]) -> Finding | None:
    """The refusal of an inventory host whose name is a vault plaintext of the inventory (the
    host name goes into unit names, Prometheus labels, paths and messages), or None. The finding
    names neither the host nor the text, only how many hosts the inventory holds and the rule."""
    names = list(names)
    texts = {t for t in secrets if t}
    for i, name in enumerate(names):
        if isinstance(name, str) and name in texts:
            return Finding("error", "inventory host name", REDACTED,
                           f"inventory host {i + 1} of {len(names)} is named as a vaulted value of the inventory: "
                           "the host name lands in unit names, Prometheus labels, paths and messages",
                           "rename the host (its ansible_host can stay), or stop vaulting a text that names a host")
    return None


def deployment_vars(all_vars: dict[str, Any], template: Callable[[Any], Any], host: str = "",
                    memo: dict | None = None, inventory_secrets: set[str] | None = None) -> dict[str, Any]:
    """The variables of one host the config loader reads (:data:`INVENTORY_VARS` and every
    ``ddtree_*`` deployment variable), each passed through ``template`` (Ansible's Templar),
    plus ``group_names`` (:data:`GROUPS_VAR`) when present.

    Before anything walks them, their size is bounded (:data:`MAX_VAR_NODES`,
    :data:`MAX_VAR_CHARS`; again after templating). Every vaulted value the deployment variables
    can reach (ansible-core 2.19 ``EncryptedString`` / ``VaultedValue``; 2.17/18
    ``AnsibleVaultEncryptedUnicode``; :func:`_vault_plaintexts`) is decrypted and its plaintext
    registered for redaction, as is every string under a secret-looking name,
    ``ddtree_hf_token`` or ``ddtree_secret_env``.

    ``memo``: a dict the caller keeps for one inventory load and passes for every host (or None):
    walks over the same container objects (the group_vars values the hosts of a group share) are
    done once and their results kept there (:func:`_memo_get`); every check still runs per host.

    ``inventory_secrets``: the vault plaintexts of every host of the inventory
    (:func:`host_vault_texts`), refused in this host's plain fields as its own are: provenance is
    inventory-wide, not per host.

    Raises:
        ConfigError: the variables are too large (one finding naming the path where the bound
            ran out); a variable's Jinja fails (:func:`template_error`); a field other than
            :data:`SECRET_VARS` holds a vaulted value or text made from one.
    """
    names = [k for k in all_vars if k in INVENTORY_VARS.values() or is_deployment_var(k)]
    raw = {k: all_vars[k] for k in names}
    _check_size(host, raw, memo)
    plain, holders = _vault_plaintexts(all_vars, template, memo)
    plain = plain | (inventory_secrets or set())
    # a plain variable under a secret-looking name (my_api_key, db_password) is a secret by its name: Jinja
    # that names it in a plain field writes it out, as Jinja naming a vaulted variable would
    holders = holders | _secret_named_vars(all_vars)
    out = {}
    for k, v in raw.items():
        try:
            out[k] = template(v)
        except Exception as exc:  # noqa: BLE001 - Ansible raises many types; each is one finding
            raise ConfigError([template_error(k, v, exc, host, holders)]) from None
        except BaseException as exc:  # a deadline (inventory.TemplateTimeout): say which variable
            exc.__dict__.setdefault("variable", k)
            raise
    if any(out[k] is not raw[k] for k in raw):  # templating changed something (else: checked above)
        _check_size(host, out, memo)
    for k, v in out.items():
        _register_secrets(k, v, secret=k in SECRET_VARS, memo=memo)
    _secret_in_plain_field(host, raw, out, plain, holders, memo)
    groups = all_vars.get(GROUPS_VAR)
    if isinstance(groups, (list, tuple)) and len(groups) <= 1000:
        out[GROUPS_VAR] = [str(g) for g in groups if isinstance(g, str)]
    return out
