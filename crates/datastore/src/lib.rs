//! One interface over both kinds of datastore.
//!
//! A datastore is a local one (`strata-engine`: a pool file, one
//! refcounted map per disk version) or a directory attached to an object
//! store (`strata-objstore`: segments and create-only manifests in a bucket,
//! one writer per disk). Their layouts have nothing in common, and neither
//! crate knows the other or this one. Everything above them — the server,
//! jobs, moves, transports, statistics — reaches disks through the
//! [`Datastore`] trait, implemented here by an adapter for each kind
//! ([`LocalDatastore`], [`ObjectStoreDatastore`]), so it is written once.
//!
//! A trait rather than an enum over the two: code above never matches on
//! the kind (a third kind, or a test double, touches nothing above), and
//! what a kind cannot do is answered by one table ([`capability`]) with a
//! reason for each refusal, as QEMU's block layer answers `-ENOTSUP` for a
//! driver's missing callback from one place.
//!
//! [`open`] is the one place that tells the kinds apart by what a
//! directory holds (`strata.super` or `strata.objstore`).
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

mod alarms;
mod background;
pub mod capability;
mod gauges;
mod local;
mod object_store;
mod object_store_groups;
mod object_store_keys;
mod punch;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use strata_api::store::Summary;
use strata_block::BlockDevice;

pub use background::Background;
pub use capability::Capability;
pub use local::{open_locked, try_lock, LocalDatastore, LockOutcome};
pub use object_store::{clone_source, Incoming, ObjectStoreDatastore};
pub use strata_engine::{
    AlarmKind, AlarmRule, AlarmState, ChangedRange, CompressReport, Consistency, DatastoreInfo,
    DedupEstimate, DedupReport, DefragReport, DiskInfo, Error, ErrorKind, FreeSpaceReport,
    FullClone, GroupInfo, GroupMemberInfo, GroupSnapshotInfo, GroupSnapshotOptions, IoLimits,
    Provisioning, PunchZeroReport, QuiesceReport, QuiesceResult, ReportedAlarms, Result,
    SnapshotInfo, SpaceWork,
};
// strata-api's vocabulary, in the trait's signatures: a disk and a
// datastore of either kind, and an object store's own answers.
pub use strata_api::store::{CompactReport, GcReport};
pub use strata_api::view::{DatastoreView, DiskView, Refusal, StoreDisk};
pub use strata_objstore::disk::{AutoCompact, CompactOptions};
pub use strata_stats::Gauge;

/// What `check` found, by kind: their layouts have nothing in common, so
/// neither do their findings.
#[derive(Debug)]
pub enum CheckReport {
    /// A local datastore's pool, log, maps and refcounts.
    Local(strata_engine::CheckReport),
    /// An object store's manifests, roots and segments.
    ObjectStore(strata_api::store::CheckReport),
}

/// The two kinds of datastore. For display, records and the capability
/// table, never for control flow above this crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Kind {
    /// A local datastore (`strata init DIR`).
    #[serde(rename = "local")]
    Local,
    /// A directory attached to an object store (`strata init|attach
    /// --object-store URL`). Serialised as "object-store"; "shared", the
    /// name placement files of earlier builds carry, reads as it too.
    #[serde(rename = "object-store", alias = "shared")]
    ObjectStore,
}

impl Kind {
    /// For messages: "local datastore", "object-store datastore".
    pub fn noun(self) -> &'static str {
        match self {
            Kind::Local => "local datastore",
            Kind::ObjectStore => "object-store datastore",
        }
    }

    /// For logs and JSON: "local", "object-store".
    pub fn name(self) -> &'static str {
        match self {
            Kind::Local => "local",
            Kind::ObjectStore => "object-store",
        }
    }

    /// What a server's clean stop does to a datastore of this kind, for
    /// its banner.
    pub fn on_stop(self) -> &'static str {
        match self {
            Kind::Local => "flushes and checkpoints",
            Kind::ObjectStore => "flushes",
        }
    }
}

