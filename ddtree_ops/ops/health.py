"""Health checks against a running SGLang server.

Check names are stable (``--json`` consumers rely on them): ``reachable``, ``ready``,
``accept_length``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import httpx

from ..sglang.client import SGLangClient, SGLangError, accept_length


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str

    def as_dict(self) -> dict:
        return asdict(self)


def check_health(url: str, timeout: float = 5.0) -> list[Check]:
    """One round of checks.

    Args:
        url: server base URL.
        timeout: seconds per HTTP request (>= 3 recommended; /health generates a token).

    Returns:
        ``reachable`` (port open), ``ready`` (/health 200) and, when ready,
        ``accept_length`` (informational: ok unless /server_info fails).
    """
    with SGLangClient(url, timeout=timeout) as c:
        try:
            status = c.health()
        except httpx.TimeoutException:
            return [Check("reachable", True, "port open"), Check("ready", False, f"/health timed out after {timeout:g} s")]
        except httpx.TransportError as exc:
            return [Check("reachable", False, f"{url}: {type(exc).__name__} (loading weights or down)")]
        checks = [Check("reachable", True, "port open"),
                  Check("ready", status == 200, f"/health answered {status}" + (" (warming up)" if status == 503 else ""))]
        if status == 200:
            try:
                al = accept_length(c.server_info())
                checks.append(Check("accept_length", True, "no verify pass yet" if al is None else f"{al:.2f} tokens per verify pass"))
            except SGLangError as exc:
                checks.append(Check("accept_length", False, str(exc)))
        return checks


def wait_ready(url: str, deadline_s: float, timeout: float = 5.0, interval_s: float = 1.0) -> list[Check]:
    """Poll :func:`check_health` until every check passes or ``deadline_s`` seconds pass.

    Returns:
        The last round of checks (all ok, or the failing round at the deadline).
    """
    end = time.monotonic() + deadline_s
    while True:
        checks = check_health(url, timeout=min(timeout, max(0.5, end - time.monotonic())))
        if all(c.ok for c in checks) or time.monotonic() + interval_s > end:
            return checks
        time.sleep(interval_s)
