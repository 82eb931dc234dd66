//! What a datastore command answers: a [`Response`], the same typed value
//! whether `ops` ran the request in the CLI's process or a server answered
//! it over the control socket, and each answer's `--json` document
//! ([`Response::to_json`], also the HTTP API's: docs/API.md).
//!
//! It serialises externally tagged (`{"disk":{...}}`): that is how it
//! crosses the control socket, and the client decodes it back into the same
//! typed value a local run produces. The `--json` document is the payload
//! without the tag.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::alarm::AlarmStatus;
use crate::datastore::{
    CheckReport, CompressReport, DatastoreInfo, DedupEstimate, DedupReport, DefragReport,
    FreeSpaceReport,
};
use crate::disk::{Provisioning, PunchZeroReport, SnapshotInfo};
use crate::group::{GroupInfo, GroupSnapshotInfo, GroupSnapshotReport};
use crate::job::JobInfo;
use crate::request::ImageFormat;
use crate::stats::StatsSnapshot;
use crate::store::{CheckReport as StoreCheckReport, CompactReport, GcReport, Summary};
use crate::value;
use crate::view::{DatastoreView, DiskView};
use crate::vmdk::ShrinkResult;

/// The answer to a [`Request`](crate::Request).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    /// `status`
    Datastore(DatastoreView),
    /// `list`
    Disks(Vec<DiskView>),
    /// `info`, `create`, `extend`, `limit`, `clone`, `snapshot revert`:
    /// the disk as it is now.
    Disk(DiskView),
    /// `rm`
    Removed {
        name: String,
    },
    /// `punchzero`
    PunchZero(PunchZeroReport),
    /// `defrag`
    Defrag(DefragReport),
    DedupEstimate(DedupEstimate),
    Dedup(DedupReport),
    /// `compress`
    Compress(CompressReport),
    /// `defrag --free-space`
    FreeSpace(FreeSpaceReport),
    /// `jobs`, `jobs pause|resume|cancel`
    Jobs(Vec<JobInfo>),
    /// A long command run with `--detach`: the job it started.
    JobStarted(JobInfo),
    /// `snapshot create`
    SnapshotCreated {
        disk: String,
        snapshot: SnapshotInfo,
    },
    /// `snapshot list`
    Snapshots(Vec<SnapshotInfo>),
    /// `snapshot delete`
    SnapshotDeleted {
        disk: String,
        snapshot: String,
    },
    /// `group list`
    Groups(Vec<GroupInfo>),
    /// `group create|info|add|remove|clone`
    Group(GroupInfo),
    /// `group rm`
    GroupDeleted {
        name: String,
    },
    /// `group snapshot`
    GroupSnapshotCreated(GroupSnapshotReport),
    /// `group snapshot list`
    GroupSnapshots(Vec<GroupSnapshotInfo>),
    /// `group snapshot delete`
    GroupSnapshotDeleted {
        group: String,
        snapshot: String,
    },
    /// `group revert`: the members as they are now.
    GroupReverted {
        group: String,
        snapshot: String,
        disks: Vec<DiskView>,
    },
    /// `check`
    Check(CheckReport),
    /// `diff`
    Diff(DiffReport),
    /// `export-diff`
    ExportDiff(ExportDiffReport),
    /// `import-diff`
    ImportDiff(ImportDiffReport),
    /// `check` of an object-store datastore.
    StoreCheck(StoreCheckReport),
    /// `init|attach --object-store`: the store as this host joined it.
    Joined {
        /// `attach` (true) or `init`.
        attached: bool,
        summary: Summary,
    },
    /// `claim`: the disk with this host as its writer.
    Claimed(DiskView),
    /// `release`: the disk as this host left it.
    Released(DiskView),
    /// `gc [--dry-run]`
    Gc(GcReport),
    /// `compact DISK`
    Compact(CompactReport),
    /// `stats`: one entry per export, in name order.
    Stats(Vec<ExportStats>),
    /// `import`
    Import(ImportReport),
    /// `export`
    Export(ExportReport),
    /// `status` asked of the control socket of a VMDK-only server.
    VmdkServer(VmdkServerStatus),
    /// `vmdk_shrink`: one entry per SEsparse extent of the top link.
    VmdkShrink(Vec<ShrinkResult>),
    /// `grow`: the datastore after the change (`changed` false when only
    /// asked).
    Capacity {
        info: DatastoreInfo,
        changed: bool,
    },
    /// `alarm list`, `alarm set`: every alarm, evaluated now.
    Alarms(Vec<AlarmEntry>),
    /// `events`: the event log, newest first.
    Events(Vec<crate::event::Event>),
    /// `move`
    Moved(MoveReport),
    /// `vhost ls`, `vhost add`: the sockets served.
    VhostExports(Vec<crate::view::VhostExport>),
    /// `vhost remove`
    VhostRemoved(crate::view::VhostExport),
    /// `rename`, `snapshot rename`: the old and the new name (`DISK` or
    /// `DISK@SNAP`).
    Renamed {
        from: String,
        to: String,
    },
    /// `schedule ls|add|run`; `served`: a server runs them (false: the
    /// CLI edited the file, nothing runs them until `serve` starts).
    Schedules {
        schedules: Vec<crate::schedule::ScheduleInfo>,
        served: bool,
    },
    /// `schedule rm`
    ScheduleRemoved {
        name: String,
    },
    /// `unlock`: the keyslot that opened; `kept` false when no server
    /// holds the datastore (the key was only checked).
    Unlocked {
        name: String,
        slot: u32,
        kept: bool,
    },
    /// `lock`: the disks whose keys were forgotten (all that share the
    /// keyring), and whether any were held.
    Locked {
        name: String,
        disks: Vec<String>,
        held: bool,
    },
    /// `key list|add|remove`, `rekey`: the disk's keyslots as they are
    /// now; `slot` the one `key add` made.
    Keys {
        name: String,
        encryption: crate::disk::Encryption,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
    },
}

