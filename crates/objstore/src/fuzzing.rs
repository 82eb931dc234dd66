//! The objects of an object-store datastore fed to the real decoders, for
//! the fuzz target `objstore_objects` (fuzz/) and for the replay of its
//! corpus in the normal test suite (`tests/fuzz_corpus.rs`). Not part of
//! the crate's API.
//!
//! The input's first byte picks the object (docs/FORMAT.md §11.3–§11.5):
//! a segment header, a whole segment, a map node, a map entry, a manifest
//! or the root object; the rest is decoded. Decoders must not panic; what
//! decodes must encode to bytes that decode to the same value (the same
//! bytes where the encoding is canonical); and one changed byte in a
//! region a CRC-32C covers must be refused (§11.1, rule 4).

use crate::layout::{
    check_segment_ends, decode_segment_header, index_lines, manifest_key, verify_segment, Entry,
    Manifest, MapNode, SegmentBuilder, ENTRY_BYTES, NODE_BYTES, SEG_HEADER_BYTES,
    SEG_TRAILER_BYTES,
};
use crate::{RootCodec, KEY_ROOT};
use strata_api::store::RootObject;

/// What [`objects`] decoded, picked by the input's first byte (modulo the
/// number of kinds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectKind {
    /// A segment's first 64 bytes, under the key its id gives.
    SegmentHeader,
    /// A whole segment (or a manifest's payload), under the key its
    /// header's id gives.
    Segment,
    /// A map node, read as the node of the level and first grain it names.
    MapNode,
    /// The same with its CRC set by the harness first.
    MapNodeFixedCrc,
    /// One 24-byte map entry (shorter input is zero-padded).
    Entry,
    /// A manifest: disk id (u32 LE) and seq (u64 LE) of its key, then the
    /// object.
    Manifest,
    /// The root object `strata-store`.
    Root,
}

const KINDS: [ObjectKind; 7] = [
    ObjectKind::SegmentHeader,
    ObjectKind::Segment,
    ObjectKind::MapNode,
    ObjectKind::MapNodeFixedCrc,
    ObjectKind::Entry,
    ObjectKind::Manifest,
    ObjectKind::Root,
];

impl ObjectKind {
    /// The first byte that selects this kind.
    pub fn selector(self) -> u8 {
        KINDS.iter().position(|&k| k == self).expect("listed") as u8
    }
}

/// What [`objects`] did with its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectsSummary {
    pub kind: Option<ObjectKind>,
    pub decoded: bool,
}

/// A position in `0..n` that depends on every input byte.
fn pick(input: &[u8], n: usize) -> usize {
    (crc32c::crc32c(input) as usize) % n.max(1)
}

/// Decode `input[1..]` as the object `input[0]` selects, checking what the
/// module documentation says.
pub fn objects(input: &[u8]) -> ObjectsSummary {
    let Some((&sel, rest)) = input.split_first() else {
        return ObjectsSummary {
            kind: None,
            decoded: false,
        };
    };
    let kind = KINDS[sel as usize % KINDS.len()];
    let decoded = match kind {
        ObjectKind::SegmentHeader => segment_header(rest),
        ObjectKind::Segment => segment(rest),
        ObjectKind::MapNode => map_node(rest, false),
        ObjectKind::MapNodeFixedCrc => map_node(rest, true),
        ObjectKind::Entry => entry(rest),
        ObjectKind::Manifest => manifest(rest),
        ObjectKind::Root => root(rest),
    };
    ObjectsSummary {
        kind: Some(kind),
        decoded,
    }
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4"))
}

/// The key of the segment a header names (a payload's: its manifest's).
fn key_of(h: &[u8]) -> String {
    if h.len() < 28 {
        return "disks/00000000/s/0000000000000000".into();
    }
    crate::layout::SegId {
        disk: u32_at(h, 16),
        gen: u32_at(h, 20),
        ctr: u32_at(h, 24),
    }
    .key()
}

fn segment_header(h: &[u8]) -> bool {
    // Under another key: refused whatever it holds.
    let other = "disks/ffffffff/s/ffffffffffffffff";
    if key_of(h) != other {
        assert!(decode_segment_header(other, h).is_err());
    }
    let key = key_of(h);
    let Ok(info) = decode_segment_header(&key, h) else {
        return false;
    };
    assert!(info.len() >= (4096 + SEG_TRAILER_BYTES) as u64);
    // The CRC covers bytes 0..64 (§11.4).
    let at = pick(h, SEG_HEADER_BYTES);
    let mut c = h.to_vec();
    c[at] ^= 0x08;
    assert!(
        decode_segment_header(&key, &c).is_err(),
        "a segment header with byte {at} changed still decodes"
    );
    true
}

