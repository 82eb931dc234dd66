//! Errors of the VMDK drivers: what is wrong, and in which file.

use std::fmt;
use std::io;

use strata_block::{BlockError, ErrorKind};

/// What kind of problem a VMDK operation ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmdkErrorKind {
    /// Reading or writing a file failed.
    Io,
    /// A header, descriptor or table does not follow the format.
    Malformed,
    /// Valid VMDK, but a kind or feature strata does not handle.
    Unsupported,
    /// The snapshot chain is broken: missing parent, CID mismatch, cycle, too deep.
    Chain,
    /// A write to a read-only link or format.
    ReadOnly,
    /// An argument out of range (offset past the end, misaligned).
    InvalidArgument,
    /// Another open of the file holds a lock that conflicts with ours
    /// (a server is writing it, or reading it while we want to write).
    InUse,
}

/// An error with the file it concerns and a sentence for people.
#[derive(Debug, Clone)]
pub struct VmdkError {
    pub kind: VmdkErrorKind,
    pub file: String,
    pub what: String,
}

pub type Result<T> = std::result::Result<T, VmdkError>;

impl VmdkError {
    pub fn new(kind: VmdkErrorKind, file: impl Into<String>, what: impl Into<String>) -> Self {
        Self {
            kind,
            file: file.into(),
            what: what.into(),
        }
    }

    pub fn malformed(file: &str, what: impl Into<String>) -> Self {
        Self::new(VmdkErrorKind::Malformed, file, what)
    }

    pub fn unsupported(file: &str, what: impl Into<String>) -> Self {
        Self::new(VmdkErrorKind::Unsupported, file, what)
    }

    pub fn chain(file: &str, what: impl Into<String>) -> Self {
        Self::new(VmdkErrorKind::Chain, file, what)
    }

    /// `file` is locked by another open (see `crate::lock`).
    pub fn in_use(file: &str, for_writing: bool) -> Self {
        let why = if for_writing {
            "in use: another process has it open (locked), so it cannot be opened for writing"
        } else {
            "in use: another process is writing it (locked), so it cannot be opened for reading"
        };
        Self::new(VmdkErrorKind::InUse, file, why)
    }

    pub fn io(file: &str, e: io::Error) -> Self {
        Self::new(VmdkErrorKind::Io, file, e.to_string())
    }
}

impl fmt::Display for VmdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.file.is_empty() {
            write!(f, "{}", self.what)
        } else {
            write!(f, "{}: {}", self.file, self.what)
        }
    }
}

impl std::error::Error for VmdkError {}

impl From<VmdkError> for BlockError {
    fn from(e: VmdkError) -> Self {
        let kind = match e.kind {
            VmdkErrorKind::Io => ErrorKind::Io,
            VmdkErrorKind::Malformed | VmdkErrorKind::Chain => ErrorKind::Corrupt,
            VmdkErrorKind::Unsupported => ErrorKind::NotSupported,
            VmdkErrorKind::ReadOnly => ErrorKind::ReadOnly,
            VmdkErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
            VmdkErrorKind::InUse => ErrorKind::Io,
        };
        BlockError::new(kind, e.to_string())
    }
}
