//! An object-store datastore's capacity, alarm rules and reported alarm
//! states, kept per host in its local directory (`DIR/alarms.json`,
//! FORMAT.md §11.8): an object store has no size of its own, and an
//! alarm's command runs on the host that set it.

use std::path::Path;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strata_engine::alarm::{effective_rules, evaluate, SpaceFigures};
use strata_engine::ReportedAlarms;
use strata_engine::{AlarmRule, AlarmStatus};

use crate::{Error, ErrorKind, Result};

const FILE: &str = "alarms.json";

/// What `DIR/alarms.json` holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct AlarmSettings {
    /// The capacity alarms measure against (0: none set).
    #[serde(default)]
    pub capacity_bytes: u64,
    /// Rules set with `strata alarm set` (the others are the defaults).
    #[serde(default)]
    pub alarms: Vec<AlarmRule>,
    /// What this host's server last reported of each alarm (ok left out).
    #[serde(default, skip_serializing_if = "ReportedAlarms::is_empty")]
    pub alarms_reported: ReportedAlarms,
}

/// Held around a read, change and write of the file, so that two changes
/// in one process (a server's `alarm set` and its watcher's record of a
/// report) do not lose each other's.
static UPDATING: Mutex<()> = Mutex::new(());

impl AlarmSettings {
    /// The settings in `dir` (the defaults when it has none).
    pub fn load(dir: &Path) -> Result<AlarmSettings> {
        let p = dir.join(FILE);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("{}: {e} (fix or remove it)", p.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(AlarmSettings::default()),
            Err(e) => Err(Error::new(ErrorKind::Io, format!("{}: {e}", p.display()))),
        }
    }

    /// Write them whole, durably (temporary file, fsync, rename).
    pub fn save(&self, dir: &Path) -> Result<()> {
        let body = serde_json::to_vec_pretty(self).expect("json");
        strata_objstore::write_durably(dir, FILE, &body)
            .map_err(|e| Error::new(ErrorKind::Io, e.message))
    }

    /// Change the settings in `dir` with `change`, and write them back
    /// when it says it changed them.
    pub fn update(
        dir: &Path,
        change: impl FnOnce(&mut AlarmSettings) -> Result<bool>,
    ) -> Result<()> {
        let _g = UPDATING.lock();
        let mut settings = AlarmSettings::load(dir)?;
        if change(&mut settings)? {
            settings.save(dir)?;
        }
        Ok(())
    }

    /// Every alarm's rule (the default where none was set).
    pub fn rules(&self) -> Vec<AlarmRule> {
        effective_rules(&self.alarms)
    }

    /// Set one alarm's rule.
    pub fn set(&mut self, rule: AlarmRule) -> Result<()> {
        rule.validate()?;
        self.alarms.retain(|r| r.kind != rule.kind);
        self.alarms.push(rule);
        self.alarms.sort_by_key(|r| r.kind);
        Ok(())
    }

    /// The figures alarms read: what the store holds (`used_bytes`)
    /// and the disks' sizes (`provisioned_bytes`) against the capacity.
    pub fn figures(&self, used_bytes: u64, provisioned_bytes: u64) -> SpaceFigures {
        SpaceFigures {
            capacity_bytes: self.capacity_bytes,
            used_bytes,
            reserved_bytes: 0,
            provisioned_bytes,
        }
    }

    /// Every alarm as `figures` put it.
    pub fn evaluate(&self, figures: &SpaceFigures) -> Vec<AlarmStatus> {
        evaluate(figures, &self.rules())
    }
}
