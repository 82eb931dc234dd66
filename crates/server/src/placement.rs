//! Where a server's disks live (docs/MOVE.md): its home datastore, or
//! another datastore a move put them in, as the home's placement file
//! says; the one [`Slot`] per served export; and the datastores (local or
//! object-store) the server opened for them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use strata_api::{Request, Response};
use strata_datastore::{Datastore as AnyDatastore, OpenOptions};
use strata_engine::{Error, ErrorKind, SpaceWork, WorkControl};

use crate::move_settings::MoveSettings;
use crate::ops::{self, Ctx};
use crate::slot::Slot;

pub use strata_datastore::Kind;

/// An open datastore a disk may live in, whichever its kind.
pub type Store = Arc<dyn AnyDatastore>;

/// The placement file in the home datastore's directory.
pub const FILE_PLACEMENT: &str = "placement.json";

/// A datastore, by its (canonical) directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Location {
    pub kind: Kind,
    pub dir: PathBuf,
}

impl Location {
    /// The datastore in `dir`: a local one, or a directory attached to an
    /// object store.
    pub fn of(dir: &Path) -> Result<Location, Error> {
        let (kind, dir) = strata_datastore::probe(dir)?;
        Ok(Location { kind, dir })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The source is authoritative; the target is being built.
    Copying,
    /// The target is authoritative; the source is to be removed.
    Switched,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveEntry {
    pub from: Location,
    pub to: Location,
    pub phase: Phase,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PlacementFile {
    pub version: u32,
    /// Disks whose place is not home.
    #[serde(default)]
    pub disks: BTreeMap<String, Location>,
    /// Moves under way.
    #[serde(default)]
    pub moves: BTreeMap<String, MoveEntry>,
}

impl PlacementFile {
    fn load(home: &Path) -> Result<PlacementFile, Error> {
        let p = home.join(FILE_PLACEMENT);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("{}: not a placement file: {e}", p.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(PlacementFile {
                version: 1,
                ..Default::default()
            }),
            Err(e) => Err(Error::new(
                ErrorKind::Io,
                format!("read {}: {e}", p.display()),
            )),
        }
    }

    /// Write it whole, atomically: temporary file, fsync, rename, fsync of
    /// the directory.
    fn save(&self, home: &Path) -> Result<(), Error> {
        let io = |what: &str, e: std::io::Error| Error::new(ErrorKind::Io, format!("{what}: {e}"));
        let p = home.join(FILE_PLACEMENT);
        let tmp = home.join(format!("{FILE_PLACEMENT}.tmp"));
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create placement file", e))?;
        f.write_all(&serde_json::to_vec_pretty(self).expect("json"))
            .and_then(|_| f.sync_all())
            .map_err(|e| io("write placement file", e))?;
        std::fs::rename(&tmp, &p).map_err(|e| io("rename placement file", e))?;
        std::fs::File::open(home)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("sync datastore directory", e))
    }
}

/// How the server opens other datastores for moves, and how its moves
/// run.
#[derive(Debug, Clone)]
pub struct Config {
    pub metadata_cache: u64,
    pub direct_io: bool,
    pub store_timeout: Duration,
    /// Object stores: whole-object prefetch and automatic compaction
    /// (`strata_datastore::OpenOptions`).
    pub store_prefetch: bool,
    pub store_compact: strata_datastore::AutoCompact,
    pub store_compress: bool,
    pub moves: MoveSettings,
}

impl Default for Config {
    /// A datastore's defaults ([`OpenOptions`]), and moves that mirror
    /// when they must.
    fn default() -> Self {
        let o = OpenOptions::default();
        Config {
            metadata_cache: o.cache_bytes,
            direct_io: o.direct_io,
            store_timeout: o.store_timeout,
            store_prefetch: o.store_prefetch,
            store_compact: o.store_compact,
            store_compress: o.store_compress,
            moves: MoveSettings::default(),
        }
    }
}

/// A server's disks and where they live.
pub struct Places {
    home_dir: PathBuf,
    /// The server's own datastore (either kind).
    home: Store,
    cfg: Config,
    guests: Mutex<Vec<(PathBuf, Store)>>,
    file: Mutex<PlacementFile>,
    slots: Mutex<HashMap<String, Weak<Slot>>>,
    pub(crate) moving: Mutex<HashSet<String>>,
}

impl Places {
    /// Read the home's placement file, finish or undo the moves a crash
    /// cut (docs/MOVE.md), and open the datastores placed disks live in.
    pub fn open(home_dir: &Path, home: Store, cfg: Config) -> Result<Arc<Places>, Error> {
        let home_dir = std::fs::canonicalize(home_dir)
            .map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", home_dir.display())))?;
        let file = PlacementFile::load(&home_dir)?;
        let p = Arc::new(Places {
            home_dir,
            home,
            cfg,
            guests: Mutex::new(Vec::new()),
            file: Mutex::new(file),
            slots: Mutex::new(HashMap::new()),
            moving: Mutex::new(HashSet::new()),
        });
        p.recover()?;
        let placed: Vec<(String, Location)> = p.file.lock().disks.clone().into_iter().collect();
        for (name, loc) in placed {
            if let Err(e) = p.store(&loc) {
                tracing::warn!(
                    "disk {name} lives in {}, which could not be opened: {}",
                    loc.dir.display(),
                    e.message
                );
            }
        }
        Ok(p)
    }

    fn recover(&self) -> Result<(), Error> {
        let moves: Vec<(String, MoveEntry)> = self.file.lock().moves.clone().into_iter().collect();
        for (name, m) in moves {
            // Copying: the source is authoritative, the target goes.
            // Switched: the target is, the source goes.
            let (gone, verb) = match m.phase {
                Phase::Copying => (&m.to, "undone: removed the partial copy"),
                Phase::Switched => (&m.from, "finished: removed the source"),
            };
            let r = self.store(gone).and_then(|s| {
                if s.exists(&name) {
                    s.remove(&name)
                } else {
                    Ok(())
                }
            });
            match r {
                Ok(()) => {
                    tracing::warn!(
                        "the move of disk {name} to {} was cut; {verb} in {}",
                        m.to.dir.display(),
                        gone.dir.display()
                    );
                    self.update(|f| {
                        f.moves.remove(&name);
                    })?;
                }
                Err(e) => tracing::warn!(
                    "the move of disk {name} was cut and its clean-up in {} failed \
                     (retried at the next start): {}",
                    gone.dir.display(),
                    e.message
                ),
            }
        }
        Ok(())
    }

    pub fn home_dir(&self) -> &Path {
        &self.home_dir
    }

    /// How this server's moves run.
    pub fn moves(&self) -> &MoveSettings {
        &self.cfg.moves
    }

    pub fn home_location(&self) -> Location {
        Location {
            kind: self.home.kind(),
            dir: self.home_dir.clone(),
        }
    }

    /// Change the placement file (in memory and on disk, atomically).
    pub fn update(&self, f: impl FnOnce(&mut PlacementFile)) -> Result<(), Error> {
        let mut g = self.file.lock();
        let mut next = g.clone();
        f(&mut next);
        next.version = 1;
        next.save(&self.home_dir)?;
        *g = next;
        Ok(())
    }

    /// Where disk `name` lives.
    pub fn place_of(&self, disk: &str) -> Location {
        self.file
            .lock()
            .disks
            .get(disk)
            .cloned()
            .unwrap_or_else(|| self.home_location())
    }

    /// The open datastore at `loc` (opened now if it is not: a local one
    /// under its lock, which a server of its own would hold).
    pub fn store(&self, loc: &Location) -> Result<Store, Error> {
        if loc.dir == self.home_dir {
            return Ok(self.home.clone());
        }
        let mut g = self.guests.lock();
        if let Some((_, s)) = g.iter().find(|(d, _)| d == &loc.dir) {
            return Ok(s.clone());
        }
        let opts = OpenOptions {
            cache_bytes: self.cfg.metadata_cache,
            direct_io: self.cfg.direct_io,
            store_timeout: self.cfg.store_timeout,
            store_prefetch: self.cfg.store_prefetch,
            store_compact: self.cfg.store_compact,
            store_compress: self.cfg.store_compress,
            // Its disks are served here: their claims are this server's.
            role: strata_datastore::Role::Server,
            ..Default::default()
        };
        // Another server of the directory answers on its control socket
        // (and holds a local datastore's lock).
        let ctl = loc.dir.join(strata_format::FILE_CONTROL);
        if std::os::unix::net::UnixStream::connect(&ctl).is_ok() {
            return Err(Error::new(
                ErrorKind::Locked,
                format!(
                    "{} is served by another strata server on this host (its control socket \
                     answers): move into it from that server's side, or stop it",
                    loc.dir.display()
                ),
            ));
        }
        let s: Store = match strata_datastore::open(&loc.dir, &opts) {
            Err(e) if e.kind == ErrorKind::Locked => {
                return Err(Error::new(
                    ErrorKind::Locked,
                    format!(
                        "{}: a disk can move only into a datastore no other process holds",
                        e.message
                    ),
                ))
            }
            r => r?,
        };
        g.push((loc.dir.clone(), s.clone()));
        Ok(s)
    }

    /// Close the datastore at `loc` if this server has no use for it: not
    /// home, no disk placed in it, no move recorded with it.
    pub fn release_unused(&self, loc: &Location) {
        if loc.dir == self.home_dir {
            return;
        }
        {
            let f = self.file.lock();
            if f.disks.values().any(|l| l == loc)
                || f.moves.values().any(|m| &m.from == loc || &m.to == loc)
            {
                return;
            }
        }
        let gone: Vec<Store> = {
            let mut g = self.guests.lock();
            let (gone, keep) = g.drain(..).partition(|(d, _)| d == &loc.dir);
            *g = keep;
            gone.into_iter().map(|(_, s)| s).collect()
        };
        for s in gone {
            close(&*s);
        }
    }

    /// The slot of export `name` (`DISK` or `DISK@SNAP`): one per export
    /// while anything holds it, opened from the disk's place. A new user
    /// of a disk's head asks its datastore even while the slot is open,
    /// so that what the datastore refuses now (a fenced object-store disk)
    /// is refused to it too; the users already in keep their slot.
    pub fn slot(&self, name: &str) -> Result<Arc<Slot>, Error> {
        let mut slots = self.slots.lock();
        let (disk, snap) = strata_format::split_target(name);
        if let Some(s) = slots.get(name).and_then(Weak::upgrade) {
            if snap.is_none() {
                self.store(&self.place_of(disk))?.open(name)?;
            }
            return Ok(s);
        }
        let dev = self.store(&self.place_of(disk))?.open(name)?;
        let s = Arc::new(Slot::new(dev));
        slots.retain(|_, w| w.strong_count() > 0);
        slots.insert(name.to_string(), Arc::downgrade(&s));
        Ok(s)
    }

    /// Forget the slot of export `name` (and those of its snapshots when
    /// `with_snapshots`): it was removed or deleted. Its clients keep it
    /// (and the device of what was removed); the next client of the name
    /// opens a slot of its own on what the name then is (a new disk or
    /// snapshot of the same name, never the old one's device).
    pub fn forget_slots(&self, name: &str, with_snapshots: bool) {
        let prefix = format!("{name}@");
        self.slots
            .lock()
            .retain(|n, _| n != name && !(with_snapshots && n.starts_with(&prefix)));
    }

    /// The open slots of `disk`'s snapshots (`DISK@SNAP`).
    pub fn snapshot_slots(&self, disk: &str) -> Vec<(String, Arc<Slot>)> {
        let prefix = format!("{disk}@");
        self.slots
            .lock()
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .filter_map(|(n, w)| w.upgrade().map(|s| (n.clone(), s)))
            .collect()
    }

    /// Every export: home's disks (but those placed elsewhere) and the
    /// disks placed in other datastores, with their snapshots.
    pub fn export_names(&self) -> Vec<(String, String)> {
        let placed = self.file.lock().disks.clone();
        let mut out: Vec<(String, String)> = self
            .home
            .export_names()
            .into_iter()
            .filter(|(n, _)| !placed.contains_key(strata_format::split_target(n).0))
            .collect();
        for (disk, loc) in &placed {
            let Ok(store) = self.store(loc) else { continue };
            out.extend(
                store
                    .export_names()
                    .into_iter()
                    .filter(|(n, _)| strata_format::split_target(n).0 == disk)
                    .map(|(n, d)| (n, format!("{d}, in {}", loc.dir.display()))),
            );
        }
        out.sort();
        out
    }

    /// Close the other datastores (flushing them).
    pub fn close(&self) {
        for (_, s) in self.guests.lock().drain(..) {
            close(&*s);
        }
    }

    /// `clone --full`: from where the source lives into its datastore or
    /// `to`; a clone made outside home is served from there (placement).
    pub(crate) fn clone_full(
        &self,
        req: &Request,
        control: Option<Arc<WorkControl>>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Response, Error> {
        let Request::CloneFull {
            source,
            name,
            provisioning,
            to,
            rate_bytes_per_sec,
        } = req
        else {
            unreachable!("Places::clone_full is given clone --full requests")
        };
        let disk = strata_format::split_target(source).0;
        self.not_moving(disk)?;
        if self.serves_placed(name) || self.home.exists(name) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("this server serves a disk named '{name}' already"),
            ));
        }
        let from = self.place_of(disk);
        let src = self.store(&from)?;
        let to = match to {
            Some(d) => Location::of(d)?,
            None => from.clone(),
        };
        let r = self.store(&to).and_then(|dst| {
            let other = (to != from).then_some(&*dst);
            let c = strata_engine::FullClone {
                source,
                name,
                provisioning: *provisioning,
                work: SpaceWork {
                    rate_bytes_per_sec: *rate_bytes_per_sec,
                    control,
                },
            };
            crate::cloning::run(&*src, other, &c, progress)
        });
        let r = match r {
            Ok(info) if to.dir != self.home_dir => self
                .update(|f| {
                    f.disks.insert(name.clone(), to.clone());
                })
                .map(|()| info),
            r => r,
        };
        drop(src);
        self.release_unused(&to);
        r.map(Response::Disk)
    }

