//! Where an extent's tables are and how big its grains are, in named units,
//! derived once from its [`Header`] and checked against the file's length.

use thiserror::Error;

use super::header::{
    CowdHeader, Header, SeSparseHeader, FLAG_COMPRESS, FLAG_RGD, MAX_GD_ENTRIES, SECTOR,
};

/// The shape of a grain-table extent. Built by [`Geometry::of`]; a value
/// that passed [`Geometry::check_fits`] addresses only bytes inside the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Extent size, from its own header.
    pub capacity_sectors: u64,
    pub grain_sectors: u64,
    /// Entries per grain table.
    pub gt_entries: u64,
    /// Width of one GD or GT entry: 4 (KDMV, COWD) or 8 (SEsparse).
    pub entry_bytes: u64,
    pub gd_offset_bytes: u64,
    pub gd_entries: u64,
    /// The redundant grain directory (KDMV with the RGD flag, not streams).
    pub rgd_offset_bytes: Option<u64>,
}

/// Why a geometry cannot be used with its file.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GeometryError {
    #[error("grain directory offset overflows")]
    GdOffsetOverflow,
    #[error("redundant grain directory offset overflows")]
    RgdOffsetOverflow,
    #[error("grain directory of {0} entries is larger than {MAX_GD_ENTRIES}")]
    GdTooLarge(u64),
    #[error("grain directory has {entries} entries, the capacity needs {need}")]
    GdTooSmall { entries: u64, need: u64 },
    #[error("grain directory at byte {offset_bytes} ({entries} entries) reaches past the end of the {len_bytes}-byte file")]
    GdPastEnd {
        offset_bytes: u64,
        entries: u64,
        len_bytes: u64,
    },
    #[error("redundant grain directory at byte {0} reaches past the end of the file")]
    RgdPastEnd(u64),
}

impl Geometry {
    /// The geometry `header` describes (for a stream, pass the footer's header).
    pub fn of(header: &Header) -> Result<Geometry, GeometryError> {
        Ok(match header {
            Header::Kdmv(h) => {
                let gt_entries = h.gtes_per_gt as u64;
                let compressed = h.flags & FLAG_COMPRESS != 0;
                let has_rgd = h.flags & FLAG_RGD != 0 && h.rgd_offset != 0 && !compressed;
                let rgd_offset_bytes = if has_rgd {
                    Some(
                        h.rgd_offset
                            .checked_mul(SECTOR)
                            .ok_or(GeometryError::RgdOffsetOverflow)?,
                    )
                } else {
                    None
                };
                Geometry {
                    capacity_sectors: h.capacity,
                    grain_sectors: h.grain_size,
                    gt_entries,
                    entry_bytes: 4,
                    gd_offset_bytes: h
                        .gd_offset
                        .checked_mul(SECTOR)
                        .ok_or(GeometryError::GdOffsetOverflow)?,
                    gd_entries: h.capacity.div_ceil(h.grain_size * gt_entries),
                    rgd_offset_bytes,
                }
            }
            Header::Cowd(h) => Geometry {
                capacity_sectors: h.num_sectors as u64,
                grain_sectors: h.grain_size as u64,
                gt_entries: CowdHeader::GT_ENTRIES,
                entry_bytes: 4,
                gd_offset_bytes: h.gd_offset as u64 * SECTOR,
                gd_entries: h.num_gd_entries as u64,
                rgd_offset_bytes: None,
            },
            Header::SeSparse(h) => Geometry {
                capacity_sectors: h.capacity,
                grain_sectors: SeSparseHeader::GRAIN_SECTORS,
                gt_entries: SeSparseHeader::GT_ENTRIES,
                entry_bytes: 8,
                gd_offset_bytes: h.grain_dir.0 * SECTOR,
                gd_entries: h.grain_dir.1 * SECTOR / 8,
                rgd_offset_bytes: None,
            },
        })
    }

    pub fn grain_bytes(&self) -> u64 {
        self.grain_sectors * SECTOR
    }

    /// Number of grains the extent addresses.
    pub fn grains(&self) -> u64 {
        self.capacity_sectors.div_ceil(self.grain_sectors)
    }

    pub fn gt_bytes(&self) -> u64 {
        self.gt_entries * self.entry_bytes
    }

    fn gd_bytes(&self) -> u64 {
        self.gd_entries * self.entry_bytes
    }

    /// Refuse directories that are too large, too small for the capacity,
    /// or reach past the end of a file of `len_bytes`.
    pub fn check_fits(&self, len_bytes: u64) -> Result<(), GeometryError> {
        let need = self
            .capacity_sectors
            .div_ceil(self.grain_sectors * self.gt_entries);
        if need > MAX_GD_ENTRIES || self.gd_entries > MAX_GD_ENTRIES {
            return Err(GeometryError::GdTooLarge(need.max(self.gd_entries)));
        }
        if self.gd_entries < need {
            return Err(GeometryError::GdTooSmall {
                entries: self.gd_entries,
                need,
            });
        }
        let gd_end = self.gd_offset_bytes.checked_add(self.gd_bytes());
        if gd_end.is_none_or(|e| e > len_bytes) {
            return Err(GeometryError::GdPastEnd {
                offset_bytes: self.gd_offset_bytes,
                entries: self.gd_entries,
                len_bytes,
            });
        }
        if let Some(o) = self.rgd_offset_bytes {
            if o.checked_add(self.gd_bytes()).is_none_or(|e| e > len_bytes) {
                return Err(GeometryError::RgdPastEnd(o));
            }
        }
        Ok(())
    }
}
