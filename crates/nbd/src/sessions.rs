//! Sessions: the connections past their handshake, each with the export
//! it opened and who the client is, listed for a server's `info` and
//! ended by a forced `rm` or revert (docs/INTERLOCKS.md).

use crate::Shared;

/// What a connection opened: the export, read-only or not, and the
/// client's certificate subject under TLS.
pub(crate) struct OpenedBy {
    pub(crate) export: String,
    pub(crate) read_only: bool,
    pub(crate) who: Option<String>,
}

/// A client connection with an export open (see [`crate::NbdServer::sessions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The connection's id, unique in this server's life.
    pub id: u64,
    pub export: String,
    /// `ip:port`, or `local pid N` over a Unix socket; under TLS with a
    /// client certificate, its subject first.
    pub peer: String,
    pub read_only: bool,
    pub since_unix: u64,
}

/// The sessions of a server (see [`crate::NbdServer::session_list`]).
#[derive(Clone)]
pub struct SessionList(pub(crate) std::sync::Weak<Shared>);

impl SessionList {
    /// The server's sessions now; none once it is gone.
    pub fn sessions(&self) -> Vec<Session> {
        self.0.upgrade().map(|s| s.sessions()).unwrap_or_default()
    }

    /// End sessions `ids` now: their sockets are shut down both ways, so
    /// their clients see the connection go and requests they had not sent
    /// are not run (a forced `rm` or revert, docs/INTERLOCKS.md). They are
    /// no longer listed; their threads finish as for any disconnect.
    pub fn close(&self, ids: &[u64]) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let mut reg = shared.conns.lock();
        for id in ids {
            if let Some(c) = reg.live.get_mut(id) {
                c.evicted = true;
                c.stop.close();
            }
        }
    }
}

impl SessionList {
    /// Sessions follow a rename (`strata rename`, `snapshot rename`): each
    /// export `rename` maps to a new name is listed by that name from now
    /// on (the connection keeps its device).
    pub fn rename_exports(&self, rename: &dyn Fn(&str) -> Option<String>) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let mut reg = shared.conns.lock();
        for c in reg.live.values_mut() {
            if let Some(o) = c.open.as_mut() {
                if let Some(new) = rename(&o.export) {
                    o.export = new;
                }
            }
        }
    }
}

impl Shared {
    pub(crate) fn sessions(&self) -> Vec<Session> {
        let reg = self.conns.lock();
        let mut out: Vec<Session> = reg
            .live
            .iter()
            // A client that hung up is gone, though its thread may not
            // have seen it yet (a command run right after it exited).
            .filter(|(_, c)| !c.evicted && !c.stop.hung_up())
            .filter_map(|(&id, c)| {
                let o = c.open.as_ref()?;
                Some(Session {
                    id,
                    export: o.export.clone(),
                    peer: match &o.who {
                        Some(who) => format!("{who} at {}", c.peer),
                        None => c.peer.clone(),
                    },
                    read_only: o.read_only,
                    since_unix: c.since_unix,
                })
            })
            .collect();
        out.sort_by_key(|s| s.id);
        out
    }
}
