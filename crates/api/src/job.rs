//! A server's jobs (the long requests it runs in threads of their own) as
//! `jobs` answers them, and what `jobs pause|resume|cancel` asks.

use serde::{Deserialize, Serialize};

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
    /// The server stopped (or died) while it ran, as a job of an earlier
    /// server's life lists it: what it did stays (each step of a long
    /// operation is its own change), the rest was not done.
    Interrupted,
}

/// One job of a server (`strata jobs --json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobInfo {
    pub id: u64,
    pub what: String,
    /// What it works on: `DISK`, `DISK@SNAP`, a group, `""` for the
    /// datastore (as the event log names it).
    #[serde(default)]
    pub target: String,
    pub state: JobState,
    /// Work done, out of `total` (bytes for every job today).
    pub done: u64,
    pub total: u64,
    /// `done` × 100 / `total`; 100 once the job is done (its `done` then
    /// equals its `total`, also when it made no progress reports).
    pub percent: u64,
    pub started_unix: u64,
    pub finished_unix: Option<u64>,
    /// Why it failed; for a cancelled job, who stopped it and what it
    /// left ("stopped by 'strata jobs cancel'; ...").
    pub error: Option<String>,
    /// What a job that ended well answered, as the command run without
    /// `--detach` would have printed it (`strata jobs show ID`), tagged
    /// with its kind: `{"dedup_estimate": {...}}`. Absent while it runs,
    /// when it failed, and for an answer over [`RESULT_KEPT_BYTES`] as
    /// JSON.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "known_answer"
    )]
    pub result: Option<Box<crate::Response>>,
}

/// A kept answer, or none when it is of a kind this build does not know
/// (a `jobs.json` written by a newer one): the job is listed without it.
fn known_answer<'de, D>(d: D) -> Result<Option<Box<crate::Response>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let v = <Option<serde_json::Value>>::deserialize(d)?;
    Ok(v.and_then(|v| serde_json::from_value(v).ok()))
}

/// The largest answer a finished job keeps (as JSON, in `jobs.json` too):
/// reports are a few hundred bytes; a long list of `check` findings is
/// not kept.
pub const RESULT_KEPT_BYTES: usize = 64 * 1024;
