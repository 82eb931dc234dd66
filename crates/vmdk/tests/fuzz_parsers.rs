//! Robustness of every parser and of whole-image opens against random and
//! mutated bytes: the result is `Ok` or `Err`, never a panic, never an
//! allocation sized by a field of the file (the global allocator below
//! refuses any single allocation over [`ALLOC_LIMIT`], which aborts the
//! test binary with "memory allocation of N bytes failed").
//!
//! Cases per property: `STRATA_FUZZ_CASES` (default 300).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::alloc::{GlobalAlloc, Layout, System};
use std::ops::Range;
use std::sync::{Arc, OnceLock};

use proptest::prelude::*;
use strata_block::{BlockDevice, Fill, ReadFill, ZeroOptions};
use strata_storage::{Backend, SimBackend};
use strata_vmdk::create::image_files;
use strata_vmdk::sparse::{CowdHeader, KdmvHeader, SeSparseHeader};
use strata_vmdk::{
    create_image, fuzzing, ImageSpec, OpenOptions, StreamWriter, Subformat, VmdkImage,
};

/// No single allocation may be larger: every file here is a few MiB, so
/// anything bigger was sized by a corrupt field.
const ALLOC_LIMIT: usize = 256 << 20;

struct Guard;

// SAFETY: forwards to the system allocator; refusing (null) is allowed.
unsafe impl GlobalAlloc for Guard {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() > ALLOC_LIMIT {
            return std::ptr::null_mut();
        }
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if l.size() > ALLOC_LIMIT {
            return std::ptr::null_mut();
        }
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        if new > ALLOC_LIMIT {
            return std::ptr::null_mut();
        }
        System.realloc(p, l, new)
    }
}

#[global_allocator]
static GUARD: Guard = Guard;

