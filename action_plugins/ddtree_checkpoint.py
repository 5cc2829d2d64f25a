"""Ansible action ``ddtree_checkpoint``: read the model's and draft's config files on the host
(where the service will read them) and check the deployment against them, before the service is
touched.

For each checkpoint given as an absolute path (:func:`ddtree_ops.config.checkpoint.host_paths`),
``config.json``, ``preprocessor_config.json`` and ``model.safetensors.index.json`` are ``stat``-ed
on the host (a missing file is absent; not a regular file, or over 1 MiB: refused) and
``slurp``-ed; the same validator as ``ddtree-ops validate`` then runs with those facts
(:func:`ddtree_ops.config.checkpoint.validate_with_checkpoints`). Hub ids are read only with
``DDTREE_HUB=1`` on the controller, as by the CLI.

Returns ``checkpoint_files`` (pass it to ``ddtree_render`` so the plan uses the derived values),
``checkpoint`` (the plan's checkpoint summary) and ``checkpoint_findings`` (warnings and info
lines). Fails with every finding (field, value, rule, fix) on an error.
"""

from __future__ import annotations

import base64

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # Reads and computes only (nothing on the host changes): runs under --check as well.
    _supports_check_mode = True

    def _read(self, path: str, task_vars: dict) -> tuple[bytes | None, str | None]:
        """(content, None), (None, None) when absent, or (None, why) when refused."""
        from ddtree_ops.config.checkpoint import MAX_FILE_BYTES
        from ddtree_ops.config.errors import shorten

        st = self._execute_module("ansible.builtin.stat", module_args={
            "path": path, "follow": True, "get_checksum": False, "get_mime": False, "get_attributes": False},
            task_vars=task_vars)
        if st.get("failed"):
            return None, f"cannot be checked on the host: {shorten(str(st.get('msg', '')), 160)}"
        s = st.get("stat") or {}
        if not s.get("exists"):
            return None, None
        if not s.get("isreg"):
            return None, "is not a regular file"
        if int(s.get("size") or 0) > MAX_FILE_BYTES:
            return None, f"is over {MAX_FILE_BYTES // 1024} KiB (no config file is that large)"
        sl = self._execute_module("ansible.builtin.slurp", module_args={"src": path}, task_vars=task_vars)
        if sl.get("failed"):
            return None, f"cannot be read on the host: {shorten(str(sl.get('msg', '')), 160)}"
        return base64.b64decode(sl.get("content", "")), None

    def run(self, tmp=None, task_vars=None):
        from ddtree_ops.config import ConfigError
        from ddtree_ops.config.checkpoint import (
            FILES,
            host_paths,
            hub_allowed,
            reader_from_host_files,
            validate_with_checkpoints,
        )
        from ddtree_ops.config.hostvars import deployment_vars
        from ddtree_ops.config.load import deployment_from_hostvars

        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        host = task_vars["inventory_hostname"]
        try:
            hostvars = deployment_vars(task_vars, self._templar.template, host)
            d = deployment_from_hostvars(host, hostvars)
            payload: dict = {}
            for role, path, rev in host_paths(d):
                files, errors = {}, {}
                for name in FILES:
                    content, why = self._read(f"{path.rstrip('/')}/{name}", task_vars)
                    files[name] = None if content is None else base64.b64encode(content).decode("ascii")
                    if why:
                        errors[name] = why
                payload[role] = {"path": path, "revision": rev, "files": files, "errors": errors}
            validated = validate_with_checkpoints(host, hostvars, reader_from_host_files(payload, hub_allowed(False)))
        except ConfigError as exc:
            result.update(failed=True, msg="checkpoint check failed:\n" + str(exc),
                          findings=[f.as_dict() for f in exc.findings])
            return result
        result.update(changed=False, checkpoint_files=payload, checkpoint=validated.plan.checkpoint,
                      checkpoint_findings=[f.message() for f in validated.warnings])
        return result
