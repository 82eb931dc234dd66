//! The event log (docs/FORMAT.md §13): who changed what, when, and how it
//! ended, as `strata events` and `GET /api/v1/events` answer it, and which
//! requests are changes of state ([`Request::event_kind`]).

use serde::{Deserialize, Serialize};

use crate::request::Request;
use crate::units::human;

/// `strata events` without `--limit`: the newest this many.
pub const EVENTS_LIMIT_DEFAULT: u32 = 100;
/// The most events one `events` request answers (the log holds a few
/// thousand: FORMAT.md §13).
pub const EVENTS_LIMIT_MAX: u32 = 100_000;

/// One entry of the event log: one line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// From 1, one more for each event of the datastore (across rotations).
    pub seq: u64,
    pub time_unix_ms: u64,
    /// What happened: `create`, `remove`, `snapshot`, `job_started`,
    /// `alarm`, `recovery`, ... (FORMAT.md §13 lists them).
    pub kind: String,
    /// What it happened to: `DISK`, `DISK@SNAP`, a group, a job's disk, an
    /// alarm's kind; empty for the datastore as a whole.
    #[serde(default)]
    pub target: String,
    /// Who asked: `cli uid 0 (root)` (the control socket's peer, or the
    /// process that ran the request itself), `api action-token from
    /// 127.0.0.1:5555`, `server`.
    pub actor: String,
    /// `ok`, or the kind of the error it ended with (`not_found`,
    /// `refused`, ...: docs/ERRORS.md).
    pub result: String,
    /// The error's message, when it ended with one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// More about it: a job's id and what it does, a forced interlock's
    /// clients, an alarm's figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl Event {
    /// The event for people, one line: `2026-12-03 14:02:11 UTC  create
    /// vm1  cli uid 0 (root)  ok`, then the error and the detail if any.
    pub fn line(&self) -> String {
        let target = if self.target.is_empty() {
            "-"
        } else {
            &self.target
        };
        let mut l = format!(
            "{}  {}  {target}  {}  {}",
            crate::units::utc(self.time_unix_ms),
            self.kind,
            self.actor,
            self.result
        );
        if let Some(e) = &self.error {
            l = format!("{l}: {e}");
        }
        if let Some(d) = &self.detail {
            l = format!("{l}  ({d})");
        }
        l
    }

    /// Whether `name` asks for this event: its target is `name`, or
    /// `name@SNAP` when `name` names no snapshot.
    pub fn is_about(&self, name: &str) -> bool {
        self.target == name
            || (!name.contains('@')
                && self
                    .target
                    .strip_prefix(name)
                    .is_some_and(|r| r.starts_with('@')))
    }
}