    /// Refuse a change to `disk` while it is being moved.
    fn not_moving(&self, disk: &str) -> Result<(), Error> {
        if self.moving.lock().contains(disk) {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "disk '{disk}' is being moved: wait for the move to end, or cancel it \
                     ('strata jobs')"
                ),
            ));
        }
        Ok(())
    }

    /// Mark `disk` as moving (refused if it already is).
    pub fn begin_move(&self, disk: &str) -> Result<(), Error> {
        if !self.moving.lock().insert(disk.to_string()) {
            return Err(Error::new(
                ErrorKind::Refused,
                format!("disk '{disk}' is already being moved (see 'strata jobs')"),
            ));
        }
        Ok(())
    }

    pub fn end_move(&self, disk: &str) {
        self.moving.lock().remove(disk);
    }
}

/// The disk a request is about, and whether it only reads it.
fn request_disk(req: &Request) -> Option<(&str, bool)> {
    fn base(n: &str) -> &str {
        strata_format::split_target(n).0
    }
    Some(match req {
        Request::Info { name } => (name.as_str(), true),
        Request::SnapshotList { disk } => (disk.as_str(), true),
        Request::Export { target, .. }
        | Request::Diff { target, .. }
        | Request::ExportDiff { target, .. } => (base(target), true),
        Request::ImportDiff { disk, .. } => (disk.as_str(), false),
        Request::Remove { name, .. }
        | Request::Extend { name, .. }
        | Request::Limit { name, .. }
        | Request::Convert { name, .. }
        | Request::PunchZero { name, .. }
        | Request::Defrag { name, .. }
        | Request::Compact { name, .. }
        | Request::Claim { name, .. }
        | Request::Rename { name, .. }
        | Request::Release { name } => (name.as_str(), false),
        Request::SnapshotCreate { disk, .. }
        | Request::SnapshotRevert { disk, .. }
        | Request::SnapshotRename { disk, .. }
        | Request::SnapshotDelete { disk, .. } => (disk.as_str(), false),
        Request::CloneLinked { source, .. } => (base(source), false),
        _ => return None,
    })
}

