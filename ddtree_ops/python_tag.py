"""The CPython tag of an interpreter (``cp311`` for CPython 3.11): the first part of every
wheelhouse directory name, compared with the host's interpreter before a host installs from it.

One definition: :data:`PYTHON_TAG_CODE` is the code every interpreter whose tag
is needed runs with ``-c`` (the ``sglang`` and ``ddtree_service`` roles get it from the
``ddtree_render`` action's ``python_tag_code``; :func:`ddtree_ops.sglang.wheelhouse.build` runs it
under the wheelhouse's Python); ``scripts/build-wheelhouse.sh`` runs this module
(``python -m ddtree_ops.python_tag``). Standard library only: the script runs it with any Python.
The tag is the interpreter part of a wheel's name (PEP 425 "Python Tag", ``cp`` + major + minor).
"""

from __future__ import annotations

PYTHON_TAG_CODE = "import sys; print(f'cp{sys.version_info[0]}{sys.version_info[1]}')"
"""Python code printing the running interpreter's CPython tag, e.g. ``cp311``, and a newline."""


def current() -> str:
    """The running interpreter's CPython tag: what :data:`PYTHON_TAG_CODE` prints, run here."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(PYTHON_TAG_CODE)
    return buf.getvalue().strip()


if __name__ == "__main__":
    exec(PYTHON_TAG_CODE)
