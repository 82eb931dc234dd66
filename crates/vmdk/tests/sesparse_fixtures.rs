//! Synthetic SEsparse fixtures, built byte by byte to the layout in
//! ../shared/reference/vmdk-formats.md §4 (not with `create_sesparse`), so
//! the reader is checked against the reference rather than against strata's
//! own writer.
//!
//! The fixture is a 48 MiB seSparse delta (three grain tables' worth) on a
//! monolithicFlat parent whose every sector is distinctive, so a grain that
//! falls through to the parent, one that reads as zeros and one that reads a
//! grain of the delta all look different. It holds every grain-table entry
//! type: 0x0 (unallocated), 0x1 (unmapped, with and without stale low bits
//! naming a grain that still holds data), 0x2 (zero) and 0x3 (allocated,
//! including grain indexes past 4096, where the rotated encoding matters).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::collections::BTreeMap;
use std::sync::Arc;

use strata_block::BlockDevice;
use strata_storage::{Backend, SimBackend};
use strata_vmdk::{OpenOptions, RangeState, VmdkImage};

const SECTOR: u64 = 512;
/// Disk size in sectors: three grain tables of 4096 grains of 8 sectors.
const CAP: u64 = 3 * 32768;
const GRAIN: u64 = 4096;
const GRAINS_PER_GT: u64 = 4096;
// The layout ESXi uses for small disks (reference §4, example of 204800 sectors).
const VOLATILE: (u64, u64) = (1, 1);
const JOURNAL_HEADER: (u64, u64) = (2, 2);
const JOURNAL: (u64, u64) = (2048, 2048);
const GD: (u64, u64) = (4096, 2048);
const GT: (u64, u64) = (6144, 2048);
const FREE_BITMAP: (u64, u64) = (8192, 2048);
const BACKMAP: (u64, u64) = (10240, 2048);
const GRAINS: (u64, u64) = (12288, CAP);

const CHILD: &str = "child.vmdk";
const CHILD_EXTENT: &str = "child-sesparse.vmdk";
const ORPHAN: &str = "orphan.vmdk";
const PARENT: &str = "parent.vmdk";
const PARENT_FLAT: &str = "parent-flat.vmdk";
const PARENT_CID: u32 = 0x1122_3344;

/// What the fixture puts in one grain-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    /// 0x0: falls through to the parent.
    Unalloc,
    /// 0x1, with whatever low bits.
    Unmapped(u64),
    /// 0x2.
    Zero(u64),
    /// 0x3: the raw entry (spelled out, not computed) and the grain index it names.
    Alloc(u64, u64),
}

impl Entry {
    fn raw(self) -> u64 {
        match self {
            Entry::Unalloc => 0,
            Entry::Unmapped(r) | Entry::Zero(r) | Entry::Alloc(r, _) => r,
        }
    }
}

/// The entries of the fixture by virtual grain; every other grain is 0x0.
/// Raw values are literal so the test does not share the encoder with the
/// code under test.
fn mapping() -> Vec<(u64, Entry)> {
    let t2 = 2 * GRAINS_PER_GT;
    vec![
        // Grain table of GD entry 0 (stored as table 1).
        (0, Entry::Alloc(0x3000_0000_0000_0000, 0)),
        (1, Entry::Alloc(0x3001_0000_0000_0001, 4097)), // the reference's example
        (2, Entry::Zero(0x2000_0000_0000_0000)),
        // Unmapped, low bits still naming grain index 4098 (which holds data).
        (3, Entry::Unmapped(0x1002_0000_0000_0001)),
        (4, Entry::Unalloc),
        // Two grains next to each other in the file and on the disk.
        (10, Entry::Alloc(0x3003_0000_0000_0000, 3)),
        (11, Entry::Alloc(0x3004_0000_0000_0000, 4)),
        (12, Entry::Alloc(0x3000_0000_0000_0001, 4096)),
        // Next to each other on the disk, in reverse order in the file.
        (13, Entry::Alloc(0x3002_0000_0000_0000, 2)),
        (14, Entry::Alloc(0x3001_0000_0000_0000, 1)),
        (20, Entry::Unmapped(0x1000_0000_0000_0000)),
        (GRAINS_PER_GT - 1, Entry::Alloc(0x3007_0000_0000_0000, 7)),
        // GD entry 1 is empty: the whole second 16 MiB falls through.
        // Grain table of GD entry 2 (stored as table 0).
        (t2, Entry::Alloc(0x3005_0000_0000_0000, 5)),
        (t2 + 1, Entry::Unalloc),
        (t2 + 100, Entry::Unmapped(0x1000_0000_0000_0000)),
        (t2 + 4094, Entry::Alloc(0x3006_0000_0000_0000, 6)),
        (t2 + 4095, Entry::Zero(0x2000_0000_0000_0000)),
    ]
}

