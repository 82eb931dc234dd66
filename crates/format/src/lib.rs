//! strata's on-disk structures, byte for byte as `docs/FORMAT.md` defines them.
//!
//! Everything here is pure encoding and decoding: no I/O. Decoders never
//! panic on input; they return [`FormatError`] naming what is wrong. Every
//! encoder is paired with a decoder and the pair is tested for round trips.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

use thiserror::Error;

pub mod packed;

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
/// Reference counts per 4 KiB count page of `refcount.data` (§4).
pub const REFS_PER_PAGE: usize = 1020;
/// Reference counts per page in format version 1 (no trailer).
pub const REFS_PER_PAGE_V1: usize = 1024;
/// Count-page trailer: page index at 4080, magic at 4088, CRC-32C at 4092.
pub mod ref_page_off {
    pub const INDEX: usize = 4080;
    pub const MAGIC: usize = 4088;
    pub const CRC: usize = 4092;
}
/// Count-page magic, `SREF`.
pub const REF_PAGE_MAGIC: u32 = 0x4645_5253;
/// Bits of a map entry that hold a grain number.
pub const ENTRY_GRAIN_MASK: u64 = (1 << 48) - 1;
/// Where a leaf entry's key index starts (bits 44–47, FORMAT.md §16.4).
pub const LEAF_KEY_SHIFT: u32 = 44;
/// Bit 43 of a leaf entry: it names a packed stream grain (FORMAT.md
/// §18.1), which holds its virtual grain's bytes compressed.
pub const LEAF_PACKED: u64 = 1 << 43;
/// Bit 42 of a packed leaf entry: its fragment continues into the stream
/// grain after the one named, which the entry references too (§18.8).
pub const LEAF_SPILLS: u64 = 1 << 42;
/// Bits of a leaf entry that hold the pool grain number (43: the pool
/// stays below 2^43 grains, 32 PiB, so bit 43 is free for the flag).
pub const LEAF_GRAIN_MASK: u64 = LEAF_PACKED - 1;
/// Bits of a packed leaf entry that hold its stream grain (42: a pool
/// below 2^42 grains, 16 PiB, packs).
pub const PACKED_GRAIN_MASK: u64 = LEAF_SPILLS - 1;

/// The pool grain a leaf entry names (its key index, packed flag and
/// spill bit left out).
#[inline]
pub fn leaf_grain(e: u64) -> u64 {
    if e & LEAF_PACKED != 0 {
        e & PACKED_GRAIN_MASK
    } else {
        e & LEAF_GRAIN_MASK
    }
}

/// Whether a leaf entry names a packed stream grain.
#[inline]
pub fn leaf_packed(e: u64) -> bool {
    e & LEAF_PACKED != 0
}

/// Whether a leaf entry names a packed fragment that continues into the
/// grain after the one it names (and so references that one too).
#[inline]
pub fn leaf_spills(e: u64) -> bool {
    e & (LEAF_PACKED | LEAF_SPILLS) == LEAF_PACKED | LEAF_SPILLS
}

/// What a leaf entry names, its key index left out: a raw grain number,
/// or a stream grain with the packed flag and spill bit (two entries
/// with one target name the same bytes, FORMAT.md §17.2b).
#[inline]
pub fn leaf_target(e: u64) -> u64 {
    e & ((1 << LEAF_KEY_SHIFT) - 1)
}

/// The key index of a leaf entry (0: the keyring's data cipher).
#[inline]
pub fn leaf_key(e: u64) -> u8 {
    ((e & ENTRY_GRAIN_MASK) >> LEAF_KEY_SHIFT) as u8
}

/// The leaf entry naming pool grain `g` under key index `key`.
#[inline]
pub fn leaf_entry(g: u64, key: u8) -> u64 {
    debug_assert!(g <= LEAF_GRAIN_MASK && key < 16);
    g | u64::from(key) << LEAF_KEY_SHIFT
}

