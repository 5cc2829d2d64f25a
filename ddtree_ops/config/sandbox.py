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

import functools
from collections.abc import Iterator
from dataclasses import dataclass

from .errors import Finding
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

FHS = "file-hierarchy(7), FHS 3.0"
SYSTEM_TREES: tuple[str, ...] = (
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/efi",
    "/run", "/var/run", "/var/lock", "/var/log", "/var/spool", "/var/mail", "/var/backups",
    "/var/lib/dpkg", "/var/lib/apt", "/var/lib/systemd", "/var/lib/private", "/var/cache/apt",
    "/var/cache/debconf", "/var/cache/private", "/var/cache/ldconfig",
)
"""Trees of the operating system (file-hierarchy(7), FHS 3.0): configuration, programs and
libraries (``/etc``, ``/usr`` and its merged-``/usr`` links), the boot loader, volatile runtime
state (``/run``, ``/var/run``, ``/var/lock``: wiped at boot, and ``/run/ddtree-ops/<name>`` is
the unit's own ``RuntimeDirectory=``, which systemd removes whenever it stops), logs, mail,
spools, the package manager's and systemd's own state. A directory the service **writes**
(state, cache) must not be, contain or lie under one: ``ReadWritePaths=`` would open it to the
service and the role (``roles/ddtree_service`` "Service directories") would chown it to the
service account with mode 0750, voiding the sandbox and breaking the host."""
SYSTEM_ROOTS: tuple[str, ...] = ("/", "/var", "/var/lib", "/var/cache", "/opt", "/srv", "/home", "/root",
                                 "/mnt", "/media", "/usr/local", "/tmp", "/var/tmp", "/proc", "/sys", "/dev")
"""Directories that hold many owners' trees (file-hierarchy(7), FHS 3.0): a deployment may live
*below* one (``/var/lib/ddtree-ops/<name>``, ``/opt/ddtree-ops/venv``), never *be* one or contain
one, since the roles create, chown and chmod every directory they are given."""
MIN_WRITABLE_DEPTH = 2
"""A written directory is at least two levels deep (``/data/sglang``, not ``/data``): a top-level
directory is shared by whatever else the host keeps there, and the role would hand all of it to
the service account."""

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
    hc = d.host_class_def
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


def _hidden(path: str) -> bool:
    """True when the directive checks of :func:`rule_sandbox_paths` already refuse ``path``."""
    return any(_under(path, t) for t in HIDDEN_BY_PROTECT_HOME + PRIVATE_TMP + KERNEL_TREES)


def _system_tree_findings(writable: tuple[tuple[str, str], ...],
                          readonly: tuple[tuple[str, str], ...]) -> Iterator[Finding]:
    """The directories the roles create and chown are the deployment's own (rule and reason:
    :data:`SYSTEM_TREES`, :data:`SYSTEM_ROOTS`, :data:`MIN_WRITABLE_DEPTH`):

    * none of state, cache, config, venv, sglang_venv is, or contains, a system tree or root;
    * the venv's parent (the role makes it root-owned 0755) is not a system tree or root;
    * state and cache (written) do not lie under a system tree, are at least two levels deep,
      and overlap neither each other nor a venv (``<sglang_venv>.builds`` included) or the
      config dir: a writable venv lets the service rewrite the code the exporter and the
      unit's ``ExecStartPost`` health/warmup run, a writable config dir its own plan.json.

    One finding per field (the first problem); paths the directive checks already refuse are skipped.
    ``writable``, ``readonly``: :func:`_service_paths` of the deployment.
    """
    paths = dict(writable + readonly)
    venv, sglang_venv = paths[f"{SVC}.venv"], paths[f"{SVC}.sglang_venv"]
    trees = SYSTEM_TREES + SYSTEM_ROOTS
    bad: set[str] = set()
    for field, path in writable + readonly:
        if _hidden(path):
            bad.add(field)
            continue
        tree = path if path in trees else next((t for t in trees if _under(t, path)), None)
        if tree is not None:
            what = "is a system directory itself" if tree == path else f"contains {tree}, a system directory"
            yield Finding(
                "error",
                field,
                path,
                f"{path} {what}; the role creates and chowns this directory (and ReadWritePaths= would open a written "
                "one to the service), which would take a system tree over",
                _fix_for(field),
                FHS,
            )
            bad.add(field)
    parent = venv.rsplit("/", 1)[0] or "/"
    if f"{SVC}.venv" not in bad and any(_under(t, parent) for t in trees):
        yield Finding("error", f"{SVC}.venv", venv,
                      f"the venv's parent {parent} is a system directory; the role makes the venv's parent "
                      "root-owned with mode 0755", "give the venv a directory of its own, e.g. /opt/ddtree-ops/venv",
                      FHS)
    owned = [(f, p) for f, p in readonly] + [(f"{SVC}.sglang_venv", f"{sglang_venv}.builds")]
    seen: list[tuple[str, str]] = []
    for field, path in writable:
        if field in bad:
            continue
        tree = next((t for t in SYSTEM_TREES if _under(path, t)), None)
        other = next(((f, p) for f, p in owned + seen if _under(path, p) or _under(p, path)), None)
        if tree is not None:
            yield Finding("error", field, path,
                          f"a directory the service writes must not lie under {tree} (an operating-system tree: "
                          "ReadWritePaths= would open it to the service and the role would chown it to the service "
                          "account)", _fix_for(field), FHS)
        elif path.count("/") < MIN_WRITABLE_DEPTH:
            yield Finding("error", field, path,
                          f"a directory the service writes must be at least {MIN_WRITABLE_DEPTH} levels deep (a "
                          "top-level directory is shared with whatever else the host keeps there, and the role "
                          "hands it to the service account)", f"use a directory of its own, e.g. {path}/sglang", FHS)
        elif other is not None:
            yield Finding("error", field, path,
                          f"overlaps {other[0]} ({other[1]}); the service may write here, so it could rewrite "
                          "what lives there (the venvs hold the code the exporter and the unit's ExecStartPost "
                          "run, the config dir its plan.json), and state and cache need separate trees",
                          "give state_dir and cache_dir their own trees, apart from each other, the venvs and "
                          "config_dir (defaults /var/lib/ddtree-ops/<name>, /var/cache/ddtree-ops/<name>)", FHS)
        seen.append((field, path))


