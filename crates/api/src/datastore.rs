//! A datastore as commands answer it (its space, alarms and state), and
//! the reports of what only a local datastore does: `check`'s recount,
//! `defrag`, `defrag --free-space` and the pool's layout (docs/FORMAT.md
//! §10).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::alarm::AlarmStatus;

/// A datastore's space, alarms and state, as `status` answers them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DatastoreInfo {
    pub location: String,
    pub capacity_bytes: u64,
    /// The capacity follows the file system (its free space plus what the
    /// datastore holds) rather than a configured size (`strata grow`).
    #[serde(default)]
    pub capacity_follows_fs: bool,
    pub used_bytes: u64,
    /// Mapped bytes summed over every disk and snapshot: what they would
    /// take if nothing were shared. Over `used_bytes`, the reduction that
    /// snapshots, clones, `dedup` and `import --base` give (a local
    /// datastore's; an object store's does not count it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logical_bytes: Option<u64>,
    pub reserved_bytes: u64,
    /// Bytes held on the host file system for reservations: the pool
    /// file's reserved tail (FORMAT.md §7.1).
    #[serde(default)]
    pub reserved_held_bytes: u64,
    /// Bytes held on the host past the pool's end beyond the reservations,
    /// readied for first writes (FORMAT.md §7.1, "Readied space").
    #[serde(default)]
    pub readied_bytes: u64,
    pub free_bytes: u64,
    pub provisioned_bytes: u64,
    /// Provisioned bytes over capacity, in percent.
    pub overcommit_percent: u64,
    /// Used plus reserved bytes over capacity, in percent.
    #[serde(default)]
    pub used_percent: u64,
    /// Every alarm (usage, overcommit) as evaluated now.
    #[serde(default)]
    pub alarms: Vec<AlarmStatus>,
    pub disks: usize,
    pub snapshots: usize,
    pub metadata_cache_bytes: u64,
    /// How the pool uses the host page cache: "writeback" or "none"
    /// (direct I/O; `serve --cache none`).
    #[serde(default)]
    pub cache_mode: String,
    /// Deleted snapshots and disks whose space is still being given back.
    pub reclaiming: usize,
    /// Set when the datastore stopped accepting writes after an error
    /// (reads go on); reopening it recovers from its log.
    pub fail_stop: Option<FailStop>,
    /// Checkpoints completed since the datastore was opened.
    pub checkpoints: u64,
    /// How the pool's space lies (free extents, what the pool file holds
    /// on the host): computed by `info_with_layout`, not by `info`.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<PoolLayout>,
}

/// Why a datastore stopped accepting writes (the engine's fail-stop).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailStop {
    pub cause: String,
    pub since_unix: u64,
}

/// How the pool's space lies (FORMAT.md §10.1).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolLayout {
    /// Maximal runs of free grains below the pool end.
    pub free_extents: u64,
    /// Runs per size class (4k, 8k-60k, 64k-1020k, 1m-16m, 16m+).
    pub free_extent_histogram: BTreeMap<String, u64>,
    /// Free grains below the pool end, in bytes.
    pub free_in_pool_bytes: u64,
    /// The pool end (high-water mark), in bytes.
    pub pool_bytes: u64,
    /// What `pool.data` occupies on the host file system (allocated blocks).
    pub pool_file_bytes: u64,
}

/// Free-run size classes of `free_extent_histogram`, in grains: 1, 2–15
/// (< 64 KiB, never punched), 16–255 (< 1 MiB), 256–4095 (< 16 MiB), more.
pub const FREE_EXTENT_CLASSES: [(&str, u64); 5] = [
    ("4k", 1),
    ("8k-60k", 2),
    ("64k-1020k", 16),
    ("1m-16m", 256),
    ("16m+", 4096),
];

/// What `defrag --free-space` did (FORMAT.md §10.4).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct FreeSpaceReport {
    pub used_bytes: u64,
    pub pool_bytes_before: u64,
    pub pool_bytes_after: u64,
    pub pool_file_bytes_before: u64,
    pub pool_file_bytes_after: u64,
    /// Live grains (data and map nodes) moved down, in bytes.
    pub moved_bytes: u64,
    /// Stored bytes of live packed fragments moved down by repacking the
    /// regions whose stream grains lay above the new end (FORMAT.md
    /// §10.4).
    #[serde(default)]
    pub repacked_bytes: u64,
    /// Free space inside the pool given back to the host file system.
    pub punched_bytes: u64,
    /// Free space in runs shorter than 64 KiB, not punched because clients
    /// were doing I/O (FORMAT.md §10.4, "Punch"; some of it may be holes
    /// already); a run with the clients quiet gives it back.
    #[serde(default)]
    pub short_runs_bytes: u64,
    /// Grains left in place because a reference to them could not be
    /// accounted for; 0 in a healthy datastore.
    pub grains_kept: u64,
    /// Why the pool end could not come down as far as planned (clients
    /// needed the room), if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What `dedup --estimate` found (docs/FORMAT.md §17.3): the named disks'
