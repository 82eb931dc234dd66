//! Object-store datastores: one datastore in an S3-compatible bucket,
//! shared by many hosts (docs/FORMAT.md §11, docs/MULTIHOST.md).
//!
//! Each host keeps a local directory with its identity and a cache; what
//! must survive lives in the store. This crate creates a datastore in a
//! store (`init`), joins one from another host (`attach`) and describes it
//! (`summary`); both first check that the store honours create-only
//! writes, which the fencing of §11.6 rests on.
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

mod cache;
pub mod diff;
pub mod disk;
pub mod envelope;
#[doc(hidden)]
pub mod fuzzing;
pub mod gc;
pub mod groups;
pub mod hot;
pub mod keys;
pub mod layout;
pub mod s3fifo;

pub use disk::{rekey_end, AutoCompact, ObjectDisk, REKEY_REGION};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use strata_api::store::{CacheStats, HostRef, ProbeSummary, RootObject, Summary};
use strata_api::units::utc;
use strata_block::throttle::{IoLimits, Throttle};
use strata_s3::{Bytes, ObjectStore, Options, ProbeReport, Put, StoreUrl};

/// The local directory's file naming the store this host uses.
pub const FILE_LOCAL: &str = "strata.objstore";
/// The root object's key (§11.3).
pub const KEY_ROOT: &str = "strata-store";
/// Disk names (§11.2).
pub const DIR_NAMES: &str = "names/";
/// Per-disk manifests and segments (§11.2).
pub const DIR_DISKS: &str = "disks/";
/// The root object's envelope magic.
pub const MAGIC_ROOT: &[u8; 8] = b"STRROOT1";
/// The layout version this build reads and writes.
pub const FORMAT: u32 = 1;
pub const GRAIN_BYTES: u32 = 4096;
pub const MAP_FANOUT: u32 = 256;
pub const SEGMENT_MAX_BYTES: u64 = 8 << 20;
/// This host's segment cache holds at most this many bytes unless
/// `--store-cache` says otherwise (§11.8).
pub const CACHE_DEFAULT_BYTES: u64 = 8 << 30;
/// The smallest cache bound: eight whole segments.
pub const CACHE_MIN_BYTES: u64 = 64 << 20;
/// The file in the local directory that records the cache bound.
pub const FILE_CACHE_BOUND: &str = "store-cache.json";

/// Record `bytes` as the bound of the segment cache of the host directory
/// `dir` (every process that opens `dir` keeps to it).
pub fn set_cache_bound(dir: &Path, bytes: u64) -> Result<()> {
    if bytes < CACHE_MIN_BYTES {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "a store cache of {bytes} bytes is too small: it must hold at least eight segments ({CACHE_MIN_BYTES} bytes, 64M)"
            ),
        ));
    }
    let body = serde_json::json!({ "bytes": bytes }).to_string();
    write_durably(dir, FILE_CACHE_BOUND, body.as_bytes())
}

/// Write `bytes` as `dir/name` whole and durably: a temporary file,
/// fsync'd, renamed over it, the directory fsync'd.
pub fn write_durably(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io("create", dir, e))?;
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", &tmp, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| io("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io("rename", &tmp, e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("sync", dir, e))
}

/// The segment cache bound recorded for `dir`, or the default.
pub fn cache_bound(dir: &Path) -> u64 {
    std::fs::read(dir.join(FILE_CACHE_BOUND))
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .and_then(|v| v["bytes"].as_u64())
        .map_or(CACHE_DEFAULT_BYTES, |b| b.max(CACHE_MIN_BYTES))
}

/// The object-store datastore returns strata's one error (docs/ERRORS.md):
/// its own kinds are `Fenced` (another host claimed the disk) and
/// `Released` (this host handed it over); the store's `Unavailable` passes
/// through unchanged.
pub use strata_block::{Error, Kind as ErrorKind};

pub type Result<T> = std::result::Result<T, Error>;

/// Stored bytes that failed a check (the message names the key).
pub(crate) fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// `DIR/strata.objstore` (§11.8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalConfig {
    pub url: String,
    pub store_uuid: String,
    pub me: HostRef,
    /// When this directory was made by `init` or `attach`, ms.
    pub joined_ms: u64,
}

