//! `jobs` and `jobs show ID` for people.

use std::fmt::Write as _;

use serde_json::Value;
use strata_api::units::{human, utc};
use strata_api::{Error, ErrorKind, JobInfo, JobState, Response};

use super::{opt, Render};

/// `jobs`: a job a line, newest first: when it started (UTC) and how
/// long it took, how far it got, and why it stopped.
pub(super) fn table(out: &mut String, jobs: &[JobInfo]) {
    if jobs.is_empty() {
        return outln!(out, "no jobs");
    }
    outln!(
        out,
        "  ID  STARTED (UTC)   TOOK  STATE        DONE               PROGRESS  WHAT"
    );
    for j in jobs {
        let (id, percent, what) = (j.id, j.percent, &j.what);
        let state = format!("{:?}", j.state).to_lowercase();
        let progress = format!("{}/{}", human(j.done), human(j.total));
        let error = opt(j.error.as_ref(), |e| format!(" ({e})"));
        // `MM-DD HH:MM:SS` of `YYYY-MM-DD HH:MM:SS UTC`.
        let started = utc(j.started_unix * 1000);
        let started = started.get(5..19).unwrap_or(&started);
        let took = j.finished_unix.map_or_else(
            || "-".to_string(),
            |f| format!("{} s", f.saturating_sub(j.started_unix)),
        );
        outln!(
            out,
            "{id:>4}  {started}  {took:>5}  {state:<11} {percent:>4}%  {progress:>21}  {what}{error}"
        );
    }
}

/// `jobs show ID`: one job of `jobs`, as its line there and then what it
/// answered, as the command would have printed it; as JSON, its entry of
/// `jobs --json`.
pub struct OneJob(JobInfo);

impl OneJob {
    /// Job `id` in `list`, the answer of `jobs`.
    pub fn of(list: Response, id: u64) -> Result<OneJob, Error> {
        let found = match list {
            Response::Jobs(all) => all.into_iter().find(|j| j.id == id),
            _ => None,
        };
        let missing = format!("no job {id} (see 'strata jobs')");
        Ok(OneJob(
            found.ok_or_else(|| Error::new(ErrorKind::NotFound, missing))?,
        ))
    }
}

impl Render for OneJob {
    fn human(&self, out: &mut String) {
        let j = &self.0;
        table(out, std::slice::from_ref(j));
        match (&j.result, j.state) {
            (Some(r), _) => {
                outln!(out, "");
                r.human(out);
            }
            (None, JobState::Done) => outln!(
                out,
                "(its answer is not kept: too large, or it ran under an older server)"
            ),
            _ => {}
        }
    }

    fn json(&self) -> Value {
        serde_json::to_value(&self.0).expect("json")
    }
}
