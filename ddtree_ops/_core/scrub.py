"""The one secret scrubber and one-line cleaner, standard library only: the preflight zipapp carries
it onto a GPU host before ddtree-ops and pydantic are installed, every host-side reader of text a program
printed (logs, command output) uses it, and ``ddtree_ops.config.errors`` re-exports it for findings.

It knows the registered secrets (:func:`register_secret`: vault plaintexts, ``ddtree_hf_token``), the token
shapes of the issuers (:data:`_TOKEN_SHAPES`), URL user info, HTTP authorization credentials, secret-looking
query parameters and the value after a secret-looking name (:data:`SECRET_NAME`, :data:`_NAMED_VALUE`).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Any

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

    - URL credentials (the whole user info of any URL up to its last ``@``, ``scheme://user:p@ss@`` ->
      ``scheme://(redacted)@``, when it holds a password or reads as a token; ``ssh://git@host`` stays),
      HTTP authorization credentials (``Bearer X``), secret-looking query parameters (``?access_token=X``);
    - well-known token formats wherever they stand (:data:`_TOKEN_SHAPE`: ``hf_...``, ``sk-...``,
      ``ghp_...``, ``github_pat_...``, ``xoxb-...``, ``glpat-...``, ``npm_...``, ``AIza...``, AWS key ids,
      JWTs, PEM private keys, Slack webhook paths);
    - the value after a NAME that looks secret (:func:`is_secret_name`) in the shapes of
      :data:`_NAMED_VALUE`: ``NAME=value``, ``NAME = value``, ``export NAME="value"``,
      ``api_key='value'`` (a Python repr), ``"hf_token": "value"`` (JSON), ``NAME: value``,
      ``--api-key value`` (an argv flag and its value), ``"client_secret": ["X", "Y"]`` (every item of a
      list); a plain lower-case word before ``:`` or an identifier before a space (``token: X``,
      ``HF_TOKEN X``) redacts only a token-like value (:func:`_token_like`), so prose (``a secret: it``,
      ``primary key: id``) stays readable, as do a plain word after a flag in a sentence (``--api-key is
      required``) and a number under a name whose last word is no secret word (``token_budget: 2048``).

    A terminal escape sequence (:data:`ESCAPES`: a coloured log line) separates words: the text between
    escapes is scrubbed piece by piece, so ``\x1b[31mBearer X`` is ``Bearer X`` after an escape, not the
    word ``mBearer``; the escapes are kept for the printer to strip, their own text scrubbed too (an OSC 8
    link or OSC 52 clipboard string can hold a URL with a password).

    Zero-width and other invisible format characters, and compatibility forms (fullwidth ``ｈｆ＿``), do
    not hide a token: the token shapes are also matched on the NFKC-folded text without format characters,
    and the original span of each match is redacted (:func:`_redact_folded_tokens`).

    Every pattern runs in time linear in ``len(text)`` (``tests/test_scrub.py`` times 1 MB lines)."""
    if "\x1b" in text or "\x9b" in text or "\x90" in text or "\x98" in text or "\x9d" in text \
            or "\x9e" in text or "\x9f" in text:
        return "".join(_scrub_plain(part) for part in _ESCAPE_SPLIT.split(text))
    return _scrub_plain(text)


scrub_text = scrub
"""The name host-side readers and the preflight zipapp know it by."""

ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI (colours, cursor, clear screen)
    r"|\x1b[\]PX^_][\s\S]*?(?:\x07|\x1b\\|\x9c|\Z)"  # OSC (titles, OSC 8 links, OSC 52 clipboard), DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # every other escape sequence (ECMA-48 nF/Fp/Fe/Fs)
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|[\x90\x98\x9d\x9e\x9f][\s\S]*?(?:\x07|\x1b\\|\x9c|\Z)"  # 8-bit OSC/DCS/SOS/PM/APC strings
)
"""Terminal escape sequences (ECMA-48 / ISO 6429: CSI, OSC and the other string and two-byte sequences,
7- and 8-bit forms); a string sequence without its terminator runs to the end, as a terminal swallows
it. The one escape table: :func:`scrub` splits text at them, :func:`clean_text` and
:func:`strip_controls` remove them."""
_ESCAPE_SPLIT = re.compile(f"({ESCAPES.pattern})")
""":data:`ESCAPES` in one capture group: ``re.split`` keeps them at the odd indexes."""

