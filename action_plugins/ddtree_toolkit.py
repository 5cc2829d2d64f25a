"""Ansible action ``ddtree_toolkit``: the CUDA toolkit role's decisions, made by ddtree_ops
on the controller (no version logic in YAML). Option ``check`` picks one:

* ``repo``: ``distribution``, ``version``, ``machine`` (Ansible facts), ``base_url`` ->
  ``repo_path`` (e.g. ``debian12/x86_64``), ``url``, ``list_file``, ``keyring_deb_url``,
  ``keyring_path``, ``keyring_package``. Fails for a distro NVIDIA has no repository for.
* ``driver``: ``stdout``, ``rc``, ``stderr`` of :data:`ddtree_ops.host.toolkit.QUERY_COMMAND`
  (the ``cuda_toolkit`` role runs it: ``ddtree_render``'s ``driver_query``), ``cuda``, ``arch``
  -> ``gpus``; fails with one clear message when the
  driver is absent, too old for the toolkit, or the GPUs are not the host class' arch.
  ``min_driver`` / ``min_driver_reason`` (``plan.toolchain``: the pinned build's floor, if higher).
* ``build_driver``: ``wheelhouse`` (controller directory of the SGLang wheelhouse) and
  ``driver_version``: the one ``sglang-*.whl`` there must not depend on CUDA wheels newer than
  the driver runs (:func:`ddtree_ops.host.toolkit.check_build_driver`).
* ``reboot``: ``connection``, ``host``, ``managed_changed``, ``reboot_required``, ``allowed`` ->
  ``reboot`` (bool) and ``reason`` (see :func:`ddtree_ops.host.toolkit.reboot_decision`).
"""

from __future__ import annotations

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # Reads and computes only (nothing on the host changes): runs under --check as well.
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        from ddtree_ops.config.toolchain import KEYRING_DEB, KEYRING_PACKAGE, KEYRING_PATH, NVIDIA_REPO_URL, nvidia_repo
        from ddtree_ops.host.toolkit import DriverCheckError, check_build_driver, check_driver, reboot_decision

        result = super().run(tmp, task_vars)
        result["changed"] = False
        a = self._task.args
        check = a.get("check")
        if check == "repo":
            try:
                repo = nvidia_repo(str(a["distribution"]), str(a["version"]), str(a["machine"]))
            except ValueError as exc:
                return {**result, "failed": True, "msg": f"{exc}. Fix: use a supported distro, or mirror a repository "
                                                         "of that layout and set cuda_toolkit_repo_url"}
            url = repo.url(str(a.get("base_url") or NVIDIA_REPO_URL))
            result.update(repo_path=repo.path, url=url, list_file=repo.list_file, keyring_deb_url=url + KEYRING_DEB,
                          keyring_path=KEYRING_PATH, keyring_package=KEYRING_PACKAGE)
        elif check == "driver":
            try:
                gpus = check_driver(str(a.get("stdout", "")), int(a.get("rc", 1)), str(a["cuda"]),
                                    a.get("arch"), str(a.get("stderr", "")),
                                    str(a.get("min_driver") or "") or None, str(a.get("min_driver_reason") or ""))
            except DriverCheckError as exc:
                return {**result, "failed": True, "msg": str(exc)}
            drv = gpus[0].driver_version
            result.update(gpus=[g.__dict__ for g in gpus], driver_version=drv,
                          msg=f"{len(gpus)} GPU(s) {gpus[0].arch}, driver {drv}: ok for CUDA {a['cuda']}"
                              + (f" and the SGLang build (>= {a['min_driver']})" if a.get("min_driver") else ""))
        elif check == "build_driver":
            from pathlib import Path

            wheels = sorted(Path(str(a.get("wheelhouse", ""))).glob("sglang-*.whl"))
            if len(wheels) != 1:
                return {
                    **result,
                    "failed": True,
                    "msg": f"ddtree_toolkit: want one sglang-*.whl in the wheelhouse {str(a.get('wheelhouse'))[:200]}, "
                    f"found {len(wheels)}. Fix: rebuild the wheelhouse (delete it; the sglang role rebuilds it)",
                }
            try:
                result["msg"] = check_build_driver(str(a.get("driver_version", "")), wheels[0])
            except DriverCheckError as exc:
                return {**result, "failed": True, "msg": str(exc)}
            result["wheel"] = wheels[0].name
        elif check == "reboot":
            reboot, reason = reboot_decision(str(a.get("connection", "ssh")), str(a.get("host", "")),
                                             boolean(a.get("managed_changed", False)),
                                             boolean(a.get("reboot_required", False)), boolean(a.get("allowed", False)))
            result.update(reboot=reboot, reason=reason, msg=reason)
        else:
            return {
                **result,
                "failed": True,
                "msg": f"ddtree_toolkit: check must be repo, driver, build_driver or reboot, not {str(check)[:40]!r}",
            }
        return result
