"""``ddtree-ops`` command line (Typer + rich).

Exit codes: 0 ok, 1 a check failed, 2 usage or configuration error (or an environment
problem the message names: a missing file, a missing controller dependency), 70 an internal
error (a bug in ddtree-ops: the message asks for a report), 130 interrupted.
``--json`` prints one object with a stable ``checks`` list of ``{name, ok, detail}``.
Every error is mapped to a one-line message in :func:`main` (:data:`ddtree_ops.cli.common.KNOWN_ERRORS`); no
traceback reaches users unless ``DDTREE_DEBUG=1`` asks for one.
"""

from __future__ import annotations

import json
import os
import sys

import typer

from .common import EXIT_INTERRUPTED, CheckFailed, _config_error, _unexpected, _usage, _wants_json, err, say
from .fleet import app as fleet_app
from .host import app as host_app
from .inventory import app as inventory_app
from .release import app as release_app
from .runtime import app as runtime_app

# Each command imports what it uses (pydantic + the config models, httpx, Ansible, rich tables):
# `--help` and the light commands start without them (`--help` target <= 0.3 s CPU,
# measured by scripts/bench-controller.py; tests/test_perf.py checks the imports).

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Deploy and operate SGLang with DFlash/DDTree speculative decoding.")
app.add_typer(fleet_app, name="fleet")
app.add_typer(release_app, name="release")  # host-side releases: ddtree_ops/cli/release.py
app.add_typer(inventory_app)  # validate, plan, render
app.add_typer(runtime_app)  # health, warmup, bench, bench-compare, sweep, probe-sglang, exporter
app.add_typer(host_app)  # port-check, check-ptxas, diagnose, preflight


def main(argv: list[str] | None = None) -> int:
    """Entry point; maps every error to a one-line message and an exit code."""
    try:
        rc = app(args=argv, standalone_mode=False)  # click returns typer.Exit's code here
        return rc if isinstance(rc, int) else 0
    except _config_error() as exc:
        from ..config.errors import shorten, show_host

        if _wants_json(argv):
            print(
                json.dumps(
                    {
                        "ok": False,
                        "checks": [
                            {
                                "name": f"config:{show_host(f.host) or shorten(f.field)}",
                                "ok": False,
                                "detail": f.message(),
                            }
                            for f in exc.findings
                        ],
                        "errors": [f.as_dict() for f in exc.findings],
                    },
                    indent=2, allow_nan=False
                )
            )
        for f in exc.findings:
            say(err, "error", "red", f.message())
        return 2
    except CheckFailed:
        return 1
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err.print("aborted")
        return 2
    except typer.exceptions.TyperException as exc:  # usage errors (bad option, unknown command)
        msg = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return _usage(argv, msg)
    except KeyboardInterrupt:
        err.print("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001 - the table below decides what users see
        return _unexpected(argv, exc)


def run() -> None:
    """Console-script entry: :func:`main`'s exit code; a reader that closed the pipe early
    (``ddtree-ops ... | head``) ends the run quietly with 141 (128 + SIGPIPE), as shells report it."""
    try:
        rc = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        rc = 141
    sys.exit(rc)
