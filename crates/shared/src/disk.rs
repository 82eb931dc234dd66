//! Disks of an object-store datastore (docs/FORMAT.md §11.4–§11.6): names,
//! manifests, claims and fencing, and [`SharedDisk`], a block device whose
//! writes collect in memory and become durable when a FLUSH commits them:
//! one create-only PUT of the disk's next manifest carrying the grains
//! (its payload) and where every grain written since the last fold lives
//! (its tail, §11.4a). Folds turn the tail into map nodes off the FLUSH's
//! critical path.
//!
//! Acknowledged-but-unflushed writes live in `dirty` (newest) and, while a
//! commit uploads them, in its entry of `inflight` (up to two commits at
//! once, the second issued on top of the first: §11.4b); reads look there
//! first, then in the newest manifest's tail, then walk its map. A host writes only
//! after it claimed the disk (a manifest with a new generation naming it);
//! a commit that finds another host's manifest in its place fences this
//! host: every later I/O fails with an error naming the new owner.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_block::throttle::{IoLimits, Throttle};
use strata_block::{
    check_range, BlockDevice, BlockError, BlockResult, ErrorKind as BErr, Extent, ReadFill,
    ZeroOptions,
};
use strata_format::split_target;
use strata_objstore::{Bytes, Listed, ObjectStore, Put};

use crate::layout::{
    manifest_key, Entry, GroupRef, Manifest, MapNode, Owner, ParentRef, PrevRef, SegId,
    SegmentBuilder, SnapshotRec, Tail, FANOUT, GRAIN, SEG_DATA_OFFSET,
};
use crate::{diff, now_ms, utc, Error, ErrorKind, Result, SharedDatastore, DIR_NAMES};

const G: u64 = GRAIN as u64;
/// Grains per segment: 8 MiB (`segment_max_bytes` of the root object).
const SEGMENT_GRAINS: usize = (crate::SEGMENT_MAX_BYTES as usize) / GRAIN;
/// Unflushed bytes one disk keeps before a write commits them itself.
const DIRTY_LIMIT_BYTES: usize = 32 << 20;
/// A disk served but not owned re-reads its newest manifest this often.
const REFRESH: Duration = Duration::from_secs(1);
/// A tail this long starts a fold in the background (§11.4a).
const TAIL_FOLD: usize = 2048;
/// A commit that would make a tail longer folds it first, inline...
const TAIL_MAX: usize = 4096;
/// ... unless a background fold is on its way: then this long. An inline
/// fold of a 1 GiB disk's map holds every FLUSH queued behind it for
/// 60-80 ms; at 10,000 random writes a second a tail grows past
/// [`TAIL_MAX`] before a fold started at [`TAIL_FOLD`] is back.
const TAIL_MAX_FOLDING: usize = 3 * TAIL_MAX;
/// Hot set segments fetched at once (§11.5b).
const HOT_FETCHERS: usize = 4;
/// Segments sealed between commits that may upload at once (§11.4a):
/// a writer that would seal one more waits.
const UPLOADS_IN_FLIGHT: usize = 4;
/// Sealed grains not yet committed that make a write commit them itself
/// (256 MiB: bounds the memory their entries take).
const SEALED_COMMIT: usize = 65536;
/// The end of a manifest read first: its tail and body, usually whole.
const MANIFEST_READ: u64 = 192 << 10;

mod compact;
pub use compact::{CompactOptions, CompactReport};

/// Crash tests: `STRATA_SHARED_CRASH_AT=STEP` makes a commit abort the
/// process (no cleanup, as kill -9) at STEP: `before-segment`,
/// `after-segment` (uploaded, no manifest), `after-manifest` (committed,
/// not acknowledged), `after-fold` (a background fold's nodes uploaded,
/// not named), `after-compact-upload` (a compaction segment uploaded, not
/// named).
fn crash_point(step: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if AT
        .get_or_init(|| std::env::var("STRATA_SHARED_CRASH_AT").ok())
        .as_deref()
        == Some(step)
    {
        eprintln!("strata: STRATA_SHARED_CRASH_AT={step}: aborting");
        std::process::abort();
    }
}

/// `names/NAME` (§11.2).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct NameObject {
    disk: u32,
}

fn name_key(name: &str) -> String {
    format!("{DIR_NAMES}{name}")
}

fn manifests_dir(disk: u32) -> String {
    format!("disks/{disk:08x}/m/")
}

/// Names of disks and snapshots: as in a local datastore.
pub fn check_name(what: &str, name: &str) -> Result<()> {
    strata_format::check_name(what, name).map_err(|m| Error::new(ErrorKind::InvalidArgument, m))
}

/// A disk's size: a non-zero number of 512-byte sectors.
fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(512) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!("a disk's size must be a non-zero multiple of 512 bytes, not {size}"),
        ));
    }
    Ok(())
}

/// Whether a tree of `levels` levels reaches virtual grain `vg`.
fn maps(levels: u8, vg: u64) -> bool {
    u32::from(levels) >= 8 || vg < MapNode::span_of_entry(levels)
}

/// Map levels for a disk of `size` bytes: one leaf maps 256 grains.
pub fn levels_for(size: u64) -> u8 {
    let grains = size.div_ceil(G).max(1);
    let mut levels = 1u8;
    while (FANOUT as u64).pow(u32::from(levels)) < grains {
        levels += 1;
    }
    levels
}

fn corrupt(msg: String) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

impl SharedDatastore {
    /// The disk id a name stands for.
    pub fn disk_id(&self, name: &str) -> Result<u32> {
        let key = name_key(name);
        let obj = self.store.get_opt(&key)?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("no disk named '{name}' in {}", self.cfg.url),
            )
        })?;
        let n: NameObject = serde_json::from_slice(&obj)
            .map_err(|e| corrupt(format!("{key}: not a disk name object: {e}")))?;
        Ok(n.disk)
    }

    /// The newest manifest of disk `id`.
    pub fn newest_manifest(&self, id: u32) -> Result<Manifest> {
        newest_manifest(&self.store, id)
    }

    /// Disk names and their newest manifests, sorted by name.
    pub fn disks(&self) -> Result<Vec<(String, Manifest)>> {
        self.disk_ids()?
            .into_iter()
            .map(|(name, id)| Ok((name, self.newest_manifest(id)?)))
            .collect()
    }

    /// Disk names and their ids (no manifest read), sorted by name.
    pub fn disk_ids(&self) -> Result<Vec<(String, u32)>> {
        let mut out = Vec::new();
        for l in self.store.list(DIR_NAMES, None)? {
            let Some(name) = l.key.strip_prefix(DIR_NAMES) else {
                continue;
            };
            out.push((name.to_string(), self.disk_id(name)?));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Create a thin disk of `size` bytes. Its first manifest is written
    /// before its name, so a name always leads to a whole disk; of two
    /// hosts creating one name, one wins and the other removes its
    /// manifest and fails.
    pub fn create_disk(&self, name: &str, size: u64) -> Result<Manifest> {
        check_name("disk", name)?;
        check_size(size)?;
        if self.store.get_opt(&name_key(name))?.is_some() {
            return Err(self.exists(name));
        }
        let m = loop {
            let id = rand::random::<u32>();
            if id == 0 {
                continue;
            }
            let m = Manifest::first(id, size, levels_for(size));
            if self
                .store
                .put_create(&m.key(), Bytes::from(m.encode(&[])))?
                == Put::Created
            {
                break m;
            }
        };
        let body = serde_json::to_vec(&NameObject { disk: m.disk }).expect("json");
        if self.store.put_create(&name_key(name), Bytes::from(body))? == Put::Exists {
            let _ = self.store.delete(&m.key());
            return Err(self.exists(name));
        }
        Ok(m)
    }

    fn exists(&self, name: &str) -> Error {
        Error::new(
            ErrorKind::AlreadyExists,
            format!("a disk named '{name}' already exists in {}", self.cfg.url),
        )
    }

    /// This process, as a manifest names its owner.
    pub fn me_as_owner(&self) -> Owner {
        Owner {
            host: self.cfg.me.host.clone(),
            name: self.cfg.me.name.clone(),
            pid: std::process::id(),
        }
    }

    /// This host, as a manifest names the host's own claim (§11.6): no
    /// process of it writes the disk.
    pub fn me_as_host(&self) -> Owner {
        Owner {
            pid: Owner::HOST_PID,
            ..self.me_as_owner()
        }
    }

    /// Whether `o` is this host's claim, or a process of this host that
    /// is this one or is gone: nobody on this host writes the disk but
    /// this process, and no other host may.
    fn is_this_host_idle(&self, o: &Owner) -> bool {
        o.host == self.cfg.me.host
            && (o.is_host() || o.pid == std::process::id() || !pid_alive(o.pid))
    }

    /// Claim disk `name` for this process (a manifest with the next
    /// generation naming it): of claims from one generation exactly one
    /// succeeds.
    pub fn claim(&self, name: &str) -> Result<Manifest> {
        let id = self.disk_id(name)?;
        claim(&self.store, name, id, self.me_as_owner(), None).map(|c| c.man)
    }

    /// Claim disk `name` once its writer released it (waiting up to
    /// `wait`), never fencing a live one (§11.5a).
    pub fn claim_handover(&self, name: &str, wait: Duration) -> Result<Manifest> {
        let id = self.disk_id(name)?;
        wait_for_release(self, name, id, wait)?;
        claim(&self.store, name, id, self.me_as_owner(), None).map(|c| c.man)
    }

    /// Claim disk `name` for this host, not this process (§11.6, "The
    /// host's claim": `strata claim` with no server running): the claim
    /// outlives the process; the host's next server takes the disk over
    /// at its first write, and every other host is refused. With
    /// `handover`, only once the writer released the disk (waiting up to
    /// that long), as [`Self::claim_handover`].
    pub fn claim_for_host(&self, name: &str, handover: Option<Duration>) -> Result<Manifest> {
        let id = self.disk_id(name)?;
        if let Some(wait) = handover {
            wait_for_release(self, name, id, wait)?;
        }
        let c = claim(&self.store, name, id, self.me_as_host(), None)?;
        assert!(c.man.owner.as_ref().is_some_and(Owner::is_host));
        Ok(c.man)
    }

    /// Release disk `name` when no live process writes it (its writer on
    /// this host is gone): a manifest with no owner. A live writer
    /// releases through its server.
    pub fn release(&self, name: &str) -> Result<Manifest> {
        let id = self.disk_id(name)?;
        let m = self.newest_manifest(id)?;
        if m.owner.is_none() {
            return Ok(m);
        }
        self.may_take_over(name, &m)?;
        let mut next = Manifest {
            seq: m.seq + 1,
            owner: None,
            written_ms: now_ms(),
            nonce: rand::random(),
            ..m.clone()
        };
        if !commit_manifest(&self.store, &m, &mut next)? {
            return Err(Error::new(
                ErrorKind::Fenced,
                format!("disk '{name}' changed hands while it was released"),
            ));
        }
        Ok(next)
    }
}

/// A hold of a linked clone on its parent's snapshot (§11.6a), under
/// `holds/PARENT8/SNAP16/CLONE8`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    pub disk: u32,
    pub snapshot: u64,
    pub clone: u32,
    pub size_bytes: u64,
    pub levels: u8,
    pub root: Option<Entry>,
}

pub const DIR_HOLDS: &str = "holds/";

impl Hold {
    pub fn key(&self) -> String {
        format!(
            "{DIR_HOLDS}{:08x}/{:016x}/{:08x}",
            self.disk, self.snapshot, self.clone
        )
    }
}

