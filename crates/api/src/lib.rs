//! What strata's commands ask and answer, as types, with nothing that
//! runs them: what a client of a strata server (the CLI, a test, a tool)
//! links instead of the daemon.
//!
//! - [`Request`] → [`Response`]: a datastore command and its answer, the
//!   same typed values whether strata-server's `ops` runs the request in
//!   the caller's process or a server answers it over the control socket;
//!   each answer's `--json` document is [`Response::to_json`] (also the
//!   HTTP API's, docs/API.md). [`VmdkRequest`] → [`VmdkResponse`]: the
//!   commands on VMDK files.
//! - [`wire`]: the control socket's framing ([`wire::Reply`] lines) and its
//!   client ([`wire::request`]).
//! - [`units`]: sizes and times on the command line and in output.
//! - The vocabulary the answers are written in, which both kinds of
//!   datastore share: [`disk`] (provisioning, disk and snapshot info),
//!   [`datastore`] (space, state, a local datastore's reports), [`group`]
//!   (consistency groups), [`alarm`] (thresholds and their evaluation),
//!   [`job`], [`event`] (the event log's entries), [`stats`] (a disk's I/O
//!   statistics); an object store's own
//!   answers in [`store`], and a disk or datastore of either kind in
//!   [`view`]; [`vmdk`] for VMDK files.
//!
//! Layering: this crate knows `strata-block` (the one error, I/O limits)
//! and nothing else of strata. The engine, the VMDK driver, the
//! statistics (`strata-stats`), the object store (`strata-objstore`) and
//! the either-kind layer (`strata-datastore`) depend on it and answer in
//! its types, so a type both they and a client need lives here, below them
//! all, and the client links none of them. Some of it is also written
//! to disk: [`Provisioning`], [`AlarmRule`], [`Consistency`] and
//! [`QuiesceReport`] are fields of the local datastore's catalog records
//! (docs/FORMAT.md §6), and [`store::Owner`], [`store::RootObject`] and
//! [`store::HostRef`] are written to an object store (§11), so their serde
//! shapes change only with the format.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

use serde::Serialize;
use serde_json::Value;

pub mod alarm;
pub mod datastore;
pub mod disk;
pub mod event;
pub mod group;
pub mod job;
pub mod key;
pub mod request;
pub mod response;
pub mod schedule;
pub mod stats;
pub mod store;
pub mod units;
pub mod view;
pub mod vmdk;
pub mod wire;

pub use alarm::{AlarmKind, AlarmRule, AlarmState, AlarmStatus, ReportedAlarms};
pub use datastore::{
    CheckReport, CompressReport, DatastoreInfo, DedupEstimate, DedupReport, DefragReport, FailStop,
    FreeSpaceReport, PackCodec, PoolLayout, FREE_EXTENT_CLASSES,
};
pub use disk::{
    DiskInfo, Encryption, KeySlotInfo, Provisioning, PunchZeroReport, RekeyProgress, SnapshotInfo,
};
pub use event::Event;
pub use group::{
    Consistency, GroupInfo, GroupMemberInfo, GroupSnapshotInfo, GroupSnapshotReport, QuiesceReport,
    QuiesceResult,
};
pub use job::{JobAction, JobInfo, JobState};
pub use key::{KeyGrant, Secret};
pub use request::{ImageFormat, KeyRequest, Request};
pub use response::{
    AlarmEntry, DiffRange, DiffReport, ExportDiffReport, ExportReport, ExportStats, ExportedLink,
    ImportBase, ImportDiffReport, ImportReport, ImportedLink, MoveReport, RangeKind, Response,
    VmdkServerStatus,
};
pub use schedule::{ScheduleInfo, ScheduleSpec, TargetKind};
pub use strata_block::throttle::IoLimits;
pub use strata_block::{Error, Kind as ErrorKind};
pub use view::{ClientInfo, DatastoreView, DiskView, Refusal, StoreDisk, VhostExport};
pub use vmdk::{
    ExtentCheck, ShrinkReport, ShrinkResult, Subformat, VmdkCheckReport, VmdkExtentInfo,
    VmdkFileCheck, VmdkInfo, VmdkLinkInfo, VmdkRequest, VmdkResponse,
};

/// A `--json` document: a serialisable answer as a JSON value.
fn value<T: Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).expect("serialisable")
}
