//! A VMDK snapshot chain opened as one block device.
//!
//! Link 0 is the file that was opened (the running delta); link `i+1` is the
//! parent named by link `i`'s `parentFileNameHint`. Reads resolve each grain
//! in the top link and fall through unallocated grains to the parent; zero
//! and unmapped grains stop the fall-through. Writes go to the top link only:
//! a write that covers part of a grain the top link does not hold copies the
//! rest of the grain from below first (read-modify-write).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};
use strata_block::{
    BlockDevice, BlockResult, ErrorKind, Extent, Fill, ReadFill, ZeroOptions, SECTOR_BYTES,
};
use strata_storage::{Backend, Storage};

use crate::descriptor::{Access, Descriptor, ExtentType, NO_PARENT_CID};
use crate::error::{Result, VmdkErrorKind};
use crate::lock::LockingBackend;
mod maintain;

use crate::sparse::{
    Gte, KdmvHeader, SparseExtent, SparseFormat, COWD_MAGIC, KDMV_MAGIC, SECTOR, SESPARSE_MAGIC,
};

/// Chains deeper than this are refused (a loop the name check missed, or abuse).
pub const DEFAULT_MAX_DEPTH: usize = 255;
/// Embedded descriptors larger than this are refused.
const MAX_EMBEDDED_DESCRIPTOR: u64 = 1 << 20;

#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Open the top link for writing (parents are always read-only).
    pub writable: bool,
    pub max_depth: usize,
    /// Lock the files (see `crate::lock`): exclusive on a writable top
    /// link's, shared on the rest. Off only for inspection that must work
    /// while a server writes the files (`vmdk info`, `vmdk check`).
    pub lock: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            writable: false,
            max_depth: DEFAULT_MAX_DEPTH,
            lock: true,
        }
    }
}

/// How one extent of a link is stored.
pub enum ExtentImpl {
    Flat {
        file: Arc<dyn Storage>,
        name: String,
        offset: u64,
    },
    Zero,
    Sparse(Arc<SparseExtent>),
}

pub struct LinkExtent {
    /// First sector of the extent in the link's address space.
    pub start: u64,
    pub sectors: u64,
    pub imp: ExtentImpl,
    pub line_type: ExtentType,
}

/// Where the descriptor text of a link lives, for CID updates.
enum DescriptorHome {
    /// A separate text file.
    File(Arc<dyn Storage>),
    /// Embedded in a sparse extent at this byte offset, this many bytes.
    Embedded(Arc<dyn Storage>, u64, u64),
    /// Synthesised (a bare COWD/SEsparse/KDMV file without a descriptor).
    None,
}

/// One file of the chain.
pub struct Link {
    /// Name in the backend (a path relative to the opened file's folder).
    pub name: String,
    pub descriptor: Descriptor,
    text: Mutex<String>,
    home: DescriptorHome,
    pub extents: Vec<LinkExtent>,
    pub sectors: u64,
    pub writable: bool,
}

impl Link {
    pub fn create_type(&self) -> &str {
        &self.descriptor.create_type
    }

    /// The sparse extents of this link.
    pub fn sparse(&self) -> impl Iterator<Item = &Arc<SparseExtent>> {
        self.extents.iter().filter_map(|e| match &e.imp {
            ExtentImpl::Sparse(s) => Some(s),
            _ => None,
        })
    }

    fn extent_at(&self, sector: u64) -> Option<&LinkExtent> {
        let i = self
            .extents
            .partition_point(|e| e.start + e.sectors <= sector);
        self.extents.get(i).filter(|e| e.start <= sector)
    }

    /// The extent holding byte `cur`, the offset of `cur` in it, and how
    /// many of the `remaining` bytes from `cur` it holds.
    fn piece(&self, cur: u64, remaining: u64) -> Result<(&LinkExtent, u64, u64)> {
        let ext = self
            .extent_at(cur / SECTOR)
            .ok_or_else(|| crate::error::malformed(&self.name, "extent map has a gap"))?;
        let n = ((ext.start + ext.sectors) * SECTOR - cur).min(remaining);
        Ok((ext, cur - ext.start * SECTOR, n))
    }

