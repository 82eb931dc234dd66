//! One virtio-blk descriptor chain taken apart and carried out by the real
//! code ([`request::parse`], [`request::execute`]) against real guest
//! memory (anonymous [`GuestMemoryMmap`] regions) and an in-memory disk,
//! for the fuzz target `vhost_chain` (fuzz/) and for the replay of its
//! corpus in the normal test suite (`tests/fuzz_corpus.rs`). Not part of
//! the backend's API.
//!
//! # Input
//!
//! Little-endian; bytes past the end of the input read as zero.
//!
//! | bytes | what |
//! |---|---|
//! | 0 | flags: [`F_READ_ONLY`], [`F_TWO_REGIONS`], [`F_WRITETHROUGH`], [`F_HIGH`], [`F_ADJACENT`] |
//! | 1 | pages (4 KiB) of region 0, minus one (`% 128`) |
//! | 2..4 | where region 0 starts, in pages (from 0, or down from the top of the address space with [`F_HIGH`]) |
//! | 4 | pages of region 1, minus one (`% 128`) |
//! | 5 | pages between the regions, minus one (none with [`F_ADJACENT`]) |
//! | 6, 7 | `max_discard_seg`, `max_write_zeroes_seg` |
//! | 8..12, 12..16 | `max_discard_sectors`, `max_write_zeroes_sectors` |
//! | 16 | descriptors in the chain (`% 33`) |
//! | 13 each | a descriptor: mode byte, `a` (u64), `l` (u32); see [`addr`] and [`len`] |
//! | the rest | guest memory: region 0 from its start, then region 1; the remainder is zeros |
//!
//! The mode byte is `write_only | addr << 1 | len << 4`: where the
//! descriptor points and how long it is are drawn from `a` and `l` in one
//! of eight ways each, so that buffers inside, across and outside the
//! regions, overlapping ones, empty and huge ones are all a byte away.
//! The disk is 1 MiB; byte `i` holds [`pattern`]`(i)`.
//!
//! # Checks
//!
//! No panic; the harness allocates nothing from a descriptor's length
//! unless the request succeeded (then the length is within the disk or
//! guest memory). When a chain has a writable byte inside guest memory,
//! the status goes in the last byte of its last non-empty descriptor,
//! which must be device-writable for the request to run; when `parse`
//! accepts a chain, `execute` writes that status byte, reports a used
//! length of at least 1 and at most the chain's device-writable bytes,
//! and the disk changes only through a successful write, discard or
//! write-zeroes (never on a read-only disk). A successful read leaves the
//! disk's bytes in the guest's buffers, a write puts the guest's bytes
//! (as they were before the request) on the disk and nothing else, a
//! discard / write-zeroes zeroes exactly its ranges, GET_ID reports
//! `min(20, buffer) + 1` bytes, an unknown type gets `UNSUPP`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use strata_block::{
    check_range, BlockDevice, BlockError, BlockResult, ErrorKind, Extent, ReadFill, ZeroOptions,
    SECTOR_BYTES,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

use crate::request::{self, kind, status, Desc, Limits, Malformed, ID_BYTES, RANGE_BYTES};

/// Flag: the disk is read-only.
pub const F_READ_ONLY: u8 = 1;
/// Flag: guest memory has a second region.
pub const F_TWO_REGIONS: u8 = 2;
/// Flag: the guest turned its write cache off (every write FUA).
pub const F_WRITETHROUGH: u8 = 4;
/// Flag: region 0 lies just below the top of the 64-bit address space
/// (and region 1 below it).
pub const F_HIGH: u8 = 8;
/// Flag: region 1 follows region 0 without a gap.
pub const F_ADJACENT: u8 = 16;

/// Bytes of the fixed head of an input.
pub const HEAD_BYTES: usize = 17;
/// Bytes of one encoded descriptor.
pub const DESC_BYTES: usize = 13;
/// Most descriptors in a chain.
pub const MAX_DESCS: usize = 32;
/// Bytes of the in-memory disk.
pub const DISK_BYTES: usize = 1 << 20;
const PAGE: u64 = 4096;
/// What GET_ID answers.
pub const ID: [u8; ID_BYTES] = *b"strata-fuzz-id-0123\0";

