"""What a deployment needs of its SGLang build: the capability probe's request.

Controller side (imports the config model); the probe itself (:mod:`.probe`) runs in the
SGLang venv with the standard library only and reads the request this module renders.
"""

from __future__ import annotations

from typing import Any

from ..config.load import Validated
from ..config.plandoc_model import PlanDoc
from ..config.versions import DDTREE_SOURCES, build_facts, sources_sizing_verify_correctly
from ..render.argv import build_argv


def probe_request(v: Validated) -> dict[str, Any]:
    """The request for ``python -m ddtree_ops.sglang.probe`` for one validated deployment.

    Returns:
        ``{argv, algorithm, version, ddtree_source, extra_flags, needs_verify_sizing,
        sizes_verify_at_budget_plus_one, ddtree_optional, arch, gpu_memory_gib, planned, fix}`` (see :mod:`.probe`);
        ``argv`` is our rendered server argv without ``python -m MODULE``; facts come from
        :mod:`ddtree_ops.config.versions`.
    """
    d, p = v.deployment, v.plan
    pin = d.sglang
    facts = build_facts(pin.base_version, pin.ddtree_source)
    good = sources_sizing_verify_correctly()
    good_src = DDTREE_SOURCES[good[0]] if good else None
    ddtree_ref = ((DDTREE_SOURCES.get(pin.ddtree_source) or good_src).reference
                  if (pin.ddtree_source or good_src) else "a DDTree fork")
    ddtree_fix = (
        f"this pin ({pin.source}{', ddtree_source ' + pin.ddtree_source if pin.ddtree_source else ''}) installed a "
        f"build without DDTREE: set ddtree_sglang.source: git with repo/commit of the DDTree source "
        f"({ddtree_ref})"
    )
    sizing_fix = (
        f"pin ddtree_source {good_src.key} ({good_src.reference}, sizes at budget + 1), install the ddtree-ops "
        f"SGLang plugin into the SGLang venv, or set ddtree_server.cuda_graph: false" if good_src else
        "install the ddtree-ops SGLang plugin, or set ddtree_server.cuda_graph: false"
    )
    return {
        "argv": build_argv(d, p)[3:],
        "algorithm": p.algorithm,
        "version": facts.version,
        "ddtree_source": pin.ddtree_source,
        "extra_flags": list(facts.extra_flags),
        "needs_verify_sizing": bool(p.algorithm == "DDTREE" and p.cuda_graphs),
        "sizes_verify_at_budget_plus_one": facts.sizes_verify_at_budget_plus_one,
        "ddtree_optional": pin.source == "simulator",
        # for the probe's sglang-resolution check (ddtree_ops.sglang.resolve): the host class's
        # arch/memory (used only where no GPU is visible) and the plan to diff against
        **_resolution_fields(v),
        "facts": facts.as_dict(),
        "fix": {
            "ddtree": ddtree_fix,
            "algorithm": f"pin an SGLang build that has {p.algorithm} (ddtree_sglang.version / source)",
            "flags": (f"the renderer emits the {facts.dialect.value} dialect of SGLang {facts.version}: pin "
                      f"ddtree_sglang.version to the release actually installed, or re-run the sglang role"),
            "sizing": sizing_fix,
            "version": f"ddtree_sglang pins {facts.version}: re-run the sglang role to install it",
        },
    }


def _resolution_fields(v: Validated) -> dict[str, Any]:
    from .resolve import planned_values

    hc = v.deployment.host_class_def
    return {"arch": hc.arch if hc else None, "gpu_memory_gib": hc.gpu_memory_gib if hc else None,
            "planned": planned_values(v.plan)}


def validated_from_plan(doc: PlanDoc) -> Validated:
    """Re-validate the deployment stored in a rendered ``plan.json`` (same rules as the inventory:
    the whole stored ``deployment`` object, :attr:`PlanDoc.document`, unknown fields refused).

    Raises:
        ConfigError: the stored deployment no longer validates.
    """
    from ..config import validate_hostvars
    from ..config.hostvars import INVENTORY_VARS

    dep = doc.document["deployment"]  # an object with a host: PlanDoc checked it
    hostvars = {INVENTORY_VARS[k]: val for k, val in dep.items() if k in INVENTORY_VARS and val is not None}
    return validate_hostvars(doc.deployment.host, hostvars)


def run_probe(python: str, request: dict[str, Any], timeout_s: float = 300.0) -> tuple[int, dict[str, Any]]:
    """Run ``PYTHON -m ddtree_ops.sglang.probe --request - --json`` with ``request``.

    Args:
        python: the SGLang venv's interpreter (ddtree-ops must be importable there; the
            sglang role installs it ``--no-deps``).
        request: from :func:`probe_request`.
        timeout_s: seconds before the probe is killed.

    Returns:
        (exit code 0/1/2, the probe's JSON object). An interpreter that cannot run the
        probe gives exit code 2 and one failed ``probe`` check naming the cause.
    """
    import json
    import subprocess

    try:
        proc = subprocess.run([python, "-m", "ddtree_ops.sglang.probe", "--request", "-", "--json"],
                              input=json.dumps(request,
                                  allow_nan=False), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        return 2, _failed(f"--python {python}: no such interpreter (the SGLang venv's bin/python)")
    except PermissionError:
        return 2, _failed(f"--python {python}: not executable")
    except subprocess.TimeoutExpired:
        return 2, _failed(f"the probe did not finish within {timeout_s:g} s")
    try:
        result = json.loads(proc.stdout)
        if not isinstance(result, dict) or not isinstance(result.get("checks"), list):
            raise ValueError("no checks list")
    except ValueError:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        if "No module named ddtree_ops" in proc.stderr:
            tail = "ddtree-ops is not installed in this venv (the sglang role installs it with --no-deps)"
        return 2, _failed(f"{python} could not run the probe: {tail}")
    return (proc.returncode if proc.returncode in (0, 1, 2) else 2), result


def _failed(detail: str) -> dict[str, Any]:
    return {"ok": False, "checks": [{"name": "probe", "ok": False, "detail": detail}]}
