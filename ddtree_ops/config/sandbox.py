"""The SGLang unit's sandbox, decided in Python: which paths it may write, what
``ProtectHome=`` it gets, which NVIDIA device groups it may open, which system calls it
may make, and the deployments whose own paths a directive would hide (refused at validate
time, one finding per path).

Sources: systemd.exec(5) (``ProtectSystem=strict`` leaves only ``/dev``, ``/proc`` and
``/sys`` writable; ``ProtectHome=yes`` hides ``/home``, ``/root`` and ``/run/user``;
``PrivateTmp=yes`` gives the unit its own empty ``/tmp`` and ``/var/tmp``;
``ProtectKernelTunables=yes`` makes ``/proc/sys``, ``/sys`` read-only),
systemd.resource-control(5) (``DeviceAllow=char-<group>`` matches the group names of
``/proc/devices``), ``systemd-analyze syscall-filter`` (group contents, systemd 252).
:func:`unit_sandbox` is what :func:`ddtree_ops.render.files.render_host` puts in the unit;
the rules here run with every other rule of :data:`ddtree_ops.config.rules.RULES`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .errors import Finding
from .hosts import HOST_CLASSES
from .models import Deployment
from .plan import Plan

SVC = "ddtree_service"
SYSTEMD_EXEC = "systemd.exec(5)"

HIDDEN_BY_PROTECT_HOME = ("/home", "/root", "/run/user")
"""Trees ``ProtectHome=yes`` makes empty and inaccessible (systemd.exec(5))."""
PRIVATE_TMP = ("/tmp", "/var/tmp")
"""Trees ``PrivateTmp=yes`` replaces with the unit's own empty directories."""
KERNEL_TREES = ("/proc", "/sys", "/dev")
"""API file systems: kernel state (``ProtectKernelTunables``, ``ProtectControlGroups``) and
device nodes (``DevicePolicy=closed``), never a place for a deployment's files."""
RAM_DISK = "/dev/shm"
"""A tmpfs an operator may preload a model into; readable inside the sandbox."""

NVIDIA_DEVICE_GROUPS: tuple[str, ...] = ("nvidia", "nvidia-frontend", "nvidia-uvm", "nvidia-caps")
"""``/proc/devices`` character-device groups CUDA opens, each allowed ``rw`` as
``DeviceAllow=char-<group>``:

* ``nvidia`` (driver >= 550.40) / ``nvidia-frontend`` (older drivers): major 195, i.e.
  ``/dev/nvidia0..N``, ``/dev/nvidiactl`` (minor 255) and ``/dev/nvidia-modeset`` (254).
  NVIDIA renamed the group in 550.40 (NVIDIA/nvidia-container-toolkit
  ``internal/info/proc/devices/devices.go``: "For GPU drivers 550.40.x or greater, the gpu
  device has been renamed from nvidia-frontend to nvidia"); Blackwell needs >= 570, so
  ``char-nvidia-frontend`` alone would leave every GPU closed.
* ``nvidia-uvm``: ``/dev/nvidia-uvm`` and ``/dev/nvidia-uvm-tools`` (unified memory; CUDA
  will not initialise without it).
* ``nvidia-caps``: ``/dev/nvidia-caps/nvidia-cap*`` (MIG config/monitor capabilities;
  NVIDIA MIG user guide, "Device nodes").

A group missing from ``/proc/devices`` (an older or newer driver) is skipped by systemd.
"""
NVLINK_DEVICE_GROUPS: tuple[str, ...] = ("nvidia-caps-imex-channels",)
"""Extra groups on NVLink host classes: ``/dev/nvidia-caps-imex-channels/channel*``, which
CUDA needs to export/import ``CU_MEM_HANDLE_TYPE_FABRIC`` handles (NCCL's cuMem path
probes them on NVLink systems and falls back to POSIX fds without). The NVSwitch nodes
(``nvidia-nvswitch*``, ``nvidia-nvlink``) belong to nvidia-fabricmanager, not to CUDA
applications, and stay closed."""

