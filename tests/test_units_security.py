"""The rendered units' sandbox: measured exposure scores of every shipped inventory
(``systemd-analyze security --offline=yes``), ``systemd-analyze verify``, the device ACL,
the system-call filter CUDA needs, the NVIDIA device-node unit, the deployments whose
paths a sandbox directive would hide (refused or rendered with the narrow exception), and
the deploy-time check that a unit's port is free or its own (``ddtree-ops port-check``)."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
from helpers import REPO

from ddtree_ops.cli import main
from ddtree_ops.config import ConfigError, validate_hostvars
from ddtree_ops.config.sandbox import SYSCALL_ALLOW, SYSCALL_DENY
from ddtree_ops.host.ports import check_port, unit_of
from ddtree_ops.render import render_host
from ddtree_ops.render.files import DEVICES_UNIT, NVIDIA_MODPROBE

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
INVENTORIES = ("example", "test", "dflash-example")
BUDGET = {"ddtree-sglang.service": 2.0, "ddtree-sglang-exporter.service": 1.5, DEVICES_UNIT: 4.5}
"""Highest accepted exposure per unit (systemd 252). Measured: SGLang 1.7 (7.5 before the
sandbox), exporter 1.1 (3.2), device-node unit 4.5."""
_SCORE = re.compile(r"Overall exposure level for \S+: ([0-9.]+) ")


def _render(inv: str, out: Path) -> list[Path]:
    assert main(["render", "--out", str(out), "-i", str(REPO / "inventory" / inv)]) == 0
    units = sorted(out.glob("*/etc/systemd/system/*.service"))
    assert units
    return units


def _score(unit: Path, threshold: int | None = None) -> tuple[float, int]:
    args = [ANALYZE, "security", "--offline=yes", "--no-pager"]
    if threshold is not None:
        args.append(f"--threshold={threshold}")
    r = subprocess.run([*args, str(unit)], capture_output=True, text=True, timeout=60)
    m = _SCORE.search(r.stdout)
    assert m, r.stdout + r.stderr
    return float(m.group(1)), r.returncode


def _unit(hostvars: dict, name: str = "/etc/systemd/system/ddtree-sglang.service") -> str:
    return {f.path: f.content for f in render_host(validate_hostvars("h1", hostvars))}[name]


def _directives(unit: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith(key + "=")]


@needs_analyze
@pytest.mark.parametrize("inv", INVENTORIES)
def test_every_shipped_unit_scores_within_budget(inv, tmp_path):
    for unit in _render(inv, tmp_path):
        budget = BUDGET[unit.name]
        score, rc = _score(unit, threshold=int(budget * 10))
        assert score <= budget and rc == 0, f"{unit}: exposure {score} > {budget}"


@needs_analyze
def test_score_check_fails_on_the_unhardened_unit(tmp_path):
    """The budget check can fail: the unit without its sandbox lines scores above 4.5."""
    unit = _render("example", tmp_path)[0].parent / "ddtree-sglang.service"
    keep = ("Protect", "Restrict", "SystemCall", "Device", "Capability", "Private", "UMask", "NoNewPriv")
    stripped = tmp_path / "stripped" / unit.name
    stripped.parent.mkdir()
    stripped.write_text("".join(line for line in unit.read_text().splitlines(keepends=True)
                                if not line.startswith(keep)))
    score, rc = _score(stripped, threshold=45)
    assert score > 4.5 and rc != 0


def _fake_root(tmp_path: Path, units: list[Path]) -> Path:
    """A root directory holding the distribution's units plus the rendered ones, and an
    executable file at every ``Exec*=`` path (verify checks they exist; nothing runs them)."""
    root = tmp_path / "root"
    shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    for u in units:
        text = u.read_text()
        (root / "etc/systemd/system" / u.name).write_text(text)
        for exe in re.findall(r"^Exec\w+=-?(/\S+)", text, flags=re.M):
            p = root / exe.lstrip("/")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text("#!/bin/sh\n")
            p.chmod(0o755)
    return root


@needs_analyze
@pytest.mark.skipif(not Path("/lib/systemd/system/multi-user.target").exists(), reason="no systemd unit directory")
@pytest.mark.parametrize("inv", INVENTORIES)
def test_every_shipped_unit_passes_systemd_analyze_verify(inv, tmp_path):
    units = _render(inv, tmp_path / "out")
    for host in sorted({u.parents[3].name for u in units}):
        mine = [u for u in units if u.parents[3].name == host]
        root = _fake_root(tmp_path / host, mine)
        for u in mine:
            r = subprocess.run([ANALYZE, "verify", "--man=no", f"--root={root}",
                                str(root / "etc/systemd/system" / u.name)], capture_output=True, text=True, timeout=60)
            assert r.returncode == 0 and not r.stderr.strip(), f"{u}: {r.stderr}"


@needs_analyze
def test_verify_catches_a_bad_directive(tmp_path):
    units = _render("test", tmp_path / "out")
    root = _fake_root(tmp_path, units)
    unit = root / "etc/systemd/system/ddtree-sglang.service"
    unit.write_text(
        unit.read_text().replace("SystemCallFilter=@system-service", "SystemCallFilter=@system-service nosuchcall")
    )
    r = subprocess.run([ANALYZE, "verify", "--man=no", f"--root={root}", str(unit)], capture_output=True, text=True,
                       timeout=60)
    assert "nosuchcall" in r.stderr


def _syscall_groups() -> dict[str, list[str]]:
    out = subprocess.run([ANALYZE, "syscall-filter", "--no-pager"], capture_output=True, text=True, timeout=60).stdout
    groups: dict[str, list[str]] = {}
    cur = None
    for line in out.splitlines():
        s = line.strip()
        if line.startswith("@"):
            cur = groups.setdefault(s, [])
        elif s and not s.startswith("#") and cur is not None:
            cur.append(s)
    return groups


@needs_analyze
def test_syscall_filter_leaves_cuda_nccl_and_the_jit_their_calls(hostvars):
    """Effective allow list = allow groups minus deny groups (a later ``~`` wins)."""
    groups = _syscall_groups()

    def expand(names) -> set[str]:
        out: set[str] = set()
        for n in names:
            out |= expand(groups[n]) if n.startswith("@") else {n}
        return out

    unit = _unit(hostvars)
    allow = expand(_directives(unit, "SystemCallFilter")[0].split())
    deny = expand(_directives(unit, "SystemCallFilter")[1].removeprefix("~").split())
    assert [n for n, _ in SYSCALL_ALLOW] == _directives(unit, "SystemCallFilter")[0].split()
    assert [n for n, _ in SYSCALL_DENY] == _directives(unit, "SystemCallFilter")[1].removeprefix("~").split()
    effective = allow - deny
    needed = {"ioctl", "mmap", "mprotect", "munmap", "madvise", "mlock",  # CUDA driver, pinned memory, JIT
              "shmget", "shmat", "memfd_create", "futex", "eventfd2",      # NCCL / torch.multiprocessing IPC
              "sched_setaffinity", "sched_getaffinity", "mbind", "set_mempolicy", "get_mempolicy",  # NUMA binding
              "pidfd_open", "pidfd_getfd", "clone3", "execve", "socket", "sendmsg", "recvmsg"}
    assert needed <= effective, sorted(needed - effective)
    assert not {"init_module", "finit_module", "mount", "reboot", "ptrace", "iopl", "setuid"} & effective
    assert "SystemCallErrorNumber=EPERM" in unit


def test_device_acl_names_every_nvidia_group(hostvars):
    unit = _unit(hostvars)
    assert _directives(unit, "DevicePolicy") == ["closed"]
    allow = _directives(unit, "DeviceAllow")
    assert {"char-nvidia rw", "char-nvidia-frontend rw", "char-nvidia-uvm rw", "char-nvidia-caps rw"} <= set(allow)
    assert "char-nvidia-caps-imex-channels rw" in allow   # b300: NVLink
    hostvars["ddtree_host_class"] = "ct200"
    hostvars["ddtree_server"]["attention_backend"] = "triton"
    ct = _directives(_unit(hostvars), "DeviceAllow")
    assert "char-nvidia-caps-imex-channels rw" not in ct and "char-nvidia-uvm rw" in ct
    for key, value in (("PrivateDevices", None), ("MemoryDenyWriteExecute", None), ("CapabilityBoundingSet", [""]),
                       ("ProtectProc", ["invisible"]), ("UMask", ["0027"]), ("RestrictNamespaces", ["yes"]),
                       ("RestrictAddressFamilies", ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"])):
        assert _directives(unit, key) == (value or []), key


def test_sglang_unit_starts_after_the_device_nodes(hostvars):
    files = {f.path: f for f in render_host(validate_hostvars("h1", hostvars))}
    unit = files["/etc/systemd/system/ddtree-sglang.service"].content
    assert DEVICES_UNIT in _directives(unit, "After")[0].split()
    assert DEVICES_UNIT in _directives(unit, "Wants")[0].split()
    dev = files[f"/etc/systemd/system/{DEVICES_UNIT}"]
    assert dev.component == "devices" and dev.mode == "0644"
    assert _directives(dev.content, "Type") == ["oneshot"] and _directives(dev.content, "RemainAfterExit") == ["yes"]
    cmds = _directives(dev.content, "ExecStart")
    assert cmds[0] == f"{NVIDIA_MODPROBE} -u -c=0"
    assert [f"{NVIDIA_MODPROBE} -c={i}" for i in range(1, 8)] == cmds[1:8]   # b300: 8 GPUs
    # MIG capability nodes: "-" prefixed, a GPU or driver without MIG must not fail the unit
    assert len(cmds) == 10 and all(
        c.startswith(f"-{NVIDIA_MODPROBE} -f /proc/driver/nvidia/capabilities/mig/") for c in cmds[8:]
    )
    assert _directives(dev.content, "WantedBy") == ["multi-user.target"]


def test_exporter_runs_as_its_own_identity(hostvars):
    unit = _unit(hostvars, "/etc/systemd/system/ddtree-sglang-exporter.service")
    assert _directives(unit, "DynamicUser") == ["yes"]
    assert not _directives(unit, "User") and not _directives(unit, "Group")
    assert "EnvironmentFile" not in unit and _directives(unit, "ProtectHome") == ["yes"]


# ------------------------------------------------------------------ refused or narrowed
def _refused(hostvars: dict, field: str, value: str) -> str:
    with pytest.raises(ConfigError) as e:
        validate_hostvars("h1", hostvars)
    lines = [f.message() for f in e.value.findings if f.field == field and f.level == "error"]
    assert lines, str(e.value)
    assert f"{field} = {value!r}" in lines[0] and "Fix: " in lines[0]
    return lines[0]


@pytest.mark.parametrize("name", ["user", "group"])
def test_root_service_account_refused(hostvars, name):
    hostvars["ddtree_service"] = {name: "root"}
    line = _refused(hostvars, f"ddtree_service.{name}", "root")
    assert "must not run as" in line


@pytest.mark.parametrize(("field", "path", "directive"), [
    ("state_dir", "/home/ops/sglang", "ProtectHome"),
    ("cache_dir", "/root/.cache/sglang", "ProtectHome"),
    ("state_dir", "/run/user/1000/sglang", "ProtectHome"),
    ("cache_dir", "/tmp/sglang-cache", "PrivateTmp"),
    ("state_dir", "/var/tmp/sglang", "PrivateTmp"),
    ("cache_dir", "/dev/shm/cache", "kernel API"),
    ("state_dir", "/proc/sglang", "kernel API"),
    ("state_dir", "/sys/fs/sglang", "kernel API"),
    ("venv", "/home/ops/venv", "ProtectHome"),
    ("sglang_venv", "/tmp/sglang-venv", "PrivateTmp"),
    ("config_dir", "/root/ddtree", "ProtectHome"),
])
def test_service_path_hidden_by_a_directive_refused(hostvars, field, path, directive):
    hostvars["ddtree_service"] = {field: path}
    assert directive in _refused(hostvars, f"ddtree_service.{field}", path)


@pytest.mark.parametrize(("field", "path"), [
    ("ddtree_model.path", "/tmp/models/kimi"),
    ("ddtree_model.path", "/var/tmp/kimi"),
    ("ddtree_model.path", "/proc/kimi"),
    ("ddtree_speculative.draft_model_path", "/tmp/draft"),
])
def test_checkpoint_the_unit_cannot_read_refused(hostvars, field, path):
    section, key = field.split(".")
    hostvars[section][key] = path
    assert "cannot read a checkpoint" in _refused(hostvars, field, path)


@pytest.mark.parametrize(("field", "path"), [
    ("ddtree_model.path", "/home/ops/models/kimi"),
    ("ddtree_speculative.draft_model_path", "/root/draft"),
])
def test_checkpoint_under_home_gets_read_only_home_and_a_warning(hostvars, field, path):
    section, key = field.split(".")
    hostvars[section][key] = path
    v = validate_hostvars("h1", hostvars)
    assert any(w.field == field and "ProtectHome=read-only" in w.rule for w in v.warnings)
    assert _directives(_unit(hostvars), "ProtectHome") == ["read-only"]


def test_paths_in_the_sandbox_default_and_custom(hostvars):
    unit = _unit(hostvars)
    assert _directives(unit, "ProtectHome") == ["yes"]
    assert _directives(unit, "ReadWritePaths") == ["/var/lib/ddtree-ops/sglang /var/cache/ddtree-ops/sglang"]
    hostvars["ddtree_model"]["path"] = "/dev/shm/kimi"          # preloaded into RAM: readable, fine
    hostvars["ddtree_service"] = {"state_dir": "/srv/sglang/state", "cache_dir": "/data/cache"}
    v = validate_hostvars("h1", hostvars)
    assert not [w for w in v.warnings if w.field.startswith(("ddtree_model", "ddtree_service"))]
    unit = _unit(hostvars)
    assert _directives(unit, "ReadWritePaths") == ["/srv/sglang/state /data/cache"]
    assert _directives(unit, "ProtectHome") == ["yes"]


# ------------------------------------------------------------------ the deployment's own directories and account
@pytest.mark.parametrize(("field", "path", "why"), [
    ("state_dir", "/etc", "is a system directory itself"),
    ("state_dir", "/usr", "is a system directory itself"),
    ("cache_dir", "/var", "is a system directory itself"),
    ("state_dir", "/var/lib", "is a system directory itself"),
    ("cache_dir", "/var/cache", "is a system directory itself"),
    ("state_dir", "/opt", "is a system directory itself"),
    ("state_dir", "/usr/local", "is a system directory itself"),
    ("state_dir", "/etc/systemd/system", "must not lie under /etc"),
    ("cache_dir", "/usr/share/sglang", "must not lie under /usr"),
    ("state_dir", "/run/ddtree-ops/sglang", "must not lie under /run"),   # the unit's RuntimeDirectory
    ("state_dir", "/var/run/sglang", "must not lie under /var/run"),     # a link to /run
    ("cache_dir", "/var/log/sglang", "must not lie under /var/log"),
    ("state_dir", "/var/lib/dpkg/sglang", "must not lie under /var/lib/dpkg"),
    ("state_dir", "/boot/sglang", "must not lie under /boot"),
    ("state_dir", "/data", "at least 2 levels deep"),
    ("state_dir", "/opt/ddtree-ops/venv", "overlaps ddtree_service.venv"),
    ("state_dir", "/opt/ddtree-ops", "overlaps ddtree_service.venv"),           # contains both venvs
    ("cache_dir", "/opt/ddtree-ops/sglang-venv/cache", "overlaps ddtree_service.sglang_venv"),
    ("cache_dir", "/opt/ddtree-ops/sglang-venv.builds", "overlaps ddtree_service.sglang_venv"),
    ("state_dir", "/etc/ddtree-ops/sglang/state", "must not lie under /etc"),
    ("config_dir", "/etc", "is a system directory itself"),
    ("config_dir", "/var/lib", "is a system directory itself"),
    ("venv", "/usr", "is a system directory itself"),
    ("venv", "/var", "is a system directory itself"),
    ("sglang_venv", "/opt", "is a system directory itself"),
    ("venv", "/opt/venv", "the venv's parent /opt is a system directory"),
    ("venv", "/venv", "the venv's parent / is a system directory"),
])
def test_system_tree_as_a_service_directory_refused(hostvars, field, path, why):
    """``state_dir: /etc`` rendered ReadWritePaths=/etc and the role would have
    chowned /etc to the service account (0750)."""
    hostvars["ddtree_service"] = {field: path}
    line = _refused(hostvars, f"ddtree_service.{field}", path)
    assert why in line and "file-hierarchy(7)" in line


def test_state_and_cache_must_not_overlap(hostvars):
    hostvars["ddtree_service"] = {"state_dir": "/data/sglang", "cache_dir": "/data/sglang/cache"}
    line = _refused(hostvars, "ddtree_service.cache_dir", "/data/sglang/cache")
    assert "overlaps ddtree_service.state_dir (/data/sglang)" in line
    hostvars["ddtree_service"] = {"state_dir": "/data/sglang", "cache_dir": "/data/sglang"}
    _refused(hostvars, "ddtree_service.cache_dir", "/data/sglang")


@pytest.mark.parametrize("service", [
    {"state_dir": "/srv/sglang/state", "cache_dir": "/srv/sglang/cache"},
    {"state_dir": "/var/lib/sglang", "cache_dir": "/var/cache/sglang", "config_dir": "/etc/sglang"},
    {"venv": "/usr/local/ddtree/venv", "sglang_venv": "/usr/local/ddtree/sglang"},  # read-only: may live in /usr
    {"state_dir": "/opt/ddtree-ops/state", "cache_dir": "/data/cache"},  # a sibling of the venvs, not inside
])
def test_own_directories_below_system_roots_accepted(hostvars, service):
    hostvars["ddtree_service"] = service
    v = validate_hostvars("h1", hostvars)
    assert not [w for w in v.warnings if w.field.startswith("ddtree_service")]


def test_a_hidden_path_gets_one_finding(hostvars):
    """/home is both hidden by ProtectHome and a system root: one line, the directive's."""
    hostvars["ddtree_service"] = {"state_dir": "/home"}
    with pytest.raises(ConfigError) as e:
        validate_hostvars("h1", hostvars)
    lines = [f.message() for f in e.value.findings if f.field == "ddtree_service.state_dir"]
    assert len(lines) == 1 and "ProtectHome" in lines[0]


