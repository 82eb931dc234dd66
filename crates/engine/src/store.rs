//! The open store: metadata behind its lock, the I/O gate and stripes, the
//! commit and checkpoint protocols (docs/FORMAT.md §5), the one space rule,
//! and fail-stop. Below the I/O path (`disk`) and the catalog operations
//! (`datastore`); it knows neither.
//!
//! Locks, always taken in this order: `commit` → `gate` → stripes → `meta`.
//! - `gate` (RwLock): every client I/O holds it shared for its whole
//!   duration; operations that change sharing (snapshot, revert, clone,
//!   delete) and the release of freed grains take it exclusively, so no I/O
//!   decided on a stale view of sharing is still running.
//! - stripes: per (version, 16-grain group) mutexes that serialise writes to
//!   the same grains (read-modify-write of a sub-grain write, allocation).
//! - `meta`: all metadata; held only for map lookups and updates, never
//!   across data I/O.

use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

/// A stripe held by a planned write ([`Store::hold_stripes`]).
pub type StripeGuard = parking_lot::ArcMutexGuard<parking_lot::RawMutex, ()>;
use strata_format::{catalog_file, Superblock, GRAIN_BYTES, SUPER_SLOT_BYTES};
use strata_storage::{Backend, Storage};

use strata_api::FailStop;

use crate::error::{err, Error, ErrorKind, Result};
use crate::journal::{LogFiles, LogWriter};
use crate::meta::{DirtyPages, EncodedPage, Meta};

/// Checkpoint when the log passes this many bytes.
pub const LOG_BYTES_MAX: u64 = 64 << 20;
/// Older generations' batches behind a closed log are cut once they
/// exceed this (FORMAT.md §5, "Checkpoint", step 6).
const LOG_TRIM_SLACK_BYTES: u64 = 1 << 20;
/// Work per reclaim step (grains; a whole leaf counts 512).
pub const RECLAIM_STEP_GRAINS: u64 = 4096;
/// Commit once the in-memory log buffer holds this much, flush or not.
pub const LOG_BUFFER_BYTES_MAX: usize = 8 << 20;
/// Longest run of freed grains given back to the file system in one call
/// (8 MiB): a punch holds the file's lock, and writers queue behind it.
const PUNCH_CHUNK_GRAINS: usize = 2048;
/// Shortest run of adjacent freed grains worth a punch (64 KiB).
pub const PUNCH_MIN_GRAINS: usize = 16;
/// Stripe locks serialising writes to nearby grains.
pub(crate) const STRIPES: usize = 1024;
/// Grains per stripe key.
pub(crate) const STRIPE_GRAINS_SHIFT: u32 = 4;

/// See [`Store::fail_on_panic`].
pub(crate) struct FailOnPanic<'a>(&'a Store);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.fail_stop(Error::new(
                ErrorKind::Corrupt,
                "an internal check failed in the middle of a change (see the server's log)",
            ));
        }
    }
}

/// A wake-up for the background committer.
#[derive(Default)]
pub(crate) struct Kick {
    /// A background committer runs.
    pub running: AtomicBool,
    wanted: Mutex<bool>,
    cv: Condvar,
}

impl Kick {
    /// Ask for a commit (and the checkpoint it may lead to), without waiting.
    pub fn kick(&self) {
        *self.wanted.lock() = true;
        self.cv.notify_one();
    }

    /// Wait up to `timeout` for a kick; true if there was one.
    pub fn wait(&self, timeout: std::time::Duration) -> bool {
        let mut w = self.wanted.lock();
        if !*w {
            self.cv.wait_for(&mut w, timeout);
        }
        std::mem::take(&mut *w)
    }
}

/// Fail-stop state. Held per datastore today; nothing in it is global, so a
/// shared datastore can keep one per disk.
#[derive(Default)]
pub(crate) struct FailState {
    stopped: AtomicBool,
    why: Mutex<Option<FailStop>>,
}

/// A space request against the one rule (FORMAT.md §7).
pub(crate) struct SpaceRequest {
    /// A reservation (thick create or extend) rather than a write.
    pub reserve: bool,
    /// Grains the operation will take or reserve.
    pub grains: u64,
    /// Of those, grains that fill the caller's own existing reservation (a
    /// thick disk writing its own space) and so add nothing.
    pub own_reserved: u64,
}

/// What commits need: the log being appended to.
pub(crate) struct CommitState {
    pub log: LogWriter,
    /// Value of `Store::mutations` at the start of the last commit's data sync.
    pub synced_mutations: u64,
}

/// What checkpoints need (one at a time).
pub(crate) struct CheckpointState {
    pub logs: LogFiles,
    pub sb: Superblock,
    /// Which superblock slots hold a valid superblock.
    pub slot_valid: [bool; 2],
    /// The page-image batch being built, kept between checkpoints: a fresh
    /// 8 MiB buffer each time cost ~2,000 page faults a checkpoint.
    pub images: Vec<u8>,
}