/// `info` of a datastore of `kind` as `status` answers it, with what the
/// kind cannot do (the capability table, [`capability::refusals`]).
pub fn datastore_view(
    kind: Kind,
    info: DatastoreInfo,
    object_store: Option<Summary>,
) -> DatastoreView {
    DatastoreView {
        info,
        cannot: capability::refusals(kind)
            .iter()
            .map(|(c, why)| Refusal {
                command: c.command().to_string(),
                reason: why.to_string(),
            })
            .collect(),
        object_store,
        clients: Vec::new(),
    }
}

/// The refusal of a kind without consistency groups.
fn groups_refused(kind: Kind) -> Error {
    capability::check(kind, Capability::Groups)
        .err()
        .unwrap_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!("consistency groups are not built for a {}", kind.noun()),
            )
        })
}

/// Renames are built for local datastores; an object store's names are
/// objects every host reads (`names/NAME`, FORMAT.md §11.2) and its
/// clones' manifests carry their parent's name, so a rename there needs
/// its own crash and multi-host analysis first.
fn rename_not_built(kind: Kind) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!(
            "renaming is not built yet for a {} (docs/MULTIHOST.md)",
            kind.noun()
        ),
    )
}

/// Encryption is built for local datastores; an object store's segments
/// and manifests need their own layout first (FORMAT.md §16.7).
fn encryption_not_built(kind: Kind) -> Error {
    Error::new(
        ErrorKind::Unsupported,
        format!(
            "encryption is not built yet for a {} (docs/FORMAT.md §16.7)",
            kind.noun()
        ),
    )
}

/// A keyslot for a secret given to a command (FORMAT.md §16.2: the KDF
/// follows from the secret's length; Argon2id at its defaults).
pub(crate) fn new_slot(key: &strata_api::KeyGrant) -> strata_crypt::NewSlot<'_> {
    strata_crypt::NewSlot {
        secret: key.secret.expose(),
        source: &key.source,
        label: key.label.as_deref(),
        argon2: Default::default(),
        now_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    }
}

fn not_encrypted(disk: &str) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!("disk '{disk}' is not encrypted"),
    )
}

/// An encrypted disk to create ([`Datastore::create_encrypted`]).
pub struct EncryptedDisk<'a> {
    pub disk: &'a str,
    pub size_bytes: u64,
    pub provisioning: Provisioning,
    pub key: &'a strata_api::KeyGrant,
}

/// A disk created with the keys of a disk of another datastore
/// ([`Datastore::create_carrying`]).
pub struct CarriedDisk<'a> {
    pub disk: &'a str,
    pub size_bytes: u64,
    pub provisioning: Provisioning,
    pub keys: &'a strata_engine::CarriedKeys,
}

/// A datastore, whichever its kind. Disks are named `DISK`; a snapshot is
/// `DISK@SNAP` wherever a target is asked for.
pub trait Datastore: Send + Sync {
    fn kind(&self) -> Kind;

    /// The directory it was opened from (canonical).
    fn dir(&self) -> &Path;

    /// What opening it recovered from, when the last process that had it
    /// open did not close it cleanly (a local datastore's log replay);
    /// None after a clean close, and for a kind that cannot tell.
    fn recovered(&self) -> Option<String> {
        None
    }

    /// Ok if this kind can do `what`, else an `Unsupported` error that says why
    /// (one table: [`capability::refusal`]).
    fn supports(&self, what: Capability) -> Result<()> {
        capability::check(self.kind(), what)
    }

    /// Whether a disk of this name exists.
    fn exists(&self, disk: &str) -> bool {
        self.disk_info(disk).is_ok()
    }

    /// The disk as it is now (the figures that cost a map walk left out).
    fn disk_info(&self, disk: &str) -> Result<DiskInfo>;

    /// The disk as commands answer it; `with_space`: with the figures that
    /// cost a walk of its map (a local disk's exclusive bytes, snapshot
    /// space and fragments), as `info` shows them.
    fn disk_view(&self, disk: &str, with_space: bool) -> Result<DiskView>;

    /// Every disk, in name order (no figure that costs a map walk).
    fn list(&self) -> Result<Vec<DiskView>>;

