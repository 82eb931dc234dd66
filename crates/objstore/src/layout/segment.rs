//! Segments (docs/FORMAT.md §11.4, §18.6): header, data area (4 KiB
//! slots in version 1, grains placed and maybe LZ4-compressed in version
//! 2), map nodes, index and trailer; built, sealed, and checked by their
//! ends or whole.

use super::*;

/// A segment's header and trailer, as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: SegId,
    pub grains: u32,
    pub nodes: u32,
    pub created_ms: u64,
    /// Bytes of its data area: `grains` × 4,096 in version 1, the end of
    /// the last placed grain in version 2 (header bytes 48..56).
    pub data_bytes: u64,
    /// Version 2: grains placed (§18.6); the index says where each lies.
    pub placed: bool,
}

impl SegmentInfo {
    /// Byte offset of grain `i` of a version-1 segment.
    pub fn grain_offset(i: u32) -> u64 {
        SEG_DATA_OFFSET as u64 + u64::from(i) * GRAIN as u64
    }

    /// Byte offset of node `j`.
    pub fn node_offset(&self, j: u32) -> u64 {
        SEG_DATA_OFFSET as u64 + self.data_bytes + u64::from(j) * NODE_BYTES as u64
    }

    fn index_offset(&self) -> u64 {
        self.node_offset(self.nodes)
    }

    /// Where its index lies in the object (between the nodes and the
    /// trailer).
    pub fn index_range(&self) -> std::ops::Range<usize> {
        let at = self.index_offset() as usize;
        at..at + self.grains as usize * SEG_INDEX_ENTRY_BYTES
    }

    /// Total object length.
    pub fn len(&self) -> u64 {
        self.index_offset()
            + u64::from(self.grains) * SEG_INDEX_ENTRY_BYTES as u64
            + SEG_TRAILER_BYTES as u64
    }

    pub fn is_empty(&self) -> bool {
        self.grains == 0 && self.nodes == 0
    }

    /// Pages of its data area (see [`Entry::pages`]).
    pub fn data_pages(&self) -> u32 {
        self.data_bytes.div_ceil(GRAIN as u64) as u32
    }

    /// Whether leaf entry `e` names bytes inside this segment's data area
    /// (as its version places them).
    pub fn holds(&self, e: &Entry) -> bool {
        let (at, len) = e.grain_range();
        (e.stored != 0) == self.placed
            && at + len as u64 <= SEG_DATA_OFFSET as u64 + self.data_bytes
    }
}

/// A grain's line of a segment's index (§11.4, §18.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct IndexLine {
    vgrain: u64,
    crc: u32,
    /// Bytes stored (4,096 in version 1).
    stored: u16,
}

impl IndexLine {
    fn encode(&self, placed: bool, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.vgrain.to_le_bytes());
        out.extend_from_slice(&self.crc.to_le_bytes());
        if placed {
            out.extend_from_slice(&self.stored.to_le_bytes());
            out.extend_from_slice(&[codec_of(self.stored), 0]);
        } else {
            out.extend_from_slice(&0u32.to_le_bytes());
        }
    }

    /// Line `b` (16 bytes) of a segment's index, checked.
    fn decode(key: &str, i: u32, placed: bool, b: &[u8]) -> crate::Result<IndexLine> {
        let stored = u16::from_le_bytes([b[12], b[13]]);
        let (codec, zero) = (b[14], b[15]);
        let fine = if placed {
            (1..=GRAIN).contains(&usize::from(stored)) && codec == codec_of(stored) && zero == 0
        } else {
            b[12..16] == [0; 4]
        };
        if !fine {
            return Err(corrupt(format!(
                "{key}: grain {i}'s index line says {stored} bytes stored, codec {codec}, reserved {zero} (version {})",
                if placed { 2 } else { 1 }
            )));
        }
        Ok(IndexLine {
            vgrain: u64::from_le_bytes(b[..8].try_into().unwrap()),
            crc: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            stored: if placed { stored } else { GRAIN as u16 },
        })
    }
}

/// The codec of a placed grain stored in `stored` bytes: a whole grain's
/// are raw, fewer LZ4 (§18.6).
fn codec_of(stored: u16) -> u8 {
    if usize::from(stored) == GRAIN {
        CODEC_RAW
    } else {
        CODEC_LZ4
    }
}