def _master_names(name: str) -> list[str]:
    text = (REPO / "tests/fixtures/base-passwd" / name).read_text()
    return [line.split(":", 1)[0] for line in text.splitlines() if line.strip()]


@pytest.mark.parametrize(("field", "master"), [("user", "passwd.master"), ("group", "group.master")])
def test_every_base_passwd_account_refused(hostvars, field, master):
    """Every static user/group of Debian's base-passwd (fixture copied from the package) is
    refused as the service account (``_apt`` fails the name pattern first: also refused)."""
    names = _master_names(master)
    assert len(names) >= (18 if field == "user" else 38)
    for name in names:
        hostvars["ddtree_service"] = {field: name}
        with pytest.raises(ConfigError) as e:
            validate_hostvars("h1", hostvars)
        assert [f for f in e.value.findings if f.field == f"ddtree_service.{field}"], name


@pytest.mark.parametrize(("field", "value", "why"), [
    ("user", "daemon", "system user"), ("user", "nobody", "system user"),
    ("group", "shadow", "system group"), ("group", "disk", "system group"), ("group", "adm", "system group"),
    ("group", "docker", "privileged group"), ("group", "wheel", "privileged group"),
    ("group", "systemd-journal", "privileged group"), ("group", "lxd", "privileged group"),
])
def test_system_or_privileged_account_refused(hostvars, field, value, why):
    hostvars["ddtree_service"] = {field: value}
    line = _refused(hostvars, f"ddtree_service.{field}", value)
    assert why in line and "base-passwd" in line


