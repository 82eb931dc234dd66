//! The datastore: init, open (recovery, upgrade from format version 1), and
//! the catalog operations (disks, snapshots, clones). The commit machinery
//! is in `store`, the I/O path in `disk`.
//!
//! Submodules, one job each, all `impl Datastore` blocks over this file's
//! state:
//! - `open`: init, open (recovery, damaged-slot fallback, v1 upgrade), close;
//! - `background`: the reclaimer, committer and readier threads;
//! - `disks`: create, remove, limits, extend, convert, punchzero;
//! - `snapshots`: take, list, revert, delete;
//! - `clones`: linked and full clones, the hidden snapshot a full clone holds;
//! - `pool`: fragments, pool layout, defrag, free-space consolidation;
//! - `groups`: consistency groups.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Serialize;
use strata_api::alarm::{self, AlarmKind, AlarmRule, AlarmState, ReportedAlarms, SpaceFigures};
use strata_api::{
    CheckReport, DatastoreInfo, DiskInfo, Provisioning, PunchZeroReport, SnapshotInfo,
};
use strata_format::{BLOCK_BYTES, BLOCK_GRAINS, GRAIN_BYTES};

use crate::catalog::DiskRec;
use crate::check;
use crate::disk::DiskHandle;
use crate::error::{err, Error, ErrorKind, Result};
use crate::meta::Meta;
use crate::store::Store;
use crate::work::WorkControl;

mod background;
mod clones;
mod disks;
#[path = "groups.rs"]
mod groups;
mod keys;
mod open;
mod pool;
mod rekey;
mod snapshots;

use clones::clone_locked;
pub use clones::{stopped_clone, FullClone};
pub use disks::NewDisk;
pub use keys::{slot_info, CarriedKeys, NewKeys};
pub(crate) use open::read_catalog;
pub use rekey::{deep_rekey_resumes, DeepRekeyReport};
use snapshots::{add_snapshot, delete_snapshot_locked, NewSnapshot};

