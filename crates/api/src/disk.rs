//! A disk and its snapshots as commands answer them, whichever kind of
//! datastore holds them, and how a disk is provisioned.
//!
//! [`Provisioning`] is also a field of the local datastore's catalog
//! records (docs/FORMAT.md §6): its serde shape changes only with the
//! format.

use serde::{Deserialize, Serialize};
use strata_block::throttle::IoLimits;
use strata_block::{Error, Kind as ErrorKind};

/// How a disk's space is provisioned (DESIGN.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provisioning {
    /// Nothing reserved; grains allocated on first write.
    Thin,
    /// Full size reserved at create; grains written (zeroed) lazily.
    Zeroedthick,
    /// Full size allocated and zeroed at create.
    Eagerzeroedthick,
}

impl Provisioning {
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "thin" => Ok(Self::Thin),
            "zeroedthick" => Ok(Self::Zeroedthick),
            "eagerzeroedthick" => Ok(Self::Eagerzeroedthick),
            other => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("unknown provisioning type '{other}' (use thin, zeroedthick or eagerzeroedthick)"),
            )),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Thin => "thin",
            Self::Zeroedthick => "zeroedthick",
            Self::Eagerzeroedthick => "eagerzeroedthick",
        }
    }
    pub fn is_thick(self) -> bool {
        self != Self::Thin
    }
}

/// What `info` reports about a disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskInfo {
    pub name: String,
    pub size_bytes: u64,
    pub provisioning: Provisioning,
    /// Bytes the disk's head maps. This and `nb`, `tbz` and
    /// `created_unix` are None where a datastore's kind does not know them
    /// without reading the disk's whole map (an object store's disks:
    /// docs/MULTIHOST.md); the engine always fills them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// 1 MiB blocks allocated (thick disks: all of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nb: Option<u64>,
    /// Blocks allocated but still to be zeroed (zeroedthick).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tbz: Option<u64>,
    pub snapshots: usize,
    pub current_snapshot: Option<String>,
    /// `DISK@SNAP` a linked clone was made from.
    pub parent: Option<String>,
    /// The parent snapshot (or its disk) was deleted since: the clone
    /// keeps its data (docs/INTERLOCKS.md). Found by looking the parent up
    /// when answering, not stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub parent_deleted: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_unix: Option<u64>,
    /// What removing the disk would free once reclaiming ends: grains that
    /// only its head and its snapshots reference (linked clones keep what
    /// they share). Computed by `disk_info`, not by `list_disks` (its cost
    /// follows the disk's exclusive data; docs/FORMAT.md §7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
    /// What deleting all the disk's snapshots (keeping its head) would free.
    /// Not the sum of the snapshots' `exclusive_bytes`: grains two
    /// snapshots share are exclusive to neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_space_bytes: Option<u64>,
    /// The head's fragments (docs/FORMAT.md §10.1): 1 plus the number of
    /// times a mapped grain is not stored right after the one before it.
    /// Computed by `disk_info_with_space`, not by `list_disks`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fragments: Option<u64>,
    /// Of the head's mapped bytes, those held packed (`strata compress`,
    /// docs/FORMAT.md §18.8), uncompressed; from the same walk as
    /// `fragments`. A local datastore's only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packed_bytes: Option<u64>,
    /// I/O limits (`strata limit`), absent when there are none.
    #[serde(default, skip_serializing_if = "IoLimits::is_none")]
    pub limits: IoLimits,
    /// How the disk is encrypted (docs/SECURITY.md, "Encryption at
    /// rest"); absent for a plain disk. Never holds a key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<Encryption>,
}

/// An encrypted disk's cipher, whether this process holds its keys, and
/// its keyslots (FORMAT.md §16): what may be shown, never a key.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Encryption {
    /// `aes-xts-plain64`.
    pub cipher: String,
    /// No key for it has been given to this process (`strata unlock`):
    /// its data cannot be read or written.
    pub locked: bool,
    /// The keyring, shared with the disk's linked clones (on an
    /// object-store datastore, where each disk has a record of its own:
    /// the disk's id).
    pub keyring: u64,
    pub slots: Vec<KeySlotInfo>,
    /// The number of the data key new writes use (it goes up by one with
    /// each deep rekey).
    #[serde(default)]
    pub data_key: u32,
    /// A deep rekey under way (`strata rekey --deep`), or one that was
    /// interrupted and waits to be resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deep_rekey: Option<RekeyProgress>,
    /// A linked clone with a key of its own (`clone --own-key`, FORMAT.md
    /// §16.4): its writes go under it, what it inherited stays under its
    /// source's key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub own_key: bool,
}

/// How far a deep rekey has come: the data below `done_bytes` (of every
/// version of the lineage) is under the new data key.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RekeyProgress {
    pub done_bytes: u64,
    pub total_bytes: u64,
}

/// One keyslot: a secret that opens the disk's keys.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct KeySlotInfo {
    pub slot: u32,
    /// How its secret was given: `file`, `keyring`, `helper`.
    pub source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// `hkdf-sha256` (key material) or `argon2id` (a passphrase).
    pub kdf: String,
    pub created_unix: u64,
}

/// A snapshot of a disk as commands answer it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// Never given to another snapshot of the disk, even once this one is
    /// deleted and its name reused (docs/BACKUP.md).
    #[serde(default)]
    pub id: u64,
    pub name: String,
    pub description: String,
    pub created_unix: u64,
    pub parent: Option<String>,
    pub size_bytes: u64,
    /// Bytes mapped in the snapshot (shared or not). This and
    /// `exclusive_bytes` are None where a datastore's kind does not know
    /// them without reading whole maps (an object store's snapshots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mapped_bytes: Option<u64>,
    /// What deleting this snapshot alone would free once reclaiming ends:
    /// data grains and map nodes only it references (docs/FORMAT.md §7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
    /// Whether the disk's live state descends directly from this snapshot.
    pub current: bool,
    /// The group whose group snapshot this is one member of (deleted with
    /// it, not alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// What `punchzero` did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PunchZeroReport {
    pub disk: String,
    pub scanned_bytes: u64,
    pub released_bytes: u64,
    /// The disk's allocated bytes afterwards.
    pub allocated_bytes: u64,
}
