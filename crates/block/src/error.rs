//! strata's one error (docs/ERRORS.md): a [`Kind`] that callers, transports
//! and scripts decide by, the [`Place`] it concerns, a sentence for people,
//! and the cause, kept.
//!
//! Every layer from here up returns this type, so a kind raised deep in the
//! object-store client (the store did not answer) reaches an NBD client, the
//! control socket and the CLI's exit code unchanged. Each wire maps the kind
//! with one exhaustive `match` in the crate that owns the wire; the errno
//! shared by NBD and FUSE is here ([`Error::errno`]).

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// What went wrong, as far as anyone decides anything by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// No disk, snapshot, export, object or file by that name.
    NotFound,
    /// The name is taken.
    AlreadyExists,
    /// An argument that makes no sense (a bad name, size, misaligned request).
    InvalidArgument,
    /// A request reaches past the end of the device.
    OutOfRange,
    /// The datastore, the host's file system or its quota is full.
    NoSpace,
    /// A write to something opened or exported read-only.
    ReadOnly,
    /// Valid, but this build, datastore kind or store does not do it.
    Unsupported,
    /// Another process or open holds it (a datastore's lock, a VMDK's lock).
    Locked,
    /// Not now, in this state (a job running, a snapshot in use).
    Refused,
    /// Stored bytes failed a check; nothing is guessed.
    Corrupt,
    /// The host's storage failed.
    Io,
    /// The object store did not answer, or refused the credentials.
    Unavailable,
    /// Another host claimed the disk; this one may not write it.
    Fenced,
    /// This host handed the disk over; it writes no more.
    Released,
    /// Removed or closed while a request was in flight.
    Gone,
}

impl Kind {
    /// Every kind, in the order of docs/ERRORS.md.
    pub const ALL: [Kind; 15] = [
        Kind::NotFound,
        Kind::AlreadyExists,
        Kind::InvalidArgument,
        Kind::OutOfRange,
        Kind::NoSpace,
        Kind::ReadOnly,
        Kind::Unsupported,
        Kind::Locked,
        Kind::Refused,
        Kind::Corrupt,
        Kind::Io,
        Kind::Unavailable,
        Kind::Fenced,
        Kind::Released,
        Kind::Gone,
    ];

    /// The kind's name on the control socket and in HTTP bodies.
    pub fn name(self) -> &'static str {
        match self {
            Kind::NotFound => "not_found",
            Kind::AlreadyExists => "already_exists",
            Kind::InvalidArgument => "invalid_argument",
            Kind::OutOfRange => "out_of_range",
            Kind::NoSpace => "no_space",
            Kind::ReadOnly => "read_only",
            Kind::Unsupported => "unsupported",
            Kind::Locked => "locked",
            Kind::Refused => "refused",
            Kind::Corrupt => "corrupt",
            Kind::Io => "io",
            Kind::Unavailable => "unavailable",
            Kind::Fenced => "fenced",
            Kind::Released => "released",
            Kind::Gone => "gone",
        }
    }

    /// The kind named `name`; a name this build does not know is `Io`, so
    /// an older client still prints a newer server's message.
    pub fn from_name(name: &str) -> Kind {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .unwrap_or(Kind::Io)
    }

    /// What the kind means, as the start of a sentence a client prints
    /// before the message (the NBD handshake's refusal, the CLI's report).
    pub fn sentence(self) -> &'static str {
        match self {
            Kind::NotFound => "not found",
            Kind::AlreadyExists => "already exists",
            Kind::InvalidArgument => "invalid argument",
            Kind::OutOfRange => "out of range",
            Kind::NoSpace => "no space left",
            Kind::ReadOnly => "read-only",
            Kind::Unsupported => "not supported",
            Kind::Locked => "in use by another process",
            Kind::Refused => "refused in this state",
            Kind::Corrupt => "stored data failed a check",
            Kind::Io => "I/O error",
            Kind::Unavailable => "the server cannot reach its object store",
            Kind::Fenced => "another host holds the disk",
            Kind::Released => "this host handed the disk over",
            Kind::Gone => "removed or closed",
        }
    }
}

/// Where an error happened: for people and logs, never decided by.
///
/// On the control socket and in HTTP error bodies it is the member
/// `"place"`, with each of `object`, `offset` and `op` only when known
/// (strata-api's `wire::ReplyError`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Place {
    /// A disk, `DISK@SNAP`, export, object key or file path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// Bytes into it, when one request failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// What was being done: "read", "commit", "claim", "open", ...
    /// (owned when it came over a wire: the control socket's client
    /// rebuilds a server's error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<Cow<'static, str>>,
}

impl Place {
    /// Whether nothing of the place is known.
    pub fn is_empty(&self) -> bool {
        *self == Place::default()
    }
}

