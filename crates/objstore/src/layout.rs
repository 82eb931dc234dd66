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
/// A segment whose grains are 4 KiB slots, stored as they are.
pub const SEGMENT_VERSION: u32 = 1;
/// A segment whose grains are placed (§18.6): each at a byte offset, a
/// multiple of [`PLACE_ALIGN`], compressed when that saves an eighth.
pub const SEGMENT_VERSION_PLACED: u32 = 2;
/// Grains of a version-2 segment start at multiples of this.
pub const PLACE_ALIGN: usize = 16;
/// The most bytes a grain may take compressed and be kept so (an eighth
/// of a grain saved, as the local pack pass asks, §18.8).
pub const MAX_PACKED: usize = GRAIN - GRAIN / 8;
const ENTRY_PRESENT: u32 = 1;
/// A leaf entry naming a grain of a version-2 segment (§18.6).
const ENTRY_PLACED: u32 = 2;
/// A placed entry's stored length, in flags bits 16..28.
const ENTRY_LEN_SHIFT: u32 = 16;
const ENTRY_LEN_MASK: u32 = 0x1fff;
/// Codecs of a version-2 segment's index (§18.6).
const CODEC_RAW: u8 = 0;
const CODEC_LZ4: u8 = 1;

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
    /// A leaf's grain in a version-2 segment (§18.6): the bytes it is
    /// stored in (4,096: raw; fewer: LZ4), and `slot` is its byte offset
    /// in the data area divided by [`PLACE_ALIGN`]. 0: `slot` counts
    /// 4 KiB grains (version 1) or nodes; the CRC is then of the stored
    /// bytes, which are the grain. Either way the CRC is of the 4,096
    /// bytes a read returns (ciphertext on an encrypted disk).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stored: u16,
}

fn is_zero<T: Default + PartialEq>(k: &T) -> bool {
    *k == T::default()
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
            let mut flags = ENTRY_PRESENT | u32::from(e.key) << ENTRY_KEY_SHIFT;
            if e.stored != 0 {
                flags |= ENTRY_PLACED | u32::from(e.stored) << ENTRY_LEN_SHIFT;
            }
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
        let known = ENTRY_PRESENT
            | u32::from(MAX_KEY_INDEX) << ENTRY_KEY_SHIFT
            | ENTRY_PLACED
            | ENTRY_LEN_MASK << ENTRY_LEN_SHIFT;
        match w(20) {
            0 if b[..ENTRY_BYTES].iter().all(|&x| x == 0) => Ok(None),
            0 => Err(corrupt("a hole entry with non-zero fields")),
            f if f & !known == 0 && f & ENTRY_PRESENT != 0 => {
                let stored = (f >> ENTRY_LEN_SHIFT & ENTRY_LEN_MASK) as u16;
                if (f & ENTRY_PLACED != 0) != (stored != 0) || usize::from(stored) > GRAIN {
                    return Err(corrupt(format!(
                        "entry flags {f:#x}: a placed grain of {stored} stored bytes (1 to {GRAIN} with bit 1, none without)"
                    )));
                }
                Ok(Some(Entry {
                    seg: SegId {
                        disk: w(0),
                        gen: w(4),
                        ctr: w(8),
                    },
                    slot: w(12),
                    crc: w(16),
                    key: (f >> ENTRY_KEY_SHIFT & u32::from(MAX_KEY_INDEX)) as u8,
                    stored,
                }))
            }
            f => Err(corrupt(format!(
                "entry flags {f:#x} (bits 0 and 1, a key index in bits 8-11 and a length in bits 16-28 are defined)"
            ))),
        }
    }

    /// Where a leaf's grain lies in its segment: its byte offset and the
    /// bytes it is stored in.
    pub fn grain_range(&self) -> (u64, usize) {
        if self.stored == 0 {
            (SegmentInfo::grain_offset(self.slot), GRAIN)
        } else {
            (
                SEG_DATA_OFFSET as u64 + u64::from(self.slot) * PLACE_ALIGN as u64,
                usize::from(self.stored),
            )
        }
    }

    /// The grain's 4,096 bytes into `out` from `stored`, the bytes at
    /// [`Entry::grain_range`]: decompressed when they are fewer, then
    /// checked against the entry's CRC. False when they do not decode to
    /// exactly a grain or fail the CRC (damage, or a hole of a sparse
    /// cache file): `out` then holds nothing to use.
    pub fn unplace(&self, stored: &[u8], out: &mut [u8]) -> bool {
        unplace(stored, self.crc, out)
    }

    /// The bytes a leaf's grain takes in its segment (padding included).
    pub fn kept_bytes(&self) -> u64 {
        kept_bytes(self.stored)
    }

    /// [`Entry::unplace`] from a whole segment's bytes `obj` (false too
    /// when they are too short to hold the grain).
    pub fn unplace_from(&self, obj: &[u8], out: &mut [u8]) -> bool {
        let (at, len) = self.grain_range();
        obj.get(at as usize..at as usize + len)
            .is_some_and(|stored| self.unplace(stored, out))
    }

    /// The 4 KiB pages of its segment's data area (page `i` at byte
    /// `4096 + 4096 i`) a leaf's grain is stored in: slot `i` alone in
    /// version 1, one or two pages in version 2. What a cache's sparse
    /// file and its read bits count (§11.8).
    pub fn pages(&self) -> std::ops::Range<u32> {
        let (at, len) = self.grain_range();
        let first = (at - SEG_DATA_OFFSET as u64) / GRAIN as u64;
        let end = (at - SEG_DATA_OFFSET as u64 + len as u64).div_ceil(GRAIN as u64);
        first as u32..end as u32
    }
}

