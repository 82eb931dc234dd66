//! One open grain-table extent: opening (header, geometry, directories) and
//! the read side (entry lookup through the table cache, grain reads). The
//! write side is in `alloc`, check and shrink in their own modules.

use std::io::Read as _;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use strata_storage::Storage;

use super::entry::{self, Gte};
use super::geometry::Geometry;
use super::header::{
    CowdHeader, Header, KdmvHeader, SeSparseHeader, SeSparseVolatile, SparseFormat, COWD_MAGIC,
    GD_AT_END, KDMV_MAGIC, MARKER_FOOTER, SECTOR, SESPARSE_MAGIC,
};
use super::held::AllocState;
use super::io::{rd, read_table};
use super::table::GtCache;
use crate::error::{Result, VmdkError, VmdkErrorKind};

/// Grains larger than this are read in pieces but never buffered whole
/// (writes and compressed reads need the whole grain).
pub const MAX_BUFFERED_GRAIN: u64 = 16 << 20;

/// An extent file as opened: what `open_extent` needs besides the header.
pub struct ExtentFile {
    pub file: Arc<dyn Storage>,
    /// Name for messages (the path in the backend).
    pub name: String,
    pub len_bytes: u64,
    pub writable: bool,
}

/// One open grain-table extent.
pub struct SparseExtent {
    pub(super) name: String,
    pub(super) file: Arc<dyn Storage>,
    pub(super) writable: bool,
    pub(super) header: Header,
    pub(super) geometry: Geometry,
    pub(super) gd: RwLock<Vec<u64>>,
    /// The redundant directory (empty without one).
    pub(super) rgd: RwLock<Vec<u64>>,
    pub(super) tables: GtCache,
    /// Serialises allocation and table updates; holds the next free byte.
    pub(super) alloc: Mutex<AllocState>,
}

/// Open an extent whose header and geometry are known: read its grain
/// directories and find where new grains go.
pub fn open_extent(src: ExtentFile, geometry: Geometry, header: Header) -> Result<SparseExtent> {
    let ExtentFile {
        file,
        name,
        len_bytes,
        writable,
    } = src;
    let mut se_volatile = match &header {
        Header::SeSparse(h) => {
            let mut vb = [0u8; 512];
            rd(&*file, &name, &mut vb, h.volatile.0 * SECTOR)?;
            let v = SeSparseVolatile::decode(&vb).map_err(|e| {
                crate::error::malformed(&name, e.to_string()).offset(h.volatile.0 * SECTOR)
            })?;
            if v.replay_journal != 0 {
                return Err(crate::error::unsupported(
                    &name,
                    "SEsparse image is dirty: its journal needs replaying, which no public tool can do (open it in ESXi first)",
                ));
            }
            v
        }
        Header::Kdmv(_) | Header::Cowd(_) => SeSparseVolatile::default(),
    };
    geometry
        .check_fits(len_bytes)
        .map_err(|e| crate::error::malformed(&name, e.to_string()))?;
    let gd = read_table(
        &*file,
        &name,
        geometry.gd_offset_bytes,
        geometry.gd_entries,
        geometry.entry_bytes,
    )?;
    let rgd = match geometry.rgd_offset_bytes {
        Some(o) => read_table(&*file, &name, o, geometry.gd_entries, geometry.entry_bytes)?,
        None => Vec::new(),
    };
    let gb = geometry.grain_bytes();
    let mut next_bytes = len_bytes.div_ceil(gb) * gb;
    match &header {
        Header::Kdmv(_) => {}
        Header::Cowd(h) => {
            let free = h.free_sector as u64 * SECTOR;
            next_bytes = next_bytes.max(free.div_ceil(gb) * gb);
        }
        Header::SeSparse(h) => {
            // Grains are numbered from the grains region; new ones go after
            // the highest one the file holds.
            next_bytes = next_bytes.max(h.grains.0 * SECTOR);
            // free_gt_number must name a table past every one in use.
            let max_used = gd
                .iter()
                .filter(|&&e| e != 0)
                .map(|&e| (e & 0xffff_ffff) + 1)
                .max()
                .unwrap_or(0);
            se_volatile.free_gt_number = se_volatile.free_gt_number.max(max_used);
        }
    }
    Ok(SparseExtent {
        name,
        file,
        writable: writable && !header.compressed(),
        header,
        geometry,
        gd: RwLock::new(gd),
        rgd: RwLock::new(rgd),
        tables: GtCache::default(),
        alloc: Mutex::new(AllocState::new(next_bytes, se_volatile)),
    })
}

/// The header of a hosted sparse extent; for a stream (GD at the end), the
/// footer's copy, which holds the real grain directory offset.
fn kdmv_header(file: &dyn Storage, name: &str, len: u64, s0: &[u8; 512]) -> Result<KdmvHeader> {
    let h = KdmvHeader::decode(s0)
        .map_err(|e| crate::error::malformed(name, e.to_string()).offset(0))?;
    if h.gd_offset != GD_AT_END {
        return Ok(h);
    }
    if len < 1536 + 512 {
        return Err(crate::error::malformed(
            name,
            "stream too short for a footer",
        ));
    }
    let mut tail = [0u8; 1536];
    rd(file, name, &mut tail, len - 1536)?;
    let ty = u32::from_le_bytes(tail[12..16].try_into().expect("4"));
    if ty != MARKER_FOOTER {
        return Err(crate::error::malformed(
            name,
            "gdOffset says the grain directory is at the end, but there is no footer marker 1536 bytes before the end",
        )
        .offset(len - 1536));
    }
    let footer: [u8; 512] = tail[512..1024].try_into().expect("512");
    let at = len - 1024;
    let h = KdmvHeader::decode(&footer)
        .map_err(|e| crate::error::malformed(name, format!("footer: {e}")).offset(at))?;
    if h.gd_offset == GD_AT_END {
        return Err(
            crate::error::malformed(name, "footer has no grain directory offset either").offset(at),
        );
    }
    Ok(h)
}