fn pid_alive(pid: u32) -> bool {
    // kill(0, 0) would check our own process group: pid 0 is the host's
    // claim, which no process holds.
    assert_ne!(pid, Owner::HOST_PID, "the host's claim has no process");
    // SAFETY: kill(2) with signal 0 sends nothing; it only checks.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

impl SharedDatastore {
    /// Whether this process may act as disk `name`'s owner without
    /// fencing a live writer: nobody owns it, this process does, this
    /// host claimed it (`strata claim` with no server running), or its
    /// owner is a process of this host that is gone (a server that
    /// crashed).
    /// Any other owner must hand it over first (`strata claim`).
    pub fn may_take_over(&self, name: &str, m: &Manifest) -> Result<()> {
        match &m.owner {
            None => Ok(()),
            Some(o) if self.is_this_host_idle(o) => Ok(()),
            Some(_) => Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "disk '{name}' is written by {}: do this there, or take the disk over with \
                     'strata claim {name}' first",
                    describe_owner(m)
                ),
            )),
        }
    }

    /// A linked clone `new` of `src@snap`, made on any host (§11.6a): a
    /// hold keeps the snapshot's map and grains while the clone lives.
    pub fn clone_linked(&self, src: &str, snap: &str, new: &str) -> Result<Manifest> {
        check_name("disk", new)?;
        if self.store.get_opt(&name_key(new))?.is_some() {
            return Err(self.exists(new));
        }
        let src_id = self.disk_id(src)?;
        let find = |m: &Manifest| m.snapshots.iter().find(|r| r.name == snap).cloned();
        let m = self.newest_manifest(src_id)?;
        let s = find(&m).ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("disk '{src}' has no snapshot '{snap}'"),
            )
        })?;
        loop {
            let c = rand::random::<u32>();
            if c == 0 || self.store.get_opt(&manifest_key(c, 1))?.is_some() {
                continue;
            }
            let hold = Hold {
                disk: src_id,
                snapshot: s.id,
                clone: c,
                size_bytes: s.size_bytes,
                levels: s.levels,
                root: s.root,
            };
            let body = Bytes::from(serde_json::to_vec(&hold).expect("json"));
            if self.store.put_create(&hold.key(), body)? == Put::Exists {
                continue;
            }
            // After the hold: if the snapshot is still there now, any GC
            // that missed the hold read a manifest that still had it.
            if find(&self.newest_manifest(src_id)?).map(|r| r.id) != Some(s.id) {
                let _ = self.store.delete(&hold.key());
                return Err(Error::new(
                    ErrorKind::NotFound,
                    format!("snapshot '{src}@{snap}' was deleted while the clone was made"),
                ));
            }
            let m1 = Manifest {
                root: s.root,
                parent: Some(ParentRef {
                    disk: src_id,
                    snapshot: s.id,
                    name: format!("{src}@{snap}"),
                }),
                ..Manifest::first(c, s.size_bytes, s.levels)
            };
            if self
                .store
                .put_create(&m1.key(), Bytes::from(m1.encode(&[])))?
                == Put::Exists
            {
                let _ = self.store.delete(&hold.key());
                continue;
            }
            let body = serde_json::to_vec(&NameObject { disk: c }).expect("json");
            if self.store.put_create(&name_key(new), Bytes::from(body))? == Put::Exists {
                let _ = self.store.delete(&m1.key());
                let _ = self.store.delete(&hold.key());
                return Err(self.exists(new));
            }
            return Ok(m1);
        }
    }

    /// Remove disk `name`: a last manifest marks it removed (a claim, so
    /// a writer elsewhere is fenced), then its name and its hold go.
    /// Its objects are garbage collection's; its snapshots' clones keep
    /// what they hold.
    pub fn remove_disk(&self, name: &str) -> Result<()> {
        let id = self.disk_id(name)?;
        let m = self.newest_manifest(id)?;
        if !m.removed {
            self.may_take_over(name, &m)?;
            let mut next = Manifest {
                seq: m.seq + 1,
                generation: m.generation + 1,
                owner: Some(self.me_as_owner()),
                written_ms: now_ms(),
                nonce: rand::random(),
                removed: true,
                ..m.clone()
            };
            if !commit_manifest(&self.store, &m, &mut next)? {
                let now = self.newest_manifest(id)?;
                return Err(Error::new(
                    ErrorKind::Fenced,
                    format!(
                        "disk '{name}' changed hands while it was removed: {}",
                        describe_owner(&now)
                    ),
                ));
            }
        }
        self.store.delete(&name_key(name))?;
        if let Some(p) = &m.parent {
            let hold = format!("{DIR_HOLDS}{:08x}/{:016x}/{id:08x}", p.disk, p.snapshot);
            self.store.delete(&hold)?;
        }
        Ok(())
    }

    /// Every hold in the store.
    pub fn holds(&self) -> Result<Vec<Hold>> {
        let mut out = Vec::new();
        for l in self.store.list(DIR_HOLDS, None)? {
            let obj = self.store.get(&l.key)?;
            let h: Hold = serde_json::from_slice(&obj)
                .map_err(|e| corrupt(format!("{}: not a hold: {e}", l.key)))?;
            if h.key() != l.key {
                return Err(corrupt(format!(
                    "{}: the hold says it is {}",
                    l.key,
                    h.key()
                )));
            }
            out.push(h);
        }
        Ok(out)
    }
}

fn newest_manifest(store: &ObjectStore, id: u32) -> Result<Manifest> {
    let dir = manifests_dir(id);
    let mut tries = 0;
    loop {
        let mut listed = store.list(&dir, None)?;
        listed.sort_by(|a, b| a.key.cmp(&b.key));
        if listed.is_empty() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("disk {id:08x} has no manifest under {dir}"),
            ));
        }
        match newest_valid(store, &listed) {
            // Rule 5: collected between the list and the read (a newer
            // one exists): list again.
            Err(e) if e.kind == ErrorKind::NotFound && tries < 8 => tries += 1,
            r => return r,
        }
    }
}

/// [`newest_manifest`] listing only the keys from `seq` on (a claim that
/// lost its race knows the key it lost); all of them if none is there.
fn newest_manifest_from(store: &ObjectStore, id: u32, seq: u64) -> Result<Manifest> {
    if seq > 0 {
        let after = manifest_key(id, seq - 1);
        let listed = store.list(&manifests_dir(id), Some(&after))?;
        if !listed.is_empty() {
            if let Ok(m) = newest_valid(store, &listed) {
                return Ok(m);
            }
        }
    }
    newest_manifest(store, id)
}

/// The newest valid manifest among `listed` (ascending keys): a
/// pipelined one only if its predecessor is there with its nonce
/// (§11.4b rule 4); at most a few keys are passed over.
fn newest_valid(store: &ObjectStore, listed: &[Listed]) -> Result<Manifest> {
    let mut passed = Vec::new();
    for l in listed.iter().rev().take(8) {
        let m = read_manifest(store, &l.key, l.size)?;
        let Some(p) = m.pipelined_on() else {
            return Ok(m);
        };
        let before = manifest_key(m.disk, p.seq);
        let valid = match listed.binary_search_by(|x| x.key.as_str().cmp(&before)) {
            Ok(i) => read_manifest(store, &before, listed[i].size)?.nonce == p.nonce,
            Err(_) => false,
        };
        if valid {
            return Ok(m);
        }
        passed.push(l.key.clone());
    }
    Err(corrupt(format!(
        "no valid manifest among the newest of the disk (passed over {}): each is pipelined on a \
         predecessor that is missing or another (FORMAT.md §11.4b)",
        passed.join(", ")
    )))
}

/// Whether `m` is an orphan (§11.4b rule 5): pipelined on a predecessor
/// whose key holds another manifest.
pub(crate) fn is_orphan(store: &ObjectStore, m: &Manifest) -> Result<bool> {
    let Some(p) = m.pipelined_on() else {
        return Ok(false);
    };
    Ok(read_manifest_at(store, &manifest_key(m.disk, p.seq))?.is_some_and(|b| b.nonce != p.nonce))
}

/// The manifest under `key` (one `HEAD` for its size, then
/// [`read_manifest`]), or None if there is none.
fn read_manifest_at(store: &ObjectStore, key: &str) -> Result<Option<Manifest>> {
    match store.size_of(key)? {
        Some(size) => read_manifest(store, key, size).map(Some),
        None => Ok(None),
    }
}

/// Manifest `key` (`size` bytes): its tail and body, read from its end
/// without its payload (§11.5).
pub(crate) fn read_manifest(store: &ObjectStore, key: &str, size: u64) -> Result<Manifest> {
    // Read whole, a manifest is checked as one read from its end is: a
    // footer that does not account for every byte (its payload's length)
    // makes it torn, whatever its size.
    let whole = || {
        let obj = store.get(key)?;
        Manifest::needs(key, obj.len() as u64, &obj).map_err(corrupt)?;
        Manifest::decode(key, &obj).map_err(corrupt)
    };
    let start = size.saturating_sub(MANIFEST_READ);
    if start == 0 {
        return whole();
    }
    let end = store.get_range(key, start..size)?;
    match Manifest::needs(key, size, &end).map_err(corrupt)? {
        // Format 1, longer than the first read: read it whole.
        None => whole(),
        Some(n) if n <= end.len() as u64 => {
            Manifest::decode(key, &end[end.len() - n as usize..]).map_err(corrupt)
        }
        Some(n) => {
            let mut all = store.get_range(key, size - n..start)?.to_vec();
            all.extend_from_slice(&end);
            Manifest::decode(key, &all).map_err(corrupt)
        }
    }
}

/// `disks/ID8/c/SEQ16`: manifest `seq` opens a generation (§11.5).
pub fn claim_marker_key(disk: u32, seq: u64) -> String {
    format!("disks/{disk:08x}/c/{seq:016x}")
}

/// The manifest seq a claim marker's key names (None: not a marker key).
pub(crate) fn claim_marker_of_key(key: &str) -> Option<u64> {
    key.rsplit_once("/c/")
        .and_then(|(_, s)| u64::from_str_radix(s, 16).ok())
}

fn describe_owner(m: &Manifest) -> String {
    match &m.owner {
        Some(o) if o.is_host() => format!(
            "host {} ({}; claimed with no server running there), generation {} since {}",
            o.host,
            o.name,
            m.generation,
            utc(m.written_ms)
        ),
        Some(o) => format!(
            "{} (host {}, pid {}), generation {} since {}",
            o.name,
            o.host,
            o.pid,
            m.generation,
            utc(m.written_ms)
        ),
        None => format!("nobody (generation {})", m.generation),
    }
}

/// How a create-only `PUT` of a manifest ended.
#[derive(Debug, PartialEq, Eq)]
enum Landed {
    Created,
    /// Another host's manifest holds the key.
    Taken,
    /// An orphan (§11.4b) holds the key: the manifest goes one key higher.
    Orphan,
}

/// Write `next` on top of `prev` (with `payload`) create-only (§11.5): one
/// `PUT`, after the claim marker if `next` opens a generation. Sets
/// `next.prev`. On `412` it reads what holds the key: an orphan
/// (§11.4b) is not another host's commit.
fn put_manifest(
    store: &ObjectStore,
    prev: &Manifest,
    next: &mut Manifest,
    payload: &[u8],
    pipelined: bool,
) -> Result<Landed> {
    debug_assert!(next.seq > prev.seq);
    next.prev = Some(PrevRef::of(prev));
    next.pipelined = pipelined;
    if next.generation > prev.generation {
        store.put(&claim_marker_key(next.disk, next.seq), Bytes::new())?;
    }
    let key = next.key();
    if store.put_create(&key, Bytes::from(next.encode(payload)))? == Put::Created {
        return Ok(Landed::Created);
    }
    // Deleted since: GC collects only orphans above the newest.
    let Some(there) = read_manifest_at(store, &key)? else {
        return Ok(Landed::Orphan);
    };
    if is_orphan(store, &there)? {
        tracing::warn!(
            "disk {:08x}: {key} is an orphan of a fenced pipeline (FORMAT.md §11.4b): \
             manifest {} goes one key higher",
            next.disk,
            next.seq
        );
        return Ok(Landed::Orphan);
    }
    Ok(Landed::Taken)
}

/// [`put_manifest`] of a manifest without a payload, one key higher past
/// each orphan (§11.4b). `Ok(false)`: another host's manifest is there.
fn commit_manifest(store: &ObjectStore, prev: &Manifest, next: &mut Manifest) -> Result<bool> {
    for _ in 0..8 {
        match put_manifest(store, prev, next, &[], false)? {
            Landed::Created => return Ok(true),
            Landed::Taken => return Ok(false),
            Landed::Orphan => {
                next.seq += 1;
                next.nonce = rand::random();
            }
        }
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        format!(
            "disk {:08x}: eight orphans in a row above manifest {}: refusing to go on",
            next.disk, prev.seq
        ),
    ))
}

/// A claim that landed: the claiming manifest, and the owner of the
/// manifest it was written on (whom the disk was taken from).
struct Claimed {
    man: Manifest,
    from: Option<Owner>,
}

/// Claim disk `name` (id `id`) for `me`. With `unless_live`, only if no
/// live writer elsewhere holds it (a first write's claim, §11.6): a host
/// that comes back after a crash must not take a disk another host
/// claimed meanwhile; an explicit `claim` passes None.
fn claim(
    store: &ObjectStore,
    name: &str,
    id: u32,
    me: Owner,
    unless_live: Option<&SharedDatastore>,
) -> Result<Claimed> {
    let mut newest = newest_manifest(store, id)?;
    let first_gen = newest.generation;
    for _ in 0..64 {
        if newest.removed {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("disk '{name}' was removed"),
            ));
        }
        if let Some(ds) = unless_live {
            ds.may_take_over(name, &newest)?;
        }
        let mut next = Manifest {
            seq: newest.seq + 1,
            generation: newest.generation + 1,
            owner: Some(me.clone()),
            written_ms: now_ms(),
            nonce: rand::random(),
            next_ctr: 0,
            ..newest.clone()
        };
        if commit_manifest(store, &newest, &mut next)? {
            tracing::info!(
                event = "claim",
                disk = name,
                generation = next.generation,
                previous = %describe_owner(&newest),
                "disk '{name}' claimed by this host (generation {})",
                next.generation
            );
            return Ok(Claimed {
                man: next,
                from: newest.owner,
            });
        }
        // Only the keys from the one lost on (a busy writer's disk has
        // thousands of manifests until GC runs).
        newest = newest_manifest_from(store, id, next.seq.saturating_sub(1))?;
        if newest.generation != first_gen {
            return Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "disk '{name}' was claimed by {} at the same time",
                    describe_owner(&newest)
                ),
            ));
        }
        // The owner committed meanwhile: claim on top of its newest.
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        format!("disk '{name}': its owner kept committing; the claim gave up after 64 tries"),
    ))
}

/// Wait up to `wait` until disk `name` may be taken without fencing a
/// live writer (released, or its writer gone; §11.5a).
fn wait_for_release(ds: &SharedDatastore, name: &str, id: u32, wait: Duration) -> Result<()> {
    let t = Instant::now();
    loop {
        let newest = newest_manifest(&ds.store, id)?;
        match ds.may_take_over(name, &newest) {
            Ok(()) => return Ok(()),
            Err(_) if t.elapsed() < wait => std::thread::sleep(Duration::from_millis(50)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "disk '{name}' is still written by {}: an incoming disk is taken only \
                         once its writer releases it ('strata release {name}' there); waited {} s",
                        describe_owner(&newest),
                        wait.as_secs()
                    ),
                ))
            }
        }
    }
}

type Batch = BTreeMap<u64, Option<Box<[u8]>>>;

impl State {
    /// This host lost the disk to another host's claim: every I/O fails
    /// from now on with `msg`. Logged once, as an error event.
    fn fence(&mut self, disk: &str, msg: &str) {
        if self.fenced.is_none() {
            tracing::error!(event = "fenced", disk, "{msg}");
        }
        self.fenced = Some(msg.to_string());
    }
}

