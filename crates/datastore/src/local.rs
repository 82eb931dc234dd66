//! The local engine as a [`Datastore`]: every call is the engine's own.

use std::fs::{File, OpenOptions as FsOpen};
use std::io::{Read, Seek, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

use strata_block::BlockDevice;
use strata_storage::FileBackend;

use crate::{
    datastore_view, gauges, AlarmKind, AlarmRule, AlarmState, Background, ChangedRange,
    CheckReport, CompressReport, Datastore, DatastoreInfo, DatastoreView, DedupEstimate,
    DedupReport, DefragReport, DiskInfo, DiskView, Error, ErrorKind, FreeSpaceReport, FullClone,
    Gauge, GroupInfo, GroupSnapshotInfo, GroupSnapshotOptions, IoLimits, Kind, OpenOptions,
    Provisioning, PunchZeroReport, ReportedAlarms, Result, SnapshotInfo, SpaceWork,
};

/// A local datastore (a pool file and its log in a directory).
pub struct LocalDatastore {
    ds: strata_engine::Datastore,
    dir: PathBuf,
}

/// What [`try_lock`] found.
pub enum LockOutcome {
    Locked(File),
    /// Another process holds it; its pid if it wrote one.
    Held(Option<u32>),
}

/// Take a local datastore's lock without waiting, writing this process's
/// pid into the lock file for the next one to name.
pub fn try_lock(dir: &Path) -> Result<LockOutcome> {
    let path = dir.join(strata_format::FILE_LOCK);
    let mut f = FsOpen::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::new(ErrorKind::Io, format!("{}: {e}", path.display())))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let mut s = String::new();
        let _ = f.read_to_string(&mut s);
        return Ok(LockOutcome::Held(s.trim().parse().ok()));
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = write!(f, "{}", std::process::id());
    Ok(LockOutcome::Locked(f))
}

/// `Locked`: another process (a server, or a command run without one)
/// holds the datastore in `dir`, named by its pid where it wrote one.
pub(crate) fn held(dir: &Path, pid: Option<u32>) -> Error {
    let who = pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
    Error::new(
        ErrorKind::Locked,
        format!(
            "datastore {} is already served or in use by another process{who}",
            dir.display()
        ),
    )
}

/// Open a local datastore whose lock the caller holds.
pub fn open_locked(dir: &Path, lock: File, opts: &OpenOptions) -> Result<strata_engine::Datastore> {
    strata_engine::Datastore::open(
        Arc::new(FileBackend::new(dir)),
        &strata_engine::OpenOptions {
            cache_bytes: opts.cache_bytes,
            direct_io: opts.direct_io,
        },
        Some(lock),
    )
}

impl LocalDatastore {
    /// Wrap an open engine datastore found in `dir`.
    pub fn new(ds: strata_engine::Datastore, dir: &Path) -> Self {
        LocalDatastore {
            ds,
            dir: std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()),
        }
    }

    /// Take the lock of the datastore in `dir` (`Locked`, naming the
    /// holder, if another process has it), open it, and start its
    /// background reclaim and commits (unless [`OpenOptions::background`]
    /// is off); a server's settings
    /// ([`OpenOptions::serving`]) apply from the first client on.
    pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Self> {
        let serving = opts.serving.clone().unwrap_or_default();
        if !serving.incoming.disks.is_empty() {
            return Err(Error::new(
                ErrorKind::Refused,
                "--incoming is for object-store datastores (a local datastore has one server, \
                 which moves disks with 'strata move')",
            ));
        }
        let lock = match try_lock(dir)? {
            LockOutcome::Locked(f) => f,
            LockOutcome::Held(pid) => return Err(held(dir, pid)),
        };
        let ds = open_locked(dir, lock, opts)?;
        if opts.background {
            ds.start_reclaimer();
            ds.start_background_commits();
        }
        ds.set_detect_zeroes(serving.detect_zeroes);
        ds.set_placement_regions(serving.placement_regions);
        if serving.ready_ahead > 0 {
            ds.set_ready_bytes(serving.ready_ahead);
            ds.start_readier();
        }
        Ok(LocalDatastore::new(ds, dir))
    }

    pub fn engine(&self) -> &strata_engine::Datastore {
        &self.ds
    }
}

