//! An object-store datastore as a [`Datastore`]: the attached directory's
//! [`strata_objstore::ObjectStoreDatastore`] and this process's one
//! handle per disk.
//!
//! A disk of an object store has one writer, and a process's unflushed
//! writes and claim live in its `ObjectDisk` handle; so every user in the
//! process (each client connection, the control socket, a move) must get
//! the same handle. This adapter keeps them, by target (`DISK` or
//! `DISK@SNAP`), until the disk is removed or taken back after a fence.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use strata_block::BlockDevice;
use strata_objstore::layout::Manifest;
use strata_objstore::ObjectDisk;

use crate::alarms::AlarmSettings;
use crate::{
    capability, datastore_view, gauges, AlarmKind, AlarmRule, AlarmState, Background, Capability,
    ChangedRange, CheckReport, CompactOptions, CompactReport, Datastore, DatastoreInfo,
    DatastoreView, DiskInfo, DiskView, Error, ErrorKind, Gauge, GcReport, GroupInfo,
    GroupSnapshotInfo, GroupSnapshotOptions, IoLimits, Kind, OpenOptions, Provisioning,
    PunchZeroReport, ReportedAlarms, Result, Role, SnapshotInfo, SpaceWork, StoreDisk,
};

/// How old the figures of [`Datastore::space_recent`] may be for a
/// metrics scrape.
const SPACE_MAX_AGE: Duration = Duration::from_secs(30);

/// Disks served "incoming" (a hand-over: their first write waits for the
/// writer elsewhere to release them), and how long it waits.
#[derive(Debug, Clone, Default)]
pub struct Incoming {
    pub disks: Vec<String>,
    pub wait: Duration,
}

/// A directory attached to an object store, with this process's handles.
pub struct ObjectStoreDatastore {
    ds: Arc<strata_objstore::ObjectStoreDatastore>,
    dir: PathBuf,
    handles: Mutex<HashMap<String, Arc<ObjectDisk>>>,
    incoming: Mutex<Incoming>,
    /// The last garbage collection this process ran, for metrics.
    last_gc: Mutex<Option<GcReport>>,
    /// Held by a collecting (not dry) gc run of this process: a user's
    /// `strata gc` and the server's background run take turns instead of
    /// the later claim fencing the earlier (FORMAT.md §11.7).
    gc_turn: Mutex<()>,
    /// Disks opened from now on fetch their hot set (a server's).
    hot_prefetch: std::sync::atomic::AtomicBool,
    /// Whether this process is a server, or a command run without one.
    role: Role,
    /// How long a store operation may take (the banner says it).
    store_timeout: Duration,
    /// The last figures of [`Datastore::space`] and when they were
    /// evaluated, for [`Datastore::space_recent`].
    recent_space: Mutex<Option<(Instant, DatastoreInfo)>>,
}