/// Grains and nodes gathered for one segment.
pub struct SegmentBuilder {
    pub id: SegId,
    /// Version 2: grains placed, compressed when they save an eighth.
    placed: bool,
    /// The data area: grains' stored bytes in the order they are added.
    grains: Vec<u8>,
    lines: Vec<IndexLine>,
    nodes: Vec<u8>,
}

impl SegmentBuilder {
    /// A version-1 segment: every grain a 4 KiB slot, as it is.
    pub fn new(id: SegId) -> Self {
        SegmentBuilder {
            id,
            placed: false,
            grains: Vec::new(),
            lines: Vec::new(),
            nodes: Vec::new(),
        }
    }

    /// A version-2 segment (§18.6): grains of plain disks compressed
    /// with LZ4 when that saves an eighth, every grain placed.
    pub fn placed(id: SegId) -> Self {
        SegmentBuilder {
            placed: true,
            ..SegmentBuilder::new(id)
        }
    }

    /// Whether grains are placed (and may be compressed).
    pub fn is_placed(&self) -> bool {
        self.placed
    }

    /// Add a grain of a plain disk; returns its entry. In a placed
    /// segment it is compressed when that saves an eighth.
    pub fn add_grain(&mut self, vgrain: u64, data: &[u8]) -> Entry {
        assert_eq!(data.len(), GRAIN);
        if self.placed {
            let packed = lz4::block::compress(data, None, false).expect("LZ4 takes 4 KiB");
            if packed.len() <= MAX_PACKED {
                return self.push(vgrain, crc32c::crc32c(data), &packed, 0);
            }
        }
        self.add_stored(vgrain, data, 0)
    }

    /// Add a grain's stored bytes as they are (a move: ciphertext stays
    /// ciphertext under key index `key`); returns its entry.
    pub fn add_stored(&mut self, vgrain: u64, data: &[u8], key: u8) -> Entry {
        assert_eq!(data.len(), GRAIN);
        self.push(vgrain, crc32c::crc32c(data), data, key)
    }

    /// Add the bytes a grain is stored in, `stored` (its entry's
    /// [`Entry::grain_range`]), as they are, with the CRC of its 4,096
    /// bytes (a segment rebuilt from another's index, as the fuzz target
    /// does). Only into a placed segment, or a raw grain into either.
    pub fn add_placed(&mut self, vgrain: u64, stored: &[u8], crc: u32, key: u8) -> Entry {
        assert!(
            stored.len() == GRAIN || (self.placed && (1..=MAX_PACKED).contains(&stored.len())),
            "{} stored bytes into a version-{} segment",
            stored.len(),
            if self.placed { 2 } else { 1 }
        );
        self.push(vgrain, crc, stored, key)
    }

    /// Add a grain of plaintext `data`, encrypted on its way in when the
    /// disk is (§16.7: under the cipher's write key, whose index the entry
    /// carries; the tweak is the grain's virtual sector, the CRC is over
    /// what is stored; never compressed); returns its entry.
    pub fn add_data(
        &mut self,
        vgrain: u64,
        data: &[u8],
        cipher: Option<&strata_crypt::DataCipher>,
    ) -> Entry {
        let Some(c) = cipher else {
            return self.add_grain(vgrain, data);
        };
        assert_eq!(data.len(), GRAIN);
        let at = self.grains.len();
        self.grains.resize(at + GRAIN, 0);
        let stored = &mut self.grains[at..];
        c.writer()
            .encrypt_to(data, stored, vgrain * strata_crypt::GRAIN_SECTORS);
        let crc = crc32c::crc32c(stored);
        self.record(at, vgrain, crc, c.write_bits())
    }

    /// `stored` appended to the data area, its line to the index.
    fn push(&mut self, vgrain: u64, crc: u32, stored: &[u8], key: u8) -> Entry {
        let at = self.grains.len();
        self.grains.extend_from_slice(stored);
        self.record(at, vgrain, crc, key)
    }

