"""How often, and how long, our tools may probe SGLang's ``/health`` without loading it.

SGLang's ``/health`` (and ``/health_generate``) is one handler that submits a real 1-token
generation and then looks for any answer of the detokenizer once a second for
``HEALTH_CHECK_TIMEOUT`` seconds (``int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20))``):
200 as soon as one came, 503 once the timeout passed
(``sglang/srt/entrypoints/http_server.py`` ``health_generate``, read off the 0.5.13.post1,
0.5.17 and 0.5.23 packages). A client that gives up does not stop it: the handler keeps
polling and the generation stays queued in the scheduler (sgl-project/sglang#35884). A
prober with a deadline shorter than SGLang's own therefore stacks generations on exactly the
server that is slow, and reads a slow-but-healthy answer (200 after 8 s) as not ready.

The rules every prober of ours follows (exporter, ``ddtree-ops health --wait``, the release
gate):

* its ``/health`` deadline outlasts SGLang's (:func:`probe_deadline_s`), so SGLang answers
  before we hang up;
* at most one ``/health`` in flight per server, and a new one starts no sooner than
  SGLang's timeout after the previous one started (:func:`min_probe_spacing_s`), so even a
  probe our side cut short has finished in SGLang before the next generation is queued;
* where the release has a flag-only readiness endpoint (``GET /ready``, 0.5.23:
  ``tokenizer_manager.is_ready()``, no generation; absent in 0.5.17 and 0.5.13.post1), the
  exporter reads that on every poll and runs the generating probe only at the spacing above
  (:func:`cheap_ready_path`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packaging.version import InvalidVersion, Version

HEALTH_CHECK_TIMEOUT_ENV = "SGLANG_HEALTH_CHECK_TIMEOUT"
"""SGLang's environment variable of its ``/health`` timeout (seconds, an integer)."""

DEFAULT_HEALTH_CHECK_TIMEOUT_S = 20
"""SGLang's default ``HEALTH_CHECK_TIMEOUT`` (``http_server.py``, 0.5.13.post1 .. 0.5.23)."""

HANDLER_STEP_S = 1.0
"""The handler sleeps this long between looks, so its 503 comes up to one step after the timeout."""

PROBE_SLACK_S = 2.0
"""Network, event-loop and local parsing time on top of SGLang's own bound."""

MAX_HEALTH_CHECK_TIMEOUT_S = 3600
"""Largest ``SGLANG_HEALTH_CHECK_TIMEOUT`` our probers honour (a bigger value is taken as this)."""

READY_ENDPOINT_SINCE = Version("0.5.23")
"""First pinned release seen with the flag-only ``GET /ready`` (0.5.23 ``http_server.py``; 0.5.17 has none)."""


def sglang_health_timeout_s(env: Mapping[str, Any] | None) -> int:
    """SGLang's ``/health`` timeout for a server started with ``env`` (its unit's environment).

    SGLang reads ``int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20))``; a value that is no
    positive integer gives the default here (SGLang itself would not start with a non-integer),
    one above :data:`MAX_HEALTH_CHECK_TIMEOUT_S` is capped at it.
    """
    raw = (env or {}).get(HEALTH_CHECK_TIMEOUT_ENV)
    try:
        value = int(str(raw).strip()) if raw is not None else DEFAULT_HEALTH_CHECK_TIMEOUT_S
    except ValueError:
        return DEFAULT_HEALTH_CHECK_TIMEOUT_S
    if value <= 0:
        return DEFAULT_HEALTH_CHECK_TIMEOUT_S
    return min(value, MAX_HEALTH_CHECK_TIMEOUT_S)


def probe_deadline_s(sglang_timeout_s: float, requested_s: float = 0.0) -> float:
    """The total deadline of one ``/health`` probe: at least SGLang's own bound (its timeout,
    one handler step, :data:`PROBE_SLACK_S`), more when the caller asks for more."""
    return max(float(requested_s), float(sglang_timeout_s) + HANDLER_STEP_S + PROBE_SLACK_S)


def min_probe_spacing_s(sglang_timeout_s: float) -> float:
    """Least time between the starts of two generating ``/health`` probes of one server: the
    handler's whole life (timeout plus one step), so an abandoned probe is over in SGLang."""
    return float(sglang_timeout_s) + HANDLER_STEP_S


def cheap_ready_path(version: str | None) -> str | None:
    """The release's flag-only readiness endpoint (``/ready`` from :data:`READY_ENDPOINT_SINCE`),
    else None. An unknown or unparsable version gets None (the generating probe only)."""
    try:
        return "/ready" if version and Version(str(version)) >= READY_ENDPOINT_SINCE else None
    except InvalidVersion:
        return None
