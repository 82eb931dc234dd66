//! Creating VMDK images for export: the files, descriptors and layouts
//! qemu-img 7.2 and VMware read, with every quirk of docs/FORMAT.md.
//!
//! [`create_image`] makes an empty writable image (monolithicSparse,
//! monolithicFlat, vmfsSparse, seSparse), optionally a delta on a parent;
//! the caller fills it through [`VmdkImage`]'s block-device interface.
//! streamOptimized is written front to back by [`StreamWriter`].

use std::io::Write as _;
use std::sync::Arc;

use strata_api::Subformat;
use strata_storage::{Backend, Storage};

use crate::chain::{OpenOptions, VmdkImage};
use crate::descriptor::{Access, Descriptor, ExtentLine, ExtentType, NO_PARENT_CID};
use crate::error::{Result, VmdkErrorKind};
use crate::sparse::{
    create_cowd, create_kdmv, create_sesparse, KdmvHeader, FLAG_COMPRESS, FLAG_MARKER,
    FLAG_NL_DETECT, GD_AT_END, MARKER_EOS, MARKER_FOOTER, MARKER_GD, MARKER_GT, SECTOR,
};

/// What to create.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    pub subformat: Subformat,
    pub sectors: u64,
    /// `parentFileNameHint` and the parent's CID, for a delta.
    pub parent: Option<(String, u32)>,
    /// `ddb.adapterType`.
    pub adapter: String,
    /// For monolithicSparse: use zeroed-grain entries (version 2).
    pub zero_grain: bool,
}

impl ImageSpec {
    pub fn new(subformat: Subformat, sectors: u64) -> Self {
        Self {
            subformat,
            sectors,
            parent: None,
            adapter: "lsilogic".into(),
            zero_grain: true,
        }
    }
}

/// A fresh random content id.
pub fn random_cid() -> u32 {
    let mut b = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    let c = u32::from_le_bytes(b) ^ std::process::id();
    if c == NO_PARENT_CID {
        1
    } else {
        c
    }
}

fn stem(name: &str) -> &str {
    let base = name.rsplit('/').next().unwrap_or(name);
    base.strip_suffix(".vmdk").unwrap_or(base)
}

fn descriptor(spec: &ImageSpec, create_type: &str, kind: ExtentType, file: String) -> Descriptor {
    let mut ddb = Descriptor::default_ddb(spec.sectors, &spec.adapter, 4);
    if spec.subformat == Subformat::SeSparse {
        ddb.push(("ddb.grain".into(), "8".into()));
    }
    Descriptor {
        version: 1,
        cid: random_cid(),
        parent_cid: spec.parent.as_ref().map(|p| p.1).unwrap_or(NO_PARENT_CID),
        create_type: create_type.into(),
        parent_hint: spec.parent.as_ref().map(|p| p.0.clone()),
        extents: vec![ExtentLine {
            access: Access::Rw,
            sectors: spec.sectors,
            kind,
            file,
            offset: 0,
        }],
        ddb,
    }
}

fn open_new(backend: &dyn Backend, name: &str) -> Result<Arc<dyn Storage>> {
    if backend.exists(name) {
        return Err(crate::error::new(
            VmdkErrorKind::InvalidArgument,
            name,
            "already exists; refusing to overwrite it",
        ));
    }
    let f = backend
        .open(name, true)
        .map_err(|e| crate::error::io(name, e))?;
    Ok(f)
}

fn put(f: &dyn Storage, name: &str, b: &[u8], off: u64) -> Result<()> {
    f.write_at(b, off).map_err(|e| crate::error::io(name, e))
}

/// Names of the files an image of `subformat` called `name` consists of.
pub fn image_files(name: &str, subformat: Subformat) -> Vec<String> {
    let dir = match name.rfind('/') {
        Some(i) => &name[..=i],
        None => "",
    };
    let s = stem(name);
    match subformat {
        Subformat::MonolithicSparse | Subformat::StreamOptimized => vec![name.to_string()],
        Subformat::MonolithicFlat => vec![name.to_string(), format!("{dir}{s}-flat.vmdk")],
        Subformat::VmfsSparse => vec![name.to_string(), format!("{dir}{s}-delta.vmdk")],
        Subformat::SeSparse => vec![name.to_string(), format!("{dir}{s}-sesparse.vmdk")],
    }
}

/// Create an empty image and open it for writing. streamOptimized is not
/// created here (see [`StreamWriter`]). An error names the file it
/// concerns in the backend (`describe()/NAME`), with op "create" (or
/// "open" for the open that ends it).
pub fn create_image(backend: Arc<dyn Backend>, name: &str, spec: &ImageSpec) -> Result<VmdkImage> {
    write_image(&*backend, name, spec)
        .map_err(|e| crate::error::in_folder(e, &backend.describe(), "create"))?;
    VmdkImage::open_in(
        backend,
        name,
        &OpenOptions {
            writable: true,
            ..Default::default()
        },
    )
}

