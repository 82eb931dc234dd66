//! Grain-table extents: hosted sparse (`KDMV`, incl. streamOptimized),
//! VMFSsparse (`COWD`) and SEsparse. All three map an extent sector to a
//! grain through a grain directory (GD) of grain tables (GT); they differ in
//! entry width, in how an entry names a grain and in which special entries
//! exist. One type handles all three so the read/write/zero paths are shared.
//!
//! Grain-table entries are decoded into [`Gte`]. Writes append new grains at
//! the end of the file (QEMU does the same). Table, directory and header
//! updates are held in memory and written at the next flush, after the data
//! they point to has been synced: a crash before a flush leaves the old
//! entries, never one naming a grain whose data was lost (which reads as
//! zeros, or as another grain's data once the space is allocated again).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read as _;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use strata_storage::Storage;

use crate::error::{Result, VmdkError, VmdkErrorKind};

pub const SECTOR: u64 = 512;

pub const KDMV_MAGIC: u32 = 0x564d_444b; // "KDMV"
pub const COWD_MAGIC: u32 = 0x4457_4f43; // "COWD"
pub const SESPARSE_MAGIC: u64 = 0xcafe_babe;
pub const SESPARSE_VOLATILE_MAGIC: u64 = 0xcafe_cafe;
pub const SESPARSE_VERSION: u64 = 0x0000_0002_0000_0001;

pub const FLAG_NL_DETECT: u32 = 1 << 0;
pub const FLAG_RGD: u32 = 1 << 1;
pub const FLAG_ZERO_GRAIN: u32 = 1 << 2;
pub const FLAG_COMPRESS: u32 = 1 << 16;
pub const FLAG_MARKER: u32 = 1 << 17;
pub const GD_AT_END: u64 = u64::MAX;

pub const MARKER_EOS: u32 = 0;
pub const MARKER_GT: u32 = 1;
pub const MARKER_GD: u32 = 2;
pub const MARKER_FOOTER: u32 = 3;

/// Grain directories with more entries are refused (QEMU's limit too).
pub const MAX_GD_ENTRIES: u64 = 32 * 1024 * 1024;
/// Grains larger than this are refused (QEMU: 0x200000 sectors).
pub const MAX_GRAIN_SECTORS: u64 = 0x20_0000;
/// Grains larger than this are read in pieces but never buffered whole
/// (writes and compressed reads need the whole grain).
pub const MAX_BUFFERED_GRAIN: u64 = 16 << 20;
/// Grain data never lies past this byte offset (an SEsparse entry can name
/// grain index 2^60, byte 2^72); keeps offset arithmetic clear of overflow.
const MAX_DATA_OFFSET: u64 = 1 << 60;
/// Grain tables kept in memory at most; beyond, arbitrary clean ones are
/// dropped (tables with unwritten updates stay until the next flush).
const GT_CACHE_LIMIT: usize = 4096;
/// Past this many unwritten metadata updates, or tables holding them, a
/// write flushes by itself, bounding the memory they take.
const MAX_PENDING_META: usize = 1 << 16;
const MAX_DIRTY_TABLES: usize = 512;

/// Which grain-table format an extent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SparseFormat {
    Kdmv,
    Cowd,
    SeSparse,
}

impl SparseFormat {
    pub fn name(self) -> &'static str {
        match self {
            SparseFormat::Kdmv => "hosted sparse (KDMV)",
            SparseFormat::Cowd => "VMFSsparse (COWD)",
            SparseFormat::SeSparse => "SEsparse",
        }
    }
}

/// A decoded grain-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gte {
    /// Not allocated here: read the parent, or zeros.
    Unalloc,
    /// Reads as zeros, does not fall through.
    Zero,
    /// SCSI-unmapped (SEsparse 0x1): reads as zeros, does not fall through.
    Unmapped,
    /// Grain data at this byte offset of the file.
    Data(u64),
    /// A streamOptimized grain marker at this byte offset.
    Compressed(u64),
}

impl Gte {
    pub fn reads_zero(self) -> bool {
        matches!(self, Gte::Zero | Gte::Unmapped)
    }
}

/// The SEsparse constant header (sector 0), all offsets and sizes in sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeHeader {
    pub capacity: u64,
    pub volatile: (u64, u64),
    pub journal_header: (u64, u64),
    pub journal: (u64, u64),
    pub grain_dir: (u64, u64),
    pub grain_tables: (u64, u64),
    pub free_bitmap: (u64, u64),
    pub backmap: (u64, u64),
    pub grains: (u64, u64),
}

impl SeHeader {
    /// The layout ESXi uses for a disk of `capacity` sectors (see FORMAT.md).
    pub fn layout(capacity: u64) -> Self {
        let r = |x: u64| x.div_ceil(2048).max(1) * 2048;
        let n_gt = capacity.div_ceil(32768).max(1);
        let gd = (4096, r((n_gt * 8).div_ceil(512)));
        let gt = (gd.0 + gd.1, r(n_gt * 64));
        let grains = capacity.div_ceil(8);
        let fb = (gt.0 + gt.1, r(grains.div_ceil(8).div_ceil(512)));
        let bm = (fb.0 + fb.1, gt.1);
        SeHeader {
            capacity,
            volatile: (1, 1),
            journal_header: (2, 2),
            journal: (2048, 2048),
            grain_dir: gd,
            grain_tables: gt,
            free_bitmap: fb,
            backmap: bm,
            grains: (bm.0 + bm.1, capacity),
        }
    }

    pub fn encode(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        let mut put = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
        put(0, SESPARSE_MAGIC);
        put(8, SESPARSE_VERSION);
        put(16, self.capacity);
        put(24, 8);
        put(32, 64);
        for (i, (o, s)) in [
            self.volatile,
            self.journal_header,
            self.journal,
            self.grain_dir,
            self.grain_tables,
            self.free_bitmap,
            self.backmap,
            self.grains,
        ]
        .into_iter()
        .enumerate()
        {
            put(80 + i * 16, o);
            put(88 + i * 16, s);
        }
        b
    }

    /// Decode and apply every check QEMU 7.2 applies, with its messages.
    pub fn decode(b: &[u8; 512]) -> std::result::Result<Self, String> {
        let g = |off: usize| u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"));
        if g(0) != SESPARSE_MAGIC {
            return Err(format!("bad SEsparse const header magic 0x{:016x}", g(0)));
        }
        if g(8) != SESPARSE_VERSION {
            return Err(format!("unsupported SEsparse version 0x{:016x}", g(8)));
        }
        if g(24) != 8 {
            return Err(format!(
                "unsupported SEsparse grain size {} (8 sectors expected)",
                g(24)
            ));
        }
        if g(32) != 64 {
            return Err(format!(
                "unsupported SEsparse grain table size {} (64 sectors expected)",
                g(32)
            ));
        }
        if g(40) != 0 {
            return Err(format!("unsupported SEsparse flags 0x{:016x}", g(40)));
        }
        if (48..80).step_by(8).any(|o| g(o) != 0) {
            return Err(format!(
                "unsupported SEsparse reserved fields 0x{:x} 0x{:x} 0x{:x} 0x{:x}",
                g(48),
                g(56),
                g(64),
                g(72)
            ));
        }
        if b[208..].iter().any(|&x| x != 0) {
            return Err("non-zero SEsparse const header padding".into());
        }
        let pair = |i: usize| (g(80 + i * 16), g(88 + i * 16));
        let h = SeHeader {
            capacity: g(16),
            volatile: pair(0),
            journal_header: pair(1),
            journal: pair(2),
            grain_dir: pair(3),
            grain_tables: pair(4),
            free_bitmap: pair(5),
            backmap: pair(6),
            grains: pair(7),
        };
        for (name, (o, s)) in [
            ("volatile header", h.volatile),
            ("grain directory", h.grain_dir),
            ("grain tables", h.grain_tables),
            ("grains", h.grains),
        ] {
            if o == 0 || s == 0 || o.checked_add(s).map_or(true, |e| e > (1u64 << 54)) {
                return Err(format!(
                    "SEsparse {name} at sector {o} size {s} is impossible"
                ));
            }
        }
        if h.capacity == 0 || h.capacity > (1u64 << 48) {
            return Err(format!(
                "SEsparse capacity {} sectors is impossible",
                h.capacity
            ));
        }
        Ok(h)
    }
}

