"""The strict JSON (RFC 8259) parser of every JSON document ddtree-ops takes from a user
(plan.json, a checkpoint's config files), standard library only. Each caller words its
own refusals (:class:`Words`); the rules are one:

* no ``NaN``/``Infinity`` (:func:`json.loads` accepts them; RFC 8259 section 6 has none);
* no duplicate key in one object (RFC 8259 section 4: "names within an object SHOULD be
  unique"; parsers disagree on which one wins);
* integer literals of at most ``max_int_digits`` digits (and of magnitude below ``max_int``
  where given), so Python's int-string limit and float overflow never fire in a consumer;
* floats finite (a literal such as ``1e999`` overflows to infinity).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class StrictJSONError(ValueError):
    """A literal or object a hook refused; ``str()`` is the caller's wording (:class:`Words`)."""


@dataclass(frozen=True)
class Words:
    """One caller's limits and messages.

    Attributes:
        max_int_digits: the longest integer literal (digits, sign aside).
        long_int: the message of a longer one, given its digit count.
        not_finite: the message of a float literal that overflows, given the literal.
        constant: the message of ``NaN``/``Infinity``/``-Infinity``, given the word.
        duplicate: the message of a repeated key, given the key.
        max_int: integers must satisfy ``-max_int < x < max_int`` (None: no bound beyond the digits).
        big_int: the message of an integer out of that range, given the integer.
    """

    max_int_digits: int
    long_int: Callable[[int], str]
    not_finite: Callable[[str], str]
    constant: Callable[[str], str]
    duplicate: Callable[[str], str]
    max_int: int | None = None
    big_int: Callable[[int], str] | None = None


def loads(text: str, words: Words) -> Any:
    """``text`` parsed under the rules of the module docstring.

    Raises:
        StrictJSONError: a refused literal or key (the message from ``words``).
        json.JSONDecodeError, RecursionError, ValueError: as :func:`json.loads` raises them
            (the caller words them).
    """

    def integer(s: str) -> int:
        digits = len(s.lstrip("-"))
        if digits > words.max_int_digits:
            raise StrictJSONError(words.long_int(digits))
        x = int(s)
        if words.max_int is not None and not -words.max_int < x < words.max_int:
            raise StrictJSONError(words.big_int(x) if words.big_int else words.long_int(digits))
        return x

    def real(s: str) -> float:
        x = float(s)
        if not math.isfinite(x):
            raise StrictJSONError(words.not_finite(s))
        return x

    def constant(s: str) -> Any:
        raise StrictJSONError(words.constant(s))

    def obj(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for k, v in pairs:
            if k in doc:
                raise StrictJSONError(words.duplicate(k))
            doc[k] = v
        return doc

    return json.loads(text, parse_int=integer, parse_float=real, parse_constant=constant, object_pairs_hook=obj)
