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
        };
        BlockError::new(kind, e.to_string())
    }
}