/// The closing generation's log during a checkpoint: handed over by the
/// commit path (commits go on in the next log), or still under the commit
/// lock when both logs share a file.
enum Closing<'a> {
    Owned(LogWriter),
    Held(MutexGuard<'a, CommitState>),
}

impl Closing<'_> {
    fn log(&mut self) -> &mut LogWriter {
        match self {
            Closing::Owned(l) => l,
            Closing::Held(cs) => &mut cs.log,
        }
    }
}

/// A checkpoint's cut: the state it writes (FORMAT.md §5, "Checkpoint").
struct Cut {
    next: u64,
    pages: DirtyPages,
    catalog: Vec<u8>,
    /// (page-change sequence, pool end) at the cut.
    at: (u64, u64),
}

/// Whether clients are doing I/O, as one piece of background work sees
/// it between its steps ([`Store::client_watch`]).
pub(crate) struct ClientWatch<'a> {
    store: &'a Store,
    /// [`Store::client_ops`] at the last look.
    seen: u64,
}

impl ClientWatch<'_> {
    /// A client command is in flight now (it holds the gate), or one began
    /// since the last look. Between two commands of a busy client the gate
    /// is free for a moment, and under writeback a write holds it only for
    /// its copy: a look at the gate alone took clients writing at 30k IOPS
    /// for idle most of the time.
    pub fn busy(&mut self) -> bool {
        let n = self.store.client_ops.load(Ordering::Relaxed);
        n != std::mem::replace(&mut self.seen, n) || self.store.gate.is_locked()
    }
}

pub(crate) struct Store {
    pub backend: Arc<dyn Backend>,
    pub pool: Arc<dyn Storage>,
    pub refs: Arc<dyn Storage>,
    pub super_file: Arc<dyn Storage>,
    pub meta: Mutex<Meta>,
    /// In an `Arc` so a read planned for a ring can own its hold
    /// (`DiskHandle::plan_read`).
    pub gate: Arc<RwLock<()>>,
    pub commit: Mutex<CommitState>,
    checkpoint: Mutex<CheckpointState>,
    /// While a checkpoint runs, freed grains are not made allocatable (one
    /// could be a node the checkpoint is about to write in place); they
    /// wait here.
    checkpoint_running: AtomicBool,
    deferred_frees: Mutex<Vec<u64>>,
    /// Checkpoints completed since open.
    pub checkpoints: AtomicU64,
    /// Wakes the background committer, when one runs (see
    /// `Datastore::start_background_commits`).
    pub background: Arc<Kick>,
    /// Wakes the readier of pool space (FORMAT.md §7.1), when one runs.
    pub readier: Arc<Kick>,
    /// In `Arc`s so a planned write can own its guards (`hold_stripes`).
    pub stripes: Vec<Arc<Mutex<()>>>,
    /// Bumped by every completed client write, so flush knows if it must sync.
    pub mutations: AtomicU64,
    /// Regions a pack pass found nothing in, and whether their heads were
    /// written since (`crate::settled`).
    pub settled: crate::settled::Settled,
    /// Client commands begun (reads, writes, zeroing, block status), so
    /// background work can tell whether clients are doing I/O.
    pub client_ops: AtomicU64,
    pub fail: FailState,
    /// Problems found at open that did not stop it (a damaged superblock
    /// slot); `check` reports them.
    pub open_warnings: Vec<String>,
    /// Log batches open replayed: not 0 when the last process that had
    /// the datastore open did not close it (FORMAT.md §5, §13 `recovery`).
    pub replayed_batches: usize,
    capacity_cache: Mutex<(Option<Instant>, u64)>,
    /// Background reclaimer of orphaned maps, when started.
    pub reclaimer: Mutex<Option<std::thread::JoinHandle<()>>>,
    pub reclaim_stop: AtomicBool,
    /// Each disk's I/O limits, shared by its handles (created on first open).
    throttles: Mutex<std::collections::HashMap<u64, Arc<crate::throttle::Throttle>>>,
    /// Configured capacity (0 = the file system's); changed only by
    /// `set_capacity`, under the meta lock.
    configured_capacity_bytes: AtomicU64,
    /// Thin disks' all-zero writes allocate nothing (FORMAT.md §7.4).
    pub detect_zeroes: AtomicBool,
    /// The unwrapped keys of the keyrings unlocked in this process, by
    /// keyring id (FORMAT.md §16); wiped when dropped.
    pub keys: Mutex<std::collections::HashMap<u64, HeldKeys>>,
    /// The log files have been preallocated for reservations (§7.1).
    logs_held: AtomicBool,
    /// A free-space consolidation runs (one at a time, FORMAT.md §10.4).
    pub consolidating: AtomicBool,
    /// The pool was opened for direct I/O (`OpenOptions::direct_io`).
    pub direct_io: bool,
    _lock: Option<File>,
}