/// What a process opening an object-store datastore does by itself,
/// besides what it is asked (`strata serve --store-prefetch`,
/// `--compact-policy`, `--compact-idle`). [`ObjectStoreDatastore::init`]
/// and [`ObjectStoreDatastore::attach`] use the defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenOptions {
    /// Reads that miss in the segment cache also fetch their objects
    /// whole in the background (§11.8); off, a read's round trips to the
    /// store are its own, which tests count exactly. On by default.
    pub prefetch: bool,
    /// The compaction passes the disks this process writes run by
    /// themselves (§11.7a).
    pub compact: AutoCompact,
    /// Data segments this process seals are version 2, their grains of
    /// plain disks LZ4-compressed when that saves an eighth (§18.6); off,
    /// version 1 as before. On by default in this library (its own tests
    /// run compressed); a server turns it on with `--store-compress lz4`
    /// (`strata_datastore::OpenOptions`, off by default for now).
    pub compress: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            prefetch: true,
            compact: AutoCompact::default(),
            compress: true,
        }
    }
}

/// An object-store datastore as this host sees it.
pub struct ObjectStoreDatastore {
    dir: PathBuf,
    cfg: LocalConfig,
    root: RootObject,
    store: Arc<ObjectStore>,
    cache: Arc<cache::SegmentCache>,
    /// Each disk's I/O limits in this process, shared by all its handles
    /// (snapshots too), by disk id.
    throttles: std::sync::Mutex<std::collections::HashMap<u32, Arc<Throttle>>>,
    /// Group snapshot objects read (they never change), by key.
    group_snaps: std::sync::Mutex<std::collections::HashMap<String, groups::GroupSnap>>,
    /// Group names by id (they never change).
    group_names: std::sync::Mutex<std::collections::HashMap<u32, String>>,
    /// A compaction emptied objects since the last GC asked (§11.7a).
    gc_wanted: std::sync::atomic::AtomicBool,
    opts: OpenOptions,
    /// The keys of the encrypted disks this process unlocked (§16.7).
    keys: keys::HeldKeys,
}

impl ObjectStoreDatastore {
    /// A builder for data segment `id` as this process seals them:
    /// placed and compressing, or version 1 (`OpenOptions::compress`).
    pub(crate) fn data_segment(&self, id: layout::SegId) -> layout::SegmentBuilder {
        if self.opts.compress {
            layout::SegmentBuilder::placed(id)
        } else {
            layout::SegmentBuilder::new(id)
        }
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn random_id() -> String {
    format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn io(what: &str, p: &Path, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("cannot {what} {}: {e}", p.display()))
}

/// Whether `dir` is the local directory of an object-store datastore.
pub fn is_shared(dir: &Path) -> bool {
    dir.join(FILE_LOCAL).exists()
}

/// The root object (§11.3, strata-api's [`RootObject`]) as this build
/// checks, reads and writes it.
pub(crate) trait RootCodec: Sized {
    /// The rule of this build's for a datastore's root it breaks, if any:
    /// checked before one is written and after one is read.
    fn broken(&self) -> Option<String>;
    /// The root object's bytes, checked.
    fn decode(obj: &[u8]) -> Result<Self>;
    /// # Panics
    /// On a root that breaks a rule of [`RootCodec::broken`] (a bug in
    /// this build).
    fn encode(&self) -> Vec<u8>;
}

impl RootCodec for RootObject {
    fn broken(&self) -> Option<String> {
        if self.format != FORMAT {
            return Some(format!(
                "layout version {} (this build reads version {FORMAT})",
                self.format
            ));
        }
        if self.grain_bytes != GRAIN_BYTES || self.map_fanout != MAP_FANOUT {
            return Some(format!(
                "grain {} bytes and map fan-out {} (this build uses {GRAIN_BYTES} and {MAP_FANOUT})",
                self.grain_bytes, self.map_fanout
            ));
        }
        if self.segment_max_bytes < u64::from(GRAIN_BYTES) || self.uuid.is_empty() {
            return Some(format!(
                "segments of at most {} bytes, uuid '{}'",
                self.segment_max_bytes, self.uuid
            ));
        }
        None
    }

    fn decode(obj: &[u8]) -> Result<RootObject> {
        let body = envelope::open(MAGIC_ROOT, KEY_ROOT, obj)?;
        let r: RootObject = serde_json::from_slice(body).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!("{KEY_ROOT}: not a root object: {e}"),
            )
        })?;
        if let Some(why) = r.broken() {
            return Err(Error::new(ErrorKind::Corrupt, format!("{KEY_ROOT}: {why}")));
        }
        Ok(r)
    }

    fn encode(&self) -> Vec<u8> {
        if let Some(why) = self.broken() {
            panic!("refusing to write a bad root object: {why}");
        }
        envelope::seal(MAGIC_ROOT, &serde_json::to_vec(self).expect("json"))
    }
}

/// A new identity for this host.
fn new_host() -> HostRef {
    HostRef {
        host: random_id(),
        name: host_name(),
    }
}