/// The grain-table index each GD entry names (None: no table).
const GD_TABLES: [Option<u64>; 3] = [Some(1), None, Some(0)];

/// Data of grain index `idx` in the grains area: non-zero and different
/// for every grain and every sector.
fn grain_data(idx: u64) -> Vec<u8> {
    (0..GRAIN)
        .map(|i| {
            let s = i / SECTOR;
            (((idx * 37 + s * 11 + i) % 251) as u8) | 0x01
        })
        .collect()
}

/// The parent's byte at virtual byte `v`: never zero, never a grain's pattern
/// byte (those are at most 251).
fn parent_byte(v: u64) -> u8 {
    0xfc | ((v / SECTOR) as u8 & 0x02) | (v as u8 & 0x01)
}

fn put(b: &SimBackend, name: &str, data: &[u8], off: u64) {
    let f = b.open(name, true).unwrap();
    f.write_at(data, off).unwrap();
    f.sync().unwrap();
}

fn u64_at(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// The constant header of reference §4.
fn const_header() -> [u8; 512] {
    let mut b = [0u8; 512];
    u64_at(&mut b, 0, 0x0000_0000_cafe_babe);
    u64_at(&mut b, 8, 0x0000_0002_0000_0001);
    u64_at(&mut b, 16, CAP);
    u64_at(&mut b, 24, 8);
    u64_at(&mut b, 32, 64);
    u64_at(&mut b, 40, 0);
    for (i, (o, s)) in [
        VOLATILE,
        JOURNAL_HEADER,
        JOURNAL,
        GD,
        GT,
        FREE_BITMAP,
        BACKMAP,
        GRAINS,
    ]
    .into_iter()
    .enumerate()
    {
        u64_at(&mut b, 80 + 16 * i, o);
        u64_at(&mut b, 88 + 16 * i, s);
    }
    b
}

fn volatile_header() -> [u8; 512] {
    let mut b = [0u8; 512];
    u64_at(&mut b, 0, 0x0000_0000_cafe_cafe);
    u64_at(&mut b, 8, 2); // free_gt_number: tables 0 and 1 are in use
    u64_at(&mut b, 16, 1); // next_txn_seq_number
    u64_at(&mut b, 24, 0); // replay_journal
    b
}

/// The bytes of the fixture's SEsparse extent file, with the chance to
/// change them before they are written.
struct Fixture {
    header: [u8; 512],
    volatile: [u8; 512],
    gd: Vec<u64>,
    tables: BTreeMap<u64, Vec<u64>>,
    entries: Vec<(u64, Entry)>,
}

impl Fixture {
    fn new() -> Self {
        let entries = mapping();
        let mut tables: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut gd = vec![0u64; 3];
        for (l1, t) in GD_TABLES.iter().enumerate() {
            if let Some(t) = t {
                gd[l1] = 0x1000_0000_0000_0000 | t;
                tables.insert(*t, vec![0u64; GRAINS_PER_GT as usize]);
            }
        }
        for &(g, e) in &entries {
            let t = GD_TABLES[(g / GRAINS_PER_GT) as usize].expect("mapped grains have a table");
            tables.get_mut(&t).unwrap()[(g % GRAINS_PER_GT) as usize] = e.raw();
        }
        Fixture {
            header: const_header(),
            volatile: volatile_header(),
            gd,
            tables,
            entries,
        }
    }

    /// Set the raw entry of virtual grain `g` (its table must exist).
    fn set_raw(&mut self, g: u64, raw: u64) {
        let t = GD_TABLES[(g / GRAINS_PER_GT) as usize].unwrap();
        self.tables.get_mut(&t).unwrap()[(g % GRAINS_PER_GT) as usize] = raw;
    }

    /// Grain indexes holding data: every allocated one, plus 4098, which
    /// only a stale unmapped entry names.
    fn data_grains(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .entries
            .iter()
            .filter_map(|&(_, e)| match e {
                Entry::Alloc(_, i) => Some(i),
                _ => None,
            })
            .collect();
        v.push(4098);
        v.sort_unstable();
        v.dedup();
        v
    }

    fn extent_bytes(&self) -> Vec<u8> {
        let last = *self.data_grains().last().unwrap();
        let len = (GRAINS.0 * SECTOR + (last + 1) * GRAIN) as usize;
        let mut f = vec![0u8; len];
        f[..512].copy_from_slice(&self.header);
        let v = (VOLATILE.0 * SECTOR) as usize;
        f[v..v + 512].copy_from_slice(&self.volatile);
        for (l1, &e) in self.gd.iter().enumerate() {
            let o = (GD.0 * SECTOR) as usize + 8 * l1;
            u64_at(&mut f, o, e);
        }
        for (&t, entries) in &self.tables {
            let base = ((GT.0 + t * 64) * SECTOR) as usize;
            for (l2, &e) in entries.iter().enumerate() {
                u64_at(&mut f, base + 8 * l2, e);
            }
        }
        for idx in self.data_grains() {
            let o = ((GRAINS.0 + idx * 8) * SECTOR) as usize;
            f[o..o + GRAIN as usize].copy_from_slice(&grain_data(idx));
        }
        f
    }

    /// Write the delta, its descriptor, an orphan descriptor on the same
    /// extent without a parent, and the flat parent into a new backend.
    fn install(&self) -> SimBackend {
        let b = SimBackend::new();
        put(&b, CHILD_EXTENT, &self.extent_bytes(), 0);
        put(&b, CHILD, child_descriptor(true).as_bytes(), 0);
        put(&b, ORPHAN, child_descriptor(false).as_bytes(), 0);
        let parent_desc = format!(
            "# Disk DescriptorFile\nversion=1\nCID={PARENT_CID:08x}\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\n# Extent description\nRW {CAP} FLAT \"{PARENT_FLAT}\" 0\n\n# The Disk Data Base\n#DDB\n\nddb.virtualHWVersion = \"14\"\n"
        );
        put(&b, PARENT, parent_desc.as_bytes(), 0);
        let flat: Vec<u8> = (0..CAP * SECTOR).map(parent_byte).collect();
        put(&b, PARENT_FLAT, &flat, 0);
        b
    }

    /// The disk as it must read: through to the parent, or zeros without one.
    fn expected(&self, with_parent: bool) -> Vec<u8> {
        let mut d: Vec<u8> = if with_parent {
            (0..CAP * SECTOR).map(parent_byte).collect()
        } else {
            vec![0u8; (CAP * SECTOR) as usize]
        };
        for &(g, e) in &self.entries {
            let r = (g * GRAIN) as usize..((g + 1) * GRAIN) as usize;
            match e {
                Entry::Unalloc => {}
                Entry::Unmapped(_) | Entry::Zero(_) => d[r].fill(0),
                Entry::Alloc(_, idx) => d[r].copy_from_slice(&grain_data(idx)),
            }
        }
        d
    }
}

/// A descriptor as ESXi writes one for an SEsparse snapshot.
fn child_descriptor(with_parent: bool) -> String {
    let (pcid, hint) = if with_parent {
        (
            format!("{PARENT_CID:08x}"),
            format!("parentFileNameHint=\"{PARENT}\"\n"),
        )
    } else {
        ("ffffffff".to_string(), String::new())
    };
    format!(
        "# Disk DescriptorFile\nversion=1\nencoding=\"UTF-8\"\nCID=a1b2c3d4\nparentCID={pcid}\nisNativeSnapshot=\"no\"\ncreateType=\"seSparse\"\n{hint}# Extent description\nRW {CAP} SESPARSE \"{CHILD_EXTENT}\"\n\n# The Disk Data Base\n#DDB\n\nddb.grain = \"8\"\nddb.longContentID = \"0123456789abcdef0123456789abcdef\"\nddb.virtualHWVersion = \"14\"\n"
    )
}

fn open(b: &SimBackend, name: &str) -> strata_vmdk::Result<VmdkImage> {
    VmdkImage::open_in(Arc::new(b.clone()), name, &OpenOptions::default())
}

fn read_all(img: &VmdkImage) -> Vec<u8> {
    let mut out = vec![0u8; img.size_bytes() as usize];
    for (i, chunk) in out.chunks_mut(1 << 20).enumerate() {
        img.read_at(chunk, i as u64 * (1 << 20)).unwrap();
    }
    out
}

/// First differing byte, for readable failures.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i} (grain {}, sector {} of it): got {:#04x}, want {:#04x}",
            i as u64 / GRAIN,
            (i as u64 % GRAIN) / SECTOR,
            got[i],
            want[i]
        );
    }
}

