//! Rules of the protocol that need a device no real disk is cheap enough
//! to be: here, one with more extents than a BLOCK_STATUS reply may carry
//! (the table "NBD protocol conformance" in docs/CLIENTS.md).

use std::os::unix::net::UnixListener;
use std::sync::Arc;

use strata_block::{
    BlockDevice, BlockError, BlockResult, ErrorKind, Extent, ReadFill, ZeroOptions,
};

use super::client::*;
use super::MIB;
use crate::proto::*;
use crate::{ExportInfo, ExportProvider, NbdServer, ServerOptions};

/// Length of each extent of [`Striped`].
const STRIPE_BYTES: u64 = 512;

/// A read-only device whose block status alternates hole and data every
/// [`STRIPE_BYTES`] (a hole first); it reads as zeros.
struct Striped {
    size: u64,
}

fn refused() -> BlockError {
    BlockError::new(ErrorKind::ReadOnly, "a striped test device")
}

impl BlockDevice for Striped {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], _offset: u64) -> BlockResult<ReadFill> {
        buf.fill(0);
        Ok(ReadFill::all_zeros(buf.len() as u64))
    }
    fn write_at(&self, _: &[u8], _: u64, _: bool) -> BlockResult<()> {
        Err(refused())
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    fn unmap(&self, _: u64, _: u64) -> BlockResult<()> {
        Err(refused())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: ZeroOptions) -> BlockResult<()> {
        Err(refused())
    }
    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        strata_block::check_range(offset, len, self.size)?;
        let end = offset + len;
        let mut out = Vec::with_capacity((len / STRIPE_BYTES + 1) as usize);
        let mut at = offset;
        while at < end {
            let stripe = at / STRIPE_BYTES;
            let next = ((stripe + 1) * STRIPE_BYTES).min(end);
            let hole = stripe.is_multiple_of(2);
            out.push(Extent {
                len_bytes: next - at,
                hole,
                zero: hole,
            });
            at = next;
        }
        Ok(out)
    }
}

/// One export, `striped`.
struct OneExport(Arc<Striped>);

impl ExportProvider for OneExport {
    fn list(&self) -> Vec<ExportInfo> {
        vec![ExportInfo {
            name: "striped".into(),
            description: String::new(),
        }]
    }
    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error> {
        match name {
            "striped" => Ok(self.0.clone()),
            _ => Err(strata_block::Error::new(
                strata_block::Kind::NotFound,
                format!("no export named '{name}'"),
            )),
        }
    }
}

/// However many extents the range has (here 2^21 in 1 GiB), a
/// BLOCK_STATUS reply carries at most 2^20 descriptors, as the protocol
/// asks, and ends inside the request; the client asks again from where it
/// ended and gets the state that follows.
#[test]
fn block_status_replies_stop_short_of_a_million_descriptors() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbd.sock");
    let device = Arc::new(Striped { size: 1024 * MIB });
    let server = NbdServer::new(Arc::new(OneExport(device)), ServerOptions::default());
    server
        .serve_unix(UnixListener::bind(&sock).unwrap())
        .unwrap();
    let (mut c, _) = Client::open(&sock, "striped", true, true);
    let len = 1u32 << 30;
    let descs = c.block_status(0, 0, len).unwrap();
    assert!(!descs.is_empty(), "no descriptor");
    assert!(descs.len() <= 1 << 20, "{} descriptors", descs.len());
    let covered: u64 = descs.iter().map(|d| d.0 as u64).sum();
    assert!(covered < len as u64, "all of 2^21 extents described");
    for (i, &(n, state)) in descs.iter().enumerate() {
        let want = if i.is_multiple_of(2) {
            STATE_HOLE | STATE_ZERO
        } else {
            0
        };
        assert_eq!((n as u64, state), (STRIPE_BYTES, want), "descriptor {i}");
    }
    let next = c.block_status(0, covered, 1024).unwrap();
    let want = if (covered / STRIPE_BYTES).is_multiple_of(2) {
        STATE_HOLE | STATE_ZERO
    } else {
        0
    };
    assert_eq!(
        next[0],
        (STRIPE_BYTES as u32, want),
        "where the reply ended"
    );
    server.shutdown();
}