    /// What `status` shows: the datastore's space, alarms and layout.
    fn status(&self) -> Result<DatastoreView>;

    /// Create a disk. `progress(done, total)` is called while an
    /// eager-zeroed disk is written.
    fn create(
        &self,
        disk: &str,
        size_bytes: u64,
        provisioning: Provisioning,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView>;

    /// Create an encrypted disk with a first keyslot for `key`
    /// (docs/FORMAT.md §16); unlocked in this process once made.
    fn create_encrypted(
        &self,
        spec: &EncryptedDisk<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        let _ = (spec, progress);
        Err(encryption_not_built(self.kind()))
    }

    /// A linked clone of `source` (`DISK@SNAP`, an encrypted disk) with a
    /// key of its own for its writes and a first keyslot for `key`
    /// (docs/FORMAT.md §16.4); unlocked in this process once made.
    fn clone_own_key(
        &self,
        source: &str,
        name: &str,
        key: &strata_api::KeyGrant,
    ) -> Result<DiskView> {
        let _ = (source, name, key);
        Err(encryption_not_built(self.kind()))
    }

    /// Open an encrypted disk's keys with `secret` and hold them in this
    /// process; the keyslot that opened.
    fn unlock(&self, disk: &str, secret: &[u8]) -> Result<u32> {
        let _ = secret;
        Err(not_encrypted(disk))
    }

    /// An encrypted disk's keys to carry into another datastore (`move`,
    /// `clone --full --to`); None for a plain disk. A kind that cannot
    /// encrypt has none to give.
    fn carried_keys(&self, disk: &str) -> Result<Option<strata_engine::CarriedKeys>> {
        match self.disk_info(disk)?.encryption {
            None => Ok(None),
            Some(_) => Err(encryption_not_built(self.kind())),
        }
    }

    /// Create a disk that adopts carried keys: the same keyslots and data
    /// keys as the disk they came from, unlocked in this process.
    fn create_carrying(
        &self,
        spec: &CarriedDisk<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        let _ = (spec, progress);
        Err(encryption_not_built(self.kind()))
    }

    /// The disks sharing an encrypted disk's keyring (its lineage).
    fn keyring_disks(&self, disk: &str) -> Result<Vec<String>> {
        Err(not_encrypted(disk))
    }

    /// Forget an encrypted disk's keys in this process (`strata lock`):
    /// the disks sharing its keyring, and whether keys were held.
    fn lock(&self, disk: &str) -> Result<(Vec<String>, bool)> {
        Err(not_encrypted(disk))
    }

    /// An encrypted disk's cipher, keyslots and whether it is locked.
    fn keys(&self, disk: &str) -> Result<strata_api::Encryption> {
        self.disk_info(disk)?
            .encryption
            .ok_or_else(|| not_encrypted(disk))
    }

    /// Add a keyslot for `new` (the disk unlocked); its number.
    fn key_add(&self, disk: &str, new: &strata_api::KeyGrant) -> Result<u32> {
        let _ = new;
        Err(not_encrypted(disk))
    }

    /// Remove keyslot `slot` (the disk unlocked; never the last).
    fn key_remove(&self, disk: &str, slot: u32) -> Result<()> {
        let _ = slot;
        Err(not_encrypted(disk))
    }

    /// Replace every keyslot by one for `new` (the disk unlocked).
    fn rekey(&self, disk: &str, new: &strata_api::KeyGrant) -> Result<()> {
        let _ = new;
        Err(not_encrypted(disk))
    }

    /// Deep rekey (FORMAT.md §16.4): with `new`, a new data key and one
    /// keyslot for `new`, then the data re-encrypted online; without,
    /// resume the one under way.
    fn rekey_deep(
        &self,
        disk: &str,
        new: Option<&strata_api::KeyGrant>,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<strata_engine::DeepRekeyReport> {
        let _ = (new, work, progress);
        Err(not_encrypted(disk))
    }

    /// Remove the disk and its snapshots.
    fn remove(&self, disk: &str) -> Result<()>;

    /// `DISK` (read-write) or `DISK@SNAP` (read-only) as a device for I/O.
    /// An object-store disk has one handle per process (its unflushed
    /// writes and its claim), which every caller shares.
    fn open(&self, target: &str) -> Result<Arc<dyn BlockDevice>>;

    /// The disk's snapshots, parents before children.
    fn snapshots(&self, disk: &str) -> Result<Vec<SnapshotInfo>>;

    /// The snapshots from the root of `target`'s tree down to its version,
    /// oldest first: for `DISK`, the path to its current snapshot; for
    /// `DISK@SNAP`, the path to SNAP's parent (what a chain export writes
    /// below it).
    fn snapshot_path(&self, target: &str) -> Result<Vec<String>> {
        let (disk, snap) = strata_format::split_target(target);
        let snaps = self.snapshots(disk)?;
        let find = |n: &str| snaps.iter().find(|s| s.name == n);
        let mut cur = match snap {
            None => snaps.iter().find(|s| s.current).map(|s| s.name.clone()),
            Some(n) => find(n)
                .ok_or_else(|| {
                    Error::new(
                        ErrorKind::NotFound,
                        format!("disk '{disk}' has no snapshot '{n}'"),
                    )
                })?
                .parent
                .clone(),
        };
        let mut path = Vec::new();
        while let Some(n) = cur {
            if path.len() > snaps.len() {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!("disk '{disk}': snapshot parents form a loop"),
                ));
            }
            cur = find(&n).and_then(|s| s.parent.clone());
            path.push(n);
        }
        path.reverse();
        Ok(path)
    }

