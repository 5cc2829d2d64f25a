"""Start smg with its workers' API key read from a systemd credential, not argv.

``python -m ddtree_ops.router_launch NAME SMG-LAUNCH-ARGS...``: reads
``$CREDENTIALS_DIRECTORY/NAME`` (systemd.exec(5) ``LoadCredential=``), parses the arguments
with smg's own parser (``smg.launch_router.parse_router_args``, what ``smg launch`` calls)
and sets the parsed ``api_key`` before starting the gateway. ``smg launch`` only takes the
key as ``--api-key VALUE``, which would put it in ``/proc/PID/cmdline`` and the unit file.

With the key set, smg 1.13.0 sends it to its workers and asks every client for it too: the data
plane (``/generate``, ``/v1/...``) and the worker API (``/workers``: list, add, drain) answer 401
("Missing API key: send it as `Authorization: Bearer <key>`") without ``Authorization: Bearer KEY``
(checked against the smg 1.13.0 wheel on 2026-12-02, and on the test hosts by
``tests/hosts/test_router_host.py``).
Standard library and smg only: it runs in the router's venv.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MAX_KEY = 4096


def read_credential(name: str) -> str:
    """The credential's text without its trailing newline; exits 2 with one line when absent,
    empty, too large or not one line."""
    base = os.environ.get("CREDENTIALS_DIRECTORY")
    if not base or "/" in name or not name:
        sys.exit(f"router_launch: no credential {name!r}: CREDENTIALS_DIRECTORY is unset (run it from the unit, "
                 "which has LoadCredential=)")
    try:
        data = (Path(base) / name).read_bytes()[: MAX_KEY + 1]
    except OSError as exc:
        sys.exit(f"router_launch: cannot read credential {name}: {exc.strerror}")
    key = data.decode("utf-8", "replace").rstrip("\n")
    if not key or len(data) > MAX_KEY or "\n" in key or "\x00" in key:
        sys.exit(f"router_launch: credential {name} must be one non-empty line of at most {MAX_KEY} bytes")
    return key


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m ddtree_ops.router_launch CREDENTIAL-NAME SMG-LAUNCH-ARGS...")
    # smg's parser accepts unique prefixes (argparse allow_abbrev): --api-k is --api-key too
    if any(len(a.split("=", 1)[0]) > 3 and "--api-key".startswith(a.split("=", 1)[0]) for a in argv[1:]):
        sys.exit("router_launch: --api-key must not be given on the command line (it is the credential's)")
    key = read_credential(argv[0])
    from smg.launch_router import launch_router, parse_router_args

    args = parse_router_args(argv[1:])
    args.api_key = key
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
