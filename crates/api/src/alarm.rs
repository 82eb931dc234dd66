//! Datastore alarms: thresholds on space usage and over-allocation, kept in
//! the catalog (docs/FORMAT.md §6: an [`AlarmRule`]'s serde shape is the
//! catalog's, so it changes only with the format), and the one pure
//! function that turns space figures and thresholds into states, shared by
//! `status`, `alarm list` and the server's periodic evaluation, on both
//! kinds of datastore.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use strata_block::{Error, Kind as ErrorKind};

type Result<T> = std::result::Result<T, Error>;

fn err<T>(kind: ErrorKind, message: impl Into<String>) -> Result<T> {
    Err(Error::new(kind, message))
}

/// What an alarm watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum AlarmKind {
    /// (used + reserved) / capacity.
    Usage,
    /// provisioned / capacity (`overcommit_percent`).
    Overcommit,
}

impl AlarmKind {
    pub const ALL: [AlarmKind; 2] = [AlarmKind::Usage, AlarmKind::Overcommit];

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "usage" => Ok(Self::Usage),
            "overcommit" => Ok(Self::Overcommit),
            other => err(
                ErrorKind::InvalidArgument,
                format!("unknown alarm '{other}' (use usage or overcommit)"),
            ),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Usage => "usage",
            Self::Overcommit => "overcommit",
        }
    }

    /// The thresholds an alarm has until the user sets it: vCenter's
    /// datastore usage alarm (75/85), and provisioning past the capacity
    /// warns, past twice the capacity alarms.
    pub fn default_rule(self) -> AlarmRule {
        let (warning_percent, alarm_percent) = match self {
            Self::Usage => (75, 85),
            Self::Overcommit => (100, 200),
        };
        AlarmRule {
            kind: self,
            warning_percent,
            alarm_percent,
            exec: None,
        }
    }

    /// Highest threshold accepted: usage cannot pass 100% (allocation
    /// stops there), over-allocation can.
    fn max_percent(self) -> u64 {
        match self {
            Self::Usage => 100,
            Self::Overcommit => 100_000,
        }
    }
}

/// An alarm's state; ordered by severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum AlarmState {
    Ok,
    Warning,
    Alarm,
}

impl AlarmState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warning => "warning",
            Self::Alarm => "alarm",
        }
    }

    /// The Prometheus gauge value: 0 ok, 1 warning, 2 alarm.
    pub fn level(self) -> u8 {
        self as u8
    }
}

/// One alarm's thresholds as kept in the catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlarmRule {
    pub kind: AlarmKind,
    /// Warning at or above this percent.
    pub warning_percent: u64,
    /// Alarm at or above this percent.
    pub alarm_percent: u64,
    /// Shell command a server runs when the state changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<String>,
}

impl AlarmRule {
    /// Refuse thresholds that make no sense: 0 < warning <= alarm, and
    /// usage at most 100.
    pub fn validate(&self) -> Result<()> {
        let (w, a) = (self.warning_percent, self.alarm_percent);
        let kind = self.kind.as_str();
        if w == 0 {
            return err(
                ErrorKind::InvalidArgument,
                format!("{kind} alarm: --warning must be above 0%"),
            );
        }
        if w > a {
            return err(
                ErrorKind::InvalidArgument,
                format!(
                    "{kind} alarm: --warning {w}% is above --alarm {a}%; warning must come first"
                ),
            );
        }
        let max = self.kind.max_percent();
        if a > max {
            return err(
                ErrorKind::InvalidArgument,
                format!("{kind} alarm: --alarm {a}% is above {max}%, the most it can reach"),
            );
        }
        if self.exec.as_deref().is_some_and(|c| c.contains('\0')) {
            return err(
                ErrorKind::InvalidArgument,
                format!("{kind} alarm: --exec must not contain a NUL byte"),
            );
        }
        Ok(())
    }

    /// The state for `percent`.
    pub fn state(&self, percent: u64) -> AlarmState {
        if percent >= self.alarm_percent {
            AlarmState::Alarm
        } else if percent >= self.warning_percent {
            AlarmState::Warning
        } else {
            AlarmState::Ok
        }
    }
}

/// The state each alarm was in when a server last reported it (logged its
/// change and ran its command), as the catalog and an object store's
/// `alarms.json` keep it (docs/FORMAT.md §6 `alarms_reported`): a JSON
/// object of kind names to state names, ok left out. A server that
/// starts reports only what differs from it. Names this build does not
/// know are kept as they are and read as nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ReportedAlarms(BTreeMap<String, String>);