def _fix_for(field: str) -> str:
    return {f"{SVC}.state_dir": "use a directory of its own, e.g. /var/lib/ddtree-ops/<name> (the default)",
            f"{SVC}.cache_dir": "use a directory of its own, e.g. /var/cache/ddtree-ops/<name> (the default)",
            f"{SVC}.config_dir": "use a directory of its own, e.g. /etc/ddtree-ops/<name> (the default)",
            }.get(field, "use a directory of its own, e.g. /opt/ddtree-ops/venv or /opt/ddtree-ops/sglang-venv")


_HIDING_DIRECTIVES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (HIDDEN_BY_PROTECT_HOME,
     "the unit runs with ProtectHome=yes, which hides {tree}; a directory the service {kind}s cannot live there",
     "use a system path such as /var/lib/ddtree-ops/<name> (state), /var/cache/ddtree-ops/<name> (cache), "
     "/opt/ddtree-ops/venv (venvs) or /etc/ddtree-ops/<name> (config)"),
    (PRIVATE_TMP,
     "the unit runs with PrivateTmp=yes: it sees its own empty {tree}, not this directory "
     "(and systemd-tmpfiles ages files there)", "use a persistent path under /var or /opt"),
    (KERNEL_TREES,
     "{tree} is a kernel API file system (read-only or closed in the unit: ProtectKernelTunables, "
     "ProtectControlGroups, DevicePolicy=closed)", "use a path on a real file system under /var or /opt"),
)
"""(trees, rule, fix) of each directive that hides a tree from the unit, for the service's own
paths (``{kind}``: ``write`` for state/cache, ``read`` for venvs and the config dir)."""


def rule_sandbox_paths(d: Deployment, p: Plan) -> Iterator[Finding]:
    """Every path the unit needs survives its sandbox and is the deployment's own
    (:func:`_system_tree_findings`): state/cache (written) not under a tree
    ``ProtectHome``/``PrivateTmp`` hides or an API file system; venvs and the config dir (read,
    plan.json by the ExecStartPost health/warmup) not hidden either; a local model or draft
    under ``/home``, ``/root``, ``/run/user`` gets ``ProtectHome=read-only`` (warning), one
    under ``/tmp``, ``/var/tmp``, ``/proc``, ``/sys`` or ``/dev`` (but ``/dev/shm``) is refused.

    The findings depend on these seven paths alone, which the hosts of a group share: they are
    worked out once per distinct set of paths (:func:`_sandbox_path_findings`)."""
    writable, readonly = _service_paths(d)
    yield from _sandbox_path_findings(tuple(writable), tuple(readonly), tuple(_local_model_paths(d)))


@functools.lru_cache(maxsize=1024)
def _sandbox_path_findings(writable: tuple[tuple[str, str], ...], readonly: tuple[tuple[str, str], ...],
                           models: tuple[tuple[str, str], ...]) -> tuple[Finding, ...]:
    """The findings of :func:`rule_sandbox_paths` for the service's (field, path) pairs
    (:func:`_service_paths`) and its local model paths (:func:`_local_model_paths`), in order."""
    return tuple(_sandbox_path_findings_of(writable, readonly, models))