struct State {
    man: Arc<Manifest>,
    refreshed: Instant,
    /// This process claimed the disk (its generation is `man.generation`).
    owner: bool,
    /// Set once a commit found another host's manifest: every I/O fails.
    fenced: Option<String>,
    /// Set once this host released the disk for a hand-over (§11.5a):
    /// writes are refused, reads follow the next writer.
    released: Option<String>,
    /// This process took the disk from its own host (the host's claim,
    /// or a process of this host that is gone): a command gives it back
    /// to the host at its end (§11.6, "What a command gives back").
    from_host: bool,
    /// The last refusal of a first write's claim that was logged (once
    /// per writer elsewhere, §11.6).
    refusal_logged: Option<String>,
    /// Incoming (§11.5a): the first write waits up to this long for the
    /// writer to release the disk instead of claiming it from a live one.
    incoming: Option<Duration>,
    next_ctr: u32,
    /// Acknowledged writes not yet in a commit (`None`: zeros).
    dirty: Batch,
    dirty_bytes: usize,
    /// Commits on their way, oldest first (at most [`PIPELINE`], §11.4b):
    /// reads see their batches until they are settled.
    inflight: std::collections::VecDeque<InFlight>,
    /// Numbers commits (`InFlight::id`).
    commit_no: u64,
    /// The outcome of each settled commit, until its FLUSH takes it.
    settled: HashMap<u64, Result<u64>>,
    /// Whether a commit may be issued on top of one in flight (§11.4b
    /// rule 2): not from a claim until the first commit after it is
    /// confirmed (that one may pass over an orphan to another key), nor
    /// after a failure until it is settled.
    pipeline_ok: bool,
    /// A commit failed without a verdict (not a `412`): before the next
    /// one, the newest manifest is read to learn whether it landed.
    unsettled: bool,
    /// (seq, nonce) of the manifests this process issued lately: a
    /// newest manifest among them landed though its `PUT` failed.
    mine: std::collections::VecDeque<(u64, u64)>,
    /// The error of the last commit that failed (FLUSHes that waited
    /// for it return it).
    last_failure: Option<Error>,
    /// When the claim markers were last listed (§11.4b: a writer yields
    /// to a claim under way), and the highest marker seen (its own claim's
    /// at first): a higher one is a claim attempt since.
    markers_listed: Option<Instant>,
    marker_seen: u64,
    /// A fold uploaded in the background that the next commit names.
    fold: Option<Fold>,
    /// Grains sealed into segments between commits (uploads between
    /// FLUSHes, §11.4a): grain → (seal number, where); the newest seal.
    sealed: BTreeMap<u64, (u64, Entry)>,
    /// Seals made so far.
    seal_no: u64,
    /// Sealed segments not uploaded yet: their bytes (reads come from
    /// them) and the upload's outcome (None: in flight).
    sealing: HashMap<SegId, Sealing>,
    /// Counts the calls that put acknowledged writes into `dirty`.
    write_seq: u64,
    /// Every write counted up to here is committed: a FLUSH that arrived
    /// after no later write returns at once (concurrent FLUSHes share
    /// one commit).
    durable_seq: u64,
    /// The counter of a fold's node segment being made in the background:
    /// manifests keep `next_ctr` at or below it until one names it (GC
    /// must take it for an upload in flight, §11.7).
    folding: Option<u32>,
    /// The counter of a compaction segment not named yet (§11.7a): held
    /// like `folding`.
    compacting: Option<u32>,
    /// Bytes of grains clients wrote since the disk was opened, and when
    /// the last write came (compaction's budget and idle test).
    client_bytes: u64,
    last_write: Instant,
}

impl State {
    /// A handle's state as it opens on `man`: not the writer, nothing
    /// unflushed.
    fn new(man: Manifest) -> State {
        State {
            man: Arc::new(man),
            refreshed: Instant::now(),
            owner: false,
            fenced: None,
            released: None,
            from_host: false,
            refusal_logged: None,
            incoming: None,
            next_ctr: 0,
            dirty: Batch::new(),
            dirty_bytes: 0,
            inflight: Default::default(),
            commit_no: 0,
            settled: HashMap::new(),
            pipeline_ok: false,
            unsettled: false,
            mine: Default::default(),
            last_failure: None,
            markers_listed: None,
            marker_seen: 0,
            fold: None,
            folding: None,
            compacting: None,
            client_bytes: 0,
            last_write: Instant::now(),
            write_seq: 0,
            durable_seq: 0,
            sealed: BTreeMap::new(),
            seal_no: 0,
            sealing: HashMap::new(),
        }
    }

    /// Remember a manifest this process issues (the newest 16).
    fn note_mine(&mut self, m: &Manifest) {
        self.mine.push_back((m.seq, m.nonce));
        if self.mine.len() > 16 {
            self.mine.pop_front();
        }
    }

    /// The lowest counter an upload in flight holds (a fold's, a
    /// compaction's): manifests keep `next_ctr` at or below it.
    fn held(&self) -> Option<u32> {
        self.folding.into_iter().chain(self.compacting).min()
    }
}

/// How many commits may be in flight at once (§11.4b).
const PIPELINE: usize = 2;

/// How often a writer lists the claim markers above its newest manifest,
/// and how long it waits before its next commit when it finds one
/// (§11.4b: a claim under way).
const MARKER_LIST_EVERY: Duration = Duration::from_millis(100);
const CLAIM_YIELD: Duration = Duration::from_millis(500);

/// A commit on its way (§11.4a, §11.4b).
struct InFlight {
    id: u64,
    batch: Arc<Batch>,
    /// The seal count when the batch was taken: grains sealed later are
    /// newer than it.
    at: u64,
    /// The write count it covers, and the seal count of the sealed
    /// grains it names (None: it names none).
    covers: u64,
    seal_upto: Option<u64>,
    /// The manifest it writes, once built: what a commit issued on top of
    /// it builds on.
    next: Option<Arc<Manifest>>,
    /// How its `PUT` ended (None: not yet): the manifest and the
    /// relocations it took, or the error; and a fold it took, given back
    /// if it failed.
    outcome: Option<Result<(Arc<Manifest>, u64)>>,
    fold: Option<Fold>,
}

/// A sealed segment on its way to the store.
struct Sealing {
    bytes: Bytes,
    failed: Option<Error>,
    in_flight: bool,
}

impl Sealing {
    /// If its upload failed: its bytes, to upload again (it is in flight
    /// from now on).
    fn retry(&mut self) -> Option<Bytes> {
        self.failed.take()?;
        self.in_flight = true;
        Some(self.bytes.clone())
    }
}

/// A fold (§11.4a): the map at `base_root` with the tail `folded`
/// applied is the map at `root`, whose nodes are uploaded.
struct Fold {
    gen: u32,
    base_root: Option<Entry>,
    base_levels: u8,
    folded: Arc<Tail>,
    root: Option<Entry>,
    levels: u8,
}

impl Fold {
    /// Whether `man` (with its tail `tail`) still builds on this fold's
    /// base: same map, and every folded grain still in the tail (tails
    /// only gain entries between folds).
    fn applies_to(&self, man: &Manifest, tail: &Tail) -> bool {
        self.gen == man.generation
            && self.base_root == man.root
            && self.base_levels == man.levels
            && self.folded.keys().all(|k| tail.contains_key(k))
    }
}

/// What a disk's commits cost, since it was opened.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CommitStats {
    pub commits: u64,
    /// Commits issued while the one before them was in flight (§11.4b).
    pub pipelined: u64,
    pub failed: u64,
    /// Bytes of segments uploaded.
    pub uploaded_bytes: u64,
    /// Time spent in commits that succeeded (upload + manifest), and the
    /// longest one.
    pub seconds_total: f64,
    pub seconds_max: f64,
}

/// A disk (or `DISK@SNAP`, read-only) of an object-store datastore, served
/// by this host.
pub struct SharedDisk {
    /// This disk itself, for the background folds it starts.
    me: Weak<SharedDisk>,
    ds: Arc<SharedDatastore>,
    name: String,
    id: u32,
    snapshot: Option<SnapshotRec>,
    read_only: bool,
    state: Mutex<State>,
    /// Signalled when a sealed segment's upload ends.
    uploaded: Condvar,
    /// Signalled when a commit in flight is built or settled.
    landed: Condvar,
    /// One commit (or claim) at a time.
    commit: Mutex<()>,
    /// Sub-grain writes read, patch and put back a grain one at a time.
    rmw: Mutex<()>,
    stats: Mutex<CommitStats>,
    /// The disk's I/O limits, shared by its handles in this process.
    throttle: Arc<Throttle>,
    /// Where on the disk this handle's reads went (its hot set, §11.5b).
    reads: crate::hot::Reads,
    /// Compaction's thread runs (§11.7a), and what compaction did.
    compactor: compact::Compactor,
}

/// A commit set apart (registered in `State::inflight`), with the
/// manifest it builds on, its segment counters, the fold it may name, and
/// the counter of a fold still being made.
struct Taken {
    id: u64,
    batch: Arc<Batch>,
    man: Arc<Manifest>,
    ctr: std::ops::Range<u32>,
    fold: Option<Fold>,
    folding: Option<u32>,
    /// How long the tail may grow before the commit folds it inline:
    /// [`TAIL_MAX_FOLDING`] if a background fold was on its way when the
    /// batch was taken, else [`TAIL_MAX`].
    tail_bound: usize,
    /// Fold the whole tail whatever its length (`fold_now`).
    force_fold: bool,
    /// Grains sealed before the batch was taken (older than it) and not
    /// named by a commit before it.
    sealed: Vec<(u64, Entry)>,
    /// Grains compaction rewrote (§11.7a), set only where still in place.
    relocate: Vec<compact::Relocation>,
}

/// What building a commit made.
enum Built {
    /// Nothing changed: the manifest it built on.
    Unchanged(Arc<Manifest>),
    Next(Box<NextManifest>),
}

/// A manifest in the store: the relocations it took (§11.7a) and the
/// bytes uploaded for it.
struct Committed {
    man: Arc<Manifest>,
    relocated: u64,
    uploaded: u64,
}

/// A manifest built on `base`, its segments uploaded, not yet `PUT`.
struct NextManifest {
    base: Arc<Manifest>,
    next: Manifest,
    /// The payload (a segment named after `next`'s key), and the grains
    /// of `batch` in it, to make it again for another key.
    payload: Option<(SegId, Bytes)>,
    batch: Arc<Batch>,
    payload_grains: Vec<u64>,
    /// Bytes of segments uploaded for it.
    uploaded: u64,
    relocated: u64,
    /// The background fold it names.
    ready: Option<Fold>,
}

/// Where one grain of a read comes from.
enum Source {
    Data,
    Zero,
    /// A sealed grain already uploaded (the cache has its segment).
    Sealed(Entry),
    Map,
}