impl LocalConfig {
    /// The settings in `dir`, if it is a local directory of one.
    fn read(dir: &Path) -> Result<Option<LocalConfig>> {
        let path = dir.join(FILE_LOCAL);
        let b = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("read", &path, e)),
        };
        serde_json::from_slice(&b).map(Some).map_err(|e| {
            Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{}: not an object-store datastore's settings: {e}",
                    path.display()
                ),
            )
        })
    }

    /// Write the settings of a new local directory for `root` at `url`.
    fn create(dir: &Path, url: &StoreUrl, root: &RootObject, me: HostRef) -> Result<LocalConfig> {
        let cfg = LocalConfig {
            url: url.to_string(),
            store_uuid: root.uuid.clone(),
            me,
            joined_ms: now_ms(),
        };
        write_local(dir, &cfg)?;
        Ok(cfg)
    }
}

/// Refuse a local directory that holds another datastore.
fn check_local_dir(dir: &Path, url: &StoreUrl) -> Result<Option<LocalConfig>> {
    // A local datastore's superblock: a directory holds one kind or the other.
    if dir.join(strata_format::FILE_SUPER).exists() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} holds a local datastore: give an object-store datastore a directory of its own (--datastore)",
                dir.display()
            ),
        ));
    }
    match LocalConfig::read(dir)? {
        Some(cfg) => {
            if cfg.url != url.to_string() {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "{} is already the local directory of {}: use another --datastore",
                        dir.display(),
                        cfg.url
                    ),
                ));
            }
            Ok(Some(cfg))
        }
        None => Ok(None),
    }
}

fn write_local(dir: &Path, cfg: &LocalConfig) -> Result<()> {
    let mut body = serde_json::to_vec_pretty(cfg).expect("json");
    body.push(b'\n');
    write_durably(dir, FILE_LOCAL, &body)
}