def test_own_accounts_accepted(hostvars):
    hostvars["ddtree_service"] = {"user": "sglang-b300", "group": "ddtree"}
    assert validate_hostvars("h1", hostvars).deployment.service.group == "ddtree"


@pytest.mark.parametrize(("section", "key"), [("ddtree_model", "path"), ("ddtree_model", "served_model_name"),
                                            ("ddtree_speculative", "draft_model_path")])
def test_option_like_argv_value_refused(hostvars, section, key):
    """``--model-path -x``: SGLang's argparse fails "expected one argument" only at start."""
    hostvars[section][key] = "--served-model-name"
    assert "reads as an option" in _refused(hostvars, f"{section}.{key}", "--served-model-name")


def test_env_value_may_start_with_a_dash(hostvars):
    """Environment values never reach argv: ``-1`` stays allowed there."""
    hostvars["ddtree_service"] = {"env": {"SGLANG_TORCH_PROFILER_DIR": "/var/lib/ddtree-ops/sglang/prof",
                                          "NCCL_NVLS_ENABLE": "-1"}}
    env = {f.path: f.content for f in render_host(validate_hostvars("h1", hostvars))}[
        "/etc/ddtree-ops/sglang/sglang.env"
    ]
    assert "NCCL_NVLS_ENABLE=-1" in env.splitlines()