    fn snapshot_create(
        &self,
        disk: &str,
        snapshot: &str,
        description: &str,
    ) -> Result<SnapshotInfo>;

    fn snapshot_delete(&self, disk: &str, snapshot: &str) -> Result<()>;

    /// Rename disk `disk` to `new`, also while it is served (its clients
    /// go on); linked clones' parents follow.
    fn rename(&self, disk: &str, new: &str) -> Result<DiskView> {
        let _ = (disk, new);
        Err(rename_not_built(self.kind()))
    }

    /// Rename snapshot `disk@snapshot` to `disk@new`; linked clones'
    /// parents follow.
    fn snapshot_rename(&self, disk: &str, snapshot: &str, new: &str) -> Result<()> {
        let _ = (disk, snapshot, new);
        Err(rename_not_built(self.kind()))
    }

    /// Make the disk's live state equal to the snapshot again.
    fn snapshot_revert(&self, disk: &str, snapshot: &str) -> Result<()>;

    /// Grow disk `disk` to `size_bytes` while it is served: connected
    /// clients see the new size (vhost-user-blk is told; NBD clients see
    /// it when they reconnect).
    fn extend(&self, disk: &str, size_bytes: u64) -> Result<DiskView>;

    /// Set disk `disk`'s I/O limits (`IoLimits::default()` clears them):
    /// kept with the disk, obeyed at once by every handle of it (and of
    /// its snapshots) in this process, whatever transport serves them.
    fn set_limits(&self, disk: &str, limits: IoLimits) -> Result<DiskView>;

