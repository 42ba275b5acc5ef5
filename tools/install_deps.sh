#!/usr/bin/env bash
# Installs the Debian packages cgspn needs, only those missing (apt-get update first).
# Used by `make test` and `make demo`; safe to run again.
set -euo pipefail
want=(libcmocka-dev libzstd-dev libpng-dev libturbojpeg0-dev libjpeg-dev libopenmpi-dev openmpi-bin
      dataset-fashion-mnist pkg-config)
missing=()
for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "cgspn: installing missing packages: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "cgspn: need root (or sudo) to apt-get install ${missing[*]}" >&2; exit 1; }
    sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