#[test]
fn every_entry_type_reads_as_the_reference_says_through_a_parent() {
    let fx = Fixture::new();
    let b = fx.install();
    let img = open(&b, CHILD).unwrap();
    assert_eq!(img.links.len(), 2, "the flat parent is linked");
    assert_eq!(img.links[0].create_type(), "seSparse");
    assert_eq!(img.size_bytes(), CAP * SECTOR);
    assert!(img.read_only());
    let want = fx.expected(true);
    assert_same(&read_all(&img), &want, "whole disk, 1 MiB reads");

    // Reads that start and end inside grains and cross entry types.
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..400 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Mostly near the interesting grains at the start of each table.
        let base = [0, 2 * GRAINS_PER_GT * GRAIN, 4090 * GRAIN][(rng % 3) as usize];
        let off = (base + (rng >> 8) % (40 * GRAIN) / SECTOR * SECTOR).min(CAP * SECTOR - SECTOR);
        let len = ((1 + (rng >> 32) % 40) * SECTOR).min(CAP * SECTOR - off);
        let mut buf = vec![0xeeu8; len as usize];
        img.read_at(&mut buf, off).unwrap();
        assert_same(
            &buf,
            &want[off as usize..(off + len) as usize],
            &format!("read of {len} bytes at {off}"),
        );
    }
}