impl Request {
    /// The event kind a request logs, None for a request that changes
    /// nothing (a read: `info`, `list`, `status`, `stats`, dry runs).
    /// Every request says which it is here, so a new one cannot be
    /// forgotten.
    pub fn event_kind(&self) -> Option<&'static str> {
        Some(match self {
            Request::Create { .. } => "create",
            Request::Remove { .. } => "remove",
            Request::Rename { .. } => "rename",
            Request::SnapshotRename { .. } => "snapshot_rename",
            Request::Extend { .. } => "extend",
            Request::Limit { .. } => "limit",
            Request::Convert { .. } => "convert",
            Request::PunchZero { .. } => "punchzero",
            Request::Defrag { dry_run, .. } => (!dry_run).then_some("defrag")?,
            Request::DefragFreeSpace { .. } => "defrag_free_space",
            Request::Dedup { .. } => "dedup",
            Request::Compress { .. } => "compress",
            Request::JobControl { .. } => "job_control",
            Request::SnapshotCreate { .. } => "snapshot",
            Request::SnapshotRevert { .. } => "revert",
            Request::SnapshotDelete { .. } => "snapshot_delete",
            Request::CloneLinked { .. } => "clone",
            Request::CloneFull { .. } => "clone_full",
            Request::GroupCreate { .. } => "group_create",
            Request::GroupDelete { .. } => "group_remove",
            Request::GroupMember { add: true, .. } => "group_add",
            Request::GroupMember { add: false, .. } => "group_drop",
            Request::GroupSnapshotCreate { .. } => "group_snapshot",
            Request::GroupSnapshotDelete { .. } => "group_snapshot_delete",
            Request::GroupSnapshotRevert { .. } => "group_revert",
            Request::GroupClone { .. } => "group_clone",
            // Writes outside the datastore: who copied a disk out is
            // worth a line.
            Request::Export { .. } => "export",
            Request::ExportDiff { .. } => "export_diff",
            Request::ImportDiff { .. } => "import_diff",
            Request::Import { .. } => "import",
            Request::Claim { .. } => "claim",
            Request::Release { .. } => "release",
            Request::Gc { dry_run } => (!dry_run).then_some("gc")?,
            Request::Compact { dry_run, .. } => (!dry_run).then_some("compact")?,
            Request::Grow { capacity_bytes } => capacity_bytes.map(|_| "grow")?,
            Request::AlarmSet { .. } => "alarm_set",
            Request::Stats {
                reset, recording, ..
            } if *reset || recording.is_some() => "stats_reset",
            Request::Move { .. } => "move",
            Request::VmdkShrink { .. } => "vmdk_shrink",
            Request::VhostAdd { .. } => "vhost_add",
            Request::VhostRemove { .. } => "vhost_remove",
            Request::ScheduleAdd { .. } => "schedule_add",
            Request::ScheduleRemove { .. } => "schedule_remove",
            Request::ScheduleRun { .. } => "schedule_run",
            Request::Key(k) => return k.event_kind(),
            Request::Status
            | Request::List
            | Request::Info { .. }
            | Request::Jobs
            | Request::SnapshotList { .. }
            | Request::GroupList
            | Request::GroupInfo { .. }
            | Request::GroupSnapshotList { .. }
            | Request::Diff { .. }
            | Request::Check
            | Request::AlarmList
            | Request::Events { .. }
            | Request::VhostList
            | Request::ScheduleList
            | Request::DedupEstimate { .. }
            | Request::Stats { .. } => return None,
        })
    }

    /// What an event of this request is about (see [`Event::target`]).
    pub fn event_target(&self) -> String {
        match self {
            Request::Create { name, .. }
            | Request::Remove { name, .. }
            | Request::Extend { name, .. }
            | Request::Limit { name, .. }
            | Request::Convert { name, .. }
            | Request::PunchZero { name, .. }
            | Request::Defrag { name, .. }
            | Request::CloneLinked { name, .. }
            | Request::CloneFull { name, .. }
            | Request::GroupCreate { name, .. }
            | Request::GroupDelete { name }
            | Request::GroupMember { name, .. }
            | Request::GroupClone { name, .. }
            | Request::Import { name, .. }
            | Request::Claim { name, .. }
            | Request::Release { name }
            | Request::Compact { name, .. }
            | Request::Rename { name, .. }
            | Request::Move { name, .. } => name.clone(),
            Request::SnapshotCreate { disk, snapshot, .. }
            | Request::SnapshotRevert { disk, snapshot, .. }
            | Request::SnapshotDelete { disk, snapshot, .. }
            | Request::SnapshotRename { disk, snapshot, .. } => format!("{disk}@{snapshot}"),
            Request::GroupSnapshotCreate {
                group, snapshot, ..
            }
            | Request::GroupSnapshotDelete { group, snapshot }
            | Request::GroupSnapshotRevert {
                group, snapshot, ..
            } => format!("{group}@{snapshot}"),
            Request::Export { target, .. } | Request::ExportDiff { target, .. } => target.clone(),
            Request::ImportDiff { disk, .. } | Request::VhostAdd { disk, .. } => disk.clone(),
            Request::Stats { disk, .. } => disk.clone().unwrap_or_default(),
            Request::DedupEstimate { disks, .. }
            | Request::Dedup { disks, .. }
            | Request::Compress { disks, .. } => disks.join(" "),
            Request::AlarmSet { rule, .. } => rule.kind.as_str().to_string(),
            Request::JobControl { id, .. } => format!("job {id}"),
            Request::ScheduleAdd { schedule } => schedule.name.clone(),
            Request::ScheduleRemove { name } | Request::ScheduleRun { name } => name.clone(),
            Request::Key(k) => k.name().to_string(),
            Request::VmdkShrink { path, .. } | Request::VhostRemove { socket: path, .. } => {
                path.display().to_string()
            }
            _ => String::new(),
        }
    }

    /// More about an event of this request than its kind and target say
    /// (None when nothing).
    pub fn event_detail(&self) -> Option<String> {
        Some(match self {
            Request::Create {
                size_bytes,
                provisioning,
                encrypt,
                ..
            } => format!(
                "{}, {}{}",
                human(*size_bytes),
                provisioning.as_str(),
                if encrypt.is_some() { ", encrypted" } else { "" }
            ),
            Request::Key(k) => return k.event_detail(),
            Request::Extend {
                size_bytes,
                by: true,
                ..
            } => format!("by {}", human(*size_bytes)),
            Request::Extend { size_bytes, .. } => format!("to {}", human(*size_bytes)),
            Request::Convert { provisioning, .. } => format!("to {}", provisioning.as_str()),
            Request::Remove { force: true, .. }
            | Request::SnapshotRevert { force: true, .. }
            | Request::SnapshotDelete { force: true, .. }
            | Request::GroupSnapshotRevert { force: true, .. } => "--force".to_string(),
            Request::Compress { codec, .. } if !codec.is_default() => {
                format!("--codec {}", codec.as_str())
            }
            Request::CloneLinked { source, .. } | Request::CloneFull { source, .. } => {
                format!("from {source}")
            }
            Request::GroupClone { source, .. } => format!("from {source}"),
            Request::GroupMember { disk, .. } => disk.clone(),
            Request::Rename { to, .. } | Request::SnapshotRename { to, .. } => format!("to {to}"),
            Request::Grow {
                capacity_bytes: Some(b),
            } => format!("capacity {}", human(*b)),
            Request::JobControl { action, .. } => format!("{action:?}").to_lowercase(),
            Request::Import { .. }
            | Request::Export { .. }
            | Request::ExportDiff { .. }
            | Request::ImportDiff { .. }
            | Request::Move { .. } => self.describe(),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_log_nothing_and_changes_log_their_kind() {
        assert_eq!(Request::List.event_kind(), None);
        assert_eq!(
            Request::Info { name: "vm".into() }.event_kind(),
            None,
            "info is a read"
        );
        let rm = Request::Remove {
            name: "vm".into(),
            force: false,
        };
        assert_eq!(rm.event_kind(), Some("remove"));
        assert_eq!(rm.event_target(), "vm");
        let snap = Request::SnapshotCreate {
            disk: "vm".into(),
            snapshot: "s1".into(),
            description: String::new(),
        };
        assert_eq!(snap.event_target(), "vm@s1");
        assert_eq!(
            Request::Gc { dry_run: true }.event_kind(),
            None,
            "a dry run changes nothing"
        );
    }

    #[test]
    fn a_disk_filter_takes_its_snapshots_too() {
        let e = |target: &str| Event {
            seq: 1,
            time_unix_ms: 0,
            kind: "snapshot".into(),
            target: target.into(),
            actor: "server".into(),
            result: "ok".into(),
            error: None,
            detail: None,
        };
        assert!(e("vm").is_about("vm"));
        assert!(e("vm@s1").is_about("vm"));
        assert!(e("vm@s1").is_about("vm@s1"));
        assert!(!e("vm2").is_about("vm"));
        assert!(!e("vm@s2").is_about("vm@s1"));
    }
}