/// Superblock slot size and count.
pub const SUPER_SLOT_BYTES: usize = 4096;
pub const SUPER_MAGIC: &[u8; 8] = b"STRATASB";
pub const FORMAT_VERSION: u32 = 2;
/// The previous format, read only to upgrade it (docs/FORMAT.md §8).
pub const FORMAT_VERSION_V1: u32 = 1;
/// Meaningful bytes of a superblock slot in format version 1.
pub const SUPER_HEADER_BYTES: u32 = 128;
/// Incompatible feature bit 0: the logs may hold MAP_RUN and REF_RUN
/// records (docs/FORMAT.md §2, §5). Every superblock this build writes
/// sets it.
pub const INCOMPAT_RUN_RECORDS: u32 = 1;
/// Incompatible feature bit 1: the catalog may hold keyrings and encrypted
/// disks (FORMAT.md §16.3). Set before the first keyring is logged.
pub const INCOMPAT_ENCRYPTION: u32 = 1 << 1;
/// Incompatible feature bit 2: a keyring may carry a deep rekey's cursor
/// (FORMAT.md §16.4). Set before the first such record is logged.
pub const INCOMPAT_DEEP_REKEY: u32 = 1 << 2;
/// Incompatible feature bit 3: leaf entries may carry a key index
/// (bits 44–47) naming an own-key clone's key (FORMAT.md §16.4). Set
/// before the first keyring with own keys is logged.
pub const INCOMPAT_KEY_INDEX: u32 = 1 << 3;
/// Feature bits this build understands.
/// Leaf entries may name packed stream grains (bit 43, FORMAT.md §18).
pub const INCOMPAT_PACKED: u32 = 1 << 4;
pub const INCOMPAT_KNOWN: u32 = INCOMPAT_RUN_RECORDS
    | INCOMPAT_ENCRYPTION
    | INCOMPAT_DEEP_REKEY
    | INCOMPAT_KEY_INDEX
    | INCOMPAT_PACKED;
/// The longest REF_RUN record, in grains.
pub const REF_RUN_MAX: u32 = 1 << 20;
pub const RO_COMPAT_KNOWN: u32 = 0;

/// Log batch header.
pub const BATCH_MAGIC: u32 = 0x4c4e_4a53; // "SJNL"
pub const BATCH_HEADER_BYTES: usize = 32;
/// Batches start at multiples of this.
pub const BATCH_ALIGN: u64 = 4096;
/// Largest payload a reader accepts (a bound against corrupt lengths).
pub const BATCH_PAYLOAD_MAX: u32 = 256 << 20;

/// Split `DISK@SNAP` into its parts.
pub fn split_target(s: &str) -> (&str, Option<&str>) {
    match s.split_once('@') {
        Some((d, sn)) => (d, Some(sn)),
        None => (s, None),
    }
}

/// Names of disks and snapshots, in a local datastore and an object-store
/// one alike: 1–128 of `[A-Za-z0-9._-]`, not starting with '.' or '-'.
/// A bad name is `InvalidArgument`, with the rule in the message.
pub fn check_name(what: &str, name: &str) -> Result<(), strata_block::Error> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(strata_block::Error::new(
            strata_block::Kind::InvalidArgument,
            format!(
                "invalid {what} name '{name}': use 1-128 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
            ),
        ))
    }
}

/// Words `strata group snapshot` reads as commands of its own (`group
/// snapshot list GROUP` or `ls`, `group snapshot delete GROUP SNAP` or
/// `rm`, clap's `help`): a group named so could never be snapshotted from
/// the command line, and `group snapshot app list` would take a snapshot
/// called "list" where its user meant to list them.
pub const GROUP_WORDS: [&str; 5] = ["list", "ls", "delete", "rm", "help"];

