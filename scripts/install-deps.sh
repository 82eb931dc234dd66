#!/usr/bin/env bash
# Install the external programs strata's tests and benchmarks drive:
# qemu-img/qemu-nbd (qemu-utils), fio, nbdinfo/nbdcopy (libnbd-bin).
set -euo pipefail
need=()
command -v qemu-img >/dev/null 2>&1 || need+=(qemu-utils)
command -v qemu-nbd >/dev/null 2>&1 || need+=(qemu-utils)
command -v fio      >/dev/null 2>&1 || need+=(fio)
command -v nbdinfo  >/dev/null 2>&1 || need+=(libnbd-bin)
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
# De-duplicate.
mapfile -t need < <(printf '%s\n' "${need[@]}" | sort -u)
echo "install-deps: installing ${need[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-deps: need root (or sudo) to install ${need[*]}" >&2; exit 1; fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# fio's nbd engine ships in fio itself on Debian 12; qemu-nbd in qemu-utils.
for t in qemu-img qemu-nbd fio nbdinfo; do
  command -v "$t" >/dev/null 2>&1 || { echo "install-deps: $t still missing" >&2; exit 1; }
done