SYSCALL_ALLOW: tuple[tuple[str, str], ...] = (
    ("@system-service", "the base set for services (systemd-analyze syscall-filter): file, socket, "
                        "process, ioctl (every CUDA driver call is an ioctl on /dev/nvidia*), mmap/mprotect "
                        "(PROT_EXEC for the PyTorch/Triton/DeepGEMM JIT), @ipc (shmget/memfd_create: NCCL and "
                        "torch.multiprocessing shared memory), @resources (sched_setaffinity: NCCL binds "
                        "threads to the GPU's NUMA node; mbind/set_mempolicy: NUMA-local host buffers), "
                        "@process (clone3, pidfd_open), @memlock (pinned host memory)"),
    ("pidfd_getfd", "in @debug, not @system-service: cuMem memory shared between ranks as POSIX fds is "
                    "imported with pidfd_open + pidfd_getfd (PyTorch c10/cuda/CUDACachingAllocator.cpp, "
                    "expandable segments handle type POSIX_FD)"),
)
"""``SystemCallFilter=`` allow list of the SGLang unit, each entry with why it is needed.
Calls outside it fail with ``EPERM`` (``SystemCallErrorNumber=EPERM``), not a kill."""
SYSCALL_DENY: tuple[tuple[str, str], ...] = (
    ("@privileged", "setuid/chroot/acct/bpf...: the unit has no capabilities, so these only fail anyway"),
    ("@mount", "no mounts from inside the service"),
    ("@module", "no kernel modules (ProtectKernelModules; device nodes come from ddtree-nvidia-devices)"),
    ("@raw-io", "no ioperm/iopl/pciconfig: GPU access is through the driver's ioctls"),
    ("@reboot", "never"),
    ("@swap", "never"),
    ("@clock", "never (ProtectClock)"),
    ("@cpu-emulation", "no vm86/modify_ldt"),
    ("@obsolete", "no obsolete calls"),
)
"""``SystemCallFilter=~`` groups removed again from the allow list (a later deny wins)."""


@dataclass(frozen=True)
class UnitSandbox:
    """What the SGLang unit's sandbox directives get (computed, the template only prints it).

    Attributes:
        read_write_paths: ``ReadWritePaths=`` (state and cache dirs; everything else is
            read-only under ``ProtectSystem=strict``).
        protect_home: ``ProtectHome=`` value, ``yes`` or ``read-only`` (a model or draft
            directory under ``/home``, ``/root`` or ``/run/user``).
        device_allow: ``DeviceAllow=`` values (``char-<group> rw``).
        syscall_allow: ``SystemCallFilter=`` allow list.
        syscall_deny: ``SystemCallFilter=~`` deny list.
    """

    read_write_paths: tuple[str, ...]
    protect_home: str
    device_allow: tuple[str, ...]
    syscall_allow: tuple[str, ...]
    syscall_deny: tuple[str, ...]