fn segment(b: &[u8]) -> bool {
    let key = key_of(b);
    if b.len() >= SEG_HEADER_BYTES + SEG_TRAILER_BYTES {
        let _ = check_segment_ends(
            &key,
            &b[..SEG_HEADER_BYTES],
            &b[b.len() - SEG_TRAILER_BYTES..],
            b.len() as u64,
        );
    }
    let Ok(info) = verify_segment(&key, b) else {
        return false;
    };
    assert_eq!(info.len(), b.len() as u64);
    // Rebuilt from its grains and nodes, it verifies and says the same.
    let mut s = if info.placed {
        SegmentBuilder::placed(info.id)
    } else {
        SegmentBuilder::new(info.id)
    };
    let lines =
        index_lines(&key, &info, &b[info.index_range()]).expect("a verified segment's index");
    for (i, g) in lines.iter().enumerate() {
        let at = g.offset as usize;
        let got = s.add_placed(g.vgrain, &b[at..at + usize::from(g.stored)], g.crc, 0);
        assert_eq!(
            got.grain_range(),
            (g.offset, usize::from(g.stored)),
            "grain {i}'s place"
        );
    }
    for j in 0..info.nodes {
        let at = info.node_offset(j) as usize;
        let n = &b[at..at + NODE_BYTES];
        let first = u64::from_le_bytes(n[24..32].try_into().expect("8"));
        // Nodes are not checked by the segment's own checks; only those
        // that decode can be rebuilt.
        let Ok(node) = MapNode::decode(&key, n, n[12], first) else {
            return true;
        };
        s.add_node(&node);
    }
    let again = s.seal(info.created_ms);
    assert_eq!(
        verify_segment(&key, &again).ok(),
        Some(info),
        "segment round trip"
    );
    true
}

fn map_node(b: &[u8], fix_crc: bool) -> bool {
    let mut b = b.to_vec();
    if b.len() < 32 {
        assert!(MapNode::decode("n", &b, 0, 0).is_err());
        return false;
    }
    if fix_crc {
        b[8..12].fill(0);
        let crc = crc32c::crc32c(&b);
        b[8..12].copy_from_slice(&crc.to_le_bytes());
    }
    let (level, first) = (b[12], u64::from_le_bytes(b[24..32].try_into().expect("8")));
    // Where another level or grain belongs: refused.
    assert!(MapNode::decode("n", &b, level.wrapping_add(1), first).is_err());
    assert!(MapNode::decode("n", &b, level, first ^ 1).is_err());
    let Ok(n) = MapNode::decode("n", &b, level, first) else {
        return false;
    };
    assert_eq!(n.entries.len(), 256);
    assert_eq!(n.encode(), b, "a map node encodes to other bytes");
    // The CRC covers the whole node (§11.4).
    let at = pick(&b, b.len());
    b[at] ^= 0x40;
    assert!(
        MapNode::decode("n", &b, level, first).is_err(),
        "a map node with byte {at} changed still decodes"
    );
    true
}

fn entry(b: &[u8]) -> bool {
    let mut e = [0u8; ENTRY_BYTES];
    let n = b.len().min(ENTRY_BYTES);
    e[..n].copy_from_slice(&b[..n]);
    let Ok(got) = Entry::decode(&e) else {
        return false;
    };
    let mut again = [0xffu8; ENTRY_BYTES];
    Entry::encode(got.as_ref(), &mut again);
    assert_eq!(again, e, "an entry encodes to other bytes");
    true
}

fn manifest(b: &[u8]) -> bool {
    if b.len() < 12 {
        return false;
    }
    let key = manifest_key(
        u32_at(b, 0),
        u64::from_le_bytes(b[4..12].try_into().expect("8")),
    );
    let obj = &b[12..];
    let needs = Manifest::needs(&key, obj.len() as u64, obj);
    let Ok(m) = Manifest::decode(&key, obj) else {
        return false;
    };
    assert_eq!(m.key(), key);
    let _ = (m.root_node(), m.pipelined_on());
    // Its last `needs` bytes are enough (§11.5).
    match needs {
        Ok(Some(n)) => {
            assert!(n <= obj.len() as u64);
            let end = &obj[obj.len() - n as usize..];
            assert_eq!(
                Manifest::decode(&key, end).ok().as_ref(),
                Some(&m),
                "a manifest read from its end differs"
            );
            // Tail, body and footer are covered by CRCs.
            let at = obj.len() - n as usize + pick(end, n as usize);
            let mut c = obj.to_vec();
            c[at] ^= 0x02;
            assert!(
                Manifest::decode(&key, &c).is_err(),
                "a manifest with byte {at} changed still decodes"
            );
        }
        Ok(None) => {
            // Format 1: the envelope's CRC covers the body; its header is
            // checked too.
            let at = pick(obj, obj.len());
            let mut c = obj.to_vec();
            c[at] ^= 0x02;
            assert!(
                Manifest::decode(&key, &c).is_err(),
                "a format-1 manifest with byte {at} changed still decodes"
            );
        }
        // `decode` may be given only the end of an object, so it cannot
        // see that the footer's payload length does not fit the object;
        // `needs` does, and the store's reader asks it first, also for a
        // manifest it reads whole (a fuzzing find: it did not).
        Err(e) => assert!(e.message.contains("torn"), "{e}"),
    }
    // Round trip, as format 2 (a root node copy that does not match its
    // root is dropped at encode).
    let mut want = m.clone();
    if want.root_node().is_none() {
        want.root_node = None;
    }
    let again = Manifest::decode(&key, &m.encode(&[])).expect("an encoded manifest decodes");
    assert_eq!(again, want, "manifest round trip");
    true
}

fn root(b: &[u8]) -> bool {
    let Ok(r) = RootObject::decode(b) else {
        return false;
    };
    assert_eq!(
        RootObject::decode(&r.encode()).ok(),
        Some(r),
        "root round trip"
    );
    let at = pick(b, b.len());
    let mut c = b.to_vec();
    c[at] ^= 0x01;
    assert!(
        RootObject::decode(&c).is_err(),
        "{KEY_ROOT} with byte {at} changed still decodes"
    );
    true
}
