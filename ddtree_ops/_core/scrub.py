"""The standard-library secret scrubber and one-line cleaner: the preflight zipapp's (it runs on
a GPU host before ddtree-ops and pydantic are installed) and every host-side reader's of
text a program printed (logs, command output). The full install adds
:func:`ddtree_ops.config.errors.scrub` on top (it also knows the registered vault values).
"""

from __future__ import annotations

import re

_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI (colours, cursor, clear screen)
    r"|\x1b[\]PX^_][\s\S]*?(?:\x07|\x1b\\|\x9c|\Z)"  # OSC (titles, OSC 8 links, OSC 52 clipboard), DCS, SOS, PM, APC
    r"|\x1b[ -/]*[0-~]?"  # every other escape sequence (ECMA-48 nF/Fp/Fe/Fs)
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|[\x90\x98\x9d\x9e\x9f][\s\S]*?(?:\x07|\x1b\\|\x9c|\Z)"
)  # 8-bit OSC/DCS/SOS/PM/APC strings
"""Terminal escape sequences (ECMA-48 / ISO 6429: CSI, OSC and the other string and two-byte
sequences, 7- and 8-bit forms); a string sequence without its terminator runs to the end."""
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069\ufeff]+")
"""C0/C1 control characters (newlines too: a detail is one line) and the invisible or
reordering format characters (zero-width, line/paragraph separators, bidi embeddings and
isolates, BOM) that make a terminal show other text than there is."""

_SECRET_WORD = re.compile(r"[a-z0-9]*(token|key)|pass(?:wd|words?|phrases?)?[0-9]*|[a-z0-9]*secrets?[a-z0-9]*"
                          r"|credentials?|auth[a-z0-9]*|pat|bearer|cookies?|salt|jwt|signature", re.IGNORECASE)
