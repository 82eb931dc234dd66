//! strata's VMDK drivers: open VMware virtual disks (descriptor + flat,
//! hosted sparse, streamOptimized, VMFSsparse/COWD and SEsparse extents,
//! and chains of them) as a [`strata_block::BlockDevice`], create them for
//! export, check and repair them, and shrink SEsparse deltas.
//!
//! The layouts are in docs/FORMAT.md ("VMDK") and
//! ../shared/reference/vmdk-formats.md.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

pub mod chain;
pub mod create;
pub mod descriptor;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod lock;
pub mod sparse;

pub use chain::{OpenOptions, RangeState, VmdkImage};
pub use create::{create_image, ImageSpec, StreamWriter};
pub use descriptor::Descriptor;
pub use error::{Result, VmdkError, VmdkErrorKind};

// What `export --subformat` writes: strata-api's vocabulary.
pub use strata_api::Subformat;
