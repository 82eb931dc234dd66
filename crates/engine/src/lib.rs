//! strata's native engine.
//!
//! A [`Datastore`] holds disks; each disk's live state and each snapshot is
//! a *version* with its own map (a radix tree of 4 KiB nodes, see
//! docs/FORMAT.md §3). Versions share nodes and data grains by reference
//! counting, so snapshots and linked clones are O(1) to create, reads and
//! writes cost the same at any snapshot count, and deleting a snapshot moves
//! no data. Metadata changes go to an absolute-value redo log, committed at
//! client flush; checkpoints write pages in place (docs/FORMAT.md §5).
//!
//! Module map: `datastore` (open, recovery, commit, catalog operations),
//! `disk` (the I/O path, a [`strata_block::BlockDevice`]), `meta` (trees,
//! counts, allocation, log records), `cache` (bounded page cache),
//! `journal` (log file), `catalog` (disks and snapshots), `check`.

mod cache;
pub mod catalog;
pub mod check;
pub mod datastore;
pub mod disk;
pub mod error;
mod journal;
mod meta;

pub use catalog::Provisioning;
pub use check::CheckReport;
pub use datastore::{
    split_target, ChangedRange, Datastore, DatastoreInfo, DiskInfo, InitOptions, OpenOptions,
    SnapshotInfo,
};
pub use disk::DiskHandle;
pub use error::{Error, ErrorKind, Result};