impl ReportedAlarms {
    /// Nothing reported but ok (or nothing ever reported).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The state `kind` was last reported in (ok when it never was).
    pub fn get(&self, kind: AlarmKind) -> AlarmState {
        match self.0.get(kind.as_str()).map(String::as_str) {
            Some("warning") => AlarmState::Warning,
            Some("alarm") => AlarmState::Alarm,
            _ => AlarmState::Ok,
        }
    }

    /// Record that `kind` was reported in `state`; whether that changed
    /// what is recorded.
    pub fn set(&mut self, kind: AlarmKind, state: AlarmState) -> bool {
        let key = kind.as_str();
        let want = (state != AlarmState::Ok).then(|| state.as_str());
        if self.0.get(key).map(String::as_str) == want {
            return false;
        }
        match want {
            Some(v) => self.0.insert(key.into(), v.into()),
            None => self.0.remove(key),
        };
        true
    }
}

/// The space figures alarms are evaluated on, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceFigures {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub reserved_bytes: u64,
    pub provisioned_bytes: u64,
}

impl SpaceFigures {
    /// `part` over the capacity in whole percent, rounded down (so a state
    /// changes exactly when `part * 100 >= threshold * capacity`); 0 with no
    /// capacity.
    fn percent(&self, part: u64) -> u64 {
        let p = u128::from(part) * 100;
        p.checked_div(u128::from(self.capacity_bytes))
            .map(|x| x.min(u128::from(u64::MAX)) as u64)
            .unwrap_or(0)
    }

    /// (used + reserved) / capacity in percent.
    pub fn used_percent(&self) -> u64 {
        self.percent(self.used_bytes.saturating_add(self.reserved_bytes))
    }

    /// provisioned / capacity in percent.
    pub fn overcommit_percent(&self) -> u64 {
        self.percent(self.provisioned_bytes)
    }

    pub fn percent_of(&self, kind: AlarmKind) -> u64 {
        match kind {
            AlarmKind::Usage => self.used_percent(),
            AlarmKind::Overcommit => self.overcommit_percent(),
        }
    }
}

/// One alarm as evaluated (`status --json`'s `alarms`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlarmStatus {
    pub kind: AlarmKind,
    pub state: AlarmState,
    pub percent: u64,
    pub warning_percent: u64,
    pub alarm_percent: u64,
}

/// Every kind's rule: the catalog's where set, else the default; in
/// [`AlarmKind::ALL`] order.
pub fn effective_rules(stored: &[AlarmRule]) -> Vec<AlarmRule> {
    AlarmKind::ALL
        .iter()
        .map(|k| {
            stored
                .iter()
                .find(|r| r.kind == *k)
                .cloned()
                .unwrap_or_else(|| k.default_rule())
        })
        .collect()
}