    /// Release the grains of disk `disk` that read all zeros (a thin
    /// disk's space given back); paced and paused through `work`.
    fn punch_zero(
        &self,
        disk: &str,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<PunchZeroReport>;

    /// The datastore's space and its alarms as evaluated now (`grow`,
    /// `alarm list`, `status`).
    fn space(&self) -> Result<DatastoreInfo>;

    /// [`Self::space`], or figures evaluated no longer than `max_age` ago
    /// where evaluating them costs requests (an object store lists its
    /// disks and reads each one's manifest): for what asks often, the
    /// server's alarm watcher, metrics scrapes and `statfs` of its FUSE
    /// mount. A local datastore's figures are counters, always current.
    fn space_recent(&self, max_age: Duration) -> Result<DatastoreInfo> {
        let _ = max_age;
        self.space()
    }

    /// The datastore's Prometheus gauges: its space and alarms (from
    /// [`Self::space_recent`]), and what its kind measures besides (a
    /// local pool's layout and each disk's fragments; an object store's
    /// open disks, segment cache, store requests and last GC).
    fn gauges(&self) -> Vec<Gauge>;

    /// The bytes `disk` holds where that is a counter read without I/O
    /// (a local disk's allocated grains), else None: what a file system
    /// listing of the disk shows as its blocks.
    fn stored_bytes(&self, disk: &str) -> Option<u64> {
        let _ = disk;
        None
    }

    /// Start what a server runs in the background for this kind (see
    /// [`Background`]) until `stop` is set; the caller joins the threads.
    fn start_background(
        self: Arc<Self>,
        background: &Background,
        stop: &Arc<AtomicBool>,
    ) -> Vec<JoinHandle<()>> {
        let _ = (background, stop);
        Vec::new()
    }

    /// How a server's banner names it ("datastore DIR", "object-store
    /// datastore URL as host NAME (ADDRESS)").
    fn describe(&self) -> String {
        format!("datastore {}", self.dir().display())
    }

    /// What a server's banner says about serving this datastore, line by
    /// line (an object store: that a disk is claimed by its first write).
    fn serving_notes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Set the capacity alarms measure against: a local datastore's size
    /// (0: follow the file system again), an object store's figure set by
    /// the user (0: none).
    fn set_capacity(&self, bytes: u64) -> Result<DatastoreInfo>;

    /// Every alarm's rule (the default where none was set).
    fn alarm_rules(&self) -> Result<Vec<AlarmRule>>;

    /// Set one alarm's thresholds and command; durable when this returns.
    fn set_alarm(&self, rule: AlarmRule) -> Result<AlarmRule>;

    /// The state each alarm was in when a server last reported it (kept
    /// with the rules: FORMAT.md §6, §11.8), so that the next server
    /// reports only what changed since.
    fn alarms_reported(&self) -> Result<ReportedAlarms>;

    /// Record that a server reported alarm `kind` in `state`; durable
    /// when this returns.
    fn set_alarm_reported(&self, kind: AlarmKind, state: AlarmState) -> Result<()>;

    /// A new disk `name` that shares `source`'s data (`DISK@SNAP`; a local
    /// datastore also takes a plain `DISK`).
    fn clone_linked(&self, source: &str, name: &str) -> Result<DiskView>;

    /// Where target `to` differs from `from` (None: an all-zero disk),
    /// both `DISK` or `DISK@SNAP` of one disk, in ascending order.
    fn changed_ranges(&self, from: Option<&str>, to: &str) -> Result<Vec<ChangedRange>>;

    // Consistency groups (docs/BACKUP.md). A kind without them refuses
    // through the capability table.

    /// A group of `disks`, each in no other group.
    fn group_create(
        &self,
        name: &str,
        disks: &[String],
        quiesce_hook: Option<String>,
        quiesce_timeout_s: Option<u64>,
    ) -> Result<GroupInfo> {
        let _ = (name, disks, quiesce_hook, quiesce_timeout_s);
        Err(groups_refused(self.kind()))
    }
    /// Remove a group without snapshots (its disks stay).
    fn group_delete(&self, name: &str) -> Result<()> {
        let _ = name;
        Err(groups_refused(self.kind()))
    }
    /// Add `disk` to a group, or (`add` false) take it out.
    fn group_member(&self, name: &str, disk: &str, add: bool) -> Result<GroupInfo> {
        let _ = (name, disk, add);
        Err(groups_refused(self.kind()))
    }
    /// Every group (none where a kind has no groups).
    fn groups(&self) -> Result<Vec<GroupInfo>> {
        Ok(Vec::new())
    }
    fn group_info(&self, name: &str) -> Result<GroupInfo> {
        Err(Error::new(
            ErrorKind::NotFound,
            format!("no group named '{name}'"),
        ))
    }
    /// One snapshot of every member at one instant (all or nothing).
    fn group_snapshot_create(
        &self,
        group: &str,
        snapshot: &str,
        opts: &GroupSnapshotOptions,
    ) -> Result<GroupSnapshotInfo> {
        let _ = (group, snapshot, opts);
        Err(groups_refused(self.kind()))
    }
    /// A group's snapshots, oldest first, with what deleting each frees.
    fn group_snapshots(&self, group: &str) -> Result<Vec<GroupSnapshotInfo>> {
        self.group_info(group).map(|_| Vec::new())
    }
    fn group_snapshot_delete(&self, group: &str, snapshot: &str) -> Result<()> {
        let _ = (group, snapshot);
        Err(groups_refused(self.kind()))
    }
    fn group_snapshot_revert(&self, group: &str, snapshot: &str) -> Result<()> {
        let _ = (group, snapshot);
        Err(groups_refused(self.kind()))
    }
    /// Linked clones of every member of `GROUP@SNAP`, grouped as `name`.
    fn group_clone(
        &self,
        source: &str,
        name: &str,
        renames: &[(String, String)],
    ) -> Result<GroupInfo> {
        let _ = (source, name, renames);
        Err(groups_refused(self.kind()))
    }

    /// Ok if `disk` is in no group and holds no member snapshot of a
    /// group snapshot: what removing or moving it away needs (a group
    /// lives in one datastore, its snapshots are deleted as one).
    fn outside_groups(&self, disk: &str) -> Result<()> {
        if let Some(g) = self
            .groups()?
            .into_iter()
            .find(|g| g.disks.iter().any(|d| d == disk))
        {
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "disk '{disk}' is in group '{}': take it out first ('strata group remove {} \
                     {disk}')",
                    g.name, g.name
                ),
            ));
        }
        if let Some(s) = self
            .snapshots(disk)?
            .into_iter()
            .find(|s| s.group.is_some())
        {
            let g = s.group.unwrap_or_default();
            return Err(Error::new(
                ErrorKind::Refused,
                format!(
                    "disk '{disk}' has snapshot '{}' of group snapshot '{g}@{}': delete that \
                     first ('strata group snapshot delete {g} {}')",
                    s.name, s.name, s.name
                ),
            ));
        }
        Ok(())
    }

    /// A full copy of `c.source` (`DISK` or `DISK@SNAP`) as a new disk
    /// `c.name` of this datastore by the kind's own means (a local datastore
    /// copies its grains, skipping what is unmapped); None where the kind
    /// has none, and the caller copies through devices.
    fn clone_full_within(
        &self,
        c: &FullClone<'_>,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Option<Result<DiskView>> {
        let _ = (c, progress);
        None
    }

    /// Verify the datastore's metadata and say what is wrong, if anything.
    fn check(&self) -> Result<CheckReport>;

    // Maintenance that only one kind does; the other refuses it with the
    // reason from the capability table ([`capability::refused`]).

    /// Change `disk`'s provisioning in place (`convert`, [`Capability::Convert`]).
    fn convert_disk(
        &self,
        disk: &str,
        to: Provisioning,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DiskView> {
        let _ = (disk, to, work, progress);
        Err(capability::refused(self.kind(), Capability::Convert))
    }

    /// Lay `disk` out in logical order (`defrag`; `dry_run`: only
    /// measure), [`Capability::Defrag`].
    fn defrag_disk(
        &self,
        disk: &str,
        dry_run: bool,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DefragReport> {
        let _ = (disk, dry_run, work, progress);
        Err(capability::refused(self.kind(), Capability::Defrag))
    }

    /// What re-sharing equal grains of `disks` (every disk when empty)
    /// would free (`dedup --estimate`, FORMAT.md §17.3), [`Capability::Dedup`].
    fn dedup_estimate(
        &self,
        disks: &[String],
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DedupEstimate> {
        let _ = (disks, work, progress);
        Err(capability::refused(self.kind(), Capability::Dedup))
    }

    /// A new thin disk `new` holding `base`'s state (`DISK` or
    /// `DISK@SNAP`), sharing every grain (`import --base`, FORMAT.md
    /// §17.2a), [`Capability::Dedup`].
    fn share_from(&self, base: &str, new: &str) -> Result<DiskView> {
        let _ = (base, new);
        Err(capability::refused(self.kind(), Capability::Dedup))
    }

    /// Re-share equal grains of `disks` (every disk when empty) at the same
    /// virtual grain (`dedup`, FORMAT.md §17.2), [`Capability::Dedup`].
    fn dedup(
        &self,
        disks: &[String],
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<DedupReport> {
        let _ = (disks, work, progress);
        Err(capability::refused(self.kind(), Capability::Dedup))
    }

    /// Pack the raw grains of `disks` (every disk when empty) that shrink
    /// by an eighth into compressed streams with `codec` (`compress`,
    /// FORMAT.md §18.5, §18.8), [`Capability::Compress`].
    fn compress(
        &self,
        disks: &[String],
        codec: strata_api::PackCodec,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<CompressReport> {
        let _ = (disks, codec, work, progress);
        Err(capability::refused(self.kind(), Capability::Compress))
    }

    /// Move data down into free runs and give the tail back to the host
    /// (`defrag --free-space`), [`Capability::Defrag`].
    fn consolidate_free_space(
        &self,
        work: &SpaceWork,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<FreeSpaceReport> {
        let _ = (work, progress);
        Err(capability::refused(self.kind(), Capability::Defrag))
    }

    /// Make this process `disk`'s writer (`claim`; `handover`: wait this
    /// long for the writer elsewhere to release it), [`Capability::Claims`].
    fn claim_disk(&self, disk: &str, handover: Option<Duration>) -> Result<DiskView> {
        let _ = (disk, handover);
        Err(capability::refused(self.kind(), Capability::Claims))
    }

    /// Stop being `disk`'s writer, everything committed (`release`),
    /// [`Capability::Claims`].
    fn release_disk(&self, disk: &str) -> Result<DiskView> {
        let _ = disk;
        Err(capability::refused(self.kind(), Capability::Claims))
    }

    /// Delete what no live root reaches (`gc`; `dry_run`: only say what),
    /// [`Capability::Gc`].
    fn collect_garbage(&self, dry_run: bool) -> Result<GcReport> {
        let _ = dry_run;
        Err(capability::refused(self.kind(), Capability::Gc))
    }

    /// Rewrite the live grains of `disk`'s partly live objects
    /// (`compact`), [`Capability::Compact`].
    fn compact_disk(&self, disk: &str, opts: CompactOptions) -> Result<CompactReport> {
        let _ = (disk, opts);
        Err(capability::refused(self.kind(), Capability::Compact))
    }

    /// Every export a server of this datastore offers (`DISK`,
    /// `DISK@SNAP`) with a few words about it, sorted.
    fn export_names(&self) -> Vec<(String, String)>;

    /// Make everything acknowledged durable and let go (a local datastore
    /// checkpoints and unlocks; an object store commits what this process
    /// writes).
    fn close(&self) -> Result<()>;
}

/// How [`open`] opens a datastore.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// A local datastore's metadata cache.
    pub cache_bytes: u64,
    /// A local datastore's pool bypasses the host page cache.
    pub direct_io: bool,
    /// How long an object-store operation may take, retries included.
    pub store_timeout: Duration,
    /// An object-store datastore's segment cache bound, recorded in its
    /// directory (None: keep the recorded one).
    pub store_cache: Option<u64>,
    /// Who opens it: what becomes of the object-store disks this process
    /// claims (a local datastore ignores it).
    pub role: Role,
    /// A server's settings for the datastore it serves ([`Serving`]);
    /// None for commands, and for a datastore a disk moves into.
    pub serving: Option<Serving>,
    /// A local datastore reclaims freed space and commits in background
    /// threads (on by default); a command that opens it, does one thing
    /// and closes it leaves them off and commits at close.
    pub background: bool,
    /// An object-store datastore's requests go here instead of the S3
    /// endpoint its URL names (tests: the in-memory fault store).
    pub store_backend: Option<strata_s3::Backend>,
    /// An object-store datastore's reads that miss in the segment cache
    /// also fetch their objects whole in the background (on by default;
    /// off, a read's round trips to the store are its own).
    pub store_prefetch: bool,
    /// The compaction passes an object-store datastore's disks run by
    /// themselves while this process writes them (FORMAT.md §11.7a).
    pub store_compact: AutoCompact,
    /// An object-store datastore's data segments are sealed with their
    /// grains LZ4-compressed where that saves an eighth (version 2,
    /// FORMAT.md §18.6; the default); off, version 1.
    pub store_compress: bool,
}

/// What a server asks of the datastore it serves, each for one kind; the
/// other kind ignores it, except that a local datastore refuses
/// `incoming` disks (it has one server, which moves disks itself).
#[derive(Debug, Clone, Default)]
pub struct Serving {
    /// Local: detect all-zero writes and store them as zero ranges.
    pub detect_zeroes: bool,
    /// Local: place each disk's grains in regions of their own.
    pub placement_regions: bool,
    /// Local: keep this many bytes of grains readied ahead of first
    /// writes (0: none).
    pub ready_ahead: u64,
    /// Object store: disks opened fetch their last writer's hot set.
    pub hot_prefetch: bool,
    /// Object store: disks served incoming (a hand-over).
    pub incoming: Incoming,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            cache_bytes: 64 << 20,
            direct_io: false,
            store_timeout: Duration::from_secs(30),
            store_cache: None,
            role: Role::Command,
            serving: None,
            background: true,
            store_backend: None,
            store_prefetch: true,
            store_compact: AutoCompact::default(),
            store_compress: true,
        }
    }
}

/// The process that opens a datastore, as far as an object store's
/// claims go (FORMAT.md §11.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A command run with no server: `claim` is made for the host and
    /// outlives the command; a disk the command takes over for a change
    /// goes back at its end to whom it was taken from.
    Command,
    /// A server: its claims are its own, and a clean stop releases every
    /// disk it writes.
    Server,
}

/// Which kind of datastore `dir` is: the one probe of what a directory
/// holds. Returns the canonical directory with it.
pub fn probe(dir: &Path) -> Result<(Kind, PathBuf)> {
    let dir = std::fs::canonicalize(dir).map_err(|e| {
        Error::new(
            ErrorKind::NotFound,
            format!("datastore directory {}: {e}", dir.display()),
        )
    })?;
    let kind = if strata_objstore::is_shared(&dir) {
        Kind::ObjectStore
    } else if dir.join(strata_format::FILE_SUPER).exists() {
        Kind::Local
    } else {
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "{} is neither a datastore ('strata init') nor a directory attached to an \
                 object store ('strata init|attach --object-store s3://...')",
                dir.display()
            ),
        ));
    };
    Ok((kind, dir))
}

