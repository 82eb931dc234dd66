//! VMware disks in and out: `import` (VMDK chains, raw, qcow2), `export`
//! (every subformat, optionally as a chain of deltas), and the offline
//! `vmdk info|check|shrink` commands.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use strata_api::wire::Watch;

use strata_api::request::absolute;
use strata_api::{
    ExportReport, ExportedLink, ImageFormat, ImportReport, ImportedLink, Request, Response,
    ShrinkResult, VmdkCheckReport, VmdkExtentInfo, VmdkFileCheck, VmdkInfo, VmdkLinkInfo,
    VmdkRequest, VmdkResponse,
};
use strata_block::{BlockDevice, ZeroOptions};

use crate::copier::{put_grains, Work, EXPORT_REMOVED};
use crate::imports::Import;
use strata_api::ImportBase;
use strata_datastore::Datastore;
use strata_engine::{Error, ErrorKind};
use strata_storage::{Backend, FileBackend};
use strata_vmdk::chain::ExtentImpl;
use strata_vmdk::create::image_files;
use strata_vmdk::{
    create_image, ImageSpec, OpenOptions, RangeState, StreamWriter, Subformat, VmdkImage,
};

const GRAIN: u64 = 4096;
const CHUNK: u64 = 1 << 20;
/// Zero a range, deallocating it where the target can.
const UNMAP_OK: ZeroOptions = ZeroOptions {
    may_unmap: true,
    fast_only: false,
    fua: false,
};

fn io(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("{what}: {e}"))
}

/// How a command opens a VMDK chain, and so which locks it takes
/// (docs/FORMAT.md §9.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only, no locks: works while a server writes the files, and may
    /// then see them mid-update (`vmdk info`, `vmdk check` without repair).
    Inspect,
    /// Read-only, shared locks on every file: refused while a writer holds
    /// the top (import, `serve --vmdk-read-only`).
    Read,
    /// The top link writable and locked exclusively, parents shared.
    Write,
}

/// Open a VMDK chain from a path. A file locked by another process is
/// refused with the holder named, as far as strata recorded it.
pub fn open_vmdk(path: &Path, access: Access) -> Result<VmdkImage, Error> {
    VmdkImage::open(
        path,
        &OpenOptions {
            writable: access == Access::Write,
            lock: access != Access::Inspect,
            ..Default::default()
        },
    )
    .map_err(|e| {
        if e.kind != strata_vmdk::VmdkErrorKind::Locked {
            return e;
        }
        in_use(
            &folder(path).join(e.place.object.unwrap_or_default()),
            access,
        )
    })
}

/// The refusal of a locked file, naming its holders.
fn in_use(file: &Path, access: Access) -> Error {
    let holders = crate::holders::describe(file);
    let who = if holders.is_empty() {
        "another process (no strata process recorded holding it: QEMU, VMware or another tool may have it open)".to_string()
    } else {
        holders.join(" and ")
    };
    let what = if access == Access::Write {
        "cannot open it for writing"
    } else {
        "cannot read it consistently while it is written"
    };
    Error::new(
        ErrorKind::Locked,
        format!(
            "{} is in use by {who}; {what} (stop that first)",
            file.display()
        ),
    )
}

/// The folder a chain opened from `path` resolves its names in.
pub fn folder(path: &Path) -> &Path {
    path.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// What kind of image a file is, by content.
fn sniff(path: &Path) -> Result<ImageFormat, Error> {
    let f = std::fs::File::open(path).map_err(|e| io(&path.display().to_string(), e))?;
    let mut head = [0u8; 4096];
    let n = f.read_at(&mut head, 0).map_err(|e| io("read", e))?;
    let h = &head[..n];
    if h.starts_with(b"QFI\xfb") {
        return Ok(ImageFormat::Qcow2);
    }
    if strata_crypt::luks::is_luks(h) {
        return Ok(ImageFormat::Luks);
    }
    if h.starts_with(b"KDMV")
        || h.starts_with(b"COWD")
        || h.starts_with(&0xcafe_babeu64.to_le_bytes())
    {
        return Ok(ImageFormat::Vmdk);
    }
    let text = String::from_utf8_lossy(h);
    let named_vmdk = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("vmdk"));
    if named_vmdk || (text.contains("createType") && text.contains("version")) {
        return Ok(ImageFormat::Vmdk);
    }
    Ok(ImageFormat::Raw)
}