"""A word of a secret-looking name: the rule of ``ddtree_ops.config.errors.SECRET_NAME``, repeated
here because the zipapp cannot import that module (it needs pydantic)."""
_SCRUB_SHAPES = (
    # URL user info (RFC 3986 3.2.1): scheme://user:pass@ or scheme://TOKEN@
    (re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#@'\"]+@"), lambda m: f"{m[1]}(redacted)@"),
    # HTTP authorization credentials (RFC 9110 11.4): Bearer X, Basic X, Token X, Digest X; the scheme words are
    # English too ("a 1-token generation"), so only a credential-shaped word goes (see _auth_credential)
    (re.compile(r"(?i)\b(bearer|basic|token|digest|apikey)(\s+)([A-Za-z0-9._~+/=-]{4,})"),
     lambda m: _auth_credential(m)),
    # secret-looking query parameters: ?access_token=X, &sig=X
    (re.compile(r"(?i)([?&;][A-Za-z0-9_.-]*(?:token|key|secret|sig|signature|password|passwd|auth|credential|session)"
                r"[A-Za-z0-9_.-]*=)[^&#\s'\"]+"), lambda m: f"{m[1]}(redacted)"),
    # tokens recognisable by their prefix: Hugging Face hf_, GitHub ghp_/gho_/ghs_/github_pat_, OpenAI sk-, Slack xox?-
    # (an issued length, or 6+ characters with a digit or a capital: hf_transfer, sk-learn stay)
    (re.compile(r"\b(?:hf_|gh[opsur]_|github_pat_|sk-|xox[abposr]-)"
                r"(?:[A-Za-z0-9_-]{20,}|(?=[a-z_-]{0,63}[0-9A-Z])[A-Za-z0-9_-]{6,})"), lambda m: "(redacted)"),
    # hf_ glued to the text before it (xhf_..., an escape's last letter, m-hf_...): the rule of
    # ddtree_ops.config.errors._TOKEN_SHAPES (issued length after anything, 6+ characters with a digit or a
    # capital not after "_")
    (re.compile(r"hf_[A-Za-z0-9]{20,}|(?<!_)hf_(?=[a-z_-]{0,63}[0-9A-Z])[A-Za-z0-9_-]{6,}"), lambda m: "(redacted)"),
)
_NAMED = re.compile(r"(?P<name>[A-Za-z_-][A-Za-z0-9_.-]*)(?P<q>[\"']?)(?P<sep>[ \t]*[=:][ \t]*)(?P<vq>[\"']?)"
                    r"(?P<value>[^\s'\",;{}\[\]()]+)")
"""``NAME=value``, ``NAME: value``, ``"name": "value"``, ``name='value'`` (a Python repr),
``--flag=value``: the value is redacted when a word of NAME is secret-looking (``HF_TOKEN = X``,
``api_key='X'``, ``export OPENAI_API_KEY="X"``)."""
_FLAG_VALUE = re.compile(
    r"(?<![A-Za-z0-9_.-])(?P<name>--?[A-Za-z][A-Za-z0-9_-]*)(?P<sep>[ \t]+)(?P<q>[\"']?)(?P<value>[^\s'\"-][^\s'\"]*)"
)
"""``--flag value`` (argv as printed): the value is redacted when a word of the flag is
secret-looking (``--api-key X``, ``--hf-token X``); a flag starts a word (``a 1-token generation`` holds none)."""


_CREDENTIAL_SIGN = re.compile(r"[0-9+/=~_]|(?<=.)[A-Z]")
_AUTH_HEADER = re.compile(r"(?i)(?:authori[sz]ation|[a-z0-9_-]*(?:token|auth|key|secret|credentials?|bearer))"
                          r"[\"']?\s*[:=]\s*[\"']?\s*\Z")
_BEARER_PROSE = frozenset({"authentication", "authorization", "authorisation", "credential", "credentials",
                           "authenticated", "authorized", "authorised", "authenticates"})


def _auth_credential(m: re.Match) -> str:
    """An authorization scheme word and the word after it, that word redacted when it reads as a credential
    (a digit, one of ``+/=~_``, an upper-case letter after the first, or 24+ characters; after ``Bearer`` any
    word of 10+ characters but a few English ones) or when an ``Authorization:`` header or a header-ish secret
    key (``token: Bearer X``) stands before: the rule of ``ddtree_ops.config.errors._redact_auth``."""
    header = _AUTH_HEADER.search(m.string, max(0, m.start() - 40), m.start()) is not None
    bearer = m[1].lower() == "bearer" and len(m[3]) >= 10 and m[3].lower() not in _BEARER_PROSE
    if header or bearer or len(m[3]) >= 24 or _CREDENTIAL_SIGN.search(m[3]):
        return f"{m[1]}{m[2]}(redacted)"
    return m[0]


def _secret_name(name: str) -> bool:
    return any(_SECRET_WORD.fullmatch(w) for w in re.split(r"[^A-Za-z0-9]+", name) if w)


_SCHEME_WORDS = ("bearer", "basic", "token", "digest", "apikey")


def _redact_named(m: re.Match) -> str:
    if not _secret_name(m["name"]) or m["value"] == "(redacted)":
        return m[0]
    if m["value"].lower() in _SCHEME_WORDS and re.match(r"\s+\(redacted\)", m.string[m.end():]):
        return m[0]  # "token: Bearer (redacted)": the scheme word is no secret, its credential is gone already
    return m[0][:m.start("value") - m.start()] + "(redacted)"


def scrub_text(text: str) -> str:
    """``text`` with secret-looking values redacted, standard library only (the zipapp's own
    scrub): URL user info, HTTP authorization credentials, secret-looking query parameters,
    prefixed tokens (``hf_...``, ``ghp_...``, ``sk-...``) and the value of every name/value
    pair or ``--flag value`` whose name has a secret-looking word (:data:`_SECRET_WORD`)."""
    for rx, sub in _SCRUB_SHAPES:
        text = rx.sub(sub, text)
    return _FLAG_VALUE.sub(_redact_named, _NAMED.sub(_redact_named, text))




def clean_text(text: object) -> str:
    """``text`` as one line safe to print and keep: terminal escape sequences removed
    (:data:`_ESCAPES`), control and invisible format characters turned into one space
    (:data:`_CONTROLS`), secrets redacted (:func:`scrub_text`)."""
    return scrub_text(_CONTROLS.sub(" ", _ESCAPES.sub("", str(text))))


_ANSI = re.compile(r"\x1b\[[0-?]{0,32}[ -/]{0,8}[@-~]|\x1b\][^\x07\x1b]{0,512}(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
"""ECMA-48 CSI sequences (colours), OSC sequences (titles, links) and two-byte escapes."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064"
                      r"\u2066-\u2069\ufeff\ufff9-\ufffb]")
"""C0/C1 controls and the invisible Unicode format characters (soft hyphen, bidi marks, embeddings,
overrides and isolates such as U+202E, zero-width spaces and joiners, line/paragraph separators,
the BOM, interlinear annotation): echoed raw, U+202E reverses what a terminal shows after it."""


def strip_controls(text: str) -> str:
    """``text`` without ANSI escapes and control characters (tabs and the like become spaces;
    newlines kept): the log reader's cleaning (``diagnose``), before a scrub."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _CONTROL.sub(" ", text)