    /// The grain stored from byte `at` of the data area to its end: its
    /// index line, its padding and its entry.
    fn record(&mut self, at: usize, vgrain: u64, crc: u32, key: u8) -> Entry {
        let len = (self.grains.len() - at) as u16;
        let (slot, stored) = if self.placed {
            self.grains
                .resize(self.grains.len().next_multiple_of(PLACE_ALIGN), 0);
            (at / PLACE_ALIGN, len)
        } else {
            (self.lines.len(), 0)
        };
        self.lines.push(IndexLine {
            vgrain,
            crc,
            stored: len,
        });
        Entry {
            seg: self.id,
            slot: slot as u32,
            crc,
            key,
            stored,
        }
    }

    /// Add a map node; returns its entry.
    pub fn add_node(&mut self, node: &MapNode) -> Entry {
        let b = node.encode();
        let crc = crc32c::crc32c(&b);
        let slot = (self.nodes.len() / NODE_BYTES) as u32;
        self.nodes.extend_from_slice(&b);
        Entry {
            seg: self.id,
            slot,
            crc,
            key: 0,
            stored: 0,
        }
    }

    pub fn grain_count(&self) -> usize {
        self.lines.len()
    }

    /// Bytes the sealed object will have.
    pub fn sealed_len(&self) -> u64 {
        self.info(0).len()
    }

    fn info(&self, created_ms: u64) -> SegmentInfo {
        SegmentInfo {
            id: self.id,
            grains: self.lines.len() as u32,
            nodes: (self.nodes.len() / NODE_BYTES) as u32,
            created_ms,
            data_bytes: self.grains.len() as u64,
            placed: self.placed,
        }
    }

    /// The object to upload.
    pub fn seal(&self, created_ms: u64) -> Vec<u8> {
        let info = self.info(created_ms);
        let mut b = Vec::with_capacity(info.len() as usize);
        let mut h = [0u8; SEG_HEADER_BYTES];
        h[0..8].copy_from_slice(MAGIC_SEGMENT);
        let version = if self.placed {
            SEGMENT_VERSION_PLACED
        } else {
            SEGMENT_VERSION
        };
        h[8..12].copy_from_slice(&version.to_le_bytes());
        h[16..20].copy_from_slice(&info.id.disk.to_le_bytes());
        h[20..24].copy_from_slice(&info.id.gen.to_le_bytes());
        h[24..28].copy_from_slice(&info.id.ctr.to_le_bytes());
        h[28..32].copy_from_slice(&u32::from(self.placed).to_le_bytes());
        h[32..36].copy_from_slice(&info.grains.to_le_bytes());
        h[36..40].copy_from_slice(&info.nodes.to_le_bytes());
        h[40..48].copy_from_slice(&created_ms.to_le_bytes());
        if self.placed {
            h[48..56].copy_from_slice(&info.data_bytes.to_le_bytes());
        }
        let crc = crc32c::crc32c(&h);
        h[12..16].copy_from_slice(&crc.to_le_bytes());
        b.extend_from_slice(&h);
        b.resize(SEG_DATA_OFFSET, 0);
        b.extend_from_slice(&self.grains);
        b.extend_from_slice(&self.nodes);
        let index_at = b.len();
        for line in &self.lines {
            line.encode(self.placed, &mut b);
        }
        let index_crc = crc32c::crc32c(&b[index_at..]);
        let mut t = [0u8; SEG_TRAILER_BYTES];
        t[0..8].copy_from_slice(MAGIC_SEGMENT_END);
        t[8..16].copy_from_slice(&info.len().to_le_bytes());
        t[16..20].copy_from_slice(&index_crc.to_le_bytes());
        t[20..24].copy_from_slice(&info.grains.to_le_bytes());
        t[24..28].copy_from_slice(&info.nodes.to_le_bytes());
        let tcrc = crc32c::crc32c(&t[..28]);
        t[28..32].copy_from_slice(&tcrc.to_le_bytes());
        b.extend_from_slice(&t);
        // Read back by its ends as a reader will (§11.3) before it goes.
        let key = self.id.key();
        let (head, end) = (&b[..SEG_HEADER_BYTES], &b[b.len() - SEG_TRAILER_BYTES..]);
        if let Err(e) = check_segment_ends(&key, head, end, b.len() as u64) {
            panic!("refusing to upload a bad segment: {e}");
        }
        b
    }
}