@pytest.mark.parametrize(("value", "ok"), [("0177.0.0.1", False), ("1234", False), ("b300.01", False),
                                           ("127.0.0.1", True), ("b300-01.example", True), ("10x.example", True)])
def test_scrape_host_numeric_last_label(hostvars, value, ok):
    hostvars["ddtree_ops"] = {"scrape_host": value}
    if ok:
        assert validate_hostvars("h1", hostvars).deployment.ops.scrape_host == value
    else:
        assert "resolvers read it as an IPv4 address" in _refused(hostvars, "ddtree_ops.scrape_host", value)


# ------------------------------------------------------------------ deploy-time port check
def _fake_proc(tmp_path: Path, port: int, cgroup: str, comm: str = "python3") -> Path:
    """A /proc with one LISTEN socket on ``port`` held by pid 4242 (layout of proc(5))."""
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    (proc / "net/tcp").write_text(
        head
        + f"   0: 00000000:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 "
          f"0\n"
        f"   1: 0100007F:{port:04X} 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 999 1 0\n"
    )
    (proc / "net/tcp6").write_text(head)
    (proc / "4242/fd").mkdir(parents=True)
    os.symlink("socket:[12345]", proc / "4242/fd/3")
    os.symlink("/dev/null", proc / "4242/fd/0")
    (proc / "4242/comm").write_text(comm + "\n")
    (proc / "4242/cgroup").write_text(cgroup)
    return proc


