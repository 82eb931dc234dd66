#!/usr/bin/env python3
"""What grain-level compression layouts would keep of an image, against
`qemu-img convert -c` (qcow2, zstd and zlib) on the same image, in one run:
a probe for docs/FORMAT.md §18 (issue 64), run before the pack pass is
built. It models the stored bytes of each layout; it writes no datastore.

    python3 -m venv /tmp/pv && /tmp/pv/bin/pip install lz4 zstandard
    /tmp/pv/bin/python bench/probes/pack_ratio.py IMAGE.raw [--fast]

Layouts, each over the image's non-zero 4 KiB grains:
  * per-grain fragments, cut at 2 KiB, first-fit bins of 16 fragments in
    4 KiB packed grains, per region of 256 grains (FORMAT.md §18 as first
    written), LZ4 and zstd;
  * the same with fragments up to 7/8 of a grain (3,584 bytes: kept when
    they save an eighth), bins per region of 256, 4,096 grains, and over
    the whole image (best fit);
  * a byte stream per region (fragments one after another across the
    region's pool grains: no bin waste, the region's last grain part-used);
  * runs of 2, 4, 8 virtual grains compressed together (qcow2's 64 KiB
    clusters are runs of 16), as a byte stream per region.
A fragment costs its bytes rounded to 16 and a 16-byte directory entry.
"""

import argparse
import bisect
import os
import subprocess
import sys
import tempfile

import lz4.block
import zstandard

G = 4096
CUT_HALF = 2048
CUT_EIGHTH = G * 7 // 8


def lz4_len(b):
    return len(lz4.block.compress(b, store_size=False))


_Z3 = zstandard.ZstdCompressor(level=3, write_content_size=False, write_checksum=False)


def zstd_len(b):
    # Without the frame's 4-byte magic (a fragment's codec says what it is).
    return len(_Z3.compress(b)) - 4


def room(n):
    return 16 + (n + 15) // 16 * 16


def bins(lens, best_fit):
    """Packed grains (16-byte head, at most 16 fragments) for `lens`,
    largest first, first fit or best fit; a grain left with one fragment
    is kept raw (a grain either way)."""
    if not best_fit:
        open_ = []  # [free bytes, count]
        for n in sorted(lens, reverse=True):
            need = room(n)
            for b in open_:
                if b[1] < 16 and b[0] >= need:
                    b[0] -= need
                    b[1] += 1
                    break
            else:
                open_.append([G - 16 - need, 1])
        return len(open_) * G
    free = []  # sorted (free bytes, grain), grains with room for more
    count = []
    for n in sorted(lens, reverse=True):
        need = room(n)
        k = bisect.bisect_left(free, (need, -1))
        if k < len(free):
            f, g = free.pop(k)
            count[g] += 1
            if count[g] < 16:
                bisect.insort(free, (f - need, g))
        else:
            count.append(1)
            bisect.insort(free, (G - 16 - need, len(count) - 1))
    return len(count) * G


def stream(lens):
    """A byte stream of fragments across consecutive pool grains."""
    total = sum(room(n) for n in lens)
    return (total + G - 1) // G * G


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("image")
    ap.add_argument("--fast", action="store_true", help="skip the whole-image bins and the runs")
    a = ap.parse_args()
    data = open(a.image, "rb").read()
    n = len(data) // G
    zero = bytes(G)
    live = [i for i in range(n) if data[i * G:(i + 1) * G] != zero]
    mapped = len(live) * G
    print(f"{a.image}: {mapped / 2**20:.1f} MiB in non-zero grains of {len(data) / 2**20:.0f} MiB")

    def ratio(stored):
        return mapped / stored

    def regions(size):
        groups = {}
        for i in live:
            groups.setdefault(i // size, []).append(i)
        return groups.values()

    rows = []
    for tag, fn in (("LZ4", lz4_len), ("zstd-3", zstd_len)):
        lens = {i: fn(data[i * G:(i + 1) * G]) for i in live}
        for cut, cutname in ((CUT_HALF, "2 KiB cut"), (CUT_EIGHTH, "7/8 cut")):
            for region, best in ((256, False), (4096, True)) + (((n, True),) if not a.fast else ()):
                stored = 0
                for idx in regions(region):
                    group = [lens[i] for i in idx]
                    kept = [x for x in group if x <= cut]
                    stored += (len(group) - len(kept)) * G + bins(kept, best)
                where = "whole image" if region == n else f"{region}-grain regions"
                rows.append((f"per-grain {tag}, {cutname}, bins per {where}", ratio(stored)))
            stored = 0
            for idx in regions(256):
                group = [lens[i] for i in idx]
                kept = [x for x in group if x <= cut]
                stored += (len(group) - len(kept)) * G + stream(kept)
            rows.append((f"per-grain {tag}, {cutname}, stream per 256-grain region", ratio(stored)))
    if not a.fast:
        for run in (2, 4, 8):
            stored = 0
            for r in range(0, n, 256):
                kept = []
                for s in range(r, min(n, r + 256), run):
                    b = data[s * G:(s + run) * G]
                    k = sum(1 for j in range(run) if b[j * G:(j + 1) * G] != zero)
                    if not k:
                        continue
                    x = zstd_len(b)
                    if x <= k * G * 7 // 8:
                        kept.append(x)
                    else:
                        stored += k * G
                stored += stream(kept)
            rows.append((f"runs of {run} grains, zstd-3, stream per 256-grain region", ratio(stored)))

    peers = []
    with tempfile.TemporaryDirectory() as d:
        for ctype in ("zstd", "zlib"):
            out = os.path.join(d, f"c.{ctype}.qcow2")
            subprocess.run(["qemu-img", "convert", "-c", "-O", "qcow2", "-o",
                            f"compression_type={ctype}", a.image, out], check=True)
            size = os.stat(out).st_size
            peers.append((f"qemu-img convert -c -o compression_type={ctype} (file size)", ratio(size)))
    ref = peers[0][1]
    for name, r in peers + rows:
        print(f"  {r:5.2f}x  {r / ref:5.2f} of qcow2 zstd  {name}")


if __name__ == "__main__":
    sys.exit(main())