/// Read a segment's header (the first 64 bytes), checking it names `key`.
pub fn decode_segment_header(key: &str, h: &[u8]) -> crate::Result<SegmentInfo> {
    if h.len() < SEG_HEADER_BYTES {
        return Err(corrupt(format!(
            "{key}: {} bytes, shorter than a segment header (torn)",
            h.len()
        )));
    }
    if &h[0..8] != MAGIC_SEGMENT {
        return Err(corrupt(format!("{key}: not a segment (bad magic)")));
    }
    let w = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    let mut c = h[..SEG_HEADER_BYTES].to_vec();
    c[12..16].fill(0);
    let actual = crc32c::crc32c(&c);
    if w(12) != actual {
        return Err(corrupt(format!(
            "{key}: checksum mismatch in segment header (stored {:#010x}, computed {actual:#010x})",
            w(12)
        )));
    }
    let (placed, data_bytes) = segment_data_area(key, h)?;
    let info = SegmentInfo {
        id: SegId {
            disk: w(16),
            gen: w(20),
            ctr: w(24),
        },
        grains: w(32),
        nodes: w(36),
        created_ms: u64::from_le_bytes(h[40..48].try_into().unwrap()),
        data_bytes,
        placed,
    };
    if SegId::from_key(key).or_else(|| SegId::payload_from_key(key)) != Some(info.id) {
        return Err(corrupt(format!(
            "{key}: the segment says it is {}, not this key",
            info.id.key()
        )));
    }
    Ok(info)
}

/// A segment header's version and data area (§11.4, §18.6): whether its
/// grains are placed, and the data area's bytes.
fn segment_data_area(key: &str, h: &[u8]) -> crate::Result<(bool, u64)> {
    let w = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    let placed = match (w(8), w(28)) {
        (SEGMENT_VERSION, 0) => false,
        (SEGMENT_VERSION_PLACED, 1) => true,
        (SEGMENT_VERSION | SEGMENT_VERSION_PLACED, flags) => {
            return Err(corrupt(format!(
                "{key}: segment version {} with flags {flags:#x}",
                w(8)
            )))
        }
        (v, _) => {
            return Err(corrupt(format!(
                "{key}: segment version {v} (this build reads {SEGMENT_VERSION} and {SEGMENT_VERSION_PLACED})"
            )))
        }
    };
    let (grains, data) = (w(32), u64::from_le_bytes(h[48..56].try_into().unwrap()));
    if !placed {
        if data != 0 || h[56..64] != [0; 8] {
            return Err(corrupt(format!(
                "{key}: reserved segment header bytes are not zero"
            )));
        }
        Ok((false, u64::from(grains) * GRAIN as u64))
    } else if h[56..64] != [0; 8]
        || data % PLACE_ALIGN as u64 != 0
        || data < u64::from(grains) * PLACE_ALIGN as u64
        || data > u64::from(grains) * GRAIN as u64
    {
        Err(corrupt(format!(
            "{key}: a data area of {data} bytes for {grains} placed grains"
        )))
    } else {
        Ok((true, data))
    }
}

/// Check a segment object of `len` bytes by its ends: the header (its
/// first [`SEG_HEADER_BYTES`], `head`), the length the header gives, and
/// the trailer (its last [`SEG_TRAILER_BYTES`], `trailer`). The index's
/// CRC (the trailer's bytes 16..20) is left to the caller.
pub fn check_segment_ends(
    key: &str,
    head: &[u8],
    trailer: &[u8],
    len: u64,
) -> crate::Result<SegmentInfo> {
    let info = decode_segment_header(key, head)?;
    if len != info.len() {
        return Err(corrupt(format!(
            "{key}: {len} bytes where its header gives {} (torn)",
            info.len()
        )));
    }
    let t = trailer;
    let w = |i: usize| u32::from_le_bytes(t[i..i + 4].try_into().unwrap());
    if t.len() != SEG_TRAILER_BYTES
        || &t[0..8] != MAGIC_SEGMENT_END
        || w(28) != crc32c::crc32c(&t[..28])
    {
        return Err(corrupt(format!(
            "{key}: the segment trailer is damaged (torn)"
        )));
    }
    if u64::from_le_bytes(t[8..16].try_into().unwrap()) != info.len()
        || w(20) != info.grains
        || w(24) != info.nodes
    {
        return Err(corrupt(format!(
            "{key}: the segment trailer disagrees with its header"
        )));
    }
    Ok(info)
}

