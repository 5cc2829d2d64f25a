"""A small HTTP client for SGLang's native endpoints (``../shared/DESIGN.md`` §2).

Uses httpx. Endpoints: ``/health`` (503 while starting, else a 1-token generation),
``/server_info`` (older builds: ``/get_server_info``), ``/generate``, ``/metrics``.
"""

from __future__ import annotations

from typing import Any

import httpx


class SGLangError(Exception):
    """The server could not be reached or answered with an error."""


class SGLangClient:
    """Synchronous client for one SGLang server.

    Args:
        base_url: e.g. ``http://127.0.0.1:30000``.
        timeout: seconds per request.
    """

    def __init__(self, base_url: str, timeout: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SGLangClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> int:
        """HTTP status of ``GET /health``.

        Raises:
            httpx.TransportError: port closed (still loading weights) or timeout.
        """
        return self._http.get("/health").status_code

    def server_info(self) -> dict[str, Any]:
        """``/server_info`` (falls back to ``/get_server_info`` on older builds).

        Raises:
            SGLangError: neither endpoint answered 200 with JSON.
        """
        for path in ("/server_info", "/get_server_info"):
            try:
                r = self._http.get(path)
            except httpx.HTTPError as exc:
                raise SGLangError(f"{self.base_url}{path}: {exc}") from exc
            if r.status_code == 200:
                info = r.json()
                if not isinstance(info, dict):
                    raise SGLangError(f"{self.base_url}{path}: answered JSON {type(info).__name__}, not an object "
                                      "(not an SGLang server?)")
                return info
            if r.status_code != 404:
                raise SGLangError(f"{self.base_url}{path}: HTTP {r.status_code}")
        raise SGLangError(f"{self.base_url}: no /server_info or /get_server_info")

    def metrics(self) -> str:
        """Prometheus text of ``/metrics`` (needs ``--enable-metrics``)."""
        r = self._http.get("/metrics")
        if r.status_code != 200:
            raise SGLangError(f"{self.base_url}/metrics: HTTP {r.status_code}")
        return r.text


def accept_length(server_info: dict[str, Any]) -> float | None:
    """Mean ``avg_spec_accept_length`` over DP ranks of ``/server_info``, or None before
    the first verify pass (tokens accepted per verify pass, bonus token included)."""
    states = server_info.get("internal_states")
    values = [  # a value that is not a number (a broken or foreign server) counts as not reported
        float(s["avg_spec_accept_length"])
        for s in (states if isinstance(states, list) else [])
        if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), (int, float))
        and not isinstance(s["avg_spec_accept_length"], bool)
    ]
    return sum(values) / len(values) if values else None