/// Names of groups (`what` "group") and group snapshots (`what` "group
/// snapshot"): [`check_name`], and none of [`GROUP_WORDS`].
pub fn check_group_name(what: &str, name: &str) -> Result<(), strata_block::Error> {
    check_name(what, name)?;
    if !GROUP_WORDS.contains(&name) {
        return Ok(());
    }
    let hint = match (what, name) {
        ("group snapshot", "list" | "ls") => {
            " (to list a group's snapshots: 'strata group snapshot list GROUP')".to_string()
        }
        _ => String::new(),
    };
    Err(strata_block::Error::new(
        strata_block::Kind::InvalidArgument,
        format!(
            "'{name}' cannot name a {what}: 'strata group snapshot {name}' is a command of its \
             own{hint}"
        ),
    ))
}

/// Object names inside a datastore.
pub const FILE_SUPER: &str = "strata.super";
pub const FILE_POOL: &str = "pool.data";
pub const FILE_REFCOUNT: &str = "refcount.data";
/// Version 1's single log file (read only to upgrade).
pub const FILE_JOURNAL_V1: &str = "journal.log";
/// Count pages being written by an upgrade from version 1 (§8).
pub const FILE_REFCOUNT_UPGRADE: &str = "refcount.v2";
pub const FILE_LOCK: &str = "lock";
pub const FILE_CONTROL: &str = "control.sock";
pub fn catalog_file(generation: u64) -> &'static str {
    if generation.is_multiple_of(2) {
        "catalog.0"
    } else {
        "catalog.1"
    }
}

/// The log file of `generation` (§5).
pub fn journal_file(generation: u64) -> &'static str {
    if generation.is_multiple_of(2) {
        "journal.0"
    } else {
        "journal.1"
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
    #[error("unsupported format version {0} (this build reads versions {FORMAT_VERSION_V1} and {FORMAT_VERSION})")]
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
    /// Format version the slot was written by: [`FORMAT_VERSION`], or
    /// [`FORMAT_VERSION_V1`] for a datastore that must be upgraded.
    /// `encode` always writes [`FORMAT_VERSION`].
    pub version: u32,
    pub generation: u64,
    pub capacity_bytes: u64,
    pub pool_grains: u64,
    pub catalog_bytes: u64,
    pub catalog_checksum: u32,
    pub uuid: [u8; 16],
    pub created_unix_secs: u64,
    pub ro_compat: u32,
    pub compat: u32,
    /// Incompatible feature bits beyond [`INCOMPAT_RUN_RECORDS`], which
    /// every slot this build writes carries anyway.
    pub incompat: u32,
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
        b[INCOMPAT..INCOMPAT + 4]
            .copy_from_slice(&(INCOMPAT_RUN_RECORDS | self.incompat).to_le_bytes());
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
        if version != FORMAT_VERSION && version != FORMAT_VERSION_V1 {
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
            version,
            generation: u64_at(b, GENERATION),
            capacity_bytes: u64_at(b, CAPACITY),
            pool_grains: u64_at(b, POOL_GRAINS),
            catalog_bytes: u64_at(b, CATALOG_BYTES),
            catalog_checksum: u32_at(b, CATALOG_CHECKSUM),
            uuid,
            created_unix_secs: u64_at(b, CREATED),
            ro_compat: u32_at(b, RO_COMPAT),
            compat: u32_at(b, COMPAT),
            incompat: incompat & !INCOMPAT_RUN_RECORDS,
        })
    }

    /// Pick the current superblock from the two slots. Returns the decoded
    /// superblock, or the errors of both slots.
    pub fn pick(slot0: &[u8], slot1: &[u8]) -> Result<Superblock, FormatError> {
        Self::pick_slots(slot0, slot1).map(|p| p.current)
    }

    /// Pick the current superblock, and say which other slot (if any) is
    /// damaged: it fails its check and is not blank (never written).
    pub fn pick_slots(slot0: &[u8], slot1: &[u8]) -> Result<SuperPick, FormatError> {
        let blank = |b: &[u8]| b.iter().all(|&x| x == 0);
        let (d0, d1) = (Self::decode(slot0), Self::decode(slot1));
        let valid = [d0.is_ok(), d1.is_ok()];
        match (d0, d1) {
            (Ok(a), Ok(b)) => Ok(SuperPick {
                current: if b.generation > a.generation { b } else { a },
                damaged: None,
                valid,
            }),
            (Ok(a), Err(e)) => Ok(SuperPick {
                current: a,
                damaged: (!blank(slot1)).then_some((1, e)),
                valid,
            }),
            (Err(e), Ok(b)) => Ok(SuperPick {
                current: b,
                damaged: (!blank(slot0)).then_some((0, e)),
                valid,
            }),
            // Report the more telling error: a version/feature refusal beats garbage.
            (Err(e0), Err(e1)) => Err(match (&e0, &e1) {
                (FormatError::Version(_) | FormatError::IncompatFeatures(_), _) => e0,
                (_, FormatError::Version(_) | FormatError::IncompatFeatures(_)) => e1,
                _ => e0,
            }),
        }
    }
}

