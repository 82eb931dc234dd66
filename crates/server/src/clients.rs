//! Who has a served disk open (docs/INTERLOCKS.md): the sessions of the
//! server's transports, as requests see them (`info`'s `clients`), and
//! the interlock that refuses to take a disk or snapshot away from them
//! unless forced. NBD's sessions are listed; vhost-user-blk's and FUSE's
//! are not yet.

use parking_lot::Mutex;
use strata_api::units::utc;
use strata_api::{ClientInfo, Request};
use strata_engine::{Error, ErrorKind};
use strata_nbd::{Session, SessionList};

/// The transports' sessions, registered as each transport starts.
#[derive(Default)]
pub struct Clients {
    nbd: Mutex<Vec<SessionList>>,
}

/// What a request would take away: exports, each with or without its
/// snapshots' (`NAME@SNAP`), and how to say it.
struct Taken {
    exports: Vec<(String, bool)>,
    what: String,
    doing: &'static str,
    force: bool,
}

impl Clients {
    /// An NBD server's sessions count from now on.
    pub fn add_nbd(&self, sessions: SessionList) {
        self.nbd.lock().push(sessions);
    }

    /// The sessions on `disk`'s exports (the disk's, and its snapshots'
    /// `DISK@SNAP`), oldest first.
    pub fn of_disk(&self, disk: &str) -> Vec<ClientInfo> {
        let on = [(disk.to_string(), true)];
        self.matching(&on)
            .into_iter()
            .map(|(_, s)| info(s))
            .collect()
    }

    /// The sessions on `exports` (each with its snapshots' when its flag
    /// says so), oldest first, with the list each came from.
    fn matching(&self, exports: &[(String, bool)]) -> Vec<(SessionList, Session)> {
        let hit = |e: &str| {
            exports.iter().any(|(x, with_snapshots)| {
                e == x
                    || (*with_snapshots
                        && e.strip_prefix(x.as_str())
                            .is_some_and(|r| r.starts_with('@')))
            })
        };
        let mut out: Vec<(SessionList, Session)> = Vec::new();
        for list in self.nbd.lock().iter() {
            for s in list.sessions() {
                if hit(&s.export) {
                    out.push((list.clone(), s));
                }
            }
        }
        out.sort_by_key(|(_, s)| (s.since_unix, s.id));
        out
    }

    /// Refuse `req` while clients have open what it would take away,
    /// naming them; when it is forced, end their sessions first
    /// (docs/INTERLOCKS.md). `members` gives a group's disks.
    pub fn interlock(
        &self,
        req: &Request,
        members: &dyn Fn(&str) -> Vec<String>,
    ) -> Result<(), Error> {
        let Some(t) = taken(req, members) else {
            return Ok(());
        };
        let open = self.matching(&t.exports);
        if open.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = open
            .iter()
            .map(|(_, s)| describe(&info(s.clone())))
            .collect();
        let names = names.join(", ");
        if !t.force {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "{} is open: {names}; stop those clients before {}, or pass --force",
                    t.what, t.doing
                ),
            ));
        }
        tracing::warn!(event = "interlock", what = %t.what,
            "{} forced while open: disconnected {names}", t.doing);
        for (list, s) in &open {
            list.close(&[s.id]);
        }
        Ok(())
    }
}

/// What `req` would take away from clients, if anything.
fn taken(req: &Request, members: &dyn Fn(&str) -> Vec<String>) -> Option<Taken> {
    let t = |exports: Vec<(String, bool)>, what: String, doing, force: &bool| Taken {
        exports,
        what,
        doing,
        force: *force,
    };
    Some(match req {
        Request::Remove { name, force } => t(
            vec![(name.clone(), true)],
            format!("'{name}'"),
            "removing it",
            force,
        ),
        Request::SnapshotDelete {
            disk,
            snapshot,
            force,
        } => {
            let s = format!("{disk}@{snapshot}");
            t(
                vec![(s.clone(), false)],
                format!("'{s}'"),
                "deleting it",
                force,
            )
        }
        Request::SnapshotRevert { disk, force, .. } => t(
            vec![(disk.clone(), false)],
            format!("'{disk}'"),
            "reverting it",
            force,
        ),
        Request::GroupSnapshotRevert { group, force, .. } => {
            let disks = members(group).into_iter().map(|d| (d, false)).collect();
            t(
                disks,
                format!("a disk of group '{group}'"),
                "reverting the group",
                force,
            )
        }
        _ => return None,
    })
}

fn info(s: Session) -> ClientInfo {
    ClientInfo {
        export: s.export,
        transport: "nbd".into(),
        peer: s.peer,
        read_only: s.read_only,
        since_unix: s.since_unix,
    }
}

/// `vm@s1 over nbd from local pid 42 (read-only, since ...)`.
pub fn describe(c: &ClientInfo) -> String {
    let mode = if c.read_only {
        "read-only"
    } else {
        "read-write"
    };
    let since = utc(c.since_unix * 1000);
    format!(
        "{} over {} from {} ({mode}, since {since})",
        c.export, c.transport, c.peer
    )
}
