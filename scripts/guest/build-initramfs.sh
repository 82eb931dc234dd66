#!/usr/bin/env bash
# Build a tiny initramfs that tests a strata disk from inside a real Linux guest.
#
#   scripts/guest/build-initramfs.sh OUTDIR
#
# Writes OUTDIR/initramfs.cpio.gz and OUTDIR/kernel: the path of the kernel to
# boot, either OUTDIR/vmlinux (the newest /boot/vmlinuz-* unpacked; QEMU boots
# it through PVH, skipping ~3 s of decompression under TCG) or, when that is
# not possible, the /boot/vmlinuz-* itself. The image holds Debian's
# busybox-static, e2fsprogs' mke2fs/e2fsck and util-linux's fstrim with their
# shared libraries, the virtio/ext4 modules of that kernel, and
# scripts/guest/init as /init. OUTDIR/stamp records a hash of this script,
# init, the kernel and the copied programs; when it matches, nothing is
# rebuilt. KERNEL=/boot/vmlinuz-X overrides the kernel choice.
# Exit status 2 means a missing prerequisite (the test then skips).
set -euo pipefail
export PATH=$PATH:/usr/sbin:/sbin
out=${1:?usage: build-initramfs.sh OUTDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

kernel=${KERNEL:-$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n1 || true)}
[ -n "$kernel" ] && [ -r "$kernel" ] || { echo "build-initramfs: no readable /boot/vmlinuz-* (install linux-image-amd64)" >&2; exit 2; }
kver=${kernel##*/vmlinuz-}
moddir=/lib/modules/$kver
[ -d "$moddir" ] || { echo "build-initramfs: $moddir missing for $kernel" >&2; exit 2; }

busybox=/bin/busybox
if [ ! -x "$busybox" ] || ldd "$busybox" >/dev/null 2>&1; then
  echo "build-initramfs: $busybox is not static (install busybox-static)" >&2; exit 2
fi
for t in mke2fs e2fsck fstrim cpio gzip; do
  command -v "$t" >/dev/null 2>&1 || { echo "build-initramfs: $t missing" >&2; exit 2; }
done

# Rebuild when the scripts, the kernel or the copied programs change.
key=$( { cat "$here/build-initramfs.sh" "$here/init"
         stat -L -c '%n %s %Y' "$kernel" "$busybox" "$(command -v mke2fs)" \
           "$(command -v e2fsck)" "$(command -v fstrim)"; } | sha256sum | cut -c1-16)-$kver
if [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$key" ] && [ -f "$out/initramfs.cpio.gz" ] &&
   [ -f "$out/kernel" ] && [ -r "$(cat "$out/kernel")" ]; then
  exit 0
fi

mkdir -p "$out"
rm -f "$out/stamp" "$out/vmlinux"
work=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,sbin,etc,proc,sys,dev,mnt,tmp,lib/modules}

cp "$busybox" "$root/bin/busybox"
for a in $("$busybox" --list); do
  [ "$a" = busybox ] || ln -sf busybox "$root/bin/$a"
done

# Dynamic tools and every library they need (ld.so keeps its absolute path).
copy_with_libs() {
  local bin=$1 name=$2
  cp -L "$bin" "$root/sbin/$name"
  ldd "$bin" | awk '/=>/ { print $3 } /^\t\// { print $1 }' | while read -r lib; do
    [ -n "$lib" ] && [ -e "$lib" ] || continue
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
}
copy_with_libs "$(command -v mke2fs)" mkfs.ext4
copy_with_libs "$(command -v e2fsck)" fsck.ext4
copy_with_libs "$(command -v fstrim)" fstrim
[ -f /etc/mke2fs.conf ] && cp /etc/mke2fs.conf "$root/etc/"

# Modules in load order; a module built into the kernel is skipped.
mods="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk crc16 mbcache jbd2 crc32c_generic libcrc32c ext4"
: > "$root/lib/modules/load"
for m in $mods; do
  rel=$(grep -E "(^|/)$m\.ko(\.xz|\.zst|\.gz)?:" "$moddir/modules.dep" | head -n1 | cut -d: -f1 || true)
  if [ -z "$rel" ]; then
    grep -qE "(^|/)$m\.ko" "$moddir/modules.builtin" 2>/dev/null || echo "build-initramfs: note: module $m not found" >&2
    continue
  fi
  case $rel in
    *.ko.xz)  xz -dc "$moddir/$rel" > "$root/lib/modules/$m.ko" ;;
    *.ko.zst) zstd -qdc "$moddir/$rel" > "$root/lib/modules/$m.ko" ;;
    *.ko.gz)  gzip -dc "$moddir/$rel" > "$root/lib/modules/$m.ko" ;;
    *)        cp "$moddir/$rel" "$root/lib/modules/$m.ko" ;;
  esac
  echo "$m" >> "$root/lib/modules/load"
done

# An uncompressed ELF kernel for PVH boot, if the kernel supports it.
boot_kernel=$kernel
if grep -q '^CONFIG_PVH=y' "/boot/config-$kver" 2>/dev/null && command -v xz >/dev/null 2>&1; then
  for pos in $(LC_ALL=C grep -obUaP '\xFD7zXZ\x00' "$kernel" | cut -d: -f1); do
    tail -c +$((pos + 1)) "$kernel" | xz -dcq > "$work/vmlinux" 2>/dev/null || true
    if [ "$(head -c 4 "$work/vmlinux" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      mv -f "$work/vmlinux" "$out/vmlinux"
      boot_kernel=$out/vmlinux
      break
    fi
  done
fi

install -m 0755 "$here/init" "$root/init"
(cd "$root" && find . -print0 | cpio --null -o -H newc --quiet) | gzip -1 > "$work/initramfs.cpio.gz"
mv -f "$work/initramfs.cpio.gz" "$out/initramfs.cpio.gz"
echo "$boot_kernel" > "$out/kernel"
echo "$key" > "$out/stamp"