/// The outcome of [`Superblock::pick_slots`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuperPick {
    pub current: Superblock,
    /// The other slot's index and error, when it is damaged (not blank).
    pub damaged: Option<(usize, FormatError)>,
    /// Which slots hold a valid superblock (a blank slot does not).
    pub valid: [bool; 2],
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
    /// An empty map node of `level` (version 2).
    PageNew {
        grain: u64,
        level: u8,
    },
    /// Version 1's empty node (no level); produced only by
    /// [`Record::decode_all_v1`], never encoded.
    PageZeroV1 {
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
    /// Entries `index .. index + n` of node `grain` := value, value + 1, …
    MapRun {
        grain: u64,
        index: u16,
        n: u16,
        value: u64,
    },
    /// Counts of grains `grain .. grain + n` := count.
    RefRun {
        grain: u64,
        n: u32,
        count: u32,
    },
    Version(VersionState),
    Catalog(Vec<u8>),
    /// A whole encoded count page (checkpoint page images).
    RefPageImage {
        page: u64,
        data: Box<[u8; GRAIN_BYTES as usize]>,
    },
    /// The last record of a generation's log.
    GenerationEnd {
        next: u64,
    },
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
    pub const PAGE_NEW: u8 = 2;
    /// Version 1's meaning of tag 2.
    pub const PAGE_ZERO_V1: u8 = 2;
    pub const MAP_SET: u8 = 3;
    pub const REF_SET: u8 = 4;
    pub const VERSION: u8 = 5;
    pub const CATALOG: u8 = 6;
    pub const REF_PAGE_IMAGE: u8 = 7;
    pub const GENERATION_END: u8 = 8;
    pub const MAP_RUN: u8 = 9;
    pub const REF_RUN: u8 = 10;
}

