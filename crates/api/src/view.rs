//! A disk and a datastore as commands answer them whichever their kind:
//! the kind-neutral figures ([`DiskInfo`], [`DatastoreInfo`]) with, for an
//! object store, its own record beside them. docs/API.md shows the JSON.
//!
//! strata-datastore's `Datastore` trait answers in these (and fills
//! [`DatastoreView::cannot`] from its capability table).

use serde::{Deserialize, Serialize};

use crate::datastore::DatastoreInfo;
use crate::disk::DiskInfo;
use crate::store::{Owner, Summary};

/// A disk as commands answer it (`info`, `list`, and the commands that
/// change a disk), whichever its kind: the figures of [`DiskInfo`] (those
/// a kind does not know without reading a whole map are absent), and for a
/// disk of an object store its writer record.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskView {
    #[serde(flatten)]
    pub info: DiskInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<StoreDisk>,
    /// Who has the disk or one of its snapshots open through the server
    /// that answered (`info` only; docs/INTERLOCKS.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientInfo>,
}

impl From<DiskInfo> for DiskView {
    fn from(info: DiskInfo) -> Self {
        DiskView {
            info,
            object_store: None,
            clients: Vec::new(),
        }
    }
}

/// One client's hold on an export of a served disk: a session
/// (docs/INTERLOCKS.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClientInfo {
    /// `vm`, or `vm@s1` for a snapshot's export.
    pub export: String,
    /// `nbd`, `vhost-user-blk` or `fuse`.
    pub transport: String,
    /// NBD: `ip:port`, or `local pid N` over a Unix socket, under TLS the
    /// certificate's subject first; vhost-user-blk: `SOCKET (pid N)`;
    /// FUSE: `pid N` (the process with the export's file open).
    pub peer: String,
    pub read_only: bool,
    pub since_unix: u64,
}

/// A vhost-user-blk socket a server serves, and the frontend connected
/// to it, if any.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VhostExport {
    pub socket: std::path::PathBuf,
    /// What it serves: `vm`, or `vm@s1`.
    pub export: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientInfo>,
}

/// Who writes a disk of an object store, from its newest manifest as the
/// answering process knows it (docs/FORMAT.md §11.5).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct StoreDisk {
    /// The disk's id in the store, 8 hex digits (its objects' prefix).
    pub id: String,
    /// Bumped by every claim: the writer's fencing token.
    pub generation: u32,
    /// The writer (None: no host has written the disk yet).
    pub owner: Option<Owner>,
    /// The manifest's key and when it was written (ms since the epoch).
    pub manifest: String,
    pub written_ms: u64,
    /// The answering process's handle was fenced: why (another host
    /// writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced: Option<String>,
}

/// A datastore as `status` answers it: space and alarms as for every
/// kind, what its kind cannot do, and for an object store the store's own
/// summary.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatastoreView {
    #[serde(flatten)]
    pub info: DatastoreInfo,
    /// What this kind of datastore cannot do, and why (strata-datastore's
    /// capability table).
    #[serde(default)]
    pub cannot: Vec<Refusal>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<Summary>,
    /// Every session on the server that answered (docs/INTERLOCKS.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clients: Vec<ClientInfo>,
}

/// A command a kind of datastore refuses, with the reason.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refusal {
    pub command: String,
    pub reason: String,
}