/// The volatile header of SEsparse (sector `volatile.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeVolatile {
    pub free_gt_number: u64,
    pub next_txn_seq_number: u64,
    pub replay_journal: u64,
}

impl SeVolatile {
    pub fn encode(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        b[0..8].copy_from_slice(&SESPARSE_VOLATILE_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.free_gt_number.to_le_bytes());
        b[16..24].copy_from_slice(&self.next_txn_seq_number.to_le_bytes());
        b[24..32].copy_from_slice(&self.replay_journal.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 512]) -> std::result::Result<Self, String> {
        let g = |off: usize| u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"));
        if g(0) != SESPARSE_VOLATILE_MAGIC {
            return Err(format!(
                "bad SEsparse volatile header magic 0x{:016x}",
                g(0)
            ));
        }
        if b[32..].iter().any(|&x| x != 0) {
            return Err("non-zero SEsparse volatile header padding".into());
        }
        Ok(SeVolatile {
            free_gt_number: g(8),
            next_txn_seq_number: g(16),
            replay_journal: g(24),
        })
    }
}

/// SEsparse allocated-entry encoding: the grain index is stored rotated.
pub fn se_encode_index(index: u64) -> u64 {
    (0x3u64 << 60) | ((index & 0xfff) << 48) | (index >> 12)
}

pub fn se_decode_index(e: u64) -> u64 {
    ((e & 0x0fff_0000_0000_0000) >> 48) | ((e & 0x0000_ffff_ffff_ffff) << 12)
}

/// The hosted sparse header (`KDMV`, sector 0), offsets and sizes in sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KdmvHeader {
    pub version: u32,
    pub flags: u32,
    pub capacity: u64,
    pub grain_size: u64,
    pub desc_offset: u64,
    pub desc_size: u64,
    pub gtes_per_gt: u32,
    pub rgd_offset: u64,
    pub gd_offset: u64,
    pub overhead: u64,
    pub unclean: bool,
    pub compress_algorithm: u16,
}

impl KdmvHeader {
    pub fn encode(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        b[0..4].copy_from_slice(&KDMV_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..20].copy_from_slice(&self.capacity.to_le_bytes());
        b[20..28].copy_from_slice(&self.grain_size.to_le_bytes());
        b[28..36].copy_from_slice(&self.desc_offset.to_le_bytes());
        b[36..44].copy_from_slice(&self.desc_size.to_le_bytes());
        b[44..48].copy_from_slice(&self.gtes_per_gt.to_le_bytes());
        b[48..56].copy_from_slice(&self.rgd_offset.to_le_bytes());
        b[56..64].copy_from_slice(&self.gd_offset.to_le_bytes());
        b[64..72].copy_from_slice(&self.overhead.to_le_bytes());
        b[72] = self.unclean as u8;
        b[73..77].copy_from_slice(&[0x0a, 0x20, 0x0d, 0x0a]);
        b[77..79].copy_from_slice(&self.compress_algorithm.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 512]) -> std::result::Result<Self, String> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
        if u32_at(0) != KDMV_MAGIC {
            return Err("not a hosted sparse extent (no KDMV magic)".into());
        }
        let h = KdmvHeader {
            version: u32_at(4),
            flags: u32_at(8),
            capacity: u64_at(12),
            grain_size: u64_at(20),
            desc_offset: u64_at(28),
            desc_size: u64_at(36),
            gtes_per_gt: u32_at(44),
            rgd_offset: u64_at(48),
            gd_offset: u64_at(56),
            overhead: u64_at(64),
            unclean: b[72] != 0,
            compress_algorithm: u16::from_le_bytes([b[77], b[78]]),
        };
        if !(1..=3).contains(&h.version) {
            return Err(format!("KDMV version {} (1, 2 or 3 expected)", h.version));
        }
        let incompatible = h.flags & 0xffff_0000 & !(FLAG_COMPRESS | FLAG_MARKER);
        if incompatible != 0 {
            return Err(format!(
                "KDMV has unknown incompatible flags 0x{incompatible:08x}"
            ));
        }
        if h.grain_size == 0 || h.grain_size > MAX_GRAIN_SECTORS {
            return Err(format!(
                "KDMV grain size {} sectors is invalid",
                h.grain_size
            ));
        }
        if h.gtes_per_gt == 0 || h.gtes_per_gt > 512 {
            return Err(format!(
                "KDMV has {} entries per grain table (1 to 512 allowed)",
                h.gtes_per_gt
            ));
        }
        if h.flags & FLAG_COMPRESS != 0 && h.compress_algorithm != 1 {
            return Err(format!(
                "KDMV compression algorithm {} (only 1, DEFLATE, is known)",
                h.compress_algorithm
            ));
        }
        if h.capacity > (1u64 << 48) {
            return Err(format!(
                "KDMV capacity {} sectors is impossible",
                h.capacity
            ));
        }
        Ok(h)
    }
}

/// The COWD header (first 2048 bytes of a VMFSsparse extent), in sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CowdHeader {
    pub version: u32,
    pub flags: u32,
    pub num_sectors: u32,
    pub grain_size: u32,
    pub gd_offset: u32,
    pub num_gd_entries: u32,
    pub free_sector: u32,
}

impl CowdHeader {
    pub const BYTES: usize = 2048;
    pub const GT_ENTRIES: u64 = 4096;

