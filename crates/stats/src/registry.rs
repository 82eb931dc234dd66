//! Name → statistics map for every disk a process serves.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::RwLock;
use strata_api::stats::StatsSnapshot;

use crate::disk::DiskStats;

/// Maps a disk or export name to its [`DiskStats`].
///
/// The lock is taken only when a connection looks its disk up and when
/// statistics are listed, reset or removed; never per I/O.
#[derive(Debug)]
pub struct StatsRegistry {
    disks: RwLock<BTreeMap<String, Arc<DiskStats>>>,
    /// Whether statistics created from now on record (see
    /// [`StatsRegistry::set_recording_all`]).
    recording: AtomicBool,
}

impl Default for StatsRegistry {
    fn default() -> Self {
        Self {
            disks: RwLock::default(),
            recording: AtomicBool::new(true),
        }
    }
}

impl StatsRegistry {
    pub fn new() -> Self {
        Self::default()
    }

    /// The statistics of `name`, created empty on first use.
    pub fn get_or_create(&self, name: &str) -> Arc<DiskStats> {
        if let Some(stats) = self.disks.read().get(name) {
            return Arc::clone(stats);
        }
        Arc::clone(
            self.disks
                .write()
                .entry(name.to_string())
                .or_insert_with(|| {
                    let stats = DiskStats::new();
                    stats.set_recording(self.recording.load(Relaxed));
                    Arc::new(stats)
                }),
        )
    }

    /// The statistics of `name`, if it has any.
    pub fn get(&self, name: &str) -> Option<Arc<DiskStats>> {
        self.disks.read().get(name).cloned()
    }

    /// Every name, sorted.
    pub fn list(&self) -> Vec<String> {
        self.disks.read().keys().cloned().collect()
    }

    /// Every name with its statistics, sorted by name.
    pub fn entries(&self) -> Vec<(String, Arc<DiskStats>)> {
        self.disks
            .read()
            .iter()
            .map(|(name, stats)| (name.clone(), Arc::clone(stats)))
            .collect()
    }

    /// A snapshot of `name`, if it has statistics.
    pub fn snapshot(&self, name: &str) -> Option<StatsSnapshot> {
        self.get(name).map(|s| s.snapshot())
    }

    /// A snapshot of every disk, sorted by name.
    pub fn snapshot_all(&self) -> Vec<(String, StatsSnapshot)> {
        let disks: Vec<(String, Arc<DiskStats>)> = self
            .disks
            .read()
            .iter()
            .map(|(name, stats)| (name.clone(), Arc::clone(stats)))
            .collect();
        disks
            .into_iter()
            .map(|(name, stats)| (name, stats.snapshot()))
            .collect()
    }

    /// Zero the statistics of `name`; false if it has none.
    pub fn reset(&self, name: &str) -> bool {
        match self.get(name) {
            Some(stats) => {
                stats.reset();
                true
            }
            None => false,
        }
    }

    /// Zero the statistics of every disk.
    pub fn reset_all(&self) {
        for stats in self.disks.read().values() {
            stats.reset();
        }
    }

    /// Pause or resume every disk's recording, and that of disks first used
    /// from now on ([`DiskStats::set_recording`]).
    pub fn set_recording_all(&self, on: bool) {
        let disks = self.disks.read();
        self.recording.store(on, Relaxed);
        for stats in disks.values() {
            stats.set_recording(on);
        }
    }

    /// Forget `name`. Devices still holding its `Arc<DiskStats>` keep
    /// recording into it, unseen; a later `get_or_create` starts afresh.
    pub fn remove(&self, name: &str) -> Option<Arc<DiskStats>> {
        self.disks.write().remove(name)
    }

    /// The statistics of each name `rename` maps to a new one are listed
    /// under that name from now on (a renamed disk or snapshot: its
    /// devices keep recording into them).
    pub fn rename(&self, rename: &dyn Fn(&str) -> Option<String>) {
        let mut disks = self.disks.write();
        let moved: Vec<(String, String)> = disks
            .keys()
            .filter_map(|k| Some((k.clone(), rename(k)?)))
            .collect();
        for (old, new) in moved {
            if let Some(s) = disks.remove(&old) {
                disks.insert(new, s);
            }
        }
    }

    /// Forget disk `disk` and its snapshots' exports (`DISK@SNAP`), as
    /// [`StatsRegistry::remove`] forgets one name: for a removed disk, or
    /// a new one whose name an old disk had.
    pub fn remove_disk(&self, disk: &str) {
        let prefix = format!("{disk}@");
        self.disks
            .write()
            .retain(|name, _| name != disk && !name.starts_with(&prefix));
    }
}