def _sandbox_path_findings_of(writable: tuple[tuple[str, str], ...], readonly: tuple[tuple[str, str], ...],
                              models: tuple[tuple[str, str], ...]) -> Iterator[Finding]:
    for field, path in writable + readonly:
        kind = "write" if (field, path) in writable else "read"
        for trees, rule, fix in _HIDING_DIRECTIVES:
            for tree in trees:
                if _under(path, tree):
                    yield Finding("error", field, path, rule.format(tree=tree, kind=kind), fix, SYSTEMD_EXEC)
    yield from _system_tree_findings(writable, readonly)
    for field, path in models:
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


BASE_PASSWD = "Debian base-passwd 3.6 (/usr/share/base-passwd/passwd.master, group.master)"
SYSTEM_USERS = frozenset({
    "root", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy", "www-data",
    "backup", "list", "irc", "gnats", "_apt", "nobody",
})
"""Debian's static system users (:data:`BASE_PASSWD`; ``gnats`` until base-passwd 3.6, ``_apt``
since). The role's ``user`` task would rewrite an existing account's primary group, home and
shell, and these own system files (``bin``, ``man``, ``mail``...) or are the shared
"unprivileged" identity (``nobody``) other daemons run as."""
SYSTEM_GROUPS = frozenset({
    "root", "daemon", "bin", "sys", "adm", "tty", "disk", "lp", "mail", "news", "uucp", "man", "proxy", "kmem",
    "dialout", "fax", "voice", "cdrom", "floppy", "tape", "sudo", "audio", "dip", "www-data", "backup", "operator",
    "list", "irc", "src", "gnats", "shadow", "utmp", "video", "sasl", "plugdev", "staff", "games", "users", "nogroup",
})
"""Debian's static system groups (:data:`BASE_PASSWD`): membership grants access to
devices or files of the system (``disk``: raw block devices; ``kmem``: kernel memory;
``shadow``: ``/etc/shadow``; ``adm``: logs; ``staff``: writes ``/usr/local``; ``sudo``: root)."""
PRIVILEGED_GROUPS = frozenset({
    "wheel", "docker", "lxd", "kvm", "libvirt", "libvirt-qemu", "systemd-journal", "input", "render",
    "netdev", "bluetooth", "sgx", "tss", "ssl-cert", "_ssh", "crontab", "messagebus", "systemd-network",
})
"""Groups created by other packages whose members gain root or other services' secrets:
``wheel`` (su/sudo), ``docker``/``lxd`` (root through the daemon's socket: docker(1) "Manage
Docker as a non-root user"), ``kvm``/``libvirt`` (VMs, ``/dev/kvm``), ``systemd-journal``
(every unit's logs), ``ssl-cert`` (TLS private keys), ``tss`` (the TPM), ``input``/``render``
(other users' input and GPU render nodes)."""


def rule_service_not_root(d: Deployment, p: Plan) -> Iterator[Finding]:
    """``ddtree_service.user``/``group`` are not root, not a Debian system account
    (:data:`SYSTEM_USERS`, :data:`SYSTEM_GROUPS`) and not a privileged group
    (:data:`PRIVILEGED_GROUPS`): the sandbox (no capabilities, ``ProtectSystem=strict``)
    assumes an unprivileged account of its own; root would own every GPU and the model cache
    of the host (systemd-analyze security scores a root unit 7.9 EXPOSED), a system group
    opens system files inside the unit (``shadow``: ``/etc/shadow``; ``docker``: root via
    ``docker.sock``), and the role's ``user`` task would rewrite an existing system account's
    group, home and shell."""
    for name in ("user", "group"):
        value = getattr(d.service, name)
        fix = (f"remove {name} (default sglang: the role creates that system account) or name an account used "
               "only by this service")
        if value == "root":
            yield Finding("error", f"{SVC}.{name}", value,
                          f"SGLang must not run as {name} root (it parses untrusted requests and loads remote code "
                          "with trust_remote_code)", fix, SYSTEMD_EXEC)
        elif name == "user" and value in SYSTEM_USERS:
            yield Finding("error", f"{SVC}.{name}", value,
                          f"{value} is a system user of the distribution; the role would rewrite the existing "
                          "account (primary group, home, shell) and SGLang would share its files and identity "
                          "with the system", fix, BASE_PASSWD)
        elif name == "group" and value in SYSTEM_GROUPS:
            yield Finding("error", f"{SVC}.{name}", value,
                          f"{value} is a system group of the distribution; the unit would run with it and reach "
                          "the system files or devices it owns (e.g. disk: raw block devices, shadow: /etc/shadow, "
                          "adm: the logs)", fix.replace("system account", "system group"), BASE_PASSWD)
        elif name == "group" and value in PRIVILEGED_GROUPS:
            yield Finding("error", f"{SVC}.{name}", value,
                          f"{value} is a privileged group (its members reach root, devices or other services' "
                          "secrets); the unit would run with it", fix, BASE_PASSWD + "; docker(1), systemd-journald(8)")