/// What `Store::new` needs.
pub(crate) struct StoreParts {
    pub backend: Arc<dyn Backend>,
    pub pool: Arc<dyn Storage>,
    pub refs: Arc<dyn Storage>,
    pub super_file: Arc<dyn Storage>,
    pub meta: Meta,
    pub commit: CommitState,
    pub checkpoint: CheckpointState,
    pub open_warnings: Vec<String>,
    pub replayed_batches: usize,
    pub lock: Option<File>,
    pub direct_io: bool,
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Store {
    pub fn new(p: StoreParts) -> Self {
        let configured = p.checkpoint.sb.capacity_bytes;
        Store {
            backend: p.backend,
            pool: p.pool,
            refs: p.refs,
            super_file: p.super_file,
            meta: Mutex::new(p.meta),
            gate: Arc::new(RwLock::new(())),
            commit: Mutex::new(p.commit),
            checkpoint: Mutex::new(p.checkpoint),
            checkpoint_running: AtomicBool::new(false),
            deferred_frees: Mutex::new(Vec::new()),
            checkpoints: AtomicU64::new(0),
            background: Arc::new(Kick::default()),
            readier: Arc::new(Kick::default()),
            direct_io: p.direct_io,
            stripes: (0..STRIPES).map(|_| Arc::new(Mutex::new(()))).collect(),
            mutations: AtomicU64::new(0),
            settled: Default::default(),
            client_ops: AtomicU64::new(0),
            fail: FailState::default(),
            open_warnings: p.open_warnings,
            replayed_batches: p.replayed_batches,
            capacity_cache: Mutex::new((None, 0)),
            reclaimer: Mutex::new(None),
            reclaim_stop: AtomicBool::new(false),
            throttles: Mutex::new(Default::default()),
            configured_capacity_bytes: AtomicU64::new(configured),
            detect_zeroes: AtomicBool::new(true),
            keys: Mutex::new(Default::default()),
            logs_held: AtomicBool::new(false),
            consolidating: AtomicBool::new(false),
            _lock: p.lock,
        }
    }

    /// Disk `id`'s throttle, made with `limits` if it has none yet.
    pub fn throttle(&self, id: u64, limits: crate::IoLimits) -> Arc<crate::throttle::Throttle> {
        self.throttles
            .lock()
            .entry(id)
            .or_insert_with(|| Arc::new(crate::throttle::Throttle::new(limits)))
            .clone()
    }

    // ------------------------------------------------------------ fail-stop

    /// Refuse a change once the datastore has fail-stopped.
    pub fn check_writable(&self) -> Result<()> {
        if self.fail.stopped.load(Ordering::Acquire) {
            let why = self.fail.why.lock().clone();
            let cause = why.map(|w| w.cause).unwrap_or_default();
            return err(
                ErrorKind::Io,
                format!(
                    "the datastore stopped accepting writes after an error ({cause}); \
                     restart the server (reopen the datastore) to recover from its log"
                ),
            );
        }
        Ok(())
    }

    /// Stop all further writes: an error happened after a change began, so
    /// the state in memory can no longer be trusted to extend the log. What
    /// was flushed stays recoverable; reopening recovers. The first cause
    /// is kept.
    pub fn fail_stop(&self, e: Error) -> Error {
        {
            let mut why = self.fail.why.lock();
            if why.is_none() {
                tracing::error!(event = "fail_stop", "fail-stop: {e}");
                *why = Some(FailStop {
                    cause: e.message.clone(),
                    since_unix: now_unix(),
                });
            }
        }
        self.fail.stopped.store(true, Ordering::Release);
        e
    }

    /// The fail-stop state, if the datastore has stopped.
    pub fn failed(&self) -> Option<FailStop> {
        self.fail.why.lock().clone()
    }

    /// A guard that fail-stops the datastore if it is dropped while the
    /// thread panics: a release assertion that fails in the middle of a
    /// change (the transport may catch the panic and go on serving) must
    /// not leave the half-made change to be committed.
    pub fn fail_on_panic(&self) -> FailOnPanic<'_> {
        FailOnPanic(self)
    }

    /// Run a metadata change; an error after its first change fail-stops.
    /// (Every change appends to the log or marks versions or the catalog
    /// dirty, which `Meta::change_count` counts.)
    pub fn guarded<T>(&self, m: &mut Meta, f: impl FnOnce(&mut Meta) -> Result<T>) -> Result<T> {
        let _fence = self.fail_on_panic();
        let before = m.change_count();
        match f(m) {
            Ok(v) => Ok(v),
            Err(e) if m.change_count() != before => Err(self.fail_stop(e)),
            Err(e) => Err(e),
        }
    }

    // ------------------------------------------------------------ space

    /// Grains the datastore may hold in all. Following the file system,
    /// the pool file (with its reserved tail) counts as the datastore's.
    pub fn capacity_grains(&self, m: &Meta) -> u64 {
        let configured = self.configured_capacity_bytes.load(Ordering::Acquire);
        if configured > 0 {
            return configured / GRAIN_BYTES;
        }
        let mut c = self.capacity_cache.lock();
        let fresh = c.0.map(|t| t.elapsed().as_millis() < 500).unwrap_or(false);
        if !fresh {
            let free = self.backend.free_bytes().unwrap_or(u64::MAX / 2);
            c.1 = free / GRAIN_BYTES;
            c.0 = Some(Instant::now());
        }
        m.tail_end().saturating_add(c.1)
    }