impl Record {
    /// Append the encoding of this record to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        /// A record's first bytes: its tag, then the 8-byte field every
        /// record but the catalog starts with (the grain, page, version
        /// or next generation it concerns).
        fn head(out: &mut Vec<u8>, tag: u8, first: u64) {
            out.push(tag);
            out.extend_from_slice(&first.to_le_bytes());
        }
        match self {
            Record::PageImage { grain, data } => {
                head(out, tag::PAGE_IMAGE, *grain);
                out.extend_from_slice(&data[..]);
            }
            Record::PageNew { grain, level } => {
                head(out, tag::PAGE_NEW, *grain);
                out.push(*level);
            }
            Record::PageZeroV1 { .. } => {
                unreachable!("version-1 records are read, never written")
            }
            Record::MapSet {
                grain,
                index,
                value,
            } => {
                head(out, tag::MAP_SET, *grain);
                out.extend_from_slice(&index.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
            Record::RefSet { grain, count } => {
                head(out, tag::REF_SET, *grain);
                out.extend_from_slice(&count.to_le_bytes());
            }
            Record::MapRun {
                grain,
                index,
                n,
                value,
            } => {
                head(out, tag::MAP_RUN, *grain);
                out.extend_from_slice(&index.to_le_bytes());
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&value.to_le_bytes());
            }
            Record::RefRun { grain, n, count } => {
                head(out, tag::REF_RUN, *grain);
                out.extend_from_slice(&n.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
            }
            Record::Version(v) => {
                head(out, tag::VERSION, v.version);
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
            Record::RefPageImage { page, data } => {
                head(out, tag::REF_PAGE_IMAGE, *page);
                out.extend_from_slice(&data[..]);
            }
            Record::GenerationEnd { next } => {
                head(out, tag::GENERATION_END, *next);
            }
        }
    }

    /// Decode all records of a version-1 batch payload (upgrade only).
    pub fn decode_all_v1(p: &[u8]) -> Result<Vec<Record>, FormatError> {
        Self::decode_versioned(p, FORMAT_VERSION_V1)
    }

    /// Decode all records of a batch payload.
    pub fn decode_all(p: &[u8]) -> Result<Vec<Record>, FormatError> {
        Self::decode_versioned(p, FORMAT_VERSION)
    }

    fn decode_versioned(mut p: &[u8], version: u32) -> Result<Vec<Record>, FormatError> {
        use record_fields::*;
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
                tag::PAGE_ZERO_V1 if version == FORMAT_VERSION_V1 => Record::PageZeroV1 {
                    grain: u64_(&mut p)?,
                },
                tag::PAGE_NEW => {
                    let grain = u64_(&mut p)?;
                    let level = take(&mut p, 1)?[0];
                    if level >= MAP_LEVELS_MAX {
                        return Err(invalid(WHAT, format!("node level {level} out of range")));
                    }
                    Record::PageNew { grain, level }
                }
                tag::MAP_SET => {
                    let grain = u64_(&mut p)?;
                    let index = u16_(&mut p)?;
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
                tag::MAP_RUN if version >= FORMAT_VERSION => map_run(&mut p)?,
                tag::REF_RUN if version >= FORMAT_VERSION => ref_run(&mut p)?,
                tag::VERSION => version_state(&mut p)?,
                tag::CATALOG => {
                    let len = u32_(&mut p)? as usize;
                    Record::Catalog(take(&mut p, len)?.to_vec())
                }
                tag::REF_PAGE_IMAGE if version >= FORMAT_VERSION => {
                    let page = u64_(&mut p)?;
                    let mut data = Box::new([0u8; GRAIN_BYTES as usize]);
                    data.copy_from_slice(take(&mut p, GRAIN_BYTES as usize)?);
                    Record::RefPageImage { page, data }
                }
                tag::GENERATION_END if version >= FORMAT_VERSION => Record::GenerationEnd {
                    next: u64_(&mut p)?,
                },
                other => return Err(invalid(WHAT, format!("unknown record tag {other}"))),
            };
            out.push(rec);
        }
        Ok(out)
    }
}

/// Reading a log record's fields (`Record::decode_all`).
mod record_fields {
    use super::*;

    pub(super) const WHAT: &str = "log record";

