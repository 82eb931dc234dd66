//! Reads through packed entries (docs/FORMAT.md §18.4): the fragment
//! holding a virtual grain is decompressed and the part asked for
//! copied. A request's runs are one grain each; the last fragment
//! decompressed is kept for the next grain of the same request, so a
//! sequential read decompresses each fragment (a pair holds two grains)
//! once.

use strata_format::{GRAIN_BYTES, GRAIN_SHIFT};

use super::DiskHandle;
use crate::compress::Unpacked;
use crate::error::{Error, ErrorKind, Result};

impl DiskHandle {
    /// Fill `dst` with virtual grain `v`'s bytes from byte `within` of it
    /// on, through packed stream grain `grain`. `memo` keeps the fragment
    /// last decompressed for the request.
    pub(super) fn read_packed(
        &self,
        dst: &mut [u8],
        (grain, v, within): (u64, u64, usize),
        encrypted: bool,
        memo: &mut Option<Unpacked>,
    ) -> Result<()> {
        if encrypted {
            // The pass leaves encrypted disks raw (§18.8): such an entry
            // is damage, never a reason to return other bytes.
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "'{}' at byte {}: a packed entry on an encrypted disk (a damaged map entry)",
                    self.name,
                    (v << GRAIN_SHIFT) + within as u64
                ),
            ));
        }
        if memo.as_ref().and_then(|u| u.bytes(grain, v)).is_none() {
            *memo = Some(self.inner.unpack(grain, v)?);
        }
        let bytes = memo
            .as_ref()
            .and_then(|u| u.bytes(grain, v))
            .expect("just unpacked");
        debug_assert!(within + dst.len() <= GRAIN_BYTES as usize);
        dst.copy_from_slice(&bytes[within..within + dst.len()]);
        Ok(())
    }
}