CONTROL_CHARS = ("\x00-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064"
                 "\u2066-\u2069\ufeff\ufff9-\ufffb")
"""The one control table, as the body of a character class: C0/C1 control characters (tabs and newlines
too) and the invisible or reordering Unicode format characters (soft hyphen, Arabic letter mark,
Mongolian vowel separator, zero-width spaces and joiners, bidi marks, line/paragraph separators, bidi
embeddings, overrides (U+202E reverses what a terminal shows after it) and isolates, word joiner and
invisible operators, the BOM, interlinear annotation) that make a terminal show other text than there is."""
CONTROL_CHAR = re.compile(f"[{CONTROL_CHARS}]")
"""One character of :data:`CONTROL_CHARS`."""
_CONTROL_RUN = re.compile(f"[{CONTROL_CHARS}]+")
_CONTROL_BUT_NEWLINE = re.compile(f"(?:(?!\\n)[{CONTROL_CHARS}])+")


def clean_text(text: object) -> str:
    """``text`` as one line safe to print and keep: secrets redacted (:func:`scrub`), terminal escape
    sequences removed (:data:`ESCAPES`), every run of control and invisible format characters
    (:data:`CONTROL_CHARS`, newlines too) one space. Scrubbed before the cleaning (a zero-width
    character inside a token prefix is still seen) and again after it when the cleaning changed the
    text (removing an escape can join the two halves of a token)."""
    text = scrub(str(text))
    cleaned = _CONTROL_RUN.sub(" ", ESCAPES.sub("", text))
    return cleaned if cleaned == text else scrub(cleaned)


def strip_controls(text: str) -> str:
    """``text`` without terminal escapes (:data:`ESCAPES`) and with every run of control characters
    but newlines (:data:`CONTROL_CHARS`: tabs and the like too) one space, newlines kept: the log
    reader's cleaning (``diagnose``). It does not scrub; callers that print scrub it before and after
    (``config.errors.one_line``), so a format character inside a token does not split it unseen."""
    if "\x1b" in text or not text.isascii():
        text = ESCAPES.sub("", text)
    return _CONTROL_BUT_NEWLINE.sub(" ", text)


def _scrub_plain(text: str) -> str:
    """:func:`scrub` of a text without terminal escapes (or of one escape sequence)."""
    for s in _secrets_longest_first():
        if s in text:
            text = text.replace(s, REDACTED)
    text = _redact_folded_tokens(text)
    if "://" in text:  # (a cheap test first: most texts hold no URL and no scheme word)
        text = _URL_USERINFO.sub(_redact_userinfo, text)
    lower = text.lower() if text.isascii() else None
    if lower is None or any(w in lower for w in _AUTH_WORDS):
        text = _AUTH_SCHEME.sub(_redact_auth, text)
    text = _SECRET_QUERY.sub(lambda m: f"{m['pre']}{REDACTED}", text)
    if any(p in text for p in _TOKEN_PREFIXES):
        text = _TOKEN_SHAPE.sub(REDACTED, text)
    if lower is not None and not any(w in lower for w in _SECRET_WORDS):
        return text  # no secret-looking name in an ASCII text
    return _redact_named_values(text)


_FOLD_NEEDED = re.compile(f"[{CONTROL_CHARS}\u3000-\u303f\uff00-\uffef]")
"""Characters after which a text is folded even when it is NFKC-normalized already (format characters;
the fullwidth and CJK-symbol blocks, cheap to test)."""


class _FoldTable(dict):
    """``str.translate`` table, filled as characters are met: a format or control character (beyond ASCII)
    to nothing, any other character to its NFKC form (``ｈ`` -> ``h``); ASCII to itself."""

    def __missing__(self, code: int) -> int | str:
        ch = chr(code)
        if code < 0x80:
            folded: int | str = code
        elif CONTROL_CHAR.match(ch):
            folded = ""
        else:
            nfkc = unicodedata.normalize("NFKC", ch)
            folded = code if nfkc == ch else nfkc
        if len(self) < 65536:  # (bounded: a text of every code point does not grow it without end)
            self[code] = folded
        return folded


