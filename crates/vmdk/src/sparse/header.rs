//! The three grain-table headers, byte for byte, and the one [`Header`] an
//! open extent carries. Decoders apply every check QEMU 7.2 applies and
//! answer with a [`HeaderError`] that names the field; encoders write what
//! the decoders accept. Nothing here does I/O.

use thiserror::Error;

/// Bytes per sector: every offset and size in these headers counts sectors.
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
/// Capacities past this many sectors (128 PiB) are refused as impossible.
const MAX_CAPACITY_SECTORS: u64 = 1 << 48;
/// SEsparse regions ending past this sector are refused as impossible.
const MAX_SESPARSE_REGION_END: u64 = 1 << 54;

/// Why a header was refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HeaderError {
    #[error("not a hosted sparse extent (no KDMV magic)")]
    KdmvMagic,
    #[error("KDMV version {0} (1, 2 or 3 expected)")]
    KdmvVersion(u32),
    #[error("KDMV has unknown incompatible flags 0x{0:08x}")]
    KdmvIncompatibleFlags(u32),
    #[error("KDMV grain size {0} sectors is invalid")]
    KdmvGrainSize(u64),
    #[error("KDMV has {0} entries per grain table (1 to 512 allowed)")]
    KdmvGtEntries(u32),
    #[error("KDMV compression algorithm {0} (only 1, DEFLATE, is known)")]
    KdmvCompression(u16),
    #[error("KDMV capacity {0} sectors is impossible")]
    KdmvCapacity(u64),
    #[error("COWD header is truncated")]
    CowdTruncated,
    #[error("not a VMFSsparse extent (no COWD magic)")]
    CowdMagic,
    #[error("COWD grain size {0} sectors is invalid")]
    CowdGrainSize(u32),
    #[error("COWD grain directory has {entries} entries, {sectors} sectors need {need}")]
    CowdGdTooSmall {
        entries: u32,
        sectors: u32,
        need: u64,
    },
    #[error("COWD grain directory at sector 0 overlaps the header")]
    CowdGdAtZero,
    #[error("bad SEsparse const header magic 0x{0:016x}")]
    SeMagic(u64),
    #[error("unsupported SEsparse version 0x{0:016x}")]
    SeVersion(u64),
    #[error("unsupported SEsparse grain size {0} (8 sectors expected)")]
    SeGrainSize(u64),
    #[error("unsupported SEsparse grain table size {0} (64 sectors expected)")]
    SeGtSize(u64),
    #[error("unsupported SEsparse flags 0x{0:016x}")]
    SeFlags(u64),
    #[error("unsupported SEsparse reserved fields 0x{:x} 0x{:x} 0x{:x} 0x{:x}", .0[0], .0[1], .0[2], .0[3])]
    SeReserved([u64; 4]),
    #[error("non-zero SEsparse const header padding")]
    SePadding,
    #[error("SEsparse {region} at sector {offset} size {size} is impossible")]
    SeRegion {
        region: &'static str,
        offset: u64,
        size: u64,
    },
    #[error("SEsparse capacity {0} sectors is impossible")]
    SeCapacity(u64),
    #[error("bad SEsparse volatile header magic 0x{0:016x}")]
    SeVolatileMagic(u64),
    #[error("non-zero SEsparse volatile header padding")]
    SeVolatilePadding,
}

/// Which grain-table format an extent uses (a name for the [`Header`] variant).
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

/// The header of an open extent: exactly one of the three formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Header {
    /// Hosted sparse; for a stream, the footer's copy (it has the real GD).
    Kdmv(KdmvHeader),
    Cowd(CowdHeader),
    SeSparse(SeSparseHeader),
}

impl Header {
    pub fn format(&self) -> SparseFormat {
        match self {
            Header::Kdmv(_) => SparseFormat::Kdmv,
            Header::Cowd(_) => SparseFormat::Cowd,
            Header::SeSparse(_) => SparseFormat::SeSparse,
        }
    }

    /// streamOptimized: grains are zlib-compressed markers (read-only).
    pub fn compressed(&self) -> bool {
        matches!(self, Header::Kdmv(h) if h.flags & FLAG_COMPRESS != 0)
    }

    /// Whether an entry can say "zero" (KDMV only with the zeroed-grain flag).
    pub fn has_zero_entries(&self) -> bool {
        match self {
            Header::Kdmv(h) => h.flags & FLAG_ZERO_GRAIN != 0,
            Header::Cowd(_) => false,
            Header::SeSparse(_) => true,
        }
    }
}

fn le_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// The SEsparse constant header (sector 0); (offset, size) pairs in sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeSparseHeader {
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