pub use crate::store::{
    LOG_BUFFER_BYTES_MAX, LOG_BYTES_MAX, PUNCH_MIN_GRAINS, RECLAIM_STEP_GRAINS,
};
pub use groups::{
    check_group_size, clone_name, clone_plan, group_full, last_disk, membership_changed,
    GroupSnapshotOptions,
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

/// How background space work (convert, punchzero) runs.
#[derive(Clone, Default)]
pub struct SpaceWork {
    /// Bytes per second to scan or fill at most (None: as fast as clients
    /// leave room for).
    pub rate_bytes_per_sec: Option<u64>,
    /// Pause / resume / cancel from outside (a server's job list).
    pub control: Option<Arc<WorkControl>>,
}

/// A byte range where two versions differ (see `Datastore::changed_ranges`).
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct ChangedRange {
    pub offset: u64,
    pub len: u64,
    /// The newer version maps data here (false: it reads zeros).
    pub mapped: bool,
}

/// A datastore opened for reading and writing. Cheap to clone.
#[derive(Clone)]
pub struct Datastore {
    pub(crate) inner: Arc<Store>,
}

impl Datastore {
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
            logical_bytes: Some(m.logical_grains() * GRAIN_BYTES),
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

    /// The state each alarm was in when a server last reported it.
    pub fn alarms_reported(&self) -> ReportedAlarms {
        self.inner.meta.lock().catalog.alarms_reported.clone()
    }

    /// Record that a server reported alarm `kind` in `state`, in the
    /// catalog (FORMAT.md §6 `alarms_reported`); durable when this
    /// returns. Nothing is written when that is what is recorded.
    pub fn set_alarm_reported(&self, kind: AlarmKind, state: AlarmState) -> Result<()> {
        let mut now = self.alarms_reported();
        if !now.set(kind, state) {
            return Ok(());
        }
        self.change(|m| {
            if m.catalog.alarms_reported.set(kind, state) {
                m.mark_catalog_dirty();
            }
            Ok(())
        })?;
        self.inner.commit(false)
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

    fn disk_info_locked(&self, m: &Meta, d: &DiskRec) -> DiskInfo {
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
            parent_deleted: false,
            created_unix: Some(d.created_unix),
            exclusive_bytes: None,
            snapshot_space_bytes: None,
            limits: d.limits,
            fragments: None,
            packed_bytes: None,
            encryption: self.encryption_of(m, d),
        }
    }

    pub fn list_disks(&self) -> Vec<DiskInfo> {
        let m = self.inner.meta.lock();
        let mut v: Vec<DiskInfo> = m
            .catalog
            .disks
            .iter()
            .map(|d| self.disk_info_locked(&m, d))
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// A disk's figures, O(1): `exclusive_bytes` and `snapshot_space_bytes`
    /// are None (see [`Self::disk_info_with_space`]).
    pub fn disk_info(&self, name: &str) -> Result<DiskInfo> {
        let m = self.inner.meta.lock();
        let d = m.catalog.disk(name)?;
        Ok(self.disk_info_locked(&m, d))
    }

    /// A disk's figures with what removing it and deleting its snapshots
    /// would free (docs/FORMAT.md §7): a read-only simulation whose cost
    /// follows the disk's exclusive data, under the metadata lock.
    pub fn disk_info_with_space(&self, name: &str) -> Result<DiskInfo> {
        let mut m = self.inner.meta.lock();
        let d = m.catalog.disk(name)?.clone();
        let mut info = self.disk_info_locked(&m, &d);
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
        let (fragments, packed) = self.disk_fragments(name)?;
        info.fragments = Some(fragments);
        info.packed_bytes = Some(packed);
        Ok(info)
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

    /// Turn zero detection on thin disks' writes on or off (FORMAT.md §7.4).
    pub fn set_detect_zeroes(&self, on: bool) {
        self.inner.detect_zeroes.store(on, Ordering::Relaxed);
    }

    /// Open `DISK` (read-write) or `DISK@SNAP` (read-only) for I/O. An
    /// encrypted disk whose keys this process does not hold is refused
    /// (FORMAT.md §16).
    pub fn open_disk(&self, target: &str) -> Result<Arc<DiskHandle>> {
        self.open_handle(target, true)
    }

    /// A handle for work on the disk's map and layout that reads no data
    /// through it (fragments, defrag: they copy ciphertext as it is), so
    /// a locked disk may be opened; its data path then refuses.
    pub(crate) fn open_keyless(&self, target: &str) -> Result<Arc<DiskHandle>> {
        self.open_handle(target, false)
    }

    fn open_handle(&self, target: &str, need_keys: bool) -> Result<Arc<DiskHandle>> {
        let m = self.inner.meta.lock();
        let (d, snap) = m.catalog.target(target)?;
        let (version, read_only, snapshot_id) = match snap {
            None => (d.head, false, None),
            Some(s) => (s.version, true, Some(s.id)),
        };
        let (cipher, keys) = match self.cipher_of(d) {
            Err(e) if !need_keys && e.kind == ErrorKind::Refused => (None, None),
            r => r?.unzip(),
        };
        let locked = d.keyring.is_some() && cipher.is_none();
        let throttle = self.inner.throttle(d.id, d.limits);
        Ok(Arc::new(DiskHandle {
            cipher,
            keys,
            locked,
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
                format!(
                    "{} disk, {}",
                    d.provisioning.as_str(),
                    strata_api::units::human(d.size_bytes)
                ),
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

    // ------------------------------------------------------------ check

    /// Verify counts, ownership and accounting (DESIGN invariant 3).
    pub fn check(&self) -> Result<CheckReport> {
        let _g = self.inner.gate.write();
        let mut m = self.inner.meta.lock();
        let mut r = check::run(&mut m, &self.inner)?;
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
