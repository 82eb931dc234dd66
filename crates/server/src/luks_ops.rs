//! LUKS1 images in and out (docs/FORMAT.md §16.6): `export --format luks`
//! writes a disk or snapshot as an image QEMU's `luks` driver and
//! cryptsetup open with the given secret; `import` of a LUKS1 image makes
//! an encrypted disk whose first keyslot opens with the image's secret.
//! Neither ever puts the disk's own data key in the image, nor the image's
//! master key in the datastore.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use strata_api::{ExportReport, ExportedLink, ImageFormat, ImportReport, Secret};
use strata_block::BlockDevice;
use strata_crypt::luks::{self, LuksHeader};
use strata_crypt::CryptError;
use strata_datastore::Datastore;
use strata_engine::{Error, ErrorKind};

use crate::copier::{put_grains, Work, EXPORT_REMOVED};
use crate::imports::Import;

/// Bytes moved per step: read, cipher, write.
const CHUNK: usize = 1 << 20;

fn io(what: &Path, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("{}: {e}", what.display()))
}

/// A LUKS problem as an error about `file`.
fn luks_error(file: &Path, e: CryptError) -> Error {
    let kind = match e {
        CryptError::Io(_) => ErrorKind::Io,
        _ => ErrorKind::InvalidArgument,
    };
    let what = match e {
        CryptError::WrongKey => "wrong key: no keyslot of the image opens with it".to_string(),
        CryptError::Damaged(why) => format!("damaged LUKS header: {why}"),
        other => other.to_string(),
    };
    Error::new(kind, format!("{}: {what}", file.display()))
}

/// Open `target`'s disk with `secret` when it is encrypted and not held
/// here yet, so that the same secret reads the disk and opens the image.
fn readable(ds: &dyn Datastore, target: &str, secret: &Secret) -> Result<(), Error> {
    let disk = strata_engine::split_target(target).0;
    let locked = ds.disk_info(disk)?.encryption.is_some_and(|e| e.locked);
    if !locked {
        return Ok(());
    }
    ds.unlock(disk, secret.expose()).map(|_| ()).map_err(|e| {
        Error::new(
            e.kind,
            format!(
                "{e}: '{disk}' is locked and the export's key does not open it; unlock it first \
                 ('strata unlock {disk}'), then export with the image's key"
            ),
        )
    })
}

/// QEMU's luks driver takes a passphrase only as UTF-8 text without NUL
/// (it refuses the image otherwise), so an export's secret must be one.
fn qemu_can_use(secret: &Secret) -> Result<(), Error> {
    let text = std::str::from_utf8(secret.expose()).ok();
    if text.is_some_and(|t| !t.contains('\0')) {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::InvalidArgument,
        "a LUKS image's secret must be UTF-8 text without NUL bytes, the only passphrases \
         QEMU's luks driver accepts; make a text key file (e.g. 'openssl rand -base64 32 > \
         FILE') and add it to the disk with 'strata key add' if it should open the disk too",
    ))
}

/// Write `target` (DISK or DISK@SNAP) to the new file `out` as a LUKS1
/// image opened by `secret`.
pub fn export(
    ds: &dyn Datastore,
    target: &str,
    out: &Path,
    secret: &Secret,
    work: &mut Work<'_>,
) -> Result<ExportReport, Error> {
    qemu_can_use(secret)?;
    readable(ds, target, secret)?;
    let h = ds.open(target)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} exists; an export never overwrites a file",
                    out.display()
                ),
            ),
            _ => io(out, e),
        })?;
    // A failed or stopped export leaves no file (it was not there).
    write_image(&*h, &f, out, secret, work).map_err(|e| {
        let _ = std::fs::remove_file(out);
        work.stopped_leaving(e, EXPORT_REMOVED)
    })?;
    Ok(ExportReport {
        target: target.to_string(),
        open: out.display().to_string(),
        links: vec![ExportedLink {
            file: out.display().to_string(),
            version: target.to_string(),
            subformat: "luks1".to_string(),
        }],
    })
}

fn write_image(
    h: &dyn BlockDevice,
    f: &File,
    out: &Path,
    secret: &Secret,
    work: &mut Work<'_>,
) -> Result<(), Error> {
    let key = secret.expose();
    let new =
        luks::create(key, luks::slot_iterations(key.len())).map_err(|e| luks_error(out, e))?;
    f.write_all_at(&new.area, 0).map_err(|e| io(out, e))?;
    let base = new.header.payload_byte();
    let size = h.size_bytes();
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    while off < size {
        let n = (CHUNK as u64).min(size - off) as usize;
        let piece = &mut buf[..n];
        h.read_at(piece, off)?;
        new.payload.encrypt(piece, off / 512);
        f.write_all_at(piece, base + off).map_err(|e| io(out, e))?;
        off += n as u64;
        (work.progress)(off, size);
        work.checkpoint()?;
    }
    f.sync_all().map_err(|e| io(out, e))
}

/// Import a LUKS1 image as a new encrypted disk whose first keyslot is
/// for `what.encrypt`, the image's passphrase (which it needs).
pub fn import(
    ds: &dyn Datastore,
    what: &Import<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<ImportReport, Error> {
    let path = what.path;
    let key = what.encrypt.ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{} is a LUKS image: importing it needs its key (--key-file FILE, \
                 --key-keyring NAME, --key-helper CMD or --key-prompt)",
                path.display()
            ),
        )
    })?;
    let f = File::open(path).map_err(|e| io(path, e))?;
    let len = f.metadata().map_err(|e| io(path, e))?.len();
    let mut head = [0u8; luks::HEADER_BYTES];
    f.read_exact_at(&mut head, 0)
        .map_err(|e| luks_error(path, CryptError::Damaged(format!("header: {e}"))))?;
    let header = LuksHeader::parse(&head, len).map_err(|e| luks_error(path, e))?;
    let (payload, _) = header
        .open(key.secret.expose(), &mut |at, buf| f.read_exact_at(buf, at))
        .map_err(|e| luks_error(path, e))?;
    let base = header.payload_byte();
    let size = len - base;
    if size == 0 || !size.is_multiple_of(512) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{}: its payload is {size} bytes, not a whole, non-zero number of 512-byte sectors",
                path.display()
            ),
        ));
    }
    what.create(ds, size)?;
    let r = (|| {
        let h = ds.open(what.name)?;
        let mut buf = vec![0u8; CHUNK];
        let mut off = 0u64;
        while off < size {
            what.step()?;
            let n = (CHUNK as u64).min(size - off) as usize;
            let piece = &mut buf[..n];
            f.read_exact_at(piece, base + off)
                .map_err(|e| io(path, e))?;
            payload.decrypt(piece, off / 512);
            put_grains(&*h, piece, off, false)?;
            off += n as u64;
            progress(off, size);
        }
        h.flush()
    })();
    if let Err(e) = r {
        let _ = ds.remove(what.name);
        return Err(e);
    }
    what.one_disk(ds, ImageFormat::Luks, None)
}