fn snapshot_name(file: &str, taken: &mut Vec<String>) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    let stem = base.strip_suffix(".vmdk").unwrap_or(base);
    let mut n: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if n.is_empty() {
        n = "link".into();
    }
    let mut cand = n.clone();
    let mut i = 2;
    while taken.contains(&cand) {
        cand = format!("{n}-{i}");
        i += 1;
    }
    taken.push(cand.clone());
    cand
}

/// Import `path` as disk `name`. A VMDK chain becomes a disk whose
/// snapshots are the chain's links below the top (base first, named after
/// the files); the top link is the disk's live state.
pub fn import(
    ds: &dyn Datastore,
    what: Import,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportReport, Error> {
    let format = match what.format {
        Some(f) => f,
        None => sniff(what.path)?,
    };
    if what.base.is_some() && matches!(format, ImageFormat::Vmdk | ImageFormat::Luks) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "--base takes a raw or qcow2 image; {} is {}",
                what.path.display(),
                format!("{format:?}").to_lowercase()
            ),
        ));
    }
    match format {
        ImageFormat::Vmdk => import_vmdk(ds, &what, progress),
        ImageFormat::Raw => {
            let base = import_raw(ds, &what, what.path, progress)?;
            what.one_disk(ds, format, base)
        }
        ImageFormat::Qcow2 => import_qcow2(ds, &what, progress),
        ImageFormat::Luks => crate::luks_ops::import(ds, &what, progress),
    }
}

/// Copy the raw image `path` (its length the disk's size) into the new
/// disk `what` asks for, skipping the holes of a sparse file; onto its
/// base when it has one (then what sharing with it did).
fn import_raw(
    ds: &dyn Datastore,
    what: &Import<'_>,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Option<ImportBase>, Error> {
    let name = what.name;
    let size = std::fs::metadata(path)
        .map_err(|e| io(&path.display().to_string(), e))?
        .len();
    if !size.is_multiple_of(512) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{} is {size} bytes, not a whole number of 512-byte sectors",
                path.display()
            ),
        ));
    }
    let f = std::fs::File::open(path).map_err(|e| io(&path.display().to_string(), e))?;
    what.create(ds, size)?;
    let h = ds.open(name)?;
    if let Some(base) = what.base {
        let r = crate::imports::copy_onto_base(&*h, &f, base, &|| what.step(), progress);
        if r.is_err() {
            let _ = ds.remove(name);
        }
        return r.map(Some);
    }
    let r = (|| {
        let mut buf = vec![0u8; CHUNK as usize];
        let mut off = 0u64;
        while off < size {
            what.step()?;
            // Skip holes of sparse files without reading them.
            let data = seek_data(&f, off).unwrap_or(off);
            if data >= size {
                break;
            }
            off = data - data % GRAIN;
            let n = CHUNK.min(size - off) as usize;
            f.read_exact_at(&mut buf[..n], off)
                .map_err(|e| io("read", e))?;
            put_grains(&*h, &buf[..n], off, false)?;
            off += n as u64;
            progress(off, size);
        }
        h.flush()
    })();
    if r.is_err() {
        let _ = ds.remove(name);
    }
    r.map(|()| None)
}

fn seek_data(f: &std::fs::File, off: u64) -> Option<u64> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: lseek on a descriptor we own; SEEK_DATA only reports.
    let r = unsafe { libc::lseek(f.as_raw_fd(), off as libc::off_t, libc::SEEK_DATA) };
    (r >= 0).then_some(r as u64)
}