/// Check a whole segment object: header, length, trailer and index.
pub fn verify_segment(key: &str, b: &[u8]) -> crate::Result<SegmentInfo> {
    let head = &b[..b.len().min(SEG_HEADER_BYTES)];
    let t = &b[b.len().saturating_sub(SEG_TRAILER_BYTES)..];
    let info = check_segment_ends(key, head, t, b.len() as u64)?;
    let w = |i: usize| u32::from_le_bytes(t[i..i + 4].try_into().unwrap());
    let index = &b[info.index_range()];
    if crc32c::crc32c(index) != w(16) {
        return Err(corrupt(format!(
            "{key}: checksum mismatch in the segment index"
        )));
    }
    let mut plain = [0u8; GRAIN];
    for (i, line) in index_lines(key, &info, index)?.iter().enumerate() {
        let (at, len) = (line.offset as usize, usize::from(line.stored));
        if !unplace(&b[at..at + len], line.crc, &mut plain) {
            return Err(corrupt(format!(
                "{key}: grain {i} does not match its checksum"
            )));
        }
        if b[at + len..(at + len).next_multiple_of(PLACE_ALIGN)]
            .iter()
            .any(|&x| x != 0)
        {
            return Err(corrupt(format!("{key}: grain {i}'s padding is not zero")));
        }
    }
    Ok(info)
}

/// A grain of a segment as its index gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexedGrain {
    pub vgrain: u64,
    /// The CRC of its 4,096 bytes.
    pub crc: u32,
    /// Where its stored bytes begin in the segment, and how many.
    pub offset: u64,
    pub stored: u16,
}

