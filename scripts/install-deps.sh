#!/usr/bin/env bash
# Install LongStraw's build dependencies from Debian 12 packages (idempotent).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-openmp-dev libcjson-dev libopenmpi-dev openmpi-bin xz-utils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