fn import_qcow2(
    ds: &dyn Datastore,
    what: &Import<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportReport, Error> {
    let (path, name) = (what.path, what.name);
    let tmp = std::env::temp_dir().join(format!("strata-import-{}-{name}.raw", std::process::id()));
    let out = std::process::Command::new("qemu-img")
        .args(["convert", "-q", "-f", "qcow2", "-O", "raw"])
        .arg(path)
        .arg(&tmp)
        .output()
        .map_err(|e| {
            Error::new(
                ErrorKind::Refused,
                format!(
                    "importing qcow2 needs qemu-img, which could not be run ({e}); install qemu-utils, or convert to raw first"
                ),
            )
        })?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "qemu-img could not read {}: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    let r = import_raw(ds, what, &tmp, progress);
    let _ = std::fs::remove_file(&tmp);
    let base = r?;
    what.one_disk(ds, ImageFormat::Qcow2, base)
}

/// How `export` writes a version: the subformat, whether as a chain of
/// links (one per snapshot on its path), and the descriptor's adapter.
pub struct ExportFormat<'a> {
    pub subformat: Subformat,
    pub chain: bool,
    pub adapter: &'a str,
}

/// The directory and file name of an export's first link (`out`, which
/// must end in .vmdk).
fn output_name(out: &Path) -> Result<(PathBuf, String), Error> {
    let dir = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file = out
        .file_name()
        .ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{} is not a file name", out.display()),
            )
        })?
        .to_string_lossy()
        .to_string();
    if !file.ends_with(".vmdk") {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "the output name must end in .vmdk",
        ));
    }
    Ok((dir.to_path_buf(), file))
}

/// The links an export writes, one per version.
struct Links {
    /// The versions (with `--chain`, every snapshot on the target's path
    /// first).
    versions: Vec<String>,
    /// Each link's file name: the one asked for, then `STEM-000001.vmdk`...
    names: Vec<String>,
    /// Each link's subformat (a chain of vmfsSparse/seSparse deltas sits
    /// on a flat base, as on ESX).
    subs: Vec<Subformat>,
    /// What each link holds: the changes from the version below it.
    deltas: Vec<Vec<strata_datastore::ChangedRange>>,
}

/// Plan an export's links (see [`Links`]).
fn plan_links(
    ds: &dyn Datastore,
    target: &str,
    file: &str,
    sub: Subformat,
    chain: bool,
) -> Result<Links, Error> {
    let (disk, _) = strata_engine::split_target(target);
    let mut versions: Vec<String> = Vec::new();
    if chain {
        if !sub.can_be_delta() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "--chain needs a subformat that can be a delta (monolithicSparse, vmfsSparse or seSparse), not {}",
                    sub.name()
                ),
            ));
        }
        versions = ds
            .snapshot_path(target)?
            .into_iter()
            .map(|s| format!("{disk}@{s}"))
            .collect();
    }
    versions.push(target.to_string());
    let stem = file.strip_suffix(".vmdk").unwrap_or(file);
    let names = (0..versions.len())
        .map(|i| match i {
            0 => file.to_string(),
            _ => format!("{stem}-{i:06}.vmdk"),
        })
        .collect();
    let subs = (0..versions.len())
        .map(|i| match i {
            0 if chain && sub != Subformat::MonolithicSparse => Subformat::MonolithicFlat,
            _ => sub,
        })
        .collect();
    let deltas = (0..versions.len())
        .map(|i| ds.changed_ranges(i.checked_sub(1).map(|p| versions[p].as_str()), &versions[i]))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Links {
        versions,
        names,
        subs,
        deltas,
    })
}

