"""Which characters an environment value may hold: the one rule for every value written to an
``EnvironmentFile=`` (``sglang.env``, ``secrets.env``) and for the inventory variables that
become one (``ddtree_secret_env``; ``ddtree_service.env`` is narrower still: argv-safe ASCII).

Refused, by Unicode general category (Python's :func:`unicodedata.category`):

- ``Cc`` control characters: C0 (newline, tab, ESC ...), DEL and the C1 range ``\\x80-\\x9f``.
  systemd.exec(5) reads ``EnvironmentFile=`` line by line, so a newline starts a new
  assignment; C1 characters such as ``\\x9b`` (CSI) are terminal escape introducers when the
  file, a journal line or a diff is shown.
- ``Zl`` / ``Zp``: U+2028 LINE SEPARATOR and U+2029 PARAGRAPH SEPARATOR. systemd does not end
  a line there, but Python's ``str.splitlines``, JavaScript and many editors do, so the file one
  reader sees as one assignment another sees as two.
- ``Cf`` format characters (U+200B zero width space, U+202E right-to-left override, U+FEFF
  byte order mark, soft hyphen ...): invisible or reordering, they make a value look other than
  it is (a secret that differs from the one pasted, a line that reads backwards), and no key,
  token or setting needs one.
- ``Cs`` lone surrogates (YAML ``"\\ud800"``): not encodable as UTF-8, the file could not be written.

Everything else (other letters, symbols, spaces) is allowed and quoted by the writer.
"""

from __future__ import annotations

import unicodedata

REFUSED_CATEGORIES = {
    "Cc": "a control character",
    "Cf": "an invisible format character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Cs": "a lone surrogate",
}
"""General categories no environment value may hold, and what each is called in a message."""


def env_char_problem(value: str) -> str | None:
    """Why ``value`` cannot be an environment value (None: it can): names the first refused
    character by code point and category, never the value itself (it may be a secret)."""
    for i, c in enumerate(value):
        cat = unicodedata.category(c)
        if cat in REFUSED_CATEGORIES:
            return (f"holds {REFUSED_CATEGORIES[cat]} (U+{ord(c):04X}, Unicode category {cat}) at offset {i}; "
                    "environment values may not hold control, format or line/paragraph separator characters")
    return None
