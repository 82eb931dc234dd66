//! Reads and writes of an extent file with the file's name on every error.

use strata_storage::Storage;

use crate::error::Result;

pub fn rd(file: &dyn Storage, name: &str, buf: &mut [u8], off: u64) -> Result<()> {
    file.read_at(buf, off)
        .map_err(|e| crate::error::io(name, e))
}

pub fn wr(file: &dyn Storage, name: &str, buf: &[u8], off: u64) -> Result<()> {
    file.write_at(buf, off)
        .map_err(|e| crate::error::io(name, e))
}

/// `entries` little-endian entries of `width` bytes (4 or 8) at byte `off`.
pub fn read_table(
    file: &dyn Storage,
    name: &str,
    off: u64,
    entries: u64,
    width: u64,
) -> Result<Vec<u64>> {
    assert!(width == 4 || width == 8, "entry width {width}");
    let mut raw = vec![0u8; (entries * width) as usize];
    rd(file, name, &mut raw, off)?;
    Ok(raw
        .chunks_exact(width as usize)
        .map(|c| {
            if width == 4 {
                u32::from_le_bytes(c.try_into().expect("4")) as u64
            } else {
                u64::from_le_bytes(c.try_into().expect("8"))
            }
        })
        .collect())
}
