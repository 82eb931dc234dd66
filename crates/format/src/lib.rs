//! strata's on-disk structures, byte for byte as `docs/FORMAT.md` defines them.
//!
//! Everything here is pure encoding and decoding: no I/O. Decoders never
//! panic on input; they return [`FormatError`] naming what is wrong. Every
//! encoder is paired with a decoder and the pair is tested for round trips.

use thiserror::Error;

/// Bytes of a grain: the unit of mapping, sharing and allocation.
pub const GRAIN_BYTES: u64 = 4096;
/// log2 of [`GRAIN_BYTES`].
pub const GRAIN_SHIFT: u32 = 12;
/// Grains of a block: the unit of allocation for locality and of nb/tbz.
pub const BLOCK_GRAINS: u64 = 256;
/// Bytes of a block (1 MiB).
pub const BLOCK_BYTES: u64 = GRAIN_BYTES * BLOCK_GRAINS;
/// Entries of a map node.
pub const MAP_FANOUT: usize = 512;
/// log2 of [`MAP_FANOUT`].
pub const MAP_FANOUT_SHIFT: u32 = 9;
/// Deepest map a disk may have (5 levels cover 128 PiB).
pub const MAP_LEVELS_MAX: u8 = 5;
/// Reference counts per 4 KiB page of `refcount.data`.
pub const REFS_PER_PAGE: usize = 1024;
/// Bits of a map entry that hold a grain number.
pub const ENTRY_GRAIN_MASK: u64 = (1 << 48) - 1;

/// Superblock slot size and count.
pub const SUPER_SLOT_BYTES: usize = 4096;
pub const SUPER_MAGIC: &[u8; 8] = b"STRATASB";
pub const FORMAT_VERSION: u32 = 1;
/// Meaningful bytes of a superblock slot in format version 1.
pub const SUPER_HEADER_BYTES: u32 = 128;
/// Feature bits this build understands (none are defined yet).
pub const INCOMPAT_KNOWN: u32 = 0;
pub const RO_COMPAT_KNOWN: u32 = 0;

/// Log batch header.
pub const BATCH_MAGIC: u32 = 0x4c4e_4a53; // "SJNL"
pub const BATCH_HEADER_BYTES: usize = 32;
/// Batches start at multiples of this.
pub const BATCH_ALIGN: u64 = 4096;
/// Largest payload a reader accepts (a bound against corrupt lengths).
pub const BATCH_PAYLOAD_MAX: u32 = 256 << 20;