impl ObjectStoreDatastore {
    pub fn new(ds: Arc<strata_objstore::ObjectStoreDatastore>, dir: &Path, role: Role) -> Self {
        ObjectStoreDatastore {
            role,
            ds,
            dir: std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()),
            handles: Mutex::new(HashMap::new()),
            incoming: Mutex::new(Incoming::default()),
            last_gc: Mutex::new(None),
            gc_turn: Mutex::new(()),
            hot_prefetch: Default::default(),
            store_timeout: OpenOptions::default().store_timeout,
            recent_space: Mutex::new(None),
        }
    }

    /// Open the attached directory `dir` (its store is not contacted yet).
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Self> {
        let o = strata_s3::Options {
            op_timeout: opts.store_timeout,
            backend: opts.store_backend.clone(),
            ..Default::default()
        };
        if let Some(bytes) = opts.store_cache {
            strata_objstore::set_cache_bound(dir, bytes)?;
        }
        let behaviour = strata_objstore::OpenOptions {
            prefetch: opts.store_prefetch,
            compact: opts.store_compact,
            compress: opts.store_compress,
        };
        let ds = strata_objstore::ObjectStoreDatastore::open(dir, &o, behaviour)?;
        let mut x = ObjectStoreDatastore::new(Arc::new(ds), dir, opts.role);
        x.store_timeout = opts.store_timeout;
        if let Some(serving) = &opts.serving {
            for name in &serving.incoming.disks {
                x.ds.disk_id(name)?;
            }
            x.set_incoming(serving.incoming.clone());
            x.set_hot_prefetch(serving.hot_prefetch);
        }
        Ok(x)
    }

    pub fn shared(&self) -> &Arc<strata_objstore::ObjectStoreDatastore> {
        &self.ds
    }

    /// Disks opened from now on fetch what their last writer read most
    /// into the cache, in the background (a server's, FORMAT.md §11.5b).
    pub fn set_hot_prefetch(&self, on: bool) {
        self.hot_prefetch
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Serve these disks incoming (see [`Incoming`]); handles opened from
    /// now on get it.
    pub fn set_incoming(&self, incoming: Incoming) {
        *self.incoming.lock() = incoming;
    }

    /// This process's handle of `target`: one per target, shared by every
    /// user. A handle that was fenced stays fenced (this host acknowledges
    /// nothing more for the disk) until [`Self::reopen`].
    pub fn disk(&self, target: &str) -> Result<Arc<ObjectDisk>> {
        let mut handles = self.handles.lock();
        if let Some(d) = handles.get(target) {
            return Ok(d.clone());
        }
        let d = ObjectDisk::open(self.ds.clone(), target, false)?;
        if self.hot_prefetch.load(std::sync::atomic::Ordering::Relaxed) && !target.contains('@') {
            // What the disk's last writer read most, in the background.
            d.prefetch_hot_set();
        }
        let inc = self.incoming.lock();
        if inc.disks.iter().any(|n| n == target) {
            d.set_incoming(Some(inc.wait));
        }
        handles.insert(target.to_string(), d.clone());
        Ok(d)
    }

    /// A new handle of `target` for users from now on (after a fence,
    /// when `claim` takes the disk back).
    pub fn reopen(&self, target: &str) -> Result<Arc<ObjectDisk>> {
        self.forget(target);
        self.disk(target)
    }

    /// Drop the handle of `target` (the disk is being removed).
    pub fn forget(&self, target: &str) {
        self.handles.lock().remove(target);
    }

    /// Collect what no live root reaches (`dry_run`: only say what), and
    /// remember the report for [`Self::last_gc`].
    ///
    /// Collecting runs of this process wait for each other (one that
    /// came second marks again after the first deleted); runs on other
    /// hosts are fenced by their claims.
    pub fn gc(&self, dry_run: bool) -> Result<GcReport> {
        let _turn = (!dry_run).then(|| self.gc_turn.lock());
        let r = self.ds.gc(dry_run)?;
        *self.last_gc.lock() = Some(r.clone());
        Ok(r)
    }

    /// The report of the last [`Self::gc`] of this process.
    pub fn last_gc(&self) -> Option<GcReport> {
        self.last_gc.lock().clone()
    }

    /// The handles open now, by target, for metrics.
    pub fn handles(&self) -> Vec<(String, Arc<ObjectDisk>)> {
        let mut v: Vec<_> = self
            .handles
            .lock()
            .iter()
            .map(|(n, d)| (n.clone(), d.clone()))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }

    /// `strata claim DISK` (`handover`: only once its writer released it,
    /// waiting up to that long): the newest manifest after it. A server
    /// claims for itself, through the handle its clients use; a command
    /// run without one claims for the host (FORMAT.md §11.6, "The host's
    /// claim"), which its end does not undo.
    pub fn claim(&self, name: &str, handover: Option<Duration>) -> Result<Manifest> {
        if self.role == Role::Command {
            return self.ds.claim_for_host(name, handover);
        }
        let mut d = self.disk(name)?;
        if d.ownership().1.is_some() {
            // Fenced here before: taking it back starts afresh.
            d = self.reopen(name)?;
        }
        match handover {
            Some(wait) => d.claim_handover(wait),
            None => d.claim(),
        }?;
        Ok((*d.manifest()).clone())
    }

    /// `strata release DISK`: this process's writes committed, then a
    /// manifest with no owner. A disk no process of this host writes but
    /// that is this host's (its claim, or a process that is gone) is
    /// released without a handle of its own.
    pub fn release(&self, name: &str) -> Result<Manifest> {
        let d = self.disk(name)?;
        let (writer, fenced) = d.ownership();
        if !writer && fenced.is_none() && !d.is_released() {
            let m = self.manifest(name)?;
            let me = self.ds.me_as_owner();
            if m.owner.as_ref().is_some_and(|o| o.host == me.host) {
                return self.ds.release(name);
            }
        }
        d.release()
    }

    /// Commit every disk this process writes; the disks that failed, with
    /// why (a disk handed over to another host is not a failure).
    pub fn flush_all(&self) -> Vec<(String, Error)> {
        let mut failed = Vec::new();
        for (name, d) in self.handles() {
            let (owner, fenced) = d.ownership();
            if fenced.is_some() || !owner {
                continue;
            }
            if let Err(e) = d.commit() {
                failed.push((name, e));
            }
        }
        failed
    }

    fn manifest(&self, disk: &str) -> Result<Manifest> {
        let id = self.ds.disk_id(disk)?;
        let m = self.ds.newest_manifest(id)?;
        if m.removed {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("disk '{disk}' was removed"),
            ));
        }
        Ok(m)
    }

    /// The manifest this process reads `disk` from: its handle's if it has
    /// one (which may hold a newer one than the store lists yet), else the
    /// newest in the store.
    pub(crate) fn current_manifest(&self, disk: &str) -> Result<Manifest> {
        if let Some(d) = self.handles.lock().get(disk) {
            return Ok((*d.manifest()).clone());
        }
        self.manifest(disk)
    }

    /// `disk` as commands answer it, from manifest `m`, with whether this
    /// process's handle of it was fenced.
    pub fn view(&self, disk: &str, m: &Manifest) -> DiskView {
        let fenced = self.handles.lock().get(disk).and_then(|d| d.ownership().1);
        DiskView {
            info: disk_info(disk, m, self.encryption_of(m)),
            object_store: Some(StoreDisk {
                id: format!("{:08x}", m.disk),
                generation: m.generation,
                owner: m.owner.clone(),
                manifest: m.key(),
                written_ms: m.written_ms,
                fenced,
            }),
            clients: Vec::new(),
        }
    }

    /// Space and alarms from the store's summary and its disks' manifests.
    fn space_of(
        &self,
        summary: &strata_api::store::Summary,
        disks: &[(String, Manifest)],
    ) -> Result<DatastoreInfo> {
        let settings = AlarmSettings::load(&self.dir)?;
        let provisioned: u64 = disks.iter().map(|(_, m)| m.size_bytes).sum();
        let used = summary.disk_bytes;
        let cap = settings.capacity_bytes;
        let figures = settings.figures(used, provisioned);
        Ok(DatastoreInfo {
            location: summary.url.to_string(),
            capacity_bytes: cap,
            capacity_follows_fs: false,
            used_bytes: used,
            logical_bytes: None,
            reserved_bytes: 0,
            reserved_held_bytes: 0,
            readied_bytes: 0,
            free_bytes: cap.saturating_sub(used),
            provisioned_bytes: provisioned,
            overcommit_percent: figures.overcommit_percent(),
            used_percent: figures.used_percent(),
            alarms: settings.evaluate(&figures),
            disks: disks.len(),
            snapshots: disks.iter().map(|(_, m)| m.snapshots.len()).sum(),
            metadata_cache_bytes: 0,
            cache_mode: String::new(),
            reclaiming: 0,
            fail_stop: None,
            checkpoints: 0,
            layout: None,
        })
    }
}

