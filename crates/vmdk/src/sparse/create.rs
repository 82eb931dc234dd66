//! Empty extents of each format, laid out as qemu-img or ESXi lay them out
//! (docs/FORMAT.md §9.2). The export code (the crate's `create` module) builds on these.

use strata_storage::Storage;

use super::header::{
    CowdHeader, KdmvHeader, SeSparseHeader, SeSparseVolatile, FLAG_NL_DETECT, FLAG_RGD,
    FLAG_ZERO_GRAIN, SECTOR,
};
use super::io::wr;
use crate::error::Result;

/// qemu-img's hosted sparse grain and table size.
const KDMV_GRAIN_SECTORS: u64 = 128;
const KDMV_GT_ENTRIES: u64 = 512;
/// Sectors qemu-img reserves for the embedded descriptor at least.
const KDMV_MIN_DESCRIPTOR_SECTORS: u64 = 20;

/// Create an empty hosted sparse extent laid out as qemu-img does (grain
/// 128 sectors, 512 entries per table, descriptor at sector 1, redundant
/// directory, all tables preallocated). Returns the header written.
pub fn create_kdmv(
    file: &dyn Storage,
    name: &str,
    capacity_sectors: u64,
    zero_grain: bool,
    descriptor: &str,
) -> Result<KdmvHeader> {
    let grain = KDMV_GRAIN_SECTORS;
    let grains = capacity_sectors.div_ceil(grain);
    let gt_count = grains.div_ceil(KDMV_GT_ENTRIES);
    let gt_sectors = KDMV_GT_ENTRIES * 4 / SECTOR;
    let gd_sectors = (gt_count * 4).div_ceil(SECTOR);
    let desc_sectors = KDMV_MIN_DESCRIPTOR_SECTORS.max((descriptor.len() as u64).div_ceil(SECTOR));
    let rgd = 1 + desc_sectors;
    let gd = rgd + gd_sectors + gt_sectors * gt_count;
    let overhead = (gd + gd_sectors + gt_sectors * gt_count).div_ceil(grain) * grain;
    let h = KdmvHeader {
        version: if zero_grain { 2 } else { 1 },
        flags: FLAG_NL_DETECT | FLAG_RGD | if zero_grain { FLAG_ZERO_GRAIN } else { 0 },
        capacity: capacity_sectors,
        grain_size: grain,
        desc_offset: 1,
        desc_size: desc_sectors,
        gtes_per_gt: KDMV_GT_ENTRIES as u32,
        rgd_offset: rgd,
        gd_offset: gd,
        overhead,
        unclean: false,
        compress_algorithm: 0,
    };
    wr(file, name, &h.encode(), 0)?;
    let mut desc = descriptor.as_bytes().to_vec();
    desc.resize((desc_sectors * SECTOR) as usize, 0);
    wr(file, name, &desc, SECTOR)?;
    for dir in [rgd, gd] {
        let mut d = Vec::with_capacity((gd_sectors * SECTOR) as usize);
        for i in 0..gt_count {
            d.extend_from_slice(&((dir + gd_sectors + gt_sectors * i) as u32).to_le_bytes());
        }
        d.resize((gd_sectors * SECTOR) as usize, 0);
        wr(file, name, &d, dir * SECTOR)?;
    }
    file.set_len(overhead * SECTOR)
        .map_err(|e| crate::error::io(name, e))?;
    Ok(h)
}

/// Create an empty COWD extent with every grain table preallocated (QEMU
/// writes only into existing tables). Grain size 1 sector, as ESX uses.
pub fn create_cowd(file: &dyn Storage, name: &str, capacity_sectors: u64) -> Result<()> {
    let sectors = u32::try_from(capacity_sectors)
        .map_err(|_| crate::error::unsupported(name, "VMFSsparse extents hold at most 2 TiB"))?;
    let n_gd = (capacity_sectors.div_ceil(CowdHeader::GT_ENTRIES)).max(1);
    let gd_sectors = (n_gd * 4).div_ceil(SECTOR);
    let gd_offset = 4u64;
    let gt_start = gd_offset + gd_sectors;
    let gt_sectors = CowdHeader::GT_ENTRIES * 4 / SECTOR;
    let end = gt_start + n_gd * gt_sectors;
    let h = CowdHeader {
        version: 1,
        flags: 3,
        num_sectors: sectors,
        grain_size: 1,
        gd_offset: gd_offset as u32,
        num_gd_entries: n_gd as u32,
        free_sector: u32::try_from(end)
            .map_err(|_| crate::error::unsupported(name, "COWD metadata past 2 TiB"))?,
    };
    wr(file, name, &h.encode(), 0)?;
    let mut d = Vec::with_capacity((gd_sectors * SECTOR) as usize);
    for i in 0..n_gd {
        d.extend_from_slice(&((gt_start + i * gt_sectors) as u32).to_le_bytes());
    }
    d.resize((gd_sectors * SECTOR) as usize, 0);
    wr(file, name, &d, gd_offset * SECTOR)?;
    file.set_len(end * SECTOR)
        .map_err(|e| crate::error::io(name, e))?;
    Ok(())
}

/// Create an empty SEsparse extent in ESXi's layout (see FORMAT.md).
pub fn create_sesparse(
    file: &dyn Storage,
    name: &str,
    capacity_sectors: u64,
) -> Result<SeSparseHeader> {
    let h = SeSparseHeader::layout(capacity_sectors);
    wr(file, name, &h.encode(), 0)?;
    wr(
        file,
        name,
        &SeSparseVolatile::default().encode(),
        h.volatile.0 * SECTOR,
    )?;
    file.set_len(h.grains.0 * SECTOR)
        .map_err(|e| crate::error::io(name, e))?;
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kdmv_layout_matches_qemu_for_3_gib() {
        let s = strata_storage::SimBackend::new();
        use strata_storage::Backend;
        let f = s.open("x", true).unwrap();
        let h = create_kdmv(&*f, "x", 3 << 21, false, "").unwrap();
        assert_eq!(h.rgd_offset, 21);
        assert_eq!(h.gd_offset, 406);
        assert_eq!(h.overhead, 896);
        assert_eq!(f.len().unwrap(), 458_752);
    }
}