/// Object names inside a datastore.
pub const FILE_SUPER: &str = "strata.super";
pub const FILE_POOL: &str = "pool.data";
pub const FILE_REFCOUNT: &str = "refcount.data";
pub const FILE_JOURNAL: &str = "journal.log";
pub const FILE_LOCK: &str = "lock";
pub const FILE_CONTROL: &str = "control.sock";
pub fn catalog_file(generation: u64) -> &'static str {
    if generation.is_multiple_of(2) {
        "catalog.0"
    } else {
        "catalog.1"
    }
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FormatError {
    #[error("bad magic in {what}")]
    BadMagic { what: &'static str },
    #[error("checksum mismatch in {what} (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum {
        what: &'static str,
        stored: u32,
        computed: u32,
    },
    #[error("unsupported format version {0} (this build reads version {FORMAT_VERSION})")]
    Version(u32),
    #[error("unknown incompatible feature bits {0:#x}: this datastore needs a newer strata")]
    IncompatFeatures(u32),
    #[error("{what}: {detail}")]
    Invalid { what: &'static str, detail: String },
    #[error("truncated {what}")]
    Truncated { what: &'static str },
}

fn invalid(what: &'static str, detail: impl Into<String>) -> FormatError {
    FormatError::Invalid {
        what,
        detail: detail.into(),
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

// ---------------------------------------------------------------- superblock

/// Superblock fields (docs/FORMAT.md §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub generation: u64,
    pub capacity_bytes: u64,
    pub pool_grains: u64,
    pub catalog_bytes: u64,
    pub catalog_checksum: u32,
    pub uuid: [u8; 16],
    pub created_unix_secs: u64,
    pub ro_compat: u32,
    pub compat: u32,
}

pub mod super_off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const INCOMPAT: usize = 12;
    pub const RO_COMPAT: usize = 16;
    pub const COMPAT: usize = 20;
    pub const HEADER_BYTES: usize = 24;
    pub const CHECKSUM: usize = 28;
    pub const GENERATION: usize = 32;
    pub const GRAIN_BYTES: usize = 40;
    pub const BLOCK_GRAINS: usize = 44;
    pub const CAPACITY: usize = 48;
    pub const POOL_GRAINS: usize = 56;
    pub const CATALOG_BYTES: usize = 64;
    pub const CATALOG_CHECKSUM: usize = 72;
    pub const UUID: usize = 80;
    pub const CREATED: usize = 96;
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        use super_off::*;
        let mut b = vec![0u8; SUPER_SLOT_BYTES];
        b[MAGIC..MAGIC + 8].copy_from_slice(SUPER_MAGIC);
        b[VERSION..VERSION + 4].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[INCOMPAT..INCOMPAT + 4].copy_from_slice(&0u32.to_le_bytes());
        b[RO_COMPAT..RO_COMPAT + 4].copy_from_slice(&self.ro_compat.to_le_bytes());
        b[COMPAT..COMPAT + 4].copy_from_slice(&self.compat.to_le_bytes());
        b[HEADER_BYTES..HEADER_BYTES + 4].copy_from_slice(&SUPER_HEADER_BYTES.to_le_bytes());
        b[GENERATION..GENERATION + 8].copy_from_slice(&self.generation.to_le_bytes());
        b[super_off::GRAIN_BYTES..super_off::GRAIN_BYTES + 4]
            .copy_from_slice(&(crate::GRAIN_BYTES as u32).to_le_bytes());
        b[super_off::BLOCK_GRAINS..super_off::BLOCK_GRAINS + 4]
            .copy_from_slice(&(crate::BLOCK_GRAINS as u32).to_le_bytes());
        b[CAPACITY..CAPACITY + 8].copy_from_slice(&self.capacity_bytes.to_le_bytes());
        b[POOL_GRAINS..POOL_GRAINS + 8].copy_from_slice(&self.pool_grains.to_le_bytes());
        b[CATALOG_BYTES..CATALOG_BYTES + 8].copy_from_slice(&self.catalog_bytes.to_le_bytes());
        b[CATALOG_CHECKSUM..CATALOG_CHECKSUM + 4]
            .copy_from_slice(&self.catalog_checksum.to_le_bytes());
        b[UUID..UUID + 16].copy_from_slice(&self.uuid);
        b[CREATED..CREATED + 8].copy_from_slice(&self.created_unix_secs.to_le_bytes());
        let crc = crc32c::crc32c(&b[..SUPER_HEADER_BYTES as usize]);
        b[CHECKSUM..CHECKSUM + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, FormatError> {
        use super_off::*;
        const WHAT: &str = "superblock";
        if b.len() < SUPER_HEADER_BYTES as usize {
            return Err(FormatError::Truncated { what: WHAT });
        }
        if &b[MAGIC..MAGIC + 8] != SUPER_MAGIC {
            return Err(FormatError::BadMagic { what: WHAT });
        }
        let header_bytes = u32_at(b, HEADER_BYTES);
        if header_bytes < SUPER_HEADER_BYTES
            || header_bytes as usize > b.len().min(SUPER_SLOT_BYTES)
        {
            return Err(invalid(
                WHAT,
                format!("header length {header_bytes} out of range"),
            ));
        }
        let mut copy = b[..header_bytes as usize].to_vec();
        copy[CHECKSUM..CHECKSUM + 4].fill(0);
        let computed = crc32c::crc32c(&copy);
        let stored = u32_at(b, CHECKSUM);
        if stored != computed {
            return Err(FormatError::BadChecksum {
                what: WHAT,
                stored,
                computed,
            });
        }
        let version = u32_at(b, VERSION);
        if version != FORMAT_VERSION {
            return Err(FormatError::Version(version));
        }
        let incompat = u32_at(b, INCOMPAT);
        if incompat & !INCOMPAT_KNOWN != 0 {
            return Err(FormatError::IncompatFeatures(incompat & !INCOMPAT_KNOWN));
        }
        let grain = u32_at(b, super_off::GRAIN_BYTES);
        if grain as u64 != crate::GRAIN_BYTES {
            return Err(invalid(WHAT, format!("grain size {grain} is not 4096")));
        }
        let block = u32_at(b, super_off::BLOCK_GRAINS);
        if block as u64 != crate::BLOCK_GRAINS {
            return Err(invalid(WHAT, format!("block of {block} grains is not 256")));
        }
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[UUID..UUID + 16]);
        Ok(Superblock {
            generation: u64_at(b, GENERATION),
            capacity_bytes: u64_at(b, CAPACITY),
            pool_grains: u64_at(b, POOL_GRAINS),
            catalog_bytes: u64_at(b, CATALOG_BYTES),
            catalog_checksum: u32_at(b, CATALOG_CHECKSUM),
            uuid,
            created_unix_secs: u64_at(b, CREATED),
            ro_compat: u32_at(b, RO_COMPAT),
            compat: u32_at(b, COMPAT),
        })
    }

    /// Pick the current superblock from the two slots. Returns the decoded
    /// superblock, or the errors of both slots.
    pub fn pick(slot0: &[u8], slot1: &[u8]) -> Result<Superblock, FormatError> {
        match (Self::decode(slot0), Self::decode(slot1)) {
            (Ok(a), Ok(b)) => Ok(if b.generation > a.generation { b } else { a }),
            (Ok(a), Err(_)) => Ok(a),
            (Err(_), Ok(b)) => Ok(b),
            // Report the more telling error: a version/feature refusal beats garbage.
            (Err(e0), Err(e1)) => Err(match (&e0, &e1) {
                (FormatError::Version(_) | FormatError::IncompatFeatures(_), _) => e0,
                (_, FormatError::Version(_) | FormatError::IncompatFeatures(_)) => e1,
                _ => e0,
            }),
        }
    }
}

// ---------------------------------------------------------------- log records

/// A metadata log record (docs/FORMAT.md §5). Every record's effect is an
/// absolute value, so replaying it twice is harmless.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    PageImage {
        grain: u64,
        data: Box<[u8; GRAIN_BYTES as usize]>,
    },
    PageZero {
        grain: u64,
    },
    MapSet {
        grain: u64,
        index: u16,
        value: u64,
    },
    RefSet {
        grain: u64,
        count: u32,
    },
    Version(VersionState),
    Catalog(Vec<u8>),
}