impl SeSparseHeader {
    /// Sectors per grain and per grain table: the only values QEMU accepts.
    pub const GRAIN_SECTORS: u64 = 8;
    pub const GT_SECTORS: u64 = 64;
    pub const GT_ENTRIES: u64 = Self::GT_SECTORS * SECTOR / 8;

    /// The layout ESXi uses for a disk of `capacity` sectors (see FORMAT.md).
    pub fn layout(capacity: u64) -> Self {
        let r = |x: u64| x.div_ceil(2048).max(1) * 2048;
        let n_gt = capacity
            .div_ceil(Self::GRAIN_SECTORS * Self::GT_ENTRIES)
            .max(1);
        let gd = (4096, r((n_gt * 8).div_ceil(512)));
        let gt = (gd.0 + gd.1, r(n_gt * Self::GT_SECTORS));
        let grains = capacity.div_ceil(Self::GRAIN_SECTORS);
        let fb = (gt.0 + gt.1, r(grains.div_ceil(8).div_ceil(512)));
        let bm = (fb.0 + fb.1, gt.1);
        SeSparseHeader {
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

    fn regions(&self) -> [(u64, u64); 8] {
        [
            self.volatile,
            self.journal_header,
            self.journal,
            self.grain_dir,
            self.grain_tables,
            self.free_bitmap,
            self.backmap,
            self.grains,
        ]
    }

    pub fn encode(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        let mut put = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
        put(0, SESPARSE_MAGIC);
        put(8, SESPARSE_VERSION);
        put(16, self.capacity);
        put(24, Self::GRAIN_SECTORS);
        put(32, Self::GT_SECTORS);
        for (i, (o, s)) in self.regions().into_iter().enumerate() {
            put(80 + i * 16, o);
            put(88 + i * 16, s);
        }
        b
    }

    /// Decode and apply every check QEMU 7.2 applies, with its messages.
    pub fn decode(b: &[u8; 512]) -> Result<Self, HeaderError> {
        let g = |off: usize| le_u64(b, off);
        if g(0) != SESPARSE_MAGIC {
            return Err(HeaderError::SeMagic(g(0)));
        }
        if g(8) != SESPARSE_VERSION {
            return Err(HeaderError::SeVersion(g(8)));
        }
        if g(24) != Self::GRAIN_SECTORS {
            return Err(HeaderError::SeGrainSize(g(24)));
        }
        if g(32) != Self::GT_SECTORS {
            return Err(HeaderError::SeGtSize(g(32)));
        }
        if g(40) != 0 {
            return Err(HeaderError::SeFlags(g(40)));
        }
        if (48..80).step_by(8).any(|o| g(o) != 0) {
            return Err(HeaderError::SeReserved([g(48), g(56), g(64), g(72)]));
        }
        if b[208..].iter().any(|&x| x != 0) {
            return Err(HeaderError::SePadding);
        }
        let pair = |i: usize| (g(80 + i * 16), g(88 + i * 16));
        let h = SeSparseHeader {
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
        for (region, (offset, size)) in [
            ("volatile header", h.volatile),
            ("grain directory", h.grain_dir),
            ("grain tables", h.grain_tables),
            ("grains", h.grains),
        ] {
            let end = offset.checked_add(size);
            if offset == 0 || size == 0 || end.is_none_or(|e| e > MAX_SESPARSE_REGION_END) {
                return Err(HeaderError::SeRegion {
                    region,
                    offset,
                    size,
                });
            }
        }
        if h.capacity == 0 || h.capacity > MAX_CAPACITY_SECTORS {
            return Err(HeaderError::SeCapacity(h.capacity));
        }
        Ok(h)
    }
}

/// The volatile header of SEsparse (sector `volatile.0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SeSparseVolatile {
    pub free_gt_number: u64,
    pub next_txn_seq_number: u64,
    pub replay_journal: u64,
}

impl SeSparseVolatile {
    pub fn encode(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        b[0..8].copy_from_slice(&SESPARSE_VOLATILE_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.free_gt_number.to_le_bytes());
        b[16..24].copy_from_slice(&self.next_txn_seq_number.to_le_bytes());
        b[24..32].copy_from_slice(&self.replay_journal.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 512]) -> Result<Self, HeaderError> {
        if le_u64(b, 0) != SESPARSE_VOLATILE_MAGIC {
            return Err(HeaderError::SeVolatileMagic(le_u64(b, 0)));
        }
        if b[32..].iter().any(|&x| x != 0) {
            return Err(HeaderError::SeVolatilePadding);
        }
        Ok(SeSparseVolatile {
            free_gt_number: le_u64(b, 8),
            next_txn_seq_number: le_u64(b, 16),
            replay_journal: le_u64(b, 24),
        })
    }
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
    /// Byte offset of the unclean-shutdown flag (check --repair clears it alone).
    pub const UNCLEAN_BYTE: usize = 72;

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
        b[Self::UNCLEAN_BYTE] = self.unclean as u8;
        b[73..77].copy_from_slice(&[0x0a, 0x20, 0x0d, 0x0a]);
        b[77..79].copy_from_slice(&self.compress_algorithm.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 512]) -> Result<Self, HeaderError> {
        if le_u32(b, 0) != KDMV_MAGIC {
            return Err(HeaderError::KdmvMagic);
        }
        let h = KdmvHeader {
            version: le_u32(b, 4),
            flags: le_u32(b, 8),
            capacity: le_u64(b, 12),
            grain_size: le_u64(b, 20),
            desc_offset: le_u64(b, 28),
            desc_size: le_u64(b, 36),
            gtes_per_gt: le_u32(b, 44),
            rgd_offset: le_u64(b, 48),
            gd_offset: le_u64(b, 56),
            overhead: le_u64(b, 64),
            unclean: b[Self::UNCLEAN_BYTE] != 0,
            compress_algorithm: u16::from_le_bytes([b[77], b[78]]),
        };
        if !(1..=3).contains(&h.version) {
            return Err(HeaderError::KdmvVersion(h.version));
        }
        let incompatible = h.flags & 0xffff_0000 & !(FLAG_COMPRESS | FLAG_MARKER);
        if incompatible != 0 {
            return Err(HeaderError::KdmvIncompatibleFlags(incompatible));
        }
        if h.grain_size == 0 || h.grain_size > MAX_GRAIN_SECTORS {
            return Err(HeaderError::KdmvGrainSize(h.grain_size));
        }
        if h.gtes_per_gt == 0 || h.gtes_per_gt > 512 {
            return Err(HeaderError::KdmvGtEntries(h.gtes_per_gt));
        }
        if h.flags & FLAG_COMPRESS != 0 && h.compress_algorithm != 1 {
            return Err(HeaderError::KdmvCompression(h.compress_algorithm));
        }
        if h.capacity > MAX_CAPACITY_SECTORS {
            return Err(HeaderError::KdmvCapacity(h.capacity));
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
    /// The fields that change while the extent is written (up to `free_sector`).
    pub const LIVE_BYTES: usize = 32;

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

    pub fn decode(b: &[u8]) -> Result<Self, HeaderError> {
        if b.len() < Self::LIVE_BYTES {
            return Err(HeaderError::CowdTruncated);
        }
        if le_u32(b, 0) != COWD_MAGIC {
            return Err(HeaderError::CowdMagic);
        }
        let h = CowdHeader {
            version: le_u32(b, 4),
            flags: le_u32(b, 8),
            num_sectors: le_u32(b, 12),
            grain_size: le_u32(b, 16),
            gd_offset: le_u32(b, 20),
            num_gd_entries: le_u32(b, 24),
            free_sector: le_u32(b, 28),
        };
        if h.grain_size == 0 || h.grain_size as u64 > MAX_GRAIN_SECTORS {
            return Err(HeaderError::CowdGrainSize(h.grain_size));
        }
        let need = (h.num_sectors as u64).div_ceil(h.grain_size as u64 * Self::GT_ENTRIES);
        if (h.num_gd_entries as u64) < need {
            return Err(HeaderError::CowdGdTooSmall {
                entries: h.num_gd_entries,
                sectors: h.num_sectors,
                need,
            });
        }
        if h.gd_offset == 0 {
            return Err(HeaderError::CowdGdAtZero);
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sesparse_layout_matches_esxi_for_100_mib() {
        let h = SeSparseHeader::layout(204_800);
        assert_eq!(h.grain_dir, (4096, 2048));
        assert_eq!(h.grain_tables, (6144, 2048));
        assert_eq!(h.free_bitmap, (8192, 2048));
        assert_eq!(h.backmap, (10240, 2048));
        assert_eq!(h.grains, (12288, 204_800));
        assert_eq!(SeSparseHeader::decode(&h.encode()).unwrap(), h);
    }

    #[test]
    fn header_errors_name_the_field() {
        let mut b = SeSparseHeader::layout(2048).encode();
        b[24] = 16;
        let e = SeSparseHeader::decode(&b).unwrap_err();
        assert_eq!(e, HeaderError::SeGrainSize(16));
        assert_eq!(
            e.to_string(),
            "unsupported SEsparse grain size 16 (8 sectors expected)"
        );
    }
}
