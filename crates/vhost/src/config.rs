//! The virtio-blk configuration space (virtio 1.2, §5.2.4) as strata fills
//! it in, and the feature bits it offers.

/// Bytes of `struct virtio_blk_config` up to and including the
/// write-zeroes fields (the secure-erase and zoned fields follow; their
/// features are not offered, so a driver does not read them).
pub const CONFIG_BYTES: usize = 60;

/// Feature bits (virtio 1.2 §5.2.3 and §6).
pub mod feature {
    pub const SIZE_MAX: u64 = 1 << 1;
    pub const SEG_MAX: u64 = 1 << 2;
    pub const RO: u64 = 1 << 5;
    pub const BLK_SIZE: u64 = 1 << 6;
    pub const FLUSH: u64 = 1 << 9;
    pub const TOPOLOGY: u64 = 1 << 10;
    pub const CONFIG_WCE: u64 = 1 << 11;
    pub const MQ: u64 = 1 << 12;
    pub const DISCARD: u64 = 1 << 13;
    pub const WRITE_ZEROES: u64 = 1 << 14;
    pub const RING_INDIRECT_DESC: u64 = 1 << 28;
    pub const RING_EVENT_IDX: u64 = 1 << 29;
    /// Not a virtio bit: vhost-user's "protocol features may be negotiated".
    pub const VHOST_USER_PROTOCOL_FEATURES: u64 = 1 << 30;
    pub const VERSION_1: u64 = 1 << 32;
}

/// Offsets of the fields strata serves.
pub mod offset {
    pub const CAPACITY: usize = 0;
    pub const SIZE_MAX: usize = 8;
    pub const SEG_MAX: usize = 12;
    pub const BLK_SIZE: usize = 20;
    pub const PHYSICAL_BLOCK_EXP: usize = 24;
    pub const MIN_IO_SIZE: usize = 26;
    pub const OPT_IO_SIZE: usize = 28;
    pub const WRITEBACK: usize = 32;
    pub const NUM_QUEUES: usize = 34;
    pub const MAX_DISCARD_SECTORS: usize = 36;
    pub const MAX_DISCARD_SEG: usize = 40;
    pub const DISCARD_SECTOR_ALIGNMENT: usize = 44;
    pub const MAX_WRITE_ZEROES_SECTORS: usize = 48;
    pub const MAX_WRITE_ZEROES_SEG: usize = 52;
    pub const WRITE_ZEROES_MAY_UNMAP: usize = 56;
}

/// What the configuration space says about one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlkConfig {
    pub capacity_sectors: u64,
    /// Largest single segment, bytes.
    pub size_max: u32,
    /// Most data segments in one request.
    pub seg_max: u32,
    /// Logical block size the driver should use (512).
    pub blk_size: u32,
    /// log2(physical block / logical block): 3 says 4 KiB grains.
    pub physical_block_exp: u8,
    /// Minimum and optimal I/O size, in logical blocks.
    pub min_io_blocks: u16,
    pub opt_io_blocks: u32,
    /// 1: write-back cache (the driver sends FLUSH); 0: write-through.
    pub writeback: bool,
    pub num_queues: u16,
    pub max_discard_sectors: u32,
    pub max_discard_seg: u32,
    pub discard_alignment_sectors: u32,
    pub max_write_zeroes_sectors: u32,
    pub max_write_zeroes_seg: u32,
    pub write_zeroes_may_unmap: bool,
}

impl BlkConfig {
    /// The little-endian bytes a driver reads.
    pub fn encode(&self) -> [u8; CONFIG_BYTES] {
        let mut b = [0u8; CONFIG_BYTES];
        let put32 = |b: &mut [u8; CONFIG_BYTES], at: usize, v: u32| {
            b[at..at + 4].copy_from_slice(&v.to_le_bytes())
        };
        b[offset::CAPACITY..offset::CAPACITY + 8]
            .copy_from_slice(&self.capacity_sectors.to_le_bytes());
        put32(&mut b, offset::SIZE_MAX, self.size_max);
        put32(&mut b, offset::SEG_MAX, self.seg_max);
        put32(&mut b, offset::BLK_SIZE, self.blk_size);
        b[offset::PHYSICAL_BLOCK_EXP] = self.physical_block_exp;
        b[offset::MIN_IO_SIZE..offset::MIN_IO_SIZE + 2]
            .copy_from_slice(&self.min_io_blocks.to_le_bytes());
        put32(&mut b, offset::OPT_IO_SIZE, self.opt_io_blocks);
        b[offset::WRITEBACK] = u8::from(self.writeback);
        b[offset::NUM_QUEUES..offset::NUM_QUEUES + 2]
            .copy_from_slice(&self.num_queues.to_le_bytes());
        put32(
            &mut b,
            offset::MAX_DISCARD_SECTORS,
            self.max_discard_sectors,
        );
        put32(&mut b, offset::MAX_DISCARD_SEG, self.max_discard_seg);
        put32(
            &mut b,
            offset::DISCARD_SECTOR_ALIGNMENT,
            self.discard_alignment_sectors,
        );
        put32(
            &mut b,
            offset::MAX_WRITE_ZEROES_SECTORS,
            self.max_write_zeroes_sectors,
        );
        put32(
            &mut b,
            offset::MAX_WRITE_ZEROES_SEG,
            self.max_write_zeroes_seg,
        );
        b[offset::WRITE_ZEROES_MAY_UNMAP] = u8::from(self.write_zeroes_may_unmap);
        b
    }

    /// The bytes `[offset, offset + size)` of the space; a window past its
    /// end reads as zeros (the driver may probe fields we do not offer).
    pub fn window(&self, offset: u32, size: u32) -> Vec<u8> {
        let all = self.encode();
        let mut out = vec![0u8; size as usize];
        let start = (offset as usize).min(CONFIG_BYTES);
        let end = (offset as usize)
            .saturating_add(size as usize)
            .min(CONFIG_BYTES);
        out[..end - start].copy_from_slice(&all[start..end]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_sit_at_the_offsets_of_the_virtio_spec() {
        let c = BlkConfig {
            capacity_sectors: 0x0102_0304_0506_0708,
            size_max: 1 << 20,
            seg_max: 126,
            blk_size: 512,
            physical_block_exp: 3,
            min_io_blocks: 8,
            opt_io_blocks: 2048,
            writeback: true,
            num_queues: 4,
            max_discard_sectors: 0x1000,
            max_discard_seg: 32,
            discard_alignment_sectors: 8,
            max_write_zeroes_sectors: 0x2000,
            max_write_zeroes_seg: 16,
            write_zeroes_may_unmap: true,
        };
        let b = c.encode();
        assert_eq!(&b[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[12..16], &126u32.to_le_bytes());
        assert_eq!(&b[20..24], &512u32.to_le_bytes());
        assert_eq!(b[24], 3);
        assert_eq!(b[32], 1);
        assert_eq!(&b[34..36], &4u16.to_le_bytes());
        assert_eq!(&b[40..44], &32u32.to_le_bytes());
        assert_eq!(b[56], 1);
        // A window crossing the end is zero-padded, never short.
        let w = c.window(56, 16);
        assert_eq!(w.len(), 16);
        assert_eq!(w[0], 1);
        assert!(w[4..].iter().all(|&x| x == 0));
        assert_eq!(c.window(200, 4), vec![0; 4]);
    }
}
