//! This host's cache of a shared datastore's objects (docs/FORMAT.md
//! §11.8): whole segments as files under `DIR/cache/` (verified end to
//! end when fetched, by their ends when a restart finds them), sparse
//! files holding the grains scattered reads kept of objects not held
//! whole, and decoded map nodes in memory. A read that misses is answered
//! with a ranged GET of just the grain or node (a cold cache does not make
//! a guest wait for whole segments); then the whole object is fetched in
//! the background (two at a time) while the cache is under half its bound
//! or the misses in the object look like a scan, else the grain alone is
//! kept; past half the bound, a whole object whose reads used at most
//! half of it shrinks to a sparse file of those grains. Objects never
//! change, so nothing here is ever invalidated. The
//! files stay within a bound, evicted by S3-FIFO ([`crate::s3fifo`]) and
//! survive a restart. Every grain and node read is checked against the CRC
//! its map entry carries; a cached copy that fails is dropped and the read
//! goes to the store.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use strata_api::store::CacheStats;
use strata_s3::{Bytes, ObjectStore};

mod files;
use files::{held_pages, list_files, read_ahead};

use crate::layout::{
    check_segment_ends, decode_segment_header, verify_segment, Entry, Manifest, MapNode, SegId,
    SegmentInfo, GRAIN, NODE_BYTES, SEG_DATA_OFFSET, SEG_HEADER_BYTES, SEG_TRAILER_BYTES,
};
use crate::s3fifo::{Arrival, S3Fifo, USE_GAP};
use crate::{corrupt, Error, ErrorKind, Result};

struct CachedSegment {
    file: File,
    info: SegmentInfo,
    /// When a use of it was last passed to the policy (see
    /// [`SegmentCache::used`]).
    used_ms: AtomicU64,
    /// A bit per page of its data area read from (a grain in version 1;
    /// see `Entry::pages`), since it arrived (`since_ms`), and when that
    /// was last looked at: what a shrink keeps (FORMAT.md §11.8, §18.6).
    read: Box<[AtomicU64]>,
    since_ms: u64,
    looked_ms: AtomicU64,
}

impl CachedSegment {
    fn note_read(&self, page: u32) {
        if let Some(w) = self.read.get(page as usize / 64) {
            w.fetch_or(1 << (page % 64), Relaxed);
        }
    }

    /// The pages grain `e` is stored in, read.
    fn note_grain(&self, e: &Entry) {
        for page in e.pages() {
            self.note_read(page);
        }
    }

    /// Copy `pages` of its data area into `to` at the same offsets
    /// (whole pages, the last one of a version-2 segment cut at the
    /// object's end); false if any cannot be read or written.
    fn copy_pages(&self, to: &File, pages: &[u32]) -> bool {
        let end = self.info.len();
        let mut g = vec![0u8; GRAIN];
        pages.iter().all(|&page| {
            let at = SegmentInfo::grain_offset(page);
            let g = &mut g[..GRAIN.min(end.saturating_sub(at) as usize)];
            self.file.read_exact_at(g, at).is_ok() && to.write_all_at(g, at).is_ok()
        })
    }

    /// The pages read from it.
    fn pages_read(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (i, w) in self.read.iter().enumerate() {
            let mut b = w.load(Relaxed);
            while b != 0 {
                out.push(i as u32 * 64 + b.trailing_zeros());
                b &= b - 1;
            }
        }
        out
    }
}

/// Grains of one object kept in a sparse file at their offsets in it
/// (FORMAT.md §11.8): what a cache that cannot hold whole objects keeps
/// of scattered reads.
struct Partial {
    file: File,
    used_ms: AtomicU64,
    /// The slot and virtual grain of the last grain that missed in this
    /// object (a next miss next to it in both is a scan: the object is
    /// fetched whole).
    last_slot: std::sync::atomic::AtomicU32,
    last_vg: AtomicU64,
    /// A miss wanted the object whole (a ghost's return) and no fetch
    /// could start then: the next miss asks again.
    whole_wanted: std::sync::atomic::AtomicBool,
}