/// The files of a new image, errors naming them by their names in `backend`.
fn write_image(backend: &dyn Backend, name: &str, spec: &ImageSpec) -> Result<()> {
    if spec.parent.is_some() && !spec.subformat.can_be_delta() {
        return Err(crate::error::unsupported(
            name,
            format!(
                "{} images cannot be deltas on a parent",
                spec.subformat.name()
            ),
        ));
    }
    if spec.sectors == 0 {
        return Err(crate::error::new(
            VmdkErrorKind::InvalidArgument,
            name,
            "size must be at least one sector",
        ));
    }
    let files = image_files(name, spec.subformat);
    let ext_name = |i: usize| files[i].rsplit('/').next().unwrap_or(&files[i]).to_string();
    match spec.subformat {
        Subformat::MonolithicSparse => {
            let d = descriptor(spec, "monolithicSparse", ExtentType::Sparse, ext_name(0));
            let f = open_new(backend, name)?;
            create_kdmv(&*f, name, spec.sectors, spec.zero_grain, &d.render())?;
            f.sync().map_err(|e| crate::error::io(name, e))?;
        }
        Subformat::MonolithicFlat => {
            let d = descriptor(spec, "monolithicFlat", ExtentType::Flat, ext_name(1));
            let flat = open_new(backend, &files[1])?;
            flat.set_len(spec.sectors * SECTOR)
                .map_err(|e| crate::error::io(&files[1], e))?;
            flat.sync().map_err(|e| crate::error::io(&files[1], e))?;
            let f = open_new(backend, name)?;
            put(&*f, name, d.render().as_bytes(), 0)?;
            f.sync().map_err(|e| crate::error::io(name, e))?;
        }
        Subformat::VmfsSparse | Subformat::SeSparse => {
            let (ct, kind) = if spec.subformat == Subformat::VmfsSparse {
                ("vmfsSparse", ExtentType::VmfsSparse)
            } else {
                ("seSparse", ExtentType::SeSparse)
            };
            let d = descriptor(spec, ct, kind, ext_name(1));
            let ext = open_new(backend, &files[1])?;
            if spec.subformat == Subformat::VmfsSparse {
                create_cowd(&*ext, &files[1], spec.sectors)?;
            } else {
                create_sesparse(&*ext, &files[1], spec.sectors)?;
            }
            ext.sync().map_err(|e| crate::error::io(&files[1], e))?;
            let f = open_new(backend, name)?;
            put(&*f, name, d.render().as_bytes(), 0)?;
            f.sync().map_err(|e| crate::error::io(name, e))?;
        }
        Subformat::StreamOptimized => {
            return Err(crate::error::unsupported(
                name,
                "streamOptimized images are written with StreamWriter",
            ))
        }
    }
    Ok(())
}

/// Writes a streamOptimized image front to back: header and descriptor,
/// compressed grains in increasing order, then grain tables, directory,
/// footer and end-of-stream marker (VMware's stream layout; qemu-img reads
/// the footer because the header's gdOffset says "at the end").
pub struct StreamWriter {
    file: Arc<dyn Storage>,
    name: String,
    header: KdmvHeader,
    pos: u64,
    /// GTE of every grain (sector of its marker, 0 = none).
    gtes: Vec<u32>,
    last: Option<u64>,
}

const STREAM_GRAIN: u64 = 128;

fn marker(val: u64, size: u32, ty: u32) -> [u8; 512] {
    let mut m = [0u8; 512];
    m[0..8].copy_from_slice(&val.to_le_bytes());
    m[8..12].copy_from_slice(&size.to_le_bytes());
    m[12..16].copy_from_slice(&ty.to_le_bytes());
    m
}

impl StreamWriter {
    /// Start a stream of `sectors` in a new file `name` of `backend`. An
    /// error names the file in the backend (`describe()/NAME`), with op
    /// "create".
    pub fn create(backend: &dyn Backend, name: &str, sectors: u64, adapter: &str) -> Result<Self> {
        Self::start(backend, name, sectors, adapter)
            .map_err(|e| crate::error::in_folder(e, &backend.describe(), "create"))
    }

