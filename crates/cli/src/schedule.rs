//! `strata schedule`: scheduled snapshots (docs/OPERATIONS.md), the
//! command line as requests (`output` prints their answers).

use clap::Subcommand;
use strata_api::schedule::{parse_at, parse_every, ScheduleSpec};
use strata_api::{Error, Request};

#[derive(Subcommand)]
pub enum ScheduleCmd {
    /// Snapshot a disk or group every DURATION, keeping the newest N
    #[command(
        long_about = "Snapshot a disk (or a consistency group: a group snapshot) every \
DURATION, named PREFIX-YYYYMMDD-HHMMSS (UTC), keeping the newest --keep of this schedule's \
snapshots (older ones of that name form are deleted; no other snapshot ever is).\n\n\
Runs fall on whole periods after midnight UTC, or after --at HH:MM (UTC): --every 1d --at 02:00 \
runs daily at 02:00 UTC. The running 'strata serve' of the datastore runs them; a run missed \
while no server ran is made once when one starts. Kept in the datastore's schedules.json."
    )]
    Add {
        name: String,
        /// The disk or group to snapshot
        #[arg(long)]
        target: String,
        /// The period: 30s, 15m, 1h, 1d, 1w
        #[arg(long, value_parser = parse_every, value_name = "DURATION")]
        every: u64,
        /// How many of this schedule's snapshots to keep (default: all)
        #[arg(long, value_name = "N")]
        keep: Option<u32>,
        /// Snapshot name prefix (default: the schedule's name)
        #[arg(long, value_name = "P")]
        prefix: Option<String>,
        /// Run the group's quiesce hook around each snapshot (group targets)
        #[arg(long)]
        quiesce: bool,
        /// Phase of the runs, UTC (e.g. 02:00 with --every 1d)
        #[arg(long, value_parser = parse_at, value_name = "HH:MM")]
        at: Option<u64>,
    },
    /// List the schedules with their last and next run
    #[command(visible_alias = "ls")]
    List,
    /// Remove a schedule (its snapshots stay)
    #[command(visible_alias = "rm")]
    Remove { name: String },
    /// Run a schedule now: a snapshot and the expiry of its older ones
    Run { name: String },
}

impl ScheduleCmd {
    /// The request this command makes.
    pub fn request(&self) -> Result<Request, Error> {
        Ok(match self {
            ScheduleCmd::Add {
                name,
                target,
                every,
                keep,
                prefix,
                quiesce,
                at,
            } => Request::ScheduleAdd {
                schedule: ScheduleSpec {
                    name: name.clone(),
                    target: target.clone(),
                    kind: None,
                    every_s: *every,
                    keep: *keep,
                    prefix: prefix.clone(),
                    quiesce: *quiesce,
                    at_s: *at,
                },
            },
            ScheduleCmd::List => Request::ScheduleList,
            ScheduleCmd::Remove { name } => Request::ScheduleRemove { name: name.clone() },
            ScheduleCmd::Run { name } => Request::ScheduleRun { name: name.clone() },
        })
    }
}