fn cases() -> u32 {
    std::env::var("STRATA_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        max_shrink_iters: 500,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------- base images

/// A valid image to mutate: its files, the one to open, and for each file
/// the byte ranges worth mutating (headers, directories, tables, text).
struct Base {
    what: &'static str,
    open: String,
    files: Vec<(String, Vec<u8>)>,
    hot: Vec<Vec<Range<usize>>>,
}

fn snapshot(b: &SimBackend, names: &[String]) -> Vec<(String, Vec<u8>)> {
    names
        .iter()
        .map(|n| {
            let f = b.open(n, false).unwrap();
            let mut v = vec![0u8; f.len().unwrap() as usize];
            f.read_at(&mut v, 0).unwrap();
            (n.clone(), v)
        })
        .collect()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Some data, zeroes and unmaps, so there are tables and every entry kind.
fn fill(img: &VmdkImage, seed: u64) {
    let size = img.size_bytes();
    for (i, &(off, len)) in [
        (0u64, 65536usize),
        (4096 * 3, 4096),
        (size / 2, 8192),
        (size - 4096, 4096),
        (size / 3 / 512 * 512, 1536),
    ]
    .iter()
    .enumerate()
    {
        img.write_at(&pattern(seed + i as u64, len), off, false)
            .unwrap();
    }
    img.write_zeroes(65536, 65536, ZeroOptions::default())
        .unwrap();
    img.unmap(0, 8192).unwrap();
    img.flush().unwrap();
}

fn u32_at(b: &[u8], o: usize) -> u64 {
    u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) as u64
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().unwrap())
}

/// Ranges of `b` worth mutating, found from its own (valid) header.
fn hot_ranges(b: &[u8]) -> Vec<Range<usize>> {
    let len = b.len();
    let clip = |r: Range<u64>| -> Range<usize> {
        (r.start.min(len as u64) as usize)..(r.end.min(len as u64) as usize)
    };
    let mut v = Vec::new();
    if len >= 512 && &b[0..4] == b"KDMV" {
        let h: [u8; 512] = b[..512].try_into().unwrap();
        let mut h = KdmvHeader::decode(&h).unwrap();
        v.push(0..512);
        if h.gd_offset == u64::MAX {
            v.push(len - 1536..len);
            let f: [u8; 512] = b[len - 1024..len - 512].try_into().unwrap();
            h = KdmvHeader::decode(&f).unwrap();
        }
        v.push(clip(
            h.desc_offset * 512..(h.desc_offset + h.desc_size) * 512,
        ));
        let n = h.capacity.div_ceil(h.grain_size * h.gtes_per_gt as u64);
        for dir in [h.gd_offset, h.rgd_offset] {
            if dir != 0 {
                v.push(clip(dir * 512..dir * 512 + n * 4));
                let gt = u32_at(b, (dir * 512) as usize) * 512;
                v.push(clip(gt..gt + 2048));
            }
        }
        let data = h.overhead * 512;
        v.push(clip(data..data + 64));
    } else if len >= 2048 && &b[0..4] == b"COWD" {
        let h = CowdHeader::decode(b).unwrap();
        v.push(0..64);
        let gd = h.gd_offset as u64 * 512;
        v.push(clip(gd..gd + h.num_gd_entries as u64 * 4));
        let gt = u32_at(b, gd as usize) * 512;
        v.push(clip(gt..gt + 16384));
    } else if len >= 1024 && u64_at(b, 0) == 0xcafe_babe {
        let h = SeSparseHeader::decode(&b[..512].try_into().unwrap()).unwrap();
        v.push(0..512);
        v.push(clip(h.volatile.0 * 512..h.volatile.0 * 512 + 64));
        let gd = h.grain_dir.0 * 512;
        v.push(clip(gd..gd + 64));
        let gde = u64_at(b, gd as usize);
        let gt = (h.grain_tables.0 + (gde & 0xffff_ffff) * 64) * 512;
        v.push(clip(gt..gt + 256));
        v.push(clip(gt..gt + 32768));
    } else {
        v.push(0..len.min(4096));
    }
    v.retain(|r| r.start < r.end);
    if v.is_empty() {
        v.push(0..len.max(1));
    }
    v
}

fn base(what: &'static str, b: &SimBackend, open: &str, names: Vec<String>) -> Base {
    let files = snapshot(b, &names);
    let hot = files.iter().map(|(_, d)| hot_ranges(d)).collect();
    Base {
        what,
        open: open.to_string(),
        files,
        hot,
    }
}

fn build_bases() -> Vec<Base> {
    let mut out = Vec::new();
    for (i, sub) in [
        Subformat::MonolithicSparse,
        Subformat::MonolithicFlat,
        Subformat::VmfsSparse,
        Subformat::SeSparse,
    ]
    .into_iter()
    .enumerate()
    {
        let b = SimBackend::new();
        let img = create_image(
            Arc::new(b.clone()),
            "d.vmdk",
            &ImageSpec::new(sub, 8192), // 4 MiB
        )
        .unwrap();
        fill(&img, i as u64 * 100);
        drop(img);
        out.push(base(sub.name(), &b, "d.vmdk", image_files("d.vmdk", sub)));
    }
    // monolithicSparse without zeroed-grain entries.
    {
        let b = SimBackend::new();
        let mut spec = ImageSpec::new(Subformat::MonolithicSparse, 8192);
        spec.zero_grain = false;
        let img = create_image(Arc::new(b.clone()), "d.vmdk", &spec).unwrap();
        fill(&img, 7);
        drop(img);
        out.push(base(
            "monolithicSparse v1",
            &b,
            "d.vmdk",
            vec!["d.vmdk".into()],
        ));
    }
    // streamOptimized.
    {
        let b = SimBackend::new();
        let mut w = StreamWriter::create(&b, "s.vmdk", 8192 + 100, "lsilogic").unwrap();
        for g in [0u64, 1, 5, 63] {
            w.write_grain(g, &pattern(g, 65536)).unwrap();
        }
        w.write_grain(64, &pattern(3, 100 * 512)).unwrap();
        w.finish().unwrap();
        out.push(base("streamOptimized", &b, "s.vmdk", vec!["s.vmdk".into()]));
    }
    // A chain: seSparse delta on vmfsSparse on monolithicSparse.
    {
        let b = SimBackend::new();
        let bk: Arc<dyn Backend> = Arc::new(b.clone());
        let img = create_image(
            bk.clone(),
            "p.vmdk",
            &ImageSpec::new(Subformat::MonolithicSparse, 8192),
        )
        .unwrap();
        fill(&img, 11);
        let cid = img.current_cid();
        drop(img);
        let mut spec = ImageSpec::new(Subformat::VmfsSparse, 8192);
        spec.parent = Some(("p.vmdk".into(), cid));
        let img = create_image(bk.clone(), "m.vmdk", &spec).unwrap();
        img.write_at(&pattern(12, 4096), 8192, false).unwrap();
        img.flush().unwrap();
        let cid = img.current_cid();
        drop(img);
        let mut spec = ImageSpec::new(Subformat::SeSparse, 8192);
        spec.parent = Some(("m.vmdk".into(), cid));
        let img = create_image(bk, "c.vmdk", &spec).unwrap();
        img.write_at(&pattern(13, 4096), 4096, false).unwrap();
        img.flush().unwrap();
        drop(img);
        let mut names = image_files("c.vmdk", Subformat::SeSparse);
        names.extend(image_files("m.vmdk", Subformat::VmfsSparse));
        names.push("p.vmdk".into());
        out.push(base("chain", &b, "c.vmdk", names));
    }
    // A descriptor of several extents: flat, zero and a sparse file.
    {
        let b = SimBackend::new();
        let img = create_image(
            Arc::new(b.clone()),
            "x.vmdk",
            &ImageSpec::new(Subformat::MonolithicSparse, 4096),
        )
        .unwrap();
        fill(&img, 21);
        drop(img);
        let f = b.open("a-flat.vmdk", true).unwrap();
        f.write_at(&pattern(22, 2048 * 512), 0).unwrap();
        let d = "# Disk DescriptorFile\nversion=1\nCID=12345678\nparentCID=ffffffff\ncreateType=\"twoGbMaxExtentSparse\"\n\n# Extent description\nRW 1024 FLAT \"a-flat.vmdk\" 1024\nRW 1000 ZERO\nRW 4096 SPARSE \"x.vmdk\"\nRDONLY 24 FLAT \"a-flat.vmdk\" 0\n\n#DDB\nddb.adapterType = \"ide\"\n";
        let f = b.open("multi.vmdk", true).unwrap();
        f.write_at(d.as_bytes(), 0).unwrap();
        out.push(base(
            "multi-extent",
            &b,
            "multi.vmdk",
            vec!["multi.vmdk".into(), "a-flat.vmdk".into(), "x.vmdk".into()],
        ));
    }
    out
}

fn bases() -> &'static [Base] {
    static B: OnceLock<Vec<Base>> = OnceLock::new();
    B.get_or_init(build_bases)
}

