//! Fragments of packed grains (docs/FORMAT.md §18): a grain compressed
//! and back, and a region's fragments binned into packed grains. The
//! pack pass writes what these make; every reader of a packed entry goes
//! through [`decompress`].

use strata_format::packed::{
    footprint, Codec, FRAGMENT_BYTES_MAX, PACKED_FRAGMENTS_MAX, PACKED_FRAGMENTS_MIN,
};
use strata_format::GRAIN_BYTES;

use crate::error::{Error, ErrorKind, Result};

const GRAIN: usize = GRAIN_BYTES as usize;

/// zstd's level for the pack pass and the estimate (its default).
pub(crate) const ZSTD_LEVEL: i32 = 3;

/// `grain` as a zstd frame at [`ZSTD_LEVEL`] (none if zstd fails, which
/// it does not for 4 KiB in memory).
pub(crate) fn compress_zstd(grain: &[u8]) -> Option<Vec<u8>> {
    zstd::bulk::compress(grain, ZSTD_LEVEL).ok()
}

/// Whether compressing a grain to `len` bytes is worth keeping: it saves
/// an eighth or more (§18.7, ZFS's rule), so at most 3,584 bytes.
pub(crate) fn saves(len: usize) -> bool {
    len <= GRAIN * 7 / 8
}

/// What a grain that compresses to `len` bytes would take packed in a
/// byte stream (§18.7): its bytes rounded to 16 and a 16-byte directory
/// entry, or the whole grain when that does not save an eighth.
pub(crate) fn stored_bytes(len: usize) -> usize {
    if saves(len) {
        room(len)
    } else {
        GRAIN
    }
}

/// Decompress a fragment's `len` compressed bytes into `out` (4,096
/// bytes), which they must fill exactly: anything else is a damaged
/// fragment (`Corrupt`, said in the error; the caller adds the grain and
/// `v`).
pub(crate) fn decompress(codec: Codec, compressed: &[u8], out: &mut [u8]) -> Result<()> {
    let damaged = |why: String| Error::new(ErrorKind::Corrupt, format!("packed fragment: {why}"));
    match codec {
        Codec::Lz4 => match lz4_flex::block::decompress_into(compressed, out) {
            Ok(n) if n == out.len() && n == GRAIN => Ok(()),
            Ok(n) => Err(damaged(format!(
                "it decompresses to {n} bytes, not {GRAIN}"
            ))),
            Err(e) => Err(damaged(format!("LZ4: {e}"))),
        },
        Codec::Zstd => {
            let mut z = zstd::bulk::Decompressor::new()
                .map_err(|e| Error::new(ErrorKind::Io, format!("zstd: {e}")))?;
            match z.decompress_to_buffer(compressed, out) {
                Ok(n) if n == out.len() && n == GRAIN => Ok(()),
                Ok(n) => Err(damaged(format!(
                    "it decompresses to {n} bytes, not {GRAIN}"
                ))),
                Err(e) => Err(damaged(format!("zstd: {e}"))),
            }
        }
    }
}

/// A fragment to bin: the virtual grain it holds and its compressed
/// length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) struct Candidate {
    pub v: u64,
    pub len: usize,
}

/// Room a fragment takes in a packed grain: its directory entry and its
/// stored bytes.
fn room(len: usize) -> usize {
    16 + footprint(len)
}

