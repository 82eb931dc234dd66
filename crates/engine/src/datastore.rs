//! The datastore: init, open (recovery, upgrade from format version 1), and
//! the catalog operations (disks, snapshots, clones). The commit machinery
//! is in `store`, the I/O path in `disk`.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use strata_format::{
    catalog_file, journal_file, Superblock, BLOCK_BYTES, BLOCK_GRAINS, FILE_POOL, FILE_REFCOUNT,
    FILE_SUPER, FORMAT_VERSION_V1, GRAIN_BYTES, SUPER_SLOT_BYTES,
};
use strata_storage::Backend;

use crate::alarm::{self, AlarmKind, AlarmRule, AlarmStatus, SpaceFigures};
use crate::catalog::{
    check_name, split_target, Catalog, DiskRec, Provisioning, SnapshotRec, HIDDEN_SNAPSHOT_PREFIX,
};
use crate::check::{self, CheckReport};
use crate::disk::DiskHandle;
use crate::error::{err, Error, ErrorKind, Result};
use crate::journal::LogFiles;
use crate::layout::{
    DefragReport, FreeSpaceReport, PoolLayout, FREE_EXTENT_CLASSES, FREE_STEP_BLOCKS,
};
use crate::meta::{FreeExtents, Meta, ZoneGrain};
use crate::store::{now_unix, CheckpointState, CommitState, Kick, SpaceRequest, Store, StoreParts};
use crate::throttle::IoLimits;
use crate::work::{Pacer, WorkControl};

#[path = "groups.rs"]
mod groups;
pub use groups::{
    check_group_size, clone_name, clone_plan, group_full, last_disk, membership_changed, GroupInfo,
    GroupMemberInfo, GroupSnapshotInfo, GroupSnapshotOptions,
};

pub use crate::store::{
    FailStop, LOG_BUFFER_BYTES_MAX, LOG_BYTES_MAX, PUNCH_MIN_GRAINS, RECLAIM_STEP_GRAINS,
};

/// Default metadata cache budget.
pub const CACHE_BYTES_DEFAULT: u64 = 128 << 20;

#[derive(Debug, Clone, Default)]
pub struct InitOptions {
    /// Capacity limit in bytes; 0 = the file system's.
    pub capacity_bytes: u64,
}

#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Budget of the engine's metadata page cache.
    pub cache_bytes: u64,
    /// Read and write the pool around the host page cache
    /// ([`Backend::open_direct`]; `serve --cache none`): grains and map
    /// pages are cached once, by the engine and the guest, never twice.
    /// The refcount file and the logs keep the page cache (they are read
    /// at open and written in bulk at checkpoints).
    pub direct_io: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            cache_bytes: CACHE_BYTES_DEFAULT,
            direct_io: false,
        }
    }
}

/// What `info` reports about a disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskInfo {
    pub name: String,
    pub size_bytes: u64,
    pub provisioning: Provisioning,
    /// Bytes the disk's head maps. This and `nb`, `tbz` and
    /// `created_unix` are None where a datastore's kind does not know them
    /// without reading the disk's whole map (an object store's disks:
    /// docs/MULTIHOST.md); the engine always fills them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// 1 MiB blocks allocated (thick disks: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nb: Option<u64>,
    /// Blocks allocated but still to be zeroed (zeroedthick).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tbz: Option<u64>,
    pub snapshots: usize,
    pub current_snapshot: Option<String>,
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_unix: Option<u64>,
    /// What removing the disk would free once reclaiming ends: grains that
    /// only its head and its snapshots reference (linked clones keep what
    /// they share). Computed by `disk_info`, not by `list_disks` (its cost
    /// follows the disk's exclusive data; docs/FORMAT.md §7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
    /// What deleting all the disk's snapshots (keeping its head) would free.
    /// Not the sum of the snapshots' `exclusive_bytes`: grains two
    /// snapshots share are exclusive to neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_space_bytes: Option<u64>,
    /// The head's fragments (docs/FORMAT.md §10.1): 1 plus the number of
    /// times a mapped grain is not stored right after the one before it.
    /// Computed by `disk_info_with_space`, not by `list_disks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<u64>,
    /// I/O limits (`strata limit`), absent when there are none.
    #[serde(default, skip_serializing_if = "IoLimits::is_none")]
    pub limits: IoLimits,
}

/// How background space work (convert, punchzero) runs.
#[derive(Clone, Default)]
pub struct SpaceWork {
    /// Bytes per second to scan or fill at most (None: as fast as clients
    /// leave room for).
    pub rate_bytes_per_sec: Option<u64>,
    /// Pause / resume / cancel from outside (a server's job list).
    pub control: Option<Arc<WorkControl>>,
}

/// What `punchzero` did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PunchZeroReport {
    pub disk: String,
    pub scanned_bytes: u64,
    pub released_bytes: u64,
    /// The disk's allocated bytes afterwards.
    pub allocated_bytes: u64,
}

/// A byte range where two versions differ (see `Datastore::changed_ranges`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct ChangedRange {
    pub offset: u64,
    pub len: u64,
    /// The newer version maps data here (false: it reads zeros).
    pub mapped: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Never given to another snapshot of the disk, even once this one is
    /// deleted and its name reused (docs/BACKUP.md).
    #[serde(default)]
    pub id: u64,
    pub name: String,
    pub description: String,
    pub created_unix: u64,
    pub parent: Option<String>,
    pub size_bytes: u64,
    /// Bytes mapped in the snapshot (shared or not). This and
    /// `exclusive_bytes` are None where a datastore's kind does not know
    /// them without reading whole maps (an object store's snapshots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapped_bytes: Option<u64>,
    /// What deleting this snapshot alone would free once reclaiming ends:
    /// data grains and map nodes only it references (docs/FORMAT.md §7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
    /// Whether the disk's live state descends directly from this snapshot.
    pub current: bool,
    /// The group whose group snapshot this is one member of (deleted with
    /// it, not alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DatastoreInfo {
    pub location: String,
    pub capacity_bytes: u64,
    /// The capacity follows the file system (its free space plus what the
    /// datastore holds) rather than a configured size (`strata grow`).
    #[serde(default)]
    pub capacity_follows_fs: bool,
    pub used_bytes: u64,
    pub reserved_bytes: u64,
    /// Bytes held on the host file system for reservations: the pool
    /// file's reserved tail (FORMAT.md §7.1).
    #[serde(default)]
    pub reserved_held_bytes: u64,
    /// Bytes held on the host past the pool's end beyond the reservations,
    /// readied for first writes (FORMAT.md §7.1, "Readied space").
    #[serde(default)]
    pub readied_bytes: u64,
    pub free_bytes: u64,
    pub provisioned_bytes: u64,
    /// Provisioned bytes over capacity, in percent.
    pub overcommit_percent: u64,
    /// Used plus reserved bytes over capacity, in percent.
    #[serde(default)]
    pub used_percent: u64,
    /// Every alarm (usage, overcommit) as evaluated now.
    #[serde(default)]
    pub alarms: Vec<AlarmStatus>,
    pub disks: usize,
    pub snapshots: usize,
    pub metadata_cache_bytes: u64,
    /// How the pool uses the host page cache: "writeback" or "none"
    /// (direct I/O; `serve --cache none`).
    #[serde(default)]
    pub cache_mode: String,
    /// Deleted snapshots and disks whose space is still being given back.
    pub reclaiming: usize,
    /// Set when the datastore stopped accepting writes after an error
    /// (reads go on); reopening it recovers from its log.
    pub fail_stop: Option<FailStop>,
    /// Checkpoints completed since the datastore was opened.
    pub checkpoints: u64,
    /// How the pool's space lies (free extents, what the pool file holds
    /// on the host): computed by `info_with_layout`, not by `info`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<PoolLayout>,
}

/// A datastore opened for reading and writing. Cheap to clone.
#[derive(Clone)]
pub struct Datastore {
    pub(crate) inner: Arc<Store>,
}

/// Record snapshot `id` of `d`'s live state: a new version sharing the
/// head's map (O(1)), and its catalog entry under `parent` in the tree.
#[expect(clippy::too_many_arguments)]
fn add_snapshot(
    m: &mut Meta,
    d: &DiskRec,
    id: u64,
    name: String,
    description: &str,
    parent: Option<u64>,
) -> Result<()> {
    let version = m.catalog.alloc_id();
    m.new_version_from(version, d.head)?;
    m.catalog.snapshots.push(SnapshotRec {
        id,
        disk: d.id,
        name,
        description: description.to_string(),
        created_unix: now_unix(),
        parent,
        version,
        size_bytes: d.size_bytes,
    });
    Ok(())
}

/// Delete snapshot `id` within a change: drop its version, hand its
/// children to its parent.
fn delete_snapshot_locked(m: &mut Meta, id: u64) -> Result<()> {
    let s = m
        .catalog
        .snapshots
        .iter()
        .find(|s| s.id == id)
        .cloned()
        .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no snapshot with id {id}")))?;
    m.drop_version(s.version)?;
    for c in m
        .catalog
        .snapshots
        .iter_mut()
        .filter(|c| c.parent == Some(s.id))
    {
        c.parent = s.parent;
    }
    m.catalog.snapshots.retain(|x| x.id != s.id);
    if let Some(dm) = m.catalog.disks.iter_mut().find(|d| d.id == s.disk) {
        if dm.current_snapshot == Some(s.id) {
            dm.current_snapshot = s.parent;
        }
    }
    m.mark_catalog_dirty();
    Ok(())
}