def test_port_held_by_its_own_unit_is_fine(tmp_path):
    proc = _fake_proc(tmp_path, 19400, "0::/system.slice/ddtree-sglang-exporter.service\n")
    assert check_port(19400, "ddtree-sglang-exporter.service", proc).ok
    assert check_port(19401, "ddtree-sglang-exporter.service", proc).detail == "port 19401 is free"
    bad = check_port(19400, "ddtree-sglang.service", proc)
    assert (
        not bad.ok and "pid 4242 (python3, unit ddtree-sglang-exporter.service)" in bad.detail and "Fix:" in bad.detail
    )


def test_port_holder_unit_from_cgroup_v1_and_a_hostile_name(tmp_path):
    proc = _fake_proc(tmp_path, 9400, "12:pids:/system.slice/dcgm-exporter.service\n"
                                      "1:name=systemd:/system.slice/dcgm-exporter.service\n", comm="dcgm\x1b[31mexp")
    r = check_port(9400, "ddtree-sglang-exporter.service", proc)
    assert not r.ok and "unit dcgm-exporter.service" in r.detail and "\x1b" not in r.detail
    assert unit_of(4242, proc) == "dcgm-exporter.service"


def test_port_held_by_a_user_manager_unit_of_the_same_name_is_not_ours(tmp_path):
    """Any user's ``systemd --user`` unit may be named ddtree-sglang.service; only the
    system unit's own cgroup counts (the first non-slice component, as systemd's cg_path_get_unit)."""
    user_unit = "0::/user.slice/user-1000.slice/user@1000.service/app.slice/ddtree-sglang.service\n"
    r = check_port(30000, "ddtree-sglang.service", _fake_proc(tmp_path, 30000, user_unit))
    assert not r.ok and "unit user@1000.service" in r.detail, r
    (tmp_path / "proc/4242/cgroup").write_text("1:name=systemd:/user.slice/user-1000.slice/user@1000.service/"
                                              "app.slice/ddtree-sglang.service\n")
    assert unit_of(4242, tmp_path / "proc") == "user@1000.service"
    for cgroup, unit in (("0::/system.slice/ddtree-sglang.service/payload\n", "ddtree-sglang.service"),
                         ("0::/ddtree.slice/ddtree-x.slice/ddtree-sglang.service\n", "ddtree-sglang.service"),
                         ("0::/user.slice/user-1000.slice/session-3.scope/ddtree-sglang.service\n", None),
                         ("0::/init.scope\n", None)):
        (tmp_path / "proc/4242/cgroup").write_text(cgroup)
        assert unit_of(4242, tmp_path / "proc") == unit, cgroup