    /// The configured capacity in bytes; 0 = it follows the file system.
    pub fn configured_capacity_bytes(&self) -> u64 {
        self.configured_capacity_bytes.load(Ordering::Acquire)
    }

    /// Set the configured capacity (0: follow the file system) and return
    /// once a checkpoint has written it into the superblock (FORMAT.md §2,
    /// "Changing the capacity"). Refused when used + reserved would not fit.
    /// A lower capacity applies before the checkpoint, a higher one after
    /// it, so no allocation ever passes the capacity a crash leaves.
    pub fn set_capacity(&self, bytes: u64) -> Result<()> {
        let _fence = self.fail_on_panic();
        // Held to the end: no other checkpoint writes a superblock meanwhile.
        let mut ck = self.checkpoint.lock();
        self.check_writable()?;
        let loosens = {
            // Nothing allocates or reserves while the figures are compared.
            let _drain = self.gate.write();
            let m = self.meta.lock();
            let current = self.capacity_grains(&m);
            // Swapped only under the meta lock, which every reader holds.
            let old = self.configured_capacity_bytes.swap(bytes, Ordering::AcqRel);
            let new = self.capacity_grains(&m);
            let needed = m.used_grains() + m.reserved_grains();
            if needed > new {
                self.configured_capacity_bytes.store(old, Ordering::Release);
                let mib = |g: u64| (g * GRAIN_BYTES) >> 20;
                let what = if bytes == 0 {
                    format!("the file system's room ({} MiB)", mib(new))
                } else {
                    format!("{} MiB", bytes >> 20)
                };
                return err(
                    ErrorKind::NoSpace,
                    format!(
                        "cannot set the capacity to {what}: {} MiB are used and {} MiB reserved \
                         by thick disks ({} MiB in all)",
                        mib(m.used_grains()),
                        mib(m.reserved_grains()),
                        mib(needed)
                    ),
                );
            }
            let loosens = new >= current;
            if loosens {
                self.configured_capacity_bytes.store(old, Ordering::Release);
            }
            loosens
        };
        ck.sb.capacity_bytes = bytes;
        self.checkpoint_held(ck)?;
        if loosens {
            let _m = self.meta.lock();
            self.configured_capacity_bytes
                .store(bytes, Ordering::Release);
        }
        *self.capacity_cache.lock() = (None, 0);
        Ok(())
    }

    /// Set incompatible feature `bit` in the superblock, if it is not set
    /// yet, and return once a checkpoint has written it (FORMAT.md §16.3:
    /// before the first keyring is logged).
    pub fn ensure_incompat(&self, bit: u32) -> Result<()> {
        let _fence = self.fail_on_panic();
        let mut ck = self.checkpoint.lock();
        if ck.sb.incompat & bit == bit {
            return Ok(());
        }
        self.check_writable()?;
        ck.sb.incompat |= bit;
        self.checkpoint_held(ck)
    }

    /// Hold the host space a reservation of `extra` more grains by
    /// `extra_disks` more thick disks needs (FORMAT.md §7.1), before it is
    /// taken: the reserved tail, and room for the logs.
    pub fn hold_reservation(&self, m: &mut Meta, extra: u64, extra_disks: u64) -> Result<()> {
        m.hold_reservation(extra, extra_disks)?;
        self.capacity_cache.lock().0 = None;
        if m.tail_target(extra, extra_disks) > 0 && !self.logs_held.swap(true, Ordering::AcqRel) {
            // Room for the metadata of writes into the reservation: the
            // logs, and the catalog rewritten by each checkpoint.
            let catalog = m.catalog_full().encode().len() as u64;
            let holds = [
                (strata_format::journal_file(0), LOG_BYTES_MAX),
                (strata_format::journal_file(1), LOG_BYTES_MAX),
                (catalog_file(0), (4 * catalog).max(64 << 10)),
                (catalog_file(1), (4 * catalog).max(64 << 10)),
            ];
            for (name, bytes) in holds {
                let r = self
                    .backend
                    .open(name, false)
                    .and_then(|f| f.allocate(0, bytes, true));
                if let Err(e) = r {
                    tracing::warn!("could not preallocate {name}: {e}");
                }
            }
        }
        Ok(())
    }

    /// Reserve `grains` more for one more thick disk (a new one, or one
    /// converted): refused unless they fit the capacity, then held.
    pub fn reserve_thick(&self, m: &mut Meta, grains: u64) -> Result<()> {
        let req = SpaceRequest {
            reserve: true,
            grains,
            own_reserved: 0,
        };
        self.check_space(m, req)?;
        self.hold_reservation(m, grains, 1)
    }