    pub(super) fn take<'a>(p: &mut &'a [u8], n: usize) -> Result<&'a [u8], FormatError> {
        if p.len() < n {
            return Err(FormatError::Truncated { what: WHAT });
        }
        let (a, b) = p.split_at(n);
        *p = b;
        Ok(a)
    }

    pub(super) fn u64_(p: &mut &[u8]) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(take(p, 8)?.try_into().expect("8")))
    }

    pub(super) fn u32_(p: &mut &[u8]) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(take(p, 4)?.try_into().expect("4")))
    }

    pub(super) fn u16_(p: &mut &[u8]) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(take(p, 2)?.try_into().expect("2")))
    }

    /// VERSION's fields, its map depth within range.
    pub(super) fn version_state(p: &mut &[u8]) -> Result<Record, FormatError> {
        let version = u64_(p)?;
        let root = u64_(p)?;
        let levels = take(p, 1)?[0];
        if levels == 0 || levels > MAP_LEVELS_MAX {
            return Err(invalid(WHAT, format!("map depth {levels} out of range")));
        }
        Ok(Record::Version(VersionState {
            version,
            root,
            levels,
            mapped_grains: u64_(p)?,
            nb: u64_(p)?,
        }))
    }

    /// MAP_RUN's fields, its entries within one node and its grains
    /// within the u64 range.
    pub(super) fn map_run(p: &mut &[u8]) -> Result<Record, FormatError> {
        let grain = u64_(p)?;
        let index = u16_(p)?;
        let n = u16_(p)?;
        let value = u64_(p)?;
        if n == 0 || index as usize + n as usize > MAP_FANOUT {
            return Err(invalid(
                WHAT,
                format!("map run of {n} entries from index {index} out of range"),
            ));
        }
        if value == 0 || value.checked_add(n as u64).is_none() {
            return Err(invalid(
                WHAT,
                format!("map run of {n} grains from grain {value} out of range"),
            ));
        }
        Ok(Record::MapRun {
            grain,
            index,
            n,
            value,
        })
    }

    /// REF_RUN's fields, its length within `REF_RUN_MAX` and its grains
    /// within the u64 range.
    pub(super) fn ref_run(p: &mut &[u8]) -> Result<Record, FormatError> {
        let grain = u64_(p)?;
        let n = u32_(p)?;
        let count = u32_(p)?;
        if n == 0 || n > REF_RUN_MAX || grain.checked_add(n as u64).is_none() {
            return Err(invalid(
                WHAT,
                format!("count run of {n} grains from grain {grain} out of range"),
            ));
        }
        Ok(Record::RefRun { grain, n, count })
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
    let mut b = Vec::with_capacity(total.div_ceil(BATCH_ALIGN as usize) * BATCH_ALIGN as usize);
    b.resize(BATCH_HEADER_BYTES, 0);
    b.extend_from_slice(payload);
    seal_batch(&mut b, generation, sequence);
    b
}

