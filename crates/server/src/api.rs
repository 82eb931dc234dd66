//! What every command asks and answers, as types: a [`Request`] (built
//! from the command line in one place, `args`), run by `ops` locally or by
//! a server over the control socket, answers a [`Response`]; offline VMDK
//! commands are a [`VmdkRequest`] answering a [`VmdkResponse`]. `output`
//! renders the answers for people or as `--json`.
//!
//! Both enums serialise externally tagged (`{"disk":{...}}`): that is how a
//! response crosses the control socket, and the client decodes it back into
//! the same typed value a local run produces. The `--json` shapes are
//! `output`'s business (the payload without the tag).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use strata_datastore::{DatastoreView, DiskView};
use strata_engine::{
    AlarmRule, AlarmStatus, CheckReport, DatastoreInfo, DefragReport, FreeSpaceReport, GroupInfo,
    GroupSnapshotInfo, Provisioning, PunchZeroReport, QuiesceReport, SnapshotInfo,
};
use strata_objstore::gc::{CheckReport as StoreCheckReport, GcReport};
use strata_stats::StatsSnapshot;
use strata_vmdk::Subformat;

/// A datastore command.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Status,
    List,
    Info {
        name: String,
    },
    Create {
        name: String,
        size_bytes: u64,
        provisioning: Provisioning,
    },
    Remove {
        name: String,
    },
    Extend {
        name: String,
        size_bytes: u64,
    },
    /// Set (or clear) a disk's I/O limits.
    Limit {
        name: String,
        limits: strata_engine::IoLimits,
    },
    /// Change a disk's provisioning (online).
    Convert {
        name: String,
        provisioning: Provisioning,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Release a thin disk's zero grains.
    PunchZero {
        name: String,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Lay a disk's grains out in logical order (online), or with
    /// `dry_run` say what that would move.
    Defrag {
        name: String,
        #[serde(default)]
        dry_run: bool,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Consolidate free space: move live grains down, lower the pool's
    /// end, punch free grains out of the host file.
    DefragFreeSpace {
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// The server's jobs (long operations).
    Jobs,
    /// Pause, resume or cancel a job.
    JobControl {
        id: u64,
        action: JobAction,
    },
    SnapshotCreate {
        disk: String,
        snapshot: String,
        description: String,
    },
    SnapshotList {
        disk: String,
    },
    SnapshotRevert {
        disk: String,
        snapshot: String,
    },
    SnapshotDelete {
        disk: String,
        snapshot: String,
    },
    CloneLinked {
        source: String,
        name: String,
    },
    /// `group create NAME DISK...` (docs/BACKUP.md, consistency groups)
    GroupCreate {
        name: String,
        disks: Vec<String>,
        #[serde(default)]
        quiesce_hook: Option<String>,
        #[serde(default)]
        quiesce_timeout_s: Option<u64>,
    },
    /// `group rm NAME`
    GroupDelete {
        name: String,
    },
    /// `group add|remove NAME DISK`
    GroupMember {
        name: String,
        disk: String,
        add: bool,
    },
    /// `group list`
    GroupList,
    /// `group info NAME`
    GroupInfo {
        name: String,
    },
    /// `group snapshot NAME SNAP`: one cut across the members, with the
    /// group's quiesce hook (or `quiesce_hook`) around it.
    GroupSnapshotCreate {
        group: String,
        snapshot: String,
        #[serde(default)]
        description: String,
        #[serde(default)]
        quiesce_hook: Option<String>,
        /// Skip the hook.
        #[serde(default)]
        no_quiesce: bool,
        /// Take the snapshot (crash-consistent) when the hook fails.
        #[serde(default)]
        ignore_quiesce_error: bool,
        #[serde(default)]
        timeout_s: Option<u64>,
        #[serde(default)]
        max_pause_ms: Option<u64>,
    },
    /// `group snapshot list NAME`
    GroupSnapshotList {
        group: String,
    },
    /// `group snapshot delete NAME SNAP`
    GroupSnapshotDelete {
        group: String,
        snapshot: String,
    },
    /// `group revert NAME SNAP`
    GroupSnapshotRevert {
        group: String,
        snapshot: String,
    },
    /// `group clone NAME@SNAP NEW [--rename OLD=NEW]`
    GroupClone {
        source: String,
        name: String,
        #[serde(default)]
        renames: Vec<(String, String)>,
    },
    /// `diff TARGET --from BASE`: where version TARGET (`DISK` or
    /// `DISK@SNAP`) differs from BASE (docs/BACKUP.md).
    Diff {
        target: String,
        from: String,
        /// Only the totals, no ranges.
        #[serde(default)]
        totals: bool,
    },
    /// `export-diff TARGET [--from BASE] FILE`: the changes as an rbd diff
    /// v1 stream written to `out` (absolute; a file or a pipe).
    ExportDiff {
        target: String,
        #[serde(default)]
        from: Option<String>,
        out: PathBuf,
    },
    /// `import-diff FILE DISK [--force]`: apply an rbd diff stream read
    /// from `path` (absolute; a file or a pipe).
    ImportDiff {
        path: PathBuf,
        disk: String,
        #[serde(default)]
        force: bool,
    },
    CloneFull {
        source: String,
        name: String,
        provisioning: Provisioning,
        /// The datastore the clone goes to (None: the source's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        to: Option<PathBuf>,
    },
    Check,
    /// `claim DISK` (object-store datastores): this host becomes its writer.
    Claim {
        name: String,
        /// Only once the writer released it (waiting up to `wait_seconds`),
        /// never fencing a live one.
        #[serde(default)]
        handover: bool,
        #[serde(default)]
        wait_seconds: Option<u64>,
    },
    /// `release DISK` (object-store datastores): this host's server
    /// commits what it acknowledged and stops writing the disk, for a
    /// hand-over.
    Release {
        name: String,
    },
    /// `gc [--dry-run]` (object-store datastores): collect what no live
    /// root reaches.
    Gc {
        dry_run: bool,
    },
    /// `compact DISK` (object-store datastores): rewrite the live grains
    /// of the disk's partly live objects (FORMAT.md §11.7a).
    Compact {
        name: String,
        /// Objects under this share live, in percent (None: 85).
        below_pct: Option<u32>,
        dry_run: bool,
    },
    /// `grow`: set the capacity (Some(0): follow the file system again), or
    /// with None only say what it is and how it can change.
    Grow {
        capacity_bytes: Option<u64>,
    },
    /// `alarm set`: one alarm's thresholds and command.
    AlarmSet {
        rule: AlarmRule,
        /// Keep the command set before (no --exec given).
        #[serde(default)]
        keep_exec: bool,
    },
    /// `alarm list`
    AlarmList,
    /// I/O statistics of one export (or all), optionally reset after
    /// reading, and recording paused (false) or resumed (true) after that.
    Stats {
        disk: Option<String>,
        reset: bool,
        #[serde(default)]
        recording: Option<bool>,
    },
    /// Import a VMDK chain, raw or qcow2 image as a new disk.
    Import {
        /// Absolute, so that a server in another directory finds it.
        path: PathBuf,
        name: String,
        provisioning: Provisioning,
        /// None: detected from the content.
        format: Option<ImageFormat>,
    },
    /// Export a disk or snapshot as VMDK (optionally its snapshot path as a chain).
    Export {
        target: String,
        /// Absolute, so that a server in another directory writes it there.
        out: PathBuf,
        #[serde(with = "subformat_name")]
        subformat: Subformat,
        chain: bool,
        adapter: String,
    },
    /// Move a disk (its snapshots too unless `head_only`) to another
    /// datastore while it is served (docs/MOVE.md).
    Move {
        name: String,
        /// The target datastore's directory (a local datastore, or one
        /// attached to an object store); absolute.
        to: PathBuf,
        #[serde(default)]
        head_only: bool,
        /// The target's provisioning (None: the source's).
        #[serde(default)]
        provisioning: Option<Provisioning>,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
    /// Shrink a served SEsparse VMDK file online: asked of the server that
    /// serves it (docs/FORMAT.md §9.5), found through its holder records.
    VmdkShrink {
        /// Absolute; the server matches it to an export by device and inode.
        path: PathBuf,
        #[serde(default)]
        rate_bytes_per_sec: Option<u64>,
    },
}

impl Request {
    /// What a job running this request does, for `strata jobs`.
    pub fn describe(&self) -> String {
        match self {
            Request::Create {
                name, provisioning, ..
            } => {
                format!("create {name} ({})", provisioning.as_str())
            }
            Request::Convert {
                name, provisioning, ..
            } => {
                format!("convert {name} to {}", provisioning.as_str())
            }
            Request::PunchZero { name, .. } => format!("punchzero {name}"),
            Request::Defrag { name, .. } => format!("defrag {name}"),
            Request::Compact { name, .. } => format!("compact {name}"),
            Request::DefragFreeSpace { .. } => "defrag --free-space".to_string(),
            Request::CloneFull {
                source,
                name,
                to: Some(to),
                ..
            } => format!("clone --full {source} {name} --to {}", to.display()),
            Request::CloneFull { source, name, .. } => format!("clone --full {source} {name}"),
            Request::Import { path, name, .. } => format!("import {} as {name}", path.display()),
            Request::Export { target, out, .. } => format!("export {target} to {}", out.display()),
            Request::Move { name, to, .. } => format!("move {name} to {}", to.display()),
            Request::ExportDiff {
                target,
                from: Some(f),
                ..
            } => format!("export-diff {target} --from {f}"),
            Request::ExportDiff { target, .. } => format!("export-diff {target}"),
            Request::ImportDiff { path, disk, .. } => {
                format!("import-diff {} into {disk}", path.display())
            }
            other => format!("{other:?}"),
        }
    }

    /// Whether a server runs the request as a job (see `jobs`): the long ones.
    pub fn is_job(&self) -> bool {
        self.shows_progress()
    }

    /// Whether the request may take long enough to deserve a progress bar.
    pub fn shows_progress(&self) -> bool {
        matches!(
            self,
            Request::CloneFull { .. }
                | Request::Convert { .. }
                | Request::PunchZero { .. }
                | Request::Defrag { dry_run: false, .. }
                | Request::DefragFreeSpace { .. }
                | Request::Import { .. }
                | Request::Export { .. }
                | Request::Move { .. }
                | Request::ExportDiff { .. }
                | Request::ImportDiff { .. }
                | Request::Create {
                    provisioning: Provisioning::Eagerzeroedthick,
                    ..
                }
        )
    }
}

/// The answer to a [`Request`].
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
    Removed { name: String },
    /// `punchzero`
    PunchZero(PunchZeroReport),
    /// `defrag`
    Defrag(DefragReport),
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
    SnapshotDeleted { disk: String, snapshot: String },
    /// `group list`
    Groups(Vec<GroupInfo>),
    /// `group create|info|add|remove|clone`
    Group(GroupInfo),
    /// `group rm`
    GroupDeleted { name: String },
    /// `group snapshot`
    GroupSnapshotCreated(GroupSnapshotReport),
    /// `group snapshot list`
    GroupSnapshots(Vec<GroupSnapshotInfo>),
    /// `group snapshot delete`
    GroupSnapshotDeleted { group: String, snapshot: String },
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
        summary: strata_objstore::Summary,
    },
    /// `claim`: the disk with this host as its writer.
    Claimed(DiskView),
    /// `release`: the disk as this host left it.
    Released(DiskView),
    /// `gc [--dry-run]`
    Gc(GcReport),
    /// `compact DISK`
    Compact(strata_objstore::disk::CompactReport),
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
    Capacity { info: DatastoreInfo, changed: bool },
    /// `alarm list`, `alarm set`: every alarm, evaluated now.
    Alarms(Vec<AlarmEntry>),
    /// `move`
    Moved(MoveReport),
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

/// What `jobs pause|resume|cancel` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobAction {
    Pause,
    Resume,
    Cancel,
}

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Running,
    Paused,
    /// Cancel asked; stops at the end of its current region.
    Cancelling,
    Done,
    Failed,
    Cancelled,
}

/// One job of a server (`strata jobs --json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobInfo {
    pub id: u64,
    pub what: String,
    pub state: JobState,
    /// Work done, out of `total` (bytes for every job today).
    pub done: u64,
    pub total: u64,
    pub percent: u64,
    pub started_unix: u64,
    pub finished_unix: Option<u64>,
    /// Why it failed or was cancelled.
    pub error: Option<String>,
}

