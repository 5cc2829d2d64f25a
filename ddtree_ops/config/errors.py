"""Findings and the error type every layer raises for bad configuration.

A :class:`Finding` names the field path (as written in the inventory, e.g.
``ddtree_speculative.budget``), the value found, the rule broken, the fix, and where the
rule comes from. The CLI prints them one per line; Ansible fails the play with them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

SECRET_NAME = re.compile(r"(?!(?:mon|don|tur|hoc|joc|whis|lac|malar)key\Z)"
                         r"[a-z0-9]*(token|key)|pass(?:wd|words?|phrases?)?[0-9]*|[a-z0-9]*secrets?[a-z0-9]*"
                         r"|credentials?|auth[a-z0-9]*|pat|bearer|cookies?|salt|jwt|signature", re.IGNORECASE)
"""One word (between ``_``, ``.``, ``-``) of a name whose value is a secret: ``*token``,
``*key``, ``password``/``passwd``, ``*secret*``, ``credential(s)``, ``auth*``, ``pat`` (a
personal access token), ``bearer``, ``cookie(s)``, ``salt``, ``jwt``, ``signature``, any case
(English words that merely end in "key" -- monkey, donkey, turkey, hockey, jockey, whiskey, lackey,
malarkey -- are not)
(``HF_TOKEN``, ``hf_token``, ``WANDB_API_KEY``, ``DB_PASSWORD``, ``ddtree_secret_env``);
``tokens`` (a count, e.g. ``draft_tokens_per_req``) is not one. Such values are never
printed; findings say ``(redacted)``."""

REDACTED = "(redacted)"
MAX_SHOWN = 200
"""Characters of an offending value (or host name) echoed in a message; longer ones end in ``…``."""

_known_secrets: set[str] = set()


def register_secret(value: str) -> None:
    """Remember a secret string (HF token, ``ddtree_secret_env`` value, anything that came
    from an Ansible vault) so no finding's text can ever contain it (see :func:`scrub`).
    Strings shorter than 4 characters are not registered (they would scrub ordinary words)."""
    if isinstance(value, str) and len(value) >= 4:
        _known_secrets.add(str(value))


def registered_secret_in(text: str) -> bool:
    """Whether ``text`` holds a secret registered with :func:`register_secret` (vault plaintexts,
    ``ddtree_hf_token``, values under secret-looking names)."""
    return any(s in text for s in _known_secrets)


def scrub(text: str) -> str:
    """``text`` with every registered secret replaced by ``(redacted)``, and these shapes redacted:

    - URL credentials (the whole user info of any URL, ``scheme://user:pass@`` or a bare token
      user -> ``scheme://(redacted)@``), HTTP authorization credentials (``Bearer X``),
      secret-looking query parameters (``?access_token=X``);
    - well-known token formats wherever they stand (:data:`_TOKEN_SHAPE`: ``hf_...``,
      ``sk-...``, ``ghp_...``, ``github_pat_...``, ``xoxb-...``, ``glpat-...``);
    - the value after a NAME that looks secret (:func:`is_secret_name`) in the shapes of
      :data:`_NAMED_VALUE`: ``NAME=value``, ``NAME = value``, ``export NAME="value"``,
      ``api_key='value'`` (a Python repr), ``"hf_token": "value"`` (JSON), ``NAME: value``,
      ``--api-key value`` (an argv flag and its value); a plain lower-case word before ``:`` or
      an identifier before a space (``token: X``, ``HF_TOKEN X``) redacts only a token-like value
      (:func:`_token_like`), so prose (``a secret: it``) stays readable.

    A terminal escape sequence (ECMA-48 CSI/OSC, 7- or 8-bit: a coloured log line) separates words:
    the text between escapes is scrubbed piece by piece, so ``\x1b[31mBearer X`` is ``Bearer X``
    after an escape, not the word ``mBearer`` (the escapes are kept; printing strips them).

    Every pattern runs in time linear in ``len(text)`` (``tests/test_scrub.py`` times 1 MB lines)."""
    if "\x1b" in text or "\x9b" in text:
        parts = _ESCAPE_SPLIT.split(text)
        return "".join(part if i % 2 else _scrub_plain(part) for i, part in enumerate(parts))
    return _scrub_plain(text)


_ESCAPE_SPLIT = re.compile(r"(\x1b\[[0-?]*[ -/]*[@-~]?|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[ -/]*[0-~]?"
                           r"|\x9b[0-?]*[ -/]*[@-~]?)")
"""Terminal escape sequences (CSI, OSC, the other two-byte escapes; 8-bit CSI), one capture group:
``re.split`` keeps them at the odd indexes."""


def _scrub_plain(text: str) -> str:
    """:func:`scrub` of a text without terminal escapes."""
    for s in _secrets_longest_first():
        if s in text:
            text = text.replace(s, REDACTED)
    if "://" in text:  # (a cheap test first: most texts hold no URL and no scheme word)
        text = _URL_TOKEN_USER.sub(lambda m: f"{m['pre']}{REDACTED}@", text)  # the whole user info
    lower = text.lower() if text.isascii() else None
    if lower is None or any(w in lower for w in _AUTH_WORDS):
        text = _AUTH_SCHEME.sub(_redact_auth, text)
    text = _SECRET_QUERY.sub(lambda m: f"{m['pre']}{REDACTED}", text)
    if any(p in text for p in _TOKEN_PREFIXES):
        text = _TOKEN_SHAPE.sub(REDACTED, text)
    if lower is not None and not any(w in lower for w in _SECRET_WORDS):
        return text  # no secret-looking name in an ASCII text
    return _redact_named_values(text)


def scrub_all(value: Any) -> Any:
    """``value`` with every string in it (keys included, any depth, nothing cut) passed through :func:`scrub`:
    for documents made of server text before they are printed or written (a check's detail, ``bench.json``)."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub(k) if isinstance(k, str) else k: scrub_all(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_all(v) for v in value]
    return value


def _redact_named_values(text: str, pattern: re.Pattern[str] | None = None) -> str:
    """:data:`_NAMED_VALUE` matches redacted by :func:`_redact_named`. A match that is no secret
    gives back its value, which may be a name itself (``argv: --api-key X``, ``export KEY=X``):
    the search goes on where that value starts (each character is scanned a bounded number of
    times: linear)."""
    out: list[str] = []
    pos = 0
    search = (pattern or _NAMED_VALUE).search
    while (m := search(text, pos)) is not None:
        new = _redact_named(m)
        if new is None:
            out.append(text[pos:m.end("sep")])
            pos = m.end("sep")
        else:
            out.append(text[pos:m.start()])
            out.append(new)
            pos = m.end()
    if not out:
        return text
    out.append(text[pos:])
    return "".join(out)


_sorted_secrets: tuple[set[str], int, list[str]] | None = None


def _secrets_longest_first() -> list[str]:
    """The registered secrets, longest first (so a secret containing another is replaced
    whole), sorted again only when the set changed: secrets are only ever added, so the set
    object and its size identify its contents (sorting them for every message cost validate time at
    1000 hosts; ``scripts/bench-controller.py`` measures it)."""
    global _sorted_secrets
    cached = _sorted_secrets
    if cached is None or cached[0] is not _known_secrets or cached[1] != len(_known_secrets):
        cached = _sorted_secrets = (_known_secrets, len(_known_secrets),
                                    sorted(_known_secrets, key=len, reverse=True))
    return cached[2]


def _redact_named(m: re.Match[str]) -> str | None:
    """The text of a :data:`_NAMED_VALUE` match with its value redacted, or None when it is no secret."""
    name, sep = m["name"], m["sep"]
    quoted = m["vq"] is not None
    value = m["qvalue"] if quoted else m["value"]
    identifier = re.search(r"[_.A-Z-]", name) is not None or bool(m["nq"])
    if "=" in sep:
        strong = True
    elif ":" in sep:  # "NAME: value" redacts any value only for identifiers (hf_token, X_API_KEY, a JSON key)
        # "password: hunter" is never prose; "password: --vault-password-file FILE" names a flag
        strong = identifier or (_PASSWORD_WORD.fullmatch(name) is not None and not value.startswith("-"))
    elif not identifier:  # "word value": prose
        return None
    elif name.startswith("--"):  # "--api-key VALUE": an argv flag takes the next word, unless that is a flag
        if value.startswith("-"):
            return None
        strong = True
    else:  # "HF_TOKEN VALUE"
        strong = False
    if not is_secret_name(name) or not (strong or _token_like(value)):
        return None
    if not quoted and value.lower() in _AUTH_WORDS and re.match(r"\s+\(redacted\)", m.string[m.end():]):
        return None  # "token: Bearer (redacted)": the scheme word is no secret, its credential is gone already
    start, end = m.span("qvalue" if quoted else "value")
    return m[0][: start - m.start()] + REDACTED + m[0][end - m.start():]


def _token_like(value: str) -> bool:
    """A word that reads as a credential rather than prose: 6 or more characters with a digit or
    an upper-case letter (``SEKRIT1``, ``AbCdEf``; not ``it``, ``missing``, ``None``)."""
    return len(value) >= 6 and _TOKEN_CHAR.search(value) is not None


_TOKEN_CHAR = re.compile(r"[0-9A-Z]")


_PLURAL_SECRET = re.compile(r"[A-Z0-9]*(TOKENS|KEYS)")
"""An upper-case (environment-style) last word ``*TOKENS`` / ``*KEYS`` (``API_TOKENS``, ``SSH_KEYS``)
is a secret too; lower-case ``tokens`` and inner words stay counts (``draft_tokens_per_req``,
``DDTREE_OPS_VERIFY_TOKENS_PER_REQ``)."""


def is_secret_name(name: str) -> bool:
    """True when a field path or name looks like it holds a secret (:data:`SECRET_NAME`, or an
    upper-case plural word :data:`_PLURAL_SECRET`). Names up to 128 characters are remembered
    (a pure function of the name; every host and message repeats the same few dozen)."""
    name = str(name)
    return _secret_name_cached(name) if len(name) <= 128 else _is_secret_name(name)


@functools.lru_cache(maxsize=4096)
def _secret_name_cached(name: str) -> bool:
    return _is_secret_name(name)


def _is_secret_name(name: str) -> bool:
    words = [w for w in re.split(r"[^A-Za-z0-9]+", str(name)) if w]
    return any(SECRET_NAME.fullmatch(w) for w in words) or bool(words and _PLURAL_SECRET.fullmatch(words[-1]))


URL_CREDENTIALS = re.compile(r"(?P<pre>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*):(?P<pw>[^\s/?#@'\"]+)@")
"""``scheme://user:password@`` in a URL (RFC 3986 §3.2.1 userinfo; the password part is deprecated
there because it is shown wherever the URL is)."""

_URL_TOKEN_USER = re.compile(r"(?i)\b(?P<pre>[a-z][a-z0-9+.-]*://)(?P<user>[^\s/?#@'\"]+)@")
"""A bare user in a URL (``https://TOKEN@host``, ``socks5://TOKEN@proxy``): forges and proxies
take a token as the user name, so echoed text never shows it (an ssh user is refused nowhere,
only not echoed)."""

_AUTH_SCHEME = re.compile(
    r"(?i)\b(?P<scheme>bearer|basic|token|digest|apikey)(?P<sep>\s+)(?P<cred>[A-Za-z0-9._~+/=-]{4,})"
)
"""An HTTP ``Authorization`` credential (RFC 9110 §11.4: ``Bearer TOKEN``, ``Basic B64``); the scheme
words are also English (``a 1-token generation``, ``paste the token here``), so only a credential-shaped
word after one is redacted (:func:`credential_shaped`) unless an ``Authorization`` header stands before it."""

_AUTH_HEADER = re.compile(r"(?i)(?:authori[sz]ation|[a-z0-9_-]*(?:token|auth|key|secret|credentials?|bearer))"
                          r"[\"']?\s*[:=]\s*[\"']?\s*\Z")
"""The text before a scheme word is an ``Authorization:`` header (or ``authorization=``), or a header-ish key
that names a secret (``token: Bearer X``, ``X-Auth-Token: Bearer X``, ``proxy_auth = Basic X``): what
follows is a credential whatever it reads like."""

BEARER_MIN_CREDENTIAL = 10
"""An all-lower-case word after ``Bearer`` of this many characters or more is a credential (RFC 6750
``b64token``; a random lower-case token has no digit often enough at 10-23 characters), unless it is one
of the English words that follow "bearer" in prose (:data:`_BEARER_PROSE`). After ``Basic``, ``Token``,
``Digest`` a lower-case word stays prose below 24 characters (``a basic check``, ``token generation``)."""
_BEARER_PROSE = frozenset({"authentication", "authorization", "authorisation", "credential", "credentials",
                           "authenticated", "authorized", "authorised", "authenticates"})

_CREDENTIAL_SIGN = re.compile(r"[0-9+/=~_]|(?<=.)[A-Z]")


def credential_shaped(word: str) -> bool:
    """Whether a word reads as a credential rather than prose: a digit, one of ``+/=~_`` (base64,
    base64url, RFC 6750 ``b64token``), an upper-case letter after its first character, or 24 characters
    and more (``SEKRITsmi``, ``dXNlcjpwYXNz``, ``abc123def``; not ``generation``, ``here``, ``Hugging``).
    Random tokens of that length hold one of these all but always; English words hold none."""
    return len(word) >= 24 or _CREDENTIAL_SIGN.search(word) is not None


def _redact_auth(m: re.Match[str]) -> str:
    """An :data:`_AUTH_SCHEME` match with its credential redacted when it is one (see there)."""
    header = _AUTH_HEADER.search(m.string, max(0, m.start() - 40), m.start()) is not None
    cred = m["cred"]
    bearer = (m["scheme"].lower() == "bearer" and len(cred) >= BEARER_MIN_CREDENTIAL
              and cred.lower() not in _BEARER_PROSE)
    if not header and not bearer and not credential_shaped(cred):
        return m[0]
    return f"{m['scheme']}{m['sep']}{REDACTED}"
_AUTH_WORDS = ("bearer", "basic", "token", "digest", "apikey")
"""The scheme words of :data:`_AUTH_SCHEME`: an ASCII text holding none of them (any case) cannot
match it (a non-ASCII text always goes through the regex: Unicode case folding, e.g. ``K``)."""

_SECRET_QUERY = re.compile(r"(?i)(?P<pre>[?&;][A-Za-z0-9_.-]*(?:token|key|secret|sig|signature|password|passwd|auth|"
                           r"credential|session)[A-Za-z0-9_.-]*=)(?P<value>[^&#\s'\"]+)")
"""A query parameter whose name looks secret (``?token=``, ``&sig=``, ``X-Amz-Signature=``)."""


def value_secret_reason(value: str) -> str | None:
    """Why a plain string value holds a secret, or None: URL user info (any scheme),
    an HTTP authorization credential (``Bearer ...``), a secret-looking query parameter, or a
    ``name=value`` / ``name: value`` pair with a secret-looking name (``api-key=X``, as in
    ``OTEL_EXPORTER_OTLP_HEADERS``). Used to refuse such values where they would land in
    world-readable files; :func:`scrub` redacts the same shapes in echoed text."""
    if URL_CREDENTIALS.search(value) or _URL_TOKEN_USER.search(value):
        return "URL credentials (user info before @)"
    if any(_redact_auth(m) != m[0] for m in _AUTH_SCHEME.finditer(value)):
        return "an HTTP authorization credential (Bearer/Basic/Token ...)"
    if _SECRET_QUERY.search(value):
        return "a secret-looking query parameter (token=, key=, sig=, ...)"
    # "name=value" / "name: value" with a secret-looking name, or any shape scrub() redacts ("--api-key X")
    if (any(is_secret_name(m["name"]) and m["sep"].strip() for m in _NAMED_VALUE.finditer(value))
            or _redact_named_values(value) != value):
        return "a name=value pair with a secret-looking name"
    return None

_PASSWORD_WORD = re.compile(r"(?i)pass(?:wd|words?|phrases?)")
"""A lower-case word before ``:`` that names a password whatever follows (``password: hunter``); other plain
words (``secret: it``) redact only a token-like value, so prose stays readable."""

_SECRET_WORDS = ("token", "key", "pass", "secret", "credential", "auth", "pat", "bearer", "cookie", "salt", "jwt",
                 "signature")
"""Every name :func:`is_secret_name` accepts holds one of these (any case)."""

_NAMED_VALUE = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<nq>\\?[\"'])?"
    r"(?=[A-Za-z0-9_.-]*?(?i:" + "|".join(_SECRET_WORDS) + r"))"
    r"(?P<name>[A-Za-z0-9_.-]+)(?(nq)\\?[\"'])"
    r"(?P<sep>[ \t]{0,8}(?:=>|[=:])[ \t]{0,8}|[ \t]{1,8})"
    r"(?:[bBrRuU]{0,2}(?P<esc>\\)?(?P<vq>[\"'])(?!\(redacted\))"
    r"(?P<qvalue>(?(esc)(?:[^\"'\\\n]|\\[^\"'\n])+|(?:[^\"'\\\n]|\\[^\n])+))"
    r"|(?P<value>(?!\(redacted\))[^\s'\",;{}\[\]()\\…]+))")
"""A NAME and its value in echoed text: ``NAME=value`` (an env line), ``NAME = value``, ``NAME: value``
(YAML), ``export NAME="value"`` (shell), ``name='value'`` (a Python repr, as SGLang prints its
``ServerArgs``), ``"name": "value"`` (JSON, also with JSON-escaped quotes ``\\"``), ``--name value``
(argv). NAME is a whole run of ``[A-Za-z0-9_.-]`` (the look-behind: a match starts only where a run
starts, so every run is tried once and a 1 MB line costs linear time); :func:`_redact_named`
decides which matches are secrets. The look-ahead skips runs holding none of :data:`_SECRET_WORDS`
(no name without one is secret). A quoted value runs to its closing quote, JSON escapes
(``\\n`` of a PEM key) included: inside ``"..."`` an escaped quote ``\\"`` is part of the value; a value
opened by an escaped quote (JSON inside a JSON string) ends at the next escaped quote. Also ``name => value``
(Perl/Ruby hashes) and Python bytes/raw reprs (``api_key=b'value'``)."""




def _is_vaulted(v: Any) -> bool:
    """True for a value that came from an Ansible vault: ansible-core 2.19 tags decrypted
    values with ``VaultedValue`` (and keeps undecrypted ones as ``EncryptedString``);
    2.17/2.18 hand out ``AnsibleVaultEncryptedUnicode``."""
    return _vault_check()(v)


@functools.cache
def _vault_check() -> Callable[[Any], bool]:
    """The test of :func:`_is_vaulted` for the installed ansible-core, its imports resolved
    once (they cost ~10 µs a call, called for every string of every host; ``scripts/bench-controller.py``
    measures validate)."""
    try:
        from ansible._internal._datatag._tags import VaultedValue
        from ansible.parsing.vault import EncryptedString
    except ImportError:  # ansible-core < 2.19, or not installed (CLI used on plain data)
        try:
            from ansible.parsing.yaml.objects import AnsibleVaultEncryptedUnicode
        except ImportError:
            return lambda v: False
        return lambda v: isinstance(v, AnsibleVaultEncryptedUnicode)
    return lambda v: isinstance(v, EncryptedString) or VaultedValue.is_tagged_on(v)


def redact(value: Any, _depth: int = 0) -> Any:
    """A copy of ``value`` safe to print: values under secret-looking keys, vaulted values
    and registered secrets become ``(redacted)``; containers are cut at 50 items / depth 8."""
    if _is_vaulted(value):
        return REDACTED
    if isinstance(value, str):
        return scrub(value)
    if _depth > 8:
        return "…"
    if isinstance(value, dict):
        out = {}
        for i, (k, x) in enumerate(value.items()):
            if i >= 50:
                out["…"] = f"{len(value) - 50} more"
                break
            ks = scrub(str(k))
            out[ks] = REDACTED if is_secret_name(ks) else redact(x, _depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        items = [redact(x, _depth + 1) for x in list(value[:50])]
        return items + ([f"… {len(value) - 50} more"] if len(value) > 50 else [])
    return value


def shorten(text: str, limit: int = MAX_SHOWN) -> str:
    """``text`` cut to ``limit`` characters plus ``…``."""
    return text if len(text) <= limit else text[:limit] + "…"


def one_line(data: bytes | str, limit: int) -> str:
    """Host-controlled text as one safe line: decoded (invalid UTF-8 replaced), terminal escapes
    (ECMA-48 CSI/OSC) removed and other control characters, tabs and newlines made spaces
    (:func:`ddtree_ops._core.scrub.strip_controls`, the log reader's), secrets scrubbed, cut to
    ``limit`` characters plus ``…``."""
    from .._core.scrub import strip_controls

    text = data.decode("utf-8", "replace") if isinstance(data, bytes | bytearray) else str(data)
    text = strip_controls(text[: limit * 8]).replace("\t", " ").replace("\n", " ")  # scrub sees a bounded text
    return shorten(scrub(text).strip(), limit)


_PLAIN_HOST = re.compile(r"[A-Za-z0-9.-]{1,253}")


def show_host(host: str) -> str:
    """A host name as messages print it: plain names as they are, anything else quoted
    (``repr``, so a newline prints as ``\\n``) and shortened."""
    return host if _PLAIN_HOST.fullmatch(host) else shorten(repr(scrub(host)))


@dataclass(frozen=True)
class Finding:
    """One rule outcome for one field.

    Secrets never leave a finding: the value of a secret-looking field (:data:`SECRET_NAME`,
    e.g. ``ddtree_hf_token``, ``ddtree_service.env.WANDB_API_KEY``), any vaulted value and
    any registered secret string (:func:`register_secret`) is replaced by ``(redacted)`` when
    the finding is made, and ``message()`` / ``as_dict()`` scrub registered secrets out of
    every text field and cut echoed values to :data:`MAX_SHOWN` characters.

    Attributes:
        level: ``error`` stops a deployment; ``warning`` is printed and kept in the plan;
            ``info`` says what was not checked (e.g. a checkpoint that could not be read).
        field: inventory path, e.g. ``ddtree_server.tp_size``.
        value: the value found (``None`` when the field is unset).
        rule: what must hold, in one sentence.
        fix: what the operator should change.
        source: where the rule comes from (SGLang file, upstream issue), if anywhere.
        host: the inventory host the finding is about.
    """

    level: Literal["error", "warning", "info"]
    field: str
    value: Any
    rule: str
    fix: str
    source: str = ""
    host: str = ""

    def __post_init__(self) -> None:
        value = REDACTED if (is_secret_name(self.field) and self.value is not None) else redact(self.value)
        object.__setattr__(self, "value", value)

    def _shown_value(self) -> str:
        """The value as messages show it, kept like :meth:`message`'s line (it does not depend on
        the host, so :meth:`for_host` copies keep it)."""
        cached = self.__dict__.get("_shown")
        if cached is not None and cached[0] is _known_secrets and cached[1] == len(_known_secrets):
            return cached[2]
        shown = REDACTED if self.value == REDACTED else shorten(scrub(repr(self.value)))
        object.__setattr__(self, "_shown", (_known_secrets, len(_known_secrets), shown))
        return shown

    def message(self) -> str:
        """One line: ``host: field = value: rule. Fix: fix [source]`` (no newline inside).

        Built when first asked for and kept while the registered secrets stay the same (the
        plan's warnings and the printed line ask twice); a secret registered later
        makes the next call build (and scrub) it again."""
        cached = self.__dict__.get("_message")
        if cached is not None and cached[0] is _known_secrets and cached[1] == len(_known_secrets):
            return cached[2]
        # the host is scrubbed apart (a token-shaped name is still redacted): scrubbing
        # "monkey-01: field = ..." whole would read the host as a secret's name and eat the field
        where = f"{scrub(show_host(self.host))}: " if self.host else ""
        src = f" [{self.source}]" if self.source else ""
        text = (f"{shorten(self.field, 300)} = {self._shown_value()}: {shorten(self.rule, 2000)}. "
                f"Fix: {shorten(self.fix, 1000)}{src}")
        line = where + scrub(text).replace("\n", "\\n").replace("\r", "\\r")
        object.__setattr__(self, "_message", (_known_secrets, len(_known_secrets), line))
        return line

    def for_host(self, host: str) -> Finding:
        """This finding about ``host`` instead: every other field as it is (the value is not redacted
        again, as ``dataclasses.replace`` would; its shown form kept), the message built anew when asked for
        (:mod:`~.shared`: hosts with the same deployment share one validation)."""
        other = object.__new__(Finding)
        fields = dict(self.__dict__)
        fields.pop("_message", None)
        fields["host"] = host
        object.__setattr__(other, "__dict__", fields)
        return other

    def as_dict(self) -> dict[str, Any]:
        """The finding as JSON-safe data (value shortened, secrets scrubbed)."""
        d = asdict(self)
        d["value"] = _jsonable(self.value)
        d["host"] = show_host(self.host) if self.host else ""
        for k in ("field", "rule", "fix", "source"):
            d[k] = scrub(shorten(str(d[k]), 2000))
        return d


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        return shorten(scrub(v))
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {shorten(str(k)): _jsonable(x) for k, x in v.items()}
    return shorten(scrub(repr(v)))


@dataclass
class ConfigError(Exception):
    """Raised when a deployment config breaks one or more rules (exit code 2)."""

    findings: list[Finding] = field(default_factory=list)

    def __str__(self) -> str:
        return "\n".join(f.message() for f in self.findings)


RULE_FIX_SEP = " | fix: "
"""Custom pydantic validators raise ``ValueError(rule + RULE_FIX_SEP + fix)``."""


def findings_from_validation_error(
    exc: ValidationError, host: str, prefix_of: dict[str, str]
) -> list[Finding]:
    """Turn pydantic's errors into findings with inventory field paths.

    Args:
        exc: the pydantic error.
        host: inventory host name.
        prefix_of: maps the model's top-level field name to its inventory variable
            (``speculative`` -> ``ddtree_speculative``).
    """
    out: list[Finding] = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ())]
        if loc:
            loc[0] = prefix_of.get(loc[0], loc[0])
        path = ".".join(loc) or "<deployment>"
        msg = str(err.get("msg", ""))
        for pfx in ("Value error, ", "Assertion failed, "):
            if msg.startswith(pfx):
                msg = msg[len(pfx):]
        if RULE_FIX_SEP in msg:
            rule, fix = msg.split(RULE_FIX_SEP, 1)
        elif err.get("type") == "extra_forbidden":
            rule, fix = "unknown setting", "remove it or check its spelling against the documented fields"
        elif err.get("type") == "missing":
            rule, fix = "this setting is required", "set it in group_vars or host_vars"
        else:
            rule, fix = msg, "give a value of the documented type and range"
        value = err.get("input") if err.get("type") != "missing" else None
        if path.startswith(prefix_of.get("hf_token", "hf_token")):
            value = REDACTED
        elif isinstance(value, dict) and path.endswith(".env"):
            # an environment map is refused as a whole for one bad name: show its names, never its
            # values (a name the secret check misses, e.g. lower-case "tokens", may hold a secret)
            value = dict.fromkeys(value, REDACTED)
        out.append(Finding("error", path, value, rule, fix, host=host))
    return out


_TOKEN_SHAPES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    # hf_ and api_org_ tokens of the issued length are recognised glued to whatever stands before them (xhf_...,
    # an ANSI escape's last letter "\x1b[2Jhf_...", m-hf_..., x_hf_...); shorter ones below not after "_" (my_hf_Short1)
    (re.compile(r"hf_[A-Za-z0-9]{20,}"), "a Hugging Face token (hf_...)", "hf_"),
    (re.compile(r"api_org_[A-Za-z0-9]{20,}"), "a Hugging Face organization token (api_org_...)",
     "api_org_"),
    (re.compile(r"(?<![A-Za-z0-9_-])gh[pousr]_[A-Za-z0-9]{30,}"), "a GitHub token (ghp_...)", "gh"),
    (re.compile(r"(?<![A-Za-z0-9_-])github_pat_[A-Za-z0-9_]{20,}"), "a GitHub token (github_pat_...)", "github_pat_"),
    (re.compile(r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}"), "an API secret key (sk-...)", "sk-"),
    (re.compile(r"(?<![A-Za-z0-9_-])xox[abposr]-[A-Za-z0-9-]{10,}"), "a Slack token (xox...)", "xox"),
    (re.compile(r"(?<![A-Za-z0-9_-])glpat-[A-Za-z0-9_-]{20,}"), "a GitLab token (glpat-...)", "glpat-"),
    (re.compile(r"(?<![A-Z0-9])AKIA[A-Z0-9]{16}(?![A-Z0-9])"), "an AWS access key id (AKIA...)", "AKIA"),
    (re.compile(r"(?<![A-Z0-9])ASIA[A-Z0-9]{16}(?![A-Z0-9])"), "an AWS temporary access key id (ASIA...)", "ASIA"),
    (re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
     "a JSON Web Token (eyJ...)", "eyJ"),
    (re.compile(r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[^-]{0,8192}(?:-----END [A-Z ]{0,40}PRIVATE KEY-----)?"),
     "a private key (PEM)", "-----BEGIN"),
    # shorter than the issuers' lengths above (a truncated, test or canary token): the prefix and 6+ characters
    # with a digit or an upper-case letter, so prefixed words (hf_transfer, sk-learn) stay
    (re.compile(r"(?:(?<!_)hf_|(?<![A-Za-z0-9_-])(?:api_org_|gh[pousr]_|github_pat_|sk-|xox[abposr]-|glpat-))"
                r"(?=[a-z_-]{0,63}[0-9A-Z])[A-Za-z0-9_-]{6,}"),
     "a token-shaped secret (a token issuer's prefix: hf_, sk-, ghp_, ...)", "hf_"),  # its prefixes: the rows above
)
"""Shapes of bare access tokens by their issuers' published prefixes: Hugging Face User Access
Tokens (``hf_`` + 34 letters/digits, huggingface.co/docs/hub/security-tokens), GitHub
(``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``, ``github_pat_``: docs.github.com "About
authentication", token formats), OpenAI/Anthropic-style ``sk-`` keys, Slack ``xox?-`` and AWS
access key ids; JSON Web Tokens (``eyJ`` header.payload.signature, RFC 7519) and PEM private
keys (RFC 7468 ``-----BEGIN ... PRIVATE KEY-----``); and, by the same prefixes, shorter values with a
digit or an upper-case letter (``hf_CANARYnewcomer3xyz``: a test or truncated token is still one).
One table: :func:`scrub` redacts them, :func:`looks_like_token` refuses them where values land in
files or argv."""

_TOKEN_SHAPE = re.compile("|".join(f"(?:{shape.pattern})" for shape, _, _ in _TOKEN_SHAPES))
"""All of :data:`_TOKEN_SHAPES` in one regex: :func:`scrub` redacts such a token wherever it
stands (a bare token in a log line, a resolver's stderr). Each alternative starts only at the start
of a run of token characters (linear time on ``sk-sk-sk-...``)."""
_TOKEN_PREFIXES = tuple(dict.fromkeys(prefix for _, _, prefix in _TOKEN_SHAPES))
"""Substrings one of which every :data:`_TOKEN_SHAPE` match holds (a cheap test before the regex)."""


def looks_like_token(value: str) -> str | None:
    """What kind of bare access token ``value`` holds (e.g. ``"a Hugging Face token (hf_...)"``),
    or None: :data:`_TOKEN_SHAPES` anywhere in the text. Used to refuse such values where they
    would land in world-readable files or the process list (``ddtree_service.env`` values,
    ``ddtree_model.revision``)."""
    if not isinstance(value, str):
        return None
    for shape, kind, _ in _TOKEN_SHAPES:
        if shape.search(value):
            return kind
    return None