/// heads and snapshots, read without a key, nothing changed.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DedupEstimate {
    /// The disks looked at (all of the datastore's when none was named).
    pub disks: Vec<String>,
    /// Their heads and snapshots.
    pub versions: u64,
    /// Mapped grains summed over every version, in bytes: what a copy of
    /// each version would take.
    pub logical_bytes: u64,
    /// Distinct grains those versions name, raw or packed, in bytes
    /// (uncompressed).
    pub stored_bytes: u64,
    /// logical − stored: shared already by snapshots, clones and earlier
    /// re-sharing.
    pub shared_bytes: u64,
    /// What re-sharing equal grains at the same virtual grain (§17.2)
    /// would free: exact, every candidate compared byte for byte.
    pub same_offset_bytes: u64,
    /// Packed grains (logical bytes) the pass would point at an equal
    /// packed grain at their virtual grain (FORMAT.md §17.2b): their
    /// stored bytes come back once `strata compress` repacks their streams.
    #[serde(default)]
    pub same_offset_packed_bytes: u64,
    /// What sharing equal grains at any offset would free: estimated from
    /// a hash sample (one grain in `sample_every`), same-offset included.
    pub any_offset_bytes: u64,
    /// Distinct grains in the sample, and the sampling rate.
    pub sample_grains: u64,
    pub sample_every: u64,
    /// Stored grains of unencrypted thin disks that hold only zeros
    /// (`punchzero` could leave them unmapped).
    pub zero_bytes: u64,
    /// Stored grains under a key: their compressibility needs the key.
    pub encrypted_bytes: u64,
    /// Unencrypted grains packed as a sample, as `strata compress` packs
    /// them (one aligned quad of virtual grains in 64, so a grain in 64;
    /// past 16,384 grains one in two of those quads is kept, then one in
    /// four..., picked at random, so that the sample spans the whole walk:
    /// one quad in `compress_sample_every` in the end; FORMAT.md §18.9); what they would take with `--codec zstd` (its
    /// quads, pairs and single grains, laid out in streams as the pass
    /// lays them out, §18.8; a grain left raw, zeros included, 4,096),
    /// and how many of them zstd packs.
    pub compress_sampled_grains: u64,
    pub compress_sampled_bytes_after: u64,
    pub packable_grains: u64,
    #[serde(default)]
    pub compress_sample_every: u64,
    /// What the sampled grains would take with LZ4 (the default codec).
    #[serde(default)]
    pub lz4_sampled_bytes_after: u64,
    /// Of `stored_bytes`, the grains held packed (`strata compress`,
    /// FORMAT.md §18.8), and the pool grains of the streams they lie in:
    /// exact, counted from the maps (a stream grain's dead fragments
    /// included, as they take its space until the stream goes).
    #[serde(default)]
    pub packed_bytes: u64,
    #[serde(default)]
    pub packed_stored_bytes: u64,
    /// Bytes read to find the figures.
    pub read_bytes: u64,
}

/// What `dedup` did (docs/FORMAT.md §17.2): equal grains at the same
/// virtual grain of the named disks made one, every sharer following.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DedupReport {
    /// The disks compared (all of the datastore's when none was named).
    pub disks: Vec<String>,
    /// Their heads and snapshots.
    pub versions: u64,
    /// Grains whose sharers now name an equal grain, freed: in bytes.
    pub freed_bytes: u64,
    /// Candidate grains read and compared, in bytes.
    pub read_bytes: u64,
    /// Regions (1 MiB of virtual grains) walked.
    pub regions: u64,
    /// Regions left as they were because their maps changed while their
    /// grains were compared (clients wrote there, a snapshot went): a
    /// later run compares them again.
    pub regions_skipped: u64,
    /// Grains left because a reference to them could not be accounted
    /// for; 0 in a healthy datastore.
    pub grains_kept: u64,
    /// Packed grains (logical bytes) whose sharers now name an equal
    /// packed grain (FORMAT.md §17.2b); what they took comes back when
    /// their streams' other fragments die or `strata compress` repacks
    /// them (stream grains freed at once are in `freed_bytes`).
    #[serde(default)]
    pub packed_merged_bytes: u64,
    /// The datastore's used bytes (data and map grains) before and after.
    pub used_bytes_before: u64,
    pub used_bytes_after: u64,
}