/// A linked clone of snapshot `s` named `new` within a change (its name
/// checked free by the caller); `parent` is what it shows as its origin.
/// Returns the new disk's id.
fn clone_locked(m: &mut Meta, s: &SnapshotRec, new: &str, parent: &str) -> Result<u64> {
    let id = m.catalog.alloc_id();
    let head = m.catalog.alloc_id();
    m.new_version_from(head, s.version)?;
    m.catalog.disks.push(DiskRec {
        id,
        name: new.to_string(),
        size_bytes: s.size_bytes,
        provisioning: Provisioning::Thin,
        head,
        current_snapshot: None,
        created_unix: now_unix(),
        parent: Some(parent.to_string()),
        limits: Default::default(),
    });
    m.mark_catalog_dirty();
    Ok(id)
}

/// Read the catalog a superblock names, checking its checksum.
pub(crate) fn read_catalog(backend: &dyn Backend, sb: &Superblock) -> Result<Catalog> {
    if sb.catalog_bytes > 1 << 30 {
        return err(
            ErrorKind::Corrupt,
            "catalog length in the superblock is absurd",
        );
    }
    let name = catalog_file(sb.generation);
    let cat_file = backend.open(name, false)?;
    // Nothing is allocated from the superblock's word alone.
    let on_disk = cat_file
        .len()
        .map_err(|e| Error::new(ErrorKind::Io, format!("{name}: {e}")))?;
    if sb.catalog_bytes > on_disk {
        return err(
            ErrorKind::Corrupt,
            format!(
                "{name} of generation {} holds {on_disk} bytes; the superblock says {}",
                sb.generation, sb.catalog_bytes
            ),
        );
    }
    let mut cat = vec![0u8; sb.catalog_bytes as usize];
    cat_file.read_at(&mut cat, 0)?;
    let crc = crc32c::crc32c(&cat);
    if crc != sb.catalog_checksum {
        return err(
            ErrorKind::Corrupt,
            format!(
                "{name} of generation {} fails its checksum (stored {:#010x}, computed {crc:#010x})",
                sb.generation, sb.catalog_checksum
            ),
        );
    }
    Catalog::decode(&cat)
}

impl Datastore {
    /// Create a new, empty datastore in `backend`.
    pub fn init(backend: Arc<dyn Backend>, opts: &InitOptions) -> Result<()> {
        if backend.exists(FILE_SUPER) {
            return err(
                ErrorKind::AlreadyExists,
                format!("{} already holds a datastore", backend.describe()),
            );
        }
        let catalog = Catalog::new().encode();
        let mut uuid = [0u8; 16];
        rand::Rng::fill(&mut rand::thread_rng(), &mut uuid);
        let sb = Superblock {
            version: strata_format::FORMAT_VERSION,
            generation: 1,
            capacity_bytes: opts.capacity_bytes,
            pool_grains: 0,
            catalog_bytes: catalog.len() as u64,
            catalog_checksum: crc32c::crc32c(&catalog),
            uuid,
            created_unix_secs: now_unix(),
            ro_compat: 0,
            compat: 0,
        };
        for f in [FILE_POOL, FILE_REFCOUNT, journal_file(0), journal_file(1)] {
            backend.open(f, true)?.sync()?;
        }
        let c = backend.open(catalog_file(1), true)?;
        c.write_at(&catalog, 0)?;
        c.sync()?;
        // The superblock last: a datastore exists once it is durable.
        let s = backend.open(FILE_SUPER, true)?;
        s.write_at(&sb.encode(), SUPER_SLOT_BYTES as u64)?;
        s.sync()?;
        Ok(())
    }

    /// Open a datastore, recovering from its log (docs/FORMAT.md §5,
    /// "Recovery"), and upgrading a version-1 datastore first (§8). `lock`
    /// is held for the lifetime of the datastore (the caller took it).
    #[expect(clippy::too_many_lines)]
    pub fn open(backend: Arc<dyn Backend>, opts: &OpenOptions, lock: Option<File>) -> Result<Self> {
        if !backend.exists(FILE_SUPER) {
            return err(
                ErrorKind::NotFound,
                format!(
                    "no datastore in {} (run 'strata init' first)",
                    backend.describe()
                ),
            );
        }
        let where_ = backend.describe();
        let super_file = backend.open(FILE_SUPER, false)?;
        let mut slots = vec![0u8; 2 * SUPER_SLOT_BYTES];
        super_file.read_at(&mut slots, 0)?;
        let pick = Superblock::pick_slots(&slots[..SUPER_SLOT_BYTES], &slots[SUPER_SLOT_BYTES..])
            .map_err(|e| {
            Error::new(ErrorKind::Corrupt, format!("{where_}: {FILE_SUPER}: {e}"))
        })?;
        let sb = pick.current;
        if sb.version == FORMAT_VERSION_V1 {
            let catalog = read_catalog(backend.as_ref(), &sb)?;
            crate::upgrade::upgrade_v1(backend.as_ref(), &sb, catalog)?;
            return Self::open(backend, opts, lock);
        }
        // A crash between steps 5 and 6 of an upgrade.
        crate::upgrade::finish(backend.as_ref())?;
        let mut open_warnings = Vec::new();
        // Which slots hold a superblock (a checkpoint must not overwrite
        // the only one, FORMAT.md §2); a never-written slot does not.
        let slot_valid = pick.valid;
        if let Some((slot, e)) = &pick.damaged {
            let w = format!(
                "{FILE_SUPER} slot {slot} (byte {}) is damaged: {e}; opened from slot {} \
                 (generation {})",
                slot * SUPER_SLOT_BYTES,
                sb.generation % 2,
                sb.generation
            );
            tracing::error!("{where_}: {w}");
            open_warnings.push(w);
        }
        let catalog = read_catalog(backend.as_ref(), &sb)?;
        let pool = if opts.direct_io {
            backend.open_direct(FILE_POOL, false)?
        } else {
            backend.open(FILE_POOL, false)?
        };
        let refs = backend.open(FILE_REFCOUNT, false)?;
        let mut meta = Meta::new(
            pool.clone(),
            refs.clone(),
            opts.cache_bytes,
            catalog,
            sb.pool_grains,
        );
        let journal_files = [
            backend.open(journal_file(0), true)?,
            backend.open(journal_file(1), true)?,
        ];
        let logs = LogFiles::new(journal_files);
        // The log of the superblock's generation, then the next ones while
        // each log ends by naming the next (a checkpoint that did not finish
        // writing its superblock, or a damaged newer slot).
        let mut gen = sb.generation;
        let mut replayed = 0;
        let mut log = logs.read_generation(gen)?;
        loop {
            replayed += log.batches.len();
            for recs in std::mem::take(&mut log.batches) {
                for r in recs {
                    meta.replay(r)?;
                }
            }
            let Some(next) = log.ended_for else { break };
            if next <= gen || next % 2 == gen % 2 {
                break;
            }
            let following = logs.read_generation(next)?;
            if following.batches.is_empty() {
                break;
            }
            gen = next;
            log = following;
        }
        let writer = logs.resume(gen, &log);
        for (file, first) in logs.first_generations()?.into_iter().enumerate() {
            if let Some(g) = first {
                if g > gen {
                    return err(
                        ErrorKind::Corrupt,
                        format!(
                            "{where_}: {} begins with a valid log of generation {g}, newer than \
                             what the superblock leads to ({gen}): a newer superblock was lost; \
                             refusing to open without it",
                            journal_file(file as u64)
                        ),
                    );
                }
            }
        }
        meta.finish_open()
            .map_err(|e| Error::new(e.kind, format!("{where_}: {}", e.message)))?;
        // The reserved tail as the pool file's length finds it (§7.1).
        meta.set_tail_end(pool.len()? / GRAIN_BYTES);
        let inner = Arc::new(Store::new(StoreParts {
            direct_io: opts.direct_io,
            backend,
            pool,
            refs,
            super_file,
            meta,
            commit: CommitState {
                log: writer,
                synced_mutations: 0,
            },
            checkpoint: CheckpointState {
                logs,
                sb,
                slot_valid,
                images: Vec::new(),
            },
            open_warnings,
            lock,
        }));
        if replayed > 0 {
            tracing::info!("replayed {replayed} log batches");
        }
        let ds = Datastore { inner };
        {
            let mut m = ds.inner.meta.lock();
            if let Err(e) = ds.inner.hold_reservation(&mut m, 0, 0) {
                tracing::warn!("{where_}: reservations are not all held on the host: {e}");
            }
        }
        ds.drop_held()?;
        // Make the recovered state a checkpoint, so the log starts empty.
        ds.inner.commit(true)?;
        Ok(ds)
    }

    /// Finish reclaiming, flush everything and checkpoint (clean shutdown).
    pub fn close(&self) -> Result<()> {
        self.stop_reclaimer();
        while self.reclaim(RECLAIM_STEP_GRAINS)? {
            self.inner.commit(false)?;
        }
        self.inner.commit(true)
    }

    /// Give back up to about `budget` grains of deleted snapshots and disks
    /// (see `Meta::reclaim`). Returns whether work remains. Freed grains
    /// become allocatable at the next commit.
    pub fn reclaim(&self, budget: u64) -> Result<bool> {
        self.inner.reclaim(budget)
    }

    /// Reclaim in the background, a bounded step at a time, so deleting a
    /// snapshot returns at once and I/O never waits long behind the freeing.
    pub fn start_reclaimer(&self) {
        let mut slot = self.inner.reclaimer.lock();
        if slot.is_some() {
            return;
        }
        self.inner.reclaim_stop.store(false, Ordering::Release);
        let ds = self.clone();
        *slot = Some(
            std::thread::Builder::new()
                .name("reclaim".into())
                .spawn(move || {
                    let mut pace = ReclaimPace::default();
                    let mut clients = ds.inner.client_watch();
                    while !ds.inner.reclaim_stop.load(Ordering::Acquire) {
                        let busy = clients.busy();
                        let t0 = std::time::Instant::now();
                        let budget = pace.budget(busy);
                        let worked = ds.inner.meta.lock().orphans() > 0;
                        match ds.reclaim(budget) {
                            Ok(more) => {
                                if pace.done(budget, worked, more) {
                                    let _ = ds.inner.commit(false);
                                }
                                if more {
                                    pace.rest(busy, t0.elapsed());
                                } else {
                                    std::thread::sleep(std::time::Duration::from_millis(50));
                                }
                            }
                            Err(e) => {
                                tracing::error!("reclaiming stopped: {e}");
                                break;
                            }
                        }
                    }
                })
                .expect("spawn reclaimer"),
        );
    }