impl SparseExtent {
    /// Open the extent in `file`, whose first bytes decide the format.
    pub fn open(file: Arc<dyn Storage>, name: &str, writable: bool) -> Result<Self> {
        let len = file.len().map_err(|e| crate::error::io(name, e))?;
        if len < 512 {
            return Err(crate::error::malformed(
                name,
                format!("only {len} bytes, too short for a sparse header"),
            ));
        }
        let mut s0 = [0u8; 512];
        rd(&*file, name, &mut s0, 0)?;
        let magic32 = u32::from_le_bytes(s0[0..4].try_into().expect("4"));
        let magic64 = u64::from_le_bytes(s0[0..8].try_into().expect("8"));
        // Each header starts the file.
        let bad =
            |e: super::header::HeaderError| crate::error::malformed(name, e.to_string()).offset(0);
        let header = if magic32 == KDMV_MAGIC {
            Header::Kdmv(kdmv_header(&*file, name, len, &s0)?)
        } else if magic32 == COWD_MAGIC {
            let mut b = [0u8; CowdHeader::BYTES];
            rd(&*file, name, &mut b, 0)?;
            Header::Cowd(CowdHeader::decode(&b).map_err(bad)?)
        } else if magic64 == SESPARSE_MAGIC {
            Header::SeSparse(SeSparseHeader::decode(&s0).map_err(bad)?)
        } else {
            return Err(crate::error::malformed(
                name,
                format!("unknown sparse extent magic 0x{magic32:08x}"),
            )
            .offset(0));
        };
        let geometry =
            Geometry::of(&header).map_err(|e| crate::error::malformed(name, e.to_string()))?;
        let src = ExtentFile {
            file,
            name: name.to_string(),
            len_bytes: len,
            writable,
        };
        open_extent(src, geometry, header)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn format(&self) -> SparseFormat {
        self.header.format()
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// Extent size in sectors (from its own header).
    pub fn capacity_sectors(&self) -> u64 {
        self.geometry.capacity_sectors
    }

    pub fn writable(&self) -> bool {
        self.writable
    }

    pub fn compressed(&self) -> bool {
        self.header.compressed()
    }

    pub fn grain_bytes(&self) -> u64 {
        self.geometry.grain_bytes()
    }

    /// Number of grains the extent addresses.
    pub fn grains(&self) -> u64 {
        self.geometry.grains()
    }

    /// Whether a whole grain can be marked zero without writing data.
    pub fn has_zero_entries(&self) -> bool {
        self.header.has_zero_entries()
    }

    pub fn kdmv_header(&self) -> Option<KdmvHeader> {
        match self.header {
            Header::Kdmv(h) => Some(h),
            _ => None,
        }
    }

    pub fn file(&self) -> &Arc<dyn Storage> {
        &self.file
    }

    pub(super) fn err(&self, what: impl Into<String>) -> VmdkError {
        crate::error::malformed(&self.name, what)
    }

    pub(super) fn readonly(&self) -> VmdkError {
        let why = if self.compressed() {
            "streamOptimized (compressed) extents are read-only; export a new one instead"
        } else {
            "extent is open read-only"
        };
        crate::error::new(VmdkErrorKind::ReadOnly, &self.name, why)
    }

    /// Byte offset of grain table `l1` (GD value `raw`), if it exists.
    pub(super) fn gt_offset(&self, raw: u64, l1: u64) -> Result<Option<u64>> {
        entry::gt_offset(&self.header, raw, l1).map_err(|e| self.err(e.to_string()))
    }

    pub(super) fn gt(&self, l1: u64) -> Result<Option<(u64, Arc<Vec<u64>>)>> {
        let raw = *self
            .gd
            .read()
            .get(l1 as usize)
            .ok_or_else(|| self.err(format!("grain directory has no entry {l1}")))?;
        let Some(off) = self.gt_offset(raw, l1)? else {
            return Ok(None);
        };
        if let Some(t) = self.tables.get(l1) {
            return Ok(Some((off, t)));
        }
        let g = &self.geometry;
        let t = read_table(&*self.file, &self.name, off, g.gt_entries, g.entry_bytes)?;
        Ok(Some((off, self.tables.insert_read(l1, Arc::new(t)))))
    }

    /// Decode one raw entry.
    pub fn decode(&self, raw: u64) -> Result<Gte> {
        entry::decode(&self.header, raw).map_err(|e| self.err(e.to_string()))
    }

    /// The entry of grain `grain` (an index in grain units from sector 0).
    pub fn lookup(&self, grain: u64) -> Result<Gte> {
        Ok(self.lookup_span(grain)?.0)
    }

    /// The entry of `grain` and for how many grains from it on the entry
    /// is known to be the same without more lookups: the rest of the grain
    /// table when the table does not exist, else 1. Lets status queries
    /// skip empty tables instead of walking them grain by grain.
    pub fn lookup_span(&self, grain: u64) -> Result<(Gte, u64)> {
        let n = self.geometry.gt_entries;
        let (l1, l2) = (grain / n, grain % n);
        match self.gt(l1)? {
            None => Ok((Gte::Unalloc, n - l2)),
            Some((_, t)) => Ok((self.decode(t[l2 as usize])?, 1)),
        }
    }

    /// Raw entry, for check and shrink.
    pub(super) fn raw_entry(&self, grain: u64) -> Result<u64> {
        let n = self.geometry.gt_entries;
        Ok(match self.gt(grain / n)? {
            None => 0,
            Some((_, t)) => t[(grain % n) as usize],
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
            return Err(crate::error::unsupported(
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
}