/// The bytes a grain stored in `stored` bytes (0: a version-1 slot) takes
/// in its segment: §18.6 pads a placed grain to [`PLACE_ALIGN`].
pub fn kept_bytes(stored: u16) -> u64 {
    match stored {
        0 => GRAIN as u64,
        n => u64::from(n).next_multiple_of(PLACE_ALIGN as u64),
    }
}

/// A grain's 4,096 bytes into `out` from the bytes it is stored in,
/// checked against `crc` (see [`Entry::unplace`]).
pub fn unplace(stored: &[u8], crc: u32, out: &mut [u8]) -> bool {
    let out = &mut out[..GRAIN];
    if stored.len() == GRAIN {
        out.copy_from_slice(stored);
    } else if !matches!(
        lz4::block::decompress_to_buffer(stored, Some(GRAIN as i32), out),
        Ok(GRAIN)
    ) {
        return false;
    }
    crc32c::crc32c(out) == crc
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
        if let Some(i) = (level > 0)
            .then(|| {
                entries
                    .iter()
                    .position(|e| e.is_some_and(|e| e.stored != 0))
            })
            .flatten()
        {
            return Err(corrupt(format!(
                "{place}: entry {i} of a level-{level} node is a placed grain's, not a node's"
            )));
        }
        Ok(MapNode {
            level,
            disk: u32::from_le_bytes(b[16..20].try_into().unwrap()),
            gen: u32::from_le_bytes(b[20..24].try_into().unwrap()),
            first,
            entries,
        })
    }
}

mod manifest;
mod segment;
pub use manifest::*;
pub use segment::*;

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
                stored: 0,
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
                    stored: 0,
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
            stored: 0,
        });
        n.entries[255] = Some(Entry {
            seg: id(),
            slot: 0,
            crc: 1,
            key: 0,
            stored: 0,
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
    fn a_placed_entry_carries_its_length_and_a_wrong_one_is_refused() {
        let e = Entry {
            seg: id(),
            slot: 1000,
            crc: 9,
            key: 2,
            stored: 1234,
        };
        let mut b = [0u8; ENTRY_BYTES];
        Entry::encode(Some(&e), &mut b);
        assert_eq!(Entry::decode(&b).unwrap(), Some(e));
        assert_eq!(e.grain_range(), (4096 + 16_000, 1234));
        let flags = u32::from_le_bytes(b[20..24].try_into().unwrap());
        assert_eq!(flags, 1 | 2 | 2 << 8 | 1234 << 16);
        for (f, why) in [
            (1 | 2, "placed grain of 0 stored bytes"),
            (1 | 100 << 16, "placed grain of 100 stored bytes"),
            (1 | 2 | 4097 << 16, "placed grain of 4097 stored bytes"),
            (1 | 4, "entry flags 0x5"),
        ] {
            b[20..24].copy_from_slice(&(f as u32).to_le_bytes());
            let err = Entry::decode(&b).unwrap_err();
            assert!(err.message.contains(why), "{f:#x}: {err}");
        }
    }
}