/// An object store's disks are thin: other provisioning is refused with
/// the capability table's reason.
fn thin_only(provisioning: Provisioning) -> Result<()> {
    if provisioning != Provisioning::Thin {
        capability::check(Kind::ObjectStore, Capability::Thick)?;
    }
    Ok(())
}

/// The `DISK@SNAP` a linked clone of an object store is made from, split
/// (a plain `DISK` is refused: its head changes under the clone).
pub fn clone_source(source: &str) -> Result<(&str, &str)> {
    match strata_format::split_target(source) {
        (disk, Some(snap)) => Ok((disk, snap)),
        (_, None) => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "a linked clone on an object-store datastore is made from a snapshot \
                 (DISK@SNAP), not '{source}'"
            ),
        )),
    }
}

fn snapshot_name(m: &Manifest, id: Option<u64>) -> Option<String> {
    id.and_then(|id| m.snapshots.iter().find(|s| s.id == id))
        .map(|s| s.name.clone())
}

fn disk_info(name: &str, m: &Manifest, encryption: Option<strata_api::Encryption>) -> DiskInfo {
    DiskInfo {
        name: name.to_string(),
        size_bytes: m.size_bytes,
        provisioning: Provisioning::Thin,
        // What a disk holds in the store is known to a walk of its whole
        // map (a GC mark: `gc --dry-run` shows it), not to its manifest.
        allocated_bytes: None,
        nb: None,
        tbz: None,
        snapshots: m.snapshots.len(),
        current_snapshot: snapshot_name(m, m.current),
        parent: m.parent.as_ref().map(|p| p.name.clone()),
        parent_deleted: false,
        created_unix: None,
        exclusive_bytes: None,
        snapshot_space_bytes: None,
        fragments: None,
        packed_bytes: None,
        limits: m.limits,
        encryption,
    }
}