impl Places {
    /// Run a request about a disk placed elsewhere in its datastore, or
    /// refuse one that would change a disk being moved; None: the request
    /// is home's (`ops::Mover::route`).
    pub(crate) fn route_request(
        &self,
        req: &Request,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Option<Result<Response, Error>> {
        if let Request::Rename { name, to } = req {
            // The new name is free here and in every datastore served.
            if let Some(e) = self.name_taken(to, name) {
                return Some(Err(e));
            }
        }
        if let Request::Create { name, .. } | Request::Import { name, .. } = req {
            if let Some(loc) = self.file.lock().disks.get(name) {
                return Some(Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "this server serves a disk named '{name}' (from {})",
                        loc.dir.display()
                    ),
                )));
            }
            return None;
        }
        let (disk, reads) = request_disk(req)?;
        if !reads {
            if let Err(e) = self.not_moving(disk) {
                return Some(Err(e));
            }
        }
        let loc = self.file.lock().disks.get(disk).cloned()?;
        let store = match self.store(&loc) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        // Requests are still answered per kind (ops, object_store).
        let r = ops::execute(&Ctx::only(&*store), req, progress);
        // What a request adds or takes away in that datastore, this
        // server serves or stops serving.
        let after = match (req, &r) {
            (Request::Remove { name, .. }, Ok(_)) => self.update(|f| {
                f.disks.remove(name);
            }),
            (Request::CloneLinked { name, .. }, Ok(_)) => self.update(|f| {
                f.disks.insert(name.clone(), loc.clone());
            }),
            (Request::Rename { name, to }, Ok(_)) => self.update(|f| {
                f.disks.remove(name);
                f.disks.insert(to.clone(), loc.clone());
            }),
            _ => Ok(()),
        };
        Some(r.and_then(|r| after.map(|_| r)))
    }

    /// Why disk `from` cannot be renamed `to`: a disk of that name is
    /// placed elsewhere, or `from` is and `to` is at home.
    fn name_taken(&self, to: &str, from: &str) -> Option<Error> {
        if to == from {
            return None;
        }
        // At home, the datastore itself refuses it.
        let placed = self.file.lock().disks.get(to).map(|l| l.dir.clone());
        let at = match placed {
            Some(dir) => dir,
            None if self.file.lock().disks.contains_key(from) && self.home.exists(to) => {
                self.home_dir.clone()
            }
            None => return None,
        };
        Some(Error::new(
            ErrorKind::AlreadyExists,
            format!("a disk named '{to}' already exists (in {})", at.display()),
        ))
    }

    /// Whether export `name` is a disk placed elsewhere (or its snapshot).
    pub(crate) fn serves_placed(&self, name: &str) -> bool {
        self.file
            .lock()
            .disks
            .contains_key(strata_format::split_target(name).0)
    }
}

/// Close a datastore this server opened, saying on stderr what failed.
fn close(s: &dyn AnyDatastore) {
    if let Err(e) = s.close() {
        tracing::warn!(
            "closing {} {} failed: {}",
            s.kind().noun(),
            s.dir().display(),
            e.message
        );
    }
}
