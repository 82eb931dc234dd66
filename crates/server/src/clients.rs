//! Who has a served disk open (docs/INTERLOCKS.md): the sessions of the
//! server's transports, as requests see them (`info`'s `clients`). NBD's
//! are listed; vhost-user-blk's and FUSE's are not yet.

use parking_lot::Mutex;
use strata_api::ClientInfo;
use strata_nbd::SessionList;

/// The transports' sessions, registered as each transport starts.
#[derive(Default)]
pub struct Clients {
    nbd: Mutex<Vec<SessionList>>,
}

impl Clients {
    /// An NBD server's sessions count from now on.
    pub fn add_nbd(&self, sessions: SessionList) {
        self.nbd.lock().push(sessions);
    }

    /// The sessions on `disk`'s exports (the disk's, and its snapshots'
    /// `DISK@SNAP`), oldest first.
    pub fn of_disk(&self, disk: &str) -> Vec<ClientInfo> {
        let snapshot = format!("{disk}@");
        let mut out: Vec<(u64, ClientInfo)> = self
            .nbd
            .lock()
            .iter()
            .flat_map(SessionList::sessions)
            .filter(|s| s.export == disk || s.export.starts_with(&snapshot))
            .map(|s| {
                let since = s.since_unix;
                let c = ClientInfo {
                    export: s.export,
                    transport: "nbd".into(),
                    peer: s.peer,
                    read_only: s.read_only,
                    since_unix: since,
                };
                (since, c)
            })
            .collect();
        out.sort_by_key(|(since, _)| *since);
        out.into_iter().map(|(_, c)| c).collect()
    }
}
