//! Scheduled snapshots (`strata schedule`, docs/OPERATIONS.md): what a
//! schedule is, as kept in the datastore's `schedules.json`
//! (docs/FORMAT.md §15) and as `schedule ls` shows it.

use serde::{Deserialize, Serialize};
use strata_block::{Error, Kind as ErrorKind};

/// What a schedule snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetKind {
    Disk,
    Group,
}

/// One schedule, as asked (`schedule add`) and as kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub name: String,
    /// A disk or a consistency group.
    pub target: String,
    /// Decided by `schedule add` (None in the request: whichever exists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<TargetKind>,
    /// The period, in seconds (≥ 1).
    pub every_s: u64,
    /// How many of this schedule's snapshots to keep (None: all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u32>,
    /// Snapshot names are `PREFIX-YYYYMMDD-HHMMSS` (UTC); None: the name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// A group target's quiesce hook runs around the cut.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub quiesce: bool,
    /// The runs' phase: seconds after midnight UTC (`--at HH:MM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_s: Option<u64>,
}

impl ScheduleSpec {
    /// The prefix of this schedule's snapshot names.
    pub fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or(&self.name)
    }

    /// Whether `snap` is a name this schedule gives (`PREFIX-` then
    /// `YYYYMMDD-HHMMSS`): the only snapshots it ever deletes.
    pub fn owns(&self, snap: &str) -> bool {
        let Some(stamp) = snap
            .strip_prefix(self.prefix())
            .and_then(|s| s.strip_prefix('-'))
        else {
            return false;
        };
        let b = stamp.as_bytes();
        b.len() == 15
            && b[8] == b'-'
            && b.iter()
                .enumerate()
                .all(|(i, c)| i == 8 || c.is_ascii_digit())
    }

    /// The first run strictly after `after_ms`: the next instant that is a
    /// whole number of periods after the phase (`--at`, else midnight
    /// UTC of 1970-01-01).
    pub fn next_after(&self, after_ms: u64) -> u64 {
        let every = self.every_s.max(1) * 1000;
        let phase = self.at_s.unwrap_or(0) * 1000 % every;
        if after_ms < phase {
            return phase;
        }
        phase + ((after_ms - phase) / every + 1) * every
    }
}

/// A schedule in `schedule ls`: as asked, and how it went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleInfo {
    #[serde(flatten)]
    pub spec: ScheduleSpec,
    pub created_unix_ms: u64,
    #[serde(default)]
    pub last_run_unix_ms: Option<u64>,
    /// `ok`, or the error of the last run.
    #[serde(default)]
    pub last_result: Option<String>,
    /// The snapshot the last run took.
    #[serde(default)]
    pub last_snapshot: Option<String>,
    /// Snapshots beyond `keep` that could not be deleted (a clone came
    /// from them, a client has them open), kept.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<String>,
    /// When the next run is due (absent in the file: computed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_unix_ms: Option<u64>,
}

impl ScheduleInfo {
    /// When the next run is due: once after the last (or the creation);
    /// missed periods are not made up, an overdue run happens once.
    pub fn next_run(&self) -> u64 {
        self.spec
            .next_after(self.last_run_unix_ms.unwrap_or(self.created_unix_ms))
    }
}

/// `--every`: `30s`, `15m`, `1h`, `1d`, `1w` (a bare number is seconds).
pub fn parse_every(s: &str) -> Result<u64, Error> {
    let t = s.trim();
    let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let mult = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        _ => 0,
    };
    match num.parse::<u64>() {
        Ok(n) if n > 0 && mult > 0 => n.checked_mul(mult).ok_or_else(|| bad_every(s)),
        _ => Err(bad_every(s)),
    }
}

fn bad_every(s: &str) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!(
            "--every {s:?}: a period above zero, a number with s, m, h, d or w (e.g. 15m, 1h, 1d)"
        ),
    )
}

/// `--at HH:MM` (UTC) as seconds after midnight.
pub fn parse_at(s: &str) -> Result<u64, Error> {
    let bad = || {
        Error::new(
            ErrorKind::InvalidArgument,
            format!("--at {s:?}: a time of day HH:MM (UTC), e.g. 02:30"),
        )
    };
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    let (h, m): (u64, u64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if h > 23 || m > 59 {
        return Err(bad());
    }
    Ok(h * 3600 + m * 60)
}

/// A period for people: `1d`, `2h`, `90s`.
pub fn every_text(s: u64) -> String {
    for (unit, n) in [("w", 7 * 86_400), ("d", 86_400), ("h", 3600), ("m", 60)] {
        if s.is_multiple_of(n) {
            return format!("{}{unit}", s / n);
        }
    }
    format!("{s}s")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(every_s: u64, at_s: Option<u64>) -> ScheduleSpec {
        ScheduleSpec {
            name: "hourly".into(),
            target: "vm".into(),
            kind: None,
            every_s,
            keep: None,
            prefix: None,
            quiesce: false,
            at_s,
        }
    }

    #[test]
    fn periods_parse_and_zero_is_refused() {
        assert_eq!(parse_every("2s").unwrap(), 2);
        assert_eq!(parse_every("15m").unwrap(), 900);
        assert_eq!(parse_every("1d").unwrap(), 86_400);
        assert!(parse_every("0").is_err());
        assert!(parse_every("0h").is_err());
        assert!(parse_every("1x").is_err());
        assert!(parse_every("h").is_err());
        assert_eq!(parse_at("02:30").unwrap(), 9000);
        assert!(parse_at("24:00").is_err());
        assert_eq!(every_text(86_400), "1d");
        assert_eq!(every_text(90), "90s");
    }

    #[test]
    fn runs_fall_on_the_phase_and_names_are_owned_by_form() {
        let daily = spec(86_400, Some(2 * 3600));
        assert_eq!(daily.next_after(0), 2 * 3_600_000);
        assert_eq!(daily.next_after(2 * 3_600_000), (86_400 + 7200) * 1000);
        assert_eq!(spec(3600, None).next_after(3_600_000 - 1), 3_600_000);
        let s = spec(3600, None);
        assert!(s.owns("hourly-20261201-020000"));
        assert!(!s.owns("hourly-20261201-0200"));
        assert!(!s.owns("hourly-mine"));
        assert!(!s.owns("hourlyx-20261201-020000"));
        assert!(!s.owns("base"));
    }
}
