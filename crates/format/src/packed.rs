//! Packed stream grains (docs/FORMAT.md §18.8): the compressed fragments
//! of a region's virtual grains laid one after another over consecutive
//! pool grains, each grain starting with a directory of the fragments
//! that start in it, checked by a CRC-32C; the last fragment of a grain
//! may continue into the next one (its *carry*). Pure layout: what
//! compresses and decompresses a fragment is the engine's.

use std::borrow::Cow;
use std::ops::Range;

use crate::{invalid, FormatError, GRAIN_BYTES};

/// `SKPK` read as a little-endian u32.
pub const PACKED_MAGIC: u32 = 0x4b50_4b53;
/// The layout's version: 1, or 2 for a grain in which a quad starts
/// (§18.9; a build before quads refuses such a grain by its version).
pub const PACKED_VERSION: u8 = 1;
/// The version of a grain in which a quad starts.
pub const PACKED_VERSION_QUADS: u8 = 2;
/// Most fragments that start in one grain.
pub const PACKED_FRAGMENTS_MAX: usize = 16;
/// Largest compressed fragment of one virtual grain: it must save an
/// eighth (§18.7).
pub const FRAGMENT_BYTES_MAX: usize = GRAIN * 7 / 8;
/// Largest compressed fragment of an aligned pair or quad of virtual
/// grains (a fragment fits its grain and one spill).
pub const PAIR_BYTES_MAX: usize = 2 * FRAGMENT_BYTES_MAX;
/// Bytes before the directory.
const HEAD: usize = 16;
/// Bytes of a directory entry.
const ENTRY: usize = 16;
/// Fragments start on this boundary (XTS needs whole 16-byte blocks).
const ALIGN: usize = 16;
const GRAIN: usize = GRAIN_BYTES as usize;
/// Bit 63 of an entry's `v`: the fragment holds `v` and `v + 1`.
const PAIR_BIT: u64 = 1 << 63;
/// Bit 62 of an entry's `v`: the fragment holds `v .. v + 3` (§18.9).
const QUAD_BIT: u64 = 1 << 62;
/// A fragment's first `v` is below this.
const V_LIMIT: u64 = QUAD_BIT;
/// Flags byte: the last fragment starting here continues into grain + 1.
const FLAG_SPILLS: u8 = 1;
/// Most bytes a grain can take of the previous grain's last fragment
/// (a grain of no fragment of its own: all but its head).
const CARRY_MAX: usize = GRAIN - HEAD;

/// How a fragment's bytes are compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Codec {
    /// An LZ4 block (no frame).
    Lz4 = 1,
    /// A zstd frame.
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
    /// The (first) virtual grain whose bytes it holds.
    pub v: u64,
    /// The virtual grains it holds from `v`: 1, 2 (a pair, `v` even) or 4
    /// (a quad, `v` a multiple of 4); 4 KiB each once decompressed.
    pub span: u8,
    /// Where its stored bytes start in the grain.
    pub offset: u16,
    /// Its compressed length; its stored bytes are that rounded up to 16
    /// (zeros after it, or the cipher's output on an encrypted disk).
    pub len: u16,
    pub codec: Codec,
    /// CRC-32C of the whole stored bytes (both grains' parts), low 24 bits.
    pub crc24: u32,
}

impl Fragment {
    /// Whether it holds virtual grain `v`.
    pub fn covers(&self, v: u64) -> bool {
        v >= self.v && v - self.v < u64::from(self.span)
    }

    /// The bytes it decompresses to: 4,096 for each grain it holds.
    pub fn plain_bytes(&self) -> usize {
        GRAIN * usize::from(self.span)
    }

    /// Its stored bytes (`len` rounded up to 16).
    pub fn stored_len(&self) -> usize {
        footprint(self.len as usize)
    }
}

/// A packed grain's directory as decoded: 16 fragments at most, held
/// inline (a read decodes a grain per request, without an allocation).
pub type Fragments = smallvec::SmallVec<[Fragment; PACKED_FRAGMENTS_MAX]>;

/// A decoded packed grain: the previous grain's bytes it ends, whether
/// its last fragment continues into the next grain, and the fragments
/// that start in it, in the order they lie.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packed {
    pub carry_in: u16,
    pub spills: bool,
    pub fragments: Fragments,
}

