"""The format of a release on the host, shared by the controller that renders it
(:mod:`ddtree_ops.render.release`) and the host-side commands that install, check and switch
it (:mod:`ddtree_ops.host.release`): the id, the manifest's name, mode and format, the names of
the active link and the history (standard library only)."""

from __future__ import annotations

import hashlib
import json
import re

ID_LENGTH = 12
"""Hex digits of a release id (the first 12 of a sha256)."""
ID_RE = re.compile(rf"^[0-9a-f]{{{ID_LENGTH}}}$")
"""The shape of a release id; anything else is refused before it names a path."""
MANIFEST = "release.json"
"""The manifest inside a release directory."""
MANIFEST_MODE = "0644"
"""The manifest's file mode (``ddtree_ops.render.release.release_result`` installs it so)."""
CURRENT = "current"
"""The symlink to the active release inside the release root."""
HISTORY = "history"
"""The activation history inside the release root: ids, newest last, one per line."""
FORMAT = 1
"""Manifest format this code writes and reads."""

def file_entry(name: str, data: bytes, mode: str) -> dict:
    """One manifest entry: ``{name, sha256, mode}`` (``mode`` an octal string such as ``"0644"``)."""
    return {"name": name, "sha256": hashlib.sha256(data).hexdigest(), "mode": mode}


def compute_id(entries: list[dict], ident: dict) -> str:
    """The release id: the first :data:`ID_LENGTH` hex digits of sha256 over the canonical JSON
    (sorted keys, no spaces, ASCII) of ``{"files": entries, "identity": ident}``.

    The one definition of the id: ``ddtree-ops render`` and the ``ddtree_render`` action
    (:func:`ddtree_ops.render.release.build_release`) compute it from the rendered bytes, the
    commands here recompute it from a manifest and the files on disk."""
    canon = json.dumps({"files": entries, "identity": ident}, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canon.encode()).hexdigest()[:ID_LENGTH]