    fn sync(&self) -> Result<()> {
        for e in &self.extents {
            match &e.imp {
                ExtentImpl::Flat { file, name, .. } => {
                    file.sync().map_err(|x| crate::error::io(name, x))?
                }
                ExtentImpl::Sparse(s) => s.sync()?,
                ExtentImpl::Zero => {}
            }
        }
        if let DescriptorHome::File(f) = &self.home {
            f.sync().map_err(|x| crate::error::io(&self.name, x))?;
        }
        Ok(())
    }
}

/// The state of a byte range as the chain resolves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeState {
    /// No link holds it: reads zeros (or the parent beyond the chain).
    Unallocated,
    /// A link says it reads as zeros.
    Zero,
    /// A link holds data for it.
    Data,
}

/// While clients send requests, an online shrink pauses this many times as
/// long as each step took (clients get at least 8/9 of the time).
const SHRINK_PAUSE_FACTOR: u32 = 8;

/// An opened chain. Implements [`BlockDevice`].
pub struct VmdkImage {
    pub links: Vec<Link>,
    backend: Arc<dyn Backend>,
    writable: bool,
    /// I/O takes it shared; shrink (which moves grains) takes it exclusive.
    io: RwLock<()>,
    cid_bumped: AtomicBool,
    /// An online shrink is running (one at a time).
    shrinking: AtomicBool,
    /// Client requests so far (reads, writes, zeroes, unmaps): an online
    /// shrink paces itself only while they come.
    requests: AtomicU64,
}

fn normalize(path: &str) -> String {
    let abs = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|l| *l != "..") {
                    parts.pop();
                } else if !abs {
                    parts.push("..");
                }
            }
            p => parts.push(p),
        }
    }
    let j = parts.join("/");
    if abs {
        format!("/{j}")
    } else {
        j
    }
}

/// `hint` as seen from the folder of `child`.
fn sibling(child: &str, hint: &str) -> String {
    if hint.starts_with('/') {
        return normalize(hint);
    }
    match child.rfind('/') {
        Some(i) => normalize(&format!("{}/{hint}", &child[..i])),
        None => normalize(hint),
    }
}

fn new_cid(old: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = t ^ ((std::process::id() as u64) << 32) ^ old as u64;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    let c = x as u32;
    if c == old || c == NO_PARENT_CID {
        c.wrapping_add(1)
    } else {
        c
    }
}

impl VmdkImage {
    /// Open `path` (a descriptor or a bare sparse file) and its parents.
    /// An error names the file it concerns by its absolute path.
    pub fn open(path: &std::path::Path, opts: &OpenOptions) -> Result<Self> {
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let name = path
            .file_name()
            .ok_or_else(|| {
                crate::error::new(
                    VmdkErrorKind::InvalidArgument,
                    path.display().to_string(),
                    "not a file name",
                )
                .op("open")
            })?
            .to_string_lossy()
            .to_string();
        // Absolute, so that the place of an error is the file's path
        // whatever the caller's working directory.
        let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        let backend: Arc<dyn Backend> = Arc::new(strata_storage::FileBackend::new(dir));
        Self::open_in(backend, &name, opts)
    }

    /// Open `name` in `backend` (parents are looked up in the same backend).
    /// An error names the file it concerns in the backend
    /// (`describe()/NAME`), with op "open".
    pub fn open_in(backend: Arc<dyn Backend>, name: &str, opts: &OpenOptions) -> Result<Self> {
        let folder = backend.describe();
        Self::open_chain(backend, name, opts)
            .map_err(|e| crate::error::in_folder(e, &folder, "open"))
    }