/// Where a descriptor points (`addr` bits of the mode byte), from `a`.
pub mod addr {
    /// Region 0's start + `a % size`.
    pub const REGION0: u8 = 0;
    /// Region 1's start + `a % size` (region 0's with one region).
    pub const REGION1: u8 = 1;
    /// `a` itself.
    pub const RAW: u8 = 2;
    /// The previous descriptor's address + `a % 8192` (overlaps it).
    pub const PREV: u8 = 3;
    /// The previous descriptor's end + `a % 4096`.
    pub const AFTER_PREV: u8 = 4;
    /// Region 0's last byte - `a % 4096` (buffers that run past it).
    pub const REGION0_END: u8 = 5;
    /// The end of guest memory + `a % 65536` (outside it).
    pub const PAST_MEMORY: u8 = 6;
    /// `u64::MAX - a % 65536` (addresses that wrap).
    pub const TOP: u8 = 7;
}

/// How long a descriptor is (`len` bits of the mode byte), from `l`.
pub mod len {
    /// `l` itself.
    pub const RAW: u8 = 0;
    /// `l % 4097`.
    pub const SMALL: u8 = 1;
    /// `(l % 2049) * 512`: whole sectors, up to 1 MiB.
    pub const SECTORS: u8 = 2;
    /// 0.
    pub const ZERO: u8 = 3;
    /// `u32::MAX - l % 4096`.
    pub const HUGE: u8 = 4;
    /// To the end of the region the address lies in (`l % 4097` outside).
    pub const TO_REGION_END: u8 = 5;
    /// 1.
    pub const ONE: u8 = 6;
    /// `l % 17`: around a header or a range.
    pub const TINY: u8 = 7;
}

/// Byte `i` of the disk before any request.
pub fn pattern(i: usize) -> u8 {
    let i = i as u32;
    (i.wrapping_mul(0x9e37_79b9) >> 24) as u8 ^ (i >> 9) as u8
}

/// The disk before any request: [`pattern`], made once.
fn initial_disk() -> &'static [u8] {
    static DISK: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    DISK.get_or_init(|| (0..DISK_BYTES).map(pattern).collect())
}

/// The in-memory disk; counts what changes it.
struct Mem {
    bytes: Mutex<Vec<u8>>,
    read_only: bool,
    mutations: AtomicUsize,
    flushes: AtomicUsize,
}

impl Mem {
    fn mutate(&self, offset: u64, len: u64, f: impl FnOnce(&mut [u8])) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(ErrorKind::ReadOnly, "read-only"));
        }
        let mut b = self.bytes.lock().unwrap();
        check_range(offset, len, b.len() as u64)?;
        self.mutations.fetch_add(1, Ordering::Relaxed);
        f(&mut b[offset as usize..(offset + len) as usize]);
        Ok(())
    }
}

impl BlockDevice for Mem {
    fn size_bytes(&self) -> u64 {
        DISK_BYTES as u64
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<ReadFill> {
        let b = self.bytes.lock().unwrap();
        check_range(offset, buf.len() as u64, b.len() as u64)?;
        buf.copy_from_slice(&b[offset as usize..offset as usize + buf.len()]);
        let mut f = ReadFill::default();
        f.push(buf.len() as u64, strata_block::Fill::Data);
        Ok(f)
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> BlockResult<()> {
        self.mutate(offset, buf.len() as u64, |d| d.copy_from_slice(buf))
    }
    fn flush(&self) -> BlockResult<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.mutate(offset, len, |d| d.fill(0))
    }
    fn write_zeroes(&self, offset: u64, len: u64, _: ZeroOptions) -> BlockResult<()> {
        self.mutate(offset, len, |d| d.fill(0))
    }
    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        check_range(offset, len, DISK_BYTES as u64)?;
        Ok(vec![Extent {
            len_bytes: len,
            hole: false,
            zero: false,
        }])
    }
}

/// Reads little-endian fields; zeros past the end.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let start = self.at.min(self.data.len());
        let end = (self.at + N).min(self.data.len());
        b[..end - start].copy_from_slice(&self.data[start..end]);
        self.at += N;
        b
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn rest(&self) -> &[u8] {
        &self.data[self.at.min(self.data.len())..]
    }
}

