//! Grain-directory and grain-table entries: what a raw value means in each
//! format ([`Gte`]), and back. Pure functions of the extent's [`Header`].

use thiserror::Error;

use super::header::{Header, SeSparseHeader, SECTOR};

/// Grain data never lies past this byte offset (an SEsparse entry can name
/// grain index 2^60, byte 2^72); keeps offset arithmetic clear of overflow.
pub const MAX_DATA_OFFSET: u64 = 1 << 60;

/// A decoded grain-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gte {
    /// Not allocated here: read the parent, or zeros.
    Unalloc,
    /// Reads as zeros, does not fall through.
    Zero,
    /// SCSI-unmapped (SEsparse 0x1): reads as zeros, does not fall through.
    Unmapped,
    /// Grain data at this byte offset of the file.
    Data(u64),
    /// A streamOptimized grain marker at this byte offset.
    Compressed(u64),
}

impl Gte {
    pub fn reads_zero(self) -> bool {
        matches!(self, Gte::Zero | Gte::Unmapped)
    }
}

/// An entry no reader may follow; the message names the entry.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EntryError {
    #[error("grain directory entry {l1} is 0x{raw:016x}, not a table reference")]
    NotATable { l1: u64, raw: u64 },
    #[error("grain directory entry {l1} names table {index}, past the {room} tables the file has room for")]
    TablePastRoom { l1: u64, index: u64, room: u64 },
    #[error("grain table entry 0x{0:016x}: type 0 with non-zero bits")]
    Type0NonZero(u64),
    #[error("grain table entry 0x{raw:016x} names grain index {index}, past any possible file")]
    GrainPastAnyFile { raw: u64, index: u64 },
    #[error("grain table entry 0x{raw:016x} has unknown type 0x{kind:x}")]
    UnknownType { raw: u64, kind: u64 },
}

/// SEsparse allocated-entry encoding: the grain index is stored rotated.
pub fn se_encode_index(index: u64) -> u64 {
    (0x3u64 << 60) | ((index & 0xfff) << 48) | (index >> 12)
}

pub fn se_decode_index(e: u64) -> u64 {
    ((e & 0x0fff_0000_0000_0000) >> 48) | ((e & 0x0000_ffff_ffff_ffff) << 12)
}

/// SEsparse GD entry naming table `index`.
pub fn se_table_ref(index: u64) -> u64 {
    (1u64 << 60) | index
}

/// Byte offset of the grain table GD entry `l1` (value `raw`) names, if any.
pub fn gt_offset(header: &Header, raw: u64, l1: u64) -> Result<Option<u64>, EntryError> {
    if raw == 0 {
        return Ok(None);
    }
    match header {
        Header::SeSparse(se) => {
            if raw >> 60 != 1 || raw & 0x0fff_ffff_0000_0000 != 0 {
                return Err(EntryError::NotATable { l1, raw });
            }
            let index = raw & 0xffff_ffff;
            let room = se.grain_tables.1 / SeSparseHeader::GT_SECTORS;
            if index + 1 > room {
                return Err(EntryError::TablePastRoom { l1, index, room });
            }
            Ok(Some(
                (se.grain_tables.0 + index * SeSparseHeader::GT_SECTORS) * SECTOR,
            ))
        }
        Header::Kdmv(_) | Header::Cowd(_) => Ok(Some(raw * SECTOR)),
    }
}

/// What the raw grain-table entry `raw` means.
pub fn decode(header: &Header, raw: u64) -> Result<Gte, EntryError> {
    Ok(match header {
        Header::Kdmv(_) => match raw {
            0 => Gte::Unalloc,
            1 if header.has_zero_entries() => Gte::Zero,
            s if header.compressed() => Gte::Compressed(s * SECTOR),
            s => Gte::Data(s * SECTOR),
        },
        Header::Cowd(_) => match raw {
            0 => Gte::Unalloc,
            s => Gte::Data(s * SECTOR),
        },
        Header::SeSparse(se) => match raw >> 60 {
            0 if raw == 0 => Gte::Unalloc,
            0 => return Err(EntryError::Type0NonZero(raw)),
            1 => Gte::Unmapped,
            2 => Gte::Zero,
            3 => {
                let index = se_decode_index(raw);
                // Indexes go up to 2^60; keep offsets far from overflowing.
                let off = index
                    .checked_mul(SeSparseHeader::GRAIN_SECTORS)
                    .and_then(|s| s.checked_add(se.grains.0))
                    .and_then(|s| s.checked_mul(SECTOR))
                    .filter(|&o| o <= MAX_DATA_OFFSET)
                    .ok_or(EntryError::GrainPastAnyFile { raw, index })?;
                Gte::Data(off)
            }
            kind => return Err(EntryError::UnknownType { raw, kind }),
        },
    })
}

/// The raw grain-table entry for `g` (the inverse of [`decode`]).
pub fn encode(header: &Header, g: Gte) -> u64 {
    match header {
        Header::Kdmv(_) => match g {
            Gte::Unalloc => 0,
            Gte::Zero | Gte::Unmapped => 1,
            Gte::Data(o) | Gte::Compressed(o) => o / SECTOR,
        },
        Header::Cowd(_) => match g {
            Gte::Data(o) | Gte::Compressed(o) => o / SECTOR,
            _ => 0,
        },
        Header::SeSparse(se) => match g {
            Gte::Unalloc => 0,
            Gte::Unmapped => 1 << 60,
            Gte::Zero => 2 << 60,
            Gte::Data(o) | Gte::Compressed(o) => {
                let sector = o / SECTOR;
                assert!(
                    sector >= se.grains.0,
                    "grain at sector {sector} lies before the grains region"
                );
                se_encode_index((sector - se.grains.0) / SeSparseHeader::GRAIN_SECTORS)
            }
        },
    }
}

/// One entry as the `width` bytes (4 or 8) stored in a table.
pub fn entry_bytes(raw: u64, width: u64) -> Vec<u8> {
    if width == 4 {
        assert!(
            raw <= u32::MAX as u64,
            "entry 0x{raw:x} does not fit 4 bytes"
        );
        (raw as u32).to_le_bytes().to_vec()
    } else {
        raw.to_le_bytes().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sesparse_index_rotation_matches_the_reference() {
        assert_eq!(se_encode_index(4097), 0x3001_0000_0000_0001);
        for i in [0u64, 1, 4095, 4096, 4097, 123_456_789, (1 << 52) - 1] {
            assert_eq!(se_decode_index(se_encode_index(i)), i);
        }
    }
}