/// Make a batch of `buf` in place: `buf` holds [`BATCH_HEADER_BYTES`] of
/// room (any contents), then the payload. Fills in the header and its
/// checksum and pads to [`BATCH_ALIGN`]: the same bytes as
/// [`encode_batch`] of the payload, without copying it (a checkpoint's
/// page images are megabytes).
pub fn seal_batch(buf: &mut Vec<u8>, generation: u64, sequence: u64) {
    assert!(
        buf.len() >= BATCH_HEADER_BYTES,
        "no room for a batch header"
    );
    let payload_len = buf.len() - BATCH_HEADER_BYTES;
    buf[0..4].copy_from_slice(&BATCH_MAGIC.to_le_bytes());
    buf[4..8].copy_from_slice(&0u32.to_le_bytes());
    buf[8..16].copy_from_slice(&generation.to_le_bytes());
    buf[16..24].copy_from_slice(&sequence.to_le_bytes());
    buf[24..28].copy_from_slice(&(payload_len as u32).to_le_bytes());
    buf[28..32].copy_from_slice(&0u32.to_le_bytes());
    let crc = crc32c::crc32c(buf);
    buf[4..8].copy_from_slice(&crc.to_le_bytes());
    let padded = buf.len().div_ceil(BATCH_ALIGN as usize) * BATCH_ALIGN as usize;
    buf.resize(padded, 0);
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

/// Lanes of a map node: the top 16 bits of word `i` are lane `i` (§3).
pub mod lane {
    pub const CRC_LO: usize = 0;
    pub const CRC_HI: usize = 1;
    pub const MAGIC: usize = 2;
    pub const LEVEL: usize = 3;
    pub const GRAIN_LO: usize = 4;
    pub const GRAIN_MID: usize = 5;
    pub const GRAIN_HI: usize = 6;
    /// Lanes from here on are reserved (0).
    pub const RESERVED_FROM: usize = 7;
}
/// Lane 2 of every map node.
pub const NODE_MAGIC: u16 = 0x4e4d;
/// Bit position of a word's lane.
const LANE_SHIFT: u32 = 48;

fn node_crc(b: &[u8]) -> u32 {
    // Lanes 0 and 1 (the CRC itself) are bytes 6..8 of words 0 and 1.
    let mut h = crc32c::crc32c(&b[..6]);
    h = crc32c::crc32c_append(h, &[0, 0]);
    h = crc32c::crc32c_append(h, &b[8..14]);
    h = crc32c::crc32c_append(h, &[0, 0]);
    crc32c::crc32c_append(h, &b[16..])
}

/// Encode map node `entries` stored at pool grain `grain`, of `level`, with
/// its lanes and checksum (§3). The caller has checked the entries against
/// the pool; this asserts what the layout itself needs, one condition each.
pub fn encode_map_node(e: &[u64; MAP_FANOUT], grain: u64, level: u8, out: &mut [u8]) {
    assert_eq!(out.len(), GRAIN_BYTES as usize, "a map node is one grain");
    assert!(level < MAP_LEVELS_MAX, "node level {level} out of range");
    assert!(grain != 0, "grain 0 never holds a map node");
    assert!(grain <= ENTRY_GRAIN_MASK, "grain {grain} past 48 bits");
    let mut lanes = [0u16; lane::RESERVED_FROM];
    lanes[lane::MAGIC] = NODE_MAGIC;
    lanes[lane::LEVEL] = level as u16;
    lanes[lane::GRAIN_LO] = grain as u16;
    lanes[lane::GRAIN_MID] = (grain >> 16) as u16;
    lanes[lane::GRAIN_HI] = (grain >> 32) as u16;
    for (i, v) in e.iter().enumerate() {
        assert!(
            v & !ENTRY_GRAIN_MASK == 0,
            "node {grain} entry {i}: value {v:#x} past 48 bits"
        );
        let l = lanes.get(i).copied().unwrap_or(0) as u64;
        out[i * 8..i * 8 + 8].copy_from_slice(&(v | l << LANE_SHIFT).to_le_bytes());
    }
    let crc = node_crc(out);
    out[6..8].copy_from_slice(&(crc as u16).to_le_bytes());
    out[14..16].copy_from_slice(&((crc >> 16) as u16).to_le_bytes());
}

/// A decoded map node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapNode {
    pub level: u8,
    pub entries: Box<[u64; MAP_FANOUT]>,
}

/// Decode the map node stored at `grain` (§3): checksum, magic, the grain it
/// names, reserved lanes, in that order. The caller checks the level it
/// expects and the entries against the pool.
pub fn decode_map_node(b: &[u8], grain: u64) -> Result<MapNode, FormatError> {
    const WHAT: &str = "map node";
    if b.len() != GRAIN_BYTES as usize {
        return Err(FormatError::Truncated { what: WHAT });
    }
    let lane_of = |i: usize| (u64_at(b, i * 8) >> LANE_SHIFT) as u16;
    let stored = lane_of(lane::CRC_LO) as u32 | (lane_of(lane::CRC_HI) as u32) << 16;
    let computed = node_crc(b);
    if stored != computed {
        return Err(FormatError::BadChecksum {
            what: WHAT,
            stored,
            computed,
        });
    }
    if lane_of(lane::MAGIC) != NODE_MAGIC {
        return Err(FormatError::BadMagic { what: WHAT });
    }
    let named = lane_of(lane::GRAIN_LO) as u64
        | (lane_of(lane::GRAIN_MID) as u64) << 16
        | (lane_of(lane::GRAIN_HI) as u64) << 32;
    if named != grain {
        return Err(invalid(
            WHAT,
            format!("names grain {named}: a write meant for another place landed here"),
        ));
    }
    let level = lane_of(lane::LEVEL);
    if level >= MAP_LEVELS_MAX as u16 {
        return Err(invalid(WHAT, format!("level {level} out of range")));
    }
    if let Some(i) = (lane::RESERVED_FROM..MAP_FANOUT).find(|&i| lane_of(i) != 0) {
        return Err(invalid(WHAT, format!("reserved lane {i} is set")));
    }
    let mut e = Box::new([0u64; MAP_FANOUT]);
    for (i, slot) in e.iter_mut().enumerate() {
        *slot = u64_at(b, i * 8) & ENTRY_GRAIN_MASK;
    }
    Ok(MapNode {
        level: level as u8,
        entries: e,
    })
}