/// A region of guest memory and what the harness put in it.
struct Region {
    base: u64,
    bytes: Vec<u8>,
}

impl Region {
    fn end(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }
}

/// The guest memory as it was before the request: `len` bytes at `addr`,
/// or None if one lies outside it.
fn initial(regions: &[Region], addr: u64, len: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = addr;
    let end = addr.checked_add(len)?;
    while at < end {
        let r = regions.iter().find(|r| r.base <= at && at < r.end())?;
        let n = (end.min(r.end()) - at) as usize;
        let off = (at - r.base) as usize;
        out.extend_from_slice(&r.bytes[off..off + n]);
        at += n as u64;
    }
    Some(out)
}

/// How `parse` took the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parse {
    /// Accepted; the request's type.
    Request(u32),
    /// No writable byte in memory: returned used with length 0.
    NoStatus,
    /// Refused with `IOERR` in the status byte.
    Refused,
}

/// What one chain came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub parse: Parse,
    /// The status byte written into guest memory, if any.
    pub status: Option<u8>,
    /// The used length the backend would report.
    pub used: u32,
    /// Data bytes compared: read data against the disk, written data
    /// against the guest's, zeroed ranges.
    pub checked_bytes: u64,
}

/// Decode `input` (see the module documentation), run its chain and check
/// the result; panics when a check fails.
#[expect(clippy::too_many_lines)]
pub fn chain(input: &[u8]) -> Outcome {
    let mut r = Reader { data: input, at: 0 };
    let flags = r.u8();
    let size0 = (u64::from(r.u8() % 128) + 1) * PAGE;
    let page0 = u64::from(r.u16());
    let size1 = (u64::from(r.u8() % 128) + 1) * PAGE;
    let gap = if flags & F_ADJACENT != 0 {
        0
    } else {
        (u64::from(r.u8()) + 1) * PAGE
    };
    if flags & F_ADJACENT != 0 {
        r.u8();
    }
    let limits = Limits {
        max_discard_seg: u32::from(r.u8()),
        max_write_zeroes_seg: u32::from(r.u8()),
        max_discard_sectors: r.u32(),
        max_write_zeroes_sectors: r.u32(),
        // Below the 1 MiB of guest memory, so both sides are reached.
        max_data_bytes: 512 << 10,
    };
    let ndesc = usize::from(r.u8()) % (MAX_DESCS + 1);
    let raw: Vec<(u8, u64, u32)> = (0..ndesc).map(|_| (r.u8(), r.u64(), r.u32())).collect();

    // The layout: region 0 low or high, region 1 after it (below it when
    // high), both within the 64-bit space.
    let two = flags & F_TWO_REGIONS != 0;
    let mut layout = Vec::new();
    if flags & F_HIGH != 0 {
        let top = !(PAGE - 1);
        let base0 = top - size0 - page0 * PAGE;
        if two {
            layout.push((base0 - gap - size1, size1));
        }
        layout.insert(0, (base0, size0));
    } else {
        let base0 = page0 * PAGE;
        layout.push((base0, size0));
        if two {
            layout.push((base0 + size0 + gap, size1));
        }
    }
    // Fill region 0 first, then region 1.
    let mut content = r.rest();
    let mut regions: Vec<Region> = layout
        .iter()
        .map(|&(base, size)| {
            let mut bytes = vec![0u8; size as usize];
            let n = content.len().min(bytes.len());
            bytes[..n].copy_from_slice(&content[..n]);
            content = &content[n..];
            Region { base, bytes }
        })
        .collect();
    regions.sort_by_key(|r| r.base);
    let ranges: Vec<(GuestAddress, usize)> = regions
        .iter()
        .map(|r| (GuestAddress(r.base), r.bytes.len()))
        .collect();
    let mem: GuestMemoryMmap = GuestMemoryMmap::from_ranges(&ranges).expect("guest memory");
    for reg in &regions {
        mem.write_slice(&reg.bytes, GuestAddress(reg.base))
            .expect("fill guest memory");
    }
    let r0 = (layout[0].0, layout[0].1);
    let r1 = *layout.last().unwrap();
    let mem_end = regions.last().unwrap().end();

    // The chain.
    let mut descs: Vec<Desc> = Vec::with_capacity(ndesc);
    for &(mode, a, l) in &raw {
        let prev = descs.last().map_or((r0.0, 0u32), |d| (d.addr.0, d.len));
        let address = match (mode >> 1) & 7 {
            addr::REGION0 => r0.0 + a % r0.1,
            addr::REGION1 => r1.0 + a % r1.1,
            addr::RAW => a,
            addr::PREV => prev.0.wrapping_add(a % 8192),
            addr::AFTER_PREV => prev
                .0
                .wrapping_add(u64::from(prev.1))
                .wrapping_add(a % 4096),
            addr::REGION0_END => (r0.0 + r0.1 - 1).saturating_sub(a % 4096),
            addr::PAST_MEMORY => mem_end.wrapping_add(a % 65536),
            _ => u64::MAX - a % 65536,
        };
        let length = match (mode >> 4) & 7 {
            len::RAW => l,
            len::SMALL => l % 4097,
            len::SECTORS => (l % 2049) * 512,
            len::ZERO => 0,
            len::HUGE => u32::MAX - l % 4096,
            len::TO_REGION_END => regions
                .iter()
                .find(|r| r.base <= address && address < r.end())
                .map_or(l % 4097, |r| (r.end() - address) as u32),
            len::ONE => 1,
            _ => l % 17,
        };
        descs.push(Desc {
            addr: GuestAddress(address),
            len: length,
            write_only: mode & 1 != 0,
        });
    }

    let dev = Mem {
        bytes: Mutex::new(initial_disk().to_vec()),
        read_only: flags & F_READ_ONLY != 0,
        mutations: AtomicUsize::new(0),
        flushes: AtomicUsize::new(0),
    };
    let writethrough = AtomicBool::new(flags & F_WRITETHROUGH != 0);
    Case {
        mem,
        regions,
        descs,
        dev,
        limits,
        writethrough,
    }
    .run()
}

