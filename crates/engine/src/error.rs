//! The engine's error: a small stable kind for callers, a message for people.

use std::fmt;

use strata_block::{BlockError, ErrorKind as BlockKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// No disk, snapshot or datastore by that name.
    NotFound,
    /// The name is taken.
    AlreadyExists,
    /// An argument makes no sense (bad name, size, range).
    InvalidArgument,
    /// The datastore has no space for this.
    NoSpace,
    /// Another process holds the datastore.
    Locked,
    /// The operation is refused in the current state (e.g. read-only).
    Refused,
    /// Stored data failed a check.
    Corrupt,
    /// The storage layer failed; the datastore refuses further writes until reopened.
    Io,
    /// The disk was removed while in use.
    Gone,
}

#[derive(Debug, Clone)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
}

pub(crate) fn err<T>(kind: ErrorKind, message: impl Into<String>) -> Result<T> {
    Err(Error::new(kind, message))
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == std::io::ErrorKind::StorageFull {
            return Error::new(ErrorKind::NoSpace, format!("file system full: {e}"));
        }
        Error::new(ErrorKind::Io, e.to_string())
    }
}

impl From<strata_format::FormatError> for Error {
    fn from(e: strata_format::FormatError) -> Self {
        Error::new(ErrorKind::Corrupt, e.to_string())
    }
}

impl From<Error> for BlockError {
    fn from(e: Error) -> Self {
        let kind = match e.kind {
            ErrorKind::NotFound | ErrorKind::Gone => BlockKind::Gone,
            ErrorKind::AlreadyExists | ErrorKind::InvalidArgument => BlockKind::InvalidArgument,
            ErrorKind::NoSpace => BlockKind::NoSpace,
            ErrorKind::Locked | ErrorKind::Refused => BlockKind::ReadOnly,
            ErrorKind::Corrupt => BlockKind::Corrupt,
            ErrorKind::Io => BlockKind::Io,
        };
        BlockError::new(kind, e.message)
    }
}

impl From<BlockError> for Error {
    fn from(e: BlockError) -> Self {
        let kind = match e.kind {
            BlockKind::InvalidArgument | BlockKind::OutOfRange => ErrorKind::InvalidArgument,
            BlockKind::NoSpace => ErrorKind::NoSpace,
            BlockKind::ReadOnly | BlockKind::NotSupported => ErrorKind::Refused,
            BlockKind::Corrupt => ErrorKind::Corrupt,
            BlockKind::Io => ErrorKind::Io,
            BlockKind::Gone => ErrorKind::Gone,
        };
        Error::new(kind, e.context)
    }
}