    fn start(backend: &dyn Backend, name: &str, sectors: u64, adapter: &str) -> Result<Self> {
        let mut spec = ImageSpec::new(Subformat::StreamOptimized, sectors);
        spec.adapter = adapter.into();
        let d = descriptor(
            &spec,
            "streamOptimized",
            ExtentType::Sparse,
            stem(name).to_string() + ".vmdk",
        );
        let text = d.render();
        let desc_sectors = 20u64.max((text.len() as u64).div_ceil(512));
        let overhead = (1 + desc_sectors).div_ceil(STREAM_GRAIN) * STREAM_GRAIN;
        let header = KdmvHeader {
            version: 3,
            flags: FLAG_NL_DETECT | FLAG_COMPRESS | FLAG_MARKER,
            capacity: sectors,
            grain_size: STREAM_GRAIN,
            desc_offset: 1,
            desc_size: desc_sectors,
            gtes_per_gt: 512,
            rgd_offset: 0,
            gd_offset: GD_AT_END,
            overhead,
            unclean: false,
            compress_algorithm: 1,
        };
        let file = open_new(backend, name)?;
        put(&*file, name, &header.encode(), 0)?;
        let mut t = text.into_bytes();
        t.resize((desc_sectors * SECTOR) as usize, 0);
        put(&*file, name, &t, SECTOR)?;
        let grains = sectors.div_ceil(STREAM_GRAIN);
        if grains > u32::MAX as u64 {
            return Err(crate::error::unsupported(name, "too large for a stream"));
        }
        Ok(Self {
            file,
            name: name.to_string(),
            header,
            pos: overhead * SECTOR,
            gtes: vec![0; grains as usize],
            last: None,
        })
    }

    /// Bytes per grain (64 KiB).
    pub fn grain_bytes(&self) -> u64 {
        STREAM_GRAIN * SECTOR
    }

    /// Append grain `index` (in increasing order); all-zero grains are
    /// left out (they read as zeros). The last grain may be short.
    pub fn write_grain(&mut self, index: u64, data: &[u8]) -> Result<()> {
        if self.last.is_some_and(|l| index <= l) || index >= self.gtes.len() as u64 {
            return Err(crate::error::new(
                VmdkErrorKind::InvalidArgument,
                &self.name,
                format!("grain {index} out of order or past the end"),
            ));
        }
        self.last = Some(index);
        if data.iter().all(|&b| b == 0) {
            return Ok(());
        }
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(data)
            .map_err(|e| crate::error::io(&self.name, e))?;
        let z = z.finish().map_err(|e| crate::error::io(&self.name, e))?;
        let mut rec = Vec::with_capacity(12 + z.len() + 512);
        rec.extend_from_slice(&(index * STREAM_GRAIN).to_le_bytes());
        rec.extend_from_slice(&(z.len() as u32).to_le_bytes());
        rec.extend_from_slice(&z);
        rec.resize(rec.len().div_ceil(512) * 512, 0);
        put(&*self.file, &self.name, &rec, self.pos)?;
        self.gtes[index as usize] = u32::try_from(self.pos / SECTOR).map_err(|_| {
            crate::error::unsupported(&self.name, "stream grows past 2 TiB of compressed data")
        })?;
        self.pos += rec.len() as u64;
        Ok(())
    }

    /// Write tables, directory, footer and end-of-stream; sync.
    pub fn finish(mut self) -> Result<()> {
        let gts = self.gtes.len().div_ceil(512);
        let mut gd: Vec<u32> = vec![0; gts];
        for (t, slot) in gd.iter_mut().enumerate() {
            let entries = &self.gtes[t * 512..((t + 1) * 512).min(self.gtes.len())];
            if entries.iter().all(|&e| e == 0) {
                continue;
            }
            put(&*self.file, &self.name, &marker(4, 0, MARKER_GT), self.pos)?;
            self.pos += SECTOR;
            let mut b = Vec::with_capacity(2048);
            for &e in entries {
                b.extend_from_slice(&e.to_le_bytes());
            }
            b.resize(2048, 0);
            put(&*self.file, &self.name, &b, self.pos)?;
            *slot = (self.pos / SECTOR) as u32;
            self.pos += 2048;
        }
        let gd_sectors = ((gts * 4) as u64).div_ceil(512);
        put(
            &*self.file,
            &self.name,
            &marker(gd_sectors, 0, MARKER_GD),
            self.pos,
        )?;
        self.pos += SECTOR;
        let gd_sector = self.pos / SECTOR;
        let mut b: Vec<u8> = gd.iter().flat_map(|e| e.to_le_bytes()).collect();
        b.resize((gd_sectors * SECTOR) as usize, 0);
        put(&*self.file, &self.name, &b, self.pos)?;
        self.pos += gd_sectors * SECTOR;
        put(
            &*self.file,
            &self.name,
            &marker(1, 0, MARKER_FOOTER),
            self.pos,
        )?;
        self.pos += SECTOR;
        let mut footer = self.header;
        footer.gd_offset = gd_sector;
        put(&*self.file, &self.name, &footer.encode(), self.pos)?;
        self.pos += SECTOR;
        put(&*self.file, &self.name, &marker(0, 0, MARKER_EOS), self.pos)?;
        self.pos += SECTOR;
        self.file
            .set_len(self.pos)
            .map_err(|e| crate::error::io(&self.name, e))?;
        self.file
            .sync()
            .map_err(|e| crate::error::io(&self.name, e))
    }
}