_FOLD = _FoldTable()


def _redact_folded_tokens(text: str) -> str:
    """``text`` with every token shape (:data:`_TOKEN_SHAPE`) that appears once its compatibility
    characters are folded (NFKC: fullwidth ``ｈｆ＿`` is ``hf_``) and its format characters dropped
    (``h\u200bf_...`` is ``hf_...``) redacted in its original span. A text that NFKC leaves as it is and
    that holds no format character is returned as it is, unread; the folding is one ``str.translate``, and
    the character-by-character map back to the original is built only when a token was found."""
    if text.isascii() or (_FOLD_NEEDED.search(text) is None and unicodedata.is_normalized("NFKC", text)):
        return text
    flat = text.translate(_FOLD)
    found = [m.span() for m in _TOKEN_SHAPE.finditer(flat) if m.end() > m.start()]
    if not found:
        return text
    origin: list[int] = []  # origin[i]: the index in text of folded character i
    for i, ch in enumerate(text):
        folded = _FOLD[ord(ch)]
        origin.extend([i] * (1 if isinstance(folded, int) else len(folded)))
    out, pos = [], 0
    for fstart, fend in found:
        start, end = origin[fstart], origin[fend - 1] + 1
        if start >= pos:
            out.append(text[pos:start])
            out.append(REDACTED)
            pos = end
    out.append(text[pos:])
    return "".join(out)


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
    if m["list"] is not None:
        return _redact_named_list(m)
    quoted = m["vq"] is not None
    value = m["qvalue"] if quoted else m["value"]
    identifier = _IDENTIFIER_CHAR.search(name) is not None or bool(m["nq"])
    if "=" in sep:
        strong = True
    elif ":" in sep:  # "NAME: value" redacts any value only for identifiers (hf_token, X_API_KEY, a JSON key)
        # "password: hunter" is never prose; "password: --vault-password-file FILE" names a flag
        strong = identifier or (_PASSWORD_WORD.fullmatch(name) is not None and not value.startswith("-"))
    elif not identifier:  # "word value": prose
        return None
    elif name.startswith("--"):  # "--api-key VALUE": an argv flag takes the next word, unless that is a flag
        if value.startswith("-") or (not quoted and _flag_in_prose(m, value)):
            return None
        strong = True
    else:  # "HF_TOKEN VALUE"
        strong = False
    if not is_secret_name(name) or not (strong or _token_like(value)):
        return None
    if not quoted and _QUANTITY.fullmatch(value) and not _ends_in_secret_word(name):
        return None  # "token_budget: 2048", "key_size=4096": a number under a name the secret word only qualifies
    if not quoted and value.lower() in _AUTH_WORDS and _REDACTED_NEXT.match(m.string, m.end()):
        return None  # "token: Bearer (redacted)": the scheme word is no secret, its credential is gone already
    start, end = m.span("qvalue" if quoted else "value")
    return m[0][: start - m.start()] + REDACTED + m[0][end - m.start():]


_IDENTIFIER_CHAR = re.compile(r"[_.A-Z-]")
"""A name holding one of these is an identifier (``hf_token``, ``X_API_KEY``), not a word of prose."""

_REDACTED_NEXT = re.compile(r"\s+\(redacted\)")
"""What follows a scheme word whose credential is redacted already (matched at a position: no copy of the
rest of the text, which made ``'Bearer ' * n`` cost n^1.5)."""

_QUANTITY = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?")
"""A plain number: a count, size or budget (``token_budget: 2048``), unless the name ends in a secret word."""

_PROSE_WORD = re.compile(r"[a-z]{1,23}")
_PROSE_BEFORE_FLAG = re.compile(r"(?:^|[\s(])[a-z]{1,23}[ \t]+\Z")
_PROSE_AFTER = re.compile(r"[ \t]+[A-Za-z]|[ \t]*(?:[.,;:!?)]|\Z)")


