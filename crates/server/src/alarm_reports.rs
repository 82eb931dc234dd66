//! What a server last reported of each alarm, kept with the alarm rules
//! (docs/FORMAT.md §6 `alarms_reported`, §11.8), so that a server that
//! starts reports (logs and runs `--exec` for) only the alarms whose state
//! changed since the last report, not every raised alarm at every start.

use std::collections::HashMap;

use strata_datastore::Datastore;
use strata_engine::{AlarmKind, AlarmState};

/// The state of each alarm the last server reported: where the alarm
/// watcher starts from (ok for a kind never reported; for every kind
/// when they cannot be read, and then a raised alarm is reported again).
pub fn load(ds: &dyn Datastore) -> HashMap<AlarmKind, AlarmState> {
    match ds.alarms_reported() {
        Ok(r) => AlarmKind::ALL.iter().map(|&k| (k, r.get(k))).collect(),
        Err(e) => {
            tracing::warn!(
                "alarms: cannot read the states last reported ({}): a raised alarm is reported \
                 again",
                e.message
            );
            HashMap::new()
        }
    }
}

/// Record that alarm `kind` was just reported in `state` (durably; a
/// failure is a warning: the next server may report the change again).
pub fn record(ds: &dyn Datastore, kind: AlarmKind, state: AlarmState) {
    if let Err(e) = ds.set_alarm_reported(kind, state) {
        tracing::warn!(
            "{} alarm: cannot record that it was reported {} ({}): the next server may report \
             it again",
            kind.as_str(),
            state.as_str(),
            e.message
        );
    }
}
