//! A packed grain (docs/FORMAT.md §18.2): 2 to 16 compressed fragments of
//! virtual grains in one 4 KiB pool grain, each found by the virtual grain
//! `v` it holds, behind a directory checked by a CRC-32C. Pure layout:
//! what compresses and decompresses a fragment is the engine's.

use crate::{invalid, FormatError, GRAIN_BYTES};

/// `SKPK` read as a little-endian u32.
pub const PACKED_MAGIC: u32 = 0x4b50_4b53;
/// The layout's version.
pub const PACKED_VERSION: u8 = 1;
/// Fewest fragments a packed grain is written with (one would save
/// nothing).
pub const PACKED_FRAGMENTS_MIN: usize = 2;
/// Most fragments of a packed grain.
pub const PACKED_FRAGMENTS_MAX: usize = 16;
/// Largest stored fragment: a grain packs only what halves at least.
pub const FRAGMENT_BYTES_MAX: usize = 2048;
/// Bytes before the directory.
const HEAD: usize = 16;
/// Bytes of a directory entry.
const ENTRY: usize = 16;
/// Fragments start on this boundary (XTS needs whole 16-byte blocks).
const ALIGN: usize = 16;
const GRAIN: usize = GRAIN_BYTES as usize;

/// How a fragment's bytes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// An LZ4 block (no frame), 4,096 bytes once decompressed.
    Lz4 = 1,
    /// A zstd frame of 4,096 bytes.
    Zstd = 2,
}

impl Codec {
    fn from_byte(b: u8) -> Option<Codec> {
        match b {
            1 => Some(Codec::Lz4),
            2 => Some(Codec::Zstd),
            _ => None,
        }
    }
}

/// One entry of a packed grain's directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// The virtual grain whose bytes it holds.
    pub v: u64,
    /// Where its stored bytes start in the grain.
    pub offset: u16,
    /// Its compressed length; its stored bytes are that rounded up to 16
    /// (zeros after it, or the cipher's output on an encrypted disk).
    pub len: u16,
    pub codec: Codec,
    /// CRC-32C of the stored bytes, low 24 bits.
    pub crc24: u32,
}

impl Fragment {
    /// Its stored bytes in `grain` (`len` rounded up to 16), checked
    /// against their CRC. `grain` is the one [`decode_packed`] accepted
    /// with this entry, so the range is inside it. Unencrypted, the
    /// compressed bytes are the first `len` of them.
    pub fn stored<'a>(&self, grain: &'a [u8]) -> Result<&'a [u8], FormatError> {
        let at = self.offset as usize;
        let b = grain
            .get(at..at + footprint(self.len as usize))
            .ok_or(FormatError::Truncated { what: WHAT })?;
        let computed = crc24(b);
        if computed != self.crc24 {
            return Err(FormatError::BadChecksum {
                what: "packed fragment",
                stored: self.crc24,
                computed,
            });
        }
        Ok(b)
    }
}

/// A fragment to lay out: virtual grain, codec, compressed length, and
/// its stored bytes: the `len` compressed bytes (padded here with zeros),
/// or, on an encrypted disk, their encryption padded to 16 first.
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    pub v: u64,
    pub codec: Codec,
    pub len: usize,
    pub stored: &'a [u8],
}

/// The low 24 bits of CRC-32C of `b`.
fn crc24(b: &[u8]) -> u32 {
    crc32c::crc32c(b) & 0x00ff_ffff
}

/// Stored bytes of a fragment of `len` compressed bytes: the room it
/// takes in a packed grain, and the unit the cipher encrypts.
pub fn footprint(len: usize) -> usize {
    len.div_ceil(ALIGN) * ALIGN
}

/// Whether fragments of these stored lengths fit one packed grain: at
/// most [`PACKED_FRAGMENTS_MAX`], each 1..=[`FRAGMENT_BYTES_MAX`], after
/// the directory, each on a 16-byte boundary.
pub fn packed_fits(lens: impl IntoIterator<Item = usize>) -> bool {
    let (mut n, mut bytes) = (0usize, 0usize);
    for len in lens {
        if len == 0 || len > FRAGMENT_BYTES_MAX {
            return false;
        }
        n += 1;
        bytes += footprint(len);
    }
    n <= PACKED_FRAGMENTS_MAX && HEAD + ENTRY * n + bytes <= GRAIN
}