#[test]
fn without_a_parent_unallocated_grains_read_zeros() {
    let fx = Fixture::new();
    let b = fx.install();
    let img = open(&b, ORPHAN).unwrap();
    assert_eq!(img.links.len(), 1);
    assert_same(&read_all(&img), &fx.expected(false), "orphan disk");
    // The bare extent, without any descriptor, reads the same.
    let bare = open(&b, CHILD_EXTENT).unwrap();
    assert_eq!(bare.links[0].create_type(), "seSparse");
    assert_same(&read_all(&bare), &fx.expected(false), "bare extent");
}

#[test]
fn status_reports_each_grain_as_its_entry_says() {
    let fx = Fixture::new();
    let b = fx.install();
    let img = open(&b, CHILD).unwrap();
    let grains = CAP / 8;
    let mut want = vec![RangeState::Unallocated; grains as usize];
    for &(g, e) in &fx.entries {
        want[g as usize] = match e {
            Entry::Unalloc => RangeState::Unallocated,
            Entry::Unmapped(_) | Entry::Zero(_) => RangeState::Zero,
            Entry::Alloc(..) => RangeState::Data,
        };
    }
    let runs = img
        .link_status(0, 0, CAP * SECTOR, usize::MAX)
        .expect("link status");
    let mut got = Vec::new();
    for (len, st) in runs {
        assert_eq!(len % GRAIN, 0, "runs of whole grains");
        got.extend(std::iter::repeat_n(st, (len / GRAIN) as usize));
    }
    assert_eq!(got.len(), want.len());
    for (g, (a, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a, w, "grain {g}");
    }
    // Through the chain, everything not zero in the delta is data (the
    // parent is flat), and block_status says the same.
    let ext = img.block_status(0, CAP * SECTOR).unwrap();
    let mut pos = 0u64;
    for e in ext {
        for g in pos / GRAIN..(pos + e.len_bytes) / GRAIN {
            let zero = want[g as usize] == RangeState::Zero;
            assert_eq!(e.zero, zero, "block_status of grain {g}");
            assert_eq!(e.hole, zero, "block_status of grain {g}");
        }
        pos += e.len_bytes;
    }
    assert_eq!(pos, CAP * SECTOR);
}

#[test]
fn check_counts_the_entries_and_finds_no_errors() {
    let fx = Fixture::new();
    let b = fx.install();
    let img = open(&b, CHILD).unwrap();
    let report = img.check(false).unwrap();
    let se = report
        .iter()
        .find(|(n, _)| n == CHILD_EXTENT)
        .map(|(_, c)| c)
        .expect("the extent is checked");
    for (name, c) in &report {
        assert!(c.errors.is_empty(), "{name}: {:?}", c.errors);
    }
    let count = |f: fn(&Entry) -> bool| fx.entries.iter().filter(|(_, e)| f(e)).count() as u64;
    assert_eq!(
        se.allocated_grains,
        count(|e| matches!(e, Entry::Alloc(..)))
    );
    assert_eq!(se.zero_grains, count(|e| matches!(e, Entry::Zero(_))));
    assert_eq!(
        se.unmapped_grains,
        count(|e| matches!(e, Entry::Unmapped(_)))
    );
}