def _flag_in_prose(m: re.Match[str], value: str) -> bool:
    """Whether ``--api-key WORD`` is prose about the flag, not argv: WORD is a plain lower-case word
    (:func:`credential_shaped` says no) and another word follows it (``--api-key is required``), or it
    ends the sentence after a flag that a word stands before (``use the --api-key flag``). In argv the
    next word is a flag or nothing (``--admin-api-key sekritadmin --host 0.0.0.0`` stays redacted)."""
    if _PROSE_WORD.fullmatch(value) is None or credential_shaped(value):
        return False
    after = _PROSE_AFTER.match(m.string, m.end())
    if after is None:
        return False
    if after[0][-1:].isalpha():
        return True  # another word follows
    return _PROSE_BEFORE_FLAG.search(m.string, max(0, m.start() - 32), m.start()) is not None


def _ends_in_secret_word(name: str) -> bool:
    """Whether the last word of ``name`` is itself a secret word (``DB_PASSWORD``, ``api_key``; not
    ``token_budget``, ``key_size``)."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name) if w]
    return bool(words) and _is_secret_name(words[-1])


_LIST_ITEM = re.compile(r"(?!\(redacted\))[^\s,\[\]{}()\\\"']+")
"""A word inside a list (a JSON/YAML/Python item, bare or quoted)."""


def _redact_named_list(m: re.Match[str]) -> str | None:
    """``"client_secret": ["X", "Y"]``: a list under a secret-looking name has every item redacted
    (quotes and commas kept, so the count stays readable); under a plain word before ``:`` or a space
    (``keys: [a, b]``) only token-like items. ``"tokens": [...]`` is no secret name (a count list)."""
    name, sep = m["name"], m["sep"]
    if not is_secret_name(name) or not sep.strip():
        return None
    identifier = _IDENTIFIER_CHAR.search(name) is not None or bool(m["nq"])
    strong = "=" in sep or identifier or _PASSWORD_WORD.fullmatch(name) is not None
    items = m["list"]
    redacted = _LIST_ITEM.sub(lambda i: REDACTED if strong or _token_like(i[0]) else i[0], items)
    if redacted == items:
        return None
    return m[0][: m.start("list") - m.start()] + redacted


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


URL_CREDENTIALS = re.compile(r"(?P<pre>(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s/?#@:'\"]*)"
                             r":(?P<pw>[^\s/?#'\"]*)@")
"""``scheme://user:password@`` in a URL (RFC 3986 §3.2.1 userinfo; the password part is deprecated
there because it is shown wherever the URL is). The password runs to the last ``@`` of the authority
(an unencoded ``@`` in it, ``https://user:p@ss@host/``, is the password's, as URL parsers read it). A
scheme starts only where a run of scheme characters starts (linear time on ``a-a-a-...://``)."""

_URL_USERINFO = re.compile(r"(?<![A-Za-z0-9+.-])(?P<pre>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^\s/?#'\"]+)@")
"""The user info of a URL (RFC 3986 §3.2.1): everything between ``scheme://`` and the last ``@``
before the host's ``/``, ``?``, ``#`` or the end of the word (``https://user:p@ss@host/x``: the user
info is ``user:p@ss``)."""


def _userinfo_secret(user: str) -> bool:
    """Whether a URL's user info is a secret: it holds a password (``user:pass``), or it is a bare user
    that reads as a token (``https://TOKEN@host``: forges and proxies take a token as the user name;
    :func:`looks_like_token` or :func:`credential_shaped`). A plain user name (``ssh://git@github.com``,
    ``ftp://anonymous@host``) is no secret and stays readable."""
    return ":" in user or looks_like_token(user) is not None or credential_shaped(user)


def _redact_userinfo(m: re.Match[str]) -> str:
    return f"{m['pre']}{REDACTED}@" if _userinfo_secret(m["user"]) else m[0]


_AUTH_SCHEME = re.compile(
    r"(?i)\b(?P<scheme>bearer|basic|token|digest|apikey)(?P<sep>\s+)(?P<cred>[A-Za-z0-9._~+/=-]{4,})"
)
"""An HTTP ``Authorization`` credential (RFC 9110 §11.4: ``Bearer TOKEN``, ``Basic B64``); the scheme
words are also English (``a 1-token generation``, ``paste the token here``), so only a credential-shaped
word after one is redacted (:func:`credential_shaped`) unless an ``Authorization`` header stands before it."""

_AUTH_HEADER = re.compile(r"(?i)(?:authori[sz]ation|[a-z0-9_-]*(?:token|auth|key|secret|credentials?|bearer))\Z")
"""The word before the ``:`` or ``=`` (and quotes, spaces) before a scheme word: an ``Authorization:`` header
(or ``authorization=``), or a header-ish key
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
    head = m.string[max(0, m.start() - 40):m.start()].rstrip(" \t\"'")
    header = False
    if head.endswith((":", "=")):  # (tested first, and the regex sees one word: 'token: Bearer ' * n stays cheap)
        key = head[:-1].rstrip(" \t\"'").rsplit(None, 1)
        header = bool(key) and _AUTH_HEADER.search(key[-1]) is not None
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
    if any(_userinfo_secret(m["user"]) for m in _URL_USERINFO.finditer(value)):
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
    r"|(?P<value>(?!\(redacted\))[^\s'\",;{}\[\]()\\…]+)"
    r"|(?P<list>\[[^\[\]]*\]?))")
"""A NAME and its value in echoed text: ``NAME=value`` (an env line), ``NAME = value``, ``NAME: value``
(YAML), ``export NAME="value"`` (shell), ``name='value'`` (a Python repr, as SGLang prints its
``ServerArgs``), ``"name": "value"`` (JSON, also with JSON-escaped quotes ``\\"``), ``--name value``
(argv). NAME is a whole run of ``[A-Za-z0-9_.-]`` (the look-behind: a match starts only where a run
starts, so every run is tried once and a 1 MB line costs linear time); :func:`_redact_named`
decides which matches are secrets. The look-ahead skips runs holding none of :data:`_SECRET_WORDS`
(no name without one is secret). A quoted value runs to its closing quote, JSON escapes
(``\\n`` of a PEM key) included: inside ``"..."`` an escaped quote ``\\"`` is part of the value; a value
opened by an escaped quote (JSON inside a JSON string) ends at the next escaped quote. Also ``name => value``
(Perl/Ruby hashes), Python bytes/raw reprs (``api_key=b'value'``) and a list value
(``"client_secret": ["X"]``: up to the closing ``]`` or the next ``[``, so list scans never overlap)."""






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
    # npm: "npm_" and 36 base62 characters (30 random, a 6-character CRC32 checksum), the GitHub token format
    # (github.blog/2021-09-23-announcing-npms-new-access-token-format)
    (re.compile(r"(?<![A-Za-z0-9_-])npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])"), "an npm access token (npm_...)", "npm_"),
    # Google API keys: "AIza" and 35 of [0-9A-Za-z_-] (39 in all; Microsoft Purview's "Google API key"
    # sensitive information type, learn.microsoft.com/purview/sit-defn-google-api-key)
    (re.compile(r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])"), "a Google API key (AIza...)", "AIza"),
    # Slack incoming webhooks: https://hooks.slack.com/services/T<workspace>/B<hook>/<secret> (the URL is the
    # credential, api.slack.com/messaging/webhooks); the path after services/ goes, the host stays readable
    (re.compile(r"(?<=hooks\.slack\.com/services/)T[A-Za-z0-9]{4,}/B[A-Za-z0-9]{4,}/[A-Za-z0-9]{8,}"),
     "a Slack webhook URL (hooks.slack.com/services/...)", "hooks.slack.com/services/"),
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
authentication", token formats), OpenAI/Anthropic-style ``sk-`` keys, Slack ``xox?-`` tokens and
webhook URLs, GitLab ``glpat-``, npm ``npm_``, Google ``AIza`` API keys and AWS access key ids; JSON Web
Tokens (``eyJ`` header.payload.signature, RFC 7519) and PEM private
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


