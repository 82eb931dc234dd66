//! A snapshot on the command line: `DISK@SNAP`, or `DISK SNAP` (and the
//! same for a group's snapshots).

use strata_api::units::invalid;
use strata_api::Error;

/// A snapshot named `DISK@SNAP` or `DISK SNAP` (see [`names`]).
#[derive(clap::Args)]
pub struct At {
    /// DISK@SNAP, or DISK followed by SNAP
    #[arg(value_name = "DISK[@SNAP]")]
    pub target: String,
    #[arg(value_name = "SNAP")]
    pub snapshot: Option<String>,
}

/// `NAME@SNAP`, or `NAME` then `SNAP`, as (NAME, SNAP): not both, not neither.
pub fn names(target: &str, snapshot: Option<&str>) -> Result<(String, String), Error> {
    let (name, snap) = strata_engine::split_target(target);
    let why = match (snap, snapshot) {
        (Some(s), None) | (None, Some(s)) => return Ok((name.into(), s.into())),
        (Some(s), Some(o)) => {
            format!("'{target} {o}' names two snapshots: give {name}@{s} or {name} {o}, not both")
        }
        (None, None) => format!("which snapshot of '{name}'? give {name}@SNAP or {name} SNAP"),
    };
    Err(invalid(why))
}