/// strata's writer must produce the reference's rotated encoding too: the
/// 4098th grain written gets index 4097 and entry 0x3001000000000001.
#[test]
fn the_writer_rotates_grain_indexes_past_4096_like_the_reference() {
    use strata_vmdk::{create_image, ImageSpec, Subformat};
    let b = SimBackend::new();
    let img = create_image(
        Arc::new(b.clone()),
        "w.vmdk",
        &ImageSpec::new(Subformat::SeSparse, 2 * 32768),
    )
    .unwrap();
    let grain = grain_data(9);
    for g in 0..4098u64 {
        img.write_at(&grain, g * GRAIN, false).unwrap();
    }
    img.flush().unwrap();
    drop(img);
    let f = b.open("w-sesparse.vmdk", false).unwrap();
    let mut h = [0u8; 512];
    f.read_at(&mut h, 0).unwrap();
    let field = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
    let (gd, gts, grains) = (field(128), field(144), field(192));
    let mut e = [0u8; 8];
    f.read_at(&mut e, gd * SECTOR).unwrap();
    let gde = u64::from_le_bytes(e);
    assert_eq!(gde >> 60, 1, "GD entry 0x{gde:016x} names a table");
    let table = gts + (gde & 0xffff_ffff) * 64;
    for (g, raw) in [
        (0u64, 0x3000_0000_0000_0000u64),
        (4095, 0x3fff_0000_0000_0000),
        (4096, 0x3000_0000_0000_0001),
        (4097, 0x3001_0000_0000_0001),
    ] {
        // Grain 4096 and up are in the second table.
        let (t, l2) = if g < 4096 {
            (table, g)
        } else {
            f.read_at(&mut e, gd * SECTOR + 8).unwrap();
            (gts + (u64::from_le_bytes(e) & 0xffff_ffff) * 64, g - 4096)
        };
        f.read_at(&mut e, t * SECTOR + l2 * 8).unwrap();
        assert_eq!(
            u64::from_le_bytes(e),
            raw,
            "entry of grain {g} (written {g}th, so index {g})"
        );
    }
    let mut d = vec![0u8; GRAIN as usize];
    f.read_at(&mut d, (grains + 4097 * 8) * SECTOR).unwrap();
    assert_eq!(d, grain, "index 4097 holds the data");
}

/// Every header QEMU 7.2 refuses is refused with a message naming the
/// problem, opened through the descriptor and as a bare extent.
#[test]
fn malformed_headers_are_refused_with_a_clear_message() {
    type Edit = Box<dyn Fn(&mut Fixture)>;
    let set = |off: usize, v: u64| -> Edit { Box::new(move |f| u64_at(&mut f.header, off, v)) };
    let vset = |off: usize, v: u64| -> Edit { Box::new(move |f| u64_at(&mut f.volatile, off, v)) };
    let cases: Vec<(&str, Edit, &str)> = vec![
        ("bad magic", set(0, 0xcafe_babf), "magic"),
        ("bad magic, high half", set(0, 0x1_cafe_babe), "magic"),
        ("version 1", set(8, 1), "version"),
        ("version 2.2", set(8, 0x0000_0002_0000_0002), "version"),
        ("grain size 16", set(24, 16), "grain size 16"),
        ("grain size 0", set(24, 0), "grain size 0"),
        ("grain table size 128", set(32, 128), "grain table size 128"),
        ("flags 1", set(40, 1), "flags"),
        ("reserved1 = 0x200 (newer ESXi)", set(48, 0x200), "reserved"),
        ("reserved2", set(56, 1), "reserved"),
        ("reserved3", set(64, 1), "reserved"),
        ("reserved4", set(72, 1 << 63), "reserved"),
        (
            "pad, first byte",
            Box::new(|f| f.header[208] = 1),
            "padding",
        ),
        (
            "pad, last byte",
            Box::new(|f| f.header[511] = 0x80),
            "padding",
        ),
        (
            "volatile magic",
            vset(0, 0xcafe_babe),
            "volatile header magic",
        ),
        (
            "volatile pad",
            Box::new(|f| f.volatile[300] = 7),
            "volatile header padding",
        ),
        ("replay_journal = 1", vset(24, 1), "journal"),
        ("replay_journal = all ones", vset(24, u64::MAX), "dirty"),
        // Not in QEMU's list, but impossible layouts must be refused too.
        ("capacity 0", set(16, 0), "capacity"),
        ("grain directory at 0", set(128, 0), "grain directory"),
        ("grain directory size 0", set(136, 0), "grain directory"),
        ("grain tables at 2^60", set(144, 1 << 60), "grain tables"),
        ("grains size 0", set(200, 0), "grains"),
        (
            "volatile header past the end",
            set(80, 1 << 40),
            "volatile header",
        ),
        (
            "grain directory of 2^40 sectors",
            set(136, 1 << 40),
            "grain directory",
        ),
    ];
    for (what, edit, want) in cases {
        let mut fx = Fixture::new();
        edit(&mut fx);
        let b = fx.install();
        for name in [CHILD, CHILD_EXTENT] {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                open(&b, name).map(|_| ())
            }));
            let err = match r {
                Err(_) => panic!("{what}: opening {name} panicked"),
                Ok(Ok(())) => panic!("{what}: opening {name} succeeded"),
                Ok(Err(e)) => e,
            };
            let msg = err.to_string();
            assert!(
                msg.to_lowercase().contains(&want.to_lowercase()),
                "{what}: opening {name}: message {msg:?} does not mention {want:?}"
            );
            assert!(
                msg.contains(CHILD_EXTENT),
                "{what}: message {msg:?} does not name the extent file"
            );
        }
    }
}

