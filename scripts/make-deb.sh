#!/usr/bin/env bash
# Build the Debian package of strata (`make deb`): the binary, the
# strata@.service template, /etc/default/strata, man pages and shell
# completions generated from the clap definitions, and the docs.
#
#   OUT        where the .deb goes (default: target/debian)
#   STRATA_BIN use this binary instead of building one (the tests do)
#
# Prints the package's path on its last line. Needs dpkg-deb (Debian's
# dpkg package) and objcopy (binutils) for stripping the debug info.
set -euo pipefail
cd "$(dirname "$0")/.."
root_dir=$PWD
out=${OUT:-$root_dir/target/debian}
bin=${STRATA_BIN:-}
if [ -z "$bin" ]; then
    cargo build --release --bin strata
    bin=${CARGO_TARGET_DIR:-$root_dir/target}/release/strata
fi
for tool in dpkg-deb dpkg objcopy gzip; do
    command -v "$tool" >/dev/null || { echo "make-deb: $tool is missing (apt-get install dpkg-dev binutils)" >&2; exit 1; }
done

# "strata 0.1.0 (6f32099ac465)" -> 0.1.0+git6f32099ac465
read -r _ version commit < <("$bin" --version)
commit=${commit//[()]/}
if [[ "$commit" =~ ^[0-9a-f]+$ ]]; then version="$version+git$commit"; fi
arch=$(dpkg --print-architecture)

mkdir -p "$out"
stage=$(mktemp -d "$out/stage.XXXXXX")
trap 'rm -rf "$stage"' EXIT
chmod 0755 "$stage"

install -d "$stage/usr/bin" "$stage/lib/systemd/system" "$stage/etc/default" \
    "$stage/usr/share/man/man1" "$stage/usr/share/bash-completion/completions" \
    "$stage/usr/share/zsh/vendor-completions" "$stage/usr/share/fish/vendor_completions.d" \
    "$stage/usr/share/doc/strata/docs" "$stage/usr/share/strata/quiesce-hooks" \
    "$stage/usr/share/strata/backup" \
    "$stage/etc/strata" "$stage/DEBIAN"
# The release profile keeps line tables for backtraces (debug = 1): the
# package ships the stripped binary, as dh_strip would.
objcopy --strip-debug "$bin" "$stage/usr/bin/strata"
chmod 0755 "$stage/usr/bin/strata"
install -m 0644 packaging/strata@.service "$stage/lib/systemd/system/strata@.service"
install -m 0644 packaging/strata.default "$stage/etc/default/strata"

"$stage/usr/bin/strata" manpages "$stage/usr/share/man/man1" >/dev/null
gzip -9n "$stage"/usr/share/man/man1/*.1
"$stage/usr/bin/strata" completions bash > "$stage/usr/share/bash-completion/completions/strata"
"$stage/usr/bin/strata" completions zsh > "$stage/usr/share/zsh/vendor-completions/_strata"
"$stage/usr/bin/strata" completions fish > "$stage/usr/share/fish/vendor_completions.d/strata.fish"

install -m 0644 README.md ARCHITECTURE.md "$stage/usr/share/doc/strata/"
install -m 0644 docs/*.md "$stage/usr/share/doc/strata/docs/"
cat > "$stage/usr/share/doc/strata/copyright" <<COPYRIGHT
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: strata

Files: *
Copyright: the strata developers
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0.
COPYRIGHT
find "$stage/usr/share" -type d -exec chmod 0755 {} +
find "$stage/usr/share" -type f -exec chmod 0644 {} +
# The group snapshot quiesce hooks (docs/BACKUP.md), run by the server.
install -m 0755 scripts/quiesce-hooks/* "$stage/usr/share/strata/quiesce-hooks/"
# The nightly incremental backup and its restore (docs/BACKUP.md).
install -m 0755 scripts/backup-nightly scripts/restore "$stage/usr/share/strata/backup/"

size=$(du -sk --exclude=DEBIAN "$stage" | cut -f1)
cat > "$stage/DEBIAN/control" <<CONTROL
Package: strata
Version: $version
Architecture: $arch
Maintainer: strata developers <strata@localhost>
Installed-Size: $size
Depends: libc6 (>= 2.34), libgcc-s1
Recommends: fuse3
Suggests: qemu-utils, nbd-client
Section: admin
Priority: optional
Description: virtual disk engine: thin and thick disks, snapshots, clones
 strata stores virtual machine disks in a datastore (a directory, or an
 S3-compatible object store shared by several hosts) with O(1) snapshots
 and linked clones, and serves them to QEMU/KVM guests, the kernel and
 qemu-img over NBD, vhost-user-blk and FUSE.
 .
 The strata@.service template runs one server per datastore.
CONTROL
echo /etc/default/strata > "$stage/DEBIAN/conffiles"
# systemd picks up the new or removed template; the instances are the
# operator's to enable (nothing starts by itself).
cat > "$stage/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
SCRIPT
cat > "$stage/DEBIAN/prerm" <<'SCRIPT'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop 'strata@*.service' >/dev/null 2>&1 || true
fi
SCRIPT
cat > "$stage/DEBIAN/postrm" <<'SCRIPT'
#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || true
fi
SCRIPT
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm" "$stage/DEBIAN/postrm"

deb="$out/strata_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$stage" "$deb" >/dev/null
echo "$deb"