impl Packed {
    /// Where the data area starts: after the directory.
    pub fn data_start(&self) -> usize {
        HEAD + ENTRY * self.fragments.len()
    }

    /// The fragment holding virtual grain `v`.
    pub fn find(&self, v: u64) -> Option<&Fragment> {
        self.fragments.iter().find(|f| f.covers(v))
    }

    /// How many of `f`'s stored bytes continue in the next grain (0 for
    /// every fragment but a spilling last one).
    pub fn spilled(&self, f: &Fragment) -> usize {
        (f.offset as usize + f.stored_len()).saturating_sub(GRAIN)
    }

    /// `f`'s whole stored bytes, checked against its CRC: from `grain`
    /// (decoded into `self`), and for a fragment that spills, the rest
    /// from `next` (the following pool grain, whose head must be sound
    /// and whose `carry_in` must be exactly that rest). Unencrypted, the
    /// compressed bytes are the first `len` of them.
    pub fn stored<'a>(
        &self,
        f: &Fragment,
        grain: &'a [u8],
        next: Option<&[u8]>,
    ) -> Result<Cow<'a, [u8]>, FormatError> {
        let mut joined = Vec::new();
        let b = if self.join(f, grain, next, &mut joined)? {
            Cow::Owned(joined)
        } else {
            Cow::Borrowed(within(f, grain))
        };
        check_crc(f, &b)?;
        Ok(b)
    }

    /// [`Packed::stored`] for the read path: a spilling fragment's two
    /// parts are joined in `joined` (a buffer kept from read to read), so
    /// nothing is allocated.
    pub fn stored_in<'a>(
        &self,
        f: &Fragment,
        grain: &'a [u8],
        next: Option<&[u8]>,
        joined: &'a mut Vec<u8>,
    ) -> Result<&'a [u8], FormatError> {
        let b = if self.join(f, grain, next, joined)? {
            &joined[..]
        } else {
            within(f, grain)
        };
        check_crc(f, b)?;
        Ok(b)
    }

    /// For a fragment that spills: its two parts, from `grain` and
    /// `next`, into `joined` (true). False for one that does not.
    fn join(
        &self,
        f: &Fragment,
        grain: &[u8],
        next: Option<&[u8]>,
        joined: &mut Vec<u8>,
    ) -> Result<bool, FormatError> {
        let rest = self.spilled(f);
        if rest == 0 {
            return Ok(false);
        }
        let next = next.ok_or(FormatError::Truncated { what: WHAT })?;
        let carried = carried_by(next)?;
        if carried.len() != rest {
            let why = format!(
                "the next grain carries {} bytes of a fragment that spills {rest}",
                carried.len()
            );
            return Err(invalid(WHAT, why));
        }
        joined.clear();
        joined.extend_from_slice(&grain[f.offset as usize..]);
        joined.extend_from_slice(carried);
        Ok(true)
    }
}

/// The bytes packed grain `b` carries from the grain before it, its head
/// checked (magic, version, count, reserved bytes, the directory's CRC)
/// and the carry inside its data area. Its own fragments are not looked
/// at: a read of the fragment spilling into it needs only these bytes,
/// which that fragment's CRC covers.
fn carried_by(b: &[u8]) -> Result<&[u8], FormatError> {
    let (n, carry_in, _) = decode_head(b)?;
    Ok(&b[carry_area(n, carry_in, false)?])
}

/// Where a grain of `n` fragments holds the `carry_in` bytes it carries:
/// on the 16-byte boundary, inside the grain; also refused, when `whole`
/// (the grain decoded for its own fragments), a grain that holds neither
/// fragments nor carried bytes.
fn carry_area(n: usize, carry_in: u16, whole: bool) -> Result<Range<usize>, FormatError> {
    let (at, carry) = (HEAD + ENTRY * n, carry_in as usize);
    if !carry.is_multiple_of(ALIGN) || at + carry > GRAIN || (whole && n == 0 && carry == 0) {
        let why = format!("{n} fragments and {carry} carried bytes");
        return Err(invalid(WHAT, why));
    }
    Ok(at..at + carry)
}

/// `f`'s stored bytes when they lie in `grain` alone.
fn within<'a>(f: &Fragment, grain: &'a [u8]) -> &'a [u8] {
    &grain[f.offset as usize..f.offset as usize + f.stored_len()]
}

