#!/usr/bin/env bash
# Set up FlowMesh SDK on a Debian/Ubuntu machine (as root, or with sudo available):
#   system packages for the local provider (podman + runc; runsc for kernel="gvisor") and the image builds,
#   then a virtual environment in .venv with the SDK installed in editable mode.
# Usage: bash setup.sh          # runtime only
#        bash setup.sh --dev    # plus the test dependencies
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")"

extra=""
# --dev: the test dependencies, the training role's (torch, trl) for its CPU test, and the
# integrations' packages (swe-rex, mini-swe-agent) that their tests drive
[ "${1:-}" = "--dev" ] && extra="[dev,train,swerex,minisweagent]"

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"

# sudo: the SSH tests log in as a non-root user that bootstraps its machine through sudo;
# runsc: gVisor, the sandboxes' kernel="gvisor" tier (docs/security.md)
pkgs=(podman runc runsc catatonit debootstrap busybox-static ca-certificates docker-registry apache2-utils openssh-server nftables iproute2 util-linux sudo)
# --dev: the shared-fleet tests start a real redis-server and skew coordinators' clocks (libfaketime);
# tests/test_top.py reads flowmesh top's screen in tmux
[ "${1:-}" = "--dev" ] && pkgs+=(redis-server faketime tmux)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
python3 -m venv --help >/dev/null 2>&1 || missing+=(python3-venv)
if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then missing+=(python3-venv); fi
if [ "${#missing[@]}" -gt 0 ]; then
    echo "[setup] apt-get install ${missing[*]}" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
    echo "[setup] creating .venv" >&2
    python3 -m venv .venv
fi
echo "[setup] pip install -e .${extra}" >&2
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extra}"
echo "[setup] ready: .venv/bin/flowmesh --help" >&2
