"""What one SGLang instance holds on its machine: GPUs, ports, directories.

Several instances may share one machine (inventory hosts with one ``ansible_host``; see
:mod:`~.fleet`). Each holds, exclusively on that machine, the values this module derives;
:func:`~.rules.rule_gpu_set` checks one instance, :func:`~.fleet.fleet_findings` checks
instances against each other.

Sources: SGLang ``ServerArgs`` (``--base-gpu-id``: "The base GPU ID to start allocating GPUs
from"; ``--nccl-port``), both flags present in 0.5.13.post1 and 0.5.23; the GPU of each rank
(0.5.23 ``entrypoints/engine.py`` and ``managers/data_parallel_controller.py``): ``base_gpu_id +
pp_rank * tp + tp_rank * gpu_id_step``, each data-parallel replica starting ``tp * pp *
gpu_id_step`` further, and with ``--enable-dp-attention`` the DP ranks sharing the TP group's
GPUs; CUDA's ``CUDA_VISIBLE_DEVICES`` (CUDA C Programming Guide,
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


def listen_ports(d: Deployment) -> list[tuple[str, int]]:
    """(field, port) of each port the instance listens on, on its machine: SGLang's ``--port``,
    the exporter, the rendezvous port (``--nccl-port``) and, on rank 0 of a multi-node server, the
    torch.distributed store (:mod:`~.multinode`: rank 0 listens on ``--dist-init-addr``). One
    listener per address and port (ip(7) EADDRINUSE): :mod:`~.fleet` checks instances against
    each other with it, :mod:`~.router` a router on the machine."""
    ports = [("ddtree_server.port", d.server.port), ("ddtree_ops.exporter_port", d.ops.exporter_port),
             ("ddtree_server.nccl_port", d.server.rendezvous_port)]
    if d.server.dist_init_port is not None and d.node_rank == 0:  # rank 0's store listens on its machine
        ports.append(("ddtree_server.multinode.dist_init_port", d.server.dist_init_port))
    return ports


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
        if VISIBLE_ENV in d.secret_env:
            raise GpuSetError(f"{VISIBLE_ENV} is in ddtree_secret_env, where the GPU-set checks cannot see it"
                              f"|move {VISIBLE_ENV} to ddtree_service.env (it is not a secret)")
        return None
    if not _INDEX_LIST.fullmatch(raw):
        raise GpuSetError("must be a comma-separated list of GPU indices (e.g. 0,1,2,3); UUIDs, MIG names, "
                          "ranges and an empty list cannot be checked against the other instances of the machine"
                          "|write the indices nvidia-smi -L prints, e.g. 4,5,6,7")
    ids = tuple(int(x) for x in raw.split(","))
    if len(set(ids)) != len(ids):
        raise GpuSetError("lists a GPU twice|list each GPU index once")
    return ids


PP_FLAGS = ("--pp-size", "--pipeline-parallel-size")
STEP_FLAG = "--gpu-id-step"
DP_ATTENTION_FLAG = "--enable-dp-attention"


def _extra_int(d: Deployment, names: tuple[str, ...]) -> int:
    """An integer 1-64 that ``ddtree_server.extra_args`` gives one of ``names``; 1 when absent.

    Raises:
        GpuSetError: not an integer in 1-64.
    """
    for name in names:
        if name in d.server.extra_args:
            value = d.server.extra_args[name]
            try:
                n = int(str(value))
            except ValueError:
                n = 0
            if not 1 <= n <= 64:
                raise GpuSetError(f"ddtree_server.extra_args.{name} = {str(value)[:40]!r} must be an integer 1-64 "
                                  f"(it places the instance's ranks on GPUs)|give {name} a small integer or remove it")
            return n
    return 1


def rank_gpus(d: Deployment) -> tuple[int, ...]:
    """GPU ordinals (relative to ``base_gpu_id``, among the visible GPUs) of every rank of the
    instance on this machine, by SGLang's own placement (module docstring): tp ranks ``gpu_id_step`` apart,
    pipeline stages ``tp`` apart, data-parallel replicas ``tp x pp x gpu_id_step`` apart unless
    DP attention shares the TP GPUs. A multi-node server (``ddtree_server.multinode``) places
    ``tp_size // nnodes`` TP ranks on each machine (0.5.23 ``entrypoints/engine.py``
    ``_launch_subprocesses``: ``gpu_id = base_gpu_id + tp_rank % tp_size_per_node``).

    Raises:
        GpuSetError: ``--pp-size`` / ``--gpu-id-step`` in ``extra_args`` not an integer 1-64.
    """
    tp = d.server.tp_size
    pp = _extra_int(d, PP_FLAGS)
    step = _extra_int(d, (STEP_FLAG,))
    dp = 1 if d.server.extra_args.get(DP_ATTENTION_FLAG) is True else d.server.dp_size
    n = d.server.nnodes
    if n > 1:  # this machine's share: tp_size // nnodes TP ranks (each pipeline stage's), engine.py
        tp = max(1, tp // n)
    return tuple(sorted({r * tp * pp * step + p * tp + t * step
                         for r in range(dp) for p in range(pp) for t in range(tp)}))


def gpu_count_needed(d: Deployment) -> int:
    """GPUs the instance spans from ``base_gpu_id``: the highest ordinal of :func:`rank_gpus` + 1
    (``tp_size x dp_size`` in the common case)."""
    return max(rank_gpus(d)) + 1


def gpu_set(d: Deployment) -> tuple[int, ...]:
    """Physical GPU indices the instance runs on: ``tp_size x dp_size`` GPUs starting at
    ``base_gpu_id`` among the visible ones (:func:`visible_gpus`, else 0..N-1). Shorter than
    :func:`gpu_count_needed` when the visible list does not reach that far (the instance
    would fail with "invalid device ordinal"; :func:`~.rules.rule_gpu_set` refuses it).

    Raises:
        GpuSetError: as :func:`visible_gpus`.
    """
    base, ranks = d.server.base_gpu_id or 0, rank_gpus(d)
    visible = visible_gpus(d)
    if visible is None:
        return tuple(base + r for r in ranks)
    return tuple(visible[base + r] for r in ranks if base + r < len(visible))


def multiproc_dir(d: Deployment) -> str:
    """``PROMETHEUS_MULTIPROC_DIR`` of the instance: the operator's ``ddtree_service.env`` value,
    else its ``RuntimeDirectory`` (``/run/ddtree-ops/<name>``)."""
    return d.service.env.get(MULTIPROC_ENV) or d.service.runtime_path


def cache_env(d: Deployment) -> dict[str, str]:
    """The per-instance directories the unit's environment points the server's caches at, inside
    ``ddtree_service.cache_dir`` (the unit's ``ReadWritePaths=``), before ``ddtree_service.env``:
    ``HOME`` (the state dir), the XDG and Hugging Face caches, Triton's kernel cache, DeepGEMM's JIT
    cache and FlashInfer's workspace (the names these libraries read: Triton ``TRITON_CACHE_DIR``,
    DeepGEMM ``DG_JIT_CACHE_DIR``, FlashInfer ``FLASHINFER_WORKSPACE_BASE``, huggingface_hub ``HF_HOME``)."""
    cache = d.service.cache_path
    return {
        "HOME": d.service.state_path,
        "XDG_CACHE_HOME": cache,
        "HF_HOME": f"{cache}/huggingface",
        "TRITON_CACHE_DIR": f"{cache}/triton",
        "DG_JIT_CACHE_DIR": f"{cache}/deepgemm",
        "FLASHINFER_WORKSPACE_BASE": f"{cache}/flashinfer",
    }


WRITTEN_DIR_ENV = re.compile(
    r"HOME|XDG_(?:CACHE|DATA|STATE|RUNTIME)_HOME|HF_HOME|TORCH_HOME|HF_HUB_CACHE|HF_DATASETS_CACHE|HF_XET_CACHE"
    r"|HUGGINGFACE_HUB_CACHE|TRANSFORMERS_CACHE|TORCH_EXTENSIONS_DIR|FLASHINFER_WORKSPACE_BASE|DG_JIT_CACHE_DIR"
    r"|[A-Z0-9_]*CACHE_(?:DIR|PATH|HOME|ROOT)"
    r"|SGLANG_[A-Z0-9_]*(?:COREDUMP|PROFILER|DUMP|DUMPER|RECORDER|STORAGE)_DIR")
"""``ddtree_service.env`` names whose value is a directory the server writes: the unit's own cache
variables (:func:`cache_env`), every ``*CACHE_DIR`` / ``*CACHE_PATH`` / ``*CACHE_HOME`` / ``*CACHE_ROOT``
(``SGLANG_DG_CACHE_DIR``, ``SGLANG_JIT_CACHE_DIR``, ``SGLANG_CUTE_AOT_CACHE_DIR``, ``TORCHINDUCTOR_CACHE_DIR``,
``CUDA_CACHE_PATH``), the Hugging Face and torch caches, and SGLang's output directories
(``SGLANG_CUDA_COREDUMP_DIR``, ``SGLANG_TORCH_PROFILER_DIR``, ``SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR``,
``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``: names in 0.5.23 ``sglang/srt/environ.py``).
:data:`MULTIPROC_ENV` is not one of them: it has its own rule (:func:`multiproc_dir`)."""


def written_dirs_from_env(d: Deployment) -> list[tuple[str, str]]:
    """``(field, path)`` of each :data:`WRITTEN_DIR_ENV` variable ``ddtree_service.env`` sets."""
    return [(f"ddtree_service.env.{n}", v) for n, v in d.service.env.items()
            if n != MULTIPROC_ENV and WRITTEN_DIR_ENV.fullmatch(n) and isinstance(v, str)]


def state_dirs(d: Deployment) -> list[tuple[str, str]]:
    """``(field, path)`` of every directory the instance writes or owns alone: config, state,
    cache, runtime, the Prometheus multiprocess directory and the cache / output directories
    ``ddtree_service.env`` names (:func:`written_dirs_from_env`)."""
    svc = d.service
    return [("ddtree_service.config_dir", svc.config_path), ("ddtree_service.state_dir", svc.state_path),
            ("ddtree_service.cache_dir", svc.cache_path), ("ddtree_service.name (RuntimeDirectory)", svc.runtime_path),
            (f"ddtree_service.env.{MULTIPROC_ENV}", multiproc_dir(d))] + written_dirs_from_env(d)


def paths_overlap(a: str, b: str) -> bool:
    """True when ``a`` and ``b`` are one directory or one lies inside the other."""
    a, b = a.rstrip("/") + "/", b.rstrip("/") + "/"
    return a.startswith(b) or b.startswith(a)