/// Create a local datastore in `dir` (the directory made if missing),
/// under its lock: `AlreadyExists` where one is, or where an object store
/// is attached; `Locked` while another process holds the directory.
pub fn init(dir: &Path, opts: &strata_engine::InitOptions) -> Result<()> {
    if strata_objstore::is_shared(dir) {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} is the local directory of an object-store datastore: a local datastore needs \
                 a directory of its own",
                dir.display()
            ),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        Error::new(ErrorKind::Io, format!("cannot create {}", dir.display())).caused_by(e)
    })?;
    let lock = match try_lock(dir)? {
        LockOutcome::Locked(f) => f,
        LockOutcome::Held(pid) => return Err(local::held(dir, pid)),
    };
    strata_engine::Datastore::init(Arc::new(strata_storage::FileBackend::new(dir)), opts)?;
    drop(lock);
    Ok(())
}

/// Open the datastore in `dir`, whichever its kind. A local one is taken
/// under its lock (`Locked` if another process holds it) and runs its
/// background reclaim and commits; an object store is attached as this
/// host.
pub fn open(dir: &Path, opts: &OpenOptions) -> Result<Arc<dyn Datastore>> {
    let (kind, dir) = probe(dir)?;
    Ok(match kind {
        Kind::Local => Arc::new(LocalDatastore::open(&dir, opts)?),
        Kind::ObjectStore => Arc::new(ObjectStoreDatastore::open(&dir, opts)?),
    })
}