def _under(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _local_model_paths(d: Deployment) -> list[tuple[str, str]]:
    """(field, path) of the model and draft when they are absolute local paths (not HF ids)."""
    out = [("ddtree_model.path", d.model.path)]
    if d.speculative.draft_model_path:
        out.append(("ddtree_speculative.draft_model_path", d.speculative.draft_model_path))
    return [(f, p) for f, p in out if p.startswith("/")]


def _service_paths(d: Deployment) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(writable, read-only) (field, path) pairs the unit itself needs."""
    s = d.service
    writable = [(f"{SVC}.state_dir", s.state_path), (f"{SVC}.cache_dir", s.cache_path)]
    readonly = [(f"{SVC}.config_dir", s.config_path), (f"{SVC}.venv", s.venv),
                (f"{SVC}.sglang_venv", s.sglang_venv_path)]
    return writable, readonly


def unit_sandbox(d: Deployment) -> UnitSandbox:
    """The sandbox of ``d``'s SGLang unit (see :class:`UnitSandbox`). Call it on a
    deployment that passed :func:`rule_sandbox_paths` (paths it refuses are not re-checked)."""
    hc = HOST_CLASSES.get(d.host_class)
    groups = NVIDIA_DEVICE_GROUPS + (NVLINK_DEVICE_GROUPS if hc is not None and hc.interconnect == "nvlink" else ())
    home = any(_under(p, t) for _, p in _local_model_paths(d) for t in HIDDEN_BY_PROTECT_HOME)
    writable, _ = _service_paths(d)
    return UnitSandbox(
        read_write_paths=tuple(dict.fromkeys(p for _, p in writable)),
        protect_home="read-only" if home else "yes",
        device_allow=tuple(f"char-{g} rw" for g in groups),
        syscall_allow=tuple(n for n, _ in SYSCALL_ALLOW),
        syscall_deny=tuple(n for n, _ in SYSCALL_DENY),
    )


def rule_sandbox_paths(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Every path the unit needs survives its sandbox: state/cache (written) not under a tree
    ``ProtectHome``/``PrivateTmp`` hides or an API file system; venvs and the config dir (read,
    plan.json by the ExecStartPost health/warmup) not hidden either; a local model or draft
    under ``/home``, ``/root``, ``/run/user`` gets ``ProtectHome=read-only`` (warning), one
    under ``/tmp``, ``/var/tmp``, ``/proc``, ``/sys`` or ``/dev`` (but ``/dev/shm``) is refused."""
    writable, readonly = _service_paths(d)
    for field, path in writable + readonly:
        kind = "written" if (field, path) in writable else "read"
        for tree in HIDDEN_BY_PROTECT_HOME:
            if _under(path, tree):
                yield Finding("error", field, path,
                              f"the unit runs with ProtectHome=yes, which hides {tree}; a directory the service "
                              f"{kind}s cannot live there",
                              "use a system path such as /var/lib/ddtree-ops/<name> (state), /var/cache/ddtree-ops/"
                              "<name> (cache), /opt/ddtree-ops/venv (venvs) or /etc/ddtree-ops/<name> (config)",
                              SYSTEMD_EXEC)
        for tree in PRIVATE_TMP:
            if _under(path, tree):
                yield Finding("error", field, path,
                              f"the unit runs with PrivateTmp=yes: it sees its own empty {tree}, not this directory "
                              "(and systemd-tmpfiles ages files there)", "use a persistent path under /var or /opt",
                              SYSTEMD_EXEC)
        for tree in KERNEL_TREES:
            if _under(path, tree):
                yield Finding("error", field, path,
                              f"{tree} is a kernel API file system (read-only or closed in the unit: "
                              "ProtectKernelTunables, ProtectControlGroups, DevicePolicy=closed)",
                              "use a path on a real file system under /var or /opt", SYSTEMD_EXEC)
    for field, path in _local_model_paths(d):
        for tree in HIDDEN_BY_PROTECT_HOME:
            if _under(path, tree):
                yield Finding("warning", field, path,
                              f"the model is under {tree}, which the unit would hide: rendered with "
                              "ProtectHome=read-only (all of /home, /root and /run/user readable by the service)",
                              "move the checkpoint to e.g. /srv/models to keep ProtectHome=yes", SYSTEMD_EXEC)
        if _under(path, RAM_DISK):
            continue
        for tree in PRIVATE_TMP + KERNEL_TREES:
            if _under(path, tree):
                yield Finding("error", field, path,
                              f"the unit cannot read a checkpoint under {tree} (PrivateTmp=yes gives it its own "
                              "/tmp and /var/tmp; /proc, /sys and /dev are kernel trees)",
                              f"move the checkpoint to e.g. /srv/models (or {RAM_DISK} to serve it from RAM)",
                              SYSTEMD_EXEC)


def rule_service_not_root(d: Deployment, p: Plan) -> Iterator[Finding]:
    """``ddtree_service.user``/``group`` are not root: the sandbox (no capabilities,
    ``ProtectSystem=strict``) assumes an unprivileged account, and root would own every GPU
    and the model cache of the host; systemd-analyze security scores a root unit 7.9 EXPOSED."""
    for name in ("user", "group"):
        value = getattr(d.service, name)
        if value == "root":
            yield Finding("error", f"{SVC}.{name}", value,
                          f"SGLang must not run as {name} root (it parses untrusted requests and loads remote code "
                          "with trust_remote_code)",
                          f"remove {name} (default sglang: the role creates that system account) or name another "
                          "unprivileged account", SYSTEMD_EXEC)