    /// [`Self::open_in`], its errors naming files by their names in the
    /// backend.
    fn open_chain(backend: Arc<dyn Backend>, name: &str, opts: &OpenOptions) -> Result<Self> {
        let files: Arc<dyn Backend> = if opts.lock {
            Arc::new(LockingBackend::new(backend.clone()))
        } else {
            backend.clone()
        };
        let mut links = Vec::new();
        let mut seen = HashSet::new();
        let mut next = Some((normalize(name), None::<(String, u32)>));
        while let Some((n, child)) = next.take() {
            if !seen.insert(n.clone()) {
                return Err(crate::error::chain(
                    &n,
                    "the chain loops back to this file (a cycle of parentFileNameHint)",
                ));
            }
            if links.len() >= opts.max_depth {
                return Err(crate::error::chain(
                    &n,
                    format!(
                        "chain is deeper than {} links; refusing to follow it further",
                        opts.max_depth
                    ),
                ));
            }
            let writable = opts.writable && links.is_empty();
            let link = Self::open_link(&*files, &n, writable).map_err(|e| match &child {
                Some((c, _)) if e.kind == VmdkErrorKind::Io => {
                    crate::error::chain(c, format!("cannot open its parent {n}: {}", e.message))
                }
                _ => e,
            })?;
            if let Some((c, want)) = &child {
                if link.descriptor.cid != *want {
                    return Err(crate::error::chain(
                        c,
                        format!(
                            "parentCID is {want:08x} but its parent {n} has CID {:08x}: the parent changed after this delta was made",
                            link.descriptor.cid
                        ),
                    ));
                }
            }
            if link.descriptor.parent_cid != NO_PARENT_CID {
                let hint = link.descriptor.parent_hint.clone().ok_or_else(|| {
                    crate::error::chain(
                        &n,
                        "has a parentCID but no parentFileNameHint to find the parent by",
                    )
                })?;
                next = Some((
                    sibling(&n, &hint),
                    Some((n.clone(), link.descriptor.parent_cid)),
                ));
            }
            links.push(link);
        }
        Ok(VmdkImage {
            links,
            backend,
            writable: opts.writable,
            io: RwLock::new(()),
            cid_bumped: AtomicBool::new(false),
            shrinking: AtomicBool::new(false),
            requests: AtomicU64::new(0),
        })
    }