impl SharedDisk {
    /// Open `name` (a disk, or `DISK@SNAP`: read-only). Reads nothing but
    /// the name and the newest manifest; claims nothing.
    pub fn open(ds: Arc<SharedDatastore>, name: &str, read_only: bool) -> Result<Arc<SharedDisk>> {
        let (disk, snap) = split_target(name);
        let id = ds.disk_id(disk)?;
        let man = ds.newest_manifest(id)?;
        if man.removed {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("disk '{disk}' was removed"),
            ));
        }
        let snapshot = match snap {
            None => None,
            Some(s) => Some(
                man.snapshots
                    .iter()
                    .find(|r| r.name == s)
                    .cloned()
                    .ok_or_else(|| {
                        Error::new(
                            ErrorKind::NotFound,
                            format!("disk '{disk}' has no snapshot '{s}'"),
                        )
                    })?,
            ),
        };
        let throttle = ds.throttle(id, man.limits);
        ds.cache.seed_root(&man);
        let reads = crate::hot::Reads::new(man.size_bytes.div_ceil(G));
        Ok(Arc::new_cyclic(|me| SharedDisk {
            compactor: Default::default(),
            me: me.clone(),
            ds,
            name: name.to_string(),
            id,
            read_only: read_only || snapshot.is_some(),
            snapshot,
            state: Mutex::new(State::new(man)),
            uploaded: Condvar::new(),
            landed: Condvar::new(),
            commit: Mutex::new(()),
            rmw: Mutex::new(()),
            stats: Mutex::new(CommitStats::default()),
            throttle,
            reads,
        }))
    }

    fn store(&self) -> &ObjectStore {
        &self.ds.store
    }

    /// The disk's name (without `@SNAP`).
    fn disk_name(&self) -> &str {
        split_target(&self.name).0
    }

    /// The manifest this disk reads from now.
    pub fn manifest(&self) -> Arc<Manifest> {
        self.state.lock().unwrap().man.clone()
    }

    /// Whether this process owns the disk, and the fencing message if it
    /// lost it.
    pub fn ownership(&self) -> (bool, Option<String>) {
        let st = self.state.lock().unwrap();
        (st.owner, st.fenced.clone())
    }

    pub fn commit_stats(&self) -> CommitStats {
        *self.stats.lock().unwrap()
    }

    /// Bytes acknowledged to writers and not yet committed to the store.
    pub fn unflushed_bytes(&self) -> u64 {
        let st = self.state.lock().unwrap();
        let flushing: usize = st.inflight.iter().map(|f| f.batch.len()).sum();
        (st.dirty.len() + flushing + st.sealed.len()) as u64 * G
    }

    fn root(&self, man: &Manifest) -> (Option<Entry>, u8) {
        match &self.snapshot {
            Some(s) => (s.root, s.levels),
            None => (man.root, man.levels),
        }
    }

    /// The grains in `grains` that this handle's version holds outside
    /// its map: the head's tail (§11.4a), then the acknowledged writes not
    /// yet committed (the batch being committed, then the newer one over
    /// it), with whether each holds data.
    fn overlay(&self, st: &State, grains: std::ops::Range<u64>) -> BTreeMap<u64, bool> {
        let mut v: BTreeMap<u64, bool> = BTreeMap::new();
        if self.snapshot.is_none() {
            v.extend(
                st.man
                    .tail
                    .range(grains.clone())
                    .map(|(k, e)| (*k, e.is_some())),
            );
        }
        v.extend(st.sealed.range(grains.clone()).map(|(k, _)| (*k, true)));
        // Batches in flight, oldest first; a grain sealed after a batch
        // was taken is newer than it.
        for f in &st.inflight {
            for (k, d) in f.batch.range(grains.clone()) {
                if st.sealed.get(k).is_none_or(|(n, _)| *n <= f.at) {
                    v.insert(*k, d.is_some());
                }
            }
        }
        v.extend(st.dirty.range(grains).map(|(k, d)| (*k, d.is_some())));
        v
    }

    /// Where grain `vg` of this handle's version (at `man`) lives: the
    /// head's tail, else its map (the segments of the nodes walked go to
    /// `used`).
    fn locate(&self, man: &Manifest, vg: u64, used: &mut Vec<SegId>) -> Result<Option<Entry>> {
        if self.snapshot.is_none() {
            if let Some(e) = man.tail.get(&vg) {
                return Ok(*e);
            }
        }
        let (root, levels) = self.root(man);
        self.lookup_noting(root, levels, vg, used)
    }

    /// Walk the map to grain `vg`'s entry.
    fn lookup(&self, root: Option<Entry>, levels: u8, vg: u64) -> Result<Option<Entry>> {
        self.lookup_noting(root, levels, vg, &mut Vec::new())
    }

    /// [`Self::lookup`], adding to `used` the segments of the nodes it
    /// walked (a read's hot set counts them, §11.5b).
    fn lookup_noting(
        &self,
        root: Option<Entry>,
        levels: u8,
        vg: u64,
        used: &mut Vec<SegId>,
    ) -> Result<Option<Entry>> {
        if !maps(levels, vg) {
            // Extended since anything was written here (FORMAT.md §11.5).
            return Ok(None);
        }
        let mut e = root;
        let mut first = 0u64;
        for level in (0..levels).rev() {
            let Some(here) = e else { return Ok(None) };
            let node = self.ds.cache.node(&self.ds.store, &here, level, first)?;
            if used.last() != Some(&here.seg) {
                used.push(here.seg);
            }
            let span = MapNode::span_of_entry(level);
            let idx = ((vg - first) / span) as usize;
            if idx >= FANOUT {
                return Err(corrupt(format!(
                    "disk '{}': grain {vg} lies outside its map",
                    self.name
                )));
            }
            first += idx as u64 * span;
            e = node.entries[idx];
        }
        Ok(e)
    }

    /// The grains where this handle's version differs from `base`'s (None:
    /// an empty disk), ascending, with whether this version maps each
    /// (docs/BACKUP.md): a walk of the two maps that skips what they
    /// share, then the acknowledged writes not yet committed (either
    /// handle's overlay; a snapshot has none).
    pub fn changes_since(&self, base: Option<&SharedDisk>) -> Result<Vec<(u64, bool)>> {
        let end = self.size_bytes().div_ceil(G);
        let (mine, man) = {
            let st = self.state.lock().unwrap();
            (self.overlay(&st, 0..end), st.man.clone())
        };
        let (theirs, their_root) = match base {
            Some(b) => {
                let (ov, m) = {
                    let st = b.state.lock().unwrap();
                    (b.overlay(&st, 0..end), st.man.clone())
                };
                (ov, b.root(&m))
            }
            None => (BTreeMap::new(), (None, 0)),
        };
        let mut walked = Vec::new();
        diff::diff_maps(
            their_root,
            self.root(&man),
            end,
            &mut |e, level, first| self.ds.cache.node(&self.ds.store, e, level, first),
            &mut |g, present| walked.push((g, present)),
        )?;
        if mine.is_empty() && theirs.is_empty() {
            return Ok(walked);
        }
        // Overlay grains count as changed whatever they hold.
        let (root, levels) = self.root(&man);
        let mut all: BTreeMap<u64, bool> = walked.into_iter().collect();
        for &g in theirs.keys() {
            if !all.contains_key(&g) && !mine.contains_key(&g) {
                let present = self.lookup(root, levels, g)?.is_some();
                all.insert(g, present);
            }
        }
        all.extend(mine);
        Ok(all.into_iter().collect())
    }

    /// Read the newest manifest now, if the disk is not ours; whether it
    /// changed.
    fn refresh_now(&self) -> bool {
        if self.snapshot.is_some() || self.state.lock().unwrap().owner {
            return false;
        }
        let newest = newest_manifest(self.store(), self.id);
        let mut st = self.state.lock().unwrap();
        st.refreshed = Instant::now();
        match newest {
            Ok(m) if !st.owner && m.seq > st.man.seq => {
                self.ds.cache.seed_root(&m);
                st.man = Arc::new(m);
                true
            }
            _ => false,
        }
    }

    /// A disk that is not ours follows its owner's commits: at most a
    /// second behind, except an incoming disk whose writer has not released
    /// it yet (§11.6b), which reads the newest manifest before every read:
    /// a migrated guest that resumes here must read what it wrote on the
    /// source, which flushed it just before it stopped.
    fn refresh_if_stale(&self) {
        {
            let st = self.state.lock().unwrap();
            let handing_over = st.incoming.is_some() && st.man.owner.is_some();
            if st.owner
                || self.snapshot.is_some()
                || (st.refreshed.elapsed() < REFRESH && !handing_over)
            {
                return;
            }
        }
        self.refresh_now();
    }

    /// Read whole grains from `first`, `n` of them, into `out`.
    fn read_grains(&self, first: u64, out: &mut [u8]) -> Result<()> {
        let n = out.len() / GRAIN;
        let mut sources = Vec::with_capacity(n);
        let man = {
            let st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            let overlay = !st.dirty.is_empty() || !st.inflight.is_empty() || !st.sealed.is_empty();
            for i in 0..n as u64 {
                if !overlay {
                    sources.push(Source::Map);
                    continue;
                }
                let vg = first + i;
                let at = i as usize * GRAIN;
                // Newest first: unsealed writes, then the newest batch in
                // flight that holds the grain unless it was sealed after
                // that batch was taken, then the seal.
                let sealed = st.sealed.get(&vg);
                let hit = match st.dirty.get(&vg) {
                    Some(d) => Some(d),
                    None => st
                        .inflight
                        .iter()
                        .rev()
                        .find_map(|f| f.batch.get(&vg).map(|d| (f.at, d)))
                        .filter(|(at, _)| sealed.is_none_or(|(n, _)| n <= at))
                        .map(|(_, d)| d),
                };
                sources.push(match (hit, sealed) {
                    (Some(Some(d)), _) => {
                        out[at..at + GRAIN].copy_from_slice(d);
                        Source::Data
                    }
                    (Some(None), _) => Source::Zero,
                    (None, Some((_, e))) => match st.sealing.get(&e.seg) {
                        Some(s) => {
                            let off = SEG_DATA_OFFSET + e.slot as usize * GRAIN;
                            out[at..at + GRAIN].copy_from_slice(&s.bytes[off..off + GRAIN]);
                            Source::Data
                        }
                        None => Source::Sealed(*e),
                    },
                    (None, None) => Source::Map,
                });
            }
            st.man.clone()
        };
        self.reads.count(first, n as u64);
        // The segments of the nodes walked: only a hot set's record (which
        // walks again, at its own manifest) needs them.
        let mut walked = Vec::new();
        for (i, s) in sources.into_iter().enumerate() {
            let at = i * GRAIN;
            let e = match s {
                Source::Data => continue,
                Source::Zero => None,
                Source::Sealed(e) => Some(e),
                Source::Map => self.locate(&man, first + i as u64, &mut walked)?,
            };
            walked.clear();
            match e {
                None => out[at..at + GRAIN].fill(0),
                Some(e) => {
                    self.ds.cache.read_grain(
                        &self.ds.store,
                        &e,
                        first + i as u64,
                        &mut out[at..at + GRAIN],
                    )?;
                }
            }
        }
        Ok(())
    }

    /// Record the disk's hot set (§11.5b) if this process writes it: the
    /// objects that hold, at the newest manifest, the data of the regions
    /// this handle's reads went to most, with the segments of the map
    /// nodes walked to them. `Ok(false)`: nothing to record (not the
    /// writer, no reads, recorded already).
    pub fn record_hot_set(&self) -> Result<bool> {
        let man = {
            let st = self.state.lock().unwrap();
            if !st.owner || st.fenced.is_some() || self.snapshot.is_some() {
                return Ok(false);
            }
            st.man.clone()
        };
        if self.reads.unchanged(man.seq) {
            return Ok(false);
        }
        let total = self.reads.total();
        let segments = self.hot_segments(&man)?;
        if segments.is_empty() {
            return Ok(false);
        }
        let host = &self.ds.config().me.name;
        self.reads
            .record(self.store(), self.id, man.seq, host, segments, total)?;
        Ok(true)
    }

    /// The objects behind the most read regions at `man`, each weighed by
    /// the reads of the grains it serves there (a node's segment by those
    /// of every grain walked through it), until [`crate::hot::HOT_MAX`]
    /// are found.
    fn hot_segments(&self, man: &Manifest) -> Result<Vec<crate::hot::HotSeg>> {
        let end = man.size_bytes.div_ceil(G);
        let mut weight: HashMap<SegId, u64> = HashMap::new();
        let mut used = Vec::new();
        for (region, reads) in self.reads.hottest() {
            if weight.len() >= crate::hot::HOT_MAX {
                break;
            }
            for vg in region.start..region.end.min(end) {
                used.clear();
                if let Some(e) = self.locate(man, vg, &mut used)? {
                    used.push(e.seg);
                }
                for s in &used {
                    *weight.entry(*s).or_default() += reads;
                }
            }
        }
        // Per grain of a region: its reads over its grains.
        let per = 1u64 << self.reads.shift();
        Ok(weight
            .into_iter()
            .map(|(seg, w)| crate::hot::HotSeg {
                seg,
                reads: w.div_ceil(per),
            })
            .collect())
    }

    /// Record the hot set in the background if it is due (§11.5b), one
    /// record at a time.
    fn maybe_record_hot_set(&self) {
        if !self.reads.due() || !self.reads.begin() {
            return;
        }
        let Some(me) = self.me.upgrade() else {
            self.reads.end();
            return;
        };
        let spawned = std::thread::Builder::new()
            .name("strata-hot-set".into())
            .spawn(move || {
                if let Err(e) = me.record_hot_set() {
                    tracing::warn!("recording the hot set of '{}': {e}", me.name);
                }
                me.reads.end();
            });
        if spawned.is_err() {
            self.reads.end();
        }
    }

    /// Fetch the segments of the disk's newest hot set (§11.5b) into the
    /// cache in the background ([`HOT_FETCHERS`] at once), the most read
    /// first, up to half the cache's bound. Client reads do not wait for
    /// it.
    pub fn prefetch_hot_set(&self) {
        let Some(me) = self.me.upgrade() else { return };
        let _ = std::thread::Builder::new()
            .name("strata-hot-fetch".into())
            .spawn(move || {
                let h = match crate::hot::newest(me.store(), me.id) {
                    Ok(Some(h)) => h,
                    Ok(None) => return,
                    Err(e) => {
                        tracing::warn!("the hot set of '{}' is not used: {e}", me.name);
                        return;
                    }
                };
                let next = std::sync::atomic::AtomicUsize::new(0);
                let stop = std::sync::atomic::AtomicBool::new(false);
                std::thread::scope(|sc| {
                    for _ in 0..HOT_FETCHERS {
                        sc.spawn(|| me.fetch_hot_part(&h.segments, &next, &stop));
                    }
                });
            });
    }

    /// One of the hot set fetchers: takes the next segment until none is
    /// left, the cache is half full, or the store fails.
    fn fetch_hot_part(
        &self,
        segs: &[crate::hot::HotSeg],
        next: &std::sync::atomic::AtomicUsize,
        stop: &std::sync::atomic::AtomicBool,
    ) {
        use std::sync::atomic::Ordering::Relaxed;
        while !stop.load(Relaxed) {
            let Some(s) = segs.get(next.fetch_add(1, Relaxed)) else {
                return;
            };
            let c = self.ds.cache.stats();
            if c.bytes >= c.bound_bytes / 2 {
                return;
            }
            match self.ds.cache.fetch_hot(self.store(), s.seg) {
                Ok(_) => {}
                // Collected since it was recorded.
                Err(e) if e.kind == ErrorKind::NotFound => {}
                Err(e) => {
                    if !stop.swap(true, Relaxed) {
                        tracing::warn!("fetching the hot set of '{}' stopped: {e}", self.name);
                    }
                    return;
                }
            }
        }
    }

    /// Make this process the disk's writer now (`strata claim` through a
    /// server), fencing the previous one (also after a release here).
    pub fn claim(&self) -> Result<()> {
        if self.read_only {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("'{}' is read-only here", self.name),
            ));
        }
        {
            let mut st = self.state.lock().unwrap();
            st.released = None;
            st.incoming = None;
        }
        self.ensure_owner(true)
    }

    /// Make this process the disk's writer, if it is not yet; an
    /// incoming disk waits for its writer's release first. Unless
    /// `explicit` (`strata claim`, a hand-over), only if no live writer
    /// elsewhere holds the disk (a first write's claim).
    fn ensure_owner(&self, explicit: bool) -> Result<()> {
        {
            let st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            if st.owner {
                return Ok(());
            }
            if let Some(r) = &st.released {
                return Err(Error::new(ErrorKind::Released, r.clone()));
            }
        }
        let _c = self.lock_commit()?;
        let incoming = {
            let st = self.state.lock().unwrap();
            if st.owner {
                return Ok(());
            }
            st.incoming
        };
        let disk = self.disk_name();
        if let Some(wait) = incoming {
            wait_for_release(&self.ds, disk, self.id, wait)?;
        }
        let guard = (!explicit && incoming.is_none()).then_some(&*self.ds);
        let c = match claim(self.store(), disk, self.id, self.ds.me_as_owner(), guard) {
            Err(e) if guard.is_some() && e.kind == ErrorKind::Fenced => {
                self.log_refusal(&e);
                return Err(e);
            }
            r => r?,
        };
        let m = c.man;
        self.ds.cache.seed_root(&m);
        let mut st = self.state.lock().unwrap();
        st.marker_seen = m.seq;
        st.man = Arc::new(m);
        st.owner = true;
        st.from_host = c.from.is_some_and(|o| self.ds.is_this_host_idle(&o));
        // The first commit after a claim may pass over an orphan: none
        // is issued on top of it (§11.4b rule 2).
        st.pipeline_ok = false;
        st.incoming = None;
        st.next_ctr = 0;
        st.fold = None;
        drop(st);
        self.start_compactor();
        Ok(())
    }

    /// A client's write could not claim the disk: another host writes it
    /// (§11.6). Said once per refusal text (it names the writer and its
    /// generation), as an error event: the client sees only EIO.
    fn log_refusal(&self, e: &Error) {
        let mut st = self.state.lock().unwrap();
        if st.refusal_logged.as_deref() != Some(e.message.as_str()) {
            tracing::error!(
                event = "writer_elsewhere",
                disk = self.disk_name(),
                "writes refused: {}",
                e.message
            );
            st.refusal_logged = Some(e.message.clone());
        }
    }

    /// Mark the disk incoming (§11.5a): until this host writes it, its
    /// first write (or `claim_handover`) waits up to `wait` for the
    /// writer's release rather than fencing it. None: claim as usual.
    pub fn set_incoming(&self, wait: Option<Duration>) {
        let mut st = self.state.lock().unwrap();
        if !st.owner {
            st.incoming = wait;
        }
    }

    /// Become the writer once the current one has released the disk
    /// (waiting up to `wait`); never fences a live writer.
    pub fn claim_handover(&self, wait: Duration) -> Result<()> {
        if self.read_only {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("'{}' is read-only here", self.name),
            ));
        }
        {
            let mut st = self.state.lock().unwrap();
            st.released = None;
            if !st.owner {
                st.incoming = Some(wait);
            }
        }
        self.ensure_owner(true)
    }

    /// Hand the disk over (§11.5a): commit every acknowledged write, then
    /// a manifest with no owner. From then on this host refuses writes (an
    /// error saying so, not a fence) and reads what the next writer
    /// commits; `claim` takes it back.
    pub fn release(&self) -> Result<Manifest> {
        self.let_go(None)
    }

    /// A command's end (§11.6, "What a command gives back"): commit, then
    /// give the disk back to whom this process took it from: its host
    /// (the host's claim) if it took it from its own host, else nobody
    /// (as [`Self::release`]).
    pub fn give_back(&self) -> Result<Manifest> {
        let from_host = self.state.lock().unwrap().from_host;
        self.let_go(from_host.then(|| self.ds.me_as_host()))
    }

    /// Before [`Self::let_go`]: the manifest if this host released the
    /// disk already (nothing to do), an error if it does not write it.
    fn released_already(&self, disk: &str) -> Result<Option<Manifest>> {
        let st = self.state.lock().unwrap();
        if st.released.is_some() {
            return Ok(Some((*st.man).clone()));
        }
        if let Some(f) = &st.fenced {
            return Err(Error::new(ErrorKind::Fenced, f.clone()));
        }
        if !st.owner {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "this host does not write disk '{disk}' ({}): there is nothing to release",
                    describe_owner(&st.man)
                ),
            ));
        }
        Ok(None)
    }

    /// [`Self::release`] to `to` instead of nobody (only the host's claim).
    fn let_go(&self, to: Option<Owner>) -> Result<Manifest> {
        assert!(to.as_ref().is_none_or(Owner::is_host));
        let disk = self.disk_name().to_string();
        if let Some(m) = self.released_already(&disk)? {
            return Ok(m);
        }
        // The next writer starts from what this one read (§11.5b).
        if let Err(e) = self.record_hot_set() {
            tracing::warn!("recording the hot set of '{disk}': {e}");
        }
        loop {
            self.commit()?;
            let _c = self.lock_commit()?;
            let man = {
                let mut st = self.state.lock().unwrap();
                if let Some(f) = &st.fenced {
                    return Err(Error::new(ErrorKind::Fenced, f.clone()));
                }
                if !st.dirty.is_empty() || !st.sealed.is_empty() {
                    // Writes acknowledged since: commit them too.
                    continue;
                }
                st.released = Some(format!(
                    "disk '{disk}' was released on this host for a hand-over: it takes no more \
                     writes here ('strata claim {disk}' takes it back)"
                ));
                st.man.clone()
            };
            let mut next = Manifest {
                seq: man.seq + 1,
                owner: to.clone(),
                written_ms: now_ms(),
                nonce: rand::random(),
                ..(*man).clone()
            };
            let r = commit_manifest(self.store(), &man, &mut next);
            let mut st = self.state.lock().unwrap();
            return match r {
                Ok(true) => {
                    st.owner = false;
                    st.man = Arc::new(next.clone());
                    st.refreshed = Instant::now();
                    let what = match to {
                        Some(_) => "given back to this host (its claim, no process)",
                        None => "released by this host for a hand-over",
                    };
                    tracing::info!(
                        event = "release",
                        disk = %disk,
                        generation = next.generation,
                        "disk '{disk}' {what}"
                    );
                    Ok(next)
                }
                Ok(false) => {
                    let msg = format!(
                        "disk '{disk}' is fenced on this host: it was claimed before the release"
                    );
                    st.fence(&disk, &msg);
                    Err(Error::new(ErrorKind::Fenced, msg))
                }
                Err(e) => {
                    st.released = None;
                    Err(e)
                }
            };
        }
    }

    /// Whether this host released the disk.
    pub fn is_released(&self) -> bool {
        self.state.lock().unwrap().released.is_some()
    }

    /// Put whole grains (`None`: zeros) into the unflushed writes.
    fn put_grains(&self, grains: Vec<(u64, Option<Box<[u8]>>)>) -> Result<()> {
        let over = {
            let mut st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            if let Some(r) = &st.released {
                return Err(Error::new(ErrorKind::Released, r.clone()));
            }
            st.client_bytes += (grains.len() * GRAIN) as u64;
            st.last_write = Instant::now();
            for (vg, d) in grains {
                if st.dirty.insert(vg, d).is_none() {
                    st.dirty_bytes += GRAIN;
                }
            }
            st.write_seq += 1;
            if st.dirty_bytes >= crate::SEGMENT_MAX_BYTES as usize && st.owner {
                st = self.seal(st)?;
            }
            st.dirty_bytes > DIRTY_LIMIT_BYTES || st.sealed.len() > SEALED_COMMIT
        };
        if over {
            self.commit()?;
        }
        Ok(())
    }

    /// Seal the data grains of `dirty` into segments and start their
    /// uploads (§11.4a, uploads between FLUSHes), waiting while
    /// [`UPLOADS_IN_FLIGHT`] are not in the store yet. Holes stay in
    /// `dirty` (they need no upload). An upload that failed is retried by
    /// the writer that waits for it, which fails with it (the store is
    /// out: the write fails, as it would at a FLUSH).
    fn seal<'a>(&'a self, mut st: MutexGuard<'a, State>) -> Result<MutexGuard<'a, State>> {
        loop {
            while st.sealing.len() >= UPLOADS_IN_FLIGHT {
                let failed = st
                    .sealing
                    .iter_mut()
                    .find_map(|(id, s)| Some((*id, s.retry()?)));
                match failed {
                    Some((id, bytes)) => {
                        drop(st);
                        self.upload_sealed(id, bytes)?;
                        st = self.state.lock().unwrap();
                    }
                    None => st = self.uploaded.wait(st).unwrap(),
                }
            }
            if st.fenced.is_some() || !st.owner {
                return Ok(st);
            }
            let chunk: Vec<u64> = st
                .dirty
                .iter()
                .filter(|(_, d)| d.as_deref().is_some_and(|d| d.iter().any(|&x| x != 0)))
                .map(|(vg, _)| *vg)
                .take(SEGMENT_GRAINS)
                .collect();
            if chunk.len() < SEGMENT_GRAINS / 2 {
                return Ok(st);
            }
            let id = SegId {
                disk: self.id,
                gen: st.man.generation,
                ctr: st.next_ctr,
            };
            st.next_ctr += 1;
            st.seal_no += 1;
            let n = st.seal_no;
            let mut b = SegmentBuilder::new(id);
            for vg in &chunk {
                let d = st.dirty.remove(vg).flatten().expect("a data grain");
                st.dirty_bytes -= GRAIN;
                let e = b.add_grain(*vg, &d);
                st.sealed.insert(*vg, (n, e));
            }
            let bytes = Bytes::from(b.seal(now_ms()));
            st.sealing.insert(
                id,
                Sealing {
                    bytes: bytes.clone(),
                    failed: None,
                    in_flight: true,
                },
            );
            let Some(me) = self.me.upgrade() else {
                return Ok(st);
            };
            let spawned = std::thread::Builder::new()
                .name("strata-upload".into())
                .spawn(move || me.upload_sealed(id, bytes));
            if let Err(e) = spawned {
                if let Some(s) = st.sealing.get_mut(&id) {
                    s.in_flight = false;
                    s.failed = Some(Error::new(
                        ErrorKind::Io,
                        format!("cannot start an upload thread: {e}"),
                    ));
                }
            }
        }
    }

    /// Upload sealed segment `id` (a thread of its own, or a commit
    /// retrying one that failed): on success its bytes go to the cache and
    /// reads take the grains from there.
    fn upload_sealed(&self, id: SegId, bytes: Bytes) -> Result<()> {
        let r = self.put_segment(id, &bytes);
        if r.is_ok() {
            self.stats.lock().unwrap().uploaded_bytes += bytes.len() as u64;
        }
        let mut st = self.state.lock().unwrap();
        match &r {
            Ok(()) => {
                st.sealing.remove(&id);
            }
            Err(e) => {
                if let Some(s) = st.sealing.get_mut(&id) {
                    s.in_flight = false;
                    s.failed = Some(e.clone());
                }
            }
        }
        self.uploaded.notify_all();
        r
    }

    /// With the commit lock held: wait until the sealed segments `ids`
    /// are in the store, uploading again those whose upload failed.
    fn wait_sealed(&self, ids: &std::collections::BTreeSet<SegId>) -> Result<()> {
        loop {
            let retry = {
                let mut st = self.state.lock().unwrap();
                while ids
                    .iter()
                    .any(|id| st.sealing.get(id).is_some_and(|s| s.in_flight))
                {
                    st = self.uploaded.wait(st).unwrap();
                }
                let failed = ids
                    .iter()
                    .find_map(|id| Some((*id, st.sealing.get_mut(id)?.retry()?)));
                match failed {
                    None => return Ok(()),
                    Some(f) => f,
                }
            };
            self.upload_sealed(retry.0, retry.1)?;
        }
    }

    /// Write `buf` at `offset` (any 512-byte alignment).
    fn write_bytes(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.ensure_owner(false)?;
        let mut grains = Vec::new();
        let mut pos = 0usize;
        while pos < buf.len() {
            let at = offset + pos as u64;
            let vg = at / G;
            let within = (at % G) as usize;
            let take = (GRAIN - within).min(buf.len() - pos);
            if within == 0 && take == GRAIN {
                grains.push((vg, Some(buf[pos..pos + GRAIN].into())));
            } else {
                // Read, patch and put back under one lock, so two partial
                // writes to one grain do not lose each other.
                if !grains.is_empty() {
                    self.put_grains(std::mem::take(&mut grains))?;
                }
                let _one = self.rmw.lock().unwrap();
                let mut g = vec![0u8; GRAIN];
                self.read_grains(vg, &mut g)?;
                g[within..within + take].copy_from_slice(&buf[pos..pos + take]);
                self.put_grains(vec![(vg, Some(g.into_boxed_slice()))])?;
            }
            pos += take;
        }
        self.put_grains(grains)
    }

    /// Zero `len` bytes at `offset`: whole grains become holes; a partial
    /// grain is written with zeros only where it holds data (over a hole it
    /// reads as zeros already).
    fn zero_bytes(&self, offset: u64, len: u64) -> Result<()> {
        self.ensure_owner(false)?;
        let end = offset + len;
        let mut at = offset;
        let mut holes = Vec::new();
        while at < end {
            let vg = at / G;
            let g_end = (vg + 1) * G;
            if at.is_multiple_of(G) && g_end <= end {
                holes.push((vg, None));
                at = g_end;
            } else {
                let upto = g_end.min(end);
                if self.holds_data(vg)? {
                    let zeros = vec![0u8; (upto - at) as usize];
                    self.write_bytes(&zeros, at)?;
                }
                at = upto;
            }
            if holes.len() >= 4096 {
                self.put_grains(std::mem::take(&mut holes))?;
            }
        }
        self.put_grains(holes)
    }

    /// Why zeroing `[offset, offset+len)` would write data (the work of a
    /// WRITE, which FAST_ZERO asks to refuse), or None when it only puts
    /// holes in the map: a partial grain that holds data.
    fn slow_zeroing(&self, offset: u64, len: u64) -> Result<Option<String>> {
        if len == 0 {
            return Ok(None);
        }
        let end = offset + len;
        let last = (end - 1) / G;
        let mut partial = Vec::with_capacity(2);
        if !offset.is_multiple_of(G) {
            partial.push(offset / G);
        }
        if !end.is_multiple_of(G) && partial.last() != Some(&last) {
            partial.push(last);
        }
        for vg in partial {
            if self.holds_data(vg)? {
                return Ok(Some(format!(
                    "grain {vg} is zeroed in part and holds data, which takes a write"
                )));
            }
        }
        Ok(None)
    }

    /// Whether grain `vg` of this handle's version holds data, as block
    /// status reports it (written and not yet committed, the tail, or the
    /// map).
    fn holds_data(&self, vg: u64) -> Result<bool> {
        let (overlay, man) = {
            let st = self.state.lock().unwrap();
            (self.overlay(&st, vg..vg + 1), st.man.clone())
        };
        if let Some(present) = overlay.get(&vg) {
            return Ok(*present);
        }
        let (root, levels) = self.root(&man);
        Ok(self.lookup(root, levels, vg)?.is_some())
    }

    /// An owner-only change of the manifest (snapshot, revert, delete a
    /// snapshot): takes the disk over if no live writer holds it, commits
    /// the unflushed writes, then commits `change(newest)`.
    fn admin(&self, change: impl FnOnce(&Manifest) -> Result<Manifest>) -> Result<Manifest> {
        self.may_write()?;
        self.commit()?;
        let _c = self.lock_commit()?;
        self.admin_locked(change)
    }

    /// Before an owner-only change: refuse a snapshot, and take the disk
    /// over if no live writer holds it (§11.6).
    fn may_write(&self) -> Result<()> {
        let disk = self.disk_name().to_string();
        if self.snapshot.is_some() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("'{}' is a snapshot, not a disk", self.name),
            ));
        }
        if !self.ownership().0 {
            let newest = newest_manifest(self.store(), self.id)?;
            self.ds.may_take_over(&disk, &newest)?;
            self.ensure_owner(false)?;
        }
        Ok(())
    }

    /// [`Self::admin`]'s change, with the commit lock held: commits
    /// `change(newest)` as the next manifest.
    fn admin_locked(&self, change: impl FnOnce(&Manifest) -> Result<Manifest>) -> Result<Manifest> {
        let disk = self.disk_name().to_string();
        self.fold_now()?;
        let man = {
            let st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            st.man.clone()
        };
        let mut next = change(&man)?;
        next.seq = man.seq + 1;
        next.written_ms = now_ms();
        next.nonce = rand::random();
        if !commit_manifest(self.store(), &man, &mut next)? {
            let who = newest_manifest(self.store(), self.id)
                .map(|m| describe_owner(&m))
                .unwrap_or_else(|e| format!("another host ({e})"));
            let msg = format!("disk '{disk}' is fenced on this host: it was claimed by {who}");
            self.state.lock().unwrap().fence(&disk, &msg);
            return Err(Error::new(ErrorKind::Fenced, msg));
        }
        self.state.lock().unwrap().man = Arc::new(next.clone());
        Ok(next)
    }

    /// Take snapshot `snap` of the disk as it is now (unflushed writes
    /// included: they are committed first).
    pub fn snapshot_create(&self, snap: &str, description: &str) -> Result<SnapshotRec> {
        check_name("snapshot", snap)?;
        let m = self.admin(|man| self.with_snapshot(man, snap, description, None))?;
        Ok(m.snapshots.last().cloned().expect("just added"))
    }

    /// `man` with snapshot `snap` of its live state added (the current one).
    fn with_snapshot(
        &self,
        man: &Manifest,
        snap: &str,
        description: &str,
        group: Option<GroupRef>,
    ) -> Result<Manifest> {
        if man.snapshots.iter().any(|s| s.name == snap) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("disk '{}' already has a snapshot '{snap}'", self.name),
            ));
        }
        let mut next = man.clone();
        next.snapshots.push(SnapshotRec {
            // The seq of the manifest that records it: never given to
            // another snapshot of the disk (FORMAT.md §11.5).
            id: man.seq + 1,
            name: snap.to_string(),
            description: description.to_string(),
            created_ms: now_ms(),
            size_bytes: man.size_bytes,
            levels: man.levels,
            root: man.root,
            parent: man.current,
            group,
        });
        next.current = next.snapshots.last().map(|s| s.id);
        Ok(next)
    }

    /// One snapshot `snap` of every disk of `members` at one instant
    /// (FORMAT.md §11.11): with every member's commit lock held, every
    /// member's state lock is taken and its acknowledged writes set apart
    /// (the cut: writes wait only while those locks are held), then each
    /// member's cut writes are committed and a manifest adds the snapshot
    /// (marked with `group`). Returns, per member in the order given, the
    /// seq of that manifest (= the snapshot's id), and how long writes
    /// were held. A failure leaves no group snapshot (the caller writes
    /// none); member records already written are incomplete (§11.11).
    pub fn group_cut(
        members: &[Arc<SharedDisk>],
        snap: &str,
        description: &str,
        group: GroupRef,
    ) -> Result<(Vec<u64>, Duration)> {
        check_name("snapshot", snap)?;
        for d in members {
            d.may_write()?;
            d.commit()?;
            if d.manifest().snapshots.iter().any(|s| s.name == snap) {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "disk '{}' already has a snapshot named '{snap}': nothing was created (a \
                         group snapshot is taken on every member or on none)",
                        d.name
                    ),
                ));
            }
        }
        let mut order: Vec<usize> = (0..members.len()).collect();
        order.sort_by_key(|&i| members[i].id);
        let _commits: Vec<_> = order
            .iter()
            .map(|&i| members[i].lock_commit())
            .collect::<Result<_>>()?;
        let t0 = Instant::now();
        let mut taken: Vec<Option<Taken>> = (0..members.len()).map(|_| None).collect();
        {
            let mut states: Vec<_> = order
                .iter()
                .map(|&i| (i, members[i].state.lock().unwrap()))
                .collect();
            for (i, st) in states.iter_mut() {
                taken[*i] = members[*i].take_batch(st)?;
            }
        }
        let held = t0.elapsed();
        // Every member's cut writes are uploaded, also after one fails (a
        // commit registered in flight must be settled); then the records.
        let mut failed = None;
        for (d, t) in members.iter().zip(taken) {
            if let Some(t) = t {
                if let Err(e) = d.commit_taken(t) {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut seqs = Vec::new();
        for d in members {
            let m = d.admin_locked(|man| d.with_snapshot(man, snap, description, Some(group)))?;
            seqs.push(m.seq);
        }
        Ok((seqs, held))
    }

    /// Grow the disk to `size_bytes` (FORMAT.md §11.5: one manifest; the
    /// map grows with the first write past what it covers). Clients see
    /// the new size at once (`size_bytes`).
    pub fn extend(&self, size_bytes: u64) -> Result<Manifest> {
        check_size(size_bytes)?;
        self.admin(|man| {
            if size_bytes < man.size_bytes {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "'{}' is {} bytes; extend only grows a disk",
                        self.name, man.size_bytes
                    ),
                ));
            }
            Ok(Manifest {
                size_bytes,
                ..man.clone()
            })
        })
    }

    /// Set the disk's I/O limits (`IoLimits::default()` clears them): one
    /// manifest, and at once for every handle of the disk in this process
    /// (another host's handles take them when they open the disk).
    pub fn set_limits(&self, limits: IoLimits) -> Result<Manifest> {
        limits
            .check()
            .map_err(|why| Error::new(ErrorKind::InvalidArgument, why))?;
        let m = self.admin(|man| {
            Ok(Manifest {
                limits,
                ..man.clone()
            })
        })?;
        self.throttle.set(limits);
        Ok(m)
    }

    /// Delete snapshot `snap` (its clones keep what they hold).
    pub fn snapshot_delete(&self, snap: &str) -> Result<()> {
        self.admin(|man| {
            let mut next = man.clone();
            let Some(gone) = next.snapshots.iter().find(|s| s.name == snap).cloned() else {
                return Err(self.no_snapshot(snap));
            };
            next.snapshots.retain(|s| s.id != gone.id);
            // Its children (and the live state) now descend from its parent.
            for s in &mut next.snapshots {
                if s.parent == Some(gone.id) {
                    s.parent = gone.parent;
                }
            }
            if next.current == Some(gone.id) {
                next.current = gone.parent;
            }
            Ok(next)
        })
        .map(|_| ())
    }

    /// Make the disk what snapshot `snap` holds (its size too); writes
    /// not yet flushed are dropped.
    pub fn snapshot_revert(&self, snap: &str) -> Result<()> {
        let _one = self.rmw.lock().unwrap();
        self.admin(|man| {
            let s = man
                .snapshots
                .iter()
                .find(|s| s.name == snap)
                .ok_or_else(|| self.no_snapshot(snap))?;
            Ok(Manifest {
                root: s.root,
                levels: s.levels,
                size_bytes: s.size_bytes,
                current: Some(s.id),
                ..man.clone()
            })
        })?;
        let mut st = self.state.lock().unwrap();
        st.dirty.clear();
        st.dirty_bytes = 0;
        st.sealed.clear();
        Ok(())
    }

    fn no_snapshot(&self, snap: &str) -> Error {
        Error::new(
            ErrorKind::NotFound,
            format!("disk '{}' has no snapshot '{snap}'", self.name),
        )
    }

    /// Upload every acknowledged write and commit the next manifest. A
    /// FLUSH whose writes a commit in flight covers waits for that one;
    /// otherwise its commit is issued at once, on top of one still in
    /// flight if there is one (§11.4b).
    pub fn commit(&self) -> Result<()> {
        let want = self.state.lock().unwrap().write_seq;
        loop {
            let c = self.commit.lock().unwrap();
            let mut st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            if st.durable_seq >= want {
                // A commit that took every write this one must cover
                // ended while this one waited for it.
                return Ok(());
            }
            if let Some(id) = st.inflight.iter().find(|f| f.covers >= want).map(|f| f.id) {
                drop(c);
                return self.joined(st, id, want);
            }
            let may_issue = st.inflight.is_empty()
                || (st.inflight.len() < PIPELINE
                    && st.pipeline_ok
                    && st.inflight.iter().all(|f| f.next.is_some()));
            if !may_issue {
                drop(c);
                drop(self.landed.wait(st).unwrap());
                continue;
            }
            if st.unsettled {
                drop(st);
                self.settle()?;
                continue;
            }
            if st
                .markers_listed
                .is_none_or(|t| t.elapsed() >= MARKER_LIST_EVERY)
            {
                st.markers_listed = Some(Instant::now());
                let seen = st.marker_seen;
                drop(st);
                self.yield_to_claim(seen);
                continue;
            }
            let Some(t) = self.take_batch(&mut st)? else {
                return Ok(());
            };
            let pipelined = st.inflight.len() > 1;
            drop(st);
            return self.run(t, Some(c), pipelined).map(|_| ());
        }
    }

    /// With the commit lock held: if a claim marker above `seen` (the
    /// highest one seen so far) is there, another host is claiming the
    /// disk: wait [`CLAIM_YIELD`], issuing nothing, so that its next
    /// attempt lands before this writer's next manifest (§11.4b). A
    /// writer that pipelines would otherwise always have its next
    /// manifest in flight before a claimer could learn the key to race it
    /// for.
    fn yield_to_claim(&self, seen: u64) {
        let dir = format!("disks/{:08x}/c/", self.id);
        let after = claim_marker_key(self.id, seen);
        let Ok(found) = self.store().list(&dir, Some(&after)) else {
            return;
        };
        let newest = found
            .iter()
            .filter_map(|l| claim_marker_of_key(&l.key))
            .max();
        if let Some(m) = newest {
            self.state.lock().unwrap().marker_seen = m;
            std::thread::sleep(CLAIM_YIELD);
        }
    }

    /// The commit lock, once no commit is in flight and a failed one is
    /// settled: for the changes that build on the newest manifest alone
    /// (claims, snapshots, folds, compaction).
    fn lock_commit(&self) -> Result<MutexGuard<'_, ()>> {
        let c = self.commit.lock().unwrap();
        let mut st = self.state.lock().unwrap();
        while !st.inflight.is_empty() {
            st = self.landed.wait(st).unwrap();
        }
        let unsettled = st.unsettled;
        drop(st);
        if unsettled {
            self.settle()?;
        }
        Ok(c)
    }

    /// After a commit failed without a verdict (§11.4b rule 3), with the
    /// commit lock held and nothing in flight: if the newest manifest is
    /// one this process issued (its `PUT` landed after all), build on it.
    fn settle(&self) -> Result<()> {
        let newest = newest_manifest(self.store(), self.id)?;
        let mut st = self.state.lock().unwrap();
        if newest.seq > st.man.seq && st.mine.contains(&(newest.seq, newest.nonce)) {
            tracing::warn!(
                "disk '{}': manifest {} landed although its PUT failed; the next commit \
                 builds on it",
                self.name,
                newest.seq
            );
            self.ds.cache.seed_root(&newest);
            st.man = Arc::new(newest);
        }
        st.unsettled = false;
        Ok(())
    }

    /// A FLUSH that waits for commit `id` (which covers the writes it
    /// waits for, `want`): its outcome, once it is settled.
    fn joined(&self, mut st: MutexGuard<'_, State>, id: u64, want: u64) -> Result<()> {
        while st.inflight.iter().any(|f| f.id == id) {
            st = self.landed.wait(st).unwrap();
        }
        if let Some(f) = &st.fenced {
            return Err(Error::new(ErrorKind::Fenced, f.clone()));
        }
        if st.durable_seq >= want {
            return Ok(());
        }
        Err(st.last_failure.clone().unwrap_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "the commit failed; the writes are kept",
            )
        }))
    }

    /// With the commit lock held: move the acknowledged writes into a
    /// commit in flight (None: there are none).
    fn take_batch(&self, st: &mut State) -> Result<Option<Taken>> {
        if let Some(f) = &st.fenced {
            return Err(Error::new(ErrorKind::Fenced, f.clone()));
        }
        if st.dirty.is_empty() && st.sealed.is_empty() {
            return Ok(None);
        }
        if !st.owner {
            return Err(Error::new(
                ErrorKind::Fenced,
                format!("disk '{}': writes without a claim", self.name),
            ));
        }
        // Grains sealed up to here are named by the commit in flight.
        let after = st.inflight.back().and_then(|f| f.seal_upto).unwrap_or(0);
        let batch = Arc::new(std::mem::take(&mut st.dirty));
        st.dirty_bytes = 0;
        let mut t = self.take(st, batch);
        t.sealed = st
            .sealed
            .iter()
            .filter(|(_, (n, _))| *n > after)
            .map(|(vg, (_, e))| (*vg, *e))
            .collect();
        let f = st.inflight.back_mut().expect("take registers it");
        f.seal_upto = Some(st.seal_no);
        f.covers = st.write_seq;
        Ok(Some(t))
    }

    /// Register a commit of `batch` on top of the newest manifest (or
    /// the one in flight): its segment counters and a node segment's,
    /// and the fold state.
    fn take(&self, st: &mut State, batch: Arc<Batch>) -> Taken {
        let ctrs = batch.len().div_ceil(SEGMENT_GRAINS) as u32 + 1;
        let ctr = st.next_ctr..st.next_ctr + ctrs;
        st.next_ctr += ctrs;
        st.commit_no += 1;
        let id = st.commit_no;
        let man = st
            .inflight
            .back()
            .and_then(|f| f.next.clone())
            .unwrap_or_else(|| st.man.clone());
        st.inflight.push_back(InFlight {
            id,
            batch: batch.clone(),
            at: st.seal_no,
            covers: st.durable_seq,
            seal_upto: None,
            next: None,
            outcome: None,
            fold: None,
        });
        Taken {
            id,
            batch,
            man,
            ctr,
            fold: st.fold.take(),
            folding: st.held(),
            tail_bound: if st.folding.is_some() {
                TAIL_MAX_FOLDING
            } else {
                TAIL_MAX
            },
            force_fold: false,
            sealed: Vec::new(),
            relocate: Vec::new(),
        }
    }

    /// With the commit lock held and nothing in flight: commit a batch
    /// [`Self::take_batch`] or [`Self::take`] registered; on failure its
    /// writes go back to the unflushed ones (or the disk is fenced). How
    /// many of its relocations (§11.7a) the manifest took.
    fn commit_taken(&self, t: Taken) -> Result<u64> {
        self.run(t, None, false)
    }

    /// Build commit `t` (its uploads, with the commit lock `guard` held
    /// if given), then let the next commit be issued on top of it (the
    /// lock is released), `PUT` its manifest and wait until it is
    /// settled, in order (§11.4b). `pipelined`: a commit before it was
    /// still in flight when it was taken.
    fn run(&self, t: Taken, guard: Option<MutexGuard<'_, ()>>, pipelined: bool) -> Result<u64> {
        let id = t.id;
        let t0 = Instant::now();
        let (built, fold) = self.build(t);
        let (r, fold, bytes) = match built {
            Err(e) => (Err(e), fold, 0),
            Ok(Built::Unchanged(base)) => (Ok((base, 0)), fold, 0),
            Ok(Built::Next(b)) => {
                {
                    let mut st = self.state.lock().unwrap();
                    if let Some(f) = st.inflight.iter_mut().find(|f| f.id == id) {
                        f.next = Some(Arc::new(b.next.clone()));
                    }
                    st.note_mine(&b.next);
                    self.landed.notify_all();
                }
                drop(guard);
                match self.land(b, pipelined) {
                    (Ok(c), _) => (Ok((c.man, c.relocated)), None, c.uploaded),
                    (Err(e), fold) => (Err(e), fold, 0),
                }
            }
        };
        {
            let mut c = self.stats.lock().unwrap();
            match &r {
                Ok(_) => {
                    let s = t0.elapsed().as_secs_f64();
                    c.commits += 1;
                    c.pipelined += u64::from(pipelined);
                    c.uploaded_bytes += bytes;
                    c.seconds_total += s;
                    c.seconds_max = c.seconds_max.max(s);
                }
                Err(_) => c.failed += 1,
            }
        }
        let mut st = self.state.lock().unwrap();
        match st.inflight.iter_mut().find(|f| f.id == id) {
            Some(f) => {
                f.outcome = Some(r);
                f.fold = fold;
            }
            // Failed with a commit before it meanwhile (settled later if
            // its manifest landed: §11.4b rule 3).
            None => {
                if st.fold.is_none() {
                    st.fold = fold;
                }
            }
        }
        self.settle_front(&mut st);
        self.landed.notify_all();
        loop {
            if let Some(r) = st.settled.remove(&id) {
                drop(st);
                if r.is_ok() {
                    self.maybe_fold();
                    self.maybe_record_hot_set();
                }
                return r;
            }
            st = self.landed.wait(st).unwrap();
        }
    }

    /// Settle the commits at the front of the queue whose `PUT`s are
    /// back, in order: a manifest counts only once every one before it
    /// is in (§11.4b rule 2). A failure fails every commit after it too:
    /// their writes go back to the unflushed ones, newest first so that
    /// newer writes win (or the disk is fenced).
    fn settle_front(&self, st: &mut State) {
        while st.inflight.front().is_some_and(|f| f.outcome.is_some()) {
            let mut f = st.inflight.pop_front().expect("checked");
            match f.outcome.take().expect("checked") {
                Ok((next, relocated)) => {
                    st.man = next;
                    st.durable_seq = st.durable_seq.max(f.covers);
                    // Committed: in the tail or the map now.
                    if let Some(upto) = f.seal_upto {
                        st.sealed.retain(|_, (n, _)| *n > upto);
                    }
                    st.pipeline_ok = true;
                    st.settled.insert(f.id, Ok(relocated));
                }
                Err(e) => {
                    let mut failed: Vec<InFlight> = st.inflight.drain(..).collect();
                    failed.insert(0, f);
                    if e.kind == ErrorKind::Fenced {
                        st.fence(&self.name, &e.message);
                    } else {
                        st.unsettled = true;
                    }
                    st.pipeline_ok = false;
                    for g in failed.iter_mut() {
                        // A fold not named yet still applies to the
                        // manifest that is still the newest.
                        if st.fold.is_none() {
                            st.fold = g.fold.take();
                        }
                        st.settled.insert(g.id, Err(e.clone()));
                    }
                    if st.fenced.is_none() {
                        // Keep them: the next FLUSH uploads them again.
                        // Newer writes made meanwhile win (unsealed or
                        // sealed).
                        for g in failed.iter().rev() {
                            for (vg, d) in g.batch.iter() {
                                if st.sealed.get(vg).is_some_and(|(n, _)| *n > g.at) {
                                    continue;
                                }
                                if let std::collections::btree_map::Entry::Vacant(v) =
                                    st.dirty.entry(*vg)
                                {
                                    v.insert(d.clone());
                                    st.dirty_bytes += GRAIN;
                                }
                            }
                        }
                    }
                    st.last_failure = Some(e);
                }
            }
        }
    }

    /// With the commit lock held: fold the newest manifest's whole tail
    /// into its map now and commit that (§11.4a: the changes only an owner
    /// makes start from an empty tail).
    fn fold_now(&self) -> Result<()> {
        let t = {
            let mut st = self.state.lock().unwrap();
            if let Some(f) = &st.fenced {
                return Err(Error::new(ErrorKind::Fenced, f.clone()));
            }
            if st.man.tail.is_empty() || !st.owner {
                return Ok(());
            }
            let mut t = self.take(&mut st, Arc::new(Batch::new()));
            t.force_fold = true;
            t
        };
        self.commit_taken(t).map(|_| ())
    }

    /// Build commit `t` (§11.4a): wait for the sealed segments it names,
    /// then its grains as the next manifest's payload (the ones past one
    /// payload in segments first, two uploads at a time) and its tail
    /// extended with them; or, when `force_fold` or the tail would grow
    /// past [`TAIL_MAX`] ([`TAIL_MAX_FOLDING`] while a background fold is
    /// on its way), its grains in segments and the whole tail folded into
    /// map nodes (one more segment) under a manifest with an empty tail.
    /// A finished background fold that still applies is named. On
    /// failure, the fold taken if it was not used.
    fn build(&self, t: Taken) -> (Result<Built>, Option<Fold>) {
        // Rule 3: what the manifest names is in the store first.
        let ids = t.sealed.iter().map(|(_, e)| e.seg).collect();
        if let Err(e) = self.wait_sealed(&ids) {
            return (Err(e), t.fold);
        }
        if !ids.is_empty() {
            crash_point("after-segment");
        }
        let Taken {
            id: _,
            batch,
            man,
            ctr: ctrs,
            fold: ready,
            folding,
            tail_bound,
            force_fold,
            sealed,
            relocate,
        } = t;
        let mut tail: Tail = (*man.tail).clone();
        let (mut root, mut levels) = (man.root, man.levels);
        let ready = match ready {
            Some(f) if f.applies_to(&man, &tail) => {
                root = f.root;
                levels = f.levels;
                tail.retain(|vg, e| f.folded.get(vg) != Some(e));
                Some(f)
            }
            // Overtaken (a revert, an inline fold): its nodes are garbage.
            _ => None,
        };
        let mut named = ready.is_some() || !sealed.is_empty();
        // Sealed grains are older than the batch: set first.
        for (vg, e) in sealed {
            tail.insert(vg, Some(e));
        }
        // Then compaction's, where nothing moved them since (§11.7a).
        let relocated = match self.relocate(&man, root, levels, &mut tail, &batch, relocate) {
            Ok(n) => n,
            Err(e) => return (Err(e), ready),
        };
        named |= relocated > 0;
        let r = self.commit_on(
            &man, batch, ctrs, folding, force_fold, tail_bound, root, levels, tail, named,
        );
        match r {
            Ok(Some(mut b)) => {
                b.relocated = relocated;
                b.ready = ready;
                (Ok(Built::Next(b)), None)
            }
            Ok(None) => (Ok(Built::Unchanged(man)), ready),
            Err(e) => (Err(e), ready),
        }
    }

    /// `PUT` a built manifest create-only on top of its base, one key
    /// higher past an orphan (§11.4b; its payload is made again for the
    /// new key). The manifest, the relocations it took and the bytes
    /// uploaded; on failure, the fold it named.
    fn land(&self, b: Box<NextManifest>, pipelined: bool) -> (Result<Committed>, Option<Fold>) {
        let NextManifest {
            base,
            mut next,
            mut payload,
            batch,
            payload_grains,
            mut uploaded,
            relocated,
            ready,
        } = *b;
        for _ in 0..8 {
            let body = payload.as_ref().map(|(_, b)| &b[..]).unwrap_or(&[]);
            match put_manifest(self.store(), &base, &mut next, body, pipelined) {
                Err(e) => return (Err(e), ready),
                Ok(Landed::Created) => {
                    uploaded += body.len() as u64;
                    crash_point("after-manifest");
                    if let Some((id, b)) = &payload {
                        // Kept as any segment this host wrote, once the
                        // FLUSH is answered; a cache that cannot keep it
                        // reads it from the store later.
                        self.ds.cache.insert_later(*id, b.clone());
                    }
                    let man = Arc::new(next);
                    return (
                        Ok(Committed {
                            man,
                            relocated,
                            uploaded,
                        }),
                        None,
                    );
                }
                Ok(Landed::Orphan) => {
                    next.seq += 1;
                    next.nonce = rand::random();
                    next.written_ms = now_ms();
                    let tail = Arc::make_mut(&mut next.tail);
                    payload = self.payload(next.seq, &batch, &payload_grains, tail);
                    self.state.lock().unwrap().note_mine(&next);
                }
                Ok(Landed::Taken) => break,
            }
        }
        let disk = self.disk_name();
        let who = match newest_manifest(self.store(), self.id) {
            Ok(m) => describe_owner(&m),
            Err(e) => format!("another host ({e})"),
        };
        (
            Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "disk '{disk}' is fenced on this host: it was claimed by {who}; this host's \
                     generation {} acknowledges no more writes (its unflushed writes are dropped)",
                    base.generation
                ),
            )),
            ready,
        )
    }

    /// The payload of manifest `seq` (§11.4a): `grains` of `batch` (all
    /// holding data) in a segment named after the manifest's key, each
    /// set in `tail` where it lands; None without grains.
    fn payload(
        &self,
        seq: u64,
        batch: &Batch,
        grains: &[u64],
        tail: &mut Tail,
    ) -> Option<(SegId, Bytes)> {
        if grains.is_empty() {
            return None;
        }
        let mut b = SegmentBuilder::new(SegId::payload(self.id, seq));
        for vg in grains {
            let d = batch[vg].as_deref().expect("payload grains hold data");
            tail.insert(*vg, Some(b.add_grain(*vg, d)));
        }
        Some((b.id, Bytes::from(b.seal(now_ms()))))
    }

    /// [`Self::build`] once the base map and tail are known: the uploads,
    /// then the manifest (not yet `PUT`; None: nothing changed).
    #[expect(clippy::too_many_arguments)]
    #[expect(clippy::too_many_lines)]
    fn commit_on(
        &self,
        man: &Arc<Manifest>,
        batch: Arc<Batch>,
        ctrs: std::ops::Range<u32>,
        folding: Option<u32>,
        fold: bool,
        tail_bound: usize,
        root: Option<Entry>,
        levels: u8,
        mut tail: Tail,
        named: bool,
    ) -> Result<Option<Box<NextManifest>>> {
        let seg = |ctr| SegId {
            disk: self.id,
            gen: man.generation,
            ctr,
        };
        // Zeros are holes: they need no grain. A hole where the map has
        // one already (and the tail says nothing) changes nothing.
        let mut data: Vec<(u64, &[u8])> = Vec::new();
        let mut holes: Vec<u64> = Vec::new();
        for (vg, d) in batch.iter() {
            match d.as_deref().filter(|d| d.iter().any(|&x| x != 0)) {
                Some(d) => data.push((*vg, d)),
                None if tail.contains_key(vg) => holes.push(*vg),
                None if self.lookup(root, levels, *vg)?.is_some() => holes.push(*vg),
                None => {}
            }
        }
        let fold = fold || {
            let new = data
                .iter()
                .map(|(vg, _)| vg)
                .chain(&holes)
                .filter(|vg| !tail.contains_key(vg))
                .count();
            tail.len() + new > tail_bound
        };
        let changed = named || fold || !data.is_empty() || !holes.is_empty();
        if !changed {
            return Ok(None);
        }
        // The last (up to) 8 MiB ride in the manifest; the rest, or all
        // of them when folding, in segments.
        let spill = if fold {
            data.len()
        } else {
            data.len().saturating_sub(SEGMENT_GRAINS)
        };
        let mut sealed: Vec<(SegId, Bytes)> = Vec::new();
        for (j, chunk) in data[..spill].chunks(SEGMENT_GRAINS).enumerate() {
            let mut b = SegmentBuilder::new(seg(ctrs.start + j as u32));
            for (vg, d) in chunk {
                tail.insert(*vg, Some(b.add_grain(*vg, d)));
            }
            sealed.push((b.id, Bytes::from(b.seal(now_ms()))));
        }
        for vg in holes {
            tail.insert(vg, None);
        }
        let (mut root, mut levels) = (root, levels);
        let mut nodes = Vec::new();
        if fold {
            let node_ctr = ctrs.start + sealed.len() as u32;
            debug_assert!(node_ctr < ctrs.end);
            let mut b = SegmentBuilder::new(seg(node_ctr));
            (root, levels) = self.fold_tail(man, root, levels, &tail, &mut b, &mut nodes)?;
            if !nodes.is_empty() {
                sealed.push((b.id, Bytes::from(b.seal(now_ms()))));
            }
            tail.clear();
        }
        let uploaded: u64 = sealed.iter().map(|(_, b)| b.len() as u64).sum();
        crash_point("before-segment");
        if !sealed.is_empty() {
            self.upload(&sealed)?;
            crash_point("after-segment");
            for (e, n) in nodes {
                self.ds.cache.insert_node(&e, n);
            }
        }
        // The payload names the manifest's key (made again one key higher
        // past an orphan, in `land`).
        let next_seq = man.seq + 1;
        let payload_grains: Vec<u64> = data[spill..].iter().map(|(vg, _)| *vg).collect();
        drop(data);
        let payload = self.payload(next_seq, &batch, &payload_grains, &mut tail);
        let mut next = Manifest {
            seq: next_seq,
            written_ms: now_ms(),
            nonce: rand::random(),
            root,
            levels,
            // A fold still being made keeps its counter "in flight" (§11.7).
            next_ctr: folding.map_or(ctrs.end, |f| f.min(ctrs.end)),
            tail: Arc::new(tail),
            ..(**man).clone()
        };
        // The root node's copy (§11.5); an unchanged root keeps the one
        // `man` carries.
        if let Some(n) = root.and_then(|e| self.ds.cache.cached_node(&e)) {
            next.set_root_node(&n);
        }
        Ok(Some(Box::new(NextManifest {
            base: man.clone(),
            next,
            payload,
            batch,
            payload_grains,
            uploaded,
            relocated: 0,
            ready: None,
        })))
    }

    /// Apply `tail` to the map at `root` (`levels` levels), copy-on-write,
    /// new nodes into `b` (and `made`); grows the tree for grains past
    /// what it maps (§11.5). The new root and levels.
    #[expect(clippy::too_many_arguments)]
    fn fold_tail(
        &self,
        man: &Manifest,
        root: Option<Entry>,
        levels: u8,
        tail: &Tail,
        b: &mut SegmentBuilder,
        made: &mut Vec<(Entry, MapNode)>,
    ) -> Result<(Option<Entry>, u8)> {
        let items: Vec<(u64, Option<Entry>)> = tail.iter().map(|(k, e)| (*k, *e)).collect();
        let items = &items[..];
        let mut grown = levels;
        while items.last().is_some_and(|(vg, _)| !maps(grown, *vg)) {
            grown += 1;
        }
        let root = if grown == levels {
            self.apply(man, grown - 1, 0, root, items, b, made)?
        } else {
            self.apply_grown(man, grown - 1, levels, root, items, b, made)?
        };
        Ok((root, grown))
    }

    /// After a commit: once the tail is [`TAIL_FOLD`] long, fold it in
    /// the background (one fold at a time); the next commit after it is
    /// uploaded names it.
    fn maybe_fold(&self) {
        let (man, ctr) = {
            let mut st = self.state.lock().unwrap();
            if st.man.tail.len() < TAIL_FOLD
                || st.folding.is_some()
                || st.fold.is_some()
                || !st.owner
                || st.fenced.is_some()
            {
                return;
            }
            let ctr = st.next_ctr;
            st.next_ctr += 1;
            st.folding = Some(ctr);
            (st.man.clone(), ctr)
        };
        let Some(me) = self.me.upgrade() else { return };
        let spawned = std::thread::Builder::new()
            .name("strata-fold".into())
            .spawn(move || {
                let r = me.fold_in_background(&man, ctr);
                let mut st = me.state.lock().unwrap();
                st.folding = None;
                match r {
                    Ok(f) => st.fold = Some(f),
                    Err(e) => tracing::warn!(
                        "disk '{}': a background fold failed (a later one retries): {e}",
                        me.name
                    ),
                }
            });
        if spawned.is_err() {
            self.state.lock().unwrap().folding = None;
        }
    }

    /// Fold `man`'s tail into its map: upload the nodes as segment `ctr`.
    fn fold_in_background(&self, man: &Manifest, ctr: u32) -> Result<Fold> {
        let mut b = SegmentBuilder::new(SegId {
            disk: self.id,
            gen: man.generation,
            ctr,
        });
        let mut nodes = Vec::new();
        let (root, levels) =
            self.fold_tail(man, man.root, man.levels, &man.tail, &mut b, &mut nodes)?;
        if !nodes.is_empty() {
            self.upload(&[(b.id, Bytes::from(b.seal(now_ms())))])?;
            crash_point("after-fold");
            for (e, n) in nodes {
                self.ds.cache.insert_node(&e, n);
            }
        }
        Ok(Fold {
            gen: man.generation,
            base_root: man.root,
            base_levels: man.levels,
            folded: man.tail.clone(),
            root,
            levels,
        })
    }

    /// PUT segment `id`, then keep it in the cache: a copy, so a cache
    /// that cannot keep it (a full or broken cache directory) is no error;
    /// reads then fetch it from the store.
    fn put_segment(&self, id: SegId, bytes: &Bytes) -> Result<()> {
        self.store().put(&id.key(), bytes.clone())?;
        let _ = self.ds.cache.insert(id, bytes);
        Ok(())
    }

    /// Upload a segment a move made (compaction); the cache keeps the
    /// grains that were cached where they were (`hot`, their new slots),
    /// or all of it while it has room (`SegmentCache::insert_moved`).
    fn put_moved(&self, id: SegId, bytes: &Bytes, hot: &[u32]) -> Result<()> {
        self.store().put(&id.key(), bytes.clone())?;
        let _ = self.ds.cache.insert_moved(id, bytes, hot);
        Ok(())
    }

    /// Upload sealed segments, two at a time, and keep them in the cache.
    fn upload(&self, sealed: &[(SegId, Bytes)]) -> Result<()> {
        let next = std::sync::atomic::AtomicUsize::new(0);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        std::thread::scope(|sc| {
            for _ in 0..sealed.len().min(2) {
                sc.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((id, bytes)) = sealed.get(i) else {
                        break;
                    };
                    if first_error.lock().unwrap().is_some() {
                        break;
                    }
                    if let Err(e) = self.put_segment(*id, bytes) {
                        first_error.lock().unwrap().get_or_insert(e);
                        break;
                    }
                });
            }
        });
        match first_error.into_inner().unwrap() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Copy-on-write the subtree at `level` covering from `first` (entry
    /// `at`) with `items` (sorted, all inside it); new nodes go into `b`.
    #[expect(clippy::too_many_arguments)]
    fn apply(
        &self,
        man: &Manifest,
        level: u8,
        first: u64,
        at: Option<Entry>,
        items: &[(u64, Option<Entry>)],
        b: &mut SegmentBuilder,
        made: &mut Vec<(Entry, MapNode)>,
    ) -> Result<Option<Entry>> {
        let node = match at {
            Some(e) => (*self.ds.cache.node(&self.ds.store, &e, level, first)?).clone(),
            None => MapNode::empty(level, self.id, man.generation, first),
        };
        self.fill(man, node, level, first, items, b, made)
    }

    /// [`apply`](Self::apply) on a tree grown to `level + 1` levels from
    /// `root`'s `root_levels` (FORMAT.md §11.5): each new level a node
    /// whose entry 0 is the level below, the old root at the bottom.
    #[expect(clippy::too_many_arguments)]
    fn apply_grown(
        &self,
        man: &Manifest,
        level: u8,
        root_levels: u8,
        root: Option<Entry>,
        items: &[(u64, Option<Entry>)],
        b: &mut SegmentBuilder,
        made: &mut Vec<(Entry, MapNode)>,
    ) -> Result<Option<Entry>> {
        if level + 1 == root_levels {
            if items.is_empty() {
                return Ok(root);
            }
            return self.apply(man, level, 0, root, items, b, made);
        }
        let below = items.partition_point(|(vg, _)| *vg < MapNode::span_of_entry(level));
        let mut node = MapNode::empty(level, self.id, man.generation, 0);
        node.entries[0] =
            self.apply_grown(man, level - 1, root_levels, root, &items[..below], b, made)?;
        self.fill(man, node, level, 0, &items[below..], b, made)
    }

    /// Set `items` (sorted, inside `node`'s span) in `node`, copying on
    /// write the subtrees they fall in; the node goes into `b` (None: it
    /// maps nothing).
    #[expect(clippy::too_many_arguments)]
    fn fill(
        &self,
        man: &Manifest,
        mut node: MapNode,
        level: u8,
        first: u64,
        items: &[(u64, Option<Entry>)],
        b: &mut SegmentBuilder,
        made: &mut Vec<(Entry, MapNode)>,
    ) -> Result<Option<Entry>> {
        node.disk = self.id;
        node.gen = man.generation;
        let span = MapNode::span_of_entry(level);
        let mut i = 0;
        while i < items.len() {
            let idx = ((items[i].0 - first) / span) as usize;
            let mut j = i + 1;
            while j < items.len() && ((items[j].0 - first) / span) as usize == idx {
                j += 1;
            }
            node.entries[idx] = if level == 0 {
                items[i].1
            } else {
                let child_first = first + idx as u64 * span;
                self.apply(
                    man,
                    level - 1,
                    child_first,
                    node.entries[idx],
                    &items[i..j],
                    b,
                    made,
                )?
            };
            i = j;
        }
        if node.entries.iter().all(Option::is_none) {
            return Ok(None);
        }
        let e = b.add_node(&node);
        made.push((e, node));
        Ok(Some(e))
    }

    fn to_block(&self, e: Error) -> BlockError {
        let kind = match e.kind {
            ErrorKind::Corrupt => BErr::Corrupt,
            ErrorKind::InvalidArgument => BErr::InvalidArgument,
            ErrorKind::Released => BErr::ReadOnly,
            _ => BErr::Io,
        };
        BlockError::new(kind, e.message)
    }
}

