//! Who has a served disk open (docs/INTERLOCKS.md): the sessions of the
//! server's three transports (NBD connections, vhost-user-blk frontends,
//! processes with a file of the FUSE mount open), as requests see them
//! (`info`'s and `status`'s `clients`), the interlock that refuses to
//! take a disk or snapshot away from them unless forced, and the
//! vhost-user-blk sockets requests add and remove on a running server.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_api::units::{human, utc};
use strata_api::{ClientInfo, KeyRequest, Request, Response, VhostExport};
use strata_engine::{Error, ErrorKind};
use strata_fuse::FuseServer;
use strata_nbd::SessionList;
use strata_vhost::VhostBlkServer;

/// The server's vhost-user-blk sockets, which requests change (serve's
/// side: how a socket is bound, owned and served).
pub trait VhostControl: Send + Sync {
    /// Serve `disk` on a new socket at `socket` (absolute).
    fn add(&self, disk: &str, socket: &Path) -> Result<(), Error>;
    /// The server the sockets are served by.
    fn server(&self) -> &VhostBlkServer;
}

/// The transports' sessions, registered as each transport starts.
#[derive(Default)]
pub struct Clients {
    nbd: Mutex<Vec<SessionList>>,
    vhost: Mutex<Option<Arc<dyn VhostControl>>>,
    fuse: Mutex<Option<Arc<FuseServer>>>,
}

/// How a session is ended.
enum Holder {
    Nbd(SessionList, u64),
    Vhost(PathBuf),
    Fuse(String, u32),
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

    /// The vhost-user-blk sockets count (and can be changed) from now on.
    pub fn set_vhost(&self, vhost: Arc<dyn VhostControl>) {
        *self.vhost.lock() = Some(vhost);
    }

    /// The FUSE mount's open files count from now on.
    pub fn set_fuse(&self, fuse: Arc<FuseServer>) {
        *self.fuse.lock() = Some(fuse);
    }

    /// Sessions and vhost-user-blk sockets follow a rename: each export
    /// `rename` maps to a new name is listed (and served) under it.
    pub fn renamed(&self, rename: &dyn Fn(&str) -> Option<String>) {
        for list in self.nbd.lock().iter() {
            list.rename_exports(rename);
        }
        if let Some(v) = self.vhost.lock().clone() {
            v.server().rename_exports(rename);
        }
        if let Some(f) = self.fuse.lock().clone() {
            f.rename_exports(rename);
        }
    }

    /// Every session, oldest first.
    pub fn list(&self) -> Vec<ClientInfo> {
        self.all().into_iter().map(|(_, c)| c).collect()
    }

    /// The sessions on `disk`'s exports (the disk's, and its snapshots'
    /// `DISK@SNAP`), oldest first.
    pub fn of_disk(&self, disk: &str) -> Vec<ClientInfo> {
        let on = [(disk.to_string(), true)];
        self.matching(&on).into_iter().map(|(_, c)| c).collect()
    }

    /// Every session with how to end it, oldest first.
    fn all(&self) -> Vec<(Holder, ClientInfo)> {
        let mut out = Vec::new();
        for list in self.nbd.lock().iter() {
            for s in list.sessions() {
                let c = client(s.export, "nbd", s.peer, s.read_only, s.since_unix);
                out.push((Holder::Nbd(list.clone(), s.id), c));
            }
        }
        out.extend(
            self.vhost_sessions()
                .into_iter()
                .map(|(socket, c)| (Holder::Vhost(socket), c)),
        );
        if let Some(f) = self.fuse.lock().clone() {
            for s in f.sessions() {
                let c = client(
                    s.export.clone(),
                    "fuse",
                    process(s.pid),
                    s.read_only,
                    s.since_unix,
                );
                out.push((Holder::Fuse(s.export, s.pid), c));
            }
        }
        out.sort_by_key(|(_, c)| c.since_unix);
        out
    }

    /// The vhost-user-blk frontends connected now, by socket.
    fn vhost_sessions(&self) -> Vec<(PathBuf, ClientInfo)> {
        let Some(v) = self.vhost.lock().clone() else {
            return Vec::new();
        };
        v.server()
            .sessions()
            .into_iter()
            .map(|s| {
                let peer = match s.pid {
                    Some(pid) => format!("{} ({})", s.socket.display(), process(pid as u32)),
                    None => s.socket.display().to_string(),
                };
                let c = client(s.export, "vhost-user-blk", peer, s.read_only, s.since_unix);
                (s.socket, c)
            })
            .collect()
    }

    /// The sessions on `exports` (each with its snapshots' when its flag
    /// says so), oldest first, with how to end each.
    fn matching(&self, exports: &[(String, bool)]) -> Vec<(Holder, ClientInfo)> {
        let hit = |e: &str| {
            exports.iter().any(|(x, with_snapshots)| {
                e == x
                    || (*with_snapshots
                        && e.strip_prefix(x.as_str())
                            .is_some_and(|r| r.starts_with('@')))
            })
        };
        self.all()
            .into_iter()
            .filter(|(_, c)| hit(&c.export))
            .collect()
    }

    /// End the sessions of `holders` now: NBD connections are shut down,
    /// vhost-user-blk frontends cut off, FUSE handles answer EIO until
    /// closed.
    fn end(&self, holders: &[Holder]) {
        for h in holders {
            match h {
                Holder::Nbd(list, id) => list.close(&[*id]),
                Holder::Vhost(socket) => {
                    if let Some(v) = self.vhost.lock().clone() {
                        v.server().disconnect(socket);
                    }
                }
                Holder::Fuse(export, pid) => {
                    if let Some(f) = self.fuse.lock().clone() {
                        f.revoke(export, *pid);
                    }
                }
            }
        }
    }

