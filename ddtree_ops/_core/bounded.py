"""Bounded reads of files a user hands ddtree-ops (standard library only)."""

from __future__ import annotations

import os
import re

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(rb"[^\[\]{}]+")


def read_at_most(fd: int, limit: int) -> bytes:
    """Up to ``limit`` bytes from ``fd``'s current offset to its end, read in 1 MiB chunks (the
    bounded read of every file ddtree-ops takes from a user: plan.json, checkpoint configs, the
    logs ``diagnose`` reads). Raises OSError as ``os.read`` does."""
    chunks: list[bytes] = []
    while limit > 0:
        chunk = os.read(fd, min(limit, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        limit -= len(chunk)
    return b"".join(chunks)


def depth(data: bytes, stop_after: int) -> int:
    """Deepest nesting of ``[``/``{`` in JSON text ``data`` (strings skipped), stopping early
    once past ``stop_after``; a flat scan, no recursion."""
    brackets = _NOT_BRACKET.sub(b"", _STRING.sub(b"", data))
    d = deepest = 0
    for c in brackets:
        d = d + 1 if c in b"[{" else d - 1
        if d > deepest:
            deepest = d
            if deepest > stop_after:
                break
    return deepest