    pub fn encode(&self) -> [u8; 2048] {
        let mut b = [0u8; 2048];
        for (o, v) in [
            (0, COWD_MAGIC),
            (4, self.version),
            (8, self.flags),
            (12, self.num_sectors),
            (16, self.grain_size),
            (20, self.gd_offset),
            (24, self.num_gd_entries),
            (28, self.free_sector),
        ] {
            b[o..o + 4].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        if b.len() < 32 {
            return Err("COWD header is truncated".into());
        }
        let g = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
        if g(0) != COWD_MAGIC {
            return Err("not a VMFSsparse extent (no COWD magic)".into());
        }
        let h = CowdHeader {
            version: g(4),
            flags: g(8),
            num_sectors: g(12),
            grain_size: g(16),
            gd_offset: g(20),
            num_gd_entries: g(24),
            free_sector: g(28),
        };
        if h.grain_size == 0 || h.grain_size as u64 > MAX_GRAIN_SECTORS {
            return Err(format!(
                "COWD grain size {} sectors is invalid",
                h.grain_size
            ));
        }
        let need = (h.num_sectors as u64).div_ceil(h.grain_size as u64 * Self::GT_ENTRIES);
        if (h.num_gd_entries as u64) < need {
            return Err(format!(
                "COWD grain directory has {} entries, {} sectors need {need}",
                h.num_gd_entries, h.num_sectors
            ));
        }
        if h.gd_offset == 0 {
            return Err("COWD grain directory at sector 0 overlaps the header".into());
        }
        Ok(h)
    }
}

/// What `check` found in one extent.
#[derive(Debug, Default, Clone)]
pub struct ExtentCheck {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub repaired: Vec<String>,
    pub allocated_grains: u64,
    pub zero_grains: u64,
    pub unmapped_grains: u64,
}

/// What `shrink` did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ShrinkReport {
    pub grains_before: u64,
    pub grains_after: u64,
    pub zero_grains_found: u64,
    pub moved: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// One open grain-table extent.
pub struct SparseExtent {
    pub format: SparseFormat,
    name: String,
    file: Arc<dyn Storage>,
    writable: bool,
    /// Extent size in sectors (from its own header).
    pub capacity: u64,
    pub grain_sectors: u64,
    gt_entries: u64,
    entry_bytes: u64,
    gd_offset: u64,
    rgd_offset: Option<u64>,
    gd: RwLock<Vec<u64>>,
    rgd: RwLock<Vec<u64>>,
    zero_grain: bool,
    compressed: bool,
    kdmv: Option<KdmvHeader>,
    cowd: Option<CowdHeader>,
    se: Option<SeHeader>,
    gt_cache: Mutex<HashMap<u64, Arc<Vec<u64>>>>,
    /// Tables with updates still in `AllocState::meta`: never evicted.
    dirty_gts: Mutex<HashSet<u64>>,
    /// Serialises allocation and table updates; holds the next free byte.
    alloc: Mutex<AllocState>,
}

struct AllocState {
    next: u64,
    se_volatile: SeVolatile,
    /// Table, directory and header bytes not yet written, by file offset.
    /// `flush_meta` writes them once the data they point to is durable.
    meta: BTreeMap<u64, Vec<u8>>,
    /// SEsparse: free grain slots below the declared grains region's end,
    /// found by a scan once appending would pass that end (lowest last).
    se_free: Vec<u64>,
}

fn rd(file: &dyn Storage, name: &str, buf: &mut [u8], off: u64) -> Result<()> {
    file.read_at(buf, off).map_err(|e| VmdkError::io(name, e))
}

fn wr(file: &dyn Storage, name: &str, buf: &[u8], off: u64) -> Result<()> {
    file.write_at(buf, off).map_err(|e| VmdkError::io(name, e))
}

fn read_table(file: &dyn Storage, name: &str, off: u64, n: u64, width: u64) -> Result<Vec<u64>> {
    let mut raw = vec![0u8; (n * width) as usize];
    rd(file, name, &mut raw, off)?;
    Ok(raw
        .chunks_exact(width as usize)
        .map(|c| {
            if width == 4 {
                u32::from_le_bytes(c.try_into().expect("4")) as u64
            } else {
                u64::from_le_bytes(c.try_into().expect("8"))
            }
        })
        .collect())
}

fn encode_entry(v: u64, width: u64) -> Vec<u8> {
    if width == 4 {
        (v as u32).to_le_bytes().to_vec()
    } else {
        v.to_le_bytes().to_vec()
    }
}

impl SparseExtent {
    /// Open the extent in `file`, whose first bytes decide the format.
    pub fn open(file: Arc<dyn Storage>, name: &str, writable: bool) -> Result<Self> {
        let len = file.len().map_err(|e| VmdkError::io(name, e))?;
        if len < 512 {
            return Err(VmdkError::malformed(
                name,
                format!("only {len} bytes, too short for a sparse header"),
            ));
        }
        let mut s0 = [0u8; 512];
        rd(&*file, name, &mut s0, 0)?;
        let magic32 = u32::from_le_bytes(s0[0..4].try_into().expect("4"));
        let magic64 = u64::from_le_bytes(s0[0..8].try_into().expect("8"));
        if magic32 == KDMV_MAGIC {
            Self::open_kdmv(file, name, writable, len, &s0)
        } else if magic32 == COWD_MAGIC {
            Self::open_cowd(file, name, writable, len)
        } else if magic64 == SESPARSE_MAGIC {
            Self::open_se(file, name, writable, len, &s0)
        } else {
            Err(VmdkError::malformed(
                name,
                format!("unknown sparse extent magic 0x{magic32:08x}"),
            ))
        }
    }

    fn bad(name: &str) -> impl Fn(String) -> VmdkError + '_ {
        move |e| VmdkError::malformed(name, e)
    }

    #[allow(clippy::too_many_arguments)]
    fn build(
        format: SparseFormat,
        file: Arc<dyn Storage>,
        name: &str,
        writable: bool,
        capacity: u64,
        grain_sectors: u64,
        gt_entries: u64,
        entry_bytes: u64,
        gd_offset: u64,
        gd_entries: u64,
        rgd_offset: Option<u64>,
        len: u64,
    ) -> Result<Self> {
        let need = capacity.div_ceil(grain_sectors * gt_entries);
        if need > MAX_GD_ENTRIES || gd_entries > MAX_GD_ENTRIES {
            return Err(VmdkError::malformed(
                name,
                format!(
                    "grain directory of {} entries is larger than {MAX_GD_ENTRIES}",
                    need.max(gd_entries)
                ),
            ));
        }
        if gd_entries < need {
            return Err(VmdkError::malformed(
                name,
                format!("grain directory has {gd_entries} entries, the capacity needs {need}"),
            ));
        }
        let gd_end = gd_offset.checked_add(gd_entries * entry_bytes);
        if gd_end.map_or(true, |e| e > len) {
            return Err(VmdkError::malformed(
                name,
                format!(
                    "grain directory at byte {gd_offset} ({gd_entries} entries) reaches past the end of the {len}-byte file"
                ),
            ));
        }
        let gd = read_table(&*file, name, gd_offset, gd_entries, entry_bytes)?;
        let rgd = match rgd_offset {
            Some(o)
                if o.checked_add(gd_entries * entry_bytes)
                    .is_some_and(|e| e <= len) =>
            {
                read_table(&*file, name, o, gd_entries, entry_bytes)?
            }
            Some(o) => {
                return Err(VmdkError::malformed(
                    name,
                    format!(
                        "redundant grain directory at byte {o} reaches past the end of the file"
                    ),
                ))
            }
            None => Vec::new(),
        };
        let next = len.div_ceil(grain_sectors * SECTOR) * grain_sectors * SECTOR;
        Ok(SparseExtent {
            format,
            name: name.to_string(),
            file,
            writable,
            capacity,
            grain_sectors,
            gt_entries,
            entry_bytes,
            gd_offset,
            rgd_offset,
            gd: RwLock::new(gd),
            rgd: RwLock::new(rgd),
            zero_grain: false,
            compressed: false,
            kdmv: None,
            cowd: None,
            se: None,
            gt_cache: Mutex::new(HashMap::new()),
            dirty_gts: Mutex::new(HashSet::new()),
            alloc: Mutex::new(AllocState {
                next,
                se_volatile: SeVolatile::default(),
                meta: BTreeMap::new(),
                se_free: Vec::new(),
            }),
        })
    }