    /// Commit and checkpoint in the background when the log buffer or the
    /// dirty metadata passes its bound, so a client write does not wait for
    /// a data sync nobody asked for (a server calls this; without it, the
    /// writer that crosses the bound commits). Writers still wait past
    /// twice the bounds. The thread ends when the datastore is dropped.
    pub fn start_background_commits(&self) {
        self.start_kicked(&self.inner.background, "commit", 200, |store| {
            if let Err(e) = store.commit(false) {
                tracing::error!("background commit: {e}");
            }
        });
    }

    /// Start (once) the thread `name` that runs `step` each time `kick`
    /// wakes it (looking every `poll_ms` whether the datastore is still
    /// there), while the datastore takes writes. It ends when the
    /// datastore is dropped.
    fn start_kicked(&self, kick: &Arc<Kick>, name: &str, poll_ms: u64, step: fn(&Store)) {
        if kick.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let kick = kick.clone();
        let store = Arc::downgrade(&self.inner);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || loop {
                let kicked = kick.wait(std::time::Duration::from_millis(poll_ms));
                let Some(store) = store.upgrade() else { break };
                if kicked && store.check_writable().is_ok() {
                    step(&store);
                }
            })
            .unwrap_or_else(|e| panic!("spawn the {name} thread: {e}"));
    }

    fn stop_reclaimer(&self) {
        self.inner.reclaim_stop.store(true, Ordering::Release);
        if let Some(h) = self.inner.reclaimer.lock().take() {
            let _ = h.join();
        }
    }

    /// Make every write so far durable.
    pub fn flush(&self) -> Result<()> {
        self.inner.commit(false)
    }

    pub fn info(&self) -> DatastoreInfo {
        let m = self.inner.meta.lock();
        let capacity = self.inner.capacity_grains(&m) * GRAIN_BYTES;
        let used = m.used_grains() * GRAIN_BYTES;
        let reserved = m.reserved_grains() * GRAIN_BYTES;
        let provisioned: u64 = m.catalog.disks.iter().map(|d| d.size_bytes).sum();
        let readied = m.readied_grains();
        let figures = SpaceFigures {
            capacity_bytes: capacity,
            used_bytes: used,
            reserved_bytes: reserved,
            provisioned_bytes: provisioned,
        };
        DatastoreInfo {
            location: self.inner.backend.describe(),
            capacity_bytes: capacity,
            capacity_follows_fs: self.inner.configured_capacity_bytes() == 0,
            used_bytes: used,
            reserved_bytes: reserved,
            reserved_held_bytes: (m.tail_end() - m.hwm() - readied) * GRAIN_BYTES,
            readied_bytes: readied * GRAIN_BYTES,
            free_bytes: capacity.saturating_sub(used + reserved),
            provisioned_bytes: provisioned,
            overcommit_percent: figures.overcommit_percent(),
            used_percent: figures.used_percent(),
            alarms: alarm::evaluate(&figures, &alarm::effective_rules(&m.catalog.alarms)),
            disks: m.catalog.disks.len(),
            snapshots: m
                .catalog
                .snapshots
                .iter()
                .filter(|s| !s.is_hidden())
                .count(),
            metadata_cache_bytes: m.cache_bytes(),
            cache_mode: if self.inner.direct_io {
                "none"
            } else {
                "writeback"
            }
            .into(),
            reclaiming: m.orphans(),
            fail_stop: self.inner.failed(),
            checkpoints: self.inner.checkpoints.load(Ordering::Relaxed),
            layout: None,
        }
    }

    /// [`Self::info`] with the pool's layout (`status`; docs/FORMAT.md
    /// §10.1), which scans the pool in bounded steps.
    pub fn info_with_layout(&self) -> Result<DatastoreInfo> {
        let layout = self.pool_layout()?;
        let mut i = self.info();
        i.layout = Some(layout);
        Ok(i)
    }

    // ------------------------------------------------------------ capacity and alarms

    /// Set the datastore's capacity (`strata grow`): `bytes` > 0 an
    /// explicit size, 0 to follow the file system again. Refused when what
    /// is used plus what thick disks reserve would not fit. Returns once
    /// the new capacity is durable (written by a checkpoint into the
    /// superblock, docs/FORMAT.md §2); a crash before leaves the old one.
    pub fn set_capacity(&self, bytes: u64) -> Result<DatastoreInfo> {
        if bytes > 0 && bytes < GRAIN_BYTES {
            return err(
                ErrorKind::InvalidArgument,
                format!("a capacity of {bytes} bytes is less than one 4 KiB grain"),
            );
        }
        self.inner.set_capacity(bytes)?;
        Ok(self.info())
    }

    /// Every alarm's thresholds (the default where none was set).
    pub fn alarm_rules(&self) -> Vec<AlarmRule> {
        alarm::effective_rules(&self.inner.meta.lock().catalog.alarms)
    }

    /// Set one alarm's thresholds and command, kept in the catalog; durable
    /// when this returns.
    pub fn set_alarm(&self, rule: AlarmRule) -> Result<AlarmRule> {
        rule.validate()?;
        let kind: AlarmKind = rule.kind;
        self.change(|m| {
            m.catalog.alarms.retain(|r| r.kind != kind);
            m.catalog.alarms.push(rule.clone());
            m.catalog.alarms.sort_by_key(|r| r.kind);
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        Ok(rule)
    }

    /// Run a catalog operation under the gate (exclusive, so no I/O acts
    /// on a stale view of sharing) and the metadata lock. An error after
    /// its first change fail-stops the datastore.
    fn change<T>(&self, f: impl FnOnce(&mut Meta) -> Result<T>) -> Result<T> {
        self.inner.check_writable()?;
        let _g = self.inner.gate.write();
        let mut m = self.inner.meta.lock();
        self.inner.guarded(&mut m, f)
    }

    // ------------------------------------------------------------ disks

    fn disk_info_locked(m: &Meta, d: &DiskRec) -> DiskInfo {
        let v = m.version_state(d.head).unwrap_or_default();
        let blocks = d.size_bytes.div_ceil(BLOCK_BYTES);
        let (nb, tbz) = match d.provisioning {
            Provisioning::Thin => (v.nb, 0),
            Provisioning::Zeroedthick => (blocks, blocks.saturating_sub(v.nb)),
            Provisioning::Eagerzeroedthick => (blocks, 0),
        };
        DiskInfo {
            name: d.name.clone(),
            size_bytes: d.size_bytes,
            provisioning: d.provisioning,
            allocated_bytes: Some(v.mapped_grains * GRAIN_BYTES),
            nb: Some(nb),
            tbz: Some(tbz),
            snapshots: m
                .catalog
                .snapshots
                .iter()
                .filter(|s| s.disk == d.id && !s.is_hidden())
                .count(),
            current_snapshot: d
                .current_snapshot
                .and_then(|id| m.catalog.snapshots.iter().find(|s| s.id == id))
                .map(|s| s.name.clone()),
            parent: d.parent.clone(),
            created_unix: Some(d.created_unix),
            exclusive_bytes: None,
            snapshot_space_bytes: None,
            limits: d.limits,
            fragments: None,
        }
    }

    pub fn list_disks(&self) -> Vec<DiskInfo> {
        let m = self.inner.meta.lock();
        let mut v: Vec<DiskInfo> = m
            .catalog
            .disks
            .iter()
            .map(|d| Self::disk_info_locked(&m, d))
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// A disk's figures, O(1): `exclusive_bytes` and `snapshot_space_bytes`
    /// are None (see [`Self::disk_info_with_space`]).
    pub fn disk_info(&self, name: &str) -> Result<DiskInfo> {
        let m = self.inner.meta.lock();
        let d = m.catalog.disk(name)?;
        Ok(Self::disk_info_locked(&m, d))
    }

    /// A disk's figures with what removing it and deleting its snapshots
    /// would free (docs/FORMAT.md §7): a read-only simulation whose cost
    /// follows the disk's exclusive data, under the metadata lock.
    pub fn disk_info_with_space(&self, name: &str) -> Result<DiskInfo> {
        let mut m = self.inner.meta.lock();
        let d = m.catalog.disk(name)?.clone();
        let mut info = Self::disk_info_locked(&m, &d);
        let snaps = |hidden: bool| -> Vec<u64> {
            m.catalog
                .snapshots
                .iter()
                .filter(|s| s.disk == d.id && (hidden || !s.is_hidden()))
                .map(|s| s.version)
                .collect()
        };
        // `rm` drops every snapshot, hidden ones included, and the head.
        let mut all = snaps(true);
        let visible = snaps(false);
        all.push(d.head);
        let base = m.drop_baseline()?;
        info.exclusive_bytes = Some(m.exclusive_grains(&base, &all)? * GRAIN_BYTES);
        info.snapshot_space_bytes = Some(m.exclusive_grains(&base, &visible)? * GRAIN_BYTES);
        drop(m);
        info.fragments = Some(self.disk_fragments(name)?);
        Ok(info)
    }

    fn check_size(size_bytes: u64) -> Result<()> {
        if size_bytes == 0 || !size_bytes.is_multiple_of(512) {
            return err(
                ErrorKind::InvalidArgument,
                format!("disk size {size_bytes} must be a positive multiple of 512 bytes"),
            );
        }
        if size_bytes > strata_format::disk_bytes_max() {
            return err(
                ErrorKind::InvalidArgument,
                format!(
                    "disk size {size_bytes} exceeds the largest supported ({})",
                    strata_format::disk_bytes_max()
                ),
            );
        }
        Ok(())
    }

    /// Create a disk. `progress(done, total)` reports zeroing of an
    /// eager-zeroed thick disk.
    pub fn create_disk(
        &self,
        name: &str,
        size_bytes: u64,
        provisioning: Provisioning,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskInfo> {
        check_name("disk", name)?;
        Self::check_size(size_bytes)?;
        self.inner.check_writable()?;
        self.change(|m| {
            if m.catalog.disk(name).is_ok() {
                return err(
                    ErrorKind::AlreadyExists,
                    format!("a disk named '{name}' already exists"),
                );
            }
            if provisioning.is_thick() {
                let grains = size_bytes.div_ceil(GRAIN_BYTES);
                self.inner.check_space(
                    m,
                    SpaceRequest {
                        reserve: true,
                        grains,
                        own_reserved: 0,
                    },
                )?;
                self.inner.hold_reservation(m, grains, 1)?;
            }
            let id = m.catalog.alloc_id();
            let head = m.catalog.alloc_id();
            m.new_empty_version(head, size_bytes.div_ceil(GRAIN_BYTES));
            m.catalog.disks.push(DiskRec {
                id,
                name: name.to_string(),
                size_bytes,
                provisioning: match provisioning {
                    Provisioning::Eagerzeroedthick => Provisioning::Zeroedthick,
                    p => p,
                },
                head,
                current_snapshot: None,
                created_unix: now_unix(),
                parent: None,
                limits: Default::default(),
            });
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        if provisioning == Provisioning::Eagerzeroedthick {
            // Created zeroedthick, filled, then marked eager (as convert
            // does, FORMAT.md §7.3): a crash part-way leaves a consistent
            // zeroedthick disk that `convert` finishes.
            self.fill_and_mark_eager(name, progress, &mut Pacer::new(None, None))?;
        }
        self.disk_info(name)
    }

    /// Remove a disk and all its snapshots. Linked clones keep what they share.
    pub fn remove_disk(&self, name: &str) -> Result<()> {
        self.inner.check_writable()?;
        self.change(|m| {
            let d = m.catalog.disk(name)?.clone();
            if let Some(g) = m.catalog.group_of(d.id) {
                return err(
                    ErrorKind::Refused,
                    format!(
                        "disk '{name}' is in group '{}': take it out first ('strata group \
                         remove {} {name}')",
                        g.name, g.name
                    ),
                );
            }
            if let Some((g, gs)) = m
                .catalog
                .snapshots
                .iter()
                .filter(|s| s.disk == d.id)
                .find_map(|s| m.catalog.group_snapshot_of(s.id))
            {
                return err(
                    ErrorKind::Refused,
                    format!(
                        "disk '{name}' has snapshot '{}' of group snapshot '{}@{}': delete \
                         that first ('strata group snapshot delete {} {}')",
                        gs.name, g.name, gs.name, g.name, gs.name
                    ),
                );
            }
            let snaps: Vec<SnapshotRec> = m
                .catalog
                .snapshots
                .iter()
                .filter(|s| s.disk == d.id)
                .cloned()
                .collect();
            for s in &snaps {
                m.drop_version(s.version)?;
            }
            m.drop_version(d.head)?;
            m.catalog.snapshots.retain(|s| s.disk != d.id);
            m.catalog.disks.retain(|x| x.id != d.id);
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)
    }

    /// Set a disk's I/O limits (`IoLimits::default()` clears them). They
    /// apply at once to every open handle of the disk and its snapshots,
    /// whatever transport serves them, and are kept in the catalog.
    pub fn set_limits(&self, name: &str, limits: IoLimits) -> Result<DiskInfo> {
        if let Err(why) = limits.check() {
            return err(ErrorKind::InvalidArgument, why);
        }
        let id = self.change(|m| {
            let d = m.catalog.disk_mut(name)?;
            d.limits = limits;
            let id = d.id;
            m.mark_catalog_dirty();
            Ok(id)
        })?;
        self.inner.commit(false)?;
        self.inner.throttle(id, limits).set(limits);
        self.disk_info(name)
    }

    /// Grow a disk (also while it is served).
    pub fn extend_disk(&self, name: &str, size_bytes: u64) -> Result<DiskInfo> {
        Self::check_size(size_bytes)?;
        self.inner.check_writable()?;
        let old = self.change(|m| {
            let d = m.catalog.disk(name)?.clone();
            if size_bytes < d.size_bytes {
                return err(
                    ErrorKind::InvalidArgument,
                    format!(
                        "'{name}' is {} bytes; extend only grows a disk",
                        d.size_bytes
                    ),
                );
            }
            if d.provisioning.is_thick() {
                let grains = (size_bytes - d.size_bytes).div_ceil(GRAIN_BYTES);
                self.inner.check_space(
                    m,
                    SpaceRequest {
                        reserve: true,
                        grains,
                        own_reserved: 0,
                    },
                )?;
                self.inner.hold_reservation(m, grains, 0)?;
            }
            m.grow_version(d.head, size_bytes.div_ceil(GRAIN_BYTES))?;
            m.catalog.disk_mut(name)?.size_bytes = size_bytes;
            m.mark_catalog_dirty();
            Ok(d)
        })?;
        self.inner.commit(false)?;
        if old.provisioning == Provisioning::Eagerzeroedthick {
            let h = self.open_disk(name)?;
            let from = old.size_bytes / GRAIN_BYTES * GRAIN_BYTES;
            h.fill_zeros(from, size_bytes - from, &mut |_, _| {}, &mut |_| Ok(()))?;
        }
        self.disk_info(name)
    }

    // ------------------------------------------------------------ provisioning

    /// Change a disk's provisioning type online (FORMAT.md §7.3): to
    /// eagerzeroedthick every unmapped grain is allocated and written with
    /// zeros; to zeroedthick the rest of the size is reserved; to thin the
    /// reservation is released and so are grains that read all zeros.
    /// Each step leaves a consistent disk; after a crash, converting again
    /// finishes the job. `progress(done, total)` reports the fill or scan.
    pub fn convert_disk(
        &self,
        name: &str,
        to: Provisioning,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskInfo> {
        self.inner.check_writable()?;
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref());
        let mut clients = self.inner.client_watch();
        let from = self.disk_info(name)?.provisioning;
        match to {
            Provisioning::Thin => {
                if from.is_thick() {
                    self.set_provisioning(name, Provisioning::Thin)?;
                }
                let h = self.open_disk(name)?;
                h.punch_zero(progress, &mut |n| pacer.pace(n, clients.busy()))?;
            }
            Provisioning::Zeroedthick => {
                if from != Provisioning::Zeroedthick {
                    self.set_provisioning(name, Provisioning::Zeroedthick)?;
                }
            }
            Provisioning::Eagerzeroedthick => {
                if from == Provisioning::Thin {
                    self.set_provisioning(name, Provisioning::Zeroedthick)?;
                }
                self.fill_and_mark_eager(name, progress, &mut pacer)?;
            }
        }
        // Like every metadata command, durable when it returns (also when
        // there was nothing to change).
        self.inner.commit(false)?;
        self.disk_info(name)
    }

    /// Release the grains of a thin disk that read all zeros (vmkfstools'
    /// punchzero). Thick disks keep their blocks: converting one to thin
    /// releases them.
    pub fn punch_zero(
        &self,
        name: &str,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<PunchZeroReport> {
        self.inner.check_writable()?;
        let info = self.disk_info(name)?;
        if info.provisioning.is_thick() {
            return err(
                ErrorKind::Refused,
                format!(
                    "'{name}' is {}: a thick disk keeps its blocks; 'convert --type thin' \
                     releases its reservation and its zero grains",
                    info.provisioning.as_str()
                ),
            );
        }
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref());
        let mut clients = self.inner.client_watch();
        let h = self.open_disk(name)?;
        let (scanned, released) = h.punch_zero(progress, &mut |n| pacer.pace(n, clients.busy()))?;
        Ok(PunchZeroReport {
            disk: name.to_string(),
            scanned_bytes: scanned,
            released_bytes: released,
            allocated_bytes: self.disk_info(name)?.allocated_bytes.unwrap_or(0),
        })
    }

    /// Place new data grains by region (FORMAT.md §10.5: the default), or
    /// with `false` in the order writes arrive (for comparison).
    pub fn set_placement_regions(&self, on: bool) {
        self.inner.meta.lock().set_placement_regions(on);
    }

    /// Keep up to `bytes` of host space allocated ahead of the pool's
    /// end, so that first writes do not wait for the host file system to
    /// allocate (FORMAT.md §7.1, "Readied space"); 0 turns it off. The
    /// readying is done by [`Datastore::ready_space`], which a background
    /// thread started by [`Datastore::start_readier`] calls when the pool
    /// grows near the readied end.
    pub fn set_ready_bytes(&self, bytes: u64) {
        let grains = bytes.div_ceil(GRAIN_BYTES).div_ceil(BLOCK_GRAINS) * BLOCK_GRAINS;
        self.inner.meta.lock().set_ready_grains(grains);
    }

    /// One step of readying pool space, if one is due; whether it ran.
    pub fn ready_space(&self) -> bool {
        self.inner.check_writable().is_ok() && self.inner.ready_space()
    }

    /// Start the thread that readies pool space ahead (once), woken by
    /// writes that grow the pool near the readied end.
    pub fn start_readier(&self) {
        self.start_kicked(&self.inner.readier, "ready", 1000, |store| {
            store.ready_space();
        });
    }

    /// Turn zero detection on thin disks' writes on or off (FORMAT.md §7.4).
    pub fn set_detect_zeroes(&self, on: bool) {
        self.inner.detect_zeroes.store(on, Ordering::Relaxed);
    }

    /// One catalog step of a conversion: a thick type reserves what is not
    /// mapped (the host space first), thin releases it.
    fn set_provisioning(&self, name: &str, to: Provisioning) -> Result<()> {
        self.change(|m| {
            let d = m.catalog.disk(name)?.clone();
            if to.is_thick() && !d.provisioning.is_thick() {
                let grains = m.unwritten_grains(&d);
                self.inner.check_space(
                    m,
                    SpaceRequest {
                        reserve: true,
                        grains,
                        own_reserved: 0,
                    },
                )?;
                self.inner.hold_reservation(m, grains, 1)?;
            }
            m.catalog.disk_mut(name)?.provisioning = to;
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)
    }

    /// Fill a zeroedthick disk's unmapped grains with zeros, then mark it
    /// eagerzeroedthick.
    fn fill_and_mark_eager(
        &self,
        name: &str,
        progress: &mut dyn FnMut(u64, u64),
        pacer: &mut Pacer<'_>,
    ) -> Result<()> {
        let h = self.open_disk(name)?;
        let size = strata_block::BlockDevice::size_bytes(&*h);
        let mut clients = self.inner.client_watch();
        h.fill_zeros(0, size, progress, &mut |n| pacer.pace(n, clients.busy()))?;
        self.set_provisioning(name, Provisioning::Eagerzeroedthick)
    }

    /// Open `DISK` (read-write) or `DISK@SNAP` (read-only) for I/O.
    pub fn open_disk(&self, target: &str) -> Result<Arc<DiskHandle>> {
        let m = self.inner.meta.lock();
        let (d, snap) = m.catalog.target(target)?;
        let (version, read_only, snapshot_id) = match snap {
            None => (d.head, false, None),
            Some(s) => (s.version, true, Some(s.id)),
        };
        let throttle = self.inner.throttle(d.id, d.limits);
        Ok(Arc::new(DiskHandle {
            inner: self.inner.clone(),
            throttle,
            disk_id: d.id,
            snapshot_id,
            version,
            read_only,
            name: target.to_string(),
        }))
    }

    /// Where `to` (`DISK` or `DISK@SNAP`) differs from `from` (`None`: an
    /// empty disk), as byte ranges with whether `to` maps them (false: `to`
    /// reads zeros there, `from` did not). Cost follows the changes, not the
    /// disk size: shared map pages are skipped. For backups and for exporting
    /// a snapshot path as a chain of deltas.
    pub fn changed_ranges(&self, from: Option<&str>, to: &str) -> Result<Vec<ChangedRange>> {
        let _g = self.inner.gate.read();
        let mut m = self.inner.meta.lock();
        let resolve = |m: &Meta, t: &str| -> Result<(u64, u64)> {
            Ok(match m.catalog.target(t)? {
                (d, None) => (d.head, d.size_bytes),
                (_, Some(s)) => (s.version, s.size_bytes),
            })
        };
        let (vb, size_b) = resolve(&m, to)?;
        let va = match from {
            Some(f) => Some(resolve(&m, f)?.0),
            None => None,
        };
        let end = size_b.div_ceil(GRAIN_BYTES);
        let mut out: Vec<ChangedRange> = Vec::new();
        m.diff(va, vb, end, &mut |v, mapped| {
            let off = v * GRAIN_BYTES;
            match out.last_mut() {
                Some(r) if r.offset + r.len == off && r.mapped == mapped => r.len += GRAIN_BYTES,
                _ => out.push(ChangedRange {
                    offset: off,
                    len: GRAIN_BYTES,
                    mapped,
                }),
            }
        })?;
        if let Some(last) = out.last_mut() {
            last.len = last.len.min(size_b - last.offset);
        }
        Ok(out)
    }

    /// The snapshots from the root of `disk`'s tree down to `target`'s
    /// version: for `DISK`, the path to its current snapshot; for
    /// `DISK@SNAP`, the path to SNAP's parent. Oldest first.
    pub fn snapshot_path(&self, target: &str) -> Result<Vec<String>> {
        let m = self.inner.meta.lock();
        let mut cur = match m.catalog.target(target)? {
            (d, None) => d.current_snapshot,
            (_, Some(s)) => s.parent,
        };
        let mut path = Vec::new();
        while let Some(id) = cur {
            let s = m
                .catalog
                .snapshots
                .iter()
                .find(|s| s.id == id)
                .ok_or_else(|| {
                    Error::new(ErrorKind::Corrupt, format!("snapshot {id} is missing"))
                })?;
            path.push(s.name.clone());
            cur = s.parent;
            if path.len() > m.catalog.snapshots.len() {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    "snapshot parents form a loop",
                ));
            }
        }
        path.reverse();
        Ok(path)
    }

    /// Every exportable name: disks and their snapshots as `DISK@SNAP`.
    pub fn export_names(&self) -> Vec<(String, String)> {
        let m = self.inner.meta.lock();
        let mut out = Vec::new();
        let mut disks: Vec<&DiskRec> = m.catalog.disks.iter().collect();
        disks.sort_by(|a, b| a.name.cmp(&b.name));
        for d in disks {
            out.push((
                d.name.clone(),
                format!("{} disk, {} bytes", d.provisioning.as_str(), d.size_bytes),
            ));
            for s in m
                .catalog
                .snapshots
                .iter()
                .filter(|s| s.disk == d.id && !s.is_hidden())
            {
                out.push((
                    format!("{}@{}", d.name, s.name),
                    format!("snapshot of {} (read-only)", d.name),
                ));
            }
        }
        out
    }

    // ------------------------------------------------------------ snapshots

    /// Take a snapshot: O(1), whatever the disk holds.
    pub fn snapshot_create(
        &self,
        disk: &str,
        snap: &str,
        description: &str,
    ) -> Result<SnapshotInfo> {
        check_name("snapshot", snap)?;
        self.inner.check_writable()?;
        self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            if m.catalog.snapshot(d.id, disk, snap).is_ok() {
                return err(
                    ErrorKind::AlreadyExists,
                    format!("disk '{disk}' already has a snapshot named '{snap}'"),
                );
            }
            let id = m.catalog.alloc_id();
            add_snapshot(m, &d, id, snap.to_string(), description, d.current_snapshot)?;
            m.catalog.disk_mut(disk)?.current_snapshot = Some(id);
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.snapshots_of(disk, false)?
            .into_iter()
            .find(|s| s.name == snap)
            .ok_or_else(|| Error::new(ErrorKind::Gone, "snapshot vanished"))
    }

    /// Snapshots of a disk, parents before children (a tree by `parent`).
    /// Each with `exclusive_bytes`: what deleting it would free (a read-only
    /// simulation per snapshot, whose cost follows its exclusive data).
    pub fn snapshot_list(&self, disk: &str) -> Result<Vec<SnapshotInfo>> {
        self.snapshots_of(disk, true)
    }

    /// Snapshots of `disk`; `exclusive_bytes` is computed when `space`
    /// (else 0, true of a snapshot just taken: it shares the head's root).
    fn snapshots_of(&self, disk: &str, space: bool) -> Result<Vec<SnapshotInfo>> {
        let mut guard = self.inner.meta.lock();
        let m: &mut Meta = &mut guard;
        let mut exclusive = std::collections::HashMap::new();
        let d = m.catalog.disk(disk)?.clone();
        if space {
            let base = m.drop_baseline()?;
            let versions: Vec<u64> = m
                .catalog
                .snapshots
                .iter()
                .filter(|s| s.disk == d.id && !s.is_hidden())
                .map(|s| s.version)
                .collect();
            for v in versions {
                exclusive.insert(v, m.exclusive_grains(&base, &[v])? * GRAIN_BYTES);
            }
        }
        let snaps: Vec<&SnapshotRec> = m
            .catalog
            .snapshots
            .iter()
            .filter(|s| s.disk == d.id && !s.is_hidden())
            .collect();
        let name_of = |id: Option<u64>| {
            id.and_then(|i| snaps.iter().find(|s| s.id == i))
                .map(|s| s.name.clone())
        };
        // Order: depth-first from the roots, children by creation.
        let mut out = Vec::new();
        let mut stack: Vec<Option<u64>> = vec![None];
        let mut visited = std::collections::HashSet::new();
        fn children<'a>(snaps: &[&'a SnapshotRec], parent: Option<u64>) -> Vec<&'a SnapshotRec> {
            let mut c: Vec<&SnapshotRec> = snaps
                .iter()
                .copied()
                .filter(|s| s.parent == parent)
                .collect();
            c.sort_by_key(|s| std::cmp::Reverse(s.id));
            c
        }
        while let Some(p) = stack.pop() {
            if let Some(id) = p {
                if !visited.insert(id) {
                    continue;
                }
                let s = snaps
                    .iter()
                    .find(|s| s.id == id)
                    .expect("child of a listed snapshot");
                let v = m.version_state(s.version).unwrap_or_default();
                out.push(SnapshotInfo {
                    id: s.id,
                    name: s.name.clone(),
                    description: s.description.clone(),
                    created_unix: s.created_unix,
                    parent: name_of(s.parent),
                    size_bytes: s.size_bytes,
                    mapped_bytes: Some(v.mapped_grains * GRAIN_BYTES),
                    exclusive_bytes: Some(exclusive.get(&s.version).copied().unwrap_or(0)),
                    current: d.current_snapshot == Some(s.id),
                    group: m
                        .catalog
                        .group_snapshot_of(s.id)
                        .map(|(g, _)| g.name.clone()),
                });
            }
            for c in children(&snaps, p) {
                stack.push(Some(c.id));
            }
        }
        Ok(out)
    }

    /// Make the disk's live state equal to the snapshot again. The live
    /// state's changes since are discarded.
    pub fn snapshot_revert(&self, disk: &str, snap: &str) -> Result<()> {
        self.inner.check_writable()?;
        self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            let s = m.catalog.snapshot(d.id, disk, snap)?.clone();
            m.replace_version(d.head, s.version)?;
            let dm = m.catalog.disk_mut(disk)?;
            dm.current_snapshot = Some(s.id);
            dm.size_bytes = s.size_bytes;
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)
    }

    /// Delete a snapshot. Moves no data: what others still share stays.
    /// Refused for a member of a group snapshot (deleted with the group
    /// snapshot, as one).
    pub fn snapshot_delete(&self, disk: &str, snap: &str) -> Result<()> {
        self.inner.check_writable()?;
        self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            let s = m.catalog.snapshot(d.id, disk, snap)?.clone();
            if let Some((g, gs)) = m.catalog.group_snapshot_of(s.id) {
                return err(
                    ErrorKind::Refused,
                    format!(
                        "snapshot '{disk}@{snap}' is a member of group snapshot '{}@{}': delete \
                         the group snapshot ('strata group snapshot delete {} {}')",
                        g.name, gs.name, g.name, gs.name
                    ),
                );
            }
            delete_snapshot_locked(m, s.id)
        })?;
        self.inner.commit(false)
    }

    // ------------------------------------------------------------ clones

    /// Linked clone of `DISK@SNAP`: O(1); shares all data with the snapshot.
    pub fn clone_linked(&self, src: &str, new: &str) -> Result<DiskInfo> {
        check_name("disk", new)?;
        let (disk, Some(snap)) = split_target(src) else {
            return err(
                ErrorKind::InvalidArgument,
                format!("a linked clone needs a snapshot: use '{src}@SNAPSHOT' (or --full)"),
            );
        };
        self.inner.check_writable()?;
        self.change(|m| {
            if m.catalog.disk(new).is_ok() {
                return err(
                    ErrorKind::AlreadyExists,
                    format!("a disk named '{new}' already exists"),
                );
            }
            let d = m.catalog.disk(disk)?.clone();
            let s = m.catalog.snapshot(d.id, disk, snap)?.clone();
            clone_locked(m, &s, new, src)?;
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.disk_info(new)
    }

    /// Full clone of `DISK` or `DISK@SNAP`: an independent copy. Copies only
    /// mapped grains; time depends on data size, not on snapshot count. A
    /// live disk is copied as it was when the clone began (point in time),
    /// through an implicit snapshot held for the copy's duration.
    pub fn clone_full(
        &self,
        src: &str,
        new: &str,
        provisioning: Provisioning,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskInfo> {
        let held = match split_target(src) {
            (disk, None) => Some((disk.to_string(), self.hold(disk)?)),
            (_, Some(_)) => None,
        };
        let from = match &held {
            Some((disk, snap)) => format!("{disk}@{snap}"),
            None => src.to_string(),
        };
        let r = self.copy_into_new(&from, new, provisioning, progress);
        if let Some((disk, snap)) = held {
            let dropped = self.snapshot_delete(&disk, &snap);
            if r.is_ok() {
                dropped?;
            }
        }
        r
    }

    fn copy_into_new(
        &self,
        src: &str,
        new: &str,
        provisioning: Provisioning,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskInfo> {
        let source = self.open_disk(src)?;
        let size = strata_block::BlockDevice::size_bytes(&*source);
        self.create_disk(new, size, provisioning, &mut |_, _| {})?;
        let target = self.open_disk(new)?;
        let r = crate::disk::copy_mapped(&source, &target, progress);
        if let Err(e) = r {
            let _ = self.remove_disk(new);
            return Err(e);
        }
        self.inner.commit(false)?;
        self.disk_info(new)
    }

    /// Hold `disk`'s live state still in an implicit snapshot (O(1)), hidden
    /// from lists, exports and the snapshot tree; returns its name.
    fn hold(&self, disk: &str) -> Result<String> {
        let name = self.change(|m| {
            let d = m.catalog.disk(disk)?.clone();
            let id = m.catalog.alloc_id();
            let name = format!("{HIDDEN_SNAPSHOT_PREFIX}{id}");
            let why = "held while a full clone copies the disk";
            add_snapshot(m, &d, id, name.clone(), why, None)?;
            m.mark_catalog_dirty();
            Ok(name)
        })?;
        self.inner.commit(false)?;
        Ok(name)
    }

    /// Drop implicit snapshots left by full clones a crash interrupted.
    fn drop_held(&self) -> Result<()> {
        let held: Vec<(String, String)> = {
            let m = self.inner.meta.lock();
            m.catalog
                .snapshots
                .iter()
                .filter(|s| s.is_hidden())
                .filter_map(|s| {
                    let d = m.catalog.disk_by_id(s.disk)?;
                    Some((d.name.clone(), s.name.clone()))
                })
                .collect()
        };
        for (disk, snap) in held {
            tracing::info!("dropping {disk}@{snap}, left by an interrupted full clone");
            self.snapshot_delete(&disk, &snap)?;
        }
        Ok(())
    }

    // ------------------------------------------------------------ check

    /// Verify counts, ownership and accounting (DESIGN invariant 3).
    pub fn check(&self) -> Result<CheckReport> {
        let _g = self.inner.gate.write();
        let mut m = self.inner.meta.lock();
        let mut r = check::run(&mut m)?;
        for w in &self.inner.open_warnings {
            r.damaged_pages += 1;
            r.errors.insert(0, w.clone());
        }
        if let Some(f) = self.inner.failed() {
            r.errors.insert(
                0,
                format!(
                    "the datastore fail-stopped: {} (reopen to recover)",
                    f.cause
                ),
            );
        }
        Ok(r)
    }
}

/// How the background reclaimer shares the metadata lock with clients.
/// Idle, it takes full steps back to back. While clients do I/O it
/// takes short steps (about a leaf, well under a millisecond under the
/// lock) and rests three times as long as each step took, so reclaiming
/// holds the lock at most a quarter of the time and a client waits at most
/// one short step for it. Freed grains are committed (a commit with frees
/// drains the gate once) every `COMMIT_EVERY` grains of work, whatever the
/// step size, so the drains do not multiply when steps shrink.
#[derive(Default)]
struct ReclaimPace {
    /// Work done since the last commit (grains, as `Meta::reclaim` counts).
    since_commit: u64,
}

impl ReclaimPace {
    /// Work between commits of the freed grains.
    const COMMIT_EVERY: u64 = 64 * RECLAIM_STEP_GRAINS;
    /// A step while clients are busy: one leaf's grains.
    const BUSY_STEP: u64 = 512;
    /// Rest after a step while clients are busy, in multiples of the step.
    const BUSY_REST: u32 = 3;

    fn budget(&self, busy: bool) -> u64 {
        if busy {
            Self::BUSY_STEP
        } else {
            RECLAIM_STEP_GRAINS
        }
    }

    /// Count a step of `budget` (`worked`: there was something to reclaim)
    /// after which work remains (`more`); true when it is time to commit:
    /// every `COMMIT_EVERY`, and when the last orphan is gone.
    fn done(&mut self, budget: u64, worked: bool, more: bool) -> bool {
        if worked {
            self.since_commit += budget;
        }
        if self.since_commit >= Self::COMMIT_EVERY || (!more && self.since_commit > 0) {
            self.since_commit = 0;
            return true;
        }
        false
    }

    /// After a step that took `took`: rest while clients are busy, else
    /// only let other threads run.
    fn rest(&self, busy: bool, took: std::time::Duration) {
        if busy {
            std::thread::sleep((took * Self::BUSY_REST).max(std::time::Duration::from_micros(200)));
        } else {
            std::thread::yield_now();
        }
    }
}

impl Datastore {
    // ------------------------------------------------------------ layout (FORMAT.md §10)

    /// The live disk's fragments (FORMAT.md §10.1).
    pub fn disk_fragments(&self, name: &str) -> Result<u64> {
        Ok(self.open_disk(name)?.fragments()?.0)
    }

    /// How the pool's space lies (FORMAT.md §10.1), scanned a few blocks
    /// per hold of the metadata lock.
    pub fn pool_layout(&self) -> Result<PoolLayout> {
        let mut acc = FreeExtents::default();
        let mut b = 0;
        let pool_bytes = loop {
            let mut m = self.inner.meta.lock();
            let blocks = m.pool_blocks();
            if b >= blocks {
                break m.hwm() * GRAIN_BYTES;
            }
            b = m.free_extents_step(b, b + FREE_STEP_BLOCKS, &mut acc)?;
        };
        acc.end_run();
        Ok(PoolLayout {
            free_extents: acc.extents,
            free_extent_histogram: FREE_EXTENT_CLASSES
                .iter()
                .zip(acc.histogram)
                .map(|(&(name, _), n)| (name.to_string(), n))
                .collect(),
            free_in_pool_bytes: acc.free_grains * GRAIN_BYTES,
            pool_bytes,
            pool_file_bytes: self.inner.pool.allocated_bytes()?,
        })
    }

    /// Lay a live disk's grains out in logical order (`strata defrag`,
    /// FORMAT.md §10.3), keeping what snapshots and clones share shared.
    /// Online, a region at a time, paced; commits every 64 MiB and at the
    /// end. With `dry_run`, reports what it would move and moves nothing.
    pub fn defrag_disk(
        &self,
        name: &str,
        dry_run: bool,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DefragReport> {
        if !dry_run {
            self.inner.check_writable()?;
        }
        if name.contains('@') {
            return err(
                ErrorKind::InvalidArgument,
                format!(
                    "'{name}' is a snapshot: defragment its disk; what the snapshot shares moves with it"
                ),
            );
        }
        let h = self.open_disk(name)?;
        let (fragments_before, mapped) = h.fragments()?;
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref())
            .resting(crate::work::LAYOUT_BUSY_REST);
        let mut clients = self.inner.client_watch();
        let t = h.defrag(dry_run, progress, &mut |n| pacer.pace(n, clients.busy()))?;
        let fragments_after = if dry_run {
            fragments_before
        } else {
            h.fragments()?.0
        };
        Ok(DefragReport {
            disk: name.to_string(),
            dry_run,
            fragments_before,
            fragments_after,
            mapped_bytes: mapped * GRAIN_BYTES,
            moved_bytes: t.moved,
            regions_moved: t.regions_moved,
            regions_skipped: t.skipped,
            grains_kept: t.kept,
        })
    }

    /// Free-space consolidation (`strata defrag --free-space`, FORMAT.md
    /// §10.4): live grains above what the used space needs are moved down
    /// into free grains, the pool end comes down to match, and the free
    /// grains left inside the pool are punched out of the host file. Paced
    /// like the other space work; each step is bounded.
    pub fn consolidate_free_space(
        &self,
        opts: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FreeSpaceReport> {
        self.inner.check_writable()?;
        if self.inner.consolidating.swap(true, Ordering::AcqRel) {
            return err(
                ErrorKind::Refused,
                "a free-space consolidation is already running (see 'strata jobs')",
            );
        }
        struct Running<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _running = Running(&self.inner.consolidating);
        // Deleted maps first: what they hold is free space too.
        while self.reclaim(1 << 16)? {}
        self.inner.commit(false)?;
        let before = self.pool_layout()?;
        let mut pacer = Pacer::new(opts.rate_bytes_per_sec, opts.control.as_deref())
            .resting(crate::work::LAYOUT_BUSY_REST);
        let mut clients = self.inner.client_watch();
        let mut pace = |n: u64| pacer.pace(n, clients.busy());
        let mut r = FreeSpaceReport {
            pool_bytes_before: before.pool_bytes,
            pool_file_bytes_before: before.pool_file_bytes,
            ..Default::default()
        };
        let (used, hwm) = {
            let m = self.inner.meta.lock();
            (m.used_grains(), m.hwm())
        };
        // Room kept below the new end for clients' writes meanwhile.
        let slack = (1u64 << 10).max(used / 32);
        let end = (used + slack + 1).div_ceil(BLOCK_GRAINS) * BLOCK_GRAINS;
        // Progress counts grains (moved, then looked at) and is reported
        // in bytes, as every job's is.
        let total = hwm.saturating_sub(end) + hwm;
        let mut report = |g: u64| progress(g.min(total) * GRAIN_BYTES, total * GRAIN_BYTES);
        let mut done = 0u64;
        if end < hwm {
            self.lower_pool_end_to(end, &mut r, &mut pace, &mut |n| {
                done = n;
                report(done)
            })?;
        }
        let mut watch = self.inner.client_watch();
        (r.punched_bytes, r.short_runs_bytes) =
            self.punch_free_grains(&mut pace, &mut || watch.busy(), &mut |g| report(done + g))?;
        let after = self.pool_layout()?;
        r.used_bytes = self.info().used_bytes;
        r.pool_bytes_after = after.pool_bytes;
        r.pool_file_bytes_after = after.pool_file_bytes;
        Ok(r)
    }

    /// Consolidation's second step (FORMAT.md §10.4, "Evacuate the top"):
    /// with allocations held below `end`, the live grains at or above it
    /// move down; when none is left there and no client needed the room,
    /// the pool end comes down to `end`, the superblock takes it and the
    /// file is cut there (the reserved tail held again past it). Otherwise
    /// `r.note` says why the end stays. `progress` gets the grains moved.
    fn lower_pool_end_to(
        &self,
        end: u64,
        r: &mut FreeSpaceReport,
        pace: &mut dyn FnMut(u64) -> Result<()>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let t = std::time::Instant::now();
        self.inner.meta.lock().set_alloc_limit(Some(end));
        let moved = self.evacuate(end, r, pace, progress);
        let lifted = self.inner.meta.lock().set_alloc_limit(None);
        moved?;
        // The moved grains' old places become free once committed.
        self.inner.commit(false)?;
        self.inner.commit(false)?;
        let lowered = !lifted && self.inner.meta.lock().lower_pool_end(end);
        if lowered {
            // The superblock takes the new end; only then the file
            // shrinks, and the reserved tail is held again past it.
            self.inner.checkpoint(true)?;
            // Under the lock: a client may have grown the pool again
            // since; everything below the tail's end stays.
            let mut m = self.inner.meta.lock();
            let end = m.tail_end();
            m.truncate_tail(end)?;
            self.inner.hold_reservation(&mut m, 0, 0)?;
        } else {
            r.note = Some(if lifted {
                "clients needed room above the planned end while grains moved; \
                 run it again when writes are quieter"
                    .to_string()
            } else {
                "grains above the planned end are still in use; run it again".to_string()
            });
        }
        tracing::info!(
            "free space: {} MiB moved below grain {end} in {:.1} s{}",
            r.moved_bytes >> 20,
            t.elapsed().as_secs_f64(),
            if lowered { "" } else { "; the end stays" }
        );
        Ok(())
    }

    /// Consolidation's last step (FORMAT.md §10.4, "Punch"): the free
    /// grains left below the pool end give their space to the host, a few
    /// blocks at a time (clients find the rest allocatable), and so does
    /// the space readied ahead of first writes (§7.1; a writer that grows
    /// the pool readies it again). While `clients_busy()` says client I/O
    /// is in flight, runs shorter than `PUNCH_MIN_GRAINS` are left on the
    /// host: a punch of a grain or two costs the clients as much as a long
    /// one (each takes the file's lock and cuts the host's extent map), and
    /// thousands of them ran the clients at a third of their speed.
    /// `progress` gets the grains looked at. Returns the bytes given back
    /// and the bytes of the short runs left.
    fn punch_free_grains(
        &self,
        pace: &mut dyn FnMut(u64) -> Result<()>,
        clients_busy: &mut dyn FnMut() -> bool,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(u64, u64)> {
        let t = std::time::Instant::now();
        let (mut bytes, mut short) = (0, 0);
        let blocks = self.inner.meta.lock().pool_blocks();
        let mut b = 0;
        while b < blocks {
            let mut held = Vec::new();
            b = self.inner.meta.lock().hold_free_step(b, b + 8, &mut held)?;
            let min_run = if clients_busy() {
                PUNCH_MIN_GRAINS as u64
            } else {
                1
            };
            let punched = self.punch_runs(&held, min_run);
            self.inner.meta.lock().release(&held);
            let (p, s) = punched?;
            bytes += p;
            short += s;
            pace(8 * BLOCK_GRAINS * GRAIN_BYTES)?;
            progress(b * BLOCK_GRAINS);
        }
        bytes += self.inner.meta.lock().drop_readied()?;
        tracing::info!(
            "free space: {} MiB given back to the host in {:.1} s; {} MiB of free runs under {} KiB \
             left alone while clients wrote",
            bytes >> 20,
            t.elapsed().as_secs_f64(),
            short >> 20,
            (PUNCH_MIN_GRAINS as u64 * GRAIN_BYTES) >> 10
        );
        Ok((bytes, short))
    }

    /// What consolidation could give back, cheaply (no scan): bytes of the
    /// pool above what is used, and bytes the pool file holds on the host
    /// above what is used and what thick disks hold in reserve (the tail,
    /// or their reservation where it is larger). The background policy
    /// decides on the second (FORMAT.md §10.4): the first includes blocks
    /// placement claimed (§10.5), which are holes on the host.
    pub fn free_space_gap(&self) -> Result<(u64, u64)> {
        let (used, pool, held) = {
            let m = self.inner.meta.lock();
            let tail = m.tail_end() - m.hwm();
            (
                m.used_grains() * GRAIN_BYTES,
                m.hwm() * GRAIN_BYTES,
                tail.max(m.reserved_grains()) * GRAIN_BYTES,
            )
        };
        let file = self.inner.pool.allocated_bytes()?;
        Ok((pool.saturating_sub(used), file.saturating_sub(used + held)))
    }

    /// Punch the runs of `sorted` (grains held out of the allocator) of at
    /// least `min_run` grains. Returns the bytes punched and the bytes of
    /// the shorter runs left alone.
    fn punch_runs(&self, sorted: &[u64], min_run: u64) -> Result<(u64, u64)> {
        let (mut bytes, mut short) = (0, 0);
        let mut i = 0;
        while i < sorted.len() {
            let mut j = i + 1;
            while j < sorted.len() && sorted[j] == sorted[j - 1] + 1 {
                j += 1;
            }
            let n = (j - i) as u64;
            if n < min_run {
                short += n * GRAIN_BYTES;
                i = j;
                continue;
            }
            self.inner.meta.lock().mark_unbacked(sorted[i], n);
            let (off, len) = (sorted[i] * GRAIN_BYTES, n * GRAIN_BYTES);
            // A hole already (a freed disk's runs, punched when reclaimed):
            // a punch would only take the file's lock from the clients.
            if !self.inner.pool.is_hole(off, len)? {
                self.inner.pool.punch_hole(off, len)?;
                bytes += len;
            }
            i = j;
        }
        Ok((bytes, short))
    }

    /// Move every live grain at or above `zone` down (FORMAT.md §10.4): up
    /// to three passes of a walk of every version finding them, then moves
    /// in batches of 64 with client I/O drained (the gate held for writing:
    /// no write is in flight, so none can write a grain in place while it
    /// is copied). Stops early, leaving the end where it is, when a client
    /// lifted the allocation limit or no free grain is left below `zone`.
    #[expect(clippy::too_many_lines)]
    fn evacuate(
        &self,
        zone: u64,
        r: &mut FreeSpaceReport,
        pace: &mut dyn FnMut(u64) -> Result<()>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        const BATCH: usize = 64;
        const STEP: u64 = 64 * 512;
        let mut since_commit = 0u64;
        for _pass in 0..3 {
            let mut found: Vec<ZoneGrain> = Vec::new();
            let versions = self.inner.meta.lock().version_ids();
            for ver in versions {
                let reach = match self.inner.meta.lock().version_state(ver) {
                    Some(st) => 1u64 << (strata_format::MAP_FANOUT_SHIFT * st.levels as u32),
                    None => continue,
                };
                let mut v = 0;
                while v < reach {
                    let t = reach.min(v + STEP);
                    let mut m = self.inner.meta.lock();
                    if m.version_state(ver).is_none() {
                        break;
                    }
                    m.zone_scan_step(ver, v, t, zone, &mut found)?;
                    v = t;
                }
            }
            let mut seen = std::collections::HashSet::new();
            found.retain(|z| seen.insert(z.grain()));
            if found.is_empty() || self.inner.meta.lock().alloc_limit_lifted() {
                return Ok(());
            }
            let mut low = 1u64;
            let mut full = false;
            let mut buf = vec![0u8; GRAIN_BYTES as usize];
            for batch in found.chunks(BATCH) {
                if self.inner.meta.lock().alloc_limit_lifted() {
                    // Clients needed the room: the end cannot come down
                    // this time, and more moves would be churn.
                    return Ok(());
                }
                // Bring the batch's data grains into the host's cache while
                // clients still run: the copies below, with client I/O
                // drained, then read from memory. (Only a warm-up: the copy
                // reads the grain again under the gate.)
                for z in batch {
                    if let ZoneGrain::Data { g, .. } = *z {
                        self.inner.pool.will_need(g * GRAIN_BYTES, GRAIN_BYTES);
                    }
                }
                for z in batch {
                    if let ZoneGrain::Data { g, .. } = *z {
                        self.inner.pool.read_at(&mut buf, g * GRAIN_BYTES)?;
                    }
                }
                {
                    let _drain = self.inner.gate.write();
                    let mut m = self.inner.meta.lock();
                    self.inner.guarded(&mut m, |m| {
                        for z in batch {
                            let g = z.grain();
                            if m.ref_get(g)? == 0 {
                                continue; // freed since the walk
                            }
                            let Some(to) = m.alloc_low(&mut low, zone)? else {
                                full = true; // no room below: the end stays
                                return Ok(());
                            };
                            let ok = match *z {
                                ZoneGrain::Data { v, g } => {
                                    self.inner.pool.read_at(&mut buf, g * GRAIN_BYTES)?;
                                    self.inner.pool.write_at(&buf, to * GRAIN_BYTES)?;
                                    m.move_grain(v, g, to)?
                                }
                                ZoneGrain::Node { base, level, g } => {
                                    m.move_node(base, level, g, to)?
                                }
                            };
                            if ok {
                                r.moved_bytes += GRAIN_BYTES;
                            } else {
                                m.abort_alloc(to)?;
                                r.grains_kept += 1;
                            }
                        }
                        Ok(())
                    })?;
                }
                self.inner
                    .mutations
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
                if full {
                    return Ok(());
                }
                since_commit += BATCH as u64 * GRAIN_BYTES;
                if since_commit >= 64 << 20 {
                    self.inner.commit(false)?;
                    since_commit = 0;
                }
                pace(BATCH as u64 * GRAIN_BYTES)?;
                progress(r.moved_bytes / GRAIN_BYTES);
            }
            self.inner.commit(false)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_storage::SimBackend;

    /// A new datastore on a simulated backend, opened.
    fn sim_store() -> (SimBackend, Datastore) {
        let b = SimBackend::new();
        Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
        let ds = Datastore::open(Arc::new(b.clone()), &OpenOptions::default(), None).unwrap();
        (b, ds)
    }

    #[test]
    fn an_implicit_clone_snapshot_left_by_a_crash_is_dropped_on_open() {
        let (b, ds) = sim_store();
        ds.create_disk("d", 4 << 20, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let held = ds.hold("d").unwrap();
        assert!(
            ds.snapshot_list("d").unwrap().is_empty(),
            "hidden from lists"
        );
        assert!(ds.open_disk(&format!("d@{held}")).is_ok());
        drop(ds);
        b.crash(1);
        let ds = Datastore::open(Arc::new(b.clone()), &OpenOptions::default(), None).unwrap();
        assert!(
            ds.open_disk(&format!("d@{held}")).is_err(),
            "dropped on open"
        );
        assert!(ds.check().unwrap().is_clean());
    }

    /// Consolidation's punch step leaves free runs shorter than 64 KiB on
    /// the host while clients do I/O (thousands of one-grain punches cost
    /// them two thirds of their speed) and gives them back when they are
    /// quiet; the runs it skips stay free and allocatable.
    #[test]
    fn short_free_runs_are_punched_only_while_clients_are_quiet() {
        use strata_block::BlockDevice;
        let (_, ds) = sim_store();
        ds.create_disk("d", 4 << 20, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let h = ds.open_disk("d").unwrap();
        h.write_at(&vec![0x11; 4 << 20], 0, false).unwrap();
        ds.flush().unwrap();
        // Every other grain rewritten after a snapshot that is then
        // deleted: its old place comes free alone, between live grains.
        ds.snapshot_create("d", "s", "").unwrap();
        for g in (0..1024u64).step_by(2) {
            h.write_at(&[0x22; 4096], g * GRAIN_BYTES, false).unwrap();
        }
        ds.snapshot_delete("d", "s").unwrap();
        while ds.reclaim(u64::MAX).unwrap() {}
        ds.flush().unwrap();
        let step = |busy: bool| {
            ds.punch_free_grains(&mut |_| Ok(()), &mut || busy, &mut |_| {})
                .unwrap()
        };
        let (_, short) = step(true);
        assert!(short >= 512 * GRAIN_BYTES, "one-grain runs left: {short}");
        let (punched, short) = step(false);
        assert_eq!(short, 0, "clients quiet: every run punched");
        assert!(punched >= 512 * GRAIN_BYTES, "{punched}");
        let mut buf = vec![0u8; 4 << 20];
        h.read_at(&mut buf, 0).unwrap();
        for (g, grain) in buf.chunks(GRAIN_BYTES as usize).enumerate() {
            let want = if g % 2 == 0 { 0x22 } else { 0x11 };
            assert!(grain.iter().all(|&x| x == want), "grain {g}");
        }
        assert!(ds.check().unwrap().is_clean());
    }

    /// The ranged lookup a write makes (one walk per leaf, counts a page at
    /// a time) answers exactly what a lookup per grain does, over a map with
    /// holes, private grains, grains shared with a snapshot and a clone,
    /// and private leaves under shared paths; ranges cross leaf boundaries.
    #[test]
    fn ranged_write_lookup_matches_a_lookup_per_grain() {
        use strata_block::BlockDevice;
        let (_, ds) = sim_store();
        ds.create_disk("d", 8 << 20, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let d = ds.open_disk("d").unwrap();
        let data = vec![7u8; 2 << 20];
        // Grains 100..612 (across the first leaf's end), then a snapshot and
        // a clone share them; then some are overwritten (private again).
        d.write_at(&data[..512 * 4096], 100 * 4096, false).unwrap();
        d.write_at(&data[..64 * 4096], 1500 * 4096, false).unwrap();
        ds.snapshot_create("d", "s", "").unwrap();
        ds.clone_linked("d@s", "c").unwrap();
        d.write_at(&data[..40 * 4096], 480 * 4096, false).unwrap();
        d.write_at(&data[..4096], 120 * 4096, false).unwrap();
        d.write_at(&data[..8 * 4096], 1800 * 4096, false).unwrap();
        let c = ds.open_disk("c").unwrap();
        c.write_at(&data[..16 * 4096], 1510 * 4096, false).unwrap();
        let mut m = ds.inner.meta.lock();
        let mut any = [false; 2];
        for h in [&d, &c] {
            for (first, count) in [
                (0, 2048),
                (90, 40),
                (500, 30),
                (1500, 400),
                (511, 2),
                (1024, 1),
            ] {
                let mut ranged = Vec::new();
                m.lookup_range_for_write(h.version, first, count, &mut ranged)
                    .unwrap();
                let single: Vec<_> = (first..first + count)
                    .map(|v| m.lookup_for_write(h.version, v).unwrap())
                    .collect();
                assert_eq!(ranged, single, "version {} [{first}, +{count})", h.version);
                for (e, x) in single {
                    any[x as usize] |= e != 0;
                }
            }
        }
        assert_eq!(any, [true, true], "both shared and private grains seen");
    }

    #[test]
    fn a_panic_inside_a_change_fail_stops_the_datastore() {
        let (_, ds) = sim_store();
        let inner = ds.inner.clone();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _fence = inner.fail_on_panic();
            panic!("a release assertion fails half-way");
        }));
        assert!(r.is_err());
        let f = ds.info().fail_stop.expect("fail-stopped");
        assert!(f.cause.contains("internal check failed"), "{f:?}");
        assert!(ds
            .create_disk("x", 1 << 20, Provisioning::Thin, &mut |_, _| {})
            .is_err());
    }
}