/// The grains of segment `info`'s index `index` (its bytes, under their
/// checked CRC), with where each lies: checked line by line, and the
/// grains checked to end at the data area's end.
pub fn index_lines(
    key: &str,
    info: &SegmentInfo,
    index: &[u8],
) -> crate::Result<Vec<IndexedGrain>> {
    let end = SEG_DATA_OFFSET as u64 + info.data_bytes;
    let mut offset = SEG_DATA_OFFSET as u64;
    let mut out = Vec::with_capacity(info.grains as usize);
    for (i, line) in (0..info.grains).zip(index.chunks_exact(SEG_INDEX_ENTRY_BYTES)) {
        let l = IndexLine::decode(key, i, info.placed, line)?;
        let after = offset + kept_bytes(l.stored);
        if after > end || (i + 1 == info.grains && after != end) {
            return Err(corrupt(format!(
                "{key}: grain {i} ends at byte {after} of a data area ending at {end}"
            )));
        }
        out.push(IndexedGrain {
            vgrain: l.vgrain,
            crc: l.crc,
            offset,
            stored: l.stored,
        });
        offset = after;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::tests::id;

    #[test]
    fn a_sealed_segment_verifies_and_a_torn_one_does_not() {
        let mut s = SegmentBuilder::new(id());
        let g1 = vec![0xabu8; GRAIN];
        let g2: Vec<u8> = (0..GRAIN).map(|i| i as u8).collect();
        let e1 = s.add_grain(100, &g1);
        let e2 = s.add_grain(7, &g2);
        let node = MapNode::empty(0, 9, 3, 0);
        let en = s.add_node(&node);
        let b = s.seal(1_795_000_000_000);
        assert_eq!(b.len() as u64, s.sealed_len());
        let key = id().key();
        let info = verify_segment(&key, &b).unwrap();
        assert_eq!((info.grains, info.nodes, info.id), (2, 1, id()));
        assert_eq!((e1.slot, e2.slot, en.slot), (0, 1, 0));
        let at = SegmentInfo::grain_offset(e2.slot) as usize;
        assert_eq!(&b[at..at + GRAIN], &g2[..]);
        assert_eq!(crc32c::crc32c(&b[at..at + GRAIN]), e2.crc);
        let at = info.node_offset(en.slot) as usize;
        assert_eq!(crc32c::crc32c(&b[at..at + NODE_BYTES]), en.crc);
        assert_eq!(
            MapNode::decode("n", &b[at..at + NODE_BYTES], 0, 0).unwrap(),
            node
        );

        let e = verify_segment(&key, &b[..b.len() - 1]).unwrap_err();
        assert!(e.message.contains("torn"), "{e}");
        let e = verify_segment("disks/deadbeef/s/000000070000000d", &b).unwrap_err();
        assert!(e.message.contains("not this key"), "{e}");
        let mut d = b.clone();
        d[SegmentInfo::grain_offset(1) as usize + 3] ^= 1;
        let e = verify_segment(&key, &d).unwrap_err();
        assert!(e.message.contains("grain 1 does not match"), "{e}");
        let mut d = b.clone();
        let last = d.len() - 40;
        d[last] ^= 1;
        assert!(verify_segment(&key, &d).is_err());

        // By its ends alone (a cached file's first use): a damaged grain
        // passes (its reads check it), a torn file or trailer does not.
        let ends = |b: &[u8], len: u64| {
            let t = &b[b.len() - SEG_TRAILER_BYTES..];
            check_segment_ends(&key, &b[..SEG_HEADER_BYTES], t, len)
        };
        assert_eq!(ends(&b, b.len() as u64).unwrap().grains, 2);
        let mut d = b.clone();
        d[SegmentInfo::grain_offset(1) as usize + 3] ^= 1;
        assert!(ends(&d, d.len() as u64).is_ok());
        let e = ends(&b, b.len() as u64 - 1).unwrap_err();
        assert!(e.message.contains("torn"), "{e}");
        let e = ends(&b[..b.len() - 1], b.len() as u64 - 1).unwrap_err();
        assert!(e.message.contains("torn"), "{e}");
        let mut d = b.clone();
        let end = d.len() - 1;
        d[end] ^= 1;
        assert!(ends(&d, d.len() as u64).is_err());
    }

    /// A segment of version 2 (§18.6): text packs, noise and stored
    /// (ciphertext) grains stay raw, every grain at a 16-byte offset its
    /// entry names, and a copy of the stored bytes is the same segment.
    #[test]
    fn a_placed_segment_packs_what_shrinks_and_says_where_each_grain_is() {
        let text: Vec<u8> = b"placed grains of a sealed segment; "
            .iter()
            .copied()
            .cycle()
            .take(GRAIN)
            .collect();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..GRAIN)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let mut s = SegmentBuilder::placed(id());
        assert!(s.is_placed());
        let et = s.add_grain(5, &text);
        let en = s.add_grain(6, &noise);
        let es = s.add_stored(7, &text, 3);
        let et2 = s.add_grain(8, &text);
        let node = MapNode::empty(0, 9, 3, 0);
        let nd = s.add_node(&node);
        let b = s.seal(1_795_000_000_000);
        assert_eq!(b.len() as u64, s.sealed_len());
        let key = id().key();
        let info = verify_segment(&key, &b).unwrap();
        assert!(info.placed);
        assert_eq!((info.grains, info.nodes), (4, 1));
        assert!(
            et.stored > 0 && usize::from(et.stored) <= MAX_PACKED,
            "{et:?}"
        );
        assert_eq!((en.stored, es.stored, es.key), (4096, 4096, 3));
        assert_eq!(et.slot, 0);
        assert_eq!(
            u64::from(en.slot) * 16,
            u64::from(et.stored).next_multiple_of(16)
        );
        assert_eq!(
            info.data_bytes,
            u64::from(et2.slot) * 16 + u64::from(et2.stored).next_multiple_of(16)
        );
        assert!(info.data_bytes < 3 * GRAIN as u64, "{}", info.data_bytes);
        let mut out = [0u8; GRAIN];
        for (e, want) in [(et, &text), (en, &noise), (es, &text), (et2, &text)] {
            let (at, len) = e.grain_range();
            assert!(
                e.unplace(&b[at as usize..at as usize + len], &mut out),
                "{e:?}"
            );
            assert_eq!(&out[..], &want[..]);
            let mut d = b[at as usize..at as usize + len].to_vec();
            d[len / 2] ^= 0x10;
            assert!(!e.unplace(&d, &mut out), "a flipped byte of {e:?}");
            let mut enc = [0u8; ENTRY_BYTES];
            Entry::encode(Some(&e), &mut enc);
            assert_eq!(Entry::decode(&enc).unwrap(), Some(e));
        }
        // A hole of a sparse file, or a cut, is a miss.
        let (at, len) = et.grain_range();
        assert!(!et.unplace(&vec![0u8; len], &mut out));
        assert!(!et.unplace(&b[at as usize..at as usize + len - 1], &mut out));
        assert_eq!(
            MapNode::decode(
                "n",
                &b[info.node_offset(nd.slot) as usize..][..NODE_BYTES],
                0,
                0
            )
            .unwrap(),
            node
        );
        let lines = index_lines(&key, &info, &b[info.index_range()]).unwrap();
        assert_eq!(
            lines
                .iter()
                .map(|g| (g.vgrain, g.offset, g.stored))
                .collect::<Vec<_>>(),
            [et, en, es, et2]
                .iter()
                .zip(5..)
                .map(|(e, v)| (v, e.grain_range().0, e.grain_range().1 as u16))
                .collect::<Vec<_>>()
        );
        // Copied as stored (compaction), it is the same object.
        let mut c = SegmentBuilder::placed(id());
        for g in &lines {
            let at = g.offset as usize;
            c.add_placed(g.vgrain, &b[at..at + usize::from(g.stored)], g.crc, 0);
        }
        c.add_node(&node);
        assert_eq!(c.seal(1_795_000_000_000), b);
        // A version-1 segment of the same grains takes four 4 KiB slots.
        let mut v1 = SegmentBuilder::new(id());
        let e1 = v1.add_grain(5, &text);
        assert_eq!((e1.stored, e1.grain_range()), (0, (4096, 4096)));
        let one = v1.seal(1);
        assert!(!verify_segment(&key, &one).unwrap().placed);
    }

    #[test]
    fn a_damaged_placed_segment_is_refused_by_name() {
        let text = b"0123456789abcdef".repeat(GRAIN / 16);
        let mut s = SegmentBuilder::placed(id());
        s.add_grain(1, &text);
        s.add_grain(2, &text);
        let b = s.seal(7);
        let key = id().key();
        let info = verify_segment(&key, &b).unwrap();
        let reseal = |d: &mut Vec<u8>| {
            // Header CRC, then the index CRC in the trailer.
            d[12..16].fill(0);
            let crc = crc32c::crc32c(&d[..SEG_HEADER_BYTES]);
            d[12..16].copy_from_slice(&crc.to_le_bytes());
            let end = d.len() - SEG_TRAILER_BYTES;
            let crc = crc32c::crc32c(&d[info.node_offset(0) as usize..end]);
            d[end + 16..end + 20].copy_from_slice(&crc.to_le_bytes());
            let crc = crc32c::crc32c(&d[end..end + 28]);
            d[end + 28..end + 32].copy_from_slice(&crc.to_le_bytes());
        };
        let refused = |d: &[u8], want: &str| {
            let e = verify_segment(&key, d).unwrap_err();
            assert!(e.message.contains(want), "{want}: {e}");
        };
        let mut d = b.clone();
        d[SEG_DATA_OFFSET + 3] ^= 1;
        refused(&d, "grain 0 does not match");
        // Padding after grain 0.
        let pad = SEG_DATA_OFFSET + info.data_bytes as usize / 2 - 1;
        let mut d = b.clone();
        d[pad] = 1;
        refused(&d, "padding is not zero");
        // Flags, version, data area length, each under a good CRC.
        for (at, v, want) in [
            (28usize, 0u8, "segment version 2 with flags 0x0"),
            (8, 3, "segment version 3 (this build reads 1 and 2)"),
            (48, 8, "a data area of"),
        ] {
            let mut d = b.clone();
            d[at] = v;
            reseal(&mut d);
            refused(&d, want);
        }
        // An index line's length or codec, under a good index CRC.
        let line = info.node_offset(0) as usize;
        for (at, v, want) in [
            (12usize, 0u8, "says 0 bytes stored"),
            (14, 0, "codec 0"),
            (15, 1, "reserved 1"),
            (12, 0xf0, "ends at byte"),
        ] {
            let mut d = b.clone();
            d[line + at] = v;
            reseal(&mut d);
            refused(&d, want);
        }
    }
}
