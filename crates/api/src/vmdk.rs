//! VMDK files: the subformats `export` writes, and the commands on VMDK
//! files that need no datastore (`vmdk info`, `vmdk check [--repair]`,
//! `vmdk shrink`) as a [`VmdkRequest`] answering a [`VmdkResponse`].
//! `strata-vmdk` reports its checks and shrinks in these types.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use strata_block::{Error, Kind as ErrorKind};

use crate::value;

/// What `export --subformat` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subformat {
    MonolithicSparse,
    MonolithicFlat,
    StreamOptimized,
    VmfsSparse,
    SeSparse,
}

impl Subformat {
    pub const ALL: [Subformat; 5] = [
        Subformat::MonolithicSparse,
        Subformat::MonolithicFlat,
        Subformat::StreamOptimized,
        Subformat::VmfsSparse,
        Subformat::SeSparse,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Subformat::MonolithicSparse => "monolithicSparse",
            Subformat::MonolithicFlat => "monolithicFlat",
            Subformat::StreamOptimized => "streamOptimized",
            Subformat::VmfsSparse => "vmfsSparse",
            Subformat::SeSparse => "seSparse",
        }
    }

    pub fn parse(s: &str) -> Result<Self, Error> {
        Self::ALL
            .into_iter()
            .find(|f| f.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "unknown subformat {s:?}; one of: {}",
                        Self::ALL.map(|f| f.name()).join(", ")
                    ),
                )
            })
    }

    /// Whether an image of this subformat can have a parent.
    pub fn can_be_delta(self) -> bool {
        matches!(
            self,
            Subformat::MonolithicSparse | Subformat::VmfsSparse | Subformat::SeSparse
        )
    }
}

/// What `check` found in one extent (serialised as is by `vmdk check --json`).
#[derive(Debug, Default, Clone, Serialize)]
pub struct ExtentCheck {
    pub errors: Vec<String>,
    pub warnings: Vec<String>,
    pub repaired: Vec<String>,
    pub allocated_grains: u64,
    pub zero_grains: u64,
    pub unmapped_grains: u64,
}

/// What `shrink` did (serialised as is by `vmdk shrink --json`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShrinkReport {
    pub grains_before: u64,
    pub grains_after: u64,
    pub zero_grains_found: u64,
    pub moved: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// A command on VMDK files, run in this process (no datastore).
#[derive(Debug, Clone)]
pub enum VmdkRequest {
    Info {
        path: PathBuf,
    },
    Check {
        path: PathBuf,
        repair: bool,
    },
    Shrink {
        path: PathBuf,
        /// Bytes/s a served file's shrink may read and copy (None: only
        /// the default pause between steps).
        rate_bytes_per_sec: Option<u64>,
    },
}

/// The answer to a [`VmdkRequest`].
#[derive(Debug, Clone)]
pub enum VmdkResponse {
    Info(VmdkInfo),
    Check(VmdkCheckReport),
    /// One entry per SEsparse extent of the top link.
    Shrink(Vec<ShrinkResult>),
}

impl VmdkResponse {
    /// Whether the command should exit non-zero although it ran: errors
    /// remain after `check`.
    pub fn found_problems(&self) -> bool {
        matches!(self, VmdkResponse::Check(r) if r.remaining_errors > 0)
    }
}

/// `vmdk info`: a chain, top link first.
#[derive(Debug, Clone, Serialize)]
pub struct VmdkInfo {
    pub size_bytes: u64,
    /// Number of links.
    pub depth: usize,
    pub links: Vec<VmdkLinkInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VmdkLinkInfo {
    pub file: String,
    pub create_type: String,
    /// Content ID, shown as 8 hex digits as in the descriptor.
    #[serde(serialize_with = "hex8")]
    pub cid: u32,
    #[serde(serialize_with = "hex8")]
    pub parent_cid: u32,
    pub parent_hint: Option<String>,
    pub size_bytes: u64,
    pub extents: Vec<VmdkExtentInfo>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VmdkExtentInfo {
    /// The descriptor's extent line type (SPARSE, FLAT, ZERO, VMFS...).
    #[serde(rename = "type")]
    pub line_type: String,
    /// What the extent is: flat, zero, or the sparse format's name.
    pub format: String,
    /// Empty for a zero extent.
    pub file: String,
    pub start_sector: u64,
    pub sectors: u64,
    /// Sparse extents only.
    pub grain_bytes: Option<u64>,
}

/// `vmdk check [--repair]`.
#[derive(Debug, Clone, Serialize)]
pub struct VmdkCheckReport {
    pub files: Vec<VmdkFileCheck>,
    /// Errors found (before any repair).
    pub errors: usize,
    /// Errors a check after the repair still finds (without repair: `errors`).
    pub remaining_errors: usize,
}

/// What `vmdk check` found in one file.
#[derive(Debug, Clone, Serialize)]
pub struct VmdkFileCheck {
    pub file: String,
    #[serde(flatten)]
    pub check: ExtentCheck,
}

/// What `vmdk shrink` did to one extent.
pub type ShrinkResult = ShrinkReport;

fn hex8<S: serde::Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{v:08x}"))
}

/// A [`Subformat`] by its VMware name on the control socket.
pub(crate) mod subformat_name {
    use serde::{Deserialize, Deserializer, Serializer};

    use super::Subformat;

    pub fn serialize<S: Serializer>(v: &Subformat, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(v.name())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Subformat, D::Error> {
        let name = String::deserialize(d)?;
        Subformat::parse(&name).map_err(serde::de::Error::custom)
    }
}

impl VmdkResponse {
    /// The answer's `--json` document.
    pub fn to_json(&self) -> Value {
        match self {
            VmdkResponse::Info(i) => value(i),
            VmdkResponse::Check(r) => value(r),
            VmdkResponse::Shrink(rs) => value(rs),
        }
    }
}
