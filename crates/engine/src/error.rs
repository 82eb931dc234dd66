//! The engine returns strata's one error (`strata_block::Error`,
//! docs/ERRORS.md); `ErrorKind` is its kind under the name the engine's
//! callers have always used.

pub use strata_block::{Error, Kind as ErrorKind};

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn err<T>(kind: ErrorKind, message: impl Into<String>) -> Result<T> {
    Err(Error::new(kind, message))
}
