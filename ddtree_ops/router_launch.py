"""Start smg with its API key read from a systemd credential, not argv.

``python -m ddtree_ops.router_launch NAME SMG-LAUNCH-ARGS...``: reads
``$CREDENTIALS_DIRECTORY/NAME`` (systemd.exec(5) ``LoadCredential=``), parses the arguments
with smg's own parser (``smg.launch_router.parse_router_args``, what ``smg launch`` calls)
and sets two parsed fields before starting the gateway:

* ``api_key``: the key smg sends to its workers (``--api-key``);
* ``control_plane_api_keys``: the same key as smg's one admin key of its control plane
  (``--control-plane-api-keys 'id:name:role:key'``; smg 1.13.0 ``smg/router_args.py``
  ``_parse_control_plane_api_keys`` turns each entry into ``(id, name, key, role)``, the shape set
  here). Without it smg serves ``/workers`` (add, remove: drain a worker) to anyone who reaches
  its port; with it, ``GET``/``POST /workers`` answer 401 unless ``Authorization: Bearer KEY``
  (checked against smg 1.13.0 on 2026-12-02: 401 without and with a wrong token, 200/202 with
  the key). :mod:`ddtree_ops.fleet.router_worker` and ``fleet status`` send that header.

``smg launch`` only takes either as a command-line value, which would put the key in
``/proc/PID/cmdline`` and the unit file, so both flags are refused on the command line.
Standard library and smg only: it runs in the router's venv.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MAX_KEY = 4096
KEY_FLAGS = ("--api-key", "--control-plane-api-keys")
"""smg options that carry the credential: set from it, never given on the command line."""
CONTROL_PLANE_ID = "ddtree-ops"
"""Id and name of the control-plane key entry (smg logs the id, never the key)."""


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
    # smg's parser accepts unique prefixes (argparse allow_abbrev): --api-k is --api-key too, and
    # --control-plane-api is --control-plane-api-keys
    for a in argv[1:]:
        bare = a.split("=", 1)[0]
        hit = next((f for f in KEY_FLAGS if len(bare) > 3 and f.startswith(bare)), None)
        if hit:
            sys.exit(f"router_launch: {hit} must not be given on the command line (it is the credential's)")
    key = read_credential(argv[0])
    from smg.launch_router import launch_router, parse_router_args

    args = parse_router_args(argv[1:])
    args.api_key = key
    args.control_plane_api_keys = [(CONTROL_PLANE_ID, CONTROL_PLANE_ID, key, "admin")]
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