    fn open_kdmv(
        file: Arc<dyn Storage>,
        name: &str,
        writable: bool,
        len: u64,
        s0: &[u8; 512],
    ) -> Result<Self> {
        let mut h = KdmvHeader::decode(s0).map_err(Self::bad(name))?;
        if h.gd_offset == GD_AT_END {
            // streamOptimized written as a stream: the footer near the end
            // holds the real header.
            if len < 1536 + 512 {
                return Err(VmdkError::malformed(name, "stream too short for a footer"));
            }
            let mut tail = [0u8; 1536];
            rd(&*file, name, &mut tail, len - 1536)?;
            let ty = u32::from_le_bytes(tail[12..16].try_into().expect("4"));
            if ty != MARKER_FOOTER {
                return Err(VmdkError::malformed(
                    name,
                    "gdOffset says the grain directory is at the end, but there is no footer marker 1536 bytes before the end",
                ));
            }
            let footer: [u8; 512] = tail[512..1024].try_into().expect("512");
            h = KdmvHeader::decode(&footer)
                .map_err(|e| VmdkError::malformed(name, format!("footer: {e}")))?;
            if h.gd_offset == GD_AT_END {
                return Err(VmdkError::malformed(
                    name,
                    "footer has no grain directory offset either",
                ));
            }
        }
        let gt_entries = h.gtes_per_gt as u64;
        let gd_entries = h.capacity.div_ceil(h.grain_size * gt_entries);
        let compressed = h.flags & FLAG_COMPRESS != 0;
        let rgd = match (h.flags & FLAG_RGD != 0 && h.rgd_offset != 0 && !compressed)
            .then(|| h.rgd_offset.checked_mul(SECTOR))
        {
            Some(None) => {
                return Err(VmdkError::malformed(
                    name,
                    "redundant grain directory offset overflows",
                ))
            }
            r => r.flatten(),
        };
        let gd_off = h
            .gd_offset
            .checked_mul(SECTOR)
            .ok_or_else(|| VmdkError::malformed(name, "grain directory offset overflows"))?;
        let mut x = Self::build(
            SparseFormat::Kdmv,
            file,
            name,
            writable && !compressed,
            h.capacity,
            h.grain_size,
            gt_entries,
            4,
            gd_off,
            gd_entries,
            rgd,
            len,
        )?;
        x.zero_grain = h.flags & FLAG_ZERO_GRAIN != 0;
        x.compressed = compressed;
        x.kdmv = Some(h);
        Ok(x)
    }

    fn open_cowd(file: Arc<dyn Storage>, name: &str, writable: bool, len: u64) -> Result<Self> {
        let mut b = [0u8; CowdHeader::BYTES];
        rd(&*file, name, &mut b, 0)?;
        let h = CowdHeader::decode(&b).map_err(Self::bad(name))?;
        let mut x = Self::build(
            SparseFormat::Cowd,
            file,
            name,
            writable,
            h.num_sectors as u64,
            h.grain_size as u64,
            CowdHeader::GT_ENTRIES,
            4,
            h.gd_offset as u64 * SECTOR,
            h.num_gd_entries as u64,
            None,
            len,
        )?;
        x.cowd = Some(h);
        let free = h.free_sector as u64 * SECTOR;
        let a = x.alloc.get_mut();
        a.next = a
            .next
            .max(free.div_ceil(x.grain_sectors * SECTOR) * x.grain_sectors * SECTOR);
        Ok(x)
    }