/// The codec `compress` packs grains with (docs/FORMAT.md §18.8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PackCodec {
    /// LZ4, each grain alone: reads of a packed grain decompress 4 KiB
    /// at several GB/s (hot data; the default).
    #[default]
    Lz4,
    /// zstd at level 4, an aligned quad or pair together when that is
    /// smaller (FORMAT.md §18.9): some 30% fewer bytes than LZ4 on OS
    /// images, reads decompress up to 16 KiB several times slower (cold
    /// and archival data).
    Zstd,
}

impl PackCodec {
    pub fn parse(s: &str) -> Result<Self, strata_block::Error> {
        match s {
            "lz4" => Ok(Self::Lz4),
            "zstd" => Ok(Self::Zstd),
            other => Err(strata_block::Error::new(
                strata_block::Kind::InvalidArgument,
                format!("unknown codec '{other}' (use lz4 or zstd)"),
            )),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// What `compress` did (docs/FORMAT.md §18.5, §18.8): the named disks'
/// raw grains that shrink by an eighth or more, compressed (a grain, or
/// an aligned pair or quad together) and laid out as packed streams, every sharer
/// following.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CompressReport {
    /// The disks packed (all of the datastore's when none was named).
    pub disks: Vec<String>,
    /// Their heads and snapshots.
    pub versions: u64,
    /// The codec: "lz4" (the default) or "zstd".
    pub codec: String,
    /// Raw grains read to be compressed, in bytes.
    pub read_bytes: u64,
    /// Virtual grains' bytes now packed (each distinct grain once).
    pub packed_bytes: u64,
    /// Of them, in fragments of an aligned pair.
    pub pair_bytes: u64,
    /// Of them, in fragments of an aligned quad (four grains, zstd only).
    #[serde(default)]
    pub quad_bytes: u64,
    /// Stored bytes of live fragments moved out of half-dead stream
    /// grains into new streams, freeing those grains (FORMAT.md §18.10).
    #[serde(default)]
    pub repacked_bytes: u64,
    /// Pool bytes of the streams written for them.
    pub stream_bytes: u64,
    /// Grains left raw: they do not shrink by an eighth (or are zeros,
    /// left to zero reclaim), in bytes.
    pub raw_bytes: u64,
    /// Regions (1 MiB of virtual grains) walked.
    pub regions: u64,
    /// Regions left as they were because their maps changed while their
    /// grains were compressed: a later run packs them.
    pub regions_skipped: u64,
    /// Raw grains not read again, in bytes: their regions are as an earlier
    /// run of this process left them, finding nothing to pack there
    /// (FORMAT.md §18.5).
    #[serde(default)]
    pub unchanged_bytes: u64,
    /// The datastore's used bytes (data and map grains) before and after.
    pub used_bytes_before: u64,
    pub used_bytes_after: u64,
}

/// What `defrag` did, or with `dry_run` would do.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DefragReport {
    pub disk: String,
    pub dry_run: bool,
    pub fragments_before: u64,
    /// After the run (equal to `fragments_before` for a dry run).
    pub fragments_after: u64,
    pub mapped_bytes: u64,
    /// Bytes moved (dry run: bytes in regions with breaks inside; regions
    /// that move only to join the one before are not counted).
    pub moved_bytes: u64,
    /// Regions (1 MiB) moved, or that would move.
    pub regions_moved: u64,
    /// Regions left as they were for want of free space in runs.
    pub regions_skipped: u64,
    /// Grains left in place because a reference to them could not be
    /// accounted for (FORMAT.md §10.2); 0 in a healthy datastore.
    pub grains_kept: u64,
}

/// What `check` of a local datastore found: every reference count and
/// counter recomputed from the maps (DESIGN.md invariant 3).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct CheckReport {
    pub versions: usize,
    pub map_nodes: u64,
    pub data_grains: u64,
    pub used_bytes: u64,
    pub pool_grains: u64,
    pub leaked_grains: u64,
    pub overshared_grains: u64,
    /// Metadata pages that failed their checks (each is named in `errors`).
    pub damaged_pages: u64,
    pub errors: Vec<String>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }
}