/// Evaluate `rules` on `figures` (pure: no clock, no I/O).
pub fn evaluate(figures: &SpaceFigures, rules: &[AlarmRule]) -> Vec<AlarmStatus> {
    rules
        .iter()
        .map(|r| {
            let percent = figures.percent_of(r.kind);
            AlarmStatus {
                kind: r.kind,
                state: r.state(percent),
                percent,
                warning_percent: r.warning_percent,
                alarm_percent: r.alarm_percent,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(used: u64, reserved: u64, capacity: u64) -> AlarmStatus {
        let f = SpaceFigures {
            capacity_bytes: capacity,
            used_bytes: used,
            reserved_bytes: reserved,
            provisioned_bytes: 0,
        };
        evaluate(&f, &[AlarmKind::Usage.default_rule()]).remove(0)
    }

    #[test]
    fn usage_changes_state_exactly_at_the_thresholds() {
        let cap = 1000;
        // 749/1000 = 74.9%: still ok; 750 = 75%: warning.
        assert_eq!(usage(749, 0, cap).state, AlarmState::Ok);
        assert_eq!(usage(749, 0, cap).percent, 74);
        assert_eq!(usage(750, 0, cap).state, AlarmState::Warning);
        assert_eq!(usage(849, 0, cap).state, AlarmState::Warning);
        assert_eq!(usage(850, 0, cap).state, AlarmState::Alarm);
        assert_eq!(usage(1000, 0, cap).state, AlarmState::Alarm);
        // Reserved bytes count like used ones.
        assert_eq!(usage(400, 350, cap).state, AlarmState::Warning);
        assert_eq!(usage(0, 850, cap).percent, 85);
        // A capacity that is not a multiple of 100 rounds down.
        assert_eq!(usage(7499, 0, 9999).state, AlarmState::Ok);
        assert_eq!(usage(7500, 0, 9999).state, AlarmState::Warning);
    }

    #[test]
    fn overcommit_uses_provisioned_over_capacity() {
        let f = |prov: u64| SpaceFigures {
            capacity_bytes: 1 << 30,
            used_bytes: 0,
            reserved_bytes: 0,
            provisioned_bytes: prov,
        };
        let r = [AlarmKind::Overcommit.default_rule()];
        assert_eq!(evaluate(&f((1 << 30) - 1), &r)[0].state, AlarmState::Ok);
        assert_eq!(evaluate(&f(1 << 30), &r)[0].state, AlarmState::Warning);
        assert_eq!(
            evaluate(&f((2 << 30) - 1), &r)[0].state,
            AlarmState::Warning
        );
        assert_eq!(evaluate(&f(2 << 30), &r)[0].state, AlarmState::Alarm);
        assert_eq!(evaluate(&f(5 << 30), &r)[0].percent, 500);
    }

    #[test]
    fn huge_figures_and_no_capacity_do_not_overflow() {
        let f = SpaceFigures {
            capacity_bytes: 1,
            used_bytes: u64::MAX,
            reserved_bytes: u64::MAX,
            provisioned_bytes: u64::MAX,
        };
        assert_eq!(f.used_percent(), u64::MAX);
        let none = SpaceFigures::default();
        assert_eq!(none.used_percent(), 0);
    }

    #[test]
    fn equal_thresholds_skip_the_warning() {
        let r = AlarmRule {
            kind: AlarmKind::Usage,
            warning_percent: 90,
            alarm_percent: 90,
            exec: None,
        };
        r.validate().unwrap();
        assert_eq!(r.state(89), AlarmState::Ok);
        assert_eq!(r.state(90), AlarmState::Alarm);
    }

    #[test]
    fn nonsense_thresholds_are_refused() {
        let rule = |kind, w, a| AlarmRule {
            kind,
            warning_percent: w,
            alarm_percent: a,
            exec: None,
        };
        for (k, w, a, says) in [
            (AlarmKind::Usage, 0, 10, "above 0%"),
            (AlarmKind::Usage, 90, 80, "warning must come first"),
            (AlarmKind::Usage, 90, 101, "above 100%"),
            (AlarmKind::Overcommit, 300, 200, "warning must come first"),
        ] {
            let e = rule(k, w, a).validate().unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument);
            assert!(e.message.contains(says), "{}", e.message);
        }
        rule(AlarmKind::Overcommit, 150, 400).validate().unwrap();
    }

    #[test]
    fn reported_states_leave_ok_out_and_keep_what_they_do_not_know() {
        let mut r = ReportedAlarms::default();
        assert_eq!(r.get(AlarmKind::Overcommit), AlarmState::Ok);
        assert!(!r.set(AlarmKind::Overcommit, AlarmState::Ok));
        assert!(r.set(AlarmKind::Overcommit, AlarmState::Alarm));
        assert!(!r.set(AlarmKind::Overcommit, AlarmState::Alarm));
        assert!(r.set(AlarmKind::Usage, AlarmState::Warning));
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"overcommit":"alarm","usage":"warning"}"#
        );
        assert!(r.set(AlarmKind::Overcommit, AlarmState::Ok));
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"usage":"warning"}"#);
        // A later build's kind or state: kept, read as nothing.
        let mut r: ReportedAlarms =
            serde_json::from_str(r#"{"inodes":"alarm","usage":"critical"}"#).unwrap();
        assert_eq!(r.get(AlarmKind::Usage), AlarmState::Ok);
        assert!(r.set(AlarmKind::Usage, AlarmState::Ok));
        assert!(r.set(AlarmKind::Overcommit, AlarmState::Warning));
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"inodes":"alarm","overcommit":"warning"}"#
        );
    }

    #[test]
    fn rules_not_set_take_their_defaults() {
        let set = AlarmRule {
            kind: AlarmKind::Overcommit,
            warning_percent: 120,
            alarm_percent: 150,
            exec: Some("true".into()),
        };
        let r = effective_rules(std::slice::from_ref(&set));
        assert_eq!(r, vec![AlarmKind::Usage.default_rule(), set]);
    }
}