    fn open_se(
        file: Arc<dyn Storage>,
        name: &str,
        writable: bool,
        len: u64,
        s0: &[u8; 512],
    ) -> Result<Self> {
        let h = SeHeader::decode(s0).map_err(Self::bad(name))?;
        let mut vb = [0u8; 512];
        rd(&*file, name, &mut vb, h.volatile.0 * SECTOR)?;
        let v = SeVolatile::decode(&vb).map_err(Self::bad(name))?;
        if v.replay_journal != 0 {
            return Err(VmdkError::unsupported(
                name,
                "SEsparse image is dirty: its journal needs replaying, which no public tool can do (open it in ESXi first)",
            ));
        }
        let gd_entries = h.grain_dir.1 * SECTOR / 8;
        let mut x = Self::build(
            SparseFormat::SeSparse,
            file,
            name,
            writable,
            h.capacity,
            8,
            4096,
            8,
            h.grain_dir.0 * SECTOR,
            gd_entries,
            None,
            len,
        )?;
        // Grains are numbered from grains_offset; new ones go after the
        // highest one the file holds.
        let gstart = h.grains.0 * SECTOR;
        let a = x.alloc.get_mut();
        a.next = a.next.max(gstart);
        a.se_volatile = v;
        x.se = Some(h);
        // free_gt_number must name a table past every one in use.
        let max_used =
            x.gd.read()
                .iter()
                .filter(|&&e| e != 0)
                .map(|&e| (e & 0xffff_ffff) + 1)
                .max()
                .unwrap_or(0);
        let a = x.alloc.get_mut();
        a.se_volatile.free_gt_number = a.se_volatile.free_gt_number.max(max_used);
        Ok(x)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn writable(&self) -> bool {
        self.writable
    }

    pub fn compressed(&self) -> bool {
        self.compressed
    }

    pub fn grain_bytes(&self) -> u64 {
        self.grain_sectors * SECTOR
    }

    /// Whether a whole grain can be marked zero without writing data.
    pub fn has_zero_entries(&self) -> bool {
        self.format == SparseFormat::SeSparse || self.zero_grain
    }

    pub fn kdmv_header(&self) -> Option<KdmvHeader> {
        self.kdmv
    }

    pub fn file(&self) -> &Arc<dyn Storage> {
        &self.file
    }

    fn err(&self, what: impl Into<String>) -> VmdkError {
        VmdkError::malformed(&self.name, what)
    }

    /// Byte offset of grain table `l1`, if it exists.
    fn gt_offset(&self, raw: u64, l1: u64) -> Result<Option<u64>> {
        if raw == 0 {
            return Ok(None);
        }
        match self.format {
            SparseFormat::SeSparse => {
                let se = self.se.as_ref().expect("se header");
                if raw >> 60 != 1 || raw & 0x0fff_ffff_0000_0000 != 0 {
                    return Err(self.err(format!(
                        "grain directory entry {l1} is 0x{raw:016x}, not a table reference"
                    )));
                }
                let idx = raw & 0xffff_ffff;
                if (idx + 1) * 64 > se.grain_tables.1 {
                    return Err(self.err(format!(
                        "grain directory entry {l1} names table {idx}, past the {} tables the file has room for",
                        se.grain_tables.1 / 64
                    )));
                }
                Ok(Some((se.grain_tables.0 + idx * 64) * SECTOR))
            }
            _ => Ok(Some(raw * SECTOR)),
        }
    }

    fn gt(&self, l1: u64) -> Result<Option<(u64, Arc<Vec<u64>>)>> {
        let raw = *self
            .gd
            .read()
            .get(l1 as usize)
            .ok_or_else(|| self.err(format!("grain directory has no entry {l1}")))?;
        let Some(off) = self.gt_offset(raw, l1)? else {
            return Ok(None);
        };
        if let Some(t) = self.gt_cache.lock().get(&l1) {
            return Ok(Some((off, t.clone())));
        }
        let t = Arc::new(read_table(
            &*self.file,
            &self.name,
            off,
            self.gt_entries,
            self.entry_bytes,
        )?);
        let mut c = self.gt_cache.lock();
        if c.len() >= GT_CACHE_LIMIT {
            let dirty = self.dirty_gts.lock();
            if let Some(k) = c.keys().find(|k| !dirty.contains(k)).copied() {
                c.remove(&k);
            }
        }
        // A writer may have cached a newer copy meanwhile: keep that one.
        let t = c.entry(l1).or_insert(t).clone();
        Ok(Some((off, t)))
    }

    /// Decode one raw entry.
    pub fn decode(&self, raw: u64) -> Result<Gte> {
        Ok(match self.format {
            SparseFormat::Kdmv => match raw {
                0 => Gte::Unalloc,
                1 if self.zero_grain => Gte::Zero,
                s if self.compressed => Gte::Compressed(s * SECTOR),
                s => Gte::Data(s * SECTOR),
            },
            SparseFormat::Cowd => match raw {
                0 => Gte::Unalloc,
                s => Gte::Data(s * SECTOR),
            },
            SparseFormat::SeSparse => match raw >> 60 {
                0 if raw == 0 => Gte::Unalloc,
                0 => {
                    return Err(self.err(format!(
                        "grain table entry 0x{raw:016x}: type 0 with non-zero bits"
                    )))
                }
                1 => Gte::Unmapped,
                2 => Gte::Zero,
                3 => {
                    let se = self.se.as_ref().expect("se header");
                    let idx = se_decode_index(raw);
                    // Indexes go up to 2^60; keep offsets far from overflowing.
                    let off = idx
                        .checked_mul(8)
                        .and_then(|s| s.checked_add(se.grains.0))
                        .and_then(|s| s.checked_mul(SECTOR))
                        .filter(|&o| o <= MAX_DATA_OFFSET)
                        .ok_or_else(|| {
                            self.err(format!(
                                "grain table entry 0x{raw:016x} names grain index {idx}, past any possible file"
                            ))
                        })?;
                    Gte::Data(off)
                }
                t => {
                    return Err(self.err(format!(
                        "grain table entry 0x{raw:016x} has unknown type 0x{t:x}"
                    )))
                }
            },
        })
    }

    fn encode(&self, g: Gte) -> u64 {
        match self.format {
            SparseFormat::Kdmv => match g {
                Gte::Unalloc => 0,
                Gte::Zero | Gte::Unmapped => 1,
                Gte::Data(o) | Gte::Compressed(o) => o / SECTOR,
            },
            SparseFormat::Cowd => match g {
                Gte::Data(o) | Gte::Compressed(o) => o / SECTOR,
                _ => 0,
            },
            SparseFormat::SeSparse => match g {
                Gte::Unalloc => 0,
                Gte::Unmapped => 1 << 60,
                Gte::Zero => 2 << 60,
                Gte::Data(o) | Gte::Compressed(o) => {
                    let se = self.se.as_ref().expect("se header");
                    se_encode_index((o / SECTOR - se.grains.0) / 8)
                }
            },
        }
    }

    /// The entry of grain `grain` (an index in grain units from sector 0).
    pub fn lookup(&self, grain: u64) -> Result<Gte> {
        let l1 = grain / self.gt_entries;
        let l2 = grain % self.gt_entries;
        match self.gt(l1)? {
            None => Ok(Gte::Unalloc),
            Some((_, t)) => self.decode(t[l2 as usize]),
        }
    }

    /// The entry of `grain` and for how many grains from it on the entry
    /// is known to be the same without more lookups: the rest of the grain
    /// table when the table does not exist, else 1. Lets status queries
    /// skip empty tables instead of walking them grain by grain.
    pub fn lookup_span(&self, grain: u64) -> Result<(Gte, u64)> {
        let l1 = grain / self.gt_entries;
        let l2 = grain % self.gt_entries;
        match self.gt(l1)? {
            None => Ok((Gte::Unalloc, self.gt_entries - l2)),
            Some((_, t)) => Ok((self.decode(t[l2 as usize])?, 1)),
        }
    }

    /// Raw entry, for check and shrink.
    fn raw_entry(&self, grain: u64) -> Result<u64> {
        let l1 = grain / self.gt_entries;
        Ok(match self.gt(l1)? {
            None => 0,
            Some((_, t)) => t[(grain % self.gt_entries) as usize],
        })
    }

    /// Read `buf.len()` bytes at `within` bytes into the grain named by `g`
    /// (Data or Compressed).
    pub fn read_grain(&self, g: Gte, within: u64, buf: &mut [u8]) -> Result<()> {
        match g {
            Gte::Data(off) => rd(&*self.file, &self.name, buf, off + within),
            Gte::Compressed(off) => {
                let data = self.inflate_grain(off)?;
                let w = within as usize;
                buf.copy_from_slice(&data[w..w + buf.len()]);
                Ok(())
            }
            _ => {
                buf.fill(0);
                Ok(())
            }
        }
    }

    fn inflate_grain(&self, off: u64) -> Result<Vec<u8>> {
        let gb = self.grain_bytes();
        if gb > MAX_BUFFERED_GRAIN {
            return Err(VmdkError::unsupported(
                &self.name,
                format!("compressed grains of {gb} bytes are too large"),
            ));
        }
        let mut hdr = [0u8; 12];
        rd(&*self.file, &self.name, &mut hdr, off)?;
        let size = u32::from_le_bytes(hdr[8..12].try_into().expect("4")) as u64;
        // zlib never expands a grain by more than a small margin.
        if size == 0 || size > gb + gb / 8 + 1024 {
            return Err(self.err(format!(
                "compressed grain at byte {off} claims {size} bytes"
            )));
        }
        let mut z = vec![0u8; size as usize];
        rd(&*self.file, &self.name, &mut z, off + 12)?;
        let mut out = Vec::with_capacity(gb as usize);
        let mut dec = flate2::read::ZlibDecoder::new(&z[..]).take(gb + 1);
        dec.read_to_end(&mut out).map_err(|e| {
            self.err(format!(
                "compressed grain at byte {off} does not inflate: {e}"
            ))
        })?;
        if out.len() as u64 > gb {
            return Err(self.err(format!(
                "compressed grain at byte {off} inflates past the grain size"
            )));
        }
        out.resize(gb as usize, 0); // the last grain of a stream may be short
        Ok(out)
    }

    /// Set grain `grain`'s entry, allocating its table if needed.
    /// Callers hold the allocation lock (`with_alloc`).
    fn set_entry(&self, st: &mut AllocState, grain: u64, g: Gte) -> Result<()> {
        let l1 = grain / self.gt_entries;
        let l2 = grain % self.gt_entries;
        let raw = self.encode(g);
        let (off, table) = match self.gt(l1)? {
            Some(x) => x,
            None => {
                if raw == 0 {
                    return Ok(()); // already unallocated
                }
                self.alloc_gt(st, l1)?;
                self.gt(l1)?
                    .ok_or_else(|| self.err("new grain table vanished"))?
            }
        };
        let eb = self.entry_bytes;
        st.meta.insert(off + l2 * eb, encode_entry(raw, eb));
        if self.rgd_offset.is_some() {
            let rraw = self.rgd.read().get(l1 as usize).copied().unwrap_or(0);
            if rraw != 0 {
                st.meta
                    .insert(rraw * SECTOR + l2 * eb, encode_entry(raw, eb));
            }
        }
        let mut t = (*table).clone();
        t[l2 as usize] = raw;
        // Dirty before cached, so a reader's eviction cannot drop it.
        let dirty_tables = {
            let mut d = self.dirty_gts.lock();
            d.insert(l1);
            d.len()
        };
        self.gt_cache.lock().insert(l1, Arc::new(t));
        if st.meta.len() >= MAX_PENDING_META || dirty_tables >= MAX_DIRTY_TABLES {
            self.flush_meta(st)?;
        }
        Ok(())
    }

    /// Make everything durable in the only order that is crash-safe
    /// without a journal: sync the data (and new, zeroed tables), then
    /// write the entries, directory and header updates that point at it,
    /// then sync again.
    /// Where a new grain goes: appended at the end, except that an SEsparse
    /// extent whose grains region is used up reuses slots that unmaps and
    /// zeroes freed (after making those entry changes durable, so no durable
    /// entry still names a reused slot).
    fn new_grain_offset(&self, st: &mut AllocState) -> Result<u64> {
        let gb = self.grain_bytes();
        if let Some(se) = self.se {
            let gstart = se.grains.0 * SECTOR;
            let limit = se.grains.1 / 8;
            if (st.next - gstart) / gb >= limit {
                if st.se_free.is_empty() {
                    self.flush_meta(st)?;
                    st.se_free = self.scan_free_slots(limit)?;
                }
                if let Some(i) = st.se_free.pop() {
                    return Ok(gstart + i * gb);
                }
            }
        }
        let off = st.next;
        st.next += gb;
        Ok(off)
    }

    /// SEsparse grain slots below `limit` that no entry names, lowest last.
    fn scan_free_slots(&self, limit: u64) -> Result<Vec<u64>> {
        let se = self.se.expect("se header");
        let gb = self.grain_bytes();
        let mut used = vec![0u64; limit.div_ceil(64) as usize];
        let mut grain = 0;
        while grain < self.grains() {
            let (g, span) = self.lookup_span(grain)?;
            grain += span;
            if let Gte::Data(o) = g {
                let i = (o - se.grains.0 * SECTOR) / gb;
                if i < limit {
                    used[(i / 64) as usize] |= 1 << (i % 64);
                }
            }
        }
        let mut free: Vec<u64> = (0..limit)
            .filter(|i| used[(i / 64) as usize] & (1 << (i % 64)) == 0)
            .take(1 << 16)
            .collect();
        free.reverse();
        Ok(free)
    }

    fn flush_meta(&self, st: &mut AllocState) -> Result<()> {
        let sync = || self.file.sync().map_err(|e| VmdkError::io(&self.name, e));
        if st.meta.is_empty() {
            return sync();
        }
        sync()?;
        // Coalesce neighbouring updates into single writes.
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (&off, b) in &st.meta {
            match runs.last_mut() {
                Some((o, buf)) if *o + buf.len() as u64 == off => buf.extend_from_slice(b),
                _ => runs.push((off, b.clone())),
            }
        }
        for (off, b) in &runs {
            wr(&*self.file, &self.name, b, *off)?;
        }
        st.meta.clear();
        self.dirty_gts.lock().clear();
        sync()
    }

    /// Give directory entry `l1` a zeroed grain table.
    fn alloc_gt(&self, st: &mut AllocState, l1: u64) -> Result<()> {
        let tb = self.gt_entries * self.entry_bytes;
        let zeros = vec![0u8; tb as usize];
        let eb = self.entry_bytes;
        match self.format {
            SparseFormat::SeSparse => {
                let se = self.se.as_ref().expect("se header");
                let idx = st.se_volatile.free_gt_number;
                if (idx + 1) * 64 > se.grain_tables.1 {
                    return Err(self.err("no room left for grain tables"));
                }
                let off = (se.grain_tables.0 + idx * 64) * SECTOR;
                wr(&*self.file, &self.name, &zeros, off)?;
                st.se_volatile.free_gt_number = idx + 1;
                let v = st.se_volatile.encode().to_vec();
                st.meta.insert(se.volatile.0 * SECTOR, v);
                let raw = (1u64 << 60) | idx;
                st.meta
                    .insert(self.gd_offset + l1 * eb, encode_entry(raw, eb));
                self.gd.write()[l1 as usize] = raw;
            }
            _ => {
                // Tables go at the end of the file, grain-aligned so grains stay aligned.
                let gb = self.grain_bytes();
                let span = tb.div_ceil(gb) * gb;
                let off = st.next;
                st.next += span;
                wr(&*self.file, &self.name, &zeros, off)?;
                let mut tables = vec![(self.gd_offset, off)];
                if let Some(r) = self.rgd_offset {
                    let roff = st.next;
                    st.next += span;
                    wr(&*self.file, &self.name, &zeros, roff)?;
                    tables.push((r, roff));
                    self.rgd.write()[l1 as usize] = roff / SECTOR;
                }
                for (dir, t) in tables {
                    st.meta.insert(dir + l1 * eb, encode_entry(t / SECTOR, eb));
                }
                self.gd.write()[l1 as usize] = off / SECTOR;
                self.update_cowd_free(st)?;
            }
        }
        self.gt_cache.lock().remove(&l1);
        Ok(())
    }

    fn update_cowd_free(&self, st: &mut AllocState) -> Result<()> {
        if let Some(mut h) = self.cowd {
            h.free_sector =
                u32::try_from(st.next / SECTOR).map_err(|_| self.err("COWD file past 2 TiB"))?;
            st.meta.insert(0, h.encode()[..32].to_vec());
        }
        Ok(())
    }

    fn readonly(&self) -> VmdkError {
        let why = if self.compressed {
            "streamOptimized (compressed) extents are read-only; export a new one instead"
        } else {
            "extent is open read-only"
        };
        VmdkError::new(VmdkErrorKind::ReadOnly, &self.name, why)
    }

    /// Run `f` with the allocation lock: the current entry of `grain` is
    /// passed in, re-read under the lock so racing writers see each other.
    pub fn with_grain<T>(
        &self,
        grain: u64,
        f: impl FnOnce(&mut GrainTx<'_>) -> Result<T>,
    ) -> Result<T> {
        if !self.writable {
            return Err(self.readonly());
        }
        let mut st = self.alloc.lock();
        let current = self.lookup(grain)?;
        let mut tx = GrainTx {
            ext: self,
            st: &mut st,
            grain,
            current,
        };
        f(&mut tx)
    }

    /// Write into an allocated grain in place.
    pub fn write_in_place(&self, off: u64, buf: &[u8]) -> Result<()> {
        if !self.writable {
            return Err(self.readonly());
        }
        wr(&*self.file, &self.name, buf, off)
    }

    /// Write the held metadata in crash-safe order and make it all durable.
    pub fn sync(&self) -> Result<()> {
        let mut st = self.alloc.lock();
        self.flush_meta(&mut st)
    }

    /// Number of grains the extent addresses.
    pub fn grains(&self) -> u64 {
        self.capacity.div_ceil(self.grain_sectors)
    }

    /// Verify tables and grains; with `repair`, fix what needs no guessing.
    pub fn check(&self, repair: bool) -> Result<ExtentCheck> {
        let mut r = ExtentCheck::default();
        let len = self.file.len().map_err(|e| VmdkError::io(&self.name, e))?;
        let gb = self.grain_bytes();
        let data_start = match self.format {
            SparseFormat::Kdmv => self
                .kdmv
                .map(|h| h.overhead.saturating_mul(SECTOR))
                .unwrap_or(0),
            SparseFormat::Cowd => self.gd_offset,
            SparseFormat::SeSparse => self.se.map(|s| s.grains.0 * SECTOR).unwrap_or(0),
        };
        if let Some(h) = self.kdmv {
            if h.unclean {
                r.warnings.push("the unclean-shutdown flag is set".into());
                if repair && self.writable {
                    let mut h2 = h;
                    h2.unclean = false;
                    wr(&*self.file, &self.name, &h2.encode()[72..73], 72)?;
                    r.repaired.push("cleared the unclean-shutdown flag".into());
                }
            }
        }
        let gd_len = self.gd.read().len() as u64;
        let mut owners: HashMap<u64, u64> = HashMap::new();
        let mut doubles: Vec<(u64, u64)> = Vec::new();
        let mut table_offsets: HashMap<u64, u64> = HashMap::new();
        for l1 in 0..gd_len {
            let raw = self.gd.read()[l1 as usize];
            // Redundant directory agreement (KDMV).
            if self.rgd_offset.is_some() {
                let rraw = self.rgd.read()[l1 as usize];
                if (raw == 0) != (rraw == 0) {
                    r.errors.push(format!(
                        "grain directory entry {l1} and its redundant copy disagree about whether a table exists"
                    ));
                }
            }
            let off = match self.gt_offset(raw, l1) {
                Ok(Some(o)) => o,
                Ok(None) => continue,
                Err(e) => {
                    r.errors.push(e.what);
                    continue;
                }
            };
            let tb = self.gt_entries * self.entry_bytes;
            if off + tb > len {
                r.errors.push(format!(
                    "grain table {l1} at byte {off} lies past the end of the file"
                ));
                continue;
            }
            if off < 512 {
                r.errors.push(format!(
                    "grain table {l1} at byte {off} overlaps the header"
                ));
                continue;
            }
            if let Some(other) = table_offsets.insert(off, l1) {
                r.errors.push(format!(
                    "grain tables {other} and {l1} are the same table at byte {off}"
                ));
            }
            let Some((_, t)) = self.gt(l1)? else { continue };
            for (l2, &e) in t.iter().enumerate() {
                let grain = l1 * self.gt_entries + l2 as u64;
                if grain >= self.grains() {
                    if e != 0 {
                        r.warnings.push(format!(
                            "grain table entry for grain {grain}, past the capacity, is set"
                        ));
                    }
                    continue;
                }
                let g = match self.decode(e) {
                    Ok(g) => g,
                    Err(err) => {
                        r.errors.push(format!("grain {grain}: {}", err.what));
                        continue;
                    }
                };
                match g {
                    Gte::Unalloc => {}
                    Gte::Zero => r.zero_grains += 1,
                    Gte::Unmapped => r.unmapped_grains += 1,
                    Gte::Data(o) | Gte::Compressed(o) => {
                        r.allocated_grains += 1;
                        let end = if matches!(g, Gte::Data(_)) {
                            o + gb
                        } else {
                            o + 12
                        };
                        if o < data_start {
                            r.errors.push(format!("grain {grain} at byte {o} overlaps the metadata (grains start at {data_start})"));
                            continue;
                        }
                        if o >= len {
                            r.errors.push(format!("grain {grain} at byte {o} lies past the end of the {len}-byte file"));
                            if repair && self.writable {
                                let replacement = if self.has_zero_entries() {
                                    Gte::Zero
                                } else {
                                    Gte::Unalloc
                                };
                                let mut st = self.alloc.lock();
                                self.set_entry(&mut st, grain, replacement)?;
                                r.repaired.push(format!(
                                    "grain {grain}: its data was never written; now {}",
                                    if replacement == Gte::Zero {
                                        "a zero grain"
                                    } else {
                                        "unallocated"
                                    }
                                ));
                            }
                            continue;
                        }
                        if end > len {
                            r.errors.push(format!(
                                "grain {grain} at byte {o} is cut short by the end of the file"
                            ));
                            if repair && self.writable {
                                self.file
                                    .set_len(end)
                                    .map_err(|e| VmdkError::io(&self.name, e))?;
                                r.repaired.push(format!(
                                    "grain {grain}: extended the file with zeros to hold it"
                                ));
                            }
                        }
                        if let Some(first) = owners.insert(o, grain) {
                            r.errors.push(format!(
                                "grains {first} and {grain} both use the data at byte {o}"
                            ));
                            doubles.push((grain, o));
                        }
                    }
                }
            }
        }
        if repair && self.writable && !self.compressed {
            for (grain, o) in doubles {
                // Both grains read the same bytes now; give the second its own copy.
                let mut buf = vec![0u8; gb as usize];
                rd(&*self.file, &self.name, &mut buf, o)?;
                self.with_grain(grain, |tx| tx.allocate(&buf))?;
                r.repaired.push(format!(
                    "grain {grain}: copied the shared data to a grain of its own"
                ));
            }
        }
        if repair && !r.repaired.is_empty() {
            self.sync()?;
        }
        Ok(r)
    }

    /// SEsparse wipe-shrink: turn all-zero grains into zero entries, move
    /// the last grains into the holes, and truncate the file. Crash-safe:
    /// copies are synced before entries change, entries before truncation.
    pub fn shrink(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<ShrinkReport> {
        let Some(se) = self.se else {
            return Err(VmdkError::unsupported(
                &self.name,
                "shrink is for SEsparse extents",
            ));
        };
        if !self.writable {
            return Err(self.readonly());
        }
        let mut st = self.alloc.lock();
        let gb = self.grain_bytes();
        let gstart = se.grains.0 * SECTOR;
        let mut rep = ShrinkReport {
            bytes_before: self.file.len().map_err(|e| VmdkError::io(&self.name, e))?,
            ..Default::default()
        };
        // 1. Find allocated grains; zero ones become zero entries.
        let mut used: Vec<(u64, u64)> = Vec::new(); // (index, grain)
        let total = self.grains();
        let mut buf = vec![0u8; gb as usize];
        let mut seen: HashMap<u64, u64> = HashMap::new();
        for grain in 0..total {
            if grain % 4096 == 0 {
                progress(grain, total * 2);
            }
            let raw = self.raw_entry(grain)?;
            if raw >> 60 == 1 && raw != 1 << 60 {
                // An unmapped entry still naming its old grain: forget it.
                self.set_entry(&mut st, grain, Gte::Unmapped)?;
            }
            if let Gte::Data(o) = self.decode(raw)? {
                rd(&*self.file, &self.name, &mut buf, o)?;
                if buf.iter().all(|&b| b == 0) {
                    self.set_entry(&mut st, grain, Gte::Zero)?;
                    rep.zero_grains_found += 1;
                    continue;
                }
                let idx = (o - gstart) / gb;
                if let Some(other) = seen.insert(idx, grain) {
                    return Err(self.err(format!(
                        "grains {other} and {grain} share grain index {idx}; run `strata vmdk check --repair` first"
                    )));
                }
                used.push((idx, grain));
            }
        }
        rep.grains_before = st.next.saturating_sub(gstart) / gb;
        self.flush_meta(&mut st)?;
        // 2. Move the highest grains into the lowest holes.
        let n = used.len() as u64;
        used.sort_unstable();
        let mut holes = {
            let taken: std::collections::HashSet<u64> = used.iter().map(|u| u.0).collect();
            (0..n)
                .filter(|i| !taken.contains(i))
                .collect::<Vec<_>>()
                .into_iter()
        };
        let moving: Vec<(u64, u64)> = used.iter().copied().filter(|&(i, _)| i >= n).collect();
        let mut moves = Vec::with_capacity(moving.len());
        for (k, (idx, grain)) in moving.into_iter().enumerate() {
            if k % 256 == 0 {
                progress(total + k as u64, total * 2);
            }
            let to = holes
                .next()
                .ok_or_else(|| self.err("shrink: ran out of holes"))?;
            rd(&*self.file, &self.name, &mut buf, gstart + idx * gb)?;
            wr(&*self.file, &self.name, &buf, gstart + to * gb)?;
            moves.push((grain, to));
        }
        self.flush_meta(&mut st)?;
        for &(grain, to) in &moves {
            self.set_entry(&mut st, grain, Gte::Data(gstart + to * gb))?;
        }
        self.flush_meta(&mut st)?;
        let new_len = gstart + n * gb;
        self.file
            .set_len(new_len)
            .map_err(|e| VmdkError::io(&self.name, e))?;
        self.flush_meta(&mut st)?;
        st.next = new_len;
        st.se_free.clear();
        rep.moved = moves.len() as u64;
        rep.grains_after = n;
        rep.bytes_after = new_len;
        progress(total * 2, total * 2);
        Ok(rep)
    }
}

impl Drop for SparseExtent {
    /// Closing without a flush still writes the held metadata (best
    /// effort: errors have nowhere to go), as a write-through driver's
    /// updates would have reached the file.
    fn drop(&mut self) {
        let mut st = self.alloc.lock();
        if !st.meta.is_empty() {
            let _ = self.flush_meta(&mut st);
        }
    }
}

/// A write transaction on one grain, under the extent's allocation lock.
pub struct GrainTx<'a> {
    ext: &'a SparseExtent,
    st: &'a mut AllocState,
    pub grain: u64,
    /// The grain's entry as of taking the lock.
    pub current: Gte,
}

impl GrainTx<'_> {
    /// Write a whole new grain with `data` and point the entry at it.
    pub fn allocate(&mut self, data: &[u8]) -> Result<()> {
        let e = self.ext;
        debug_assert_eq!(data.len() as u64, e.grain_bytes());
        let off = e.new_grain_offset(self.st)?;
        wr(&*e.file, &e.name, data, off)?;
        if e.format == SparseFormat::Cowd {
            e.update_cowd_free(self.st)?;
        }
        e.set_entry(self.st, self.grain, Gte::Data(off))?;
        self.current = Gte::Data(off);
        Ok(())
    }

    /// Point the entry at a special value (zero, unmapped, unallocated).
    pub fn set(&mut self, g: Gte) -> Result<()> {
        self.ext.set_entry(self.st, self.grain, g)?;
        self.current = g;
        Ok(())
    }
}

/// Create an empty hosted sparse extent laid out as qemu-img does (grain
/// 128 sectors, 512 entries per table, descriptor at sector 1, redundant
/// directory, all tables preallocated). Returns the header written.
pub fn create_kdmv(
    file: &dyn Storage,
    name: &str,
    capacity: u64,
    zero_grain: bool,
    descriptor: &str,
) -> Result<KdmvHeader> {
    let grain = 128u64;
    let grains = capacity.div_ceil(grain);
    let gt_count = grains.div_ceil(512);
    let gd_sectors = (gt_count * 4).div_ceil(512);
    let desc_sectors = 20u64.max((descriptor.len() as u64).div_ceil(512));
    let rgd = 1 + desc_sectors;
    let gd = rgd + gd_sectors + 4 * gt_count;
    let overhead = (gd + gd_sectors + 4 * gt_count).div_ceil(grain) * grain;
    let h = KdmvHeader {
        version: if zero_grain { 2 } else { 1 },
        flags: FLAG_NL_DETECT | FLAG_RGD | if zero_grain { FLAG_ZERO_GRAIN } else { 0 },
        capacity,
        grain_size: grain,
        desc_offset: 1,
        desc_size: desc_sectors,
        gtes_per_gt: 512,
        rgd_offset: rgd,
        gd_offset: gd,
        overhead,
        unclean: false,
        compress_algorithm: 0,
    };
    wr(file, name, &h.encode(), 0)?;
    let mut desc = descriptor.as_bytes().to_vec();
    desc.resize((desc_sectors * SECTOR) as usize, 0);
    wr(file, name, &desc, SECTOR)?;
    for dir in [rgd, gd] {
        let mut d = Vec::with_capacity((gd_sectors * SECTOR) as usize);
        for i in 0..gt_count {
            d.extend_from_slice(&((dir + gd_sectors + 4 * i) as u32).to_le_bytes());
        }
        d.resize((gd_sectors * SECTOR) as usize, 0);
        wr(file, name, &d, dir * SECTOR)?;
    }
    file.set_len(overhead * SECTOR)
        .map_err(|e| VmdkError::io(name, e))?;
    Ok(h)
}

/// Create an empty COWD extent with every grain table preallocated (QEMU
/// writes only into existing tables). Grain size 1 sector, as ESX uses.
pub fn create_cowd(file: &dyn Storage, name: &str, capacity: u64) -> Result<()> {
    let sectors = u32::try_from(capacity)
        .map_err(|_| VmdkError::unsupported(name, "VMFSsparse extents hold at most 2 TiB"))?;
    let n_gd = (capacity.div_ceil(CowdHeader::GT_ENTRIES)).max(1);
    let gd_sectors = (n_gd * 4).div_ceil(512);
    let gt_start = 4 + gd_sectors;
    let gt_sectors = CowdHeader::GT_ENTRIES * 4 / 512;
    let end = gt_start + n_gd * gt_sectors;
    let h = CowdHeader {
        version: 1,
        flags: 3,
        num_sectors: sectors,
        grain_size: 1,
        gd_offset: 4,
        num_gd_entries: n_gd as u32,
        free_sector: u32::try_from(end)
            .map_err(|_| VmdkError::unsupported(name, "COWD metadata past 2 TiB"))?,
    };
    wr(file, name, &h.encode(), 0)?;
    let mut d = Vec::with_capacity((gd_sectors * SECTOR) as usize);
    for i in 0..n_gd {
        d.extend_from_slice(&((gt_start + i * gt_sectors) as u32).to_le_bytes());
    }
    d.resize((gd_sectors * SECTOR) as usize, 0);
    wr(file, name, &d, 4 * SECTOR)?;
    file.set_len(end * SECTOR)
        .map_err(|e| VmdkError::io(name, e))?;
    Ok(())
}

/// Create an empty SEsparse extent in ESXi's layout (see FORMAT.md).
pub fn create_sesparse(file: &dyn Storage, name: &str, capacity: u64) -> Result<SeHeader> {
    let h = SeHeader::layout(capacity);
    wr(file, name, &h.encode(), 0)?;
    wr(
        file,
        name,
        &SeVolatile::default().encode(),
        h.volatile.0 * SECTOR,
    )?;
    file.set_len(h.grains.0 * SECTOR)
        .map_err(|e| VmdkError::io(name, e))?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sesparse_index_rotation_matches_the_reference() {
        assert_eq!(se_encode_index(4097), 0x3001_0000_0000_0001);
        for i in [0u64, 1, 4095, 4096, 4097, 123_456_789, (1 << 52) - 1] {
            assert_eq!(se_decode_index(se_encode_index(i)), i);
        }
    }

    #[test]
    fn sesparse_layout_matches_esxi_for_100_mib() {
        let h = SeHeader::layout(204_800);
        assert_eq!(h.grain_dir, (4096, 2048));
        assert_eq!(h.grain_tables, (6144, 2048));
        assert_eq!(h.free_bitmap, (8192, 2048));
        assert_eq!(h.backmap, (10240, 2048));
        assert_eq!(h.grains, (12288, 204_800));
        assert_eq!(SeHeader::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn kdmv_layout_matches_qemu_for_3_gib() {
        let s = strata_storage::SimBackend::new();
        use strata_storage::Backend;
        let f = s.open("x", true).unwrap();
        let h = create_kdmv(&*f, "x", 3 << 21, false, "").unwrap();
        assert_eq!(h.rgd_offset, 21);
        assert_eq!(h.gd_offset, 406);
        assert_eq!(h.overhead, 896);
        assert_eq!(f.len().unwrap(), 458_752);
    }
}