impl Datastore for LocalDatastore {
    fn kind(&self) -> Kind {
        Kind::Local
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn recovered(&self) -> Option<String> {
        match self.ds.replayed_batches() {
            0 => None,
            n => Some(format!(
                "replayed {n} log batches: the last process that had the datastore open did not \
                 close it cleanly"
            )),
        }
    }

    fn disk_info(&self, disk: &str) -> Result<DiskInfo> {
        self.ds.disk_info(disk)
    }

    fn disk_view(&self, disk: &str, with_space: bool) -> Result<DiskView> {
        Ok(if with_space {
            self.ds.disk_info_with_space(disk)?
        } else {
            self.ds.disk_info(disk)?
        }
        .into())
    }

    fn list(&self) -> Result<Vec<DiskView>> {
        Ok(self
            .ds
            .list_disks()
            .into_iter()
            .map(DiskView::from)
            .collect())
    }

    fn status(&self) -> Result<DatastoreView> {
        Ok(datastore_view(
            Kind::Local,
            self.ds.info_with_layout()?,
            None,
        ))
    }

    fn create(
        &self,
        disk: &str,
        size_bytes: u64,
        provisioning: Provisioning,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        Ok(self
            .ds
            .create_disk(disk, size_bytes, provisioning, progress)?
            .into())
    }

    fn create_encrypted(
        &self,
        spec: &crate::EncryptedDisk<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        let slot = crate::new_slot(spec.key);
        let new = strata_engine::NewDisk {
            name: spec.disk,
            size_bytes: spec.size_bytes,
            provisioning: spec.provisioning,
            keys: strata_engine::NewKeys::Fresh(&slot),
        };
        Ok(self.ds.create_disk_with(&new, progress)?.into())
    }

    fn unlock(&self, disk: &str, secret: &[u8]) -> Result<u32> {
        self.ds.unlock(disk, secret)
    }

    fn clone_own_key(
        &self,
        source: &str,
        name: &str,
        key: &strata_api::KeyGrant,
    ) -> Result<DiskView> {
        let slot = crate::new_slot(key);
        Ok(self.ds.clone_linked_own_key(source, name, &slot)?.into())
    }

    fn carried_keys(&self, disk: &str) -> Result<Option<strata_engine::CarriedKeys>> {
        self.ds.carried_keys(disk)
    }

    fn create_carrying(
        &self,
        spec: &crate::CarriedDisk<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        let new = strata_engine::NewDisk {
            name: spec.disk,
            size_bytes: spec.size_bytes,
            provisioning: spec.provisioning,
            keys: strata_engine::NewKeys::Adopt(spec.keys),
        };
        Ok(self.ds.create_disk_with(&new, progress)?.into())
    }

    fn keyring_disks(&self, disk: &str) -> Result<Vec<String>> {
        self.ds.keyring_disks(disk)
    }

    fn lock(&self, disk: &str) -> Result<(Vec<String>, bool)> {
        self.ds.lock(disk)
    }

    fn key_add(&self, disk: &str, new: &strata_api::KeyGrant) -> Result<u32> {
        self.ds.key_add(disk, &crate::new_slot(new))
    }

    fn key_remove(&self, disk: &str, slot: u32) -> Result<()> {
        self.ds.key_remove(disk, slot)
    }

    fn rekey(&self, disk: &str, new: &strata_api::KeyGrant) -> Result<()> {
        self.ds.rekey_shallow(disk, &crate::new_slot(new))
    }

    fn rekey_deep(
        &self,
        disk: &str,
        new: Option<&strata_api::KeyGrant>,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<strata_engine::DeepRekeyReport> {
        let slot = new.map(crate::new_slot);
        self.ds.rekey_deep(disk, slot.as_ref(), work, progress)
    }

    fn remove(&self, disk: &str) -> Result<()> {
        self.ds.remove_disk(disk)
    }

    fn open(&self, target: &str) -> Result<Arc<dyn BlockDevice>> {
        Ok(self.ds.open_disk(target)? as Arc<dyn BlockDevice>)
    }

    fn snapshots(&self, disk: &str) -> Result<Vec<SnapshotInfo>> {
        self.ds.snapshot_list(disk)
    }

    fn snapshot_path(&self, target: &str) -> Result<Vec<String>> {
        // The engine's walk needs no exclusive-bytes figures.
        self.ds.snapshot_path(target)
    }

    fn snapshot_create(
        &self,
        disk: &str,
        snapshot: &str,
        description: &str,
    ) -> Result<SnapshotInfo> {
        self.ds.snapshot_create(disk, snapshot, description)
    }

    fn snapshot_delete(&self, disk: &str, snapshot: &str) -> Result<()> {
        self.ds.snapshot_delete(disk, snapshot)
    }

    fn rename(&self, disk: &str, new: &str) -> Result<DiskView> {
        Ok(self.ds.rename_disk(disk, new)?.into())
    }

    fn snapshot_rename(&self, disk: &str, snapshot: &str, new: &str) -> Result<()> {
        self.ds.snapshot_rename(disk, snapshot, new)
    }

    fn snapshot_revert(&self, disk: &str, snapshot: &str) -> Result<()> {
        self.ds.snapshot_revert(disk, snapshot)
    }

    fn extend(&self, disk: &str, size_bytes: u64) -> Result<DiskView> {
        Ok(self.ds.extend_disk(disk, size_bytes)?.into())
    }

    fn set_limits(&self, disk: &str, limits: IoLimits) -> Result<DiskView> {
        Ok(self.ds.set_limits(disk, limits)?.into())
    }

    fn punch_zero(
        &self,
        disk: &str,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<PunchZeroReport> {
        self.ds.punch_zero(disk, work, progress)
    }

    fn space(&self) -> Result<DatastoreInfo> {
        Ok(self.ds.info())
    }

    fn set_capacity(&self, bytes: u64) -> Result<DatastoreInfo> {
        self.ds.set_capacity(bytes)
    }

    fn alarm_rules(&self) -> Result<Vec<AlarmRule>> {
        Ok(self.ds.alarm_rules())
    }

    fn set_alarm(&self, rule: AlarmRule) -> Result<AlarmRule> {
        self.ds.set_alarm(rule)
    }

    fn alarms_reported(&self) -> Result<ReportedAlarms> {
        Ok(self.ds.alarms_reported())
    }

    fn set_alarm_reported(&self, kind: AlarmKind, state: AlarmState) -> Result<()> {
        self.ds.set_alarm_reported(kind, state)
    }

    fn clone_linked(&self, source: &str, name: &str) -> Result<DiskView> {
        Ok(self.ds.clone_linked(source, name)?.into())
    }

    fn changed_ranges(&self, from: Option<&str>, to: &str) -> Result<Vec<ChangedRange>> {
        self.ds.changed_ranges(from, to)
    }

    fn group_create(
        &self,
        name: &str,
        disks: &[String],
        quiesce_hook: Option<String>,
        quiesce_timeout_s: Option<u64>,
    ) -> Result<GroupInfo> {
        self.ds
            .group_create(name, disks, quiesce_hook, quiesce_timeout_s)
    }

    fn group_delete(&self, name: &str) -> Result<()> {
        self.ds.group_delete(name)
    }

    fn group_member(&self, name: &str, disk: &str, add: bool) -> Result<GroupInfo> {
        self.ds.group_member(name, disk, add)
    }

    fn groups(&self) -> Result<Vec<GroupInfo>> {
        Ok(self.ds.groups())
    }

    fn group_info(&self, name: &str) -> Result<GroupInfo> {
        self.ds.group_info(name)
    }

    fn group_snapshot_create(
        &self,
        group: &str,
        snapshot: &str,
        opts: &GroupSnapshotOptions,
    ) -> Result<GroupSnapshotInfo> {
        self.ds.group_snapshot_create(group, snapshot, opts)
    }

    fn group_snapshots(&self, group: &str) -> Result<Vec<GroupSnapshotInfo>> {
        self.ds.group_snapshots(group, true)
    }

    fn group_snapshot_delete(&self, group: &str, snapshot: &str) -> Result<()> {
        self.ds.group_snapshot_delete(group, snapshot)
    }

    fn group_snapshot_revert(&self, group: &str, snapshot: &str) -> Result<()> {
        self.ds.group_snapshot_revert(group, snapshot)
    }

    fn group_clone(
        &self,
        source: &str,
        name: &str,
        renames: &[(String, String)],
    ) -> Result<GroupInfo> {
        self.ds.group_clone(source, name, renames)
    }

    fn export_names(&self) -> Vec<(String, String)> {
        self.ds.export_names()
    }

    fn close(&self) -> Result<()> {
        self.ds.close()
    }

    fn clone_full_within(
        &self,
        c: &FullClone<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Option<Result<DiskView>> {
        Some(self.ds.clone_full(c, progress).map(DiskView::from))
    }

    fn check(&self) -> Result<CheckReport> {
        self.ds.check().map(CheckReport::Local)
    }

    fn convert_disk(
        &self,
        disk: &str,
        to: Provisioning,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        Ok(self.ds.convert_disk(disk, to, work, progress)?.into())
    }

    fn defrag_disk(
        &self,
        disk: &str,
        dry_run: bool,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DefragReport> {
        self.ds.defrag_disk(disk, dry_run, work, progress)
    }

    fn dedup_estimate(
        &self,
        disks: &[String],
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DedupEstimate> {
        self.ds.dedup_estimate(disks, work, progress)
    }

    fn share_from(&self, base: &str, new: &str) -> Result<DiskView> {
        Ok(self.ds.share_from(base, new)?.into())
    }

    fn dedup(
        &self,
        disks: &[String],
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DedupReport> {
        self.ds.dedup(disks, work, progress)
    }

    fn compress(
        &self,
        disks: &[String],
        codec: strata_api::PackCodec,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CompressReport> {
        self.ds.compress(disks, codec, work, progress)
    }

    fn consolidate_free_space(
        &self,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FreeSpaceReport> {
        self.ds.consolidate_free_space(work, progress)
    }

    fn gauges(&self) -> Vec<Gauge> {
        let i = self.ds.info();
        let mut g = gauges::space(&i);
        g.extend(gauges::local(&self.ds, &i));
        g
    }

    fn stored_bytes(&self, disk: &str) -> Option<u64> {
        if disk.contains('@') {
            return None;
        }
        self.ds.disk_info(disk).ok().and_then(|d| d.allocated_bytes)
    }

    fn start_background(
        self: Arc<Self>,
        background: &Background,
        stop: &Arc<AtomicBool>,
    ) -> Vec<JoinHandle<()>> {
        let free_space = background.free_space_threshold.map(|threshold| {
            crate::background::spawn_free_space_policy(
                self.ds.clone(),
                stop.clone(),
                background.control.clone(),
                threshold,
            )
        });
        free_space.into_iter().collect()
    }
}