/// An error with a kind to decide by, where it happened, a sentence, and
/// its cause.
///
/// `kind` and `message` are public fields: callers match on the kind, and
/// tests read the message. Display prints `object at offset: op: message:
/// cause`, with the parts that are known.
#[derive(Debug, Clone)]
pub struct Error {
    pub kind: Kind,
    pub place: Place,
    pub message: String,
    /// The cause, shared so that the error stays `Clone`.
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(kind: Kind, message: impl Into<String>) -> Self {
        Error {
            kind,
            place: Place::default(),
            message: message.into(),
            source: None,
        }
    }

    /// The same error, about `object` (a disk, key or file).
    pub fn at(mut self, object: impl Into<String>) -> Self {
        self.place.object = Some(object.into());
        self
    }

    /// The same error, at `offset` bytes into its object.
    pub fn offset(mut self, offset: u64) -> Self {
        self.place.offset = Some(offset);
        self
    }

    /// The same error, raised while doing `op`.
    pub fn op(mut self, op: impl Into<Cow<'static, str>>) -> Self {
        self.place.op = Some(op.into());
        self
    }

    /// The same error, caused by `cause`.
    pub fn caused_by(mut self, cause: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Arc::new(cause));
        self
    }

    /// The same error with `what` in front of its message ("opening x: ...").
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }

    /// The Linux errno NBD and FUSE report for this error (the NBD spec's
    /// list: EPERM, EIO, ENOMEM, EINVAL, ENOSPC, EOVERFLOW, ENOTSUP,
    /// ESHUTDOWN). FUSE refines a few (see the fuse crate).
    pub fn errno(&self) -> i32 {
        match self.kind {
            Kind::NotFound | Kind::Gone => libc::ESHUTDOWN,
            Kind::AlreadyExists | Kind::InvalidArgument | Kind::OutOfRange => libc::EINVAL,
            Kind::NoSpace => libc::ENOSPC,
            Kind::ReadOnly | Kind::Locked | Kind::Refused | Kind::Fenced | Kind::Released => {
                libc::EPERM
            }
            Kind::Unsupported => libc::ENOTSUP,
            Kind::Corrupt | Kind::Io | Kind::Unavailable => libc::EIO,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Place { object, offset, op } = &self.place;
        match (object, offset) {
            (Some(object), Some(offset)) => write!(f, "{object} at {offset}: ")?,
            (Some(object), None) => write!(f, "{object}: ")?,
            (None, Some(offset)) => write!(f, "at {offset}: ")?,
            (None, None) => {}
        }
        if let Some(op) = op {
            write!(f, "{op}: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(cause) = &self.source {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

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
            Some(cause) => Error::new(Kind::NoSpace, format!("{cause}: {e}")),
            None => Error::new(Kind::Io, e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_that_will_not_grow_a_file_is_out_of_space() {
        for errno in [libc::ENOSPC, libc::EFBIG, libc::EDQUOT] {
            let e = Error::from(std::io::Error::from_raw_os_error(errno));
            assert_eq!(e.kind, Kind::NoSpace, "errno {errno}: {e}");
            assert_eq!(e.errno(), libc::ENOSPC, "errno {errno}");
        }
        let e = Error::from(std::io::Error::from_raw_os_error(libc::EFBIG));
        assert!(e.message.contains("EFBIG"), "{e}");
        // With context added, as the storage layer does: the kind remains.
        for errno in [libc::ENOSPC, libc::EFBIG, libc::EDQUOT] {
            let raw = std::io::Error::from_raw_os_error(errno);
            let e = Error::from(std::io::Error::new(raw.kind(), format!("write x: {raw}")));
            assert_eq!(e.kind, Kind::NoSpace, "errno {errno} with context: {e}");
        }
        let e = Error::from(std::io::Error::from_raw_os_error(libc::EIO));
        assert_eq!(e.kind, Kind::Io);
    }

    #[test]
    fn every_name_reads_back_as_its_kind_and_an_unknown_one_as_io() {
        for k in Kind::ALL {
            assert_eq!(Kind::from_name(k.name()), k);
        }
        assert_eq!(Kind::from_name("from_a_newer_server"), Kind::Io);
        let mut names: Vec<_> = Kind::ALL.iter().map(|k| k.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Kind::ALL.len());
    }

    #[test]
    fn display_names_the_place_the_message_and_the_cause() {
        let e = Error::new(Kind::Unavailable, "no answer in 5 s")
            .at("disks/d/m")
            .op("read");
        assert_eq!(e.to_string(), "disks/d/m: read: no answer in 5 s");
        let e = Error::new(Kind::Io, "short read")
            .at("vm.img")
            .offset(4096)
            .caused_by(std::io::Error::from_raw_os_error(libc::EIO));
        assert!(
            e.to_string().starts_with("vm.img at 4096: short read: "),
            "{e}"
        );
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(Error::new(Kind::Gone, "closed").to_string(), "closed");
    }
}