impl ObjectStoreDatastore {
    /// Say that a GC would free something now (a compaction emptied
    /// objects): a server's background GC runs sooner (§11.7a).
    pub fn want_gc(&self) {
        self.gc_wanted
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether a GC was wanted since the last call (and forget it).
    pub fn take_gc_wanted(&self) -> bool {
        self.gc_wanted
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Disk `id`'s throttle in this process, made with `limits` if it has
    /// none yet.
    pub(crate) fn throttle(&self, id: u32, limits: IoLimits) -> Arc<Throttle> {
        self.throttles
            .lock()
            .unwrap()
            .entry(id)
            .or_insert_with(|| Arc::new(Throttle::new(limits)))
            .clone()
    }

    /// Create a datastore in the store at `url`, with `dir` as this host's
    /// local directory. Refuses a prefix that already holds anything, and a
    /// store that does not honour create-only writes.
    pub fn init(dir: &Path, url: &StoreUrl, opts: &Options) -> Result<(Self, Summary)> {
        if check_local_dir(dir, url)?.is_some() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{} is already attached to {url}", dir.display()),
            ));
        }
        let store = ObjectStore::connect(url, opts)?;
        let probe = store.probe()?;
        if let Some(obj) = store.get_opt(KEY_ROOT)? {
            let what = match RootObject::decode(&obj) {
                Ok(r) => format!(
                    "strata datastore {} (created by {} at {})",
                    r.uuid,
                    r.created_by.name,
                    utc(r.created_ms)
                ),
                Err(e) => format!("a damaged root object ({e})"),
            };
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{url} already holds {what}: join it with 'strata attach --object-store {url}'"
                ),
            ));
        }
        let there = store.list_first("", 3)?;
        if !there.is_empty() {
            let keys: Vec<&str> = there.iter().map(|l| l.key.as_str()).collect();
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{url} is not empty (it holds {}{}): choose an empty prefix",
                    keys.join(", "),
                    if there.len() == 3 { ", ..." } else { "" }
                ),
            ));
        }
        let me = new_host();
        let root = RootObject {
            format: FORMAT,
            uuid: random_id(),
            created_ms: now_ms(),
            created_by: me.clone(),
            grain_bytes: GRAIN_BYTES,
            map_fanout: MAP_FANOUT,
            segment_max_bytes: SEGMENT_MAX_BYTES,
        };
        if store.put_create(KEY_ROOT, Bytes::from(root.encode()))? == Put::Exists {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("another host created a datastore at {url} at the same time: attach to it"),
            ));
        }
        let cfg = LocalConfig::create(dir, url, &root, me)?;
        Self::joined(dir, cfg, root, store, probe)
    }

    /// The datastore at `dir`, its cache and per-process state new.
    fn assemble(
        dir: &Path,
        cfg: LocalConfig,
        root: RootObject,
        store: ObjectStore,
        opts: OpenOptions,
    ) -> Self {
        ObjectStoreDatastore {
            cache: cache::SegmentCache::new(dir.join("cache"), cache_bound(dir), opts.prefetch),
            opts,
            throttles: Default::default(),
            group_snaps: Default::default(),
            group_names: Default::default(),
            gc_wanted: Default::default(),
            keys: Default::default(),
            dir: dir.to_path_buf(),
            cfg,
            root,
            store: Arc::new(store),
        }
    }

    /// The datastore and its summary at the end of `init` or `attach`.
    fn joined(
        dir: &Path,
        cfg: LocalConfig,
        root: RootObject,
        store: ObjectStore,
        probe: ProbeReport,
    ) -> Result<(Self, Summary)> {
        let ds = Self::assemble(dir, cfg, root, store, OpenOptions::default());
        let mut s = ds.summary()?;
        s.probe = Some(ProbeSummary {
            racers: probe.racers,
            accepted: probe.accepted,
            ms: probe.put_ms,
        });
        Ok((ds, s))
    }

    /// Join the datastore at `url` from this host, with `dir` as its local
    /// directory (a new one, or this host's own for the same store).
    pub fn attach(dir: &Path, url: &StoreUrl, opts: &Options) -> Result<(Self, Summary)> {
        let existing = check_local_dir(dir, url)?;
        let store = ObjectStore::connect(url, opts)?;
        let probe = store.probe()?;
        let Some(obj) = store.get_opt(KEY_ROOT)? else {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "no strata datastore at {url} (no '{KEY_ROOT}' object): create one with 'strata init --object-store {url}'"
                ),
            ));
        };
        let root = RootObject::decode(&obj)
            .map_err(|e| Error::new(e.kind, format!("{url}: {}", e.message)))?;
        let cfg = match existing {
            Some(c) if c.store_uuid == root.uuid => c,
            Some(c) => {
                return Err(Error::new(
                    ErrorKind::AlreadyExists,
                    format!(
                        "{} belongs to datastore {} that was at {url}; the one there now is {}: use a new --datastore",
                        dir.display(),
                        c.store_uuid,
                        root.uuid
                    ),
                ))
            }
            None => LocalConfig::create(dir, url, &root, new_host())?,
        };
        Self::joined(dir, cfg, root, store, probe)
    }

    /// Open the datastore `dir` was attached to, reaching its store with
    /// `store` and using it as `opts` say.
    pub fn open(dir: &Path, store: &Options, opts: OpenOptions) -> Result<Self> {
        let cfg = LocalConfig::read(dir)?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!(
                    "{} is not attached to an object-store datastore",
                    dir.display()
                ),
            )
        })?;
        let url = StoreUrl::parse(&cfg.url)?;
        let store = ObjectStore::connect(&url, store)?;
        let obj = store.get_opt(KEY_ROOT)?.ok_or_else(|| {
            Error::new(
                ErrorKind::NotFound,
                format!("{url}: the datastore is gone (no '{KEY_ROOT}' object)"),
            )
        })?;
        let root = RootObject::decode(&obj)?;
        if root.uuid != cfg.store_uuid {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{url} now holds datastore {}, not {} that {} was attached to",
                    root.uuid,
                    cfg.store_uuid,
                    dir.display()
                ),
            ));
        }
        Ok(Self::assemble(dir, cfg, root, store, opts))
    }

    pub fn config(&self) -> &LocalConfig {
        &self.cfg
    }

    /// What this process does by itself with the datastore.
    pub fn options(&self) -> &OpenOptions {
        &self.opts
    }

    pub fn root(&self) -> &RootObject {
        &self.root
    }

    /// The requests this process made to the store, by kind.
    pub fn store_requests(&self) -> strata_s3::Requests {
        self.store.requests()
    }

    /// What this process's segment cache holds and how it served reads.
    /// Wait until the objects whose cache files are written in the
    /// background are written (before a clean stop).
    pub fn drain_cache(&self) {
        self.cache.drain();
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// What is in the store now.
    pub fn summary(&self) -> Result<Summary> {
        let disks = self
            .store
            .list(DIR_NAMES, None)?
            .into_iter()
            .filter_map(|l| l.key.strip_prefix(DIR_NAMES).map(str::to_string))
            .collect();
        let objs = self.store.list(DIR_DISKS, None)?;
        Ok(Summary {
            url: self.cfg.url.clone(),
            endpoint: self.store.endpoint().to_string(),
            local_dir: self.dir.clone(),
            me: self.cfg.me.clone(),
            root: self.root.clone(),
            disks,
            disk_objects: objs.len() as u64,
            disk_bytes: objs.iter().map(|l| l.size).sum(),
            probe: None,
            cache: Some(Box::new(self.cache.stats())),
        })
    }
}
