//! The VMDK drivers return strata's one error (docs/ERRORS.md), with the
//! file it concerns as its place. The constructors here name the cases
//! the drivers raise: a file that does not follow the format and a broken
//! snapshot chain are `Corrupt`, a lock held by another open is `Locked`.

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

/// Reading or writing `file` failed (a full host file system is `NoSpace`).
pub fn io(file: &str, e: io::Error) -> VmdkError {
    let e = VmdkError::from(e);
    new(e.kind, file, e.message)
}
