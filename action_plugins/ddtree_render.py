"""Ansible action ``ddtree_render``: validate this host's deployment and render its files
with the same Python code as ``ddtree-ops render`` (byte-identical output).

Runs on the controller only. Options:

* ``secrets`` (bool, default false): return only the secret files (run the task with
  ``no_log: true``); otherwise return every non-secret file.
* ``component`` (str, default ``service``): which files: ``service`` (SGLang unit, env,
  plan.json, secrets), ``exporter`` (the exporter unit, for the ddtree_exporter role) or
  ``devices`` (the host's NVIDIA device-node unit, for the cuda_toolkit role) or ``router_join``
  (the unit, SGLang drop-in and 0600 config that register the warm instance at the routers in
  front of it: :func:`ddtree_ops.render.router.render_join`; none without such a router).
* ``routers`` (list of inventory host names; usually ``groups['routers']``): the router hosts,
  read for ``component: router_join`` (:func:`ddtree_ops.config.router.routers_for`).
* ``checkpoint_files`` (dict, optional): the host's checkpoint config files as read by
  ``ddtree_checkpoint``; the plan then uses the values derived from them (block size, vision
  ``min_pixels``). Default: ``_ddtree_checkpoint.checkpoint_files`` when an earlier task of the
  run registered it (deploy.yml's validation play does), so every role renders the same plan.
  Without either, checkpoints are read as ``ddtree-ops render`` reads them (controller
  directories; the Hub with ``DDTREE_HUB=1``).

Returns ``files`` (list of ``{path, content, mode, secret}``), ``plan``, ``unit``, ``url`` (where
the host reaches SGLang: ``Server.local_url``), ``rendezvous_port`` (SGLang's ``--nccl-port``:
``Server.rendezvous_port``), ``exporter_url`` (the exporter, on loopback),
``paths`` (``config``, ``state``, ``cache``, ``venv`` directories on the host; ``secrets``: the
secrets file, removed by the role when none is rendered; ``sglang_build``: the SGLang build the
release runs, :func:`ddtree_ops.render.argv.sglang_build_path`, None without one; the ``sglang``
role installs into it), ``deployment`` (no secrets),
``router_join`` (the join files' paths: ``unit_name``, ``unit``, ``dropin``, ``config``, ``hold``),
``plan_warnings``, ``probe_request`` (for the capability probe), ``service_env`` (the unit's
non-secret environment), ``devices_unit`` and ``nvidia_modprobe`` (the device-node unit's
name and the binary it runs), ``release`` (the service's release:
:func:`ddtree_ops.render.release.release_result`: ``id`` (the same id ``ddtree-ops render``
prints), ``root``, ``dir``, ``keep``, ``files`` to install in the release dir, ``links``: the live
paths as symlinks through ``current``), and values the roles share with Python, each defined once
there: ``installs_sglang`` (:attr:`ddtree_ops.config.models.SGLangPin.installs_sglang`),
``python_tag_code`` (:data:`ddtree_ops.python_tag.PYTHON_TAG_CODE`), ``driver_query`` (the
arguments of ``nvidia-smi`` for the driver check: :data:`ddtree_ops.host.toolkit.QUERY_COMMAND`)
and ``managed_by`` (how the header of a file ddtree-ops writes starts:
:data:`ddtree_ops.render.files.MANAGED_BY`). Fails with every finding (field, value, rule, fix) when the
config is invalid; secret values never appear in ``msg`` or ``findings``
(:class:`ddtree_ops.config.errors.Finding` redacts them).
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    # Reads and computes only (nothing on the host changes): runs under --check as well.
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        from ddtree_ops.config import ConfigError
        from ddtree_ops.config.checkpoint import hub_allowed, reader_from_host_files, validate_with_checkpoints
        from ddtree_ops.config.hostvars import deployment_vars
        from ddtree_ops.host.toolkit import QUERY_COMMAND
        from ddtree_ops.python_tag import PYTHON_TAG_CODE
        from ddtree_ops.render import render_host
        from ddtree_ops.render.argv import sglang_build_path
        from ddtree_ops.render.files import DEVICES_UNIT, MANAGED_BY, NVIDIA_MODPROBE, plan_document, service_env
        from ddtree_ops.render.release import release_result
        from ddtree_ops.render.router import join_paths
        from ddtree_ops.sglang.expect import probe_request

        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        want_secrets = bool(self._task.args.get("secrets", False))
        host = task_vars["inventory_hostname"]
        try:
            hostvars = deployment_vars(task_vars, self._templar.template, host)
            files = self._task.args.get("checkpoint_files")
            if files is None:  # registered by an earlier ddtree_checkpoint task of this run (deploy.yml)
                earlier = task_vars.get("_ddtree_checkpoint")
                files = earlier.get("checkpoint_files") if isinstance(earlier, dict) else None
            reader = reader_from_host_files(files or {}, hub_allowed(False))
            validated = validate_with_checkpoints(host, hostvars, reader)
            sglang_build = sglang_build_path(validated.deployment)  # a missing lock file is a finding too
        except ConfigError as exc:
            result.update(failed=True, msg="invalid deployment config:\n" + str(exc),
                          findings=[f.as_dict() for f in exc.findings])
            return result
        component = self._task.args.get("component", "service")
        if component == "router_join":
            from ddtree_ops.config.router import routers_for
            from ddtree_ops.render.router import render_join

            try:
                router_vars = {h: deployment_vars(task_vars["hostvars"][h], self._templar.template, h)
                               for h in sorted(dict.fromkeys(map(str, self._task.args.get("routers") or [])))}
            except ConfigError as exc:
                result.update(failed=True, msg="invalid router config:\n" + str(exc),
                              findings=[f.as_dict() for f in exc.findings])
                return result
            routers, found = routers_for(router_vars, validated)
            if found:
                result.update(failed=True, msg="invalid router config:\n" + "\n".join(f.message() for f in found),
                              findings=[f.as_dict() for f in found])
                return result
            rendered = render_join(validated, routers)
        else:
            rendered = render_host(validated)
        files = [f for f in rendered if f.secret == want_secrets and f.component == component]
        doc = plan_document(validated)
        result.update(
            changed=False,
            files=[{"path": f.path, "content": f.content, "mode": f.mode, "secret": f.secret} for f in files],
            plan=validated.plan.as_dict(),
            unit=doc["unit"],
            url=doc["url"],
            rendezvous_port=validated.deployment.server.rendezvous_port,
            exporter_url=validated.deployment.ops.exporter_url,
            exporter_unit=next((f.path.rsplit("/", 1)[1] for f in files if f.component == "exporter"), None),
            paths={**doc["paths"], "sglang_build": sglang_build},
            deployment=doc["deployment"],
            plan_warnings=[w.message() for w in validated.warnings],
            probe_request=probe_request(validated),
            service_env=service_env(validated),
            devices_unit=DEVICES_UNIT,
            nvidia_modprobe=NVIDIA_MODPROBE,
            release=release_result(validated),
            router_join=join_paths(validated),
            installs_sglang=validated.deployment.sglang.installs_sglang,
            python_tag_code=PYTHON_TAG_CODE,
            driver_query=QUERY_COMMAND[1:],
            managed_by=MANAGED_BY,
        )
        return result
