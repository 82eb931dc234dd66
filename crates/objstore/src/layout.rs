//! The objects of an object-store datastore, byte by byte (docs/FORMAT.md
//! §11.4, §11.5): segment ids and keys, map entries and nodes, segments
//! (header, grains, nodes, index, trailer) and manifests. Decoding checks
//! every checksum, length and self-description and names the object's key
//! in its error; nothing here talks to a store.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use strata_api::store::Owner;
use strata_block::throttle::IoLimits;

use crate::{corrupt, envelope};

pub const GRAIN: usize = 4096;
pub const FANOUT: usize = 256;
pub const ENTRY_BYTES: usize = 24;
pub const NODE_HEADER_BYTES: usize = 32;
pub const NODE_BYTES: usize = NODE_HEADER_BYTES + FANOUT * ENTRY_BYTES;
pub const SEG_HEADER_BYTES: usize = 64;
/// Grains start here (the header padded to 4 KiB).
pub const SEG_DATA_OFFSET: usize = 4096;
pub const SEG_INDEX_ENTRY_BYTES: usize = 16;
pub const SEG_TRAILER_BYTES: usize = 32;
pub const MAGIC_SEGMENT: &[u8; 8] = b"STRSEG01";
pub const MAGIC_SEGMENT_END: &[u8; 8] = b"STRSEGE1";
pub const MAGIC_NODE: &[u8; 8] = b"STRMAPN1";
pub const MAGIC_MANIFEST: &[u8; 8] = b"STRMAN01";
/// The footer of a format-2 manifest (§11.5).
pub const MAGIC_MANIFEST_2: &[u8; 8] = b"STRMAN02";
/// A pipelined manifest (§11.4b): the layout of `STRMAN02`, under a magic
/// that builds which do not validate pipelined manifests refuse.
pub const MAGIC_MANIFEST_3: &[u8; 8] = b"STRMAN03";
/// `STRMAN02` and `STRMAN03` of an encrypted disk (§16.7): the layouts of
/// those, under magics a build that does not know keyrings refuses.
pub const MAGIC_MANIFEST_4: &[u8; 8] = b"STRMAN04";
pub const MAGIC_MANIFEST_5: &[u8; 8] = b"STRMAN05";
pub const MANIFEST_FOOTER_BYTES: usize = 32;
pub const TAIL_ENTRY_BYTES: usize = 32;
/// A segment id whose generation has this bit is a manifest's payload.
const PAYLOAD_GEN: u32 = 0x8000_0000;
pub const SEGMENT_VERSION: u32 = 1;
const ENTRY_PRESENT: u32 = 1;

/// A segment: written by generation `gen` of disk `disk`, its `ctr`-th.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SegId {
    pub disk: u32,
    pub gen: u32,
    pub ctr: u32,
}

impl SegId {
    /// The payload of manifest `seq` of disk `disk` (§11.4a).
    pub fn payload(disk: u32, seq: u64) -> SegId {
        SegId {
            disk,
            gen: PAYLOAD_GEN | (seq >> 32) as u32,
            ctr: seq as u32,
        }
    }

    /// The manifest whose payload this is, if it is one.
    pub fn payload_of(&self) -> Option<u64> {
        (self.gen & PAYLOAD_GEN != 0)
            .then_some((((self.gen & !PAYLOAD_GEN) as u64) << 32) | self.ctr as u64)
    }

    /// `disks/ID8/s/GEN8CTR8` (§11.2); a payload's is its manifest's key.
    pub fn key(&self) -> String {
        if let Some(seq) = self.payload_of() {
            return manifest_key(self.disk, seq);
        }
        format!(
            "{}{:08x}{:08x}",
            segments_dir(self.disk),
            self.gen,
            self.ctr
        )
    }