impl BlockDevice for SharedDisk {
    fn size_bytes(&self) -> u64 {
        match &self.snapshot {
            Some(s) => s.size_bytes,
            None => self.state.lock().unwrap().man.size_bytes,
        }
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<ReadFill> {
        check_range(offset, buf.len() as u64, self.size_bytes())?;
        self.throttle.admit(buf.len() as u64);
        self.refresh_if_stale();
        let first = offset / G;
        let end = (offset + buf.len() as u64).div_ceil(G);
        let read = |buf: &mut [u8]| {
            if offset.is_multiple_of(G) && buf.len().is_multiple_of(GRAIN) {
                self.read_grains(first, buf)
            } else {
                let mut tmp = vec![0u8; ((end - first) * G) as usize];
                self.read_grains(first, &mut tmp)?;
                let skip = (offset - first * G) as usize;
                buf.copy_from_slice(&tmp[skip..skip + buf.len()]);
                Ok(())
            }
        };
        match read(buf) {
            // Rule 5: what an older manifest named was collected; the
            // newest one names where it is now.
            Err(e) if e.kind == ErrorKind::NotFound && self.refresh_now() => {
                read(buf).map_err(|e| self.to_block(e))?
            }
            r => r.map_err(|e| self.to_block(e))?,
        }
        Ok(ReadFill::all_data(buf.len() as u64))
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(BErr::ReadOnly, self.name.clone()));
        }
        check_range(offset, buf.len() as u64, self.size_bytes())?;
        self.throttle.admit(buf.len() as u64);
        self.write_bytes(buf, offset)
            .map_err(|e| self.to_block(e))?;
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> BlockResult<()> {
        if self.read_only {
            return Ok(());
        }
        // A fenced disk's commit fails with the fencing message.
        self.commit().map_err(|e| self.to_block(e))
    }

