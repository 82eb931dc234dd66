//! Disk operations: create, remove, limits, extend, convert between
//! provisioning types, and punchzero. Each is one or a few catalog changes;
//! the zero fill itself runs on the disk's I/O path.

use strata_format::GRAIN_BYTES;

use strata_api::Provisioning;

use crate::catalog::{check_name, DiskRec, SnapshotRec};
use crate::error::{err, ErrorKind, Result};
use crate::store::{now_unix, SpaceRequest};
use crate::throttle::IoLimits;
use crate::work::Pacer;

use super::keys::NewKeys;
use super::{Datastore, DiskInfo, PunchZeroReport, SpaceWork};

/// A disk to create (`Datastore::create_disk_with`).
pub struct NewDisk<'a> {
    pub name: &'a str,
    pub size_bytes: u64,
    pub provisioning: Provisioning,
    pub keys: NewKeys<'a>,
}

/// A change of disk `name`'s provisioning from `from` to `to`.
#[derive(Clone, Copy)]
struct Conversion<'n> {
    name: &'n str,
    from: Provisioning,
    to: Provisioning,
}

impl Datastore {
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
        let spec = NewDisk {
            name,
            size_bytes,
            provisioning,
            keys: NewKeys::Plain,
        };
        self.create_disk_with(&spec, progress)
    }

    /// Create a disk, encrypted when `spec.keys` says so (FORMAT.md §16):
    /// the keyring and the disk enter the catalog in one record, and the
    /// new disk's keys are held, so it is unlocked in this process.
    pub fn create_disk_with(
        &self,
        spec: &NewDisk<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskInfo> {
        let (name, size_bytes, provisioning) = (spec.name, spec.size_bytes, spec.provisioning);
        check_name("disk", name)?;
        Self::check_size(size_bytes)?;
        self.inner.check_writable()?;
        self.inner.meta.lock().catalog.name_free(name)?;
        let mut keys = self.prepare_keys(spec.keys, name)?;
        let held = self.change(|m| {
            m.catalog.name_free(name)?;
            if provisioning.is_thick() {
                let grains = size_bytes.div_ceil(GRAIN_BYTES);
                self.inner.reserve_thick(m, grains)?;
            }
            let keyring = keys.take().map(|(k, u)| (Self::install_keyring(m, k), u));
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
                keyring: keyring.as_ref().map(|k| k.0),
            });
            m.mark_catalog_dirty();
            Ok(keyring)
        })?;
        if let Some((id, u)) = held {
            self.hold_keys(name, id, u)?;
        }
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
            // Its keyring goes with it unless a linked clone shares it.
            m.catalog.drop_unused_keyrings();
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.forget_unused_keys();
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

    /// Rename disk `old` to `new`, also while it is served: open handles
    /// hold the disk by its id, so its clients go on. Linked clones made
    /// from its snapshots show the new name in their parent. One catalog
    /// change (FORMAT.md §6): after a crash the disk has one name or the
    /// other.
    pub fn rename_disk(&self, old: &str, new: &str) -> Result<DiskInfo> {
        check_name("disk", new)?;
        self.inner.check_writable()?;
        self.change(|m| {
            m.catalog.disk(old)?;
            if old != new {
                m.catalog.name_free(new)?;
            }
            m.catalog.disk_mut(old)?.name = new.to_string();
            let from = |p: &str| p.strip_prefix(old)?.strip_prefix('@').map(str::to_string);
            for d in &mut m.catalog.disks {
                if let Some(snap) = d.parent.as_deref().and_then(from) {
                    d.parent = Some(format!("{new}@{snap}"));
                }
            }
            m.mark_catalog_dirty();
            Ok(())
        })?;
        self.inner.commit(false)?;
        self.disk_info(new)
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
                        "'{name}' is {}; extend only grows a disk",
                        strata_api::units::human_exact(d.size_bytes)
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
        let from = self.disk_info(name)?.provisioning;
        // The scan's last progress, for what a stopped one leaves.
        let mut scanned = (0, 0);
        let mut seen = |done, total| {
            scanned = (done, total);
            progress(done, total)
        };
        let c = Conversion { name, from, to };
        if let Err(e) = self.convert_steps(&c, &mut seen, &mut pacer) {
            let stopped = opts.control.as_deref().and_then(|w| w.stopped_by(&e));
            return Err(self.convert_left(&c, scanned, e, stopped));
        }
        // Like every metadata command, durable when it returns (also when
        // there was nothing to change).
        self.inner.commit(false)?;
        self.disk_info(name)
    }

    /// The steps of conversion `c`, each leaving a consistent disk.
    fn convert_steps(
        &self,
        c: &Conversion<'_>,
        progress: &mut dyn FnMut(u64, u64),
        pacer: &mut Pacer<'_>,
    ) -> Result<()> {
        let Conversion { name, from, to } = *c;
        match to {
            Provisioning::Thin => {
                if from.is_thick() {
                    self.set_provisioning(name, Provisioning::Thin)?;
                }
                let h = self.open_disk(name)?;
                let mut clients = self.inner.client_watch();
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
                self.fill_and_mark_eager(name, progress, pacer)?;
            }
        }
        Ok(())
    }

    /// The error of conversion `c` that stopped with `e` (cancelled:
    /// `stopped` says by whom): what the disk is now, each step having
    /// left a consistent disk, and how to finish. `scanned`: the last
    /// progress of a scan for zero blocks.
    fn convert_left(
        &self,
        c: &Conversion<'_>,
        scanned: (u64, u64),
        e: crate::Error,
        stopped: Option<String>,
    ) -> crate::Error {
        let Conversion { name, from, to } = *c;
        let Ok(now) = self.disk_info(name) else {
            return e;
        };
        let is = match now.provisioning {
            p if p == from => format!("'{name}' stays {}", p.as_str()),
            p => format!("'{name}' is {} now", p.as_str()),
        };
        let pct = |done: u64, total: u64| (done * 100).checked_div(total).unwrap_or(100);
        let what = match (now.provisioning, to) {
            (Provisioning::Thin, Provisioning::Thin) => {
                let released = if from.is_thick() {
                    "no space reserved for it any more, "
                } else {
                    ""
                };
                let part = pct(scanned.0, scanned.1);
                format!(" ({released}{part} % of it scanned for zero blocks to release)")
            }
            (Provisioning::Zeroedthick, Provisioning::Eagerzeroedthick) => {
                let (nb, tbz) = (now.nb.unwrap_or(0), now.tbz.unwrap_or(0));
                let part = pct(nb - tbz.min(nb), nb);
                format!(" (its blocks reserved, {part} % of them zeroed)")
            }
            _ => String::new(),
        };
        let again = format!(
            "run 'strata convert {name} --type {}' again to finish",
            to.as_str()
        );
        match stopped {
            Some(why) => crate::Error::new(e.kind, format!("{why}: {is}{what}; {again}")),
            None => crate::Error::new(e.kind, format!("{e}; {is}{what}; {again}")),
        }
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

    /// One catalog step of a conversion: a thick type reserves what is not
    /// mapped (the host space first), thin releases it.
    fn set_provisioning(&self, name: &str, to: Provisioning) -> Result<()> {
        self.change(|m| {
            let d = m.catalog.disk(name)?.clone();
            if to.is_thick() && !d.provisioning.is_thick() {
                let grains = m.unwritten_grains(&d);
                self.inner.reserve_thick(m, grains)?;
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
}