fn status_byte(mem: &GuestMemoryMmap, at: GuestAddress) -> u8 {
    mem.read_obj::<u8>(at).expect("status byte in memory")
}

/// One case built from the fuzzer's input: the guest's memory and the
/// regions it was filled from, the descriptor chain, and the device with
/// its limits and write cache mode.
struct Case {
    mem: GuestMemoryMmap,
    regions: Vec<Region>,
    descs: Vec<Desc>,
    dev: Mem,
    limits: Limits,
    writethrough: AtomicBool,
}

impl Case {
    /// Parse and carry out the chain, and check what it did.
    #[expect(clippy::too_many_lines)]
    fn run(&self) -> Outcome {
        let Case {
            mem,
            regions,
            descs,
            dev,
            limits,
            writethrough,
        } = self;
        // Where the status must go, worked out here independently: the last
        // byte of the last non-empty device-writable descriptor, if it is in
        // guest memory.
        let expect_status = descs
            .iter()
            .rposition(|d| d.write_only && d.len > 0)
            .and_then(|i| descs[i].addr.0.checked_add(u64::from(descs[i].len) - 1))
            .map(GuestAddress)
            .filter(|&a| GuestMemoryBackend::check_range(mem, a, 1));
        let first_write = descs.iter().position(|d| d.write_only);
        let readable_after_writable =
            first_write.is_some_and(|i| descs[i..].iter().any(|d| !d.write_only));
        let writable: u64 = descs
            .iter()
            .filter(|d| d.write_only)
            .map(|d| u64::from(d.len))
            .sum();

        let req = match request::parse(mem, descs) {
            Ok(req) => req,
            Err(Malformed::NoStatus) => {
                assert_eq!(
                    expect_status, None,
                    "NoStatus for a chain with a writable last byte in memory"
                );
                assert_eq!(dev.mutations.load(Ordering::Relaxed), 0);
                return Outcome {
                    parse: Parse::NoStatus,
                    status: None,
                    used: 0,
                    checked_bytes: 0,
                };
            }
            Err(Malformed::Bad(at, _why)) => {
                assert_eq!(
                    Some(at),
                    expect_status,
                    "refused chain's status byte is not its last writable byte"
                );
                // As the backend does: IOERR there, used length 1.
                mem.write_slice(&[status::IOERR], at)
                    .expect("status byte of a refused chain in memory");
                assert_eq!(dev.mutations.load(Ordering::Relaxed), 0);
                return Outcome {
                    parse: Parse::Refused,
                    status: Some(status::IOERR),
                    used: 1,
                    checked_bytes: 0,
                };
            }
        };
        assert_eq!(
            Some(req.status_at),
            expect_status,
            "status byte is not the last byte of the last device-writable descriptor"
        );
        assert!(
            !readable_after_writable,
            "a chain with a device-readable descriptor after a writable one was accepted"
        );
        let inp_total: u64 = req.inp.iter().map(|&(_, l)| u64::from(l)).sum();
        let out_total: u64 = req.out.iter().map(|&(_, l)| u64::from(l)).sum();
        assert_eq!(
            inp_total + 1,
            writable,
            "data + status bytes are not the chain's writable bytes"
        );

        let t = request::Target {
            dev,
            limits,
            writethrough,
            id: &ID,
        };
        let done = request::execute(mem, t, &req);
        let st = done.status;
        assert!(
            matches!(st, status::OK | status::IOERR | status::UNSUPP),
            "status {st}"
        );
        assert_eq!(
            status_byte(mem, req.status_at),
            st,
            "status byte not written"
        );
        assert!(
            done.written >= 1 && u64::from(done.written) <= writable,
            "used length {} with {writable} writable bytes",
            done.written
        );
        let mutations = dev.mutations.load(Ordering::Relaxed);
        let may_change = st == status::OK
            && !dev.read_only
            && matches!(req.kind, kind::OUT | kind::DISCARD | kind::WRITE_ZEROES);
        assert!(
            mutations == 0 || may_change,
            "disk changed by type {} with status {st} (read-only: {})",
            req.kind,
            dev.read_only
        );
        if st != status::OK {
            assert_eq!(done.written, 1, "data reported for a failed request");
        }

        let mut checked = 0u64;
        let disk = dev.bytes.lock().unwrap();
        let sector_off = req.sector.checked_mul(SECTOR_BYTES);
        match req.kind {
            kind::IN if st == status::OK => {
                assert_eq!(u64::from(done.written), inp_total + 1);
                let off = sector_off.expect("read at an overflowing sector succeeded");
                assert!(
                    inp_total.is_multiple_of(SECTOR_BYTES) && off + inp_total <= DISK_BYTES as u64
                );
                let mut at = off as usize;
                for &(a, l) in &req.inp {
                    // Inside memory and not overlapping: the read succeeded.
                    let mut got = vec![0u8; l as usize];
                    mem.read_slice(&mut got, a).expect("read buffer in memory");
                    for (i, &g) in got.iter().enumerate() {
                        if a.0 + i as u64 != req.status_at.0 {
                            assert_eq!(g, disk[at + i], "read byte {} wrong", at + i);
                        }
                    }
                    at += l as usize;
                    checked += u64::from(l);
                }
            }
            kind::OUT if st == status::OK => {
                let off = sector_off.expect("write at an overflowing sector succeeded") as usize;
                assert!(
                    out_total.is_multiple_of(SECTOR_BYTES)
                        && off as u64 + out_total <= DISK_BYTES as u64
                );
                assert_eq!(done.written, 1);
                let mut expect = initial_disk().to_vec();
                if !dev.read_only {
                    let mut at = off;
                    for &(a, l) in &req.out {
                        let data =
                            initial(regions, a.0, u64::from(l)).expect("write data in memory");
                        expect[at..at + data.len()].copy_from_slice(&data);
                        at += data.len();
                    }
                } else {
                    assert_eq!(out_total, 0, "write to a read-only disk succeeded");
                }
                assert!(*disk == expect, "disk after a write");
                checked += out_total;
            }
            kind::DISCARD | kind::WRITE_ZEROES if st == status::OK => {
                assert!(!dev.read_only, "discard on a read-only disk succeeded");
                assert_eq!(done.written, 1);
                let mut raw = Vec::new();
                for &(a, l) in &req.out {
                    raw.extend(initial(regions, a.0, u64::from(l)).expect("ranges in memory"));
                }
                assert!(!raw.is_empty() && raw.len().is_multiple_of(RANGE_BYTES));
                let mut expect = initial_disk().to_vec();
                for rg in raw.chunks_exact(RANGE_BYTES) {
                    let sector = u64::from_le_bytes(rg[0..8].try_into().unwrap());
                    let n = u64::from(u32::from_le_bytes(rg[8..12].try_into().unwrap()));
                    let start = (sector * SECTOR_BYTES) as usize;
                    let end = ((sector + n) * SECTOR_BYTES) as usize;
                    expect[start..end].fill(0);
                    checked += (end - start) as u64;
                }
                assert!(*disk == expect, "disk after a discard / write-zeroes");
            }
            kind::FLUSH => {
                assert_eq!(done.written, 1);
                if st == status::OK {
                    assert_eq!(dev.flushes.load(Ordering::Relaxed), 1);
                }
            }
            kind::GET_ID if st == status::OK => {
                assert_eq!(
                    u64::from(done.written),
                    inp_total.min(ID_BYTES as u64) + 1,
                    "GET_ID used length"
                );
            }
            kind::IN | kind::OUT | kind::DISCARD | kind::WRITE_ZEROES | kind::GET_ID => {}
            other => assert_eq!(st, status::UNSUPP, "unknown type {other}"),
        }
        Outcome {
            parse: Parse::Request(req.kind),
            status: Some(st),
            used: done.written,
            checked_bytes: checked,
        }
    }
}

