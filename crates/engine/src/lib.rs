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
//! What it answers (disk, snapshot, group and datastore info, reports,
//! alarm rules and their evaluation) is written in strata-api's
//! vocabulary, which both kinds of datastore share; the engine re-exports
//! those types where its own signatures use them.
//!
//! Modules, each depending only on those listed before it (ARCHITECTURE.md
//! draws them): `error`, `catalog` (disks, snapshots, versions as stored),
//! `cache` (bounded page cache), `journal` (the log files), `meta` (pages,
//! counts, allocation, trees, versions, replay), `check`, `upgrade` (format
//! version 1 → 2), `store` (commit, checkpoint, space rule, fail-stop),
//! `disk` (the I/O path, a [`strata_block::BlockDevice`]), `datastore`
//! (open, recovery, catalog operations).
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

// The datastore crate evaluates an object store's alarms through this path.
pub use strata_api::alarm;
mod cache;
pub mod catalog;
pub mod check;
mod compress;
pub mod datastore;
mod dedup;
pub mod disk;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
mod journal;
pub mod layout;
mod meta;
mod rekey;
mod settled;
mod store;
pub use strata_block::throttle;
mod upgrade;
mod work;

pub use catalog::split_target;
pub use datastore::{
    check_group_size, clone_name, clone_plan, deep_rekey_resumes, group_full, last_disk,
    membership_changed, slot_info, stopped_clone, CarriedKeys, ChangedRange, Datastore,
    DeepRekeyReport, FullClone, GroupSnapshotOptions, InitOptions, NewDisk, NewKeys, OpenOptions,
    SpaceWork,
};
pub use disk::DiskHandle;
pub use error::{Error, ErrorKind, Result};
// strata-api's vocabulary, in the engine's signatures.
pub use strata_api::alarm::{AlarmKind, AlarmRule, AlarmState, AlarmStatus, ReportedAlarms};
pub use strata_api::{
    CheckReport, CompressReport, Consistency, DatastoreInfo, DedupEstimate, DedupReport,
    DefragReport, DiskInfo, FailStop, FreeSpaceReport, GroupInfo, GroupMemberInfo,
    GroupSnapshotInfo, PackCodec, PoolLayout, Provisioning, PunchZeroReport, QuiesceReport,
    QuiesceResult, SnapshotInfo,
};
pub use throttle::IoLimits;
pub use work::{Pacer, WorkControl};