    fn open_file(backend: &dyn Backend, name: &str, writable: bool) -> Result<Arc<dyn Storage>> {
        if writable {
            backend.open(name, false)
        } else {
            backend.open_read_only(name)
        }
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock => crate::error::in_use(name, writable),
            _ => crate::error::io(name, e),
        })
    }

    #[expect(clippy::too_many_lines)]
    fn open_link(backend: &dyn Backend, name: &str, writable: bool) -> Result<Link> {
        let f = Self::open_file(backend, name, writable)?;
        let len = f.len().map_err(|e| crate::error::io(name, e))?;
        let mut head = [0u8; 512];
        f.read_at(&mut head, 0)
            .map_err(|e| crate::error::io(name, e))?;
        let m32 = u32::from_le_bytes(head[0..4].try_into().expect("4"));
        let m64 = u64::from_le_bytes(head[0..8].try_into().expect("8"));
        if m32 == KDMV_MAGIC || m32 == COWD_MAGIC || m64 == SESPARSE_MAGIC {
            let sp = Arc::new(SparseExtent::open(f.clone(), name, writable)?);
            let (descriptor, text, home) = match sp.kdmv_header() {
                Some(KdmvHeader {
                    desc_offset,
                    desc_size,
                    ..
                }) if desc_offset != 0 && desc_size != 0 => {
                    let bytes = desc_size
                        .saturating_mul(SECTOR)
                        .min(MAX_EMBEDDED_DESCRIPTOR);
                    let off = desc_offset.saturating_mul(SECTOR);
                    if off >= len {
                        return Err(crate::error::malformed(
                            name,
                            "embedded descriptor lies past the end of the file",
                        )
                        .offset(off));
                    }
                    let mut b = vec![0u8; bytes as usize];
                    f.read_at(&mut b, off)
                        .map_err(|e| crate::error::io(name, e))?;
                    let d = Descriptor::parse(&b).map_err(|e| {
                        crate::error::malformed(name, format!("embedded descriptor: {e}"))
                            .offset(off)
                    })?;
                    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
                    let text = String::from_utf8_lossy(&b[..end]).to_string();
                    (d, text, DescriptorHome::Embedded(f.clone(), off, bytes))
                }
                _ => (
                    Self::synthetic(name, &sp),
                    String::new(),
                    DescriptorHome::None,
                ),
            };
            let sectors = sp.capacity_sectors();
            return Ok(Link {
                name: name.to_string(),
                descriptor,
                text: Mutex::new(text),
                home,
                extents: vec![LinkExtent {
                    start: 0,
                    sectors,
                    imp: ExtentImpl::Sparse(sp),
                    line_type: ExtentType::Sparse,
                }],
                sectors,
                writable,
            });
        }
        if len > crate::descriptor::MAX_DESCRIPTOR_BYTES as u64 {
            return Err(crate::error::malformed(
                name,
                "not a VMDK: no sparse magic, and too large to be a text descriptor",
            ));
        }
        let mut b = vec![0u8; len as usize];
        f.read_at(&mut b, 0)
            .map_err(|e| crate::error::io(name, e))?;
        let descriptor = Descriptor::parse(&b)
            .map_err(|e| crate::error::malformed(name, format!("not a VMDK descriptor: {e}")))?;
        let text = String::from_utf8_lossy(&b).to_string();
        let mut extents = Vec::new();
        let mut start = 0u64;
        let mut link_writable = writable;
        for line in &descriptor.extents {
            if line.access == Access::NoAccess {
                return Err(crate::error::unsupported(
                    name,
                    format!("extent {:?} is NOACCESS", line.file),
                ));
            }
            if line.access == Access::RdOnly && writable {
                link_writable = false;
            }
            let ew = writable && line.access == Access::Rw;
            let file_name = if line.file.is_empty() {
                String::new()
            } else {
                sibling(name, &line.file)
            };
            let imp = match line.kind {
                ExtentType::Zero => ExtentImpl::Zero,
                ExtentType::Flat | ExtentType::Vmfs => {
                    let ef = Self::open_file(backend, &file_name, ew)?;
                    ExtentImpl::Flat {
                        file: ef,
                        name: file_name.clone(),
                        // Bounded like disk sizes, so offset + position never overflows.
                        offset: Some(line.offset)
                            .filter(|&o| o <= 1u64 << 48)
                            .map(|o| o * SECTOR)
                            .ok_or_else(|| {
                                crate::error::malformed(
                                    name,
                                    format!(
                                        "extent {:?}: offset of {} sectors is impossible",
                                        line.file, line.offset
                                    ),
                                )
                            })?,
                    }
                }
                ExtentType::Sparse | ExtentType::VmfsSparse | ExtentType::SeSparse => {
                    let ef = Self::open_file(backend, &file_name, ew)?;
                    let sp = SparseExtent::open(ef, &file_name, ew)?;
                    // QEMU accepts KDMV or COWD for both SPARSE and VMFSSPARSE.
                    let ok = match line.kind {
                        ExtentType::SeSparse => sp.format() == SparseFormat::SeSparse,
                        _ => sp.format() != SparseFormat::SeSparse,
                    };
                    if !ok {
                        return Err(crate::error::malformed(
                            name,
                            format!(
                                "extent {:?} is declared {} but the file is {}",
                                line.file,
                                line.kind.name(),
                                sp.format().name()
                            ),
                        ));
                    }
                    ExtentImpl::Sparse(Arc::new(sp))
                }
                ExtentType::VmfsRdm | ExtentType::VmfsRaw => {
                    return Err(crate::error::unsupported(
                        name,
                        format!(
                            "extent {:?} is a raw device mapping ({}), which strata does not open",
                            line.file,
                            line.kind.name()
                        ),
                    ))
                }
            };
            extents.push(LinkExtent {
                start,
                sectors: line.sectors,
                imp,
                line_type: line.kind,
            });
            start = start
                .checked_add(line.sectors)
                .filter(|&s| s <= 1u64 << 48)
                .ok_or_else(|| {
                    crate::error::malformed(name, "extents add up to an impossible size")
                })?;
        }
        Ok(Link {
            name: name.to_string(),
            descriptor,
            text: Mutex::new(text),
            home: DescriptorHome::File(f),
            extents,
            sectors: start,
            writable: link_writable,
        })
    }

    fn synthetic(name: &str, sp: &SparseExtent) -> Descriptor {
        let create_type = match sp.format() {
            SparseFormat::Kdmv if sp.compressed() => "streamOptimized",
            SparseFormat::Kdmv => "monolithicSparse",
            SparseFormat::Cowd => "vmfsSparse",
            SparseFormat::SeSparse => "seSparse",
        };
        Descriptor {
            version: 1,
            cid: 0,
            parent_cid: NO_PARENT_CID,
            create_type: create_type.into(),
            parent_hint: None,
            extents: vec![crate::descriptor::ExtentLine {
                access: Access::Rw,
                sectors: sp.capacity_sectors(),
                kind: ExtentType::Sparse,
                file: name.to_string(),
                offset: 0,
            }],
            ddb: Vec::new(),
        }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    pub fn size_sectors(&self) -> u64 {
        self.links[0].sectors
    }

    fn top_writable(&self) -> BlockResult<()> {
        if !self.writable || !self.links[0].writable {
            return Err(crate::error::new(
                ErrorKind::ReadOnly,
                &self.links[0].name,
                "open read-only",
            ));
        }
        Ok(())
    }

    /// Read `buf` at byte `off` as link `level` sees it, appending to
    /// `fill` how each run was filled: what no link stores (below the
    /// bottom link, past a link's end, ZERO extents, zero and unmapped
    /// grains) is `Zeros`.
    fn read_level(
        &self,
        level: usize,
        buf: &mut [u8],
        off: u64,
        fill: &mut ReadFill,
    ) -> Result<()> {
        let Some(link) = self.links.get(level) else {
            buf.fill(0);
            fill.push(buf.len() as u64, Fill::Zeros);
            return Ok(());
        };
        let end_link = link.sectors * SECTOR;
        let mut pos = 0usize;
        while pos < buf.len() {
            let cur = off + pos as u64;
            if cur >= end_link {
                buf[pos..].fill(0);
                fill.push((buf.len() - pos) as u64, Fill::Zeros);
                break;
            }
            let (ext, ext_off, n) = link.piece(cur, (buf.len() - pos) as u64)?;
            let n = n as usize;
            let piece = &mut buf[pos..pos + n];
            match &ext.imp {
                ExtentImpl::Zero => {
                    piece.fill(0);
                    fill.push(n as u64, Fill::Zeros);
                }
                ExtentImpl::Flat { file, name, offset } => {
                    file.read_at(piece, offset + ext_off)
                        .map_err(|e| crate::error::io(name, e))?;
                    fill.push(n as u64, Fill::Data);
                }
                ExtentImpl::Sparse(s) => {
                    let at = InExtent {
                        s,
                        ext_off,
                        virt: cur,
                    };
                    self.read_sparse(level, at, piece, fill)?
                }
            }
            pos += n;
        }
        Ok(())
    }

    /// Read from a sparse extent, merging runs of grains that fall through
    /// or sit next to each other in the file into single reads.
    fn read_sparse(
        &self,
        level: usize,
        at: InExtent,
        buf: &mut [u8],
        fill: &mut ReadFill,
    ) -> Result<()> {
        let InExtent { s, ext_off, virt } = at;
        let gb = s.grain_bytes();
        let cap = s.capacity_sectors() * SECTOR;
        let mut pos = 0usize;
        while pos < buf.len() {
            let o = ext_off + pos as u64;
            let first = if o >= cap {
                Gte::Unalloc
            } else {
                s.lookup(o / gb)?
            };
            // Extend the run while the next grain continues it.
            let mut n = (gb - o % gb).min((buf.len() - pos) as u64) as usize;
            while pos + n < buf.len() {
                let o2 = ext_off + (pos + n) as u64;
                let next = if o2 >= cap {
                    Gte::Unalloc
                } else {
                    s.lookup(o2 / gb)?
                };
                let continues = match (first, next) {
                    (Gte::Unalloc, Gte::Unalloc) => true,
                    (a, b) if a.reads_zero() && b.reads_zero() => true,
                    (Gte::Data(a), Gte::Data(b)) => b == a + o % gb + (o2 - o),
                    _ => false,
                };
                if !continues {
                    break;
                }
                n += gb.min((buf.len() - pos - n) as u64) as usize;
            }
            let piece = &mut buf[pos..pos + n];
            match first {
                Gte::Unalloc => self.read_level(level + 1, piece, virt + pos as u64, fill)?,
                Gte::Zero | Gte::Unmapped => {
                    piece.fill(0);
                    fill.push(n as u64, Fill::Zeros);
                }
                g => {
                    s.read_grain(g, o % gb, piece)?;
                    fill.push(n as u64, Fill::Data);
                }
            }
            pos += n;
        }
        Ok(())
    }

    /// How `[off, off+len)` resolves, as runs; stops after `max_runs`.
    pub fn status(&self, off: u64, len: u64, max_runs: usize) -> Result<Vec<(u64, RangeState)>> {
        let mut runs = Runs::new(max_runs, true);
        self.status_level(0, off, len, &mut runs)?;
        Ok(runs.out)
    }

    /// What link `level` alone holds for `[off, off+len)`, as runs:
    /// `Unallocated` where it defers to its parent. Stops after `max_runs`.
    pub fn link_status(
        &self,
        level: usize,
        off: u64,
        len: u64,
        max_runs: usize,
    ) -> Result<Vec<(u64, RangeState)>> {
        let mut runs = Runs::new(max_runs, false);
        self.status_level(level, off, len, &mut runs)?;
        Ok(runs.out)
    }

    /// Read what link `level` shows at `off` (falling through to its parents).
    pub fn read_link(&self, level: usize, buf: &mut [u8], off: u64) -> Result<()> {
        let _g = self.io.read();
        self.read_level(level, buf, off, &mut ReadFill::new())
    }

    fn push(out: &mut Vec<(u64, RangeState)>, n: u64, st: RangeState) {
        match out.last_mut() {
            Some((l, s)) if *s == st => *l += n,
            _ => out.push((n, st)),
        }
    }

    /// Add to `runs` how `[off, off+len)` resolves from link `level`; how
    /// many bytes it covered before `runs` was full.
    fn status_level(&self, level: usize, off: u64, len: u64, runs: &mut Runs) -> Result<u64> {
        let Some(link) = self.links.get(level) else {
            Self::push(&mut runs.out, len, RangeState::Unallocated);
            return Ok(len);
        };
        let end_link = link.sectors * SECTOR;
        let mut pos = 0u64;
        while pos < len && runs.out.len() < runs.max {
            let cur = off + pos;
            if cur >= end_link {
                Self::push(&mut runs.out, len - pos, RangeState::Unallocated);
                return Ok(len);
            }
            let (ext, ext_off, n) = link.piece(cur, len - pos)?;
            match &ext.imp {
                ExtentImpl::Zero => Self::push(&mut runs.out, n, RangeState::Zero),
                ExtentImpl::Flat { .. } => Self::push(&mut runs.out, n, RangeState::Data),
                ExtentImpl::Sparse(s) => {
                    let gb = s.grain_bytes();
                    let cap = s.capacity_sectors() * SECTOR;
                    let mut p = 0u64;
                    while p < n && runs.out.len() < runs.max {
                        let o = ext_off + p;
                        // Past the extent's capacity, or in a missing
                        // table: one step for the whole span.
                        let (g, span) = if o >= cap {
                            (Gte::Unalloc, u64::MAX)
                        } else {
                            s.lookup_span(o / gb)?
                        };
                        let m = span.saturating_mul(gb).saturating_sub(o % gb).min(n - p);
                        match g {
                            Gte::Unalloc if !runs.recurse => {
                                Self::push(&mut runs.out, m, RangeState::Unallocated)
                            }
                            Gte::Unalloc => {
                                let done = self.status_level(level + 1, cur + p, m, runs)?;
                                if done < m {
                                    return Ok(pos + p + done);
                                }
                            }
                            Gte::Zero | Gte::Unmapped => {
                                Self::push(&mut runs.out, m, RangeState::Zero)
                            }
                            _ => Self::push(&mut runs.out, m, RangeState::Data),
                        }
                        p += m;
                    }
                    if p < n {
                        return Ok(pos + p);
                    }
                }
            }
            pos += n;
        }
        Ok(pos)
    }

    /// Give the top link a new CID on its first write, as VMware and QEMU
    /// do, so children made from the old content notice the change.
    fn bump_cid(&self) -> Result<()> {
        if self.cid_bumped.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let top = &self.links[0];
        let mut text = top.text.lock();
        let (file, off, room) = match &top.home {
            DescriptorHome::File(f) => (f.clone(), 0u64, u64::MAX),
            DescriptorHome::Embedded(f, off, room) => (f.clone(), *off, *room),
            DescriptorHome::None => return Ok(()),
        };
        let cid = new_cid(top.descriptor.cid);
        let mut replaced = false;
        let new_text: Vec<String> = text
            .split('\n')
            .map(|l| {
                let t = l.trim_start();
                if !replaced && t.starts_with("CID") && t[3..].trim_start().starts_with('=') {
                    replaced = true;
                    format!("CID={cid:08x}")
                } else {
                    l.to_string()
                }
            })
            .collect();
        let mut new_text = new_text.join("\n");
        if !replaced || new_text.len() as u64 > room {
            return Ok(());
        }
        let mut bytes = new_text.clone().into_bytes();
        if let DescriptorHome::Embedded(..) = top.home {
            bytes.resize(room as usize, 0);
        }
        file.write_at(&bytes, off)
            .map_err(|e| crate::error::io(&top.name, e))?;
        if let DescriptorHome::File(_) = top.home {
            file.set_len(bytes.len() as u64)
                .map_err(|e| crate::error::io(&top.name, e))?;
        }
        std::mem::swap(&mut *text, &mut new_text);
        Ok(())
    }

    /// The CID the top link has now (after a first write it is a new one).
    pub fn current_cid(&self) -> u32 {
        let text = self.links[0].text.lock();
        Descriptor::parse(text.as_bytes())
            .map(|d| d.cid)
            .unwrap_or(self.links[0].descriptor.cid)
    }

    fn write_top(&self, buf: &[u8], off: u64) -> Result<()> {
        let link = &self.links[0];
        let mut pos = 0usize;
        while pos < buf.len() {
            let cur = off + pos as u64;
            let (ext, ext_off, n) = link.piece(cur, (buf.len() - pos) as u64)?;
            let n = n as usize;
            let piece = &buf[pos..pos + n];
            match &ext.imp {
                ExtentImpl::Zero => {
                    return Err(crate::error::new(
                        VmdkErrorKind::ReadOnly,
                        &link.name,
                        format!(
                            "sectors {}.. are a ZERO extent, which cannot hold data",
                            ext.start
                        ),
                    ))
                }
                ExtentImpl::Flat { file, name, offset } => {
                    file.write_at(piece, offset + ext_off)
                        .map_err(|e| crate::error::io(name, e))?
                }
                ExtentImpl::Sparse(s) => {
                    let at = InExtent {
                        s,
                        ext_off,
                        virt: cur,
                    };
                    self.write_sparse(at, piece, None)?
                }
            }
            pos += n;
        }
        Ok(())
    }

    /// Write `buf` (or zeros of its length when `zeros` says so) into a
    /// sparse extent of the top link.
    fn write_sparse(&self, at: InExtent, buf: &[u8], zero_len: Option<u64>) -> Result<()> {
        let InExtent { s, ext_off, virt } = at;
        let gb = s.grain_bytes();
        if gb > crate::sparse::MAX_BUFFERED_GRAIN {
            return Err(crate::error::unsupported(
                s.name(),
                format!("writes to grains of {gb} bytes"),
            ));
        }
        let total = zero_len.unwrap_or(buf.len() as u64);
        let cap = s.capacity_sectors() * SECTOR;
        let mut pos = 0u64;
        while pos < total {
            let o = ext_off + pos;
            if o >= cap {
                return Err(crate::error::new(
                    VmdkErrorKind::InvalidArgument,
                    s.name(),
                    format!("byte {o} is past the extent's capacity of {cap} bytes"),
                ));
            }
            let within = o % gb;
            let m = (gb - within).min(total - pos);
            let grain = o / gb;
            let zeros;
            let piece: &[u8] = match zero_len {
                Some(_) => {
                    zeros = vec![0u8; m as usize];
                    &zeros
                }
                None => &buf[pos as usize..(pos + m) as usize],
            };
            match s.lookup(grain)? {
                Gte::Data(d) => s.write_in_place(d + within, piece)?,
                _ => {
                    let grain_virt = virt + pos - within;
                    s.with_grain(grain, |tx| match tx.current {
                        Gte::Data(d) => s.write_in_place(d + within, piece),
                        cur => {
                            let mut full = vec![0u8; gb as usize];
                            if m < gb {
                                match cur {
                                    Gte::Unalloc => self.read_level(
                                        1,
                                        &mut full,
                                        grain_virt,
                                        &mut ReadFill::new(),
                                    )?,
                                    Gte::Compressed(_) => s.read_grain(cur, 0, &mut full)?,
                                    _ => {}
                                }
                            }
                            full[within as usize..(within + m) as usize].copy_from_slice(piece);
                            tx.allocate(&full)
                        }
                    })?
                }
            }
            pos += m;
        }
        Ok(())
    }

    /// Make `[off, off+len)` of the top link read as zeros; `unmap` marks
    /// SEsparse grains unmapped (0x1) rather than zero (0x2).
    fn zero_top(&self, off: u64, len: u64, unmap: bool, fast_only: bool) -> Result<()> {
        let link = &self.links[0];
        let has_parent = self.links.len() > 1;
        let mut pos = 0u64;
        while pos < len {
            let cur = off + pos;
            let (ext, ext_off, n) = link.piece(cur, len - pos)?;
            match &ext.imp {
                ExtentImpl::Zero => {}
                ExtentImpl::Flat { file, name, offset } => file
                    .punch_hole(offset + ext_off, n)
                    .map_err(|e| crate::error::io(name, e))?,
                ExtentImpl::Sparse(s) => {
                    let gb = s.grain_bytes();
                    let mut p = 0u64;
                    while p < n {
                        let o = ext_off + p;
                        let within = o % gb;
                        let m = (gb - within).min(n - p);
                        let grain = o / gb;
                        let whole = within == 0 && m == gb;
                        let cur_g = s.lookup(grain)?;
                        let already = cur_g.reads_zero() || (cur_g == Gte::Unalloc && !has_parent);
                        if already && !(unmap && whole && cur_g == Gte::Unalloc && has_parent) {
                            // reads zero already; nothing to do
                        } else if whole && s.has_zero_entries() {
                            let target = if unmap && s.format() == SparseFormat::SeSparse {
                                Gte::Unmapped
                            } else {
                                Gte::Zero
                            };
                            s.with_grain(grain, |tx| {
                                if tx.current == Gte::Zero && target == Gte::Unmapped {
                                    return Ok(()); // unmap leaves zero grains as they are
                                }
                                tx.set(target)
                            })?;
                        } else if fast_only {
                            return Err(crate::error::unsupported(
                                s.name(),
                                "zeroing these grains needs data writes",
                            ));
                        } else {
                            let at = InExtent {
                                s,
                                ext_off: o,
                                virt: cur + p,
                            };
                            self.write_sparse(at, &[], Some(m))?;
                        }
                        p += m;
                    }
                }
            }
            pos += n;
        }
        Ok(())
    }

    /// Flush every file of the top link.
    pub fn sync(&self) -> Result<()> {
        self.links[0].sync()
    }
}

