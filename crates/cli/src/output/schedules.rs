//! `schedule ls|add|run` for people.

use std::fmt::Write as _;

use strata_api::schedule::{every_text, ScheduleInfo, TargetKind};
use strata_api::units::utc;

/// One block per schedule; without a server, says that nothing runs them.
pub(super) fn list(out: &mut String, schedules: &[ScheduleInfo], served: bool) {
    if schedules.is_empty() {
        outln!(out, "no schedules");
    }
    for s in schedules {
        let p = &s.spec;
        let kind = match p.kind {
            Some(TargetKind::Group) => "group",
            _ => "disk",
        };
        let keep = p.keep.map_or("all".to_string(), |k| k.to_string());
        let at = p
            .at_s
            .map(|a| format!(" at {:02}:{:02} UTC", a / 3600, a / 60 % 60))
            .unwrap_or_default();
        let quiesce = if p.quiesce { ", quiesced" } else { "" };
        outln!(
            out,
            "{}: {kind} {} every {}{at}, keep {keep}, snapshots {}-YYYYMMDD-HHMMSS{quiesce}",
            p.name,
            p.target,
            every_text(p.every_s),
            p.prefix()
        );
        let last = match (s.last_run_unix_ms, &s.last_result) {
            (Some(t), Some(r)) => format!("{} ({r})", utc(t)),
            _ => "never".to_string(),
        };
        outln!(out, "  last run: {last}");
        if let Some(snap) = &s.last_snapshot {
            outln!(out, "  last snapshot: {}@{snap}", p.target);
        }
        if !s.kept.is_empty() {
            outln!(
                out,
                "  kept beyond --keep (in use or cloned): {}",
                s.kept.join(", ")
            );
        }
        if let Some(t) = s.next_run_unix_ms {
            outln!(out, "  next run: {}", utc(t));
        }
    }
    if !served && !schedules.is_empty() {
        outln!(
            out,
            "note: no server runs this datastore: schedules run only while 'strata serve' does"
        );
    }
}