// ---------------------------------------------------------------- mutation

const INTERESTING: [u64; 28] = [
    0,
    1,
    2,
    7,
    8,
    0x40,
    0x80,
    0xff,
    0x200,
    4095,
    4096,
    4097,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 32,
    1 << 40,
    1 << 48,
    1 << 54,
    1 << 60,
    1 << 63,
    u64::MAX,
    u64::MAX - 1,
    0x1000_0000_0000_0001,
    0x1000_0000_ffff_ffff,
    0x3fff_ffff_ffff_ffff,
    0x2000_0000_0000_0000,
    0xcafe_babe,
];

const TOKENS: [&str; 24] = [
    "RW ",
    "RDONLY ",
    "NOACCESS ",
    " FLAT ",
    " SPARSE ",
    " ZERO ",
    " SESPARSE ",
    " VMFSSPARSE ",
    " VMFS ",
    " VMFSRDM ",
    "\"",
    "=",
    "\n",
    "18446744073709551615",
    "281474976710656",
    "4294967295",
    " 0",
    "parentFileNameHint=\"",
    "parentCID=0\n",
    "CID=",
    "../",
    "/",
    "\0",
    "\u{feff}é\u{ff}",
];

/// One mutation, as raw numbers interpreted against the chosen file.
#[derive(Debug, Clone)]
struct Mutation {
    file: u8,
    hot: bool,
    region: u8,
    pos: u32,
    op: u8,
    val: u64,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    (
        any::<u8>(),
        prop::bool::weighted(0.85),
        any::<u8>(),
        any::<u32>(),
        any::<u8>(),
        any::<u64>(),
    )
        .prop_map(|(file, hot, region, pos, op, val)| Mutation {
            file,
            hot,
            region,
            pos,
            op,
            val,
        })
}

fn is_text(d: &[u8]) -> bool {
    d.len() < 64 * 1024 && (d.starts_with(b"#") || d.starts_with(b"version"))
}

