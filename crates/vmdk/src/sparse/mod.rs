//! Grain-table extents: hosted sparse (`KDMV`, incl. streamOptimized),
//! VMFSsparse (`COWD`) and SEsparse. All three map an extent sector to a
//! grain through a grain directory (GD) of grain tables (GT); they differ in
//! entry width, in how an entry names a grain and in which special entries
//! exist. One type handles all three so the read/write/zero paths are shared.
//!
//! Writes append new grains at the end of the file (QEMU does the same).
//! Table, directory and header updates are held in memory and written at the
//! next flush, after the data they point to has been synced: a crash before
//! a flush leaves the old entries, never one naming a grain whose data was
//! lost (which reads as zeros, or as another grain's data once the space is
//! allocated again).
//!
//! Modules, each depending only on those above it in this list:
//! - `header`: the three headers' codecs, [`Header`], [`HeaderError`]
//! - `geometry`: [`Geometry`], table positions and sizes in named units
//! - `entry`: GD/GT entry codecs ([`Gte`]), pure functions of the header
//! - `io`, `table`, `held`: file I/O helpers, the GT cache, the state the
//!   allocation lock guards (held updates, the append cursor)
//! - `extent`: [`SparseExtent`]: open, lookups, grain reads
//! - `alloc`: the write side (new grains and tables, flush order)
//! - `check`, `shrink`: check/repair and SEsparse shrink
//! - `create`: empty extents of each format

mod alloc;
mod check;
mod create;
mod entry;
mod extent;
mod geometry;
mod header;
mod held;
mod io;
mod shrink;
mod table;

pub use alloc::GrainTx;
pub use create::{create_cowd, create_kdmv, create_sesparse};
pub use entry::{se_decode_index, se_encode_index, EntryError, Gte};
pub use extent::{open_extent, ExtentFile, SparseExtent, MAX_BUFFERED_GRAIN};
pub use geometry::{Geometry, GeometryError};
pub use header::*;
pub use shrink::{OnlineShrink, ONLINE_MOVE_GRAINS, ONLINE_SCAN_GRAINS};

// What `check` and `shrink` report: strata-api's vocabulary.
pub use strata_api::{ExtentCheck, ShrinkReport};