    /// The one space rule (FORMAT.md §7): used + reserved + what is asked,
    /// less what fills the asker's own reservation, must fit the capacity.
    pub fn check_space(&self, m: &Meta, req: SpaceRequest) -> Result<()> {
        let cap = self.capacity_grains(m);
        let reserved = m.reserved_grains();
        let used = m.used_grains();
        let wanted = req.grains - req.own_reserved.min(req.grains);
        if used + reserved + wanted > cap {
            let mib = |g: u64| (g * GRAIN_BYTES) >> 20;
            let what = if req.reserve {
                format!("cannot reserve {} MiB", mib(req.grains))
            } else {
                format!("datastore full: {} MiB asked", mib(req.grains))
            };
            return err(
                ErrorKind::NoSpace,
                format!(
                    "{what}: capacity {} MiB, {} MiB used, {} MiB reserved by thick disks",
                    mib(cap),
                    mib(used),
                    mib(reserved)
                ),
            );
        }
        Ok(())
    }

    // ------------------------------------------------------------ commit

    /// Make everything written so far durable (group commit); checkpoint
    /// when forced or when the log or dirty metadata has grown past its
    /// bound (then without waiting if one already runs).
    pub fn commit(&self, force_checkpoint: bool) -> Result<()> {
        let _fence = self.fail_on_panic();
        let t0 = Instant::now();
        let mut cs = self.commit.lock();
        let t_lock = t0.elapsed();
        self.check_writable()?;
        let seen = self.mutations.load(Ordering::Acquire);
        let batch = self.meta.lock().take_batch();
        if let Err(e) = self.write_batch(&mut cs, &batch.payload, seen) {
            // The batch left memory: nothing can extend the log any more.
            return Err(self.fail_stop(e));
        }
        if t0.elapsed().as_millis() > 20 {
            tracing::debug!(
                "slow commit: {} bytes, lock after {t_lock:?}, durable after {:?}",
                batch.payload.len(),
                t0.elapsed()
            );
        }
        let freed = self.take_committed(batch.has_pending_frees);
        let needs = force_checkpoint
            || cs.log.offset > LOG_BYTES_MAX
            || self.meta.lock().needs_checkpoint();
        // Punching can take a while (hundreds of MiB after a snapshot
        // delete): other commits, client flushes among them, go ahead.
        drop(cs);
        self.punch_and_release(&freed);
        {
            let mut m = self.meta.lock();
            match m.trim_tail() {
                Ok(true) => self.capacity_cache.lock().0 = None,
                Ok(false) => {}
                Err(e) => tracing::warn!("could not trim the reserved tail: {e}"),
            }
        }
        if needs {
            self.checkpoint(force_checkpoint)?;
        }
        Ok(())
    }

    /// Commit protocol steps 2–3 (FORMAT.md §5): data written up to
    /// mutation count `seen` is synced before the batch that may point at
    /// it is appended and synced. An empty batch with no new data costs
    /// nothing.
    fn write_batch(&self, cs: &mut CommitState, payload: &[u8], seen: u64) -> Result<()> {
        if seen != cs.synced_mutations || !payload.is_empty() {
            self.pool.sync()?;
        }
        if !payload.is_empty() {
            cs.log.append(payload)?;
            cs.log.sync()?;
        }
        cs.synced_mutations = seen;
        Ok(())
    }

    /// The frees of the batch just made durable, once no command still in
    /// flight may be reading one of them.
    fn take_committed(&self, has_frees: bool) -> Vec<u64> {
        if has_frees {
            let _drain = self.gate.write();
            self.meta.lock().take_committed()
        } else {
            self.meta.lock().take_committed()
        }
    }

    /// Give freed grains' space back to the file system, then make them
    /// allocatable. In that order: a grain allocatable before its punch
    /// could be taken and written by a writer, and the punch would then
    /// zero the new data. While a checkpoint runs, making them allocatable
    /// waits for its end.
    ///
    /// Only runs of at least `PUNCH_MIN_GRAINS` adjacent grains are
    /// punched, at most `PUNCH_CHUNK_GRAINS` per call so that writers
    /// waiting on the file's lock get in between. Scattered grains (the old
    /// versions of random overwrites, freed when a snapshot goes) stay
    /// allocated in the file for the allocator to reuse: punching them one
    /// by one cost half the server's CPU and cut random writes from ~40k to
    /// ~3k IOPS while a snapshot delete was being reclaimed.
    fn punch_and_release(&self, sorted: &[u64]) {
        if sorted.is_empty() {
            return;
        }
        let mut i = 0;
        while i < sorted.len() {
            let mut end = i + 1;
            while end < sorted.len() && sorted[end] == sorted[end - 1] + 1 {
                end += 1;
            }
            if end - i >= PUNCH_MIN_GRAINS {
                for chunk in sorted[i..end].chunks(PUNCH_CHUNK_GRAINS) {
                    let start = chunk[0] * GRAIN_BYTES;
                    let len = chunk.len() as u64 * GRAIN_BYTES;
                    // Before the punch: an allocation that trusts the
                    // block to be held must not pick it meanwhile.
                    self.meta.lock().mark_unbacked(chunk[0], chunk.len() as u64);
                    if let Err(e) = self.pool.punch_hole(start, len) {
                        tracing::warn!("could not punch freed space at {start}+{len}: {e}");
                    }
                }
            }
            i = end;
        }
        let mut deferred = self.deferred_frees.lock();
        if self.checkpoint_running.load(Ordering::Acquire) {
            deferred.extend_from_slice(sorted);
        } else {
            self.meta.lock().release(sorted);
        }
    }

