"""What one SGLang instance holds on its machine: GPUs, ports, directories.

Several instances may share one machine (inventory hosts with one ``ansible_host``; see
:mod:`~.fleet`). Each holds, exclusively on that machine, the values this module derives;
:func:`~.rules.rule_gpu_set` checks one instance, :func:`~.fleet.fleet_findings` checks
instances against each other.

Sources: SGLang ``ServerArgs`` (``--base-gpu-id``: "The base GPU ID to start allocating GPUs
from", rank r uses ``base_gpu_id + r * gpu_id_step``; ``--nccl-port``), both flags present
in 0.5.13.post1 and 0.5.23; CUDA's ``CUDA_VISIBLE_DEVICES`` (CUDA C Programming Guide,
"CUDA Environment Variables": a comma-separated list of device indices or UUIDs; the
process sees only those, renumbered from 0 in list order).
"""

from __future__ import annotations

import re

from .models import Deployment

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
"""``ddtree_service.env`` name that narrows the GPUs the instance's processes see."""
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's multiprocess directory (SGLang ``set_prometheus_multiproc_dir``
makes a temporary directory inside it). Rendered as the instance's ``RuntimeDirectory``,
which systemd creates at start and removes at stop (:func:`multiproc_dir`)."""

_INDEX_LIST = re.compile(r"[0-9]{1,2}(,[0-9]{1,2})*")


class GpuSetError(ValueError):
    """``CUDA_VISIBLE_DEVICES`` is not a list of distinct device indices (message: rule | fix)."""


def visible_gpus(d: Deployment) -> tuple[int, ...] | None:
    """The physical GPU indices ``ddtree_service.env.CUDA_VISIBLE_DEVICES`` leaves visible, in
    order; ``None`` when it is not set (all GPUs of the host visible).

    Raises:
        GpuSetError: a value that is not a comma-separated list of distinct indices 0-99
            (UUIDs and MIG names cannot be compared across instances without the machine).
    """
    raw = d.service.env.get(VISIBLE_ENV)
    if raw is None:
        return None
    if not _INDEX_LIST.fullmatch(raw):
        raise GpuSetError("must be a comma-separated list of GPU indices (e.g. 0,1,2,3); UUIDs, MIG names, "
                          "ranges and an empty list cannot be checked against the other instances of the machine"
                          "|write the indices nvidia-smi -L prints, e.g. 4,5,6,7")
    ids = tuple(int(x) for x in raw.split(","))
    if len(set(ids)) != len(ids):
        raise GpuSetError("lists a GPU twice|list each GPU index once")
    return ids


def gpu_count_needed(d: Deployment) -> int:
    """GPUs one instance uses: ``tp_size`` x ``dp_size`` (SGLang: one GPU per TP rank per DP replica)."""
    return d.server.tp_size * d.server.dp_size


def gpu_set(d: Deployment) -> tuple[int, ...]:
    """Physical GPU indices the instance runs on: ``tp_size x dp_size`` GPUs starting at
    ``base_gpu_id`` among the visible ones (:func:`visible_gpus`, else 0..N-1). Shorter than
    :func:`gpu_count_needed` when the visible list does not reach that far (the instance
    would fail with "invalid device ordinal"; :func:`~.rules.rule_gpu_set` refuses it).

    Raises:
        GpuSetError: as :func:`visible_gpus`.
    """
    base, need = d.server.base_gpu_id or 0, gpu_count_needed(d)
    visible = visible_gpus(d)
    if visible is None:
        return tuple(range(base, base + need))
    return visible[base:base + need]


def multiproc_dir(d: Deployment) -> str:
    """``PROMETHEUS_MULTIPROC_DIR`` of the instance: the operator's ``ddtree_service.env`` value,
    else its ``RuntimeDirectory`` (``/run/ddtree-ops/<name>``)."""
    return d.service.env.get(MULTIPROC_ENV) or d.service.runtime_path


def state_dirs(d: Deployment) -> list[tuple[str, str]]:
    """``(field, path)`` of every directory the instance writes or owns alone: config, state,
    cache, runtime and the Prometheus multiprocess directory."""
    svc = d.service
    return [("ddtree_service.config_dir", svc.config_path), ("ddtree_service.state_dir", svc.state_path),
            ("ddtree_service.cache_dir", svc.cache_path), ("ddtree_service.name (RuntimeDirectory)", svc.runtime_path),
            (f"ddtree_service.env.{MULTIPROC_ENV}", multiproc_dir(d))]


def paths_overlap(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` are one directory or one lies inside the other."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)