    fn unmap(&self, offset: u64, len: u64) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(BErr::ReadOnly, self.name.clone()));
        }
        check_range(offset, len, self.size_bytes())?;
        self.throttle.admit(0);
        // Only whole grains are released; a partial grain keeps its data
        // (unmap is advisory).
        let first = offset.div_ceil(G);
        let end = (offset + len) / G;
        if first < end {
            self.ensure_owner(false).map_err(|e| self.to_block(e))?;
            self.put_grains((first..end).map(|vg| (vg, None)).collect())
                .map_err(|e| self.to_block(e))?;
        }
        Ok(())
    }

    /// Zeros are holes here whatever `may_unmap` says (FORMAT.md §11.4a: a
    /// commit stores no zero grain), and an object store has no space to
    /// provision ahead. `fast_only` refuses only a partial grain over data.
    fn write_zeroes(&self, offset: u64, len: u64, opts: ZeroOptions) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(BErr::ReadOnly, self.name.clone()));
        }
        check_range(offset, len, self.size_bytes())?;
        self.throttle.admit(0);
        if opts.fast_only {
            if let Some(why) = self
                .slow_zeroing(offset, len)
                .map_err(|e| self.to_block(e))?
            {
                return Err(BlockError::new(
                    BErr::NotSupported,
                    format!("'{}': no fast zeroing here: {why}", self.name),
                ));
            }
        }
        self.zero_bytes(offset, len).map_err(|e| self.to_block(e))?;
        if opts.fua {
            self.flush()?;
        }
        Ok(())
    }

    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        check_range(offset, len, self.size_bytes())?;
        let (overlay, man) = {
            let st = self.state.lock().unwrap();
            (
                self.overlay(&st, offset / G..(offset + len).div_ceil(G)),
                st.man.clone(),
            )
        };
        let (root, levels) = self.root(&man);
        let mut out: Vec<Extent> = Vec::new();
        let mut at = offset;
        let end = offset + len;
        while at < end {
            let vg = at / G;
            let next = ((vg + 1) * G).min(end);
            let present = match overlay.get(&vg) {
                Some(p) => *p,
                None => self
                    .lookup(root, levels, vg)
                    .map_err(|e| self.to_block(e))?
                    .is_some(),
            };
            let piece = next - at;
            match out.last_mut() {
                Some(l) if l.hole != present => l.len_bytes += piece,
                _ => out.push(Extent {
                    len_bytes: piece,
                    hole: !present,
                    zero: !present,
                }),
            }
            at = next;
        }
        Ok(out)
    }
}