    /// The generation a checkpoint starts after `current`: the next one,
    /// unless its slot holds the only valid superblock (the other was found
    /// damaged), then the one after, whose slot is the damaged one.
    fn next_generation(current: u64, slot_valid: &[bool; 2]) -> u64 {
        let next = current + 1;
        let slot = (next % 2) as usize;
        if slot_valid[slot] && !slot_valid[1 - slot] {
            next + 1
        } else {
            next
        }
    }

    /// Checkpoint (FORMAT.md §5). `wait`: wait for a running one to end and
    /// run anyway; otherwise return at once if one runs.
    pub fn checkpoint(&self, wait: bool) -> Result<()> {
        self.checkpoint_if(wait, |_| true)
    }

    /// As [`Store::checkpoint`], but once it holds the checkpoint lock it
    /// runs only if `still(meta)` (a writer that waited for a running
    /// checkpoint need not run a second one).
    fn checkpoint_if(&self, wait: bool, still: impl Fn(&Meta) -> bool) -> Result<()> {
        let _fence = self.fail_on_panic();
        let ck = if wait {
            self.checkpoint.lock()
        } else {
            match self.checkpoint.try_lock() {
                Some(ck) => ck,
                None => return Ok(()),
            }
        };
        self.check_writable()?;
        if !still(&self.meta.lock()) {
            return Ok(());
        }
        self.checkpoint_held(ck)
    }

    /// Checkpoint with the checkpoint lock held.
    fn checkpoint_held(&self, mut ck: MutexGuard<'_, CheckpointState>) -> Result<()> {
        {
            let _d = self.deferred_frees.lock();
            self.checkpoint_running.store(true, Ordering::Release);
        }
        let r = self.checkpoint_locked(&mut ck);
        let deferred = {
            let mut d = self.deferred_frees.lock();
            self.checkpoint_running.store(false, Ordering::Release);
            std::mem::take(&mut *d)
        };
        drop(ck);
        if !deferred.is_empty() {
            self.meta.lock().release(&deferred);
        }
        r.map_err(|e| self.fail_stop(e))
    }

    /// The cut, under the commit lock: drain I/O for a moment, take the
    /// last records of the closing generation and every dirty page (shared,
    /// copied on write: see `PageData`), then make those records durable
    /// with GENERATION_END.
    fn cut(&self, cs: &mut CommitState, ck: &CheckpointState) -> Result<(Cut, Vec<u64>)> {
        let next = Self::next_generation(cs.log.generation, &ck.slot_valid);
        let seen = self.mutations.load(Ordering::Acquire);
        let (batch, cut) = {
            let t0 = Instant::now();
            let _drain = self.gate.write();
            let t_drained = t0.elapsed();
            let mut m = self.meta.lock();
            let batch = m.take_batch();
            let cut = Cut {
                next,
                pages: m.copy_dirty_pages(),
                catalog: m.catalog_full().encode(),
                at: m.cut(),
            };
            tracing::debug!(
                "cut: I/O drained after {t_drained:?}, dirty pages taken after {:?}",
                t0.elapsed()
            );
            (batch, cut)
        };
        let mut payload = batch.payload;
        strata_format::Record::GenerationEnd { next }.encode_into(&mut payload);
        // Fail-stop here, under the commit lock: a commit that got the lock
        // between this error and the caller's fail-stop would take a batch
        // while this one's frees are unsettled.
        self.write_batch(cs, &payload, seen)
            .map_err(|e| self.fail_stop(e))?;
        Ok((cut, self.take_committed(batch.has_pending_frees)))
    }