impl BlockDevice for VmdkImage {
    fn size_bytes(&self) -> u64 {
        self.size_sectors() * SECTOR
    }

    fn read_only(&self) -> bool {
        !self.writable || !self.links[0].writable
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<ReadFill> {
        strata_block::check_range(offset, buf.len() as u64, self.size_bytes())?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let _g = self.io.read();
        let mut fill = ReadFill::new();
        self.read_level(0, buf, offset, &mut fill)?;
        Ok(fill)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BlockResult<()> {
        strata_block::check_range(offset, buf.len() as u64, self.size_bytes())?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.top_writable()?;
        let _g = self.io.read();
        self.bump_cid()?;
        self.write_top(buf, offset)?;
        if fua {
            self.sync()?;
        }
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        if self.read_only() {
            return Ok(());
        }
        self.sync()
    }

    fn unmap(&self, offset: u64, len: u64) -> BlockResult<()> {
        strata_block::check_range(offset, len, self.size_bytes())?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.top_writable()?;
        let _g = self.io.read();
        self.bump_cid()?;
        self.zero_top(offset, len, true, false)
    }

    fn write_zeroes(&self, offset: u64, len: u64, opts: ZeroOptions) -> BlockResult<()> {
        strata_block::check_range(offset, len, self.size_bytes())?;
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.top_writable()?;
        let _g = self.io.read();
        self.bump_cid()?;
        self.zero_top(offset, len, false, opts.fast_only)?;
        if opts.fua {
            self.sync()?;
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        strata_block::check_range(offset, len, self.size_bytes())?;
        let _g = self.io.read();
        let runs = self.status(offset, len, 4096)?;
        Ok(runs
            .into_iter()
            .map(|(n, st)| Extent {
                len_bytes: n,
                hole: st != RangeState::Data,
                zero: st != RangeState::Data,
            })
            .collect())
    }

    fn preferred_block_bytes(&self) -> u32 {
        self.links[0]
            .sparse()
            .map(|s| s.grain_bytes())
            .max()
            .unwrap_or(SECTOR_BYTES)
            .min(1 << 20) as u32
    }
}

/// Where a piece of a request falls in a sparse extent: the extent, the
/// offset in it, and the piece's virtual offset.
#[derive(Clone, Copy)]
struct InExtent<'a> {
    s: &'a SparseExtent,
    ext_off: u64,
    virt: u64,
}

/// A block-status answer being built: its runs, how many it may have,
/// and whether what a link does not hold is looked up in its parents.
struct Runs {
    out: Vec<(u64, RangeState)>,
    max: usize,
    recurse: bool,
}

impl Runs {
    fn new(max: usize, recurse: bool) -> Runs {
        Runs {
            out: Vec::new(),
            max,
            recurse,
        }
    }
}
