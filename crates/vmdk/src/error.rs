//! The VMDK drivers return strata's one error (docs/ERRORS.md), with the
//! file it concerns as its place. The constructors here name the cases
//! the drivers raise: a file that does not follow the format and a broken
//! snapshot chain are `Corrupt`, a lock held by another open is `Locked`.
//! Opening and creating an image name the file by its path (in the
//! backend's folder) with op "open" or "create", and a header that fails
//! to parse by where in the file it lies.

use std::io;

pub use strata_block::{Error as VmdkError, Kind as VmdkErrorKind};

pub type Result<T> = std::result::Result<T, VmdkError>;

/// An error of `kind` about `file` (none when `file` is empty).
pub fn new(kind: VmdkErrorKind, file: impl Into<String>, what: impl Into<String>) -> VmdkError {
    let e = VmdkError::new(kind, what);
    let file = file.into();
    if file.is_empty() {
        e
    } else {
        e.at(file)
    }
}

/// A header, descriptor or table that does not follow the format.
pub fn malformed(file: &str, what: impl Into<String>) -> VmdkError {
    new(VmdkErrorKind::Corrupt, file, what)
}

/// Valid VMDK, but a kind or feature strata does not handle.
pub fn unsupported(file: &str, what: impl Into<String>) -> VmdkError {
    new(VmdkErrorKind::Unsupported, file, what)
}

/// A broken snapshot chain: a missing parent, a CID mismatch, a cycle.
pub fn chain(file: &str, what: impl Into<String>) -> VmdkError {
    new(VmdkErrorKind::Corrupt, file, what)
}

/// `file` is locked by another open (see `crate::lock`).
pub fn in_use(file: &str, for_writing: bool) -> VmdkError {
    let why = if for_writing {
        "in use: another process has it open (locked), so it cannot be opened for writing"
    } else {
        "in use: another process is writing it (locked), so it cannot be opened for reading"
    };
    new(VmdkErrorKind::Locked, file, why)
}

/// `e` as the public constructors return it: raised by `op` ("open",
/// "create") on a file of the chain whose names are relative to `folder`
/// (a backend's [`describe`](strata_storage::Backend::describe): the
/// directory of a file backend), so that its place names the file by its
/// path there.
pub(crate) fn in_folder(mut e: VmdkError, folder: &str, op: &'static str) -> VmdkError {
    if let Some(name) = e.place.object.take() {
        let path = std::path::Path::new(folder).join(&name);
        e = e.at(path.display().to_string());
    }
    if e.place.op.is_none() {
        e = e.op(op);
    }
    e
}

/// Reading or writing `file` failed (a full host file system is `NoSpace`).
pub fn io(file: &str, e: io::Error) -> VmdkError {
    let e = VmdkError::from(e);
    new(e.kind, file, e.message)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use strata_block::BlockDevice as _;
    use strata_storage::{Backend, FileBackend, SimBackend};

    use crate::{create_image, ImageSpec, OpenOptions, Subformat, VmdkErrorKind, VmdkImage};

    /// A monolithicSparse image `vm.vmdk` of 1 MiB in a new directory.
    fn image() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let b: Arc<dyn Backend> = Arc::new(FileBackend::new(dir.path()));
        let spec = ImageSpec::new(Subformat::MonolithicSparse, 2048);
        drop(create_image(b, "vm.vmdk", &spec).unwrap());
        let path = dir.path().join("vm.vmdk");
        (dir, path)
    }

    #[test]
    fn a_header_that_fails_to_parse_names_the_file_and_where() {
        let (_dir, path) = image();
        // KDMV's version (bytes 4..8), one no tool writes.
        let mut b = std::fs::read(&path).unwrap();
        b[4..8].copy_from_slice(&9u32.to_le_bytes());
        std::fs::write(&path, b).unwrap();
        let e = VmdkImage::open(&path, &OpenOptions::default())
            .err()
            .expect("refused");
        assert_eq!(e.kind, VmdkErrorKind::Corrupt, "{e}");
        let file = path.display().to_string();
        assert_eq!(e.place.object.as_deref(), Some(file.as_str()), "{e}");
        assert_eq!(
            (e.place.offset, e.place.op.as_deref()),
            (Some(0), Some("open")),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            format!("{file} at 0: open: KDMV version 9 (1, 2 or 3 expected)")
        );
    }

    #[test]
    fn opening_and_creating_name_the_file_by_its_path() {
        let (dir, path) = image();
        // A file that is not there.
        let gone = dir.path().join("gone.vmdk");
        let e = VmdkImage::open(&gone, &OpenOptions::default())
            .err()
            .expect("refused");
        let want = gone.display().to_string();
        assert_eq!(e.place.object.as_deref(), Some(want.as_str()), "{e}");
        assert_eq!(e.place.op.as_deref(), Some("open"), "{e}");
        // A path with `..` in it: the file as opened.
        let odd = dir.path().join("sub/../vm.vmdk");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let img = VmdkImage::open(&odd, &OpenOptions::default()).unwrap();
        // Open for reading: a write is refused, naming the file.
        let e = img.write_at(&[0u8; 512], 0, false).unwrap_err();
        assert_eq!(e.kind, VmdkErrorKind::ReadOnly, "{e}");
        assert_eq!(e.place.object.as_deref(), Some("vm.vmdk"), "{e}");
        drop(img);
        // Created over a file that is there.
        let b: Arc<dyn Backend> = Arc::new(FileBackend::new(dir.path()));
        let spec = ImageSpec::new(Subformat::SeSparse, 2048);
        let e = create_image(b.clone(), "vm.vmdk", &spec)
            .err()
            .expect("refused");
        let want = path.display().to_string();
        assert_eq!(e.place.object.as_deref(), Some(want.as_str()), "{e}");
        assert_eq!(e.place.op.as_deref(), Some("create"), "{e}");
        assert_eq!(
            e.to_string(),
            format!("{want}: create: already exists; refusing to overwrite it")
        );
        let e = crate::StreamWriter::create(&*b, "vm.vmdk", 2048, "lsilogic")
            .err()
            .expect("refused");
        assert_eq!(e.place.object.as_deref(), Some(want.as_str()), "{e}");
        assert_eq!(e.place.op.as_deref(), Some("create"), "{e}");
    }

    #[test]
    fn a_broken_chain_names_the_file_that_points_nowhere() {
        let b = SimBackend::new();
        let spec = ImageSpec::new(Subformat::VmfsSparse, 2048);
        drop(create_image(Arc::new(b.clone()), "dir/x.vmdk", &spec).unwrap());
        let text = "# Disk DescriptorFile\nversion=1\nCID=00000001\nparentCID=00000002\n\
                    createType=\"vmfsSparse\"\nparentFileNameHint=\"gone.vmdk\"\n\n\
                    # Extent description\nRW 2048 VMFSSPARSE \"x-delta.vmdk\"\n";
        let f = b.open("dir/orphan.vmdk", true).unwrap();
        f.write_at(text.as_bytes(), 0).unwrap();
        let e = VmdkImage::open_in(Arc::new(b), "dir/orphan.vmdk", &OpenOptions::default())
            .err()
            .expect("refused");
        // Named in the backend, which a SimBackend describes as "sim".
        assert_eq!(
            e.place.object.as_deref(),
            Some("sim/dir/orphan.vmdk"),
            "{e}"
        );
        assert_eq!(e.place.op.as_deref(), Some("open"), "{e}");
    }
}
