//! What every importer shares (`vmdk_ops` for VMDK, raw and qcow2,
//! `luks_ops` for LUKS1): the request, the new disk made plain, encrypted
//! or from a base it shares, and the report of an image that became one
//! disk.

use std::os::unix::fs::FileExt;
use std::path::Path;

use strata_api::{ImageFormat, ImportBase, ImportReport, KeyGrant};
use strata_block::{BlockDevice, ZeroOptions};
use strata_datastore::{Datastore, EncryptedDisk};
use strata_engine::{Error, ErrorKind, Provisioning, WorkControl};

/// What `import --base` compares at a time.
const CHUNK: usize = 1 << 20;
const GRAIN: usize = 4096;

/// What to import: the image at `path` (its format, or None to tell it
/// by its bytes) as disk `name`, provisioned `prov`, encrypted with a
/// first keyslot for `encrypt` when given (a LUKS1 image's passphrase).
pub struct Import<'a> {
    pub path: &'a Path,
    pub name: &'a str,
    pub prov: Provisioning,
    pub format: Option<ImageFormat>,
    pub encrypt: Option<&'a KeyGrant>,
    /// Start from this disk's state, sharing it (FORMAT.md §17.2a).
    pub base: Option<&'a str>,
    /// A job's control (a server's job: pause, cancel, the server's stop).
    pub control: Option<&'a WorkControl>,
}

impl Import<'_> {
    /// Between two chunks: wait while the job is paused; an error once it
    /// is cancelled (the caller removes the half-made disk).
    pub fn step(&self) -> Result<(), Error> {
        match self.control {
            Some(c) => c.checkpoint().map_err(|e| {
                c.stopped_leaving(
                    e,
                    &format!(
                        "the half-made disk '{}' was removed; import again",
                        self.name
                    ),
                )
            }),
            None => Ok(()),
        }
    }

    /// Create the new disk of `size` bytes, encrypted when a key was given,
    /// holding its base's state when one was.
    pub fn create(&self, ds: &dyn Datastore, size: u64) -> Result<(), Error> {
        if let Some(base) = self.base {
            return self.create_on(ds, base, size);
        }
        match self.encrypt {
            Some(key) => {
                let spec = EncryptedDisk {
                    disk: self.name,
                    size_bytes: size,
                    provisioning: self.prov,
                    key,
                };
                ds.create_encrypted(&spec, &mut |_, _| {})?;
            }
            None => {
                ds.create(self.name, size, self.prov, &mut |_, _| {})?;
            }
        }
        Ok(())
    }

    /// The new disk as `base`'s state, every grain shared, grown to `size`
    /// (FORMAT.md §17.2a).
    fn create_on(&self, ds: &dyn Datastore, base: &str, size: u64) -> Result<(), Error> {
        if self.encrypt.is_some() || self.prov != Provisioning::Thin {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "--base makes a thin disk that shares its base's grains: it cannot be {}",
                    if self.encrypt.is_some() {
                        "encrypted with a key of its own".to_string()
                    } else {
                        format!("--type {}", self.prov.as_str())
                    }
                ),
            ));
        }
        let have = ds.share_from(base, self.name)?.info.size_bytes;
        let grown = match have.cmp(&size) {
            std::cmp::Ordering::Greater => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "the image is {size} bytes, less than base '{base}' ({have} bytes): a disk \
                     does not shrink; import it without --base"
                ),
            )),
            std::cmp::Ordering::Less => ds.extend(self.name, size).map(|_| ()),
            std::cmp::Ordering::Equal => Ok(()),
        };
        if grown.is_err() {
            let _ = ds.remove(self.name);
        }
        grown
    }

    /// The report of an image of `format` that became the one disk asked
    /// for (no links, no snapshots); `base`: what sharing with it did.
    pub fn one_disk(
        &self,
        ds: &dyn Datastore,
        format: ImageFormat,
        base: Option<ImportBase>,
    ) -> Result<ImportReport, Error> {
        Ok(ImportReport {
            disk: ds.disk_view(self.name, false)?,
            format,
            links: None,
            snapshots: Vec::new(),
            base,
        })
    }
}

/// Bring `h`, a new disk holding its base's state, to the bytes of the
/// image file `f` (as long as the disk), a chunk at a time, calling
/// `step` before each: the grains that differ are written (unmapped where
/// the image holds zeros), equal ones stay shared. Holes of a sparse image
/// read as zeros (no disk I/O).
pub fn copy_onto_base(
    h: &dyn BlockDevice,
    f: &std::fs::File,
    base: &str,
    step: &dyn Fn() -> Result<(), Error>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportBase, Error> {
    let mut r = ImportBase {
        base: base.to_string(),
        same_bytes: 0,
        written_bytes: 0,
        unmapped_bytes: 0,
    };
    let size = h.size_bytes();
    let (mut img, mut cur) = (vec![0u8; CHUNK], vec![0u8; CHUNK]);
    let mut off = 0u64;
    while off < size {
        step()?;
        let n = (CHUNK as u64).min(size - off) as usize;
        f.read_exact_at(&mut img[..n], off)
            .map_err(|e| Error::new(ErrorKind::Io, format!("reading the image at {off}: {e}")))?;
        h.read_at(&mut cur[..n], off)?;
        for p in (0..n).step_by(GRAIN) {
            let (a, b) = (&img[p..n.min(p + GRAIN)], &cur[p..n.min(p + GRAIN)]);
            let at = off + p as u64;
            if a == b {
                if a.iter().any(|&x| x != 0) {
                    r.same_bytes += a.len() as u64;
                }
            } else if a.iter().all(|&x| x == 0) {
                let unmap = ZeroOptions {
                    may_unmap: true,
                    fast_only: false,
                    fua: false,
                };
                h.write_zeroes(at, a.len() as u64, unmap)?;
                r.unmapped_bytes += a.len() as u64;
            } else {
                h.write_at(a, at, false)?;
                r.written_bytes += a.len() as u64;
            }
        }
        off += n as u64;
        progress(off, size);
    }
    h.flush()?;
    Ok(r)
}
