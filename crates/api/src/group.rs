//! Consistency groups as commands answer them (docs/BACKUP.md): a group,
//! its group snapshots and their members, and the quiesce hook's run.
//!
//! [`Consistency`] and [`QuiesceReport`] are also fields of the local
//! datastore's catalog records (docs/FORMAT.md §6): their serde shapes
//! change only with the format.

use serde::{Deserialize, Serialize};

/// What a group snapshot holds: what the disks were told (crash), or that
/// too after a quiesce hook froze the applications (application).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Consistency {
    Crash,
    Application,
}

impl Consistency {
    /// As JSON and people see it: "crash" or "application".
    pub fn as_str(self) -> &'static str {
        match self {
            Consistency::Crash => "crash",
            Consistency::Application => "application",
        }
    }

    /// The other way round; None for a word that is neither.
    pub fn parse(s: &str) -> Option<Self> {
        [Consistency::Crash, Consistency::Application]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// How a quiesce hook went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QuiesceResult {
    Ok,
    Failed,
    Timeout,
    Skipped,
}

/// A quiesce hook's run, kept with the group snapshot it preceded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuiesceReport {
    pub hook: String,
    pub result: QuiesceResult,
    pub duration_ms: u64,
    pub error: Option<String>,
}

/// A group as commands answer it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupInfo {
    pub name: String,
    pub disks: Vec<String>,
    pub created_unix: u64,
    pub quiesce_hook: Option<String>,
    pub quiesce_timeout_s: Option<u64>,
    /// Group snapshots it has.
    pub snapshots: usize,
}

/// One member's snapshot in a group snapshot.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupMemberInfo {
    pub disk: String,
    pub snapshot: String,
    /// The member snapshot's id (`--from id:N`).
    pub id: u64,
    pub size_bytes: u64,
    /// What deleting this member's snapshot alone would free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
}

/// A group snapshot as commands answer it (docs/BACKUP.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GroupSnapshotInfo {
    pub group: String,
    pub name: String,
    pub id: u64,
    pub description: String,
    pub created_unix: u64,
    /// Every member snapshot exists and is durable.
    pub ready_to_use: bool,
    pub consistency: Consistency,
    pub quiesce: Option<QuiesceReport>,
    /// How long client I/O was held for the cut.
    pub pause_us: u64,
    pub members: Vec<GroupMemberInfo>,
    /// What deleting the group snapshot frees on all members together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
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