impl Partial {
    /// A sparse file opened or made at `now_ms`; `last`: the miss that
    /// made it (slot, virtual grain), if one did.
    fn new(file: File, now_ms: u64, last: Option<(u32, u64)>) -> Arc<Partial> {
        let (slot, vg) = last.unwrap_or((u32::MAX, u64::MAX));
        Arc::new(Partial {
            file,
            used_ms: AtomicU64::new(now_ms),
            last_slot: std::sync::atomic::AtomicU32::new(slot),
            last_vg: AtomicU64::new(vg),
            whole_wanted: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

/// A decoded map node, and when a use of its segment was last passed to
/// the policy: a node in memory still uses its segment, so that a restart
/// finds it cached.
struct KeptNode {
    node: Arc<MapNode>,
    used_ms: AtomicU64,
}

/// Segments and nodes this host has read or written.
pub struct SegmentCache {
    dir: PathBuf,
    segments: RwLock<HashMap<SegId, Arc<CachedSegment>>>,
    /// Objects of which only some grains are here (sparse files).
    partials: RwLock<HashMap<SegId, Arc<Partial>>>,
    /// Taken to add a grain to a sparse file and to replace one by its
    /// whole object, so that the two never both stand for one object.
    partial_lock: Mutex<()>,
    nodes: RwLock<HashMap<(SegId, u32), Arc<KeptNode>>>,
    /// One fetch of a segment at a time per segment: a cold disk read by
    /// many threads fetches each segment once.
    fetching: Mutex<HashMap<SegId, Arc<Mutex<()>>>>,
    /// Headers of segments not (yet) cached, for ranged reads of nodes.
    headers: RwLock<HashMap<SegId, SegmentInfo>>,
    /// Segments being fetched in the background.
    prefetching: Mutex<HashSet<SegId>>,
    /// Which files to delete when they exceed the bound.
    bound: u64,
    /// Reads that miss fetch whole segments in the background (off: a
    /// read's round trips to the store are its own, and can be counted
    /// exactly; `strata serve --store-prefetch`, docs/MULTIHOST.md).
    prefetch_on: bool,
    /// Made at first use: see [`Self::policy`].
    policy: std::sync::OnceLock<Mutex<S3Fifo<SegId>>>,
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    damaged: AtomicU64,
    hot_fetched: AtomicU64,
    /// Whole objects turned into sparse files.
    shrunk: AtomicU64,
    /// Evicted whole objects whose read grains the keeper kept.
    evicted_kept: AtomicU64,
    /// When a cache file last could not be written (None: never, or one
    /// was written once the pause after the last failure was over). Until [`UNWRITABLE_RETRY`] has passed, no
    /// object is fetched whole: a full or broken cache directory costs one
    /// message, and reads take their grains from the store, not a GET of
    /// a whole object per miss that then cannot be kept.
    unwritable: Mutex<Option<Instant>>,
    /// Objects handed to [`Self::insert_later`] whose files are not
    /// written yet: reads take their grains from these bytes.
    pending: RwLock<HashMap<SegId, Bytes>>,
    pending_bytes: AtomicU64,
    /// The thread that writes them (started at first use).
    writer: std::sync::OnceLock<Mutex<std::sync::mpsc::SyncSender<(SegId, Bytes)>>>,
    /// Buffers for `O_DIRECT` writes, kept for the next (memory used once
    /// stays backed: new memory is what costs, see [`write_direct`]).
    direct_bufs: Mutex<Vec<Vec<u8>>>,
    /// The thread that turns whole objects into sparse files of the
    /// grains read (a shrink, or an eviction: [`Keep`]), off the read
    /// path; started at first use.
    keeper: std::sync::OnceLock<Mutex<std::sync::mpsc::SyncSender<Keep>>>,
    /// Objects handed to it and not done yet (one job per object).
    keeping: Mutex<HashSet<SegId>>,
    /// This cache, for the threads it starts.
    me: std::sync::Weak<SegmentCache>,
    opened: Instant,
}

/// What the keeper thread is asked to do with a whole object (FORMAT.md
/// §11.8): both keep the grains reads used of it as a sparse file.
enum Keep {
    /// Still held whole: it becomes a sparse file in its place.
    Shrink(SegId, Arc<CachedSegment>),
    /// Evicted (its file unlinked, still open here): its read grains
    /// come back as a sparse file in the main FIFO.
    Evicted(SegId, Arc<CachedSegment>),
}

/// Background fetches of whole segments at once.
const PREFETCH_MAX: usize = 2;
/// A miss this close (in slots) to its object's last one is taken for a
/// scan (FORMAT.md §11.8).
const NEAR_SLOTS: u32 = 2;
/// A whole object is not shrunk before it has been cached this long (ms):
/// a scan reads all of it well within that.
const SHRINK_AFTER_MS: u64 = 5000;
/// How long whole fetches pause after a cache file could not be written.
const UNWRITABLE_RETRY: std::time::Duration = std::time::Duration::from_secs(30);
/// A use gate's value before any use was passed on.
const UNUSED: u64 = u64::MAX;

/// Objects waiting for the keeper thread at most.
const KEEP_QUEUE: usize = 64;

/// Bytes of objects [`SegmentCache::insert_later`] lets wait for their
/// files.
const PENDING_MAX: u64 = 64 << 20;

impl SegmentCache {
    /// The cache in `dir`, holding at most `bound` bytes of files, its
    /// misses fetching whole segments in the background if `prefetch`.
    /// The files an earlier process left are counted when the cache is
    /// first used (a command that reads no disk does not list them).
    pub fn new(dir: PathBuf, bound: u64, prefetch: bool) -> Arc<Self> {
        let now = Instant::now();
        Arc::new_cyclic(|me| SegmentCache {
            dir,
            segments: RwLock::new(HashMap::new()),
            partials: RwLock::new(HashMap::new()),
            partial_lock: Mutex::new(()),
            nodes: RwLock::new(HashMap::new()),
            fetching: Mutex::new(HashMap::new()),
            headers: RwLock::new(HashMap::new()),
            prefetching: Mutex::new(HashSet::new()),
            bound,
            prefetch_on: prefetch,
            policy: std::sync::OnceLock::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            damaged: AtomicU64::new(0),
            hot_fetched: AtomicU64::new(0),
            shrunk: AtomicU64::new(0),
            evicted_kept: AtomicU64::new(0),
            unwritable: Mutex::new(None),
            pending: RwLock::new(HashMap::new()),
            pending_bytes: AtomicU64::new(0),
            writer: std::sync::OnceLock::new(),
            direct_bufs: Mutex::new(Vec::new()),
            keeper: std::sync::OnceLock::new(),
            keeping: Mutex::new(HashSet::new()),
            me: me.clone(),
            opened: now,
        })
    }

    /// The policy, with the files an earlier process left counted (oldest
    /// first out) and those beyond the bound deleted.
    fn policy(&self) -> &Mutex<S3Fifo<SegId>> {
        self.policy.get_or_init(|| {
            let mut policy = S3Fifo::new(self.bound);
            let now = Instant::now();
            let mut found = Vec::new();
            list_files(&self.dir, &self.dir, &mut found);
            // Whole files first: a sparse file of an object held whole
            // (a process stopped between the two) is deleted.
            found.sort_by_key(|f| (f.3, f.2));
            for (id, bytes, _, partial) in found {
                if partial && policy.contains(&id) {
                    let _ = std::fs::remove_file(self.partial_path(id));
                    continue;
                }
                for old in policy.insert(id, Arrival::read(bytes), now) {
                    let _ = std::fs::remove_file(self.path(old));
                    let _ = std::fs::remove_file(self.partial_path(old));
                }
            }
            Mutex::new(policy)
        })
    }

    pub fn stats(&self) -> CacheStats {
        let p = self.policy().lock().unwrap();
        CacheStats {
            bytes: p.bytes(),
            bound_bytes: p.bound(),
            segments: p.len() as u64,
            hits: self.hits.load(Relaxed),
            misses: self.misses.load(Relaxed),
            evictions: self.evictions.load(Relaxed),
            damaged: self.damaged.load(Relaxed),
            hot_fetched: self.hot_fetched.load(Relaxed),
            shrunk: self.shrunk.load(Relaxed),
            evicted_kept: self.evicted_kept.load(Relaxed),
        }
    }

    /// The segment if it is here (memory or the cache directory), without
    /// asking the store. A file this process has not used yet is checked
    /// by its ends first (header, length, trailer: it may be torn, or from
    /// a build that wrote it differently); one that fails is deleted.
    /// What it holds is checked read by read, against the CRC each map
    /// entry carries (FORMAT.md §11.8).
    fn local(&self, id: SegId) -> Option<Arc<CachedSegment>> {
        if let Some(s) = self.segments.read().unwrap().get(&id) {
            // An upload's copy, written past the page cache and read now
            // for the first time: read the rest of it ahead too.
            if s.used_ms.load(Relaxed) == UNUSED {
                read_ahead(&s.file);
            }
            self.used(id, &s.used_ms);
            return Some(s.clone());
        }
        // Held in part, or not at all: no whole file to look for (a failed
        // open per read of a sparse object cost more than the read).
        if self.partials.read().unwrap().contains_key(&id) {
            return None;
        }
        // Count what is here before this file is opened, added or deleted.
        if !self.policy().lock().unwrap().contains(&id) {
            return None;
        }
        let file = File::open(self.path(id)).ok()?;
        let ends = || -> std::io::Result<(u64, Vec<u8>, Vec<u8>)> {
            let len = file.metadata()?.len();
            let mut head = vec![0; (SEG_HEADER_BYTES as u64).min(len) as usize];
            file.read_exact_at(&mut head, 0)?;
            let n = (SEG_TRAILER_BYTES as u64).min(len);
            let mut trailer = vec![0; n as usize];
            file.read_exact_at(&mut trailer, len - n)?;
            Ok((len, head, trailer))
        };
        let checked = ends()
            .map_err(Error::from)
            .and_then(|(len, h, t)| check_segment_ends(&id.key(), &h, &t, len).map(|i| (i, len)));
        let (info, len) = match checked {
            Ok(x) => x,
            Err(e) => {
                self.drop_damaged(id, &format!("is damaged ({e})"));
                return None;
            }
        };
        // Readers that open the file at once make one object of it: a
        // second one would take reads the first does not know of, and a
        // shrink by either would leave the other's grains out.
        let s = {
            let mut segs = self.segments.write().unwrap();
            match segs.entry(id) {
                std::collections::hash_map::Entry::Occupied(o) => return Some(o.get().clone()),
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(self.cached(file, info, true)).clone()
                }
            }
        };
        self.admit(id, len, true, false);
        Some(s)
    }

    /// Count segment `id` (its file is written; `read`: for a read, not
    /// an upload; `main`: into the main FIFO) and evict what no longer
    /// fits.
    fn admit(&self, id: SegId, bytes: u64, read: bool, main: bool) {
        let out =
            self.policy()
                .lock()
                .unwrap()
                .insert(id, Arrival { bytes, main, read }, Instant::now());
        self.evict(out);
    }

    /// Delete what the policy evicted (whole or sparse files). A whole
    /// object of which reads used some grains, at most half, is handed to
    /// the keeper, which keeps those grains as a sparse file (§11.8): it
    /// was evicted for its size, not because nothing in it is read (a
    /// warm-up that reads faster than objects shrink would otherwise lose
    /// the grains it has just read).
    fn evict(&self, out: Vec<SegId>) {
        for old in out {
            let whole = self.segments.write().unwrap().remove(&old);
            // A reader that has it open finishes from the unlinked file.
            let _ = std::fs::remove_file(self.path(old));
            // A sparse file (maybe one a restart listed, not opened yet).
            self.partials.write().unwrap().remove(&old);
            let _ = std::fs::remove_file(self.partial_path(old));
            self.evictions.fetch_add(1, Relaxed);
            if let Some(seg) = whole {
                if worth_keeping(&seg) {
                    self.send_keep(Keep::Evicted(old, seg));
                }
            }
        }
    }

    /// Hand `job` to the keeper thread (started at first use), unless
    /// its object is on its way there already or the queue is full (a
    /// shrink is asked for again by a later read; an eviction's grains
    /// are then read from the store again when missed).
    fn send_keep(&self, job: Keep) {
        let id = match &job {
            Keep::Shrink(id, _) | Keep::Evicted(id, _) => *id,
        };
        if !self.keeping.lock().unwrap().insert(id) {
            return;
        }
        let tx = self.keeper.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Keep>(KEEP_QUEUE);
            let me = self.me.clone();
            let _ = std::thread::Builder::new()
                .name("strata-cache-keeper".into())
                .spawn(move || {
                    for job in rx {
                        let Some(c) = me.upgrade() else { break };
                        let (Keep::Shrink(id, seg) | Keep::Evicted(id, seg)) = job;
                        c.keep_read_grains(id, &seg);
                        c.keeping.lock().unwrap().remove(&id);
                    }
                });
            Mutex::new(tx)
        });
        if tx.lock().unwrap().try_send(job).is_err() {
            self.keeping.lock().unwrap().remove(&id);
        }
    }

    /// Make `file`, written at `tmp`, object `id`'s sparse file (renamed
    /// into place, then known to readers); false, and `tmp` deleted, if
    /// it cannot be renamed. Under `partial_lock`.
    fn place_partial(&self, id: SegId, tmp: &Path, file: File) -> bool {
        if std::fs::rename(tmp, self.partial_path(id)).is_err() {
            let _ = std::fs::remove_file(tmp);
            return false;
        }
        self.partials
            .write()
            .unwrap()
            .insert(id, Partial::new(file, self.clock_ms(), None));
        true
    }

    /// Object `id` arrives whole (`s`): it replaces the grains a sparse
    /// file kept of it (if any), which are counted out of the policy.
    fn replace_partial(&self, id: SegId, s: Arc<CachedSegment>) {
        let _g = self.partial_lock.lock().unwrap();
        let known = self.partials.write().unwrap().remove(&id);
        let path = self.partial_path(id);
        // The grains the sparse file held were read: the whole object
        // counts them so, or its next shrink would leave them out.
        let held = match &known {
            Some(p) => held_pages(&p.file),
            None => File::open(&path).map_or(Vec::new(), |f| held_pages(&f)),
        };
        for slot in held {
            s.note_read(slot);
        }
        self.segments.write().unwrap().insert(id, s);
        if known.is_some() || path.exists() {
            let _ = std::fs::remove_file(path);
            self.policy().lock().unwrap().remove(&id);
        }
    }

    /// The sparse file of object `id`, if there is one (opened the first
    /// time this process uses it after a restart listed it).
    fn partial(&self, id: SegId) -> Option<Arc<Partial>> {
        if let Some(p) = self.partials.read().unwrap().get(&id) {
            self.used(id, &p.used_ms);
            return Some(p.clone());
        }
        if !self.policy().lock().unwrap().contains(&id) {
            return None;
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.partial_path(id))
            .ok()?;
        let p = Partial::new(file, self.clock_ms(), None);
        Some(
            self.partials
                .write()
                .unwrap()
                .entry(id)
                .or_insert(p)
                .clone(),
        )
    }

    /// Past half its bound, a whole object cached for [`SHRINK_AFTER_MS`]
    /// of which reads used at most half the grains becomes a sparse file
    /// of the grains read (FORMAT.md §11.8), made by the keeper thread,
    /// not by the read: S3-FIFO keeps what is used, not how much of it,
    /// so a whole object holding a few hot grains would otherwise keep out
    /// the grains of others. Looked at once a second per object at most,
    /// by a read that hit it.
    fn maybe_shrink(&self, id: SegId, seg: &Arc<CachedSegment>) {
        let now = self.clock_ms();
        let last = seg.looked_ms.load(Relaxed);
        if now < seg.since_ms + SHRINK_AFTER_MS
            || now < last + 1000
            || seg
                .looked_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_err()
        {
            return;
        }
        if worth_keeping(seg) && !self.under_half(0) {
            self.send_keep(Keep::Shrink(id, seg.clone()));
        }
    }

    /// Whether the cache holds under half its bound with `adding` bytes
    /// more: objects are then kept whole; past it, by the grains read
    /// (§11.8).
    fn under_half(&self, adding: u64) -> bool {
        let p = self.policy().lock().unwrap();
        p.bytes() + adding <= p.bound() / 2
    }

    /// A new sparse file for object `id` (its directory made if need
    /// be); `fresh`: emptied if one is there.
    fn make_partial(&self, id: SegId, fresh: bool) -> std::io::Result<File> {
        let path = self.partial_path(id);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(fresh)
            .open(&path)
    }

    /// A read of grain `e` (virtual grain `vg`) missed: fetch its object
    /// whole in the background (true), or keep only the grain (false).
    /// Whole while the cache is under half its bound (a cold start fills
    /// it fastest so), or when the miss is next to the object's last one
    /// both in the object and on the disk (a scan of data written in
    /// order; the grains of a payload are in order too, but far apart on
    /// the disk), or when the object is a ghost (evicted whole after reads
    /// used more than half of it, too much to keep as grains: read again,
    /// it comes back whole into the main FIFO, S3-FIFO's return, in one
    /// GET rather than a ranged GET per grain); past that, a whole object
    /// would push out grains others read for a few of its own.
    fn whole_on_miss(&self, e: &Entry, vg: u64) -> bool {
        if self.under_half(crate::SEGMENT_MAX_BYTES) {
            return true;
        }
        if self.policy().lock().unwrap().is_ghost(&e.seg) {
            return true;
        }
        let Some(part) = self.partials.read().unwrap().get(&e.seg).cloned() else {
            return false;
        };
        if part.whole_wanted.swap(false, Relaxed) {
            return true;
        }
        let page = e.pages().start;
        let last = part.last_slot.swap(page, Relaxed);
        let last_vg = part.last_vg.swap(vg, Relaxed);
        last != u32::MAX
            && last.abs_diff(page) <= NEAR_SLOTS
            && last_vg.abs_diff(vg) <= NEAR_SLOTS as u64
    }

    /// A cached file failed verification (`why`): say so, forget it and
    /// delete it; the read goes to the store.
    fn drop_damaged(&self, id: SegId, why: &str) {
        tracing::warn!(
            "cached copy {} {why}: deleted, reading from the store",
            self.path(id).display()
        );
        self.segments.write().unwrap().remove(&id);
        self.policy().lock().unwrap().remove(&id);
        let _ = std::fs::remove_file(self.path(id));
        self.damaged.fetch_add(1, Relaxed);
    }

    /// Fetch segment `id` whole in the background (at most
    /// [`PREFETCH_MAX`] at once; a later miss asks again).
    fn prefetch(self: &Arc<Self>, store: &Arc<ObjectStore>, id: SegId) -> bool {
        if !self.prefetch_on || self.cannot_write() {
            return false;
        }
        {
            let mut p = self.prefetching.lock().unwrap();
            if p.len() >= PREFETCH_MAX || !p.insert(id) {
                // Already on its way, or no room: a later miss asks again.
                return p.contains(&id);
            }
        }
        let (me, store) = (self.clone(), store.clone());
        let spawned = std::thread::Builder::new()
            .name("segment-fetch".into())
            .spawn(move || {
                if let Err(e) = me.segment(&store, id) {
                    tracing::warn!("background fetch of {}: {e}", id.key());
                }
                me.prefetching.lock().unwrap().remove(&id);
            });
        if spawned.is_err() {
            self.prefetching.lock().unwrap().remove(&id);
            return false;
        }
        true
    }

    /// Have segment `id` here whole (verified), fetching it now if needed.
    pub fn fetch(&self, store: &ObjectStore, id: SegId) -> Result<()> {
        self.segment(store, id).map(|_| ())
    }

    /// A segment's header, for a ranged read of one of its nodes.
    fn header(&self, store: &ObjectStore, id: SegId) -> Result<SegmentInfo> {
        if let Some(i) = self.headers.read().unwrap().get(&id) {
            return Ok(*i);
        }
        let key = id.key();
        let h = store.get_range(&key, 0..SEG_HEADER_BYTES as u64)?;
        let info = decode_segment_header(&key, &h)?;
        self.headers.write().unwrap().insert(id, info);
        Ok(info)
    }

    fn path(&self, id: SegId) -> PathBuf {
        self.dir.join(id.key())
    }

    /// Where the sparse file of object `id` is: its key and `.g`.
    fn partial_path(&self, id: SegId) -> PathBuf {
        self.dir.join(format!("{}.g", id.key()))
    }

    /// Keep a segment this host has just uploaded (its bytes are in hand).
    pub fn insert(&self, id: SegId, bytes: &[u8]) -> Result<()> {
        let info = decode_segment_header(&id.key(), bytes)?;
        let file = self.write_file(id, bytes, true)?;
        self.replace_partial(id, self.cached(file, info, false));
        self.admit(id, bytes.len() as u64, false, false);
        Ok(())
    }

    /// Keep an object this host has just uploaded, written by a thread of
    /// its own: a FLUSH is answered without waiting for the file (about a
    /// millisecond for a 256 KiB payload here), and reads take its grains
    /// from `bytes` until the file is there. Up to [`PENDING_MAX`] bytes
    /// wait; past that the file is written here and now. A copy: a file
    /// that cannot be written costs nothing but later reads from the store.
    pub fn insert_later(self: &Arc<Self>, id: SegId, bytes: Bytes) {
        let tx = self.writer.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<(SegId, Bytes)>(64);
            let me = Arc::downgrade(self);
            let _ = std::thread::Builder::new()
                .name("strata-cache-writer".into())
                .spawn(move || {
                    for (id, b) in rx {
                        let Some(c) = me.upgrade() else { break };
                        let _ = c.insert(id, &b);
                        c.written(id);
                    }
                });
            Mutex::new(tx)
        });
        let n = bytes.len() as u64;
        if self.pending_bytes.fetch_add(n, Relaxed) + n <= PENDING_MAX {
            self.pending.write().unwrap().insert(id, bytes.clone());
            if tx.lock().unwrap().try_send((id, bytes.clone())).is_ok() {
                return;
            }
            self.pending.write().unwrap().remove(&id);
        }
        self.pending_bytes.fetch_sub(n, Relaxed);
        let _ = self.insert(id, &bytes);
    }

    /// Object `id`'s file is written (or could not be): no longer pending.
    fn written(&self, id: SegId) {
        if let Some(b) = self.pending.write().unwrap().remove(&id) {
            self.pending_bytes.fetch_sub(b.len() as u64, Relaxed);
        }
    }

    /// Wait (up to 30 s) until every object handed to
    /// [`Self::insert_later`] is written: before a clean stop, so that a
    /// restart finds them.
    pub fn drain(&self) {
        let t = Instant::now();
        while self.pending_bytes.load(Relaxed) > 0 && t.elapsed().as_secs() < 30 {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Grain `e` from an object waiting for its file, if it is one.
    fn pending_grain(&self, e: &Entry, out: &mut [u8]) -> bool {
        if self.pending_bytes.load(Relaxed) == 0 {
            return false;
        }
        let Some(b) = self.pending.read().unwrap().get(&e.seg).cloned() else {
            return false;
        };
        e.unplace_from(&b, out)
    }

    /// A cache file could not be written less than [`UNWRITABLE_RETRY`]
    /// ago.
    fn cannot_write(&self) -> bool {
        self.unwritable
            .lock()
            .unwrap()
            .is_some_and(|t| t.elapsed() < UNWRITABLE_RETRY)
    }

    /// The segment, from memory, the cache directory, or the store.
    fn segment(&self, store: &ObjectStore, id: SegId) -> Result<Arc<CachedSegment>> {
        self.segment_or_fetch(store, id, false).map(|(s, _)| s)
    }

    /// [`Self::segment`]; a segment fetched now enters the main FIFO if
    /// `hot` (a hot set named it, §11.5b). Whether it was fetched.
    fn segment_or_fetch(
        &self,
        store: &ObjectStore,
        id: SegId,
        hot: bool,
    ) -> Result<(Arc<CachedSegment>, bool)> {
        if let Some(s) = self.segments.read().unwrap().get(&id) {
            return Ok((s.clone(), false));
        }
        let gate = self.fetching.lock().unwrap().entry(id).or_default().clone();
        let _one = gate.lock().unwrap();
        // Fetched by another thread meanwhile, or cached by an earlier run.
        let seg = match self.local(id) {
            Some(s) => Ok((s, false)),
            None => self.fetch_whole(store, id, hot).map(|s| (s, true)),
        };
        self.fetching.lock().unwrap().remove(&id);
        seg
    }

    /// Milliseconds since this cache opened: the clock of its atomics.
    fn clock_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    /// A file held for segment `info.id`; `read`: a read brought it (it
    /// was used now), else an upload did (its first read is a use the
    /// policy must hear of at once).
    fn cached(&self, file: File, info: SegmentInfo, read: bool) -> Arc<CachedSegment> {
        let now = self.clock_ms();
        let used_ms = AtomicU64::new(if read { now } else { UNUSED });
        let words = (info.data_pages() as usize).div_ceil(64);
        Arc::new(CachedSegment {
            file,
            info,
            used_ms,
            read: (0..words).map(|_| AtomicU64::new(0)).collect(),
            since_ms: now,
            looked_ms: AtomicU64::new(now),
        })
    }

    /// A use of segment `seg` (a cached file read, or a decoded node of
    /// it walked), whose last use passed to the policy was at `used_ms`.
    /// The policy counts at most one use per [`USE_GAP`], so only those
    /// are passed on: a hit does not take its lock.
    fn used(&self, seg: SegId, used_ms: &AtomicU64) {
        let now = self.clock_ms();
        let last = used_ms.load(Relaxed);
        if (last == UNUSED || now >= last + USE_GAP.as_millis() as u64)
            && used_ms
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
        {
            self.policy().lock().unwrap().touch(&seg, Instant::now());
        }
    }

    fn missed(&self) {
        self.misses.fetch_add(1, Relaxed);
    }

    /// Fetch segment `id` of a hot set (§11.5b) unless it is here (whole
    /// or in part); whether it was fetched.
    pub fn fetch_hot(&self, store: &ObjectStore, id: SegId) -> Result<bool> {
        // Here already, whole or in part (a restart that kept the cache):
        // left for the reads that use it to check and count.
        if self.policy().lock().unwrap().contains(&id) || self.cannot_write() {
            return Ok(false);
        }
        let (_, fetched) = self.segment_or_fetch(store, id, true)?;
        if fetched {
            self.hot_fetched.fetch_add(1, Relaxed);
        }
        Ok(fetched)
    }

    /// GET segment `id`, verify it end to end, keep it as a file (in the
    /// main FIFO if `hot`).
    fn fetch_whole(&self, store: &ObjectStore, id: SegId, hot: bool) -> Result<Arc<CachedSegment>> {
        let (bytes, info) = get_verified(store, id)?;
        let s = self.cached(self.write_file(id, &bytes, false)?, info, true);
        self.replace_partial(id, s.clone());
        self.admit(id, bytes.len() as u64, true, hot);
        Ok(s)
    }

    /// Grain `e` into `out` (4096 bytes) if this process holds it (whole,
    /// in part, or waiting for its file) and it passes its CRC, for a move
    /// (compaction, §11.7a): not a client's read, so not counted as a hit,
    /// not a use, and nothing is fetched or kept. Whether it was here.
    pub fn peek_grain(&self, e: &Entry, out: &mut [u8]) -> bool {
        let out = &mut out[..GRAIN];
        if self.pending_grain(e, out) {
            return true;
        }
        let mut from = |f: &File| grain_from_file(f, e, out) == Some(true);
        let whole = self.segments.read().unwrap().get(&e.seg).cloned();
        if let Some(s) = whole {
            if s.info.holds(e) && from(&s.file) {
                return true;
            }
        }
        let part = self.partials.read().unwrap().get(&e.seg).cloned();
        part.is_some_and(|p| from(&p.file))
    }

    /// Keep a segment a move made (compaction) and has just uploaded;
    /// `hot`: the pages (see `Entry::pages`) of its grains that were in
    /// this cache where they were.
    /// Under half the bound it is kept whole, as an upload is; past it,
    /// only those grains, in a sparse file: what was cached stays cached
    /// where it now is, and the rest does not push out what reads use.
    pub fn insert_moved(&self, id: SegId, bytes: &[u8], hot: &[u32]) -> Result<()> {
        if self.under_half(bytes.len() as u64) {
            return self.insert(id, bytes);
        }
        let _g = self.partial_lock.lock().unwrap();
        if hot.is_empty() || self.segments.read().unwrap().contains_key(&id) {
            return Ok(());
        }
        let path = self.partial_path(id);
        let io = |e: std::io::Error| {
            Error::new(
                ErrorKind::Io,
                format!("cannot write cache file {}: {e}", path.display()),
            )
        };
        let file = self.make_partial(id, true).map_err(io)?;
        for &page in hot {
            let at = SegmentInfo::grain_offset(page) as usize;
            let g = bytes
                .get(at..(at + GRAIN).min(bytes.len()))
                .filter(|g| !g.is_empty())
                .ok_or_else(|| corrupt(format!("{}: no page {page} in it", id.key())))?;
            file.write_all_at(g, at as u64).map_err(io)?;
        }
        self.partials
            .write()
            .unwrap()
            .insert(id, Partial::new(file, self.clock_ms(), None));
        // Into the main FIFO: these grains were kept where they were.
        let kept = Arrival {
            bytes: (hot.len() * GRAIN) as u64,
            main: true,
            read: true,
        };
        let out = self
            .policy()
            .lock()
            .unwrap()
            .insert(id, kept, Instant::now());
        self.evict(out);
        Ok(())
    }

    /// Read the grain `e` points at (virtual grain `vg` of its disk: how
    /// misses are told apart from a scan) into `out` (4096 bytes),
    /// checking its CRC. A cached copy that fails the check is dropped and
    /// the grain is read from the store.
    pub fn read_grain(
        self: &Arc<Self>,
        store: &Arc<ObjectStore>,
        e: &Entry,
        vg: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let out = &mut out[..GRAIN];
        if self.pending_grain(e, out) {
            self.hits.fetch_add(1, Relaxed);
            return Ok(());
        }
        if let Some(seg) = self.local(e.seg) {
            if !seg.info.holds(e) {
                return Err(corrupt(format!(
                    "{}: a map entry names bytes {:?} (slot {}) outside its data area of {} bytes",
                    e.seg.key(),
                    e.grain_range(),
                    e.slot,
                    seg.info.data_bytes
                )));
            }
            let got = grain_from_file(&seg.file, e, out).ok_or_else(|| {
                Error::new(
                    ErrorKind::Io,
                    format!("cannot read {}", self.path(e.seg).display()),
                )
            })?;
            if got {
                self.hits.fetch_add(1, Relaxed);
                seg.note_grain(e);
                self.maybe_shrink(e.seg, &seg);
                return Ok(());
            }
            let why = format!("does not match grain {}'s checksum", e.slot);
            self.drop_damaged(e.seg, &why);
        } else if let Some(p) = self.partial(e.seg) {
            if let Some(got) = grain_from_file(&p.file, e, out) {
                if got {
                    self.hits.fetch_add(1, Relaxed);
                    return Ok(());
                }
                // A hole reads as zeros: not kept yet (zeros that were the
                // grain's bytes passed the check). Anything else is
                // damage: counted, and the grain is written again below;
                // but a placed grain may share a page with one kept
                // (its own bytes then zeros), so only raw slots count.
                if e.stored == 0 && out.iter().any(|&b| b != 0) {
                    self.damaged.fetch_add(1, Relaxed);
                }
            }
        }
        self.missed();
        let want = self.whole_on_miss(e, vg);
        // Not on its way (no room): a grain kept now makes the object
        // held in part, no longer a ghost, so the sparse file remembers
        // that it is wanted whole.
        let unmet = want && !self.prefetch(store, e.seg);
        let (at, len) = e.grain_range();
        let b = store.get_range(&e.seg.key(), at..at + len as u64)?;
        if !e.unplace(&b, out) {
            return Err(corrupt(format!(
                "{}: grain {} does not match the checksum its map entry holds (read from the store)",
                e.seg.key(),
                e.slot,
            )));
        }
        self.keep_grain(e, vg, &b, unmet);
        Ok(())
    }

    /// The map node `e` points at, expected at `level` covering from `first`.
    pub fn node(
        self: &Arc<Self>,
        store: &Arc<ObjectStore>,
        e: &Entry,
        level: u8,
        first: u64,
    ) -> Result<Arc<MapNode>> {
        if let Some(k) = self.nodes.read().unwrap().get(&(e.seg, e.slot)) {
            self.used(e.seg, &k.used_ms);
            return Ok(k.node.clone());
        }
        let mut b = vec![0u8; NODE_BYTES];
        let mut cached = false;
        if let Some(seg) = self.local(e.seg) {
            check_node_slot(e, &seg.info)?;
            seg.file
                .read_exact_at(&mut b, seg.info.node_offset(e.slot))
                .map_err(|err| {
                    Error::new(
                        ErrorKind::Io,
                        format!("cannot read {}: {err}", self.path(e.seg).display()),
                    )
                })?;
            cached = crc32c::crc32c(&b) == e.crc;
            if cached {
                self.hits.fetch_add(1, Relaxed);
            } else {
                let why = format!("does not match node {}'s checksum", e.slot);
                self.drop_damaged(e.seg, &why);
            }
        }
        if !cached {
            self.missed();
            let _ = self.prefetch(store, e.seg);
            // Segments of map nodes hold no grains (commits and folds
            // write nodes apart, FORMAT.md §11.4a), so node `slot` is
            // at a known offset: one round trip instead of two. The
            // CRC its entry holds says whether the guess was right;
            // if not, the header says where it is.
            let guess = SEG_DATA_OFFSET as u64 + e.slot as u64 * NODE_BYTES as u64;
            let got = match self.headers.read().unwrap().get(&e.seg) {
                Some(_) => None,
                None => store
                    .get_range(&e.seg.key(), guess..guess + NODE_BYTES as u64)
                    .ok()
                    .filter(|g| crc32c::crc32c(g) == e.crc),
            };
            match got {
                Some(g) => b.copy_from_slice(&g),
                None => {
                    let info = self.header(store, e.seg)?;
                    check_node_slot(e, &info)?;
                    let at = info.node_offset(e.slot);
                    b.copy_from_slice(&store.get_range(&e.seg.key(), at..at + NODE_BYTES as u64)?);
                }
            }
            if crc32c::crc32c(&b) != e.crc {
                return Err(corrupt(format!(
                    "{}: map node {} does not match the checksum its parent holds",
                    e.seg.key(),
                    e.slot
                )));
            }
        }
        let place = format!("{} node {}", e.seg.key(), e.slot);
        let node = Arc::new(MapNode::decode(&place, &b, level, first)?);
        self.keep_node(e, node.clone());
        Ok(node)
    }

    fn keep_node(&self, e: &Entry, node: Arc<MapNode>) {
        let used_ms = AtomicU64::new(self.clock_ms());
        self.nodes
            .write()
            .unwrap()
            .insert((e.seg, e.slot), Arc::new(KeptNode { node, used_ms }));
    }

    /// Keep the root node of manifest `m` read from the store, from the
    /// copy it carries (§11.5), so that the first read does not fetch it.
    pub fn seed_root(&self, m: &Manifest) {
        let Some(e) = m.root.filter(|_| m.root_node.is_some()) else {
            return;
        };
        if self.cached_node(&e).is_none() {
            if let Some(n) = m.root_node() {
                self.insert_node(&e, n);
            }
        }
    }

    /// The decoded node `e` points at, if this process holds it.
    pub fn cached_node(&self, e: &Entry) -> Option<Arc<MapNode>> {
        let nodes = self.nodes.read().unwrap();
        nodes.get(&(e.seg, e.slot)).map(|k| k.node.clone())
    }

    /// Keep a node this host has just written (it is in a segment that was
    /// inserted).
    pub fn insert_node(&self, e: &Entry, node: MapNode) {
        self.keep_node(e, Arc::new(node));
    }
}

/// Object `id` from the store, whole and verified end to end (a
/// manifest's payload without the manifest that follows it, §11.5).
pub(crate) fn get_verified(store: &ObjectStore, id: SegId) -> Result<(Bytes, SegmentInfo)> {
    let key = id.key();
    let mut bytes = store.get(&key)?;
    if id.payload_of().is_some() {
        let info = decode_segment_header(&key, &bytes)?;
        if info.len() <= bytes.len() as u64 {
            bytes.truncate(info.len() as usize);
        }
    }
    let info = verify_segment(&key, &bytes)?;
    Ok((bytes, info))
}

/// Whether reads used some of whole object `seg`'s grains and at most
/// half: those are worth a sparse file of their own (§11.8); more than
/// half is a scan's or a hot object's, kept or evicted whole.
fn worth_keeping(seg: &CachedSegment) -> bool {
    let read = seg
        .read
        .iter()
        .map(|w| w.load(Relaxed).count_ones())
        .sum::<u32>();
    read > 0 && read * 2 <= seg.info.data_pages()
}

/// Grain `e` into `out` (4,096 bytes) from a cache file: None when the
/// file cannot give the bytes it is stored in, else whether they decode
/// to it and pass its CRC. A raw grain is read straight into `out` (as
/// every grain was before §18.6: no buffer on a hit), so a failed check
/// leaves there the bytes read.
fn grain_from_file(f: &File, e: &Entry, out: &mut [u8]) -> Option<bool> {
    let (at, len) = e.grain_range();
    if len == GRAIN {
        f.read_exact_at(&mut out[..GRAIN], at).ok()?;
        return Some(crc32c::crc32c(&out[..GRAIN]) == e.crc);
    }
    let mut stored = [0u8; GRAIN];
    f.read_exact_at(&mut stored[..len], at).ok()?;
    Some(e.unplace(&stored[..len], out))
}

fn check_node_slot(e: &Entry, info: &SegmentInfo) -> Result<()> {
    if e.slot >= info.nodes {
        return Err(corrupt(format!(
            "{}: a map entry names node {} of a segment with {}",
            e.seg.key(),
            e.slot,
            info.nodes
        )));
    }
    Ok(())
}