    /// Steps of a checkpoint from generation `g` to `next`:
    /// the cut (above); page images appended to log `g`; pages, count pages
    /// and catalog in place; the superblock; then log `next` is the one
    /// commits append to. Commits switch to log `next` at the cut and go on
    /// while pages are written and synced, unless both logs share a file
    /// (after a damaged slot, `next` skips a generation), when the commit
    /// lock is held to the end.
    fn checkpoint_locked(&self, ck: &mut CheckpointState) -> Result<()> {
        let t0 = Instant::now();
        let mut cs = self.commit.lock();
        let t_lock = t0.elapsed();
        self.check_writable()?;
        let closing_gen = cs.log.generation;
        let (cut, freed) = self.cut(&mut cs, ck)?;
        let t_cut = t0.elapsed();
        let pages = Meta::encode_pages(cut.pages);
        self.punch_and_release(&freed);
        let same_file = cut.next % 2 == closing_gen % 2;
        let mut closing = if same_file {
            Closing::Held(cs)
        } else {
            let c = std::mem::replace(&mut cs.log, ck.logs.start(cut.next));
            drop(cs);
            Closing::Owned(c)
        };
        // Page images, so a page torn in place is rewritten whole by replay.
        let chunks: Vec<&[EncodedPage]> = if pages.is_empty() {
            vec![&[]]
        } else {
            pages.chunks(Meta::IMAGES_PER_BATCH).collect()
        };
        for (i, chunk) in chunks.iter().enumerate() {
            let end = (i + 1 == chunks.len()).then_some(cut.next);
            Meta::image_batch_into(chunk, end, &mut ck.images);
            closing.log().append_sealed(&mut ck.images)?;
        }
        closing.log().sync()?;
        // Pages and catalog in place.
        Meta::write_pages_to(&self.pool, &self.refs, &pages)?;
        self.pool.sync()?;
        self.refs.sync()?;
        let cat_file = self.backend.open(catalog_file(cut.next), true)?;
        cat_file.write_at(&cut.catalog, 0)?;
        cat_file.set_len(cut.catalog.len() as u64)?;
        cat_file.sync()?;
        // The superblock.
        let mut sb = ck.sb.clone();
        sb.version = strata_format::FORMAT_VERSION;
        sb.generation = cut.next;
        sb.pool_grains = cut.at.1;
        sb.catalog_bytes = cut.catalog.len() as u64;
        sb.catalog_checksum = crc32c::crc32c(&cut.catalog);
        let slot = (cut.next % 2) as usize;
        self.super_file
            .write_at(&sb.encode(), slot as u64 * SUPER_SLOT_BYTES as u64)?;
        self.super_file.sync()?;
        ck.slot_valid[slot] = true;
        ck.sb = sb;
        match closing {
            Closing::Held(mut cs) => cs.log = ck.logs.start(cut.next),
            // Log `g` is only read again if slot `next` is found damaged,
            // and then only up to its last batch: older generations'
            // batches behind it go, so the file is as long as one
            // generation's log, not the longest ever (FORMAT.md §5). Not
            // while reservations hold the logs' space preallocated.
            Closing::Owned(c) if !self.logs_held.load(Ordering::Acquire) => {
                if let Err(e) = c.trim(LOG_TRIM_SLACK_BYTES) {
                    tracing::warn!("could not cut the closed log's old batches: {e}");
                }
            }
            Closing::Owned(_) => {}
        }
        self.meta.lock().checkpointed(cut.at);
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            "checkpoint to generation {}: {} pages; commit lock after {:?}, cut done after {:?}, \
             all done after {:?}",
            cut.next,
            pages.len(),
            t_lock,
            t_cut,
            t0.elapsed()
        );
        Ok(())
    }

    /// The part of [`Store::maybe_checkpoint`] that never waits: with a
    /// background committer and both bounds not passed twice over, wake
    /// the committer if needed and say Ok; without one, Ok while neither
    /// bound is passed; otherwise what the writer must do itself (dirty
    /// metadata over the budget, log buffer full).
    pub fn within_bounds(&self) -> std::result::Result<(), (bool, bool)> {
        let (over, half, log_len) = {
            let m = self.meta.lock();
            (m.cache_over_budget(), m.needs_checkpoint(), m.log_len())
        };
        let log_full = log_len > LOG_BUFFER_BYTES_MAX;
        if self.background.running.load(Ordering::Acquire)
            && !over
            && log_len <= 2 * LOG_BUFFER_BYTES_MAX
        {
            if half || log_full {
                self.background.kick();
            }
            return Ok(());
        }
        if !over && !log_full {
            return Ok(());
        }
        Err((over, log_full))
    }

    /// Keep the log buffer and dirty metadata bounded (called by writers
    /// before they take the gate). With a background committer, a writer
    /// only wakes it, and waits itself only past twice the bounds (memory
    /// stays bounded); without one, the writer commits or checkpoints.
    pub fn maybe_checkpoint(&self) -> Result<()> {
        let Err((over, log_full)) = self.within_bounds() else {
            return Ok(());
        };
        if over {
            // Memory is bounded: wait for a checkpoint (the commit may have
            // run one already).
            let t0 = Instant::now();
            self.commit(false)?;
            self.checkpoint_if(true, |m| m.cache_over_budget())?;
            tracing::debug!(
                "writer waited {:?}: dirty metadata over the cache budget",
                t0.elapsed()
            );
        } else if log_full {
            tracing::debug!("writer commits: log buffer over twice its bound");
            // Bound the memory of the log buffer: commit early (harmless;
            // a commit only makes more durable than the client asked for).
            self.commit(false)?;
        }
        Ok(())
    }

    /// One step of readying pool space ahead (FORMAT.md §7.1, "Readied
    /// space"), if one is due: the range is noted under the metadata lock,
    /// allocated on the host without it, and taken as tail under it again.
    /// Returns whether a step ran.
    pub fn ready_space(&self) -> bool {
        let now = Instant::now();
        let Some(step) = self.meta.lock().ready_plan(now) else {
            return false;
        };
        let outcome = self.pool.allocate(
            step.from * GRAIN_BYTES,
            (step.to - step.from) * GRAIN_BYTES,
            false,
        );
        self.meta.lock().ready_done(step, &outcome, now);
        // The capacity follows the file system: it changed.
        self.capacity_cache.lock().0 = None;
        true
    }

    /// Whether freeing in progress could make room (pending frees, orphans).
    pub fn space_to_come(&self) -> bool {
        let m = self.meta.lock();
        m.pending_len() > 0 || m.orphans() > 0
    }

    /// Give back up to about `budget` grains of orphaned maps; an error
    /// part-way fail-stops.
    pub fn reclaim(&self, budget: u64) -> Result<bool> {
        self.check_writable()?;
        let mut m = self.meta.lock();
        let r = self.guarded(&mut m, |m| m.reclaim(budget));
        // Hand the lock to a client waiting for it: a plain unlock lets the
        // reclaimer take it back for its next step before the woken client
        // runs, and the clients starve while a large orphan is reclaimed.
        MutexGuard::unlock_fair(m);
        r
    }

    /// A watch on client I/O for background work to look at between its
    /// steps (see [`ClientWatch::busy`]).
    pub fn client_watch(&self) -> ClientWatch<'_> {
        ClientWatch {
            store: self,
            seen: self.client_ops.load(Ordering::Relaxed),
        }
    }

    /// Reclaim a bounded amount and commit, so freed grains are allocatable.
    pub fn make_space(&self) -> Result<()> {
        self.reclaim(64 * RECLAIM_STEP_GRAINS)?;
        self.commit(false)
    }

    /// Lock the stripes covering virtual grains `[first, last]` of `ver`,
    /// to write them: a pack pass's notes of the range are cleared
    /// (`crate::settled`).
    pub fn lock_stripes(&self, ver: u64, first: u64, last: u64) -> Vec<MutexGuard<'_, ()>> {
        let held = self.lock_stripes_of(&[ver], first, last);
        self.settled.written(ver, first, last);
        held
    }

    /// Lock the stripes covering virtual grains `[first, last]` of every
    /// version of `vers`, in the one global order every locker uses (so a
    /// caller holding several never deadlocks with a client write).
    pub fn lock_stripes_of(&self, vers: &[u64], first: u64, last: u64) -> Vec<MutexGuard<'_, ()>> {
        Self::stripe_indices(vers, first, last)
            .into_iter()
            .map(|i| self.stripes[i].lock())
            .collect()
    }

    /// The stripes of [`Store::lock_stripes`] as guards a planned write
    /// owns until its pieces are written (clearing the notes as it does).
    /// Without `wait`, None when one of them is held (the caller's own
    /// writes in flight may hold it).
    pub fn hold_stripes(
        &self,
        ver: u64,
        first: u64,
        last: u64,
        wait: bool,
    ) -> Option<Vec<StripeGuard>> {
        let held: Option<Vec<StripeGuard>> = Self::stripe_indices(&[ver], first, last)
            .into_iter()
            .map(|i| {
                if wait {
                    Some(self.stripes[i].lock_arc())
                } else {
                    self.stripes[i].try_lock_arc()
                }
            })
            .collect();
        if held.is_some() {
            self.settled.written(ver, first, last);
        }
        held
    }

    /// The stripes covering `[first, last]` of each version, in locking order.
    fn stripe_indices(vers: &[u64], first: u64, last: u64) -> Vec<usize> {
        let k0 = first >> STRIPE_GRAINS_SHIFT;
        let k1 = last >> STRIPE_GRAINS_SHIFT;
        let mut idx: Vec<usize> = if k1 - k0 >= STRIPES as u64 {
            (0..STRIPES).collect()
        } else {
            vers.iter()
                .flat_map(|&ver| {
                    (k0..=k1).map(move |k| {
                        (k.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            ^ ver.wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
                            as usize
                            % STRIPES
                    })
                })
                .collect()
        };
        idx.sort_unstable();
        idx.dedup();
        idx
    }
}

/// The cipher a lineage's data is under, shared by the keyring's held
/// keys and every handle opened through them. It changes only during a
/// deep rekey, under the metadata lock (FORMAT.md §16.4).
pub type CipherCell = Mutex<Arc<strata_crypt::DataCipher>>;

/// One keyring's unlocked keys as this process holds them. A full clone's
/// keyring may share the `Unlocked` of its source; `token` is this entry's
/// own, so handles opened through it (which keep it weakly) are refused
/// once this entry goes (`strata lock`), whatever else shares the keys.
pub struct HeldKeys {
    pub keys: Arc<strata_crypt::Unlocked>,
    pub token: Arc<()>,
    /// The data cipher of `keys` under the keyring's record as it stands.
    pub cipher: Arc<CipherCell>,
}

impl HeldKeys {
    pub fn new(
        keys: Arc<strata_crypt::Unlocked>,
        rec: &strata_crypt::KeyringRec,
    ) -> std::result::Result<HeldKeys, strata_crypt::CryptError> {
        let cipher = Arc::new(Mutex::new(Arc::new(rec.data_cipher(&keys)?)));
        Ok(HeldKeys {
            keys,
            token: Arc::new(()),
            cipher,
        })
    }
}