/// What `diff` found (docs/BACKUP.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiffReport {
    pub disk: String,
    /// The versions compared, as resolved (`DISK`, `DISK@SNAP`).
    pub target: String,
    pub base: String,
    /// Snapshot ids (absent for a disk's head).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_id: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_id: Option<u64>,
    pub size_bytes: u64,
    pub base_size_bytes: u64,
    /// Ascending and merged; None when only the totals were asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranges: Option<Vec<DiffRange>>,
    pub data_bytes: u64,
    pub zero_bytes: u64,
}

/// One range of a [`DiffReport`].
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiffRange {
    pub offset: u64,
    pub length: u64,
    #[serde(rename = "type")]
    pub kind: RangeKind,
}

/// What a changed range reads as in the target.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RangeKind {
    /// The target maps data.
    Data,
    /// The target reads zeros (trimmed, zeroed, or never written past
    /// the base's size).
    Zero,
}

/// What `export-diff` wrote.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExportDiffReport {
    pub target: String,
    /// The base as resolved (None: a full export of what the version maps).
    pub base: Option<String>,
    /// The file written (`-`: standard output).
    pub file: String,
    pub size_bytes: u64,
    pub data_bytes: u64,
    pub zero_bytes: u64,
    /// Bytes of the stream.
    pub stream_bytes: u64,
}

/// What `import-diff` applied.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImportDiffReport {
    pub disk: String,
    /// The stream's from- and to-snapshot names.
    pub from: Option<String>,
    /// The snapshot created at the end (the stream's `t`).
    pub snapshot: Option<String>,
    pub size_bytes: u64,
    /// The disk was grown to the stream's size.
    pub extended: bool,
    pub data_bytes: u64,
    pub zero_bytes: u64,
    /// Of `data_bytes`, what the disk held already (whole or partial
    /// grains): not written, so it stays shared with the snapshots that
    /// hold it.
    #[serde(default)]
    pub same_bytes: u64,
}

/// What `move` did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MoveReport {
    pub disk: String,
    /// The datastore directories it left and went to.
    pub from: PathBuf,
    pub to: PathBuf,
    pub provisioning: Provisioning,
    /// Snapshots re-created on the target (names, parents first).
    pub snapshots: Vec<String>,
    /// Bytes read from the source and written to the target (all passes).
    pub copied_bytes: u64,
    /// Passes over the ranges clients changed during the copy (the last
    /// one with I/O held).
    pub passes: u32,
    /// Whether client writes were mirrored into the target at the end
    /// (they outpaced the copy passes).
    #[serde(default)]
    pub mirrored: bool,
    /// How long client I/O was held at the switch.
    pub switch_ms: f64,
    pub seconds: f64,
    /// Remarks (e.g. a thick disk became thin on an object store).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// One alarm in `alarm list`: its state now, and the command it runs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct AlarmEntry {
    #[serde(flatten)]
    pub status: AlarmStatus,
    /// Shell command the server runs when the state changes.
    pub exec: Option<String>,
}

impl Response {
    /// Whether the command should exit non-zero although it ran: `check`
    /// found problems.
    pub fn found_problems(&self) -> bool {
        matches!(self, Response::Check(r) if !r.is_clean())
            || matches!(self, Response::StoreCheck(r) if !r.errors.is_empty())
    }
}

/// The statistics of one export.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExportStats {
    pub export: String,
    pub stats: StatsSnapshot,
}

/// What `import` made.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImportReport {
    /// The new disk.
    pub disk: DiskView,
    pub format: ImageFormat,
    /// The chain's files, top first (VMDK only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<Vec<ImportedLink>>,
    /// The disk's snapshots made from the links below the top, base first.
    pub snapshots: Vec<String>,
    /// With `--base`: what the new disk shares with its base and what the
    /// import wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<ImportBase>,
}