impl ObjectStoreDatastore {
    /// The snapshots of manifest `m` that count: a member of a group
    /// snapshot only once that group snapshot's object exists (§11.11).
    fn snapshot_infos(&self, m: &Manifest) -> Vec<SnapshotInfo> {
        let mut recs = m.snapshots.clone();
        // Ids grow with time and a parent is older than its children.
        recs.sort_by_key(|s| s.id);
        recs.iter()
            .filter_map(|s| {
                let (shown, group) = self.visible(s);
                shown.then(|| SnapshotInfo {
                    id: s.id,
                    name: s.name.clone(),
                    description: s.description.clone(),
                    created_unix: s.created_ms / 1000,
                    parent: snapshot_name(m, s.parent),
                    size_bytes: s.size_bytes,
                    mapped_bytes: None,
                    exclusive_bytes: None,
                    current: m.current == Some(s.id),
                    group,
                })
            })
            .collect()
    }
}

impl Datastore for ObjectStoreDatastore {
    fn kind(&self) -> Kind {
        Kind::ObjectStore
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn disk_info(&self, disk: &str) -> Result<DiskInfo> {
        let m = self.current_manifest(disk)?;
        Ok(disk_info(disk, &m, self.encryption_of(&m)))
    }

    fn disk_view(&self, disk: &str, _with_space: bool) -> Result<DiskView> {
        Ok(self.view(disk, &self.current_manifest(disk)?))
    }

    fn list(&self) -> Result<Vec<DiskView>> {
        let disks = self.ds.disks()?;
        let open: HashMap<String, Arc<ObjectDisk>> = self.handles.lock().clone();
        Ok(disks
            .iter()
            .map(|(name, m)| match open.get(name) {
                // This process's handle may hold a newer manifest.
                Some(d) => self.view(name, &d.manifest()),
                None => self.view(name, m),
            })
            .collect())
    }

    fn status(&self) -> Result<DatastoreView> {
        let summary = self.ds.summary()?;
        let disks = self.ds.disks()?;
        Ok(datastore_view(
            Kind::ObjectStore,
            self.space_of(&summary, &disks)?,
            Some(summary),
        ))
    }

    fn create(
        &self,
        disk: &str,
        size_bytes: u64,
        provisioning: Provisioning,
        _progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        thin_only(provisioning)?;
        let m = self.ds.create_disk(disk, size_bytes)?;
        Ok(self.view(disk, &m))
    }

    fn create_encrypted(
        &self,
        spec: &crate::EncryptedDisk<'_>,
        _progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        thin_only(spec.provisioning)?;
        let m = self.create_fresh(spec.disk, spec.size_bytes, spec.key)?;
        Ok(self.view(spec.disk, &m))
    }

    fn unlock(&self, disk: &str, secret: &[u8]) -> Result<u32> {
        self.ds.unlock(disk, secret)
    }

    fn carried_keys(&self, disk: &str) -> Result<Option<strata_engine::CarriedKeys>> {
        self.carry(disk)
    }

    fn create_carrying(
        &self,
        spec: &crate::CarriedDisk<'_>,
        _progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        thin_only(spec.provisioning)?;
        let (rec, keys) = (spec.keys.record().clone(), spec.keys.keys().clone());
        let m = self.create_keyed(spec.disk, spec.size_bytes, rec, keys)?;
        Ok(self.view(spec.disk, &m))
    }

    fn keyring_disks(&self, disk: &str) -> Result<Vec<String>> {
        self.keyring_members(disk)
    }

    fn lock(&self, disk: &str) -> Result<(Vec<String>, bool)> {
        self.lock_keys(disk)
    }

    fn key_add(&self, disk: &str, new: &strata_api::KeyGrant) -> Result<u32> {
        let slot = crate::new_slot(new);
        self.disk(disk)?
            .change_keyring(|k, keys| k.add_slot(keys, &slot))
    }

    fn key_remove(&self, disk: &str, slot: u32) -> Result<()> {
        self.disk(disk)?.change_keyring(|k, _| k.remove_slot(slot))
    }

    fn rekey(&self, disk: &str, new: &strata_api::KeyGrant) -> Result<()> {
        let slot = crate::new_slot(new);
        self.disk(disk)?
            .change_keyring(|k, keys| k.rekey_shallow(keys, &slot))
    }

    fn clone_own_key(
        &self,
        source: &str,
        name: &str,
        key: &strata_api::KeyGrant,
    ) -> Result<DiskView> {
        let (disk, snap) = clone_source(source)?;
        let m = self.clone_own_keyed(disk, snap, name, key)?;
        Ok(self.view(name, &m))
    }

    fn rekey_deep(
        &self,
        disk: &str,
        new: Option<&strata_api::KeyGrant>,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<strata_engine::DeepRekeyReport> {
        self.deep_rekey(disk, new, work, progress)
    }

    fn remove(&self, disk: &str) -> Result<()> {
        self.outside_groups(disk)?;
        let prefix = format!("{disk}@");
        self.handles
            .lock()
            .retain(|n, _| n != disk && !n.starts_with(&prefix));
        self.ds.remove_disk(disk)
    }

    /// The shared handle of `target`; the head of a disk whose handle was
    /// fenced is refused with the fence's reason (naming the disk and who
    /// claimed it) until `claim` takes it back: a client that opens it
    /// learns why at once, not at its first read. Its snapshots open.
    fn open(&self, target: &str) -> Result<Arc<dyn BlockDevice>> {
        let d = self.disk(target)?;
        // An encrypted disk whose keys this process lacks serves nothing.
        d.check_unlocked()?;
        if strata_format::split_target(target).1.is_none() {
            if let Some(why) = d.ownership().1 {
                return Err(Error::new(ErrorKind::Fenced, why));
            }
        }
        Ok(d as Arc<dyn BlockDevice>)
    }

    fn snapshots(&self, disk: &str) -> Result<Vec<SnapshotInfo>> {
        Ok(self.snapshot_infos(&self.current_manifest(disk)?))
    }

    fn snapshot_create(
        &self,
        disk: &str,
        snapshot: &str,
        description: &str,
    ) -> Result<SnapshotInfo> {
        let d = self.disk(disk)?;
        let rec = d.snapshot_create(snapshot, description)?;
        let m = d.manifest();
        self.snapshot_infos(&m)
            .into_iter()
            .find(|s| s.name == rec.name)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Io,
                    format!("snapshot {disk}@{snapshot} is not in the manifest just written"),
                )
            })
    }

    fn snapshot_delete(&self, disk: &str, snapshot: &str) -> Result<()> {
        if let Some(g) = self
            .snapshots(disk)?
            .into_iter()
            .find(|s| s.name == snapshot)
            .and_then(|s| s.group)
        {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "snapshot '{disk}@{snapshot}' is a member of group snapshot \
                     '{g}@{snapshot}': delete the group snapshot ('strata group snapshot \
                     delete {g} {snapshot}')"
                ),
            ));
        }
        self.disk(disk)?.snapshot_delete(snapshot)?;
        self.forget(&format!("{disk}@{snapshot}"));
        Ok(())
    }

    fn snapshot_revert(&self, disk: &str, snapshot: &str) -> Result<()> {
        self.disk(disk)?.snapshot_revert(snapshot)
    }

    fn extend(&self, disk: &str, size_bytes: u64) -> Result<DiskView> {
        // Through this process's handle, which its clients are reading.
        let m = self.disk(disk)?.extend(size_bytes)?;
        Ok(self.view(disk, &m))
    }

    fn set_limits(&self, disk: &str, limits: IoLimits) -> Result<DiskView> {
        let m = self.disk(disk)?.set_limits(limits)?;
        Ok(self.view(disk, &m))
    }

    fn punch_zero(
        &self,
        disk: &str,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<PunchZeroReport> {
        // A commit never stores a grain of zeros, so only writes not yet
        // committed can hold any; the scan reads what the map stores.
        if disk.contains('@') {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("'{disk}' is a snapshot: punchzero works on a disk"),
            ));
        }
        let dev = self.disk(disk)?;
        crate::punch::punch_zero(disk, &*dev, work, progress)
    }

    fn space(&self) -> Result<DatastoreInfo> {
        let summary = self.ds.summary()?;
        let disks = self.ds.disks()?;
        let i = self.space_of(&summary, &disks)?;
        *self.recent_space.lock() = Some((Instant::now(), i.clone()));
        Ok(i)
    }

    fn space_recent(&self, max_age: Duration) -> Result<DatastoreInfo> {
        if let Some((at, i)) = &*self.recent_space.lock() {
            if at.elapsed() <= max_age {
                return Ok(i.clone());
            }
        }
        self.space()
    }

    fn check(&self) -> Result<CheckReport> {
        self.ds.check().map(CheckReport::ObjectStore)
    }

    fn claim_disk(&self, disk: &str, handover: Option<Duration>) -> Result<DiskView> {
        let m = self.claim(disk, handover)?;
        Ok(self.view(disk, &m))
    }

    fn release_disk(&self, disk: &str) -> Result<DiskView> {
        let m = self.release(disk)?;
        Ok(self.view(disk, &m))
    }

    fn collect_garbage(&self, dry_run: bool) -> Result<GcReport> {
        self.gc(dry_run)
    }

    fn compact_disk(&self, disk: &str, opts: CompactOptions) -> Result<CompactReport> {
        self.disk(disk)?.compact(opts)
    }

    fn gauges(&self) -> Vec<Gauge> {
        // A scrape pays for a LIST and a GET per disk at most once per
        // SPACE_MAX_AGE; a store that does not answer leaves the space
        // gauges out, not the rest.
        let mut g = match self.space_recent(SPACE_MAX_AGE) {
            Ok(i) => gauges::space(&i),
            Err(_) => Vec::new(),
        };
        g.extend(gauges::object_store(self));
        g
    }

    fn start_background(
        self: Arc<Self>,
        background: &Background,
        stop: &Arc<AtomicBool>,
    ) -> Vec<JoinHandle<()>> {
        background
            .gc_interval
            .map(|interval| crate::background::spawn_gc(self, stop.clone(), interval))
            .into_iter()
            .collect()
    }

    fn describe(&self) -> String {
        let c = self.ds.config();
        format!(
            "object-store datastore {} as host {} ({})",
            c.url, c.me.name, c.me.host
        )
    }

    fn serving_notes(&self) -> Vec<String> {
        vec![format!(
            "a disk is claimed by its first write; FLUSH waits up to {} s for the store",
            self.store_timeout.as_secs()
        )]
    }

    fn set_capacity(&self, bytes: u64) -> Result<DatastoreInfo> {
        AlarmSettings::update(&self.dir, |s| {
            s.capacity_bytes = bytes;
            Ok(true)
        })?;
        self.space()
    }

    fn alarm_rules(&self) -> Result<Vec<AlarmRule>> {
        Ok(AlarmSettings::load(&self.dir)?.rules())
    }

    fn set_alarm(&self, rule: AlarmRule) -> Result<AlarmRule> {
        AlarmSettings::update(&self.dir, |s| s.set(rule.clone()).map(|()| true))?;
        Ok(rule)
    }

    fn alarms_reported(&self) -> Result<ReportedAlarms> {
        Ok(AlarmSettings::load(&self.dir)?.alarms_reported)
    }

    fn set_alarm_reported(&self, kind: AlarmKind, state: AlarmState) -> Result<()> {
        AlarmSettings::update(&self.dir, |s| Ok(s.alarms_reported.set(kind, state)))
    }

    fn clone_linked(&self, source: &str, name: &str) -> Result<DiskView> {
        let (disk, snap) = clone_source(source)?;
        let m = self.ds.clone_linked(disk, snap, name)?;
        self.hold_for_clone(name, &m)?;
        Ok(self.view(name, &m))
    }

    fn changed_ranges(&self, from: Option<&str>, to: &str) -> Result<Vec<ChangedRange>> {
        // A walk of the two maps that skips the subtrees they share
        // (docs/BACKUP.md), through this process's handles (whose
        // acknowledged writes count).
        let base = from.map(|f| self.disk(f)).transpose()?;
        let target = self.disk(to)?;
        let grains = target.changes_since(base.as_deref())?;
        let g = strata_objstore::layout::GRAIN as u64;
        let mut out: Vec<ChangedRange> = Vec::new();
        for (grain, mapped) in grains {
            let offset = grain * g;
            match out.last_mut() {
                Some(r) if r.offset + r.len == offset && r.mapped == mapped => r.len += g,
                _ => out.push(ChangedRange {
                    offset,
                    len: g,
                    mapped,
                }),
            }
        }
        if let Some(last) = out.last_mut() {
            last.len = last.len.min(target.size_bytes() - last.offset);
        }
        Ok(out)
    }

    fn group_create(
        &self,
        name: &str,
        disks: &[String],
        quiesce_hook: Option<String>,
        quiesce_timeout_s: Option<u64>,
    ) -> Result<GroupInfo> {
        self.og_create(name, disks, quiesce_hook, quiesce_timeout_s)
    }

    fn group_delete(&self, name: &str) -> Result<()> {
        self.og_delete(name)
    }

    fn group_member(&self, name: &str, disk: &str, add: bool) -> Result<GroupInfo> {
        self.og_member(name, disk, add)
    }

    fn groups(&self) -> Result<Vec<GroupInfo>> {
        self.og_groups()
    }

    fn group_info(&self, name: &str) -> Result<GroupInfo> {
        self.og_info(name)
    }

    fn group_snapshot_create(
        &self,
        group: &str,
        snapshot: &str,
        opts: &GroupSnapshotOptions,
    ) -> Result<GroupSnapshotInfo> {
        self.og_snapshot_create(group, snapshot, opts)
    }

    fn group_snapshots(&self, group: &str) -> Result<Vec<GroupSnapshotInfo>> {
        self.og_snapshots(group)
    }

    fn group_snapshot_delete(&self, group: &str, snapshot: &str) -> Result<()> {
        self.og_snapshot_delete(group, snapshot)
    }

    fn group_snapshot_revert(&self, group: &str, snapshot: &str) -> Result<()> {
        self.og_snapshot_revert(group, snapshot)
    }

    fn group_clone(
        &self,
        source: &str,
        name: &str,
        renames: &[(String, String)],
    ) -> Result<GroupInfo> {
        self.og_clone(source, name, renames)
    }

    fn export_names(&self) -> Vec<(String, String)> {
        let disks = match self.ds.disks() {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("listing the store's disks failed: {e}");
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for (name, m) in disks {
            let owner = match &m.owner {
                Some(o) => format!("owner {} generation {}", o.name, m.generation),
                None => "no owner".into(),
            };
            out.push((name.clone(), format!("object-store disk ({owner})")));
            for s in &m.snapshots {
                out.push((
                    format!("{name}@{}", s.name),
                    format!("snapshot of {name} (read-only)"),
                ));
            }
        }
        out.sort();
        out
    }

    fn close(&self) -> Result<()> {
        let mut failed = self.flush_all();
        for (name, d) in self.handles() {
            // The next host to serve these disks starts from what was read
            // here (FORMAT.md §11.5b).
            if let Err(e) = d.record_hot_set() {
                tracing::warn!("recording the hot set of '{name}': {e}");
            }
            // A server's clean stop lets go of the disks it writes, so
            // another host's first write takes them without a 'strata
            // claim' (a first write never fences a writer on another host,
            // FORMAT.md §11.6). A command gives back what it took over:
            // to its host if it took it from its host, else to nobody.
            let (writer, fenced) = d.ownership();
            if writer && fenced.is_none() && !name.contains('@') {
                let r = match self.role {
                    Role::Server => d.release(),
                    Role::Command => d.give_back(),
                };
                if let Err(e) = r {
                    failed.push((name, e));
                }
            }
        }
        self.ds.drain_cache();
        match failed.first() {
            None => Ok(()),
            Some((name, e)) => Err(Error::new(
                e.kind,
                format!(
                    "{} of the object-store disks could not be committed; {name}: {}",
                    failed.len(),
                    e.message
                ),
            )),
        }
    }
}