def test_port_bound_but_not_listening_is_taken(tmp_path):
    """A socket bound and never listening (CLOSE) makes the server's bind fail with
    EADDRINUSE: it counts; TIME_WAIT and orphans (inode 0) do not; --host narrows to overlapping addresses."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        r = check_port(port, "ddtree-sglang.service")  # in no /proc/net table: the probe bind finds it
        assert not r.ok and "bound but not listening" in r.detail and "EADDRINUSE" in r.detail, r
        assert main(["port-check", "--port", str(port), "--unit", "ddtree-sglang.service", "--host", "0.0.0.0"]) == 1
        assert not check_port(port, "ddtree-sglang.service", host="127.0.0.1").ok
        assert check_port(port, "ddtree-sglang.service", host="127.0.0.2").ok  # no overlap: that bind succeeds
        with socket.socket() as t, pytest.raises(OSError):
            t.bind(("0.0.0.0", port))  # what port-check predicts
    with pytest.raises(ValueError, match="must be an IP address"):
        check_port(30000, "ddtree-sglang.service", host="example.org")
    proc = _fake_proc(tmp_path, 30000, "0::/init.scope\n")
    head = (proc / "net/tcp").read_text().splitlines()[0]
    (proc / "net/tcp").write_text(
        head + "\n   0: 0100007F:7530 0100007F:9C40 06 00000000:00000000 00:00000000 00000000     0        0 0 1 0\n"
        "   1: 0100007F:7530 0100007F:9C41 05 00000000:00000000 00:00000000 00000000     0        0 0 1 0\n")
    assert check_port(30000, "ddtree-sglang.service", proc).detail == "port 30000 is free"
    (proc / "net/tcp6").write_text(  # [::]:30000 bound (CLOSE) by pid 4242: overlaps IPv4 too
        head + "\n   0: 00000000000000000000000000000000:7530 00000000000000000000000000000000:0000 07 "
        "00000000:00000000 00:00000000 00000000     0        0 12345 1 0\n")
    for host in ("10.0.0.1", "::1", None):
        assert not check_port(30000, "ddtree-sglang.service", proc, host=host).ok, host


def test_port_check_on_real_sockets_and_the_cli(capsys):
    with socket.socket() as s4, socket.socket(socket.AF_INET6) as s6:
        s4.bind(("127.0.0.1", 0))
        s4.listen()
        s6.bind(("::1", 0))
        s6.listen()
        for port in (s4.getsockname()[1], s6.getsockname()[1]):
            r = check_port(port, "ddtree-sglang.service")
            assert not r.ok and [h.pid for h in r.holders] == [os.getpid()], r
        assert main(["port-check", "--port", str(s4.getsockname()[1]), "--unit", "ddtree-sglang.service"]) == 1
        assert f"pid {os.getpid()}" in capsys.readouterr().out
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert main(["port-check", "--port", str(free), "--unit", "ddtree-sglang.service"]) == 0
    assert main(["port-check", "--port", "0", "--unit", "ddtree-sglang.service"]) == 2
    assert main(["port-check", "--port", "80", "--unit", "x; rm -rf /"]) == 2
    assert "must be a systemd service name" in capsys.readouterr().err
