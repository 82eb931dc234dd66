use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use strata_api::store::Owner;
use strata_api::units::utc;
use strata_block::throttle::{IoLimits, Throttle};
use strata_block::{
    check_range, BlockDevice, BlockError, BlockResult, ErrorKind as BErr, Extent, ReadFill,
    ZeroOptions,
};
use strata_format::split_target;
use strata_s3::{Bytes, Listed, ObjectStore, Put};

use crate::layout::{
    manifest_key, Entry, GroupRef, Manifest, MapNode, ParentRef, PrevRef, SegId, SegmentBuilder,
    SnapshotRec, Tail, FANOUT, GRAIN,
};
use crate::{corrupt, diff, now_ms, Error, ErrorKind, ObjectStoreDatastore, Result, DIR_NAMES};

const G: u64 = GRAIN as u64;
/// Cipher sectors per grain: a grain's tweak is its first virtual sector (§16.1).
const SECTORS: u64 = strata_crypt::GRAIN_SECTORS;
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

mod admin;
mod catalog;
mod claim;
mod commit;
mod compact;
mod device;
mod fold;
mod hotset;
mod manifests;
mod read;
mod rekey;
mod write;
pub use catalog::{Hold, DIR_HOLDS};
pub use compact::{AutoCompact, CompactOptions};
pub use manifests::claim_marker_key;
pub(crate) use manifests::{claim_marker_of_key, is_orphan, read_manifest};
pub use rekey::{rekey_end, REKEY_REGION};

use claim::{claim, wait_for_release};
use manifests::{
    commit_manifest, describe_owner, newest_manifest, newest_manifest_from, put_manifest, Landed,
};

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
    strata_format::check_name(what, name)
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
    /// A writer is compressing or encrypting a segment's grains with the
    /// state let go ([`ObjectDisk::seal`]); the others do not start one.
    preparing_seal: bool,
    /// Commits waiting for that seal (no writer starts the next one).
    commits_waiting: u32,
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
    /// Grains read through this handle (a deep rekey rests while it
    /// grows, §16.7).
    client_reads: u64,
    /// The cipher of the writes acknowledged and not yet in the store
    /// (an encrypted disk's, §16.7): set by every write, so they are
    /// sealed under the keys they were taken with also after `lock`.
    cipher: Option<Arc<strata_crypt::DataCipher>>,
    /// The virtual grains a deep rekey's step re-encrypts (§16.7): writes
    /// to them wait on `landed` until it is committed.
    rekey_region: Option<std::ops::Range<u64>>,
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
            client_reads: 0,
            write_seq: 0,
            durable_seq: 0,
            sealed: BTreeMap::new(),
            seal_no: 0,
            preparing_seal: false,
            commits_waiting: 0,
            sealing: HashMap::new(),
            cipher: None,
            rekey_region: None,
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
pub struct ObjectDisk {
    /// This disk itself, for the background folds it starts.
    me: Weak<ObjectDisk>,
    ds: Arc<ObjectStoreDatastore>,
    name: String,
    id: u32,
    snapshot: Option<SnapshotRec>,
    read_only: bool,
    /// Its manifests carry a keyring: grains are stored encrypted (§16.7).
    encrypted: bool,
    state: Mutex<State>,
    /// Signalled when a sealed segment's upload ends, and when a seal
    /// being prepared is done ([`State::preparing_seal`]).
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
    /// The cipher the batch's grains are sealed under (§16.7).
    cipher: Option<Arc<strata_crypt::DataCipher>>,
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
    /// The cipher of its payload's grains (§16.7).
    cipher: Option<Arc<strata_crypt::DataCipher>>,
}

/// Where one grain of a read comes from.
enum Source {
    Data,
    Zero,
    /// A sealed grain already uploaded (the cache has its segment).
    Sealed(Entry),
    Map,
}