    /// Refuse `req` while clients have open what it would take away,
    /// naming them (and, for `rm`, what removing frees: `frees`); when it
    /// is forced, end their sessions first (docs/INTERLOCKS.md).
    /// `members` gives a group's disks.
    pub fn interlock(
        &self,
        req: &Request,
        members: &dyn Fn(&str) -> Vec<String>,
        frees: &dyn Fn(&str) -> Option<u64>,
    ) -> Result<(), Error> {
        let Some(t) = taken(req, members) else {
            return Ok(());
        };
        let open = self.matching(&t.exports);
        if open.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = open.iter().map(|(_, c)| describe(c)).collect();
        let names = names.join(", ");
        if !t.force {
            let freed = match req {
                Request::Remove { name, .. } => frees(name)
                    .map(|b| format!("; removing it frees {}", human(b)))
                    .unwrap_or_default(),
                _ => String::new(),
            };
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "{} is open: {names}{freed}; stop those clients before {}, or pass --force",
                    t.what, t.doing
                ),
            ));
        }
        tracing::warn!(event = "interlock", what = %t.what,
            "{} forced while open: disconnected {names}", t.doing);
        let holders: Vec<Holder> = open.into_iter().map(|(h, _)| h).collect();
        self.end(&holders);
        Ok(())
    }

    /// The clients a forced `req` disconnects, described (None when it
    /// is not forced or nobody has open what it takes): what the event
    /// log's `interlock` event names.
    pub fn forced_over(
        &self,
        req: &Request,
        members: &dyn Fn(&str) -> Vec<String>,
    ) -> Option<String> {
        let t = taken(req, members).filter(|t| t.force)?;
        let open = self.matching(&t.exports);
        let names: Vec<String> = open.iter().map(|(_, c)| describe(c)).collect();
        (!names.is_empty()).then(|| names.join(", "))
    }

    /// `vhost add`, `vhost remove` and `vhost ls`.
    pub fn vhost_request(&self, req: &Request) -> Result<Response, Error> {
        let Some(v) = self.vhost.lock().clone() else {
            return Err(Error::new(
                ErrorKind::Refused,
                "this server serves no vhost-user-blk sockets",
            ));
        };
        match req {
            Request::VhostAdd { disk, socket } => {
                v.add(disk, socket)?;
                tracing::info!(event = "vhost_add", socket = %socket.display(), disk = %disk,
                    "vhost-user-blk export added");
                Ok(Response::VhostExports(self.vhost_exports(Some(socket))))
            }
            Request::VhostRemove { socket, force } => self.vhost_remove(&*v, socket, *force),
            Request::VhostList => Ok(Response::VhostExports(self.vhost_exports(None))),
            other => Err(Error::new(
                ErrorKind::Refused,
                format!("{other:?} is not a vhost request"),
            )),
        }
    }

    /// The vhost-user-blk sockets (only `socket`, if given) with their
    /// frontends.
    fn vhost_exports(&self, socket: Option<&Path>) -> Vec<VhostExport> {
        let Some(v) = self.vhost.lock().clone() else {
            return Vec::new();
        };
        let sessions = self.vhost_sessions();
        let frontend = |p: &Path| {
            sessions
                .iter()
                .find_map(|(s, c)| (s == p).then(|| c.clone()))
        };
        v.server()
            .listening()
            .into_iter()
            .filter(|l| socket.is_none_or(|s| s == l.socket))
            .map(|l| VhostExport {
                client: frontend(&l.socket),
                socket: l.socket,
                export: l.export,
            })
            .collect()
    }

    /// `vhost remove SOCKET`: refused while a frontend is connected,
    /// unless forced.
    fn vhost_remove(
        &self,
        v: &dyn VhostControl,
        socket: &Path,
        force: bool,
    ) -> Result<Response, Error> {
        let Some(export) = self.vhost_exports(Some(socket)).pop() else {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "this server serves no vhost-user-blk socket {}",
                    socket.display()
                ),
            ));
        };
        if let (Some(c), false) = (&export.client, force) {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "{} is in use: {}; stop that frontend first, or pass --force",
                    socket.display(),
                    describe(c)
                ),
            ));
        }
        if let Some(c) = &export.client {
            tracing::warn!(event = "interlock", socket = %socket.display(),
                "vhost-user-blk socket removed while in use: disconnected {}", describe(c));
        }
        v.server()
            .remove(socket)
            .map_err(|e| Error::new(ErrorKind::NotFound, e.to_string()))?;
        tracing::info!(event = "vhost_remove", socket = %socket.display(), disk = %export.export,
            "vhost-user-blk export removed");
        Ok(Response::VhostRemoved(export))
    }
}

fn client(export: String, transport: &str, peer: String, ro: bool, since: u64) -> ClientInfo {
    ClientInfo {
        export,
        transport: transport.into(),
        peer,
        read_only: ro,
        since_unix: since,
    }
}

/// `pid 4242 (qemu-img)`: a local process by its pid and command name.
fn process(pid: u32) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(name) => format!("pid {pid} ({})", name.trim_end()),
        Err(_) => format!("pid {pid}"),
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
        Request::Key(KeyRequest::Lock { name, force }) => {
            let disks = members(name).into_iter().map(|d| (d, true)).collect();
            t(
                disks,
                format!("'{name}' (or a disk sharing its keys)"),
                "locking it",
                force,
            )
        }
        _ => return None,
    })
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