    /// The segment a key names, if it names one (`s/` keys only; see
    /// [`SegId::payload_from_key`] for manifests).
    pub fn from_key(key: &str) -> Option<SegId> {
        let rest = key.strip_prefix("disks/")?;
        let (disk, rest) = rest.split_once('/')?;
        let name = rest.strip_prefix("s/")?;
        if disk.len() != 8 || name.len() != 16 {
            return None;
        }
        let gen = u32::from_str_radix(&name[..8], 16).ok()?;
        if gen & PAYLOAD_GEN != 0 {
            return None;
        }
        Some(SegId {
            disk: u32::from_str_radix(disk, 16).ok()?,
            gen,
            ctr: u32::from_str_radix(&name[8..], 16).ok()?,
        })
    }

    /// The payload id of a manifest key (whether or not it carries one).
    pub fn payload_from_key(key: &str) -> Option<SegId> {
        let (disk, seq) = manifest_of_key(key)?;
        Some(SegId::payload(disk, seq))
    }
}

/// Disk id and seq of a manifest key `disks/ID8/m/SEQ16`.
pub fn manifest_of_key(key: &str) -> Option<(u32, u64)> {
    let rest = key.strip_prefix("disks/")?;
    let (disk, rest) = rest.split_once('/')?;
    let seq = rest.strip_prefix("m/")?;
    if disk.len() != 8 || seq.len() != 16 {
        return None;
    }
    Some((
        u32::from_str_radix(disk, 16).ok()?,
        u64::from_str_radix(seq, 16).ok()?,
    ))
}

/// `disks/ID8/s/`: where disk `disk`'s segments are.
pub fn segments_dir(disk: u32) -> String {
    format!("disks/{disk:08x}/s/")
}

/// `disks/ID8/m/SEQ16`: manifest `seq` of disk `disk`.
pub fn manifest_key(disk: u32, seq: u64) -> String {
    format!("disks/{disk:08x}/m/{seq:016x}")
}

/// Where a grain (in a leaf) or a child node (above) is: slot `slot` of
/// segment `seg`, with the CRC-32C of what is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Entry {
    pub seg: SegId,
    pub slot: u32,
    pub crc: u32,
    /// A leaf's grain on an encrypted disk: the key index of the data key
    /// it is under (§16.7, flags bits 8–11): 0 but for an own-key clone's
    /// writes. Always 0 above the leaves.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub key: u8,
}

fn is_zero(k: &u8) -> bool {
    *k == 0
}

/// Where an entry's key index lies in its flags (§11.4).
const ENTRY_KEY_SHIFT: u32 = 8;
/// The largest key index (4 bits).
pub const MAX_KEY_INDEX: u8 = 15;

impl Entry {
    pub fn encode(e: Option<&Entry>, out: &mut [u8]) {
        out[..ENTRY_BYTES].fill(0);
        if let Some(e) = e {
            out[0..4].copy_from_slice(&e.seg.disk.to_le_bytes());
            out[4..8].copy_from_slice(&e.seg.gen.to_le_bytes());
            out[8..12].copy_from_slice(&e.seg.ctr.to_le_bytes());
            out[12..16].copy_from_slice(&e.slot.to_le_bytes());
            out[16..20].copy_from_slice(&e.crc.to_le_bytes());
            let flags = ENTRY_PRESENT | u32::from(e.key) << ENTRY_KEY_SHIFT;
            out[20..24].copy_from_slice(&flags.to_le_bytes());
        }
    }

    pub fn decode(b: &[u8]) -> crate::Result<Option<Entry>> {
        let Some(b) = b.get(..ENTRY_BYTES) else {
            return Err(corrupt(format!(
                "an entry of {} bytes ({ENTRY_BYTES} expected)",
                b.len()
            )));
        };
        let w = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        match w(20) {
            0 if b[..ENTRY_BYTES].iter().all(|&x| x == 0) => Ok(None),
            0 => Err(corrupt("a hole entry with non-zero fields")),
            f if f & !(u32::from(MAX_KEY_INDEX) << ENTRY_KEY_SHIFT) == ENTRY_PRESENT => {
                Ok(Some(Entry {
                    seg: SegId {
                        disk: w(0),
                        gen: w(4),
                        ctr: w(8),
                    },
                    slot: w(12),
                    crc: w(16),
                    key: (f >> ENTRY_KEY_SHIFT) as u8,
                }))
            }
            f => Err(corrupt(format!(
                "entry flags {f:#x} (bit 0 and a key index in bits 8-11 are defined)"
            ))),
        }
    }
}