/// Entry types 0x4 to 0xF, a type-0 entry with bits set, and a directory
/// entry that is no table reference: reads of the grain fail with a clear
/// error, other grains still read, check reports it, nothing panics.
#[test]
fn unknown_entry_types_are_read_errors_not_garbage() {
    let mut bad: Vec<(u64, &str)> = (0x4u64..=0xf)
        .map(|t| ((t << 60) | 0x0001_0000_0000_0000, "unknown type"))
        .collect();
    bad.push((0x0000_0000_0000_0001, "type 0 with non-zero bits"));
    bad.push((0x0fff_ffff_ffff_ffff, "type 0 with non-zero bits"));
    let want = Fixture::new().expected(true);
    for (raw, msg_want) in bad {
        let mut fx = Fixture::new();
        fx.set_raw(0, raw);
        let b = fx.install();
        let img = open(&b, CHILD).unwrap();
        let mut buf = vec![0u8; GRAIN as usize];
        let e = img
            .read_at(&mut buf, 0)
            .expect_err(&format!("entry 0x{raw:016x} must not read"));
        assert!(
            e.to_string().contains(msg_want) && e.to_string().contains(&format!("{raw:016x}")),
            "entry 0x{raw:016x}: {e}"
        );
        // A read that covers the bad grain among good ones fails too.
        let mut big = vec![0u8; 16 * GRAIN as usize];
        assert!(img.read_at(&mut big, 0).is_err());
        assert!(img.block_status(0, GRAIN).is_err());
        // Everything else still reads right.
        let mut rest = vec![0u8; 64 * GRAIN as usize];
        img.read_at(&mut rest, GRAIN).unwrap();
        assert_same(
            &rest,
            &want[GRAIN as usize..65 * GRAIN as usize],
            "after the bad grain",
        );
        let report = img.check(false).unwrap();
        let errors: Vec<&String> = report.iter().flat_map(|(_, c)| &c.errors).collect();
        assert!(
            errors
                .iter()
                .any(|e| e.contains("grain 0") && e.contains(msg_want)),
            "check must report grain 0: {errors:?}"
        );
    }
}

#[test]
fn bad_grain_directory_entries_are_read_errors() {
    for (raw, msg_want) in [
        (0x2000_0000_0000_0001u64, "not a table reference"),
        (0x1000_0001_0000_0000, "not a table reference"),
        (0x1000_0000_0000_0020, "past the 32 tables"), // GT area holds 2048/64 = 32
        (0x1000_0000_ffff_ffff, "past the 32 tables"),
    ] {
        let mut fx = Fixture::new();
        fx.gd[0] = raw;
        let b = fx.install();
        let img = open(&b, CHILD).unwrap();
        let mut buf = vec![0u8; GRAIN as usize];
        let e = img.read_at(&mut buf, 0).unwrap_err().to_string();
        assert!(e.contains(msg_want), "GD entry 0x{raw:016x}: {e}");
        // The third table is fine.
        let off = 2 * GRAINS_PER_GT * GRAIN;
        img.read_at(&mut buf, off).unwrap();
        assert_eq!(buf, grain_data(5));
        let report = img.check(false).unwrap();
        assert!(
            report
                .iter()
                .flat_map(|(_, c)| &c.errors)
                .any(|e| e.contains(msg_want)),
            "check must report GD entry 0"
        );
    }
}
