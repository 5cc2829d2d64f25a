"""Ansible action ``ddtree_prometheus``: the monitoring host's Prometheus files for every
SGLang host of the inventory, rendered by the same Python code as ``ddtree-ops render``.

Runs on the controller only. Options:

* ``servers`` (list of inventory host names, required): hosts whose deployments to scrape
  (usually ``groups['sglang_servers']``); each is validated like ``ddtree_render`` does.
* ``config_dir`` (str): Prometheus' configuration directory; ``rules_path`` and ``dashboard_path``
  (str, optional) default to its files named :data:`~ddtree_ops.render.monitoring.RULES_FILE`
  and :data:`~ddtree_ops.render.monitoring.DASHBOARD_FILE`
  (:func:`~ddtree_ops.render.monitoring.monitoring_paths`). One of ``config_dir`` and
  ``rules_path`` is required unless ``fleet_only``; the rules path goes into ``rule_files:``.
* ``fleet_only`` (bool, default false): only validate ``servers`` and check them against each
  other (deploy.yml's first play, run once before anything changes); returns ``targets`` and
  ``waves`` (host -> deploy wave: instances of one machine deploy one after the other,
  :func:`ddtree_ops.config.fleet.instance_waves`) and ``multinode`` (host -> every node of its
  multi-node server, rank 0 first: :func:`ddtree_ops.config.multinode_fleet.server_nodes`;
  playbooks/rolling.yml restarts them as one unit).
* ``routers`` (list of inventory host names, optional; usually ``groups['routers']``): router
  hosts (``ddtree_router``, :mod:`ddtree_ops.config.router`) checked against ``servers`` (ports
  of one machine, worker list) and scraped as job ``smg``; none: nothing changes. With
  ``fleet_only`` it also returns ``routers`` (router host -> its rendered files and probe URLs,
  the ``router`` role's input; the API key file's content included: register it with no_log) and
  ``router_fronts`` (instance host -> the routers in front of it, for playbooks/rolling.yml's
  drain and re-add) (:func:`ddtree_ops.render.router.router_facts`).
* ``scrape_interval``, ``scrape_timeout``, ``evaluation_interval`` (Prometheus durations).
* ``alerts`` (dict): :class:`ddtree_ops.render.monitoring.AlertSettings` overrides.

Returns ``prometheus_yml``, ``rules``, ``dashboard`` (text), ``rules_path`` and ``dashboard_path``
(where the role installs them) and ``targets`` (host names).
Fails with every finding when any server's config is invalid (a vault plaintext of any host of the
inventory in a plain field included, or a host named as one), when two servers clash on one
machine (:mod:`ddtree_ops.config.fleet`: same address and port, or same unit), or on a bad
alert setting. A host listed twice in ``servers`` is scraped once.
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
        from ddtree_ops.config.hostvars import deployment_vars, host_vault_texts, vaulted_host_name
        from ddtree_ops.render import render_prometheus
        from ddtree_ops.render.monitoring import (
            AlertSettings,
            AlertSettingsError,
            monitoring_paths,
            render_dashboard,
            render_rules,
        )

        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        servers = args.get("servers") or []
        fleet_only = bool(args.get("fleet_only", False))
        if not isinstance(servers, list) or not (args.get("rules_path") or args.get("config_dir") or fleet_only):
            result.update(failed=True, msg="ddtree_prometheus: servers (list of hosts) and config_dir (or rules_path) "
                                           "are required")
            return result
        validated, findings = [], []
        # provenance is inventory-wide (ddtree_ops.config.hostvars.host_vault_texts): the vault plaintexts of
        # every host of the inventory count as secrets on each server, and no host may be named as one
        memo: dict = {}
        everyone = [str(h) for h in (task_vars.get("groups") or {}).get("all") or []]
        secrets: set[str] = set()
        for host in everyone:
            if host in task_vars["hostvars"]:
                secrets |= host_vault_texts(task_vars["hostvars"][host], self._templar.template, memo)
        named = vaulted_host_name(everyone, secrets)
        if named is not None:
            result.update(failed=True, msg="invalid deployment config:\n" + named.message(),
                          findings=[named.as_dict()])
            return result
        for host in sorted(dict.fromkeys(map(str, servers))):  # a host listed twice is one target
            try:
                host_all = task_vars["hostvars"][host]
                hostvars = deployment_vars(host_all, self._templar.template, host, memo, inventory_secrets=secrets)
                # the checkpoint facts deploy.yml's ddtree_checkpoint read on that host, if any (same plan as
                # ddtree_render's)
                earlier = host_all.get("_ddtree_checkpoint")
                files = earlier.get("checkpoint_files") if isinstance(earlier, dict) else None
                reader = reader_from_host_files(files or {}, hub_allowed(False))
                validated.append(validate_with_checkpoints(host, hostvars, reader))
            except ConfigError as exc:
                findings.extend(exc.findings)
        if not findings:
            from ddtree_ops.config.fleet import fleet_findings

            findings = fleet_findings(validated)  # two hosts on one machine and port: duplicate targets
        routers = []
        router_hosts = args.get("routers") or []
        if not findings and router_hosts:  # the gateways in front of them (ddtree_ops.config.router)
            from ddtree_ops.config.router import validate_routers

            if not isinstance(router_hosts, list):
                result.update(failed=True, msg="ddtree_prometheus: routers must be a list of hosts")
                return result
            try:
                router_vars = {h: deployment_vars(task_vars["hostvars"][h], self._templar.template, h, memo,
                                                  inventory_secrets=secrets)
                               for h in sorted(dict.fromkeys(map(str, router_hosts)))}
            except ConfigError as exc:
                findings = list(exc.findings)
            else:
                routers, findings = validate_routers(router_vars, validated)
        if findings:
            result.update(failed=True, msg="invalid deployment config:\n" + "\n".join(f.message() for f in findings),
                          findings=[f.as_dict() for f in findings])
            return result
        if fleet_only:
            from ddtree_ops.config.fleet import instance_waves
            from ddtree_ops.config.multinode_fleet import server_nodes
            from ddtree_ops.render.router import router_facts

            result.update(changed=False, targets=[v.deployment.host for v in validated],
                          waves=instance_waves(validated), multinode=server_nodes(validated),
                          **router_facts(routers, validated),
                          msg=f"{len(validated)} deployment(s) valid, no clash between them")
            return result
        try:
            settings = AlertSettings.from_dict(dict(args.get("alerts") or {}))
            paths = monitoring_paths(str(args.get("config_dir") or ""), str(args.get("rules_path") or ""),
                                     str(args.get("dashboard_path") or ""))
        except (AlertSettingsError, ValueError) as exc:
            result.update(failed=True, msg=str(exc))
            return result
        kw = {k: str(args[k]) for k in ("scrape_interval", "scrape_timeout", "evaluation_interval") if args.get(k)}
        result.update(
            changed=False,
            prometheus_yml=render_prometheus(validated, rule_files=[paths["rules_path"]], routers=routers, **kw),
            rules=render_rules(settings, validated),
            dashboard=render_dashboard(validated),
            targets=[v.deployment.host for v in validated],
            **paths,
        )
        return result
