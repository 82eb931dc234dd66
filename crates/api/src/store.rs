//! An object-store datastore's own answers (docs/MULTIHOST.md): the store
//! as this host joined it ([`Summary`], `status`, `init`, `attach`), who
//! writes a disk ([`Owner`]), `gc`, `check` and `compact`.
//!
//! strata-objstore answers in these types, and the server passes them on
//! as they are. Some are also written to the store: [`Owner`] is a field of
//! every manifest (docs/FORMAT.md §11.5), [`RootObject`] is the root object
//! (§11.3) and [`HostRef`] is in it and in the local directory's settings,
//! so their serde shapes change only with the format.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What `init`, `attach` and `status` show.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub url: String,
    pub endpoint: String,
    pub local_dir: PathBuf,
    pub me: HostRef,
    pub root: RootObject,
    /// Disk names (§11.2), sorted.
    pub disks: Vec<String>,
    /// Objects under `disks/` and their bytes.
    pub disk_objects: u64,
    pub disk_bytes: u64,
    /// The conditional-write probe, when this call ran it.
    pub probe: Option<ProbeSummary>,
    /// This process's segment cache (§11.8).
    #[serde(default)]
    pub cache: Option<Box<CacheStats>>,
}

/// A host, as objects name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRef {
    /// Random, made at `init` / `attach`, kept in the local directory.
    pub host: String,
    /// The host name, for people.
    pub name: String,
}

/// The store's root object (docs/FORMAT.md §11.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootObject {
    pub format: u32,
    pub uuid: String,
    pub created_ms: u64,
    pub created_by: HostRef,
    pub grain_bytes: u32,
    pub map_fanout: u32,
    pub segment_max_bytes: u64,
}

/// The conditional-write probe's run (`init`, `attach`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProbeSummary {
    pub racers: usize,
    pub accepted: usize,
    pub ms: f64,
}

/// What this process's segment cache holds and how it served reads
/// (docs/FORMAT.md §11.8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Bytes of the segment files held, and their bound.
    pub bytes: u64,
    pub bound_bytes: u64,
    pub segments: u64,
    /// Grain and node reads a cached file served.
    pub hits: u64,
    /// Grain and node reads that went to the store.
    pub misses: u64,
    /// Files deleted to stay within the bound.
    pub evictions: u64,
    /// Cached files that failed verification (deleted, read from the store).
    pub damaged: u64,
    /// Segments fetched ahead because a disk's hot set named them.
    #[serde(default)]
    pub hot_fetched: u64,
    /// Whole objects turned into sparse files of the grains read (§11.8).
    #[serde(default)]
    pub shrunk: u64,
    /// Whole objects evicted whose read grains were kept as sparse files.
    #[serde(default)]
    pub evicted_kept: u64,
}

/// What `gc` (or `gc --dry-run`) found and did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GcReport {
    pub dry_run: bool,
    /// The run's claim, `gc/SEQ16` (none for a dry run).
    pub claim: Option<String>,
    /// Bytes and count of every segment in the store.
    pub stored_bytes: u64,
    pub segments: u64,
    /// Bytes of the grains and nodes reached from a live root.
    pub live_bytes: u64,
    /// What the same grains and nodes would take uncompressed (a grain
    /// 4,096 bytes): against `live_bytes`, what compress-at-seal saves
    /// (FORMAT.md §18.6).
    #[serde(default)]
    pub live_plain_bytes: u64,
    /// Segments nothing reaches that may go (fenced or sealed before the
    /// newest manifest), and their bytes.
    pub garbage_segments: u64,
    pub garbage_bytes: u64,
    /// Unreached segments kept because they may be uploads in flight.
    pub in_flight_segments: u64,
    pub deleted_segments: u64,
    pub deleted_manifests: u64,
    pub disks: Vec<DiskSpace>,
    pub holds: u64,
    pub ms: u64,
    /// Objects holding grains or nodes (segments, and manifests by their
    /// payload) by the share of their bytes a live root reaches: `[0]`
    /// under 10 %, `[1]` 10–20 %, ..., `[9]` 90 % and more. GC frees only
    /// objects nothing reaches; the partly live ones are what compaction
    /// rewrites (§11.7).
    #[serde(default)]
    pub live_share: Vec<u64>,
    /// Objects reached but less than half live, and the bytes in them
    /// nothing reaches: what compacting them would give back.
    #[serde(default)]
    pub sparse_objects: u64,
    #[serde(default)]
    pub sparse_dead_bytes: u64,
}

/// One disk's space, as the mark found it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DiskSpace {
    pub name: String,
    pub id: String,
    /// Grains and nodes reached from this disk's roots (its snapshots'
    /// included) and from no other disk's or hold's.
    pub exclusive_bytes: u64,
    /// Everything reached from this disk's roots.
    pub referenced_bytes: u64,
}

/// What `check` of an object store found (manifests, roots, segments).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckReport {
    pub disks: u64,
    pub snapshots: u64,
    pub holds: u64,
    pub nodes: u64,
    pub grains: u64,
    pub errors: Vec<String>,
}

/// What a compaction pass (`compact DISK`) found and did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompactReport {
    pub disk: String,
    pub dry_run: bool,
    /// The threshold, in percent of an object's bytes.
    pub below_pct: u32,
    /// Objects holding the head's grains, their bytes and the head's
    /// bytes in them.
    pub objects: u64,
    pub stored_bytes: u64,
    pub live_bytes: u64,
    /// Objects under the threshold (a snapshot reaches none of them), and
    /// their bytes.
    pub candidates: u64,
    pub candidate_bytes: u64,
    /// Grains rewritten (a dry run: that would be) and their bytes.
    pub rewritten_grains: u64,
    pub rewritten_bytes: u64,
    /// Rewritten grains whose new place a commit took, and those that
    /// were written again meanwhile (their copies are garbage).
    pub relocated_grains: u64,
    pub dropped_grains: u64,
    /// Segments uploaded.
    pub segments: u64,
    /// Bytes of the objects emptied (GC frees them).
    pub emptied_bytes: u64,
    pub ms: u64,
}

/// Who may write a disk (docs/FORMAT.md §11.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    pub host: String,
    pub name: String,
    /// The writing process, or [`Owner::HOST_PID`].
    pub pid: u32,
}

impl Owner {
    /// `pid` of the host's own claim (§11.6): the host writes the disk,
    /// no process of it does (`strata claim` with no server running).
    pub const HOST_PID: u32 = 0;

    /// Whether this is the host's claim rather than a process's.
    pub fn is_host(&self) -> bool {
        self.pid == Self::HOST_PID
    }
}
