//! The kinds of command statistics tell apart (a leaf: `disk` and
//! `snapshot` both use it).

use serde::{Deserialize, Serialize};

/// The kinds of command a [`DiskStats`](crate::DiskStats) tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Read,
    Write,
    Flush,
    Unmap,
    WriteZeroes,
    BlockStatus,
}

/// Number of [`Op`] variants.
pub const OP_COUNT: usize = 6;

impl Op {
    /// Every op, in the order they are reported.
    pub const ALL: [Op; OP_COUNT] = [
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Unmap,
        Op::WriteZeroes,
        Op::BlockStatus,
    ];

    /// The name used in JSON, text output and the Prometheus `op` label.
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Unmap => "unmap",
            Op::WriteZeroes => "write_zeroes",
            Op::BlockStatus => "block_status",
        }
    }

    #[inline]
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}
