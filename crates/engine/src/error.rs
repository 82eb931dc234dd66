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

/// A host file system that will not grow a file (full, a file-size limit,
/// a quota) leaves the datastore out of space, not broken: the NBD protocol
/// asks that EFBIG and EDQUOT reach the client as ENOSPC. The message keeps
/// the host's own reason.
impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        use std::io::ErrorKind as Io;
        // By kind, not only errno: the storage layer adds context to its
        // errors, which keeps the kind but drops the raw errno.
        let cause = match (e.raw_os_error(), e.kind()) {
            (Some(libc::ENOSPC), _) | (_, Io::StorageFull) => Some("file system full"),
            (Some(libc::EFBIG), _) | (_, Io::FileTooLarge) => {
                Some("file too large (EFBIG) on the host")
            }
            (Some(libc::EDQUOT), _) | (_, Io::QuotaExceeded) => {
                Some("disk quota exceeded (EDQUOT) on the host")
            }
            _ => None,
        };
        match cause {
            Some(cause) => Error::new(ErrorKind::NoSpace, format!("{cause}: {e}")),
            None => Error::new(ErrorKind::Io, e.to_string()),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_that_will_not_grow_a_file_is_out_of_space() {
        for errno in [libc::ENOSPC, libc::EFBIG, libc::EDQUOT] {
            let e = Error::from(std::io::Error::from_raw_os_error(errno));
            assert_eq!(e.kind, ErrorKind::NoSpace, "errno {errno}: {e}");
            assert_eq!(BlockError::from(e).errno(), libc::ENOSPC, "errno {errno}");
        }
        let e = Error::from(std::io::Error::from_raw_os_error(libc::EFBIG));
        assert!(e.message.contains("EFBIG"), "{e}");
        // With context added, as the storage layer does: the kind remains.
        for errno in [libc::ENOSPC, libc::EFBIG, libc::EDQUOT] {
            let raw = std::io::Error::from_raw_os_error(errno);
            let e = Error::from(std::io::Error::new(raw.kind(), format!("write x: {raw}")));
            assert_eq!(
                e.kind,
                ErrorKind::NoSpace,
                "errno {errno} with context: {e}"
            );
        }
        let e = Error::from(std::io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(e.kind, ErrorKind::Io);
    }
}