fn apply(m: &Mutation, files: &mut [(String, Vec<u8>)], hot: &[Vec<Range<usize>>]) {
    let fi = m.file as usize % files.len();
    let data = &mut files[fi].1;
    if data.is_empty() {
        data.push(0);
    }
    let range = if m.hot {
        let h = &hot[fi];
        let r = h[m.region as usize % h.len()].clone();
        r.start.min(data.len() - 1)..r.end.min(data.len()).max(r.start.min(data.len() - 1) + 1)
    } else {
        0..data.len()
    };
    let pos = range.start + m.pos as usize % (range.end - range.start);
    let interesting = INTERESTING[(m.val % INTERESTING.len() as u64) as usize];
    let value = if m.val >> 63 == 1 { m.val } else { interesting };
    if is_text(data) && !m.op.is_multiple_of(4) {
        // Text edits: insert a token, delete a span, or replace a number.
        match m.op % 4 {
            1 => {
                let t = TOKENS[(m.val % TOKENS.len() as u64) as usize];
                let at = pos.min(data.len());
                data.splice(at..at, t.bytes());
            }
            2 => {
                let end = (pos + 1 + (m.val % 40) as usize).min(data.len());
                data.drain(pos..end);
            }
            _ => {
                let at = pos.min(data.len());
                let digits = value.to_string();
                let end = data[at..]
                    .iter()
                    .position(|c| !c.is_ascii_alphanumeric())
                    .map_or(data.len(), |p| at + p);
                data.splice(at..end, digits.bytes());
            }
        }
        return;
    }
    match m.op % 8 {
        0 => data[pos] ^= 1 << (m.val % 8),
        1 => data[pos] = m.val as u8,
        2 | 3 => {
            let p = pos & !3;
            let end = (p + 4).min(data.len());
            let b = (value as u32).to_le_bytes();
            data[p..end].copy_from_slice(&b[..end - p]);
        }
        4 | 5 => {
            let p = pos & !7;
            let end = (p + 8).min(data.len());
            let b = value.to_le_bytes();
            data[p..end].copy_from_slice(&b[..end - p]);
        }
        6 => {
            // Truncate somewhere.
            let keep = (m.val % (data.len() as u64 + 1)) as usize;
            data.truncate(keep);
        }
        _ => {
            // Overwrite a short run with one byte value.
            let end = (pos + 1 + (m.val % 16) as usize).min(data.len());
            data[pos..end].fill((m.val >> 8) as u8);
        }
    }
}

fn install(files: &[(String, Vec<u8>)]) -> SimBackend {
    let b = SimBackend::new();
    for (n, d) in files {
        let f = b.open(n, true).unwrap();
        f.write_at(d, 0).unwrap();
        f.set_len(d.len() as u64).unwrap();
    }
    b
}

/// Open, read, ask for status and check: any result but a panic is fine
/// (the checks of the `open_image` fuzz target, with larger windows).
fn exercise(b: &SimBackend, name: &str) {
    let Ok(img) = VmdkImage::open_in(Arc::new(b.clone()), name, &OpenOptions::default()) else {
        return;
    };
    fuzzing::exercise(&img, 64 << 20, 16 << 20);
}