/// `b`, a fragment's whole stored bytes, against the fragment's CRC.
fn check_crc(f: &Fragment, b: &[u8]) -> Result<(), FormatError> {
    let computed = crc24(b);
    if computed != f.crc24 {
        return Err(FormatError::BadChecksum {
            what: "packed fragment",
            stored: f.crc24,
            computed,
        });
    }
    Ok(())
}

/// A fragment to lay out: the virtual grain (the first of a run), codec,
/// compressed length, and its stored bytes: the `len` compressed bytes
/// (padded here with zeros), or, on an encrypted disk, their encryption
/// padded to 16 first.
#[derive(Clone, Copy, Debug)]
pub struct Piece<'a> {
    pub v: u64,
    /// Virtual grains it holds: 1, 2 or 4 ([`Fragment::span`]).
    pub span: u8,
    pub codec: Codec,
    pub len: usize,
    pub stored: &'a [u8],
}

/// The low 24 bits of CRC-32C of `b`.
fn crc24(b: &[u8]) -> u32 {
    crc32c::crc32c(b) & 0x00ff_ffff
}

/// Stored bytes of a fragment of `len` compressed bytes: the room it
/// takes in a stream, and the unit the cipher encrypts.
pub fn footprint(len: usize) -> usize {
    len.div_ceil(ALIGN) * ALIGN
}

/// Largest compressed length of a fragment of `span` grains.
fn len_max(span: u8) -> usize {
    if span > 1 {
        PAIR_BYTES_MAX
    } else {
        FRAGMENT_BYTES_MAX
    }
}

/// Whether a fragment of `span` grains from `v` is one the layout has: a
/// single, a pair at an even `v` or a quad at a multiple of 4, below
/// 2^62.
fn aligned(v: u64, span: u8) -> bool {
    matches!(span, 1 | 2 | 4) && v.is_multiple_of(u64::from(span)) && v < V_LIMIT
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
/// past 16 (a fuzz harness seals what it made up, to reach the checks
/// behind the CRC).
pub fn seal_packed(b: &mut [u8]) -> bool {
    if b.len() != GRAIN || b[5] as usize > PACKED_FRAGMENTS_MAX {
        return false;
    }
    let crc = directory_crc(b, b[5] as usize);
    b[8..12].copy_from_slice(&crc.to_le_bytes());
    true
}

/// A virtual grain held twice by fragments `fs` (a pair holds two, a
/// quad four).
fn repeated(fs: impl Iterator<Item = (u64, u8)>) -> Option<u64> {
    let mut vs: Vec<u64> = Vec::new();
    for (v, span) in fs {
        vs.extend((0..u64::from(span)).map(|k| v.wrapping_add(k)));
    }
    vs.sort_unstable();
    vs.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}

const WHAT: &str = "packed grain";

/// A packed stream as laid out: its grains (4,096 bytes each, one after
/// another), and for each piece given, the index of the grain where it
/// starts (what its leaf entries name, counted from the stream's first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stream {
    pub grains: Vec<u8>,
    pub starts: Vec<usize>,
    /// For each grain, whether its last fragment continues into the next.
    pub spills: Vec<bool>,
}

impl Stream {
    /// Its grains.
    pub fn len(&self) -> usize {
        self.spills.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spills.is_empty()
    }
}