/// The mutable state of one version: root, depth and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VersionState {
    pub version: u64,
    pub root: u64,
    pub levels: u8,
    pub mapped_grains: u64,
    pub nb: u64,
}

pub mod tag {
    pub const PAGE_IMAGE: u8 = 1;
    pub const PAGE_ZERO: u8 = 2;
    pub const MAP_SET: u8 = 3;
    pub const REF_SET: u8 = 4;
    pub const VERSION: u8 = 5;
    pub const CATALOG: u8 = 6;
}

impl Record {
    /// Append the encoding of this record to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        match self {
            Record::PageImage { grain, data } => {
                out.push(tag::PAGE_IMAGE);
                out.extend_from_slice(&grain.to_le_bytes());
                out.extend_from_slice(&data[..]);
            }
            Record::PageZero { grain } => {
                out.push(tag::PAGE_ZERO);
                out.extend_from_slice(&grain.to_le_bytes());
            }
            Record::MapSet {
                grain,
                index,
                value,
            } => {
                out.push(tag::MAP_SET);
                out.extend_from_slice(&grain.to_le_bytes());
                out.extend_from_slice(&index.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
            Record::RefSet { grain, count } => {
                out.push(tag::REF_SET);
                out.extend_from_slice(&grain.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            Record::Version(v) => {
                out.push(tag::VERSION);
                out.extend_from_slice(&v.version.to_le_bytes());
                out.extend_from_slice(&v.root.to_le_bytes());
                out.push(v.levels);
                out.extend_from_slice(&v.mapped_grains.to_le_bytes());
                out.extend_from_slice(&v.nb.to_le_bytes());
            }
            Record::Catalog(bytes) => {
                out.push(tag::CATALOG);
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(bytes);
            }
        }
    }

    /// Decode all records of a batch payload.
    pub fn decode_all(mut p: &[u8]) -> Result<Vec<Record>, FormatError> {
        const WHAT: &str = "log record";
        fn take<'a>(p: &mut &'a [u8], n: usize) -> Result<&'a [u8], FormatError> {
            if p.len() < n {
                return Err(FormatError::Truncated { what: WHAT });
            }
            let (a, b) = p.split_at(n);
            *p = b;
            Ok(a)
        }
        fn u64_(p: &mut &[u8]) -> Result<u64, FormatError> {
            Ok(u64::from_le_bytes(take(p, 8)?.try_into().expect("8")))
        }
        fn u32_(p: &mut &[u8]) -> Result<u32, FormatError> {
            Ok(u32::from_le_bytes(take(p, 4)?.try_into().expect("4")))
        }
        let mut out = Vec::new();
        while !p.is_empty() {
            let t = take(&mut p, 1)?[0];
            let rec = match t {
                tag::PAGE_IMAGE => {
                    let grain = u64_(&mut p)?;
                    let mut data = Box::new([0u8; GRAIN_BYTES as usize]);
                    data.copy_from_slice(take(&mut p, GRAIN_BYTES as usize)?);
                    Record::PageImage { grain, data }
                }
                tag::PAGE_ZERO => Record::PageZero {
                    grain: u64_(&mut p)?,
                },
                tag::MAP_SET => {
                    let grain = u64_(&mut p)?;
                    let index = u16::from_le_bytes(take(&mut p, 2)?.try_into().expect("2"));
                    if index as usize >= MAP_FANOUT {
                        return Err(invalid(WHAT, format!("map index {index} out of range")));
                    }
                    let value = u64_(&mut p)?;
                    Record::MapSet {
                        grain,
                        index,
                        value,
                    }
                }
                tag::REF_SET => Record::RefSet {
                    grain: u64_(&mut p)?,
                    count: u32_(&mut p)?,
                },
                tag::VERSION => {
                    let version = u64_(&mut p)?;
                    let root = u64_(&mut p)?;
                    let levels = take(&mut p, 1)?[0];
                    if levels == 0 || levels > MAP_LEVELS_MAX {
                        return Err(invalid(WHAT, format!("map depth {levels} out of range")));
                    }
                    Record::Version(VersionState {
                        version,
                        root,
                        levels,
                        mapped_grains: u64_(&mut p)?,
                        nb: u64_(&mut p)?,
                    })
                }
                tag::CATALOG => {
                    let len = u32_(&mut p)? as usize;
                    Record::Catalog(take(&mut p, len)?.to_vec())
                }
                other => return Err(invalid(WHAT, format!("unknown record tag {other}"))),
            };
            out.push(rec);
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------- log batches

/// A decoded batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub generation: u64,
    pub sequence: u64,
    pub payload_bytes: u32,
}

/// Encode a batch: header, payload, zero padding to [`BATCH_ALIGN`].
pub fn encode_batch(generation: u64, sequence: u64, payload: &[u8]) -> Vec<u8> {
    let total = BATCH_HEADER_BYTES + payload.len();
    let padded = total.div_ceil(BATCH_ALIGN as usize) * BATCH_ALIGN as usize;
    let mut b = Vec::with_capacity(padded);
    b.extend_from_slice(&BATCH_MAGIC.to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(&generation.to_le_bytes());
    b.extend_from_slice(&sequence.to_le_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(&0u32.to_le_bytes());
    b.extend_from_slice(payload);
    let crc = crc32c::crc32c(&b);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b.resize(padded, 0);
    b
}

/// Decode a batch header; `None` if this is not a batch at all (end of log).
pub fn decode_batch_header(b: &[u8]) -> Option<BatchHeader> {
    if b.len() < BATCH_HEADER_BYTES || u32_at(b, 0) != BATCH_MAGIC {
        return None;
    }
    let payload_bytes = u32_at(b, 24);
    if payload_bytes > BATCH_PAYLOAD_MAX {
        return None;
    }
    Some(BatchHeader {
        generation: u64_at(b, 8),
        sequence: u64_at(b, 16),
        payload_bytes,
    })
}

/// Verify a whole batch (header + payload, unpadded) against its checksum.
pub fn batch_checksum_ok(b: &[u8]) -> bool {
    if b.len() < BATCH_HEADER_BYTES {
        return false;
    }
    let stored = u32_at(b, 4);
    let mut h = crc32c::crc32c(&b[..4]);
    h = crc32c::crc32c_append(h, &[0u8; 4]);
    h = crc32c::crc32c_append(h, &b[8..]);
    h == stored
}

/// Bytes a batch with this payload occupies in the log, padding included.
pub fn batch_span(payload_bytes: u32) -> u64 {
    (BATCH_HEADER_BYTES as u64 + payload_bytes as u64).div_ceil(BATCH_ALIGN) * BATCH_ALIGN
}

// ---------------------------------------------------------------- map nodes

/// Decode a map node page into entries, checking the reserved bits.
pub fn decode_map_node(b: &[u8]) -> Result<Box<[u64; MAP_FANOUT]>, FormatError> {
    if b.len() != GRAIN_BYTES as usize {
        return Err(FormatError::Truncated { what: "map node" });
    }
    let mut e = Box::new([0u64; MAP_FANOUT]);
    for (i, slot) in e.iter_mut().enumerate() {
        let v = u64_at(b, i * 8);
        if v & !ENTRY_GRAIN_MASK != 0 {
            return Err(invalid(
                "map node",
                format!("entry {i} has reserved bits set: {v:#x}"),
            ));
        }
        *slot = v;
    }
    Ok(e)
}

pub fn encode_map_node(e: &[u64; MAP_FANOUT], out: &mut [u8]) {
    for (i, v) in e.iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
}

/// Depth of the map needed to address `grains` virtual grains.
pub fn levels_for(grains: u64) -> u8 {
    let mut levels = 1u8;
    let mut cover = MAP_FANOUT as u64;
    while cover < grains && levels < MAP_LEVELS_MAX {
        levels += 1;
        cover = cover.saturating_mul(MAP_FANOUT as u64);
    }
    levels
}

/// Largest disk a map of [`MAP_LEVELS_MAX`] levels addresses, in bytes.
pub fn disk_bytes_max() -> u64 {
    (MAP_FANOUT as u64).pow(MAP_LEVELS_MAX as u32) * GRAIN_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sb() -> Superblock {
        Superblock {
            generation: 9,
            capacity_bytes: 1 << 40,
            pool_grains: 1234,
            catalog_bytes: 77,
            catalog_checksum: 0xdead_beef,
            uuid: [7; 16],
            created_unix_secs: 42,
            ro_compat: 0,
            compat: 0,
        }
    }

    #[test]
    fn superblock_round_trips_and_offsets_match_the_spec() {
        let b = sb().encode();
        assert_eq!(&b[0..8], b"STRATASB");
        assert_eq!(u64_at(&b, 32), 9, "generation at 32");
        assert_eq!(u32_at(&b, 40), 4096, "grain_bytes at 40");
        assert_eq!(u32_at(&b, 44), 256, "block_grains at 44");
        assert_eq!(u64_at(&b, 56), 1234, "pool_grains at 56");
        assert_eq!(Superblock::decode(&b).unwrap(), sb());
    }

    #[test]
    fn superblock_refuses_flipped_bits_unknown_features_and_versions() {
        let mut b = sb().encode();
        b[60] ^= 1;
        assert!(matches!(
            Superblock::decode(&b),
            Err(FormatError::BadChecksum { .. })
        ));
        let mut b = sb().encode();
        b[12] = 4; // unknown incompat bit; fix checksum
        b[28..32].fill(0);
        let crc = crc32c::crc32c(&b[..128]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Superblock::decode(&b),
            Err(FormatError::IncompatFeatures(4))
        );
    }

    #[test]
    fn pick_prefers_newer_valid_slot() {
        let a = sb();
        let mut b2 = sb();
        b2.generation = 10;
        let pa = a.encode();
        let pb = b2.encode();
        assert_eq!(Superblock::pick(&pa, &pb).unwrap().generation, 10);
        let mut torn = pb.clone();
        torn[100] ^= 0xff;
        assert_eq!(Superblock::pick(&pa, &torn).unwrap().generation, 9);
        assert!(Superblock::pick(&[0u8; 4096], &[0u8; 4096]).is_err());
    }

    #[test]
    fn levels_cover_disk_sizes() {
        assert_eq!(levels_for(1), 1);
        assert_eq!(levels_for(512), 1);
        assert_eq!(levels_for(513), 2);
        assert_eq!(levels_for(512 * 512), 2);
        assert_eq!(levels_for((1u64 << 40) / 4096), 4); // 1 TiB
        assert_eq!(levels_for(u64::MAX), MAP_LEVELS_MAX);
    }

    fn arb_record() -> impl Strategy<Value = Record> {
        prop_oneof![
            (any::<u64>(), any::<u8>()).prop_map(|(g, b)| Record::PageImage {
                grain: g,
                data: Box::new([b; 4096])
            }),
            any::<u64>().prop_map(|g| Record::PageZero { grain: g }),
            (any::<u64>(), 0u16..512, any::<u64>()).prop_map(|(grain, index, value)| {
                Record::MapSet {
                    grain,
                    index,
                    value,
                }
            }),
            (any::<u64>(), any::<u32>()).prop_map(|(grain, count)| Record::RefSet { grain, count }),
            (
                any::<u64>(),
                any::<u64>(),
                1u8..=5,
                any::<u64>(),
                any::<u64>()
            )
                .prop_map(
                    |(version, root, levels, mapped_grains, nb)| Record::Version(VersionState {
                        version,
                        root,
                        levels,
                        mapped_grains,
                        nb
                    })
                ),
            proptest::collection::vec(any::<u8>(), 0..100).prop_map(Record::Catalog),
        ]
    }

    proptest! {
        #[test]
        fn records_round_trip(recs in proptest::collection::vec(arb_record(), 0..20)) {
            let mut buf = Vec::new();
            for r in &recs { r.encode_into(&mut buf); }
            prop_assert_eq!(Record::decode_all(&buf).unwrap(), recs);
        }

        #[test]
        fn record_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let _ = Record::decode_all(&bytes);
        }

        #[test]
        fn superblock_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
            let _ = Superblock::decode(&bytes);
        }

        #[test]
        fn batches_verify_and_detect_any_flip(payload in proptest::collection::vec(any::<u8>(), 0..300), flip in 0usize..332) {
            let b = encode_batch(3, 4, &payload);
            prop_assert_eq!(b.len() as u64 % BATCH_ALIGN, 0);
            let h = decode_batch_header(&b).unwrap();
            prop_assert_eq!(h, BatchHeader { generation: 3, sequence: 4, payload_bytes: payload.len() as u32 });
            let used = BATCH_HEADER_BYTES + payload.len();
            prop_assert!(batch_checksum_ok(&b[..used]));
            let mut c = b.clone();
            let at = flip % used;
            c[at] ^= 0x40;
            prop_assert!(!batch_checksum_ok(&c[..used]) || decode_batch_header(&c).is_none());
        }
    }
}