// ---------------------------------------------------------------- properties

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mutated_images_open_read_and_check_without_panicking(
        which in any::<u8>(),
        muts in prop::collection::vec(mutation(), 1..6),
    ) {
        let bases = bases();
        let base = &bases[which as usize % bases.len()];
        let mut files = base.files.clone();
        for m in &muts {
            apply(m, &mut files, &base.hot);
        }
        let b = install(&files);
        exercise(&b, &base.open);
    }

    #[test]
    fn random_files_open_without_panicking(
        prefix in 0usize..6,
        body in prop::collection::vec(any::<u8>(), 0..3000),
        fields in prop::collection::vec((0usize..64, any::<u64>(), 0usize..INTERESTING.len()), 0..12),
    ) {
        let mut d = match prefix {
            0 => b"KDMV".to_vec(),
            1 => b"COWD".to_vec(),
            2 => 0xcafe_babeu64.to_le_bytes().to_vec(),
            3 => b"version=1\nCID=1\ncreateType=\"x\"\n".to_vec(),
            _ => Vec::new(),
        };
        d.extend_from_slice(&body);
        d.resize(d.len().max(2048), 0);
        // Plausible-looking header fields.
        for (slot, v, i) in fields {
            let v = if v % 3 == 0 { v } else { INTERESTING[i] };
            let o = 8 + slot * 8;
            d[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        if prefix == 2 {
            // Pass the SEsparse constant checks so the layout gets used.
            d[8..16].copy_from_slice(&0x0000_0002_0000_0001u64.to_le_bytes());
            d[24..32].copy_from_slice(&8u64.to_le_bytes());
            d[32..48].fill(0);
            d[32..40].copy_from_slice(&64u64.to_le_bytes());
            d[48..80].fill(0);
            d[208..512].fill(0);
        }
        let b = install(&[("f.vmdk".to_string(), d)]);
        exercise(&b, "f.vmdk");
    }

    #[test]
    fn descriptor_parse_never_panics_and_round_trips(
        base_sel in 0usize..4,
        muts in prop::collection::vec(mutation(), 0..8),
        raw in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        fuzzing::descriptor(&raw);
        let texts = [
            "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\n# Extent description\nRW 2048 FLAT \"a-flat.vmdk\" 0\n\n#DDB\nddb.adapterType = \"ide\"\n",
            "version=1\nencoding=\"UTF-8\"\nCID=a1b2c3d4\nparentCID=11223344\nisNativeSnapshot=\"no\"\ncreateType=\"seSparse\"\nparentFileNameHint=\"p.vmdk\"\n# Extent description\nRW 8192 SESPARSE \"c-sesparse.vmdk\"\n\nddb.grain = \"8\"\n",
            "version=3\nCID=1\ncreateType=\"twoGbMaxExtentSparse\"\nRW 4192256 SPARSE \"x-s001.vmdk\"\nRW 10 ZERO\nRDONLY 7 VMFS \"v.vmdk\"\nNOACCESS 1 FLAT \"n\" 5\n",
            "version=1\r\nCID = 00000001\r\ncreateType = \"vmfsSparse\"\r\nRW 100 VMFSSPARSE \"d-delta.vmdk\"\r\n\0\0garbage",
        ];
        let mut files = vec![("d".to_string(), texts[base_sel].as_bytes().to_vec())];
        let hot = vec![vec![0..files[0].1.len()]];
        for m in &muts {
            apply(m, &mut files, &hot);
        }
        // The `descriptor` fuzz target's checks.
        fuzzing::descriptor(&files[0].1);
    }

    #[test]
    fn header_decoders_never_panic_and_round_trip(
        raw in prop::collection::vec(any::<u8>(), 512),
        cowd_len in 0usize..2100,
        fields in prop::collection::vec((0usize..64, 0usize..INTERESTING.len()), 0..16),
        magic in 0usize..4,
    ) {
        let mut b: [u8; 512] = raw.clone().try_into().unwrap();
        for (slot, i) in fields {
            let o = slot * 8;
            b[o..o + 8].copy_from_slice(&INTERESTING[i].to_le_bytes());
        }
        match magic {
            0 => b[0..4].copy_from_slice(b"KDMV"),
            1 => b[0..4].copy_from_slice(b"COWD"),
            2 => {
                b[0..8].copy_from_slice(&0xcafe_babeu64.to_le_bytes());
                b[8..16].copy_from_slice(&0x0000_0002_0000_0001u64.to_le_bytes());
                b[24..32].copy_from_slice(&8u64.to_le_bytes());
                b[32..40].copy_from_slice(&64u64.to_le_bytes());
                b[40..80].fill(0);
                b[208..].fill(0);
            }
            _ => {
                b[0..8].copy_from_slice(&0xcafe_cafeu64.to_le_bytes());
                b[32..].fill(0);
            }
        }
        // The `sparse_headers` fuzz target's checks, on the sector and on
        // the input COWD is decoded from.
        fuzzing::sparse_headers(&b);
        let mut c = b.to_vec();
        c.resize(cowd_len, 0xa5);
        fuzzing::sparse_headers(&c);
    }
}

/// The examples the brief names: size fields of 2^40 and more are refused
/// before anything is allocated from them.
#[test]
fn huge_size_fields_are_refused_before_allocating() {
    let bases = bases();
    let find = |w: &str| bases.iter().find(|b| b.what == w).unwrap();
    // SEsparse: grain directory size 2^40 sectors; capacity 2^47.
    for (off, v) in [(136usize, 1u64 << 40), (16, 1 << 47), (136, u64::MAX / 512)] {
        let base = find("seSparse");
        let mut files = base.files.clone();
        let ext = &mut files[1].1;
        ext[off..off + 8].copy_from_slice(&v.to_le_bytes());
        let b = install(&files);
        let r = VmdkImage::open_in(Arc::new(b), "d.vmdk", &OpenOptions::default());
        assert!(
            r.is_err(),
            "SEsparse field at {off} = {v:#x} must be refused"
        );
    }
    // KDMV: capacity 2^40 sectors (a grain directory of 2^40/65536 entries
    // past the file), grain size 1, 2^47 sectors.
    for (off, v) in [(12usize, 1u64 << 40), (20, 1), (12, 1 << 47)] {
        let base = find("monolithicSparse");
        let mut files = base.files.clone();
        let f = &mut files[0].1;
        f[off..off + 8].copy_from_slice(&v.to_le_bytes());
        let b = install(&files);
        if let Ok(img) = VmdkImage::open_in(Arc::new(b.clone()), "d.vmdk", &OpenOptions::default())
        {
            // Grain size 1 with the same tables is a valid (if odd) image.
            exercise(&b, "d.vmdk");
            drop(img);
        }
    }
    // COWD: 2^32-1 directory entries.
    let base = find("vmfsSparse");
    let mut files = base.files.clone();
    files[1].1[24..28].copy_from_slice(&u32::MAX.to_le_bytes());
    let b = install(&files);
    assert!(VmdkImage::open_in(Arc::new(b), "d.vmdk", &OpenOptions::default()).is_err());
    // A descriptor naming a flat extent at an offset near 2^64 bytes.
    let base = find("monolithicFlat");
    let mut files = base.files.clone();
    let text = String::from_utf8(files[0].1.clone()).unwrap();
    for off in ["36028797018963967", "18014398509481984", "35184372088832"] {
        files[0].1 = text.replace(" 0\n", &format!(" {off}\n")).into_bytes();
        let b = install(&files);
        exercise(&b, "d.vmdk");
    }
}

#[test]
fn every_base_image_is_valid_and_reads() {
    for base in bases() {
        let b = install(&base.files);
        let img = VmdkImage::open_in(Arc::new(b.clone()), &base.open, &OpenOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", base.what));
        let mut buf = vec![0u8; img.size_bytes() as usize];
        img.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().any(|&x| x != 0), "{}: has data", base.what);
        for (name, c) in img.check(false).unwrap() {
            assert!(c.errors.is_empty(), "{}: {name}: {:?}", base.what, c.errors);
        }
    }
}

/// The runs of `[off, off+len)` as block status reports them, with every
/// extent that is a hole or reads as zeros as `Zeros` (what a read may call
/// a hole).
fn status_fill(img: &VmdkImage, off: u64, len: u64) -> ReadFill {
    let mut want = ReadFill::new();
    let mut at = off;
    while at < off + len {
        for x in img.block_status(at, off + len - at).unwrap() {
            let f = if x.hole || x.zero {
                Fill::Zeros
            } else {
                Fill::Data
            };
            want.push(x.len_bytes, f);
            at += x.len_bytes;
        }
    }
    want
}

/// A read reports as zeros exactly what block status calls a hole or zero
/// (unallocated grains down the whole chain, zero and unmapped grains, ZERO
/// extents), from its own lookups, and those runs hold zeros.
#[test]
fn reads_report_the_holes_block_status_reports() {
    for base in bases() {
        let b = install(&base.files);
        let img = VmdkImage::open_in(Arc::new(b.clone()), &base.open, &OpenOptions::default())
            .unwrap_or_else(|e| panic!("{}: {e}", base.what));
        let size = img.size_bytes();
        let mut buf = vec![0xa5u8; size as usize];
        let fill = img.read_at(&mut buf, 0).unwrap();
        assert_eq!(fill, status_fill(&img, 0, size), "{}", base.what);
        // Every base but the flat one has holes.
        assert_eq!(
            fill.runs().any(|(_, f)| f == Fill::Zeros),
            base.what != "monolithicFlat",
            "{}: holes",
            base.what
        );
        for (r, f) in fill.runs() {
            if f == Fill::Zeros {
                let run = &buf[r.start as usize..r.end as usize];
                assert!(run.iter().all(|&x| x == 0), "{}: {r:?}", base.what);
            }
        }
        // Short reads across grain and extent edges say the same.
        for k in 0..64u64 {
            let off = (k * 4096 * 17 + 1536) % size / 512 * 512;
            let len = (3 * 512).min(size - off);
            let fill = img.read_at(&mut buf[..len as usize], off).unwrap();
            assert_eq!(fill, status_fill(&img, off, len), "{} at {off}", base.what);
        }
    }
}

/// The panics and hangs the fuzzing found, as fixed cases.
#[test]
fn regressions_found_by_fuzzing() {
    let bases = bases();
    let find = |w: &str| bases.iter().find(|b| b.what == w).unwrap();
    let open = |files: &[(String, Vec<u8>)], name: &str| {
        VmdkImage::open_in(Arc::new(install(files)), name, &OpenOptions::default())
    };

    // KDMV redundant GD offset of 2^63 sectors: overflowed computing bytes.
    let mut files = find("monolithicSparse").files.clone();
    files[0].1[48..56].copy_from_slice(&(1u64 << 63).to_le_bytes());
    let e = open(&files, "d.vmdk").err().expect("refused");
    assert!(e.to_string().contains("redundant grain directory"), "{e}");

    // KDMV overHead near 2^64 sectors: check overflowed computing bytes.
    let mut files = find("monolithicSparse").files.clone();
    files[0].1[64..72].copy_from_slice(&u64::MAX.to_le_bytes());
    let img = open(&files, "d.vmdk").unwrap();
    let report = img.check(false).unwrap();
    assert!(report.iter().any(|(_, c)| !c.errors.is_empty()));

    // SEsparse allocated entry naming grain index ~2^60: overflowed
    // computing the offset; now a read error naming the entry.
    let base = find("seSparse");
    let mut files = base.files.clone();
    let ext = &mut files[1].1;
    let h = SeSparseHeader::decode(&ext[..512].try_into().unwrap()).unwrap();
    let gde = u64_at(ext, (h.grain_dir.0 * 512) as usize);
    let gt = ((h.grain_tables.0 + (gde & 0xffff_ffff) * 64) * 512) as usize;
    ext[gt..gt + 8].copy_from_slice(&0x3fff_ffff_ffff_ffffu64.to_le_bytes());
    let img = open(&files, "d.vmdk").unwrap();
    let mut buf = vec![0u8; 4096];
    let e = img.read_at(&mut buf, 0).unwrap_err();
    assert!(e.to_string().contains("past any possible file"), "{e}");
    assert!(img.block_status(0, 4096).is_err());
    let report = img.check(false).unwrap();
    assert!(report.iter().any(|(_, c)| c
        .errors
        .iter()
        .any(|e| e.contains("past any possible file"))));

    // FLAT extent at 2^55-1 sectors: offset + position overflowed.
    let mut files = find("monolithicFlat").files.clone();
    let text = String::from_utf8(files[0].1.clone()).unwrap();
    files[0].1 = text.replace(" 0\n", " 36028797018963967\n").into_bytes();
    let e = open(&files, "d.vmdk").err().expect("refused");
    assert!(e.to_string().contains("offset"), "{e}");
}

/// Block status walked a sparse extent grain by grain, even where no grain
/// table exists or past the extent's own capacity: minutes for a large
/// empty disk. It now steps over whole missing tables.
#[test]
fn status_of_large_empty_sparse_disks_is_quick() {
    let bases = bases();
    let base = bases.iter().find(|b| b.what == "seSparse").unwrap();
    // SEsparse of 2 TiB: the 1 MiB directory of the small image covers it.
    let mut files = base.files.clone();
    let cap: u64 = 131_072 * 32_768;
    files[1].1[16..24].copy_from_slice(&cap.to_le_bytes());
    let text = String::from_utf8(files[0].1.clone()).unwrap();
    files[0].1 = text.replace("RW 8192 ", &format!("RW {cap} ")).into_bytes();
    // The same small extent declared 128 TiB long in the descriptor.
    let mut files2 = base.files.clone();
    files2[0].1 = text.replace("RW 8192 ", "RW 274877906944 ").into_bytes();
    for files in [files, files2] {
        let b = install(&files);
        let img = VmdkImage::open_in(Arc::new(b), "d.vmdk", &OpenOptions::default()).unwrap();
        let t = std::time::Instant::now();
        let ext = img.block_status(0, img.size_bytes()).unwrap();
        assert_eq!(
            ext.iter().map(|e| e.len_bytes).sum::<u64>(),
            img.size_bytes()
        );
        assert!(ext.len() < 64, "{} runs", ext.len());
        assert!(
            t.elapsed() < std::time::Duration::from_secs(20),
            "block status of {} bytes took {:?}",
            img.size_bytes(),
            t.elapsed()
        );
    }
}
