"""Helpers for tests against the booted systemd test hosts (``scripts/testhost.sh``).

They run only with ``DDTREE_TESTHOSTS=1`` (set by ``scripts/test.sh`` after ``testhost.sh up``
and ``testhost-standins.sh up``), and then fail when the hosts are down; otherwise they skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "testhost.sh"
KEY = REPO_ROOT / ".state" / "ssh" / "id_ed25519"
SSH_OPTS = [
    "-o", "StrictHostKeyChecking=no",
    "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR",
    "-o", "BatchMode=yes",
    "-o", "ConnectTimeout=5",
    "-o", "IdentitiesOnly=yes",
]


def status() -> dict[str, tuple[str, str]]:
    """Host name -> (state, address) from one `testhost.sh status` (its probes are bounded
    there; this bound only guards against the script itself wedging). A wedged run reads as
    no host known."""
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "status"],
            capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return {}
    found = {}
    for line in proc.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            found[fields[0]] = (fields[1], fields[2] if len(fields) >= 3 else "")
    return found


def up_hosts(deadline_s: float = 120.0, pause_s: float = 3.0) -> dict[str, str]:
    """Host name -> address for every host `testhost.sh status` reports as up.

    A host that is booted but does not answer (a probe that timed out: loaded machine, sshd
    stalled) is asked again until every booted host answers or ``deadline_s`` has passed; a
    host that never answers is left out, so only the tests that need it fail, naming it."""
    end = time.monotonic() + deadline_s
    while True:
        found = status()
        up = {name: addr for name, (state, addr) in found.items() if state == "up"}
        waiting = [name for name, (state, _) in found.items() if state not in ("up", "down")]
        if found and not waiting:
            return up
        if time.monotonic() + pause_s > end:
            return up
        time.sleep(pause_s)


def ssh_options() -> list[str]:
    """Options (key included) shared by ssh and scp to the test hosts."""
    return [*SSH_OPTS, "-i", str(KEY)]


def ssh(address: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ssh", *ssh_options(), f"root@{address}", command],
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


VENV_BIN = REPO_ROOT / ".venv" / "bin"
TEST_INVENTORY = REPO_ROOT / "inventory" / "test"
HOST = "ddt-th1"


def copy_test_inventory(dest: Path) -> Path:
    """inventory/test copied to ``dest`` (a directory to create) with the SSH key pinned to this
    checkout's: the inventory names it relative to itself (``inventory_dir``), which a copy elsewhere
    would not find. Returns ``dest``."""
    shutil.copytree(TEST_INVENTORY, dest)
    hosts = yaml.safe_load((TEST_INVENTORY / "hosts.yml").read_text())
    hosts["all"]["children"]["testhosts"]["vars"]["ansible_ssh_private_key_file"] = str(KEY)
    (dest / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return dest


def deploy(inventory: Path = TEST_INVENTORY, limit: str = HOST,
           args: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    r = subprocess.run([str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), "-l", limit, "deploy.yml", *args],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - t0


def recap(output: str, host: str = HOST) -> dict[str, int]:
    m = re.search(rf"^{re.escape(host)}\s+:\s+(.*)$", output, re.M)
    assert m, output[-3000:]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def link_hosts(addresses: dict[str, str]) -> list[list[str]]:
    """Route the test hosts of ``addresses`` (name -> 10.213.I.2) to each other through the root
    network namespace (``testhost.sh`` gives each only its own /30 and no default route): a route
    to every other host's /30 in each host's namespace, and IPv4 forwarding on the hosts' veth
    ends only (``net.ipv4.conf.<veth>.forwarding``: the interface a packet enters decides, so
    nothing else of this machine starts forwarding). Returns the commands that undo it
    (:func:`unlink_hosts`)."""
    undo: list[list[str]] = []
    for name, addr in addresses.items():
        gw = re.sub(r"\.2$", ".1", addr)
        for other, oaddr in addresses.items():
            if other == name:
                continue
            net = re.sub(r"\.2$", ".0", oaddr) + "/30"
            subprocess.run(["ip", "-n", name, "route", "replace", net, "via", gw], check=True, timeout=10)
            undo.append(["ip", "-n", name, "route", "del", net, "via", gw])
        key = f"net.ipv4.conf.{name}.forwarding"
        old = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, check=True, timeout=10).stdout
        subprocess.run(["sysctl", "-q", "-w", f"{key}=1"], check=True, timeout=10)
        undo.append(["sysctl", "-q", "-w", f"{key}={old.strip()}"])
    return undo


def unlink_hosts(undo: list[list[str]]) -> None:
    """Undo :func:`link_hosts` (a host already down has lost its routes and veth with it)."""
    for cmd in undo:
        subprocess.run(cmd, capture_output=True, timeout=10)