/// How many of `pieces` start in a grain whose data area opens with
/// `carry` bytes of the previous grain's last fragment, and whether the
/// last of them spills into the next grain.
fn fit(pieces: &[Piece<'_>], carry: usize) -> (usize, bool) {
    let mut used = carry;
    for (n, p) in pieces.iter().take(PACKED_FRAGMENTS_MAX).enumerate() {
        let fp = footprint(p.len);
        let start = HEAD + ENTRY * (n + 1) + used;
        if start + fp <= GRAIN {
            used += fp;
            continue;
        }
        // It starts here and spills if a part of it fits here and the
        // rest fits the next grain (never a third one).
        let here = GRAIN.saturating_sub(start);
        return if here >= ALIGN && fp - here <= CARRY_MAX {
            (n + 1, true)
        } else {
            (n, false)
        };
    }
    (pieces.len().min(PACKED_FRAGMENTS_MAX), false)
}

/// Refused pieces: none, a length past what saves an eighth, a pair at
/// an odd `v` or a quad at one not a multiple of 4, stored bytes that are neither `len` nor more up to
/// [`footprint`]`(len)`, a virtual grain held twice.
fn check_pieces(pieces: &[Piece<'_>]) -> Result<(), FormatError> {
    if pieces.is_empty() {
        return Err(invalid(WHAT, "a stream of no fragment"));
    }
    for p in pieces {
        if p.len == 0 || p.len > len_max(p.span) {
            let why = format!("virtual grain {}: {} compressed bytes", p.v, p.len);
            return Err(invalid(WHAT, why));
        }
        if !aligned(p.v, p.span) {
            let why = format!("virtual grain {} as a run of {}", p.v, p.span);
            return Err(invalid(WHAT, why));
        }
        if p.stored.len() < p.len || p.stored.len() > footprint(p.len) {
            let why = format!("{} stored bytes for {} compressed", p.stored.len(), p.len);
            return Err(invalid(WHAT, why));
        }
    }
    if let Some(v) = repeated(pieces.iter().map(|p| (p.v, p.span))) {
        return Err(invalid(WHAT, format!("virtual grain {v} twice")));
    }
    Ok(())
}

/// `pieces` laid out in the order given as a packed stream (§18.8): each
/// grain holds the rest of the previous grain's last fragment, then as
/// many whole fragments as fit, the last of which may continue into the
/// next grain.
pub fn encode_stream(pieces: &[Piece<'_>]) -> Result<Stream, FormatError> {
    check_pieces(pieces)?;
    let mut out = Stream::default();
    let mut carry: Vec<u8> = Vec::new();
    let mut i = 0;
    while i < pieces.len() || !carry.is_empty() {
        let (n, spills) = fit(&pieces[i..], carry.len());
        let mut b = vec![0u8; GRAIN];
        b[0..4].copy_from_slice(&PACKED_MAGIC.to_le_bytes());
        let quads = pieces[i..i + n].iter().any(|p| p.span == 4);
        b[4] = if quads {
            PACKED_VERSION_QUADS
        } else {
            PACKED_VERSION
        };
        b[5] = n as u8;
        b[6..8].copy_from_slice(&(carry.len() as u16).to_le_bytes());
        b[12] = if spills { FLAG_SPILLS } else { 0 };
        let mut at = HEAD + ENTRY * n;
        b[at..at + carry.len()].copy_from_slice(&carry);
        at += carry.len();
        carry.clear();
        for (j, p) in pieces[i..i + n].iter().enumerate() {
            let mut whole = p.stored.to_vec();
            whole.resize(footprint(p.len), 0);
            let e = HEAD + ENTRY * j;
            let v = p.v
                | match p.span {
                    2 => PAIR_BIT,
                    4 => QUAD_BIT,
                    _ => 0,
                };
            b[e..e + 8].copy_from_slice(&v.to_le_bytes());
            b[e + 8..e + 10].copy_from_slice(&(at as u16).to_le_bytes());
            b[e + 10..e + 12].copy_from_slice(&(p.len as u16).to_le_bytes());
            b[e + 12] = p.codec as u8;
            b[e + 13..e + 16].copy_from_slice(&crc24(&whole).to_le_bytes()[..3]);
            let here = (GRAIN - at).min(whole.len());
            b[at..at + here].copy_from_slice(&whole[..here]);
            carry.extend_from_slice(&whole[here..]);
            at += here;
            out.starts.push(out.spills.len());
        }
        seal_packed(&mut b);
        out.grains.extend_from_slice(&b);
        out.spills.push(spills);
        i += n;
    }
    Ok(out)
}

/// Packed grain `b` (4,096 bytes) decoded, every field checked: magic,
/// version, count, flags and reserved bytes, the directory's CRC, the
/// carried bytes inside the data area, each fragment on a 16-byte
/// boundary after what lies before it, inside the grain but for a last
/// one that spills (and then by no more than the next grain can carry),
/// no virtual grain twice, known codecs, quads only in a version-2 grain. Fragment bytes are checked when
/// read ([`Packed::stored`]).
pub fn decode_packed(b: &[u8]) -> Result<Packed, FormatError> {
    let (n, carry_in, spills) = decode_head(b)?;
    let fragments = (0..n)
        .map(|i| decode_entry(b, i))
        .collect::<Result<Fragments, _>>()?;
    if b[4] == PACKED_VERSION && fragments.iter().any(|f| f.span == 4) {
        return Err(invalid(WHAT, "a quad in a version-1 grain"));
    }
    let p = Packed {
        carry_in,
        spills,
        fragments,
    };
    let mut end = carry_area(n, carry_in, true)?.end;
    for (i, f) in p.fragments.iter().enumerate() {
        let (at, stop) = (f.offset as usize, f.offset as usize + f.stored_len());
        if at < end {
            let why = format!("fragment {i} at {at} overlaps the bytes before it, to {end}");
            return Err(invalid(WHAT, why));
        }
        let last = i + 1 == n;
        if (stop > GRAIN) != (last && spills) || stop > GRAIN + CARRY_MAX {
            let why = format!("fragment {i} ends at {stop}, the grain says spills: {spills}");
            return Err(invalid(WHAT, why));
        }
        end = stop;
    }
    if spills && n == 0 {
        return Err(invalid(WHAT, "it spills with no fragment"));
    }
    if let Some(v) = repeated(p.fragments.iter().map(|f| (f.v, f.span))) {
        return Err(invalid(WHAT, format!("virtual grain {v} twice")));
    }
    Ok(p)
}

/// The head of packed grain `b` checked (length, magic, version, count,
/// flags and reserved bytes, the directory's CRC): its fragment count,
/// carried bytes and whether it spills.
fn decode_head(b: &[u8]) -> Result<(usize, u16, bool), FormatError> {
    if b.len() != GRAIN {
        return Err(FormatError::Truncated { what: WHAT });
    }
    let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"));
    if word(0) != PACKED_MAGIC {
        return Err(FormatError::BadMagic { what: WHAT });
    }
    if b[4] != PACKED_VERSION && b[4] != PACKED_VERSION_QUADS {
        let why = format!("version {} (this build reads 1 and 2)", b[4]);
        return Err(invalid(WHAT, why));
    }
    let n = b[5] as usize;
    if n > PACKED_FRAGMENTS_MAX {
        return Err(invalid(WHAT, format!("{n} fragments (16 at most)")));
    }
    if b[12] & !FLAG_SPILLS != 0 || b[13..16] != [0, 0, 0] {
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
    let carry_in = u16::from_le_bytes([b[6], b[7]]);
    Ok((n, carry_in, b[12] & FLAG_SPILLS != 0))
}

/// Entry `i` of packed grain `b`'s directory: a known codec, a length
/// that saves an eighth, a pair at an even `v`, a quad at a multiple of
/// 4, not both, a start inside the grain
/// on a 16-byte boundary (where it lies against the others is the
/// caller's check).
fn decode_entry(b: &[u8], i: usize) -> Result<Fragment, FormatError> {
    let e = &b[HEAD + ENTRY * i..HEAD + ENTRY * (i + 1)];
    let half = |at: usize| u16::from_le_bytes([e[at], e[at + 1]]);
    let raw_v = u64::from_le_bytes(e[0..8].try_into().expect("8 bytes"));
    let span = match (raw_v & PAIR_BIT != 0, raw_v & QUAD_BIT != 0) {
        (false, false) => 1,
        (true, false) => 2,
        (false, true) => 4,
        (true, true) => {
            return Err(invalid(
                WHAT,
                format!("fragment {i}: both a pair and a quad"),
            ));
        }
    };
    let f = Fragment {
        v: raw_v & !(PAIR_BIT | QUAD_BIT),
        span,
        offset: half(8),
        len: half(10),
        codec: Codec::from_byte(e[12])
            .ok_or_else(|| invalid(WHAT, format!("fragment {i}: unknown codec {}", e[12])))?,
        crc24: u32::from_le_bytes([e[13], e[14], e[15], 0]),
    };
    let (at, len) = (f.offset as usize, f.len as usize);
    if !at.is_multiple_of(ALIGN) || at >= GRAIN || len == 0 || len > len_max(f.span) {
        let why = format!("fragment {i}: {len} bytes at {at}, outside the grain");
        return Err(invalid(WHAT, why));
    }
    if !aligned(f.v, f.span) {
        let why = format!("fragment {i}: a run of {} at {}", f.span, f.v);
        return Err(invalid(WHAT, why));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces of every kind: singles, pairs and quads, lengths from 1 to
    /// the most, stored bytes a pattern of their `v`.
    fn sample(count: u64) -> Vec<(u64, u8, Codec, Vec<u8>)> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut v = 0u64;
        (0..count)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let span = [1u8, 2, 1, 4, 2][i as usize % 5];
                v = v.next_multiple_of(u64::from(span));
                let len = 1 + (x >> 20) as usize % len_max(span);
                let bytes = (0..len).map(|k| (v as usize * 7 + k) as u8).collect();
                let codec = if i % 2 == 0 { Codec::Zstd } else { Codec::Lz4 };
                let out = (v, span, codec, bytes);
                v += u64::from(span);
                out
            })
            .collect()
    }

    fn pieces(f: &[(u64, u8, Codec, Vec<u8>)]) -> Vec<Piece<'_>> {
        f.iter()
            .map(|(v, span, codec, b)| Piece {
                v: *v,
                span: *span,
                codec: *codec,
                len: b.len(),
                stored: b,
            })
            .collect()
    }

    fn grain(s: &Stream, i: usize) -> &[u8] {
        &s.grains[i * GRAIN..(i + 1) * GRAIN]
    }

    #[test]
    fn every_fragment_comes_back_from_the_grain_it_starts_in() {
        let f = sample(300);
        let s = encode_stream(&pieces(&f)).unwrap();
        assert_eq!(s.grains.len(), s.len() * GRAIN);
        assert_eq!(s.starts.len(), f.len());
        let stored: usize = f.iter().map(|p| footprint(p.3.len()) + ENTRY).sum();
        // The stream wastes little: under a grain's worth per 16 grains.
        assert!(
            s.len() * (GRAIN - HEAD) < stored + stored / 16 + GRAIN,
            "{}",
            s.len()
        );
        let mut joined = Vec::new();
        for (i, (v, span, codec, bytes)) in f.iter().enumerate() {
            let at = s.starts[i];
            let g = grain(&s, at);
            let p = decode_packed(g).unwrap();
            assert_eq!(p.spills, s.spills[at]);
            for w in *v..v + u64::from(*span) {
                let e = p.find(w).unwrap();
                assert_eq!((e.v, e.span, e.codec), (*v, *span, *codec));
            }
            // A grain in which a quad starts says version 2, others 1.
            let quads = p.fragments.iter().any(|f| f.span == 4);
            assert_eq!(g[4], if quads { 2 } else { 1 });
            let e = p.find(*v).unwrap();
            let next = (at + 1 < s.len()).then(|| grain(&s, at + 1));
            let b = p.stored(e, g, next).unwrap();
            assert_eq!(b.len(), footprint(bytes.len()));
            assert_eq!(&b[..bytes.len()], &bytes[..]);
            assert!(b[bytes.len()..].iter().all(|&z| z == 0));
            // The read path's form gives the same bytes, its buffer
            // reused from fragment to fragment.
            assert_eq!(p.stored_in(e, g, next, &mut joined).unwrap(), &b[..]);
            if p.spilled(e) > 0 {
                // The rest is in the next grain, and only there.
                assert!(p.stored(e, g, None).is_err());
                assert!(p.stored_in(e, g, None, &mut joined).is_err());
                let q = decode_packed(next.unwrap()).unwrap();
                assert_eq!(q.carry_in as usize, p.spilled(e));
                // A next grain whose head is damaged is refused, though
                // the bytes carried are sound.
                let mut bad = next.unwrap().to_vec();
                bad[13] = 1;
                assert!(p.stored_in(e, g, Some(&bad), &mut joined).is_err());
                bad[13] = 0;
                bad[8] ^= 1;
                assert!(p.stored(e, g, Some(&bad)).is_err());
            }
        }
        // Only the last grain never spills; a grain's count never tops 16.
        assert!(!s.spills[s.len() - 1]);
        for i in 0..s.len() {
            assert!(decode_packed(grain(&s, i)).unwrap().fragments.len() <= 16);
        }
        // Sixteen tiny fragments fill a directory; the seventeenth starts
        // the next grain.
        let tiny: Vec<_> = (0..17).map(|v| (v, 1, Codec::Lz4, vec![1u8; 5])).collect();
        let s = encode_stream(&pieces(&tiny)).unwrap();
        assert_eq!(s.starts, [vec![0; 16], vec![1]].concat());
    }

    #[test]
    fn a_fragment_never_reaches_a_third_grain() {
        // Two of the largest pairs: the first spills into grain 1, the
        // second starts in grain 1 after the carry and spills into grain 2.
        let big: Vec<_> = [0u64, 2, 4]
            .iter()
            .map(|&v| (v, 2, Codec::Zstd, vec![v as u8 + 1; PAIR_BYTES_MAX]))
            .collect();
        let s = encode_stream(&pieces(&big)).unwrap();
        for (i, (v, ..)) in big.iter().enumerate() {
            let g = grain(&s, s.starts[i]);
            let p = decode_packed(g).unwrap();
            let e = *p.find(*v).unwrap();
            let next = (s.starts[i] + 1 < s.len()).then(|| grain(&s, s.starts[i] + 1));
            assert_eq!(p.stored(&e, g, next).unwrap().len(), PAIR_BYTES_MAX);
            assert!(p.spilled(&e) <= CARRY_MAX);
        }
        // A grain that only carries: no fragment of its own.
        let p = decode_packed(grain(&s, 1));
        assert!(p.is_ok());
    }

    #[test]
    fn what_cannot_be_laid_out_is_refused() {
        let one = |v: u64, span: u8, len: usize, stored: usize| {
            let b = vec![1u8; stored];
            let p = [Piece {
                v,
                span,
                codec: Codec::Zstd,
                len,
                stored: &b,
            }];
            encode_stream(&p).map(|s| s.len())
        };
        assert_eq!(one(1, 1, 3584, 3584).unwrap(), 1);
        assert!(one(1, 1, 3585, 3585).is_err());
        assert!(one(2, 2, 7168, 7168).is_ok());
        assert!(one(2, 2, 7169, 7169).is_err());
        assert!(one(4, 4, 7168, 7168).is_ok());
        assert!(one(4, 4, 7169, 7169).is_err());
        for (v, span) in [(3, 2), (2, 4), (6, 4), (0, 3), (0, 8), (0, 0)] {
            let e = one(v, span, 100, 100).unwrap_err().to_string();
            assert!(e.contains("as a run of"), "{v} {span}: {e}");
        }
        assert!(one(1, 1, 0, 0).is_err());
        assert!(one(1, 1, 20, 19).is_err());
        assert!(one(1, 1, 20, 32).is_ok());
        assert!(one(1, 1, 20, 33).is_err());
        assert!(one(1 << 63, 1, 20, 20).is_err());
        assert!(one(1 << 62, 1, 20, 20).is_err());
        assert!(one((1 << 62) - 4, 4, 20, 20).is_ok());
        assert!(encode_stream(&[]).is_err());
        let twice = vec![
            (4, 2, Codec::Lz4, vec![1u8; 10]),
            (5, 1, Codec::Lz4, vec![2u8; 10]),
        ];
        let e = encode_stream(&pieces(&twice)).unwrap_err().to_string();
        assert!(e.contains("virtual grain 5 twice"), "{e}");
        let twice = vec![
            (8, 4, Codec::Zstd, vec![1u8; 10]),
            (10, 2, Codec::Zstd, vec![2u8; 10]),
        ];
        let e = encode_stream(&pieces(&twice)).unwrap_err().to_string();
        assert!(e.contains("virtual grain 10 twice"), "{e}");
    }

    #[test]
    fn every_damaged_field_is_named() {
        let f = sample(8);
        let s = encode_stream(&pieces(&f)).unwrap();
        let g = grain(&s, 0).to_vec();
        let damaged = |at: usize, x: u8| {
            let mut b = g.clone();
            b[at] ^= x;
            decode_packed(&b).unwrap_err().to_string()
        };
        assert!(damaged(0, 1).contains("bad magic"));
        assert!(damaged(4, 4).contains("version"));
        assert!(damaged(5, 0x40).contains("fragments"));
        assert!(damaged(12, 2).contains("reserved"));
        assert!(damaged(14, 1).contains("reserved"));
        // Any bit of the directory or of carry_in and the flag: its CRC.
        let n = decode_packed(&g).unwrap().fragments.len();
        for at in [6, 7, 8, 12, 16, 24, 26, 28, 29, 16 + 16 * n - 1] {
            assert!(damaged(at, 1).contains("checksum"), "{at}");
        }
        assert!(decode_packed(&g[..4095]).is_err());
        // A fragment's byte: that fragment's CRC, when it is read; a
        // spilled fragment's byte in the next grain too.
        let p = decode_packed(&g).unwrap();
        let mut b = g.clone();
        b[p.fragments[0].offset as usize + 1] ^= 1;
        let e = p.stored(&p.fragments[0], &b, None).unwrap_err().to_string();
        assert!(e.contains("packed fragment"), "{e}");
        let last = p.fragments[p.fragments.len() - 1];
        assert!(
            p.spills && p.spilled(&last) > 0,
            "the sample spills from grain 0"
        );
        let mut next = grain(&s, 1).to_vec();
        assert!(p.stored(&last, &g, Some(&next)).is_ok());
        let q = decode_packed(&next).unwrap();
        next[q.data_start()] ^= 1;
        assert!(p.stored(&last, &g, Some(&next)).is_err());
        // A next grain that carries another length is named.
        let other = grain(&s, s.len() - 1);
        let e = p.stored(&last, &g, Some(other)).unwrap_err().to_string();
        assert!(e.contains("carries") || e.contains("packed"), "{e}");
    }

    /// A directory with a valid CRC but impossible fields (as a bug or a
    /// hostile file could write) is refused by its fields.
    #[test]
    fn a_directory_with_a_good_crc_is_still_checked() {
        let tiny: Vec<_> = (0..3)
            .map(|v| (v * 8, 1, Codec::Lz4, vec![v as u8; 100]))
            .collect();
        let s = encode_stream(&pieces(&tiny)).unwrap();
        let g = grain(&s, 0).to_vec();
        let resealed = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut b = g.clone();
            edit(&mut b);
            assert!(seal_packed(&mut b));
            decode_packed(&b).unwrap_err().to_string()
        };
        let e1 = HEAD + ENTRY;
        // The second fragment inside the first; inside the directory.
        assert!(resealed(&|b| b[e1 + 8] = 80).contains("overlaps"));
        assert!(resealed(&|b| b[HEAD + 8] = 32).contains("overlaps"));
        // Unaligned; an empty fragment; past the end without a spill.
        assert!(resealed(&|b| b[HEAD + 8] = 65).contains("outside"));
        assert!(resealed(&|b| {
            b[HEAD + 10] = 0;
            b[HEAD + 11] = 0;
        })
        .contains("outside"));
        let e2 = HEAD + 2 * ENTRY;
        assert!(resealed(&|b| {
            b[e2 + 8] = 0xf0;
            b[e2 + 9] = 0x0f
        })
        .contains("ends at"));
        // Flagged as spilling, but the last fragment ends inside.
        assert!(resealed(&|b| b[12] = 1).contains("ends at"));
        // Carried bytes unaligned, or past the grain, or a grain of
        // nothing.
        assert!(resealed(&|b| b[6] = 8).contains("carried"));
        assert!(resealed(&|b| b[7] = 0x10).contains("carried"));
        assert!(resealed(&|b| b[5] = 0).contains("carried"));
        // A v twice (a pair over a single), an odd pair, unknown codec.
        assert!(resealed(&|b| b[e1] = 0).contains("twice"));
        assert!(resealed(&|b| {
            b[HEAD] = 9;
            b[e1 + 7] = 0x80
        })
        .contains("twice"));
        assert!(resealed(&|b| {
            b[e1] = 3;
            b[e1 + 7] = 0x80
        })
        .contains("a run of 2"));
        // A quad: only in a version-2 grain, at a multiple of 4, not
        // also a pair, not over another fragment.
        let quad = |b: &mut Vec<u8>| {
            b[e1] = 8;
            b[e1 + 7] = 0x40
        };
        assert!(resealed(&quad).contains("version-1"));
        let v2 = |b: &mut Vec<u8>| {
            quad(b);
            b[4] = 2
        };
        let mut b = g.clone();
        v2(&mut b);
        assert!(seal_packed(&mut b));
        let p = decode_packed(&b).unwrap();
        assert_eq!((p.fragments[1].v, p.fragments[1].span), (8, 4));
        assert!(p.find(11).is_some() && p.find(12).is_none());
        assert!(resealed(&|b| {
            v2(b);
            b[e1] = 6
        })
        .contains("a run of 4"));
        assert!(resealed(&|b| {
            v2(b);
            b[e1 + 7] = 0xc0
        })
        .contains("both"));
        assert!(resealed(&|b| {
            v2(b);
            b[e1] = 0
        })
        .contains("twice"));
        assert!(resealed(&|b| b[4] = 3).contains("version 3"));
        assert!(resealed(&|b| b[HEAD + 12] = 3).contains("codec"));
        assert!(!seal_packed(&mut [0u8; 100]));
    }
}