/// A descriptor as encoded in an input: mode byte, `a`, `l`.
#[derive(Debug, Clone, Copy)]
pub struct EncDesc {
    pub write_only: bool,
    pub addr_mode: u8,
    pub a: u64,
    pub len_mode: u8,
    pub l: u32,
}

impl EncDesc {
    /// `len` bytes at `offset` in region 0.
    pub fn at(offset: u64, len: u32, write_only: bool) -> Self {
        Self {
            write_only,
            addr_mode: addr::REGION0,
            a: offset,
            len_mode: len::RAW,
            l: len,
        }
    }
}

/// The head of an input.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    pub flags: u8,
    pub region0_pages: u8,
    pub region0_page: u16,
    pub region1_pages: u8,
    pub gap_pages: u8,
    pub limits: Limits,
}

impl Default for Head {
    /// One region of 64 KiB at 1 MiB; the backend's limits.
    fn default() -> Self {
        Self {
            flags: 0,
            region0_pages: 16,
            region0_page: 256,
            region1_pages: 16,
            gap_pages: 16,
            limits: Limits {
                max_discard_sectors: 1 << 21,
                max_discard_seg: 64,
                max_write_zeroes_sectors: 1 << 21,
                max_write_zeroes_seg: 64,
                max_data_bytes: 512 << 10,
            },
        }
    }
}

/// An input for [`chain`] (seeds of the corpus).
pub fn encode(head: &Head, descs: &[EncDesc], memory: &[u8]) -> Vec<u8> {
    assert!(descs.len() <= MAX_DESCS);
    let mut v = vec![head.flags, head.region0_pages.wrapping_sub(1) % 128];
    v.extend(head.region0_page.to_le_bytes());
    v.push(head.region1_pages.wrapping_sub(1) % 128);
    v.push(head.gap_pages.wrapping_sub(1));
    v.push(head.limits.max_discard_seg as u8);
    v.push(head.limits.max_write_zeroes_seg as u8);
    v.extend(head.limits.max_discard_sectors.to_le_bytes());
    v.extend(head.limits.max_write_zeroes_sectors.to_le_bytes());
    v.push(descs.len() as u8);
    for d in descs {
        v.push(u8::from(d.write_only) | (d.addr_mode & 7) << 1 | (d.len_mode & 7) << 4);
        v.extend(d.a.to_le_bytes());
        v.extend(d.l.to_le_bytes());
    }
    v.extend_from_slice(memory);
    v
}
