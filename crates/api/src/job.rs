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
}