/// The statistics of one export.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExportStats {
    pub export: String,
    pub stats: StatsSnapshot,
}

/// An image format `import` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    Vmdk,
    Raw,
    /// Read through `qemu-img convert`.
    Qcow2,
}

impl ImageFormat {
    pub fn parse(s: &str) -> Result<Self, strata_engine::Error> {
        match s {
            "vmdk" => Ok(ImageFormat::Vmdk),
            "raw" => Ok(ImageFormat::Raw),
            "qcow2" => Ok(ImageFormat::Qcow2),
            other => Err(strata_engine::Error::new(
                strata_engine::ErrorKind::InvalidArgument,
                format!("unknown import format {other:?}: vmdk, raw or qcow2"),
            )),
        }
    }
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

/// A command on VMDK files, run in this process (no datastore).
#[derive(Debug, Clone)]
pub enum VmdkRequest {
    Info {
        path: PathBuf,
    },
    Check {
        path: PathBuf,
        repair: bool,
    },
    Shrink {
        path: PathBuf,
        /// Bytes/s a served file's shrink may read and copy (None: only
        /// the default pause between steps).
        rate_bytes_per_sec: Option<u64>,
    },
}

/// The answer to a [`VmdkRequest`].
#[derive(Debug, Clone)]
pub enum VmdkResponse {
    Info(VmdkInfo),
    Check(VmdkCheckReport),
    /// One entry per SEsparse extent of the top link.
    Shrink(Vec<ShrinkResult>),
}

impl VmdkResponse {
    /// Whether the command should exit non-zero although it ran: errors
    /// remain after `check`.
    pub fn found_problems(&self) -> bool {
        matches!(self, VmdkResponse::Check(r) if r.remaining_errors > 0)
    }
}

/// `vmdk info`: a chain, top link first.
#[derive(Debug, Clone, Serialize)]
pub struct VmdkInfo {
    pub size_bytes: u64,
    /// Number of links.
    pub depth: usize,
    pub links: Vec<VmdkLinkInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VmdkLinkInfo {
    pub file: String,
    pub create_type: String,
    /// Content ID, shown as 8 hex digits as in the descriptor.
    #[serde(serialize_with = "hex8")]
    pub cid: u32,
    #[serde(serialize_with = "hex8")]
    pub parent_cid: u32,
    pub parent_hint: Option<String>,
    pub size_bytes: u64,
    pub extents: Vec<VmdkExtentInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VmdkExtentInfo {
    /// The descriptor's extent line type (SPARSE, FLAT, ZERO, VMFS...).
    #[serde(rename = "type")]
    pub line_type: String,
    /// What the extent is: flat, zero, or the sparse format's name.
    pub format: String,
    /// Empty for a zero extent.
    pub file: String,
    pub start_sector: u64,
    pub sectors: u64,
    /// Sparse extents only.
    pub grain_bytes: Option<u64>,
}

/// `vmdk check [--repair]`.
#[derive(Debug, Clone, Serialize)]
pub struct VmdkCheckReport {
    pub files: Vec<VmdkFileCheck>,
    /// Errors found (before any repair).
    pub errors: usize,
    /// Errors a check after the repair still finds (without repair: `errors`).
    pub remaining_errors: usize,
}

/// What `vmdk check` found in one file.
#[derive(Debug, Clone, Serialize)]
pub struct VmdkFileCheck {
    pub file: String,
    #[serde(flatten)]
    pub check: strata_vmdk::sparse::ExtentCheck,
}

/// What `vmdk shrink` did to one extent.
pub type ShrinkResult = strata_vmdk::sparse::ShrinkReport;

fn hex8<S: serde::Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:08x}"))
}

/// A [`Subformat`] by its VMware name on the control socket.
mod subformat_name {
    use serde::{Deserialize, Deserializer, Serializer};
    use strata_vmdk::Subformat;

    pub fn serialize<S: Serializer>(v: &Subformat, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Subformat, D::Error> {
        let name = String::deserialize(d)?;
        Subformat::parse(&name).map_err(serde::de::Error::custom)
    }
}

/// A group snapshot taken, with how its hook's `unquiesce` went.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupSnapshotReport {
    #[serde(flatten)]
    pub snapshot: GroupSnapshotInfo,
    /// The hook's `unquiesce` run (None without a hook).
    #[serde(default)]
    pub unquiesce: Option<QuiesceReport>,
}

/// A `--json` document: a serialisable answer as a JSON value.
fn value<T: Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).expect("serialisable")
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
            Response::VmdkServer(s) => value(s),
            Response::VmdkShrink(rs) => value(rs),
            Response::Capacity { info, .. } => value(info),
            Response::Alarms(a) => value(a),
        }
    }
}

impl VmdkResponse {
    /// The answer's `--json` document.
    pub fn to_json(&self) -> Value {
        match self {
            VmdkResponse::Info(i) => value(i),
            VmdkResponse::Check(r) => value(r),
            VmdkResponse::Shrink(rs) => value(rs),
        }
    }
}
