//! The objects of an object-store datastore, byte by byte (docs/FORMAT.md
//! §11.4, §11.5): segment ids and keys, map entries and nodes, segments
//! (header, grains, nodes, index, trailer) and manifests. Decoding checks
//! every checksum, length and self-description and names the object's key
//! in its error; nothing here talks to a store.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub seg: SegId,
    pub slot: u32,
    pub crc: u32,
}

impl Entry {
    pub fn encode(e: Option<&Entry>, out: &mut [u8]) {
        out[..ENTRY_BYTES].fill(0);
        if let Some(e) = e {
            out[0..4].copy_from_slice(&e.seg.disk.to_le_bytes());
            out[4..8].copy_from_slice(&e.seg.gen.to_le_bytes());
            out[8..12].copy_from_slice(&e.seg.ctr.to_le_bytes());
            out[12..16].copy_from_slice(&e.slot.to_le_bytes());
            out[16..20].copy_from_slice(&e.crc.to_le_bytes());
            out[20..24].copy_from_slice(&ENTRY_PRESENT.to_le_bytes());
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
            ENTRY_PRESENT => Ok(Some(Entry {
                seg: SegId {
                    disk: w(0),
                    gen: w(4),
                    ctr: w(8),
                },
                slot: w(12),
                crc: w(16),
            })),
            f => Err(corrupt(format!(
                "entry flags {f:#x} (only bit 0 is defined)"
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

    /// Add a grain; returns its entry.
    pub fn add_grain(&mut self, vgrain: u64, data: &[u8]) -> Entry {
        assert_eq!(data.len(), GRAIN);
        let crc = crc32c::crc32c(data);
        let slot = self.vgrains.len() as u32;
        self.grains.extend_from_slice(data);
        self.vgrains.push((vgrain, crc));
        Entry {
            seg: self.id,
            slot,
            crc,
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
        debug_assert_eq!(b.len() as u64, info.len());
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

/// A snapshot, as a manifest carries it (§11.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRec {
    pub id: u64,
    pub name: String,
    #[serde(default)]
    pub description: String,
    pub created_ms: u64,
    pub size_bytes: u64,
    pub levels: u8,
    pub root: Option<Entry>,
    /// The snapshot the disk descended from when this one was taken (the
    /// tree, §11.3); none for a root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<u64>,
    /// The group snapshot this snapshot is a member of (§11.11); it counts
    /// only once that group snapshot's object exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupRef>,
}

/// A member snapshot's group snapshot: group id and group snapshot id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupRef {
    pub group: u32,
    pub snapshot: u64,
}

/// Where a linked clone came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    pub disk: u32,
    pub snapshot: u64,
    /// `DISK@SNAP` when the clone was made.
    pub name: String,
}

/// Who may write a disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub host: String,
    pub name: String,
    /// The writing process, or [`Owner::HOST_PID`].
    pub pid: u32,
}

impl Owner {
    /// `pid` of the host's own claim (§11.6): the host writes the disk,
    /// no process of it does (`strata claim` with no server running).
    pub const HOST_PID: u32 = 0;

    /// Whether this is the host's claim rather than a process's.
    pub fn is_host(&self) -> bool {
        self.pid == Self::HOST_PID
    }
}

/// A disk's whole state at one point (§11.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub disk: u32,
    pub seq: u64,
    pub generation: u32,
    pub owner: Option<Owner>,
    pub written_ms: u64,
    /// Random per write: two writers never produce the same bytes, so a
    /// create that finds its own bytes knows it was its own retry.
    pub nonce: u64,
    pub size_bytes: u64,
    pub levels: u8,
    pub root: Option<Entry>,
    pub next_ctr: u32,
    #[serde(default)]
    pub snapshots: Vec<SnapshotRec>,
    #[serde(default)]
    pub parent: Option<ParentRef>,
    #[serde(default)]
    pub removed: bool,
    /// The snapshot the disk's live state descends from (the last one
    /// taken or reverted to), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u64>,
    /// I/O limits (`strata limit`), absent when there are none.
    #[serde(default, skip_serializing_if = "IoLimits::is_none")]
    pub limits: IoLimits,
    /// A copy of the node `root` points at, base64 (§11.5): a host that
    /// opens the disk walks one level less on its first reads. A hint,
    /// used only if it matches `root`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_node: Option<String>,
    /// The manifest this one extends (§11.4b); absent on a disk's first
    /// manifest and on manifests of builds before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prev: Option<PrevRef>,
    /// Written while `prev` was still in flight (§11.4b): valid only if
    /// the object at `prev.seq` carries `prev.nonce`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pipelined: bool,
    /// Where the grains written since the map was last folded live
    /// (§11.4a; None: a hole); they win over the map. Stored in binary
    /// beside the body, not in it.
    #[serde(skip)]
    pub tail: Arc<Tail>,
}

/// The manifest a manifest extends (§11.4b).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrevRef {
    pub seq: u64,
    pub nonce: u64,
}

impl PrevRef {
    pub fn of(m: &Manifest) -> PrevRef {
        PrevRef {
            seq: m.seq,
            nonce: m.nonce,
        }
    }
}

/// A manifest's tail (§11.4a): virtual grain → entry (None: a hole).
pub type Tail = BTreeMap<u64, Option<Entry>>;

/// The footer of a format-2 manifest (§11.5).
struct Footer {
    payload: u64,
    tail: u32,
    body: u32,
    /// CRC-32C of tail and body.
    crc: u32,
    /// `STRMAN03`: a pipelined manifest (§11.4b).
    pipelined: bool,
}

impl Footer {
    /// The footer in the last 32 bytes of `end`: None if they are too few
    /// or do not start with `STRMAN02` or `STRMAN03` (format 1), an error
    /// if its own CRC fails.
    fn read(key: &str, end: &[u8]) -> crate::Result<Option<Footer>> {
        let Some(at) = end.len().checked_sub(MANIFEST_FOOTER_BYTES) else {
            return Ok(None);
        };
        let f = &end[at..];
        let pipelined = match &f[..8] {
            m if m == MAGIC_MANIFEST_2 => false,
            m if m == MAGIC_MANIFEST_3 => true,
            _ => return Ok(None),
        };
        let w = |i: usize| u32::from_le_bytes(f[i..i + 4].try_into().unwrap());
        if w(28) != crc32c::crc32c(&f[..28]) {
            return Err(corrupt(format!(
                "{key}: the manifest footer is damaged (torn)"
            )));
        }
        Ok(Some(Footer {
            payload: u64::from_le_bytes(f[8..16].try_into().unwrap()),
            tail: w(16),
            body: w(20),
            crc: w(24),
            pipelined,
        }))
    }
}

impl Manifest {
    /// Manifest 1 of disk `disk` (§11.2): generation 1, no owner, an
    /// empty map of `levels` levels; written now, with a fresh nonce.
    pub fn first(disk: u32, size_bytes: u64, levels: u8) -> Manifest {
        Manifest {
            disk,
            seq: 1,
            generation: 1,
            owner: None,
            written_ms: crate::now_ms(),
            nonce: rand::random(),
            size_bytes,
            levels,
            root: None,
            next_ctr: 0,
            snapshots: Vec::new(),
            parent: None,
            removed: false,
            current: None,
            limits: Default::default(),
            root_node: None,
            prev: None,
            pipelined: false,
            tail: Default::default(),
        }
    }

    pub fn key(&self) -> String {
        manifest_key(self.disk, self.seq)
    }

    /// The manifest a pipelined manifest needs in place to be valid
    /// (§11.4b); None for one that is not pipelined.
    pub fn pipelined_on(&self) -> Option<PrevRef> {
        self.prev.filter(|_| self.pipelined)
    }

    /// The node `root` points at, from the copy this manifest carries, if
    /// it has one that matches `root` (its CRC) and `levels`.
    pub fn root_node(&self) -> Option<MapNode> {
        use base64::Engine as _;
        let (e, copy) = (self.root?, self.root_node.as_ref()?);
        let b = base64::engine::general_purpose::STANDARD
            .decode(copy)
            .ok()?;
        if self.levels == 0 || b.len() != NODE_BYTES || crc32c::crc32c(&b) != e.crc {
            return None;
        }
        MapNode::decode(&self.key(), &b, self.levels - 1, 0).ok()
    }

    /// Carry a copy of `node`, the node `root` points at.
    pub fn set_root_node(&mut self, node: &MapNode) {
        use base64::Engine as _;
        self.root_node = Some(base64::engine::general_purpose::STANDARD.encode(node.encode()));
    }

    /// Format 2 (§11.5): `payload` (a sealed segment with this
    /// manifest's payload id, or empty), the tail, the body, the footer.
    /// A root node copy that does not match `root` is left out.
    pub fn encode(&self, payload: &[u8]) -> Vec<u8> {
        if self.root_node.is_some() && self.root_node().is_none() {
            let mut m = self.clone();
            m.root_node = None;
            return m.encode(payload);
        }
        let body = serde_json::to_vec(self).expect("json");
        let t = self.tail.len();
        let mut out = Vec::with_capacity(payload.len() + t * TAIL_ENTRY_BYTES + body.len() + 32);
        out.extend_from_slice(payload);
        let mut e = [0u8; TAIL_ENTRY_BYTES];
        for (vg, entry) in self.tail.iter() {
            e[..8].copy_from_slice(&vg.to_le_bytes());
            Entry::encode(entry.as_ref(), &mut e[8..]);
            out.extend_from_slice(&e);
        }
        out.extend_from_slice(&body);
        let crc = crc32c::crc32c(&out[payload.len()..]);
        let mut f = [0u8; MANIFEST_FOOTER_BYTES];
        f[..8].copy_from_slice(if self.pipelined {
            MAGIC_MANIFEST_3
        } else {
            MAGIC_MANIFEST_2
        });
        f[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        f[16..20].copy_from_slice(&(t as u32).to_le_bytes());
        f[20..24].copy_from_slice(&(body.len() as u32).to_le_bytes());
        f[24..28].copy_from_slice(&crc.to_le_bytes());
        let fcrc = crc32c::crc32c(&f[..28]);
        f[28..32].copy_from_slice(&fcrc.to_le_bytes());
        out.extend_from_slice(&f);
        out
    }

    /// Format 1 (§11.5), as builds before §11.4a wrote it (tests of
    /// stores those builds left).
    pub fn encode_v1(&self) -> Vec<u8> {
        assert!(self.tail.is_empty(), "format 1 has no tail");
        envelope::seal(MAGIC_MANIFEST, &serde_json::to_vec(self).expect("json"))
    }

    /// How many bytes at the end of a manifest object of `size` bytes hold
    /// its tail and body, given its last bytes `end` (at least the
    /// footer; None: it is format 1, read it whole).
    pub fn needs(key: &str, size: u64, end: &[u8]) -> crate::Result<Option<u64>> {
        if size < MANIFEST_FOOTER_BYTES as u64 {
            return Ok(None);
        }
        let Some(f) = Footer::read(key, end)? else {
            return Ok(None);
        };
        let want = f.tail as u64 * TAIL_ENTRY_BYTES as u64 + f.body as u64;
        if f.payload.checked_add(want + MANIFEST_FOOTER_BYTES as u64) != Some(size) {
            return Err(corrupt(format!(
                "{key}: the manifest footer gives {} + {want} + 32 bytes, the object has {size} (torn)",
                f.payload
            )));
        }
        Ok(Some(want + MANIFEST_FOOTER_BYTES as u64))
    }

    /// Decode a manifest from its object: `obj` is the whole object (format
    /// 1 or 2) or, for format 2, at least its last
    /// [`Manifest::needs`] bytes (the payload is not needed).
    pub fn decode(key: &str, obj: &[u8]) -> crate::Result<Manifest> {
        if obj.starts_with(MAGIC_MANIFEST) {
            let body = envelope::open(MAGIC_MANIFEST, key, obj)?;
            return Self::decode_body(key, body, Tail::new());
        }
        if obj.len() < MANIFEST_FOOTER_BYTES {
            return Err(corrupt(format!(
                "{key}: {} bytes: not a manifest (torn)",
                obj.len()
            )));
        }
        let Some(f) = Footer::read(key, obj)? else {
            return Err(corrupt(format!(
                "{key}: not a manifest (neither STRMAN01 at its start nor STRMAN02 or STRMAN03 at its end)"
            )));
        };
        let (t, b) = (f.tail as usize, f.body as usize);
        let len = t * TAIL_ENTRY_BYTES + b;
        let Some(start) = (obj.len() - MANIFEST_FOOTER_BYTES).checked_sub(len) else {
            return Err(corrupt(format!(
                "{key}: shorter than its footer says (torn)"
            )));
        };
        let rest = &obj[start..obj.len() - MANIFEST_FOOTER_BYTES];
        let actual = crc32c::crc32c(rest);
        if actual != f.crc {
            return Err(corrupt(format!(
                "{key}: checksum mismatch in the manifest's tail and body (stored {:#010x}, computed {actual:#010x})",
                f.crc
            )));
        }
        let mut tail = Tail::new();
        let mut last = None;
        for (i, e) in rest[..t * TAIL_ENTRY_BYTES]
            .chunks(TAIL_ENTRY_BYTES)
            .enumerate()
        {
            let vg = u64::from_le_bytes(e[..8].try_into().unwrap());
            if last.is_some_and(|l| l >= vg) {
                return Err(corrupt(format!("{key}: tail entry {i} is out of order")));
            }
            last = Some(vg);
            let entry = Entry::decode(&e[8..])
                .map_err(|why| why.context(format_args!("{key}: tail entry {i}")))?;
            tail.insert(vg, entry);
        }
        let m = Self::decode_body(key, &rest[t * TAIL_ENTRY_BYTES..], tail)?;
        if m.pipelined != f.pipelined || (m.pipelined && m.prev.is_none()) {
            return Err(corrupt(format!(
                "{key}: its footer and its body disagree on whether it is pipelined (damaged)"
            )));
        }
        Ok(m)
    }

    fn decode_body(key: &str, body: &[u8], tail: Tail) -> crate::Result<Manifest> {
        let mut m: Manifest = serde_json::from_slice(body)
            .map_err(|e| corrupt(format!("{key}: not a manifest: {e}")))?;
        if m.key() != key {
            return Err(corrupt(format!(
                "{key}: the manifest says it is {}",
                m.key()
            )));
        }
        m.tail = Arc::new(tail);
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> SegId {
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
    fn a_node_round_trips_and_every_flipped_bit_is_caught() {
        let mut n = MapNode::empty(1, 9, 3, 65536);
        n.entries[0] = Some(Entry {
            seg: id(),
            slot: 5,
            crc: 0x1234_5678,
        });
        n.entries[255] = Some(Entry {
            seg: id(),
            slot: 0,
            crc: 1,
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

    #[test]
    fn manifests_round_trip_and_name_their_key() {
        let m = Manifest {
            seq: 42,
            generation: 2,
            owner: Some(Owner {
                host: "h".into(),
                name: "vm1".into(),
                pid: 99,
            }),
            written_ms: 5,
            nonce: 77,
            root: Some(Entry {
                seg: id(),
                slot: 1,
                crc: 2,
            }),
            next_ctr: 13,
            ..Manifest::first(3, 1 << 30, 3)
        };
        let b = m.encode_v1();
        assert_eq!(Manifest::decode(&m.key(), &b).unwrap(), m);
        let e = Manifest::decode(&manifest_key(3, 43), &b).unwrap_err();
        assert!(e.message.contains("the manifest says it is"), "{e}");

        // Format 2, with a payload and a tail; read whole or from its end.
        let mut m = m;
        let mut tail = Tail::new();
        tail.insert(7, None);
        tail.insert(
            9,
            Some(Entry {
                seg: SegId::payload(3, 42),
                slot: 0,
                crc: 5,
            }),
        );
        m.tail = Arc::new(tail);
        let mut p = SegmentBuilder::new(SegId::payload(3, 42));
        p.add_grain(9, &[1u8; GRAIN]);
        let payload = p.seal(1);
        let b = m.encode(&payload);
        assert_eq!(Manifest::decode(&m.key(), &b).unwrap(), m);
        let need = Manifest::needs(&m.key(), b.len() as u64, &b[b.len() - 40..])
            .unwrap()
            .unwrap();
        assert_eq!(need as usize, b.len() - payload.len());
        let end = &b[b.len() - need as usize..];
        assert_eq!(Manifest::decode(&m.key(), end).unwrap(), m);
        assert_eq!(
            verify_segment(&m.key(), &b[..payload.len()])
                .unwrap()
                .grains,
            1
        );
        for i in (payload.len()..b.len()).step_by(5) {
            let mut d = b.clone();
            d[i] ^= 0x20;
            assert!(Manifest::decode(&m.key(), &d).is_err(), "flip at {i}");
        }
        let e = Manifest::needs(&m.key(), b.len() as u64 + 1, &b).unwrap_err();
        assert!(e.message.contains("torn"), "{e}");
        assert_eq!(SegId::payload(3, 42).key(), m.key());
        assert_eq!(SegId::payload(3, 42).payload_of(), Some(42));
        assert_eq!(SegId::from_key(&m.key()), None);
        let big = SegId::payload(3, (5u64 << 32) | 6);
        assert_eq!(big.payload_of(), Some((5u64 << 32) | 6));
        assert_eq!(SegId::payload_from_key(&big.key()), Some(big));
        let m = Manifest {
            tail: Default::default(),
            ..m
        };
        let b = m.encode(&[]);
        let e = Manifest::decode(&manifest_key(3, 43), &b).unwrap_err();
        assert!(
            e.message
                .contains("the manifest says it is disks/00000003/m/000000000000002a"),
            "{e}"
        );
        let mut d = b.clone();
        let n = d.len() - 3;
        d[n] ^= 1;
        assert!(Manifest::decode(&m.key(), &d).is_err());

        // The root node's copy: carried when it matches `root` and
        // `levels`, dropped at encode when it does not.
        let mut node = MapNode::empty(2, 3, 2, 0);
        node.entries[4] = Some(Entry {
            seg: id(),
            slot: 3,
            crc: 9,
        });
        let mut m = Manifest {
            root: Some(Entry {
                seg: id(),
                slot: 1,
                crc: crc32c::crc32c(&node.encode()),
            }),
            ..m
        };
        m.set_root_node(&node);
        assert_eq!(m.root_node(), Some(node.clone()));
        let back = Manifest::decode(&m.key(), &m.encode(&[])).unwrap();
        assert_eq!(back.root_node(), Some(node.clone()));
        for stale in [
            Manifest {
                root: Some(Entry {
                    crc: 1,
                    ..m.root.unwrap()
                }),
                ..m.clone()
            },
            Manifest {
                levels: 2,
                ..m.clone()
            },
        ] {
            assert_eq!(stale.root_node(), None);
            let back = Manifest::decode(&m.key(), &stale.encode(&[])).unwrap();
            assert_eq!(back.root_node, None);
        }
    }

    #[test]
    fn pipelined_manifests_carry_their_own_magic() {
        let mut m = Manifest::first(3, 1 << 30, 3);
        m.seq = 9;
        m.prev = Some(PrevRef { seq: 8, nonce: 77 });
        let plain = m.encode(&[]);
        assert_eq!(&plain[plain.len() - 32..][..8], MAGIC_MANIFEST_2);
        assert_eq!(Manifest::decode(&m.key(), &plain).unwrap(), m);
        m.pipelined = true;
        let b = m.encode(&[]);
        assert_eq!(&b[b.len() - 32..][..8], MAGIC_MANIFEST_3);
        assert_eq!(
            Manifest::needs(&m.key(), b.len() as u64, &b).unwrap(),
            Some(b.len() as u64)
        );
        assert_eq!(Manifest::decode(&m.key(), &b).unwrap(), m);
        // A footer that says pipelined over a body that does not (or the
        // other way round) is damage, not a manifest.
        let relabel = |b: &[u8], magic: &[u8; 8]| {
            let mut d = b.to_vec();
            let f = d.len() - 32;
            d[f..f + 8].copy_from_slice(magic);
            let crc = crc32c::crc32c(&d[f..f + 28]);
            d[f + 28..].copy_from_slice(&crc.to_le_bytes());
            d
        };
        for d in [
            relabel(&b, MAGIC_MANIFEST_2),
            relabel(&plain, MAGIC_MANIFEST_3),
        ] {
            let e = Manifest::decode(&m.key(), &d).unwrap_err();
            assert!(
                e.message.contains("disagree on whether it is pipelined"),
                "{e}"
            );
        }
        // Pipelined without a predecessor is damage too.
        m.prev = None;
        let e = Manifest::decode(&m.key(), &m.encode(&[])).unwrap_err();
        assert!(e.message.contains("pipelined"), "{e}");
        // Builds before §11.4b read the body without the two fields.
        let mut old = serde_json::to_value(Manifest::first(3, 1 << 30, 3)).unwrap();
        old.as_object_mut().unwrap().remove("prev");
        let back: Manifest = serde_json::from_value(old).unwrap();
        assert_eq!((back.prev, back.pipelined), (None, false));
    }
}