/// Refuse an export that would overwrite any file of its links.
fn refuse_existing(dir: &Path, names: &[String], subs: &[Subformat]) -> Result<(), Error> {
    for (n, &s) in names.iter().zip(subs) {
        for f in image_files(n, s) {
            if dir.join(&f).exists() {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "{} already exists; refusing to overwrite it",
                        dir.join(&f).display()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Write the mapped `ranges` of `h` into a streamOptimized link, grain
/// by grain in order, and finish it.
fn write_stream(
    mut w: StreamWriter,
    h: &dyn BlockDevice,
    ranges: &[strata_datastore::ChangedRange],
    step: &mut dyn FnMut(u64) -> Result<(), Error>,
) -> Result<(), Error> {
    let size = h.size_bytes();
    let gb = w.grain_bytes();
    let mut buf = vec![0u8; gb as usize];
    let mut last: Option<u64> = None;
    for r in ranges.iter().filter(|r| r.mapped) {
        let first = r.offset / gb;
        let end = (r.offset + r.len).div_ceil(gb);
        for g in first..end {
            if last.is_some_and(|l| g <= l) {
                continue;
            }
            let n = gb.min(size - g * gb) as usize;
            h.read_at(&mut buf[..n], g * gb)?;
            w.write_grain(g, &buf[..n])?;
            last = Some(g);
        }
        step(r.len)?;
    }
    w.finish()?;
    Ok(())
}

/// Write `ranges` of `h` into a sparse or flat link: data as grains, and
/// in a `delta` zeroed ranges as zero grains (they hide the parent's data).
fn write_sparse(
    img: &VmdkImage,
    h: &dyn BlockDevice,
    ranges: &[strata_datastore::ChangedRange],
    delta: bool,
    step: &mut dyn FnMut(u64) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut buf = vec![0u8; CHUNK as usize];
    for r in ranges {
        if !r.mapped {
            if delta {
                img.write_zeroes(r.offset, r.len, UNMAP_OK)?;
            }
            step(r.len)?;
            continue;
        }
        let mut p = 0u64;
        while p < r.len {
            let n = CHUNK.min(r.len - p) as usize;
            h.read_at(&mut buf[..n], r.offset + p)?;
            put_grains(img, &buf[..n], r.offset + p, delta)?;
            p += n as u64;
            step(n as u64)?;
        }
    }
    Ok(())
}

/// Copy what link `level` of `img` holds onto `dev`: its data grains,
/// and its zeroed ranges unless it is the base (a new disk reads zeros).
/// `progress` gets the offset reached.
fn copy_link(
    img: &VmdkImage,
    level: usize,
    dev: &dyn BlockDevice,
    step: &dyn Fn() -> Result<(), Error>,
    progress: &mut dyn FnMut(u64),
) -> Result<(), Error> {
    let base = level == img.links.len() - 1;
    let link_size = (img.links[level].sectors * 512).min(img.size_bytes());
    let mut buf = vec![0u8; CHUNK as usize];
    let mut off = 0u64;
    while off < link_size {
        for (len, st) in img.link_status(level, off, link_size - off, 1024)? {
            match st {
                RangeState::Unallocated => {}
                RangeState::Zero if base => {}
                RangeState::Zero => dev.write_zeroes(off, len, UNMAP_OK)?,
                RangeState::Data => {
                    let mut p = 0u64;
                    while p < len {
                        step()?;
                        let n = CHUNK.min(len - p) as usize;
                        img.read_link(level, &mut buf[..n], off + p)?;
                        put_grains(dev, &buf[..n], off + p, !base)?;
                        p += n as u64;
                        progress(off + p);
                    }
                }
            }
            off += len;
        }
    }
    Ok(())
}

fn import_vmdk(
    ds: &dyn Datastore,
    what: &Import<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportReport, Error> {
    let name = what.name;
    let img = open_vmdk(what.path, Access::Read)?;
    let size = img.size_bytes();
    let levels = img.links.len();
    what.create(ds, size)?;
    let mut taken = Vec::new();
    let mut snaps = Vec::new();
    let r = (|| -> Result<(), Error> {
        let h = ds.open(name)?;
        let total = size * levels as u64;
        let mut done = 0u64;
        for level in (0..levels).rev() {
            let step = || what.step();
            copy_link(&img, level, &*h, &step, &mut |at| {
                progress(done + at, total)
            })?;
            done += size;
            progress(done, total);
            if level > 0 {
                let sn = snapshot_name(&img.links[level].name, &mut taken);
                ds.snapshot_create(
                    name,
                    &sn,
                    &format!(
                        "imported from {} ({})",
                        img.links[level].name,
                        img.links[level].create_type()
                    ),
                )?;
                snaps.push(sn);
            }
        }
        h.flush()
    })();
    if let Err(e) = r {
        let _ = ds.remove(name);
        return Err(e);
    }
    Ok(ImportReport {
        disk: ds.disk_view(name, false)?,
        format: ImageFormat::Vmdk,
        base: None,
        links: Some(
            img.links
                .iter()
                .map(|l| ImportedLink {
                    file: l.name.clone(),
                    create_type: l.create_type().to_string(),
                })
                .collect(),
        ),
        snapshots: snaps,
    })
}

/// Export `target` (DISK or DISK@SNAP) to `out`. With `chain`, write the
/// snapshot path as a base and deltas named like VMware's (`NAME.vmdk`,
/// `NAME-000001.vmdk`, ...); the last file is `target`.
pub fn export(
    ds: &dyn Datastore,
    target: &str,
    out: &Path,
    how: &ExportFormat<'_>,
    work: &mut Work<'_>,
) -> Result<ExportReport, Error> {
    let (dir, file) = output_name(out)?;
    let links = plan_links(ds, target, &file, how.subformat, how.chain)?;
    refuse_existing(&dir, &links.names, &links.subs)?;
    let total: u64 = links.deltas.iter().flatten().map(|r| r.len).sum();
    let mut done = 0u64;
    let mut step = |n: u64| {
        done += n;
        (work.progress)(done, total);
        work.checkpoint()
    };
    let written = write_links(ds, &dir, &links, how, &mut step).map_err(|e| {
        // None of these files was there before (refuse_existing): an
        // export that fails or is stopped leaves none of them.
        for (n, &s) in links.names.iter().zip(&links.subs) {
            for f in image_files(n, s) {
                let _ = std::fs::remove_file(dir.join(f));
            }
        }
        work.stopped_leaving(e, EXPORT_REMOVED)
    })?;
    (work.progress)(total, total);
    Ok(ExportReport {
        target: target.to_string(),
        open: dir
            .join(links.names.last().expect("one link"))
            .display()
            .to_string(),
        links: written,
    })
}

/// Write each link of `links` into `dir`: what its version changed, as a
/// stream or as a sparse or flat image on the link below it.
fn write_links(
    ds: &dyn Datastore,
    dir: &Path,
    links: &Links,
    how: &ExportFormat<'_>,
    step: &mut dyn FnMut(u64) -> Result<(), Error>,
) -> Result<Vec<ExportedLink>, Error> {
    let backend: Arc<dyn Backend> = Arc::new(FileBackend::new(dir));
    let mut written = Vec::new();
    let mut parent: Option<(String, u32)> = None;
    for (i, v) in links.versions.iter().enumerate() {
        let h = ds.open(v)?;
        let size = h.size_bytes();
        let (name, this_sub) = (&links.names[i], links.subs[i]);
        if this_sub == Subformat::StreamOptimized {
            let w = StreamWriter::create(&*backend, name, size / 512, how.adapter)?;
            write_stream(w, &*h, &links.deltas[i], step)?;
        } else {
            let mut spec = ImageSpec::new(this_sub, size / 512);
            spec.parent = parent.clone();
            spec.adapter = how.adapter.to_string();
            let img = create_image(backend.clone(), name, &spec)?;
            // Zero grains of a delta must hide the parent's data there.
            write_sparse(&img, &*h, &links.deltas[i], i > 0, step)?;
            img.flush()?;
            parent = Some((name.clone(), img.current_cid()));
        }
        written.push(ExportedLink {
            file: dir.join(name).display().to_string(),
            version: v.clone(),
            subformat: this_sub.name().to_string(),
        });
    }
    Ok(written)
}

/// Run a `vmdk` command.
pub fn execute(req: &VmdkRequest, watch: &mut dyn Watch) -> Result<VmdkResponse, Error> {
    Ok(match req {
        VmdkRequest::Info { path } => VmdkResponse::Info(info(path)?),
        VmdkRequest::Check { path, repair } => VmdkResponse::Check(check(path, *repair)?),
        VmdkRequest::Shrink {
            path,
            rate_bytes_per_sec,
        } => VmdkResponse::Shrink(shrink(path, *rate_bytes_per_sec, watch)?),
    })
}

/// `strata vmdk info`: the chain, link by link.
fn info(path: &Path) -> Result<VmdkInfo, Error> {
    let img = open_vmdk(path, Access::Inspect)?;
    let links = img
        .links
        .iter()
        .map(|l| VmdkLinkInfo {
            file: l.name.clone(),
            create_type: l.create_type().to_string(),
            cid: l.descriptor.cid,
            parent_cid: l.descriptor.parent_cid,
            parent_hint: l.descriptor.parent_hint.clone(),
            size_bytes: l.sectors * 512,
            extents: l
                .extents
                .iter()
                .map(|e| {
                    let (format, file, grain_bytes) = match &e.imp {
                        ExtentImpl::Flat { name, .. } => ("flat", name.clone(), None),
                        ExtentImpl::Zero => ("zero", String::new(), None),
                        ExtentImpl::Sparse(s) => (
                            s.format().name(),
                            s.name().to_string(),
                            Some(s.grain_bytes()),
                        ),
                    };
                    VmdkExtentInfo {
                        line_type: e.line_type.name().to_string(),
                        format: format.to_string(),
                        file,
                        start_sector: e.start,
                        sectors: e.sectors,
                        grain_bytes,
                    }
                })
                .collect(),
        })
        .collect();
    Ok(VmdkInfo {
        size_bytes: img.size_bytes(),
        depth: img.links.len(),
        links,
    })
}

/// `strata vmdk check [--repair]`: errors, warnings and repairs per file.
fn check(path: &Path, repair: bool) -> Result<VmdkCheckReport, Error> {
    let img = open_vmdk(
        path,
        if repair {
            Access::Write
        } else {
            Access::Inspect
        },
    )?;
    let held = repair
        .then(|| crate::holders::record(&img, folder(path), "strata vmdk check --repair", None));
    let res = img.check(repair)?;
    let errors = res.iter().map(|(_, c)| c.errors.len()).sum();
    let files = res
        .into_iter()
        .map(|(file, check)| VmdkFileCheck { file, check })
        .collect();
    // After a repair, say what is still wrong.
    let remaining_errors = if repair {
        drop(img);
        drop(held);
        let again = open_vmdk(path, Access::Inspect)?.check(false)?;
        again.iter().map(|(_, c)| c.errors.len()).sum()
    } else {
        errors
    };
    Ok(VmdkCheckReport {
        files,
        errors,
        remaining_errors,
    })
}

/// `strata vmdk shrink`: compact an SEsparse top link; here if nobody
/// holds it, else by the server that serves it (docs/FORMAT.md §9.5).
fn shrink(
    path: &Path,
    rate: Option<u64>,
    watch: &mut dyn Watch,
) -> Result<Vec<ShrinkResult>, Error> {
    let img = match open_vmdk(path, Access::Write) {
        Ok(img) => img,
        Err(e) if e.kind == ErrorKind::Locked => return shrink_served(path, rate, e, watch),
        Err(e) => return Err(e),
    };
    let _held = crate::holders::record(&img, folder(path), "strata vmdk shrink", None);
    // A rate asks for the stepped shrink here too (paced, nobody to wait for).
    let progress = &mut |d, t| watch.progress(d, t);
    let reps = match rate {
        Some(_) => img.shrink_online(rate, progress),
        None => img.shrink(progress),
    }?;
    Ok(reps)
}

/// Ask the server holding `path` (refused with `refused`) to shrink it.
fn shrink_served(
    path: &Path,
    rate: Option<u64>,
    refused: Error,
    watch: &mut dyn Watch,
) -> Result<Vec<ShrinkResult>, Error> {
    let servers = crate::holders::servers(path);
    let Some((pid, socket)) = servers.first() else {
        return Err(refused);
    };
    let req = Request::VmdkShrink {
        path: absolute(path)?,
        rate_bytes_per_sec: rate,
    };
    match strata_api::wire::request(socket, &req, false, watch) {
        Ok(Response::VmdkShrink(r)) => Ok(r),
        Ok(other) => Err(Error::new(
            ErrorKind::Io,
            format!("the server (pid {pid}) answered shrink with {other:?}"),
        )),
        Err(e) if e.message.contains("answers status only") || e.message.contains("unknown variant") => {
            Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "{} is served by a strata server (pid {pid}, control socket {}) whose version cannot shrink online; stop it and run shrink again (offline), or restart it with this version",
                    path.display(),
                    socket.display()
                ),
            ))
        }
        Err(e) => Err(Error::new(
            e.kind,
            format!(
                "shrink by the server of {} (pid {pid}): {}",
                path.display(),
                e.message
            ),
        )),
    }
}