/// The CRC of a packed grain's head and directory (`n` entries), its own
/// field read as 0.
fn directory_crc(b: &[u8], n: usize) -> u32 {
    let h = crc32c::crc32c(&b[..8]);
    let h = crc32c::crc32c_append(h, &[0; 4]);
    crc32c::crc32c_append(h, &b[12..HEAD + ENTRY * n])
}

/// Set the directory CRC of packed grain `b` (4,096 bytes) for the
/// fragment count its byte 5 gives; false, untouched, when that count is
/// not 2..=16 (a fuzz harness seals what it made up, to reach the checks
/// behind the CRC).
pub fn seal_packed(b: &mut [u8]) -> bool {
    if b.len() != GRAIN || !(PACKED_FRAGMENTS_MIN..=PACKED_FRAGMENTS_MAX).contains(&(b[5] as usize))
    {
        return false;
    }
    let crc = directory_crc(b, b[5] as usize);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    true
}

/// A virtual grain named twice in `vs`.
fn repeated(vs: impl Iterator<Item = u64>) -> Option<u64> {
    let mut vs: Vec<u64> = vs.collect();
    vs.sort_unstable();
    vs.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

/// A packed grain of `pieces`, laid out in the order given after the
/// directory; the rest is zero. Refused: fewer than
/// [`PACKED_FRAGMENTS_MIN`], a `v` twice, stored bytes that are neither
/// `len` nor more up to [`footprint`]`(len)`, or what [`packed_fits`]
/// refuses.
pub fn encode_packed(pieces: &[Piece<'_>]) -> Result<Vec<u8>, FormatError> {
    let n = pieces.len();
    if n < PACKED_FRAGMENTS_MIN {
        return Err(invalid(WHAT, format!("{n} fragments (2 at least)")));
    }
    if !packed_fits(pieces.iter().map(|p| p.len)) {
        return Err(invalid(WHAT, "its fragments do not fit one grain"));
    }
    if let Some(p) = pieces
        .iter()
        .find(|p| p.stored.len() < p.len || p.stored.len() > footprint(p.len))
    {
        let why = format!("{} stored bytes for {} compressed", p.stored.len(), p.len);
        return Err(invalid(WHAT, why));
    }
    if let Some(v) = repeated(pieces.iter().map(|p| p.v)) {
        return Err(invalid(WHAT, format!("virtual grain {v} twice")));
    }
    let mut b = vec![0u8; GRAIN];
    b[0..4].copy_from_slice(&PACKED_MAGIC.to_le_bytes());
    b[4] = PACKED_VERSION;
    b[5] = n as u8;
    let mut at = HEAD + ENTRY * n;
    for (i, p) in pieces.iter().enumerate() {
        let room = footprint(p.len);
        b[at..at + p.stored.len()].copy_from_slice(p.stored);
        let e = HEAD + ENTRY * i;
        b[e..e + 8].copy_from_slice(&p.v.to_le_bytes());
        b[e + 8..e + 10].copy_from_slice(&(at as u16).to_le_bytes());
        b[e + 10..e + 12].copy_from_slice(&(p.len as u16).to_le_bytes());
        b[e + 12] = p.codec as u8;
        let crc = crc24(&b[at..at + room]).to_le_bytes();
        b[e + 13..e + 16].copy_from_slice(&crc[..3]);
        at += room;
    }
    seal_packed(&mut b);
    Ok(b)
}

const WHAT: &str = "packed grain";

/// The directory of packed grain `b` (4,096 bytes), every field checked:
/// magic, version, count, reserved bytes, CRC, each fragment inside the
/// grain after the directory on a 16-byte boundary, no two overlapping, no
/// `v` twice, a known codec. Fragment bytes are checked when read
/// ([`Fragment::stored`]).
pub fn decode_packed(b: &[u8]) -> Result<Vec<Fragment>, FormatError> {
    let n = decode_head(b)?;
    let fragments = (0..n)
        .map(|i| decode_entry(b, n, i))
        .collect::<Result<Vec<_>, _>>()?;
    let mut by_offset: Vec<&Fragment> = fragments.iter().collect();
    by_offset.sort_unstable_by_key(|f| f.offset);
    if let Some(w) = by_offset
        .windows(2)
        .find(|w| w[0].offset as usize + footprint(w[0].len as usize) > w[1].offset as usize)
    {
        let why = format!("fragments at {} and {} overlap", w[0].offset, w[1].offset);
        return Err(invalid(WHAT, why));
    }
    if let Some(v) = repeated(fragments.iter().map(|f| f.v)) {
        return Err(invalid(WHAT, format!("virtual grain {v} twice")));
    }
    Ok(fragments)
}

/// The head of packed grain `b` checked (length, magic, version, count,
/// reserved bytes, the directory's CRC): its fragment count.
fn decode_head(b: &[u8]) -> Result<usize, FormatError> {
    if b.len() != GRAIN {
        return Err(FormatError::Truncated { what: WHAT });
    }
    let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    if word(0) != PACKED_MAGIC {
        return Err(FormatError::BadMagic { what: WHAT });
    }
    if b[4] != PACKED_VERSION {
        let why = format!("version {} (this build reads 1)", b[4]);
        return Err(invalid(WHAT, why));
    }
    let n = b[5] as usize;
    if !(PACKED_FRAGMENTS_MIN..=PACKED_FRAGMENTS_MAX).contains(&n) {
        return Err(invalid(WHAT, format!("{n} fragments (2 to 16)")));
    }
    if b[6..8] != [0, 0] || word(12) != 0 {
        return Err(invalid(WHAT, "reserved bytes are not zero"));
    }
    let (stored, computed) = (word(8), directory_crc(b, n));
    if stored != computed {
        return Err(FormatError::BadChecksum {
            what: WHAT,
            stored,
            computed,
        });
    }
    Ok(n)
}

/// Entry `i` of the `n` in packed grain `b`'s directory, its codec known
/// and its stored bytes inside the grain after the directory, on a
/// 16-byte boundary.
fn decode_entry(b: &[u8], n: usize, i: usize) -> Result<Fragment, FormatError> {
    let e = &b[HEAD + ENTRY * i..HEAD + ENTRY * (i + 1)];
    let half = |at: usize| u16::from_le_bytes([e[at], e[at + 1]]);
    let f = Fragment {
        v: u64::from_le_bytes(e[0..8].try_into().expect("8 bytes")),
        offset: half(8),
        len: half(10),
        codec: Codec::from_byte(e[12])
            .ok_or_else(|| invalid(WHAT, format!("fragment {i}: unknown codec {}", e[12])))?,
        crc24: u32::from_le_bytes([e[13], e[14], e[15], 0]),
    };
    let (start, at, len) = (HEAD + ENTRY * n, f.offset as usize, f.len as usize);
    if at < start
        || at % ALIGN != 0
        || len == 0
        || len > FRAGMENT_BYTES_MAX
        || at + footprint(len) > GRAIN
    {
        let why = format!("fragment {i}: {len} bytes at {at}, outside {start}..4096");
        return Err(invalid(WHAT, why));
    }
    Ok(f)
}

/// The fragment of `v` in a decoded directory.
pub fn packed_fragment(directory: &[Fragment], v: u64) -> Option<&Fragment> {
    directory.iter().find(|f| f.v == v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<(u64, Codec, Vec<u8>)> {
        vec![
            (7, Codec::Lz4, vec![1u8; 100]),
            (3, Codec::Zstd, (0..2048u32).map(|i| i as u8).collect()),
            (1 << 40, Codec::Lz4, vec![9u8; 17]),
        ]
    }

    fn encode(f: &[(u64, Codec, Vec<u8>)]) -> Result<Vec<u8>, FormatError> {
        let pieces: Vec<Piece<'_>> = f
            .iter()
            .map(|(v, codec, b)| Piece {
                v: *v,
                codec: *codec,
                len: b.len(),
                stored: b,
            })
            .collect();
        encode_packed(&pieces)
    }

    #[test]
    fn fragments_come_back_by_their_virtual_grain() {
        let f = sample();
        let g = encode(&f).unwrap();
        assert_eq!(g.len(), 4096);
        assert_eq!(&g[0..4], b"SKPK");
        let dir = decode_packed(&g).unwrap();
        assert_eq!(dir.len(), 3);
        for (v, codec, bytes) in &f {
            let e = packed_fragment(&dir, *v).unwrap();
            assert_eq!(e.codec, *codec);
            assert_eq!(e.offset % 16, 0);
            let stored = e.stored(&g).unwrap();
            assert_eq!(stored.len(), bytes.len().div_ceil(16) * 16);
            assert_eq!(&stored[..bytes.len()], &bytes[..]);
            assert!(stored[bytes.len()..].iter().all(|&b| b == 0));
        }
        assert!(packed_fragment(&dir, 8).is_none());
        // Directory, then fragments in order, each 16-aligned, then zeros.
        assert_eq!(dir[0].offset, 16 + 16 * 3);
        assert_eq!(dir[1].offset, dir[0].offset + 112);
        assert_eq!(dir[2].offset, dir[1].offset + 2048);
        let end = dir[2].offset as usize + 32;
        assert!(g[end..].iter().all(|&b| b == 0));
    }

    #[test]
    fn what_does_not_fit_or_repeats_is_refused() {
        let one = vec![(1, Codec::Lz4, vec![1u8; 10])];
        assert!(encode(&one).is_err());
        let twice = vec![
            (1, Codec::Lz4, vec![1u8; 10]),
            (1, Codec::Lz4, vec![2u8; 10]),
        ];
        assert!(encode(&twice).unwrap_err().to_string().contains("twice"));
        let big = vec![
            (1, Codec::Lz4, vec![1u8; 2049]),
            (2, Codec::Lz4, vec![2u8; 10]),
        ];
        assert!(encode(&big).is_err());
        // Two of 2,048 take 4,144 bytes with the directory.
        let halves = vec![
            (1, Codec::Lz4, vec![1u8; 2048]),
            (2, Codec::Lz4, vec![2u8; 2048]),
        ];
        assert!(encode(&halves).is_err());
        assert!(packed_fits([2016, 2016]));
        assert!(packed_fits([2016, 2017]));
        assert!(!packed_fits([2016, 2033]));
        assert!(packed_fits([16; 16]));
        assert!(!packed_fits([16; 17]));
        assert!(!packed_fits([0, 5]));
        // Stored bytes: the compressed ones, or their padded encryption.
        let piece = |stored: &[u8]| {
            let other = Piece {
                v: 2,
                codec: Codec::Lz4,
                len: 3,
                stored: &[1, 2, 3],
            };
            encode_packed(&[
                Piece {
                    v: 1,
                    codec: Codec::Lz4,
                    len: 20,
                    stored,
                },
                other,
            ])
        };
        assert!(piece(&[5; 19]).is_err());
        assert!(piece(&[5; 20]).is_ok());
        assert!(piece(&[5; 32]).is_ok());
        assert!(piece(&[5; 33]).is_err());
    }

    #[test]
    fn every_damaged_field_is_named() {
        let g = encode(&sample()).unwrap();
        let damaged = |at: usize, x: u8| {
            let mut b = g.clone();
            b[at] ^= x;
            decode_packed(&b).unwrap_err().to_string()
        };
        assert!(damaged(0, 1).contains("bad magic"));
        assert!(damaged(4, 3).contains("version"));
        assert!(damaged(5, 0x40).contains("fragments"));
        assert!(damaged(6, 1).contains("reserved"));
        assert!(damaged(13, 1).contains("reserved"));
        // Any bit of the directory: its CRC.
        for at in [8, 16, 24, 26, 28, 29, 16 + 16 * 3 - 1] {
            assert!(damaged(at, 0x10).contains("checksum"), "{at}");
        }
        // A fragment's byte: that fragment's CRC, when it is read.
        let mut b = g.clone();
        let dir = decode_packed(&b).unwrap();
        b[dir[1].offset as usize + 5] ^= 1;
        let dir = decode_packed(&b).unwrap();
        assert!(dir[0].stored(&b).is_ok());
        let e = dir[1].stored(&b).unwrap_err().to_string();
        assert!(e.contains("packed fragment"), "{e}");
        assert!(decode_packed(&g[..4095]).is_err());
    }

    /// A directory with a valid CRC but impossible entries (as a bug or a
    /// hostile file could write) is refused by its fields.
    #[test]
    fn a_directory_with_a_good_crc_is_still_checked() {
        let g = encode(&sample()).unwrap();
        let resealed = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut b = g.clone();
            edit(&mut b);
            assert!(seal_packed(&mut b));
            decode_packed(&b).unwrap_err().to_string()
        };
        // Overlap: the second fragment starts inside the first.
        let e = resealed(&|b| b[16 + 16 + 8] = 80);
        assert!(e.contains("overlap"), "{e}");
        // Inside the directory.
        let e = resealed(&|b| b[16 + 8] = 32);
        assert!(e.contains("outside"), "{e}");
        // Unaligned, past the end, empty.
        assert!(resealed(&|b| b[16 + 8] = 65).contains("outside"));
        assert!(resealed(&|b| b[16 + 32 + 9] = 0x10).contains("outside"));
        assert!(resealed(&|b| {
            b[16 + 10] = 0;
            b[16 + 11] = 0;
        })
        .contains("outside"));
        // A v twice, an unknown codec.
        assert!(resealed(&|b| b[16 + 16] = 7).contains("twice"));
        assert!(resealed(&|b| b[16 + 12] = 3).contains("codec"));
    }
}