/// What `import --base` shared and wrote (docs/FORMAT.md §17.2a).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImportBase {
    /// The disk (or `DISK@SNAP`) the new disk started from.
    pub base: String,
    /// Image bytes (whole grains) equal to the base's there: left shared.
    pub same_bytes: u64,
    /// Grains written because the image holds other bytes there.
    pub written_bytes: u64,
    /// Grains unmapped: zeros (or holes) in the image where the base has data.
    pub unmapped_bytes: u64,
}

/// One file of an imported VMDK chain.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImportedLink {
    pub file: String,
    pub create_type: String,
}

/// What `export` wrote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExportReport {
    /// DISK or DISK@SNAP as asked.
    pub target: String,
    /// The file to open: the last link.
    pub open: String,
    /// Base first.
    pub links: Vec<ExportedLink>,
}

/// One file `export` wrote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExportedLink {
    pub file: String,
    /// The disk version it holds (DISK or DISK@SNAP).
    pub version: String,
    pub subformat: String,
}

/// Who a VMDK-only server is, for a refusal that names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmdkServerStatus {
    pub server: String,
    pub pid: u32,
    pub export: String,
    pub file: String,
    pub read_only: bool,
}

impl Response {
    /// The answer's `--json` document (also the HTTP API's): its payload,
    /// no enum tag; scripts and tests parse it, so a field keeps its name.
    pub fn to_json(&self) -> Value {
        match self {
            Response::Datastore(i) => value(i),
            Response::Disks(disks) => value(disks),
            Response::Disk(d) => value(d),
            Response::Removed { name } => json!({ "removed": name }),
            Response::PunchZero(r) => value(r),
            Response::Defrag(r) => value(r),
            Response::DedupEstimate(r) => value(r),
            Response::Dedup(r) => value(r),
            Response::Compress(r) => value(r),
            Response::FreeSpace(r) => value(r),
            Response::Jobs(jobs) => value(jobs),
            Response::JobStarted(j) => value(j),
            Response::SnapshotCreated { snapshot, .. } => value(snapshot),
            Response::Snapshots(snaps) => value(snaps),
            Response::SnapshotDeleted { disk, snapshot } => {
                json!({ "deleted": format!("{disk}@{snapshot}") })
            }
            Response::Groups(g) => value(g),
            Response::Group(g) => value(g),
            Response::GroupDeleted { name } => json!({ "deleted": name }),
            Response::GroupSnapshotCreated(r) => value(r),
            Response::GroupSnapshots(s) => value(s),
            Response::GroupSnapshotDeleted { group, snapshot } => {
                json!({ "deleted": format!("{group}@{snapshot}") })
            }
            Response::GroupReverted { disks, .. } => value(disks),
            Response::Check(r) => value(r),
            Response::StoreCheck(r) => value(r),
            Response::Diff(r) => value(r),
            Response::ExportDiff(r) => value(r),
            Response::ImportDiff(r) => value(r),
            Response::Joined { summary, .. } => value(summary),
            Response::Claimed(d) | Response::Released(d) => value(d),
            Response::Gc(r) => value(r),
            Response::Compact(r) => value(r),
            // One object keyed by export name.
            Response::Stats(exports) => Value::Object(
                exports
                    .iter()
                    .map(|e| (e.export.clone(), value(&e.stats)))
                    .collect(),
            ),
            Response::Import(r) => value(r),
            Response::Export(r) => value(r),
            Response::Moved(r) => value(r),
            Response::VhostExports(v) => value(v),
            Response::VhostRemoved(v) => json!({ "removed": value(v) }),
            Response::Renamed { from, to } => json!({ "renamed": from, "to": to }),
            Response::VmdkServer(s) => value(s),
            Response::VmdkShrink(rs) => value(rs),
            Response::Capacity { info, .. } => value(info),
            Response::Alarms(a) => value(a),
            Response::Events(e) => value(e),
            Response::Schedules { schedules, .. } => value(schedules),
            Response::ScheduleRemoved { name } => json!({ "removed": name }),
            Response::Unlocked { name, slot, kept } => {
                json!({ "disk": name, "slot": slot, "kept": kept })
            }
            Response::Locked { name, disks, held } => {
                json!({ "disk": name, "disks": disks, "held": held })
            }
            Response::Keys {
                name,
                encryption,
                slot,
            } => keys_json(name, encryption, *slot),
        }
    }
}

/// `key list|add|remove`, `rekey` as JSON: the disk and its encryption,
/// with the keyslot `key add` made.
fn keys_json(name: &str, encryption: &crate::disk::Encryption, slot: Option<u32>) -> Value {
    let mut v = json!({ "disk": name, "encryption": value(encryption) });
    if let Some(s) = slot {
        v["slot"] = json!(s);
    }
    v
}