/// A map node (§11.4): 256 entries at one level, covering the virtual
/// grains from `first`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapNode {
    pub level: u8,
    /// The writer that made it.
    pub disk: u32,
    pub gen: u32,
    pub first: u64,
    pub entries: Vec<Option<Entry>>,
}

impl MapNode {
    pub fn empty(level: u8, disk: u32, gen: u32, first: u64) -> MapNode {
        MapNode {
            level,
            disk,
            gen,
            first,
            entries: vec![None; FANOUT],
        }
    }

    /// Virtual grains one entry of a node at `level` covers.
    pub fn span_of_entry(level: u8) -> u64 {
        1u64 << (8 * u32::from(level))
    }

    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(self.entries.len(), FANOUT);
        let mut b = vec![0u8; NODE_BYTES];
        b[0..8].copy_from_slice(MAGIC_NODE);
        b[12] = self.level;
        b[16..20].copy_from_slice(&self.disk.to_le_bytes());
        b[20..24].copy_from_slice(&self.gen.to_le_bytes());
        b[24..32].copy_from_slice(&self.first.to_le_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let at = NODE_HEADER_BYTES + i * ENTRY_BYTES;
            Entry::encode(e.as_ref(), &mut b[at..at + ENTRY_BYTES]);
        }
        let crc = crc32c::crc32c(&b);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decode a node found at `place` (for messages), checking that it is
    /// the node of `level` covering `first` its referrer expects.
    pub fn decode(place: &str, b: &[u8], level: u8, first: u64) -> crate::Result<MapNode> {
        if b.len() != NODE_BYTES {
            return Err(corrupt(format!(
                "{place}: map node of {} bytes, not {NODE_BYTES}",
                b.len()
            )));
        }
        if &b[0..8] != MAGIC_NODE {
            return Err(corrupt(format!("{place}: not a map node (bad magic)")));
        }
        let stored = u32::from_le_bytes(b[8..12].try_into().unwrap());
        let mut c = b.to_vec();
        c[8..12].fill(0);
        let actual = crc32c::crc32c(&c);
        if stored != actual {
            return Err(corrupt(format!(
                "{place}: checksum mismatch in map node (stored {stored:#010x}, computed {actual:#010x})"
            )));
        }
        if b[13..16] != [0, 0, 0] {
            return Err(corrupt(format!(
                "{place}: reserved map node bytes are not zero"
            )));
        }
        let got_first = u64::from_le_bytes(b[24..32].try_into().unwrap());
        if b[12] != level || got_first != first {
            return Err(corrupt(format!(
                "{place}: map node of level {} covering grain {got_first} where level {level} covering {first} belongs",
                b[12]
            )));
        }
        let entries = (0..FANOUT)
            .map(|i| {
                let at = NODE_HEADER_BYTES + i * ENTRY_BYTES;
                Entry::decode(&b[at..at + ENTRY_BYTES])
                    .map_err(|m| m.context(format_args!("{place}: entry {i}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(MapNode {
            level,
            disk: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            gen: u32::from_le_bytes(b[20..24].try_into().unwrap()),
            first,
            entries,
        })
    }
}

/// A segment's header and trailer, as read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: SegId,
    pub grains: u32,
    pub nodes: u32,
    pub created_ms: u64,
}

impl SegmentInfo {
    /// Byte offset of grain `i`.
    pub fn grain_offset(i: u32) -> u64 {
        SEG_DATA_OFFSET as u64 + u64::from(i) * GRAIN as u64
    }

    /// Byte offset of node `j`.
    pub fn node_offset(&self, j: u32) -> u64 {
        Self::grain_offset(self.grains) + u64::from(j) * NODE_BYTES as u64
    }

    fn index_offset(&self) -> u64 {
        self.node_offset(self.nodes)
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
}

/// Grains and nodes gathered for one segment.
pub struct SegmentBuilder {
    pub id: SegId,
    /// (virtual grain, data): in the order they are stored.
    grains: Vec<u8>,
    vgrains: Vec<(u64, u32)>,
    nodes: Vec<u8>,
}

impl SegmentBuilder {
    pub fn new(id: SegId) -> Self {
        SegmentBuilder {
            id,
            grains: Vec::new(),
            vgrains: Vec::new(),
            nodes: Vec::new(),
        }
    }

    /// Add a grain of a plain disk; returns its entry.
    pub fn add_grain(&mut self, vgrain: u64, data: &[u8]) -> Entry {
        self.add_stored(vgrain, data, 0)
    }

    /// Add a grain's stored bytes as they are (a move: ciphertext stays
    /// ciphertext under key index `key`); returns its entry.
    pub fn add_stored(&mut self, vgrain: u64, data: &[u8], key: u8) -> Entry {
        assert_eq!(data.len(), GRAIN);
        let crc = crc32c::crc32c(data);
        let slot = self.vgrains.len() as u32;
        self.grains.extend_from_slice(data);
        self.vgrains.push((vgrain, crc));
        Entry {
            seg: self.id,
            slot,
            crc,
            key,
        }
    }

    /// Add a grain of plaintext `data`, encrypted on its way in when the
    /// disk is (§16.7: under the cipher's write key, whose index the entry
    /// carries; the tweak is the grain's virtual sector, the CRC is over
    /// what is stored); returns its entry.
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
        let slot = self.vgrains.len() as u32;
        self.vgrains.push((vgrain, crc));
        Entry {
            seg: self.id,
            slot,
            crc,
            key: c.write_bits(),
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
        }
    }

    pub fn grain_count(&self) -> usize {
        self.vgrains.len()
    }

    /// Bytes the sealed object will have.
    pub fn sealed_len(&self) -> u64 {
        self.info(0).len()
    }

    fn info(&self, created_ms: u64) -> SegmentInfo {
        SegmentInfo {
            id: self.id,
            grains: self.vgrains.len() as u32,
            nodes: (self.nodes.len() / NODE_BYTES) as u32,
            created_ms,
        }
    }

    /// The object to upload.
    pub fn seal(&self, created_ms: u64) -> Vec<u8> {
        let info = self.info(created_ms);
        let mut b = Vec::with_capacity(info.len() as usize);
        let mut h = [0u8; SEG_HEADER_BYTES];
        h[0..8].copy_from_slice(MAGIC_SEGMENT);
        h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        h[16..20].copy_from_slice(&info.id.disk.to_le_bytes());
        h[20..24].copy_from_slice(&info.id.gen.to_le_bytes());
        h[24..28].copy_from_slice(&info.id.ctr.to_le_bytes());
        h[32..36].copy_from_slice(&info.grains.to_le_bytes());
        h[36..40].copy_from_slice(&info.nodes.to_le_bytes());
        h[40..48].copy_from_slice(&created_ms.to_le_bytes());
        let crc = crc32c::crc32c(&h);
        h[12..16].copy_from_slice(&crc.to_le_bytes());
        b.extend_from_slice(&h);
        b.resize(SEG_DATA_OFFSET, 0);
        b.extend_from_slice(&self.grains);
        b.extend_from_slice(&self.nodes);
        let index_at = b.len();
        for &(v, crc) in &self.vgrains {
            b.extend_from_slice(&v.to_le_bytes());
            b.extend_from_slice(&crc.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
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
    if w(8) != SEGMENT_VERSION {
        return Err(corrupt(format!(
            "{key}: segment version {} (this build reads {SEGMENT_VERSION})",
            w(8)
        )));
    }
    let info = SegmentInfo {
        id: SegId {
            disk: w(16),
            gen: w(20),
            ctr: w(24),
        },
        grains: w(32),
        nodes: w(36),
        created_ms: u64::from_le_bytes(h[40..48].try_into().unwrap()),
    };
    if SegId::from_key(key).or_else(|| SegId::payload_from_key(key)) != Some(info.id) {
        return Err(corrupt(format!(
            "{key}: the segment says it is {}, not this key",
            info.id.key()
        )));
    }
    Ok(info)
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
    let index = &b[info.index_offset() as usize..b.len() - SEG_TRAILER_BYTES];
    if crc32c::crc32c(index) != w(16) {
        return Err(corrupt(format!(
            "{key}: checksum mismatch in the segment index"
        )));
    }
    for i in 0..info.grains {
        let at = i as usize * SEG_INDEX_ENTRY_BYTES;
        let crc = u32::from_le_bytes(index[at + 8..at + 12].try_into().unwrap());
        let off = SegmentInfo::grain_offset(i) as usize;
        if crc32c::crc32c(&b[off..off + GRAIN]) != crc {
            return Err(corrupt(format!(
                "{key}: grain {i} does not match its checksum"
            )));
        }
    }
    Ok(info)
}

mod manifest;
pub use manifest::*;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn id() -> SegId {
        SegId {
            disk: 0xdead_beef,
            gen: 7,
            ctr: 12,
        }
    }

    #[test]
    fn segment_keys_round_trip() {
        assert_eq!(id().key(), "disks/deadbeef/s/000000070000000c");
        assert_eq!(SegId::from_key(&id().key()), Some(id()));
        for bad in [
            "disks/deadbeef/m/000000070000000c",
            "disks/deadbee/s/000000070000000c",
            "x",
        ] {
            assert_eq!(SegId::from_key(bad), None, "{bad}");
        }
        assert_eq!(manifest_key(1, 42), "disks/00000001/m/000000000000002a");
    }

    #[test]
    fn a_short_entry_is_an_error_not_a_panic() {
        for n in [0, 1, 20, ENTRY_BYTES - 1] {
            let e = Entry::decode(&vec![0u8; n]).unwrap_err();
            assert!(e.message.contains("24 expected"), "{e}");
        }
        assert!(matches!(Entry::decode(&[0u8; ENTRY_BYTES + 3]), Ok(None)));
    }

    #[test]
    fn a_key_index_rides_in_the_flags_and_unknown_flags_are_refused() {
        for key in [0, 1, MAX_KEY_INDEX] {
            let e = Entry {
                seg: id(),
                slot: 2,
                crc: 3,
                key,
            };
            let mut b = [0u8; ENTRY_BYTES];
            Entry::encode(Some(&e), &mut b);
            assert_eq!(Entry::decode(&b).unwrap(), Some(e));
        }
        for flags in [0x2u32, 0x1001, 0x8000_0001, 0x0f00] {
            let mut b = [0u8; ENTRY_BYTES];
            Entry::encode(
                Some(&Entry {
                    seg: id(),
                    slot: 2,
                    crc: 3,
                    key: 0,
                }),
                &mut b,
            );
            b[20..24].copy_from_slice(&flags.to_le_bytes());
            let e = Entry::decode(&b).unwrap_err();
            assert!(e.message.contains("entry flags"), "{flags:#x}: {e}");
        }
    }

    #[test]
    fn a_node_round_trips_and_every_flipped_bit_is_caught() {
        let mut n = MapNode::empty(1, 9, 3, 65536);
        n.entries[0] = Some(Entry {
            seg: id(),
            slot: 5,
            crc: 0x1234_5678,
            key: 0,
        });
        n.entries[255] = Some(Entry {
            seg: id(),
            slot: 0,
            crc: 1,
            key: 0,
        });
        let b = n.encode();
        assert_eq!(b.len(), NODE_BYTES);
        assert_eq!(MapNode::decode("k", &b, 1, 65536).unwrap(), n);
        let e = MapNode::decode("k", &b, 0, 65536).unwrap_err();
        assert!(
            e.message.contains("where level 0 covering 65536 belongs"),
            "{e}"
        );
        let e = MapNode::decode("k", &b, 1, 0).unwrap_err();
        assert!(e.message.contains("covering grain 65536"), "{e}");
        for byte in (0..NODE_BYTES).step_by(7) {
            let mut d = b.clone();
            d[byte] ^= 0x04;
            assert!(
                MapNode::decode("k", &d, 1, 65536).is_err(),
                "flip at {byte}"
            );
        }
    }

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
}