/// Packed grains for `c`, as indexes into it: first fit by decreasing
/// length, each grain's fragments of distinct virtual grains and within
/// its 4,096 bytes. A grain that would hold one fragment is left out (its
/// fragment stays raw: packing it alone saves nothing).
#[cfg_attr(not(test), allow(dead_code))] // §18.2's bins: §18.8's stream writer replaces them
pub(crate) fn bin(c: &[Candidate]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..c.len())
        .filter(|&i| (1..=FRAGMENT_BYTES_MAX).contains(&c[i].len))
        .collect();
    order.sort_unstable_by(|&a, &b| c[b].len.cmp(&c[a].len).then(c[a].v.cmp(&c[b].v)));
    // Each open grain: its fragments and the bytes they take (head
    // included).
    let mut grains: Vec<(Vec<usize>, usize)> = Vec::new();
    for i in order {
        let need = room(c[i].len);
        let fits = |(members, used): &(Vec<usize>, usize)| {
            members.len() < PACKED_FRAGMENTS_MAX
                && used + need <= GRAIN
                && members.iter().all(|&m| c[m].v != c[i].v)
        };
        match grains.iter_mut().find(|g| fits(g)) {
            Some((members, used)) => {
                members.push(i);
                *used += need;
            }
            None => grains.push((vec![i], 16 + need)),
        }
    }
    grains
        .into_iter()
        .map(|(members, _)| members)
        .filter(|m| m.len() >= PACKED_FRAGMENTS_MIN)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_format::packed::{decode_packed, encode_packed, packed_fits, Piece};

    #[test]
    fn a_grain_comes_back_byte_for_byte() {
        let text: Vec<u8> = b"one refcounted map per disk version; "
            .iter()
            .copied()
            .cycle()
            .take(GRAIN)
            .collect();
        let small = lz4_flex::block::compress(&text);
        assert!(small.len() <= FRAGMENT_BYTES_MAX, "{}", small.len());
        let mut out = vec![0u8; GRAIN];
        decompress(Codec::Lz4, &small, &mut out).unwrap();
        assert_eq!(out, text);
        // Noise does not pack.
        let mut x = 88172645463325252u64;
        let noise: Vec<u8> = (0..GRAIN / 8)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        assert!(!saves(lz4_flex::block::compress(&noise).len()));
        // A fragment short by a byte, or of another length, is refused.
        assert!(decompress(Codec::Lz4, &small[..small.len() - 1], &mut out).is_err());
        let half = lz4_flex::block::compress(&text[..2048]);
        let e = decompress(Codec::Lz4, &half, &mut out).unwrap_err();
        assert!(e.to_string().contains("2048 bytes"), "{e}");
        assert_eq!(e.kind, ErrorKind::Corrupt);
        assert!(decompress(Codec::Zstd, &small, &mut out).is_err());
        // zstd: smaller than LZ4 on text, back byte for byte, and a frame
        // of another length or cut short refused.
        let z = compress_zstd(&text).unwrap();
        assert!(z.len() < small.len(), "{} vs {}", z.len(), small.len());
        decompress(Codec::Zstd, &z, &mut out).unwrap();
        assert_eq!(out, text);
        assert!(decompress(Codec::Zstd, &z[..z.len() - 1], &mut out).is_err());
        let half = compress_zstd(&text[..2048]).unwrap();
        let e = decompress(Codec::Zstd, &half, &mut out).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Corrupt, "{e}");
        assert!(decompress(Codec::Lz4, &z, &mut out).is_err());
        // What a grain would take packed: noise stays whole.
        assert_eq!(stored_bytes(compress_zstd(&noise).unwrap().len()), GRAIN);
        assert_eq!(stored_bytes(100), 16 + 112);
        assert!(saves(3584) && !saves(3585));
    }

    #[test]
    fn bins_fit_hold_distinct_grains_and_two_at_least() {
        // 16 fragments of 200 bytes fill one grain: 16 + 16 x (16 + 208).
        let c: Vec<Candidate> = (0..16).map(|v| Candidate { v, len: 200 }).collect();
        assert_eq!(bin(&c), vec![(0..16).collect::<Vec<_>>()]);
        // The same virtual grain never twice in a grain; a lone fragment
        // stays raw.
        let same: Vec<Candidate> = (0..3).map(|_| Candidate { v: 9, len: 100 }).collect();
        assert!(bin(&same).is_empty());
        // Mixed sizes: every bin is a valid packed grain, no fragment in
        // two, and no more grains than the bytes need plus one.
        let mut x = 12345u64;
        let mixed: Vec<Candidate> = (0..500)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                Candidate {
                    v: i / 3,
                    len: 1 + (x >> 33) as usize % 2048,
                }
            })
            .collect();
        let bins = bin(&mixed);
        let mut seen = std::collections::HashSet::new();
        let mut bytes = 0;
        for b in &bins {
            assert!(b.len() >= 2);
            assert!(packed_fits(b.iter().map(|&i| mixed[i].len)));
            let vs: std::collections::HashSet<u64> = b.iter().map(|&i| mixed[i].v).collect();
            assert_eq!(vs.len(), b.len());
            for &i in b {
                assert!(seen.insert(i));
                bytes += room(mixed[i].len);
            }
        }
        let fill = bytes as f64 / (bins.len() * (GRAIN - 16)) as f64;
        assert!(fill > 0.9, "{} grains for {bytes} bytes", bins.len());
        // And each bin lays out: the format's encoder takes it.
        let stored: Vec<Vec<u8>> = mixed.iter().map(|c| vec![7u8; c.len]).collect();
        for b in &bins {
            let pieces: Vec<Piece<'_>> = b
                .iter()
                .map(|&i| Piece {
                    v: mixed[i].v,
                    codec: Codec::Lz4,
                    len: mixed[i].len,
                    stored: &stored[i],
                })
                .collect();
            assert_eq!(
                decode_packed(&encode_packed(&pieces).unwrap())
                    .unwrap()
                    .len(),
                b.len()
            );
        }
    }
}
