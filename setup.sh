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
# integrations' packages (swe-rex, mini-swe-agent) that their tests drive; verl and Harbor are
# installed after it (see below: verl without its pins, Harbor in .venv312)
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
if [ "${1:-}" = "--dev" ]; then
    # verl (tests/test_integration_verl.py): verl 0.9.1 without its declared dependencies (they pin
    # transformers<5.11, below the [train] tests', and pull ray[default], wandb, tensorboard...), plus
    # what importing verl.tools takes: ray's core, tensordict, omegaconf (about 80 MB to download)
    echo "[setup] pip install --no-deps verl==0.9.1 tensordict==0.10.0; ray==2.60.0 omegaconf==2.3.1" >&2
    .venv/bin/python -m pip install -q --disable-pip-version-check "ray==2.60.0" "omegaconf==2.3.1" \
        cloudpickle orjson pyvers
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "verl==0.9.1" "tensordict==0.10.0"
    # Harbor (tests/test_integration_harbor.py) requires Python >= 3.12: the SDK and harbor in .venv312
    py312=""
    for cand in python3.14 python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python3; do
        if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null
        then py312="$(command -v "$cand")"; break; fi
    done
    if [ -n "$py312" ]; then
        [ -x .venv312/bin/python ] || { echo "[setup] creating .venv312 with $py312" >&2; "$py312" -m venv .venv312; }
        echo "[setup] .venv312: pip install -e .[harbor] harbor==0.25.0" >&2
        .venv312/bin/python -m pip install -q --disable-pip-version-check -e ".[harbor]" "harbor==0.25.0"
    else
        echo "[setup] NOTE: no Python >= 3.12 here (python3.12, python3.13, python3.14, ~/.pyenv/versions/3.12+):" \
             "Harbor requires it, so tests/test_integration_harbor.py will SKIP (no Python >= 3.12)" >&2
    fi
    # az (tests/providers/test_azure_cli.py checks the ARM emulator with it): PyPI's azure-cli in a
    # venv of its own (it pins its own azure-mgmt-* versions; Debian's azure-cli 2.45 fails every
    # "az vm" command with "API version 2022-11-01 does not have operation group 'virtual_machines'")
    [ -x .venv-az/bin/python ] || python3 -m venv .venv-az
    echo "[setup] .venv-az: pip install azure-cli==2.91.0" >&2
    .venv-az/bin/python -m pip install -q --disable-pip-version-check "azure-cli==2.91.0"
fi
echo "[setup] ready: .venv/bin/flowmesh --help" >&2
