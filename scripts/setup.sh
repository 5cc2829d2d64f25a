#!/usr/bin/env bash
# Set up a fresh Debian 12 / Ubuntu 22.04+ machine (as root) for ddtree-ops development,
# the demo and the tests: apt packages, the project venv (.venv) with pinned Python deps
# (ansible-core included: no Galaxy collections are needed; the dev and lint extras: pytest,
# ruff, yamllint, ansible-lint), and the test-host rootfs.
# Idempotent: re-running only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "setup: run as root (apt, debootstrap and systemd-nspawn need it): sudo $0" >&2
  exit 2
fi

# openssh-server: tests/test_fleet_ssh.py runs its own throw-away sshd on 127.0.0.1
pkgs=(python3 python3-venv python3-pip git debootstrap systemd-container iproute2 openssh-client openssh-server prometheus curl ca-certificates apt-utils gnupg)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  if [[ " ${missing[*]} " == *" openssh-server "* ]] && [ -d /run/systemd/system ]; then
    # only the sshd binary is needed: setup opens no port (Debian's package starts ssh.service)
    systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
stamp=".venv/.ddtree-setup-$(cat pyproject.toml constraints.txt | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  .venv/bin/python -m pip install -qq --disable-pip-version-check -c constraints.txt -e '.[dev,lint]'
  rm -f .venv/.ddtree-setup-*
  touch "$stamp"
fi

bash scripts/testhost.sh build
echo "setup: ok (.venv, apt packages, test-host rootfs)" >&2