/// Decode a version-1 map node (upgrade only): the entries are the low 48
/// bits of each word. The top bits are ignored: they are 0 in version 1 and
/// lanes in a node an interrupted upgrade already rewrote (§8).
pub fn decode_map_node_v1(b: &[u8]) -> Result<Box<[u64; MAP_FANOUT]>, FormatError> {
    if b.len() != GRAIN_BYTES as usize {
        return Err(FormatError::Truncated { what: "map node" });
    }
    let mut e = Box::new([0u64; MAP_FANOUT]);
    for (i, slot) in e.iter_mut().enumerate() {
        *slot = u64_at(b, i * 8) & ENTRY_GRAIN_MASK;
    }
    Ok(e)
}

// ---------------------------------------------------------------- count pages

/// Encode count page `page` (§4).
pub fn encode_ref_page(page: u64, counts: &[u32; REFS_PER_PAGE], out: &mut [u8]) {
    assert_eq!(
        out.len(),
        GRAIN_BYTES as usize,
        "a count page is 4096 bytes"
    );
    for (i, c) in counts.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&c.to_le_bytes());
    }
    out[ref_page_off::INDEX..ref_page_off::INDEX + 8].copy_from_slice(&page.to_le_bytes());
    out[ref_page_off::MAGIC..ref_page_off::MAGIC + 4]
        .copy_from_slice(&REF_PAGE_MAGIC.to_le_bytes());
    let crc = crc32c::crc32c(&out[..ref_page_off::CRC]);
    out[ref_page_off::CRC..].copy_from_slice(&crc.to_le_bytes());
}

/// Decode count page `page` (§4). `blank_ok`: the page lies wholly at or
/// above the superblock's `pool_grains`, so all zeros means "never written".
pub fn decode_ref_page(
    b: &[u8],
    page: u64,
    blank_ok: bool,
) -> Result<Box<[u32; REFS_PER_PAGE]>, FormatError> {
    const WHAT: &str = "count page";
    if b.len() != GRAIN_BYTES as usize {
        return Err(FormatError::Truncated { what: WHAT });
    }
    let mut counts = Box::new([0u32; REFS_PER_PAGE]);
    if blank_ok && b.iter().all(|&x| x == 0) {
        return Ok(counts);
    }
    let stored = u32_at(b, ref_page_off::CRC);
    let computed = crc32c::crc32c(&b[..ref_page_off::CRC]);
    if stored != computed {
        return Err(FormatError::BadChecksum {
            what: WHAT,
            stored,
            computed,
        });
    }
    if u32_at(b, ref_page_off::MAGIC) != REF_PAGE_MAGIC {
        return Err(FormatError::BadMagic { what: WHAT });
    }
    let named = u64_at(b, ref_page_off::INDEX);
    if named != page {
        return Err(invalid(
            WHAT,
            format!("names page {named}: a write meant for another place landed here"),
        ));
    }
    for (i, c) in counts.iter_mut().enumerate() {
        *c = u32_at(b, i * 4);
    }
    Ok(counts)
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
mod tests;

/// Bytes that fail the format's checks are corrupt: nothing is guessed.
impl From<FormatError> for strata_block::Error {
    fn from(e: FormatError) -> Self {
        strata_block::Error::new(strata_block::Kind::Corrupt, e.to_string())
    }
}
