//! Replays the committed corpora of the fuzz targets `datastore_pages` and
//! `datastore_open` (fuzz/corpus/) through `strata_engine::fuzzing`, as
//! the fuzz targets do: none may panic, the seeds cut from a real
//! datastore (`valid_*`) must decode, and the real datastores must open
//! and read back what was written.
//!
//! The seeds are written by `write_seeds` (ignored; run it to regenerate
//! them after a format change):
//! `cargo test -p strata-engine --test fuzz_corpus -- --ignored write_seeds`.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::catalog::Catalog;
use strata_engine::fuzzing::{self, PageKind, FILES};
use strata_engine::{Datastore, InitOptions, Provisioning};
use strata_format::{
    catalog_file, decode_batch_header, decode_map_node, journal_file, Superblock,
    BATCH_HEADER_BYTES, FILE_POOL, FILE_REFCOUNT, FILE_SUPER, GRAIN_BYTES, SUPER_SLOT_BYTES,
};
use strata_storage::FileBackend;

const DISK_BYTES: u64 = 4 << 20;
const KIB: usize = 1024;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| tag.wrapping_add((i / 4096) as u8).wrapping_mul(3) ^ (i as u8 & 0x1f))
        .collect()
}

/// What `d` holds after each step of `build`: the writes of step 1, of
/// step 2 (after the snapshot `s`), of step 3 (flushed, left in the log).
fn writes(step: u8) -> Vec<(u64, Vec<u8>)> {
    match step {
        1 => vec![
            (0, pattern(0x11, 64 * KIB)),
            (1 << 20, pattern(0x22, 16 * KIB)),
            (3 << 20, pattern(0x33, 8 * KIB)),
        ],
        2 => vec![(8 * KIB as u64, pattern(0x44, 8 * KIB))],
        _ => vec![
            (2 << 20, pattern(0x55, 4 * KIB)),
            (0, pattern(0x66, 4 * KIB)),
        ],
    }
}

/// `d` after steps `1..=last`.
fn contents(last: u8) -> Vec<u8> {
    let mut d = vec![0u8; DISK_BYTES as usize];
    for step in 1..=last {
        for (off, b) in writes(step) {
            d[off as usize..off as usize + b.len()].copy_from_slice(&b);
        }
    }
    d
}

fn open(dir: &Path) -> Datastore {
    common::open_dir(dir).unwrap()
}

fn apply(ds: &Datastore, step: u8, flush_each: bool) {
    let h = ds.open_disk("d").unwrap();
    for (off, b) in writes(step) {
        h.write_at(&b, off, false).unwrap();
        if flush_each {
            h.flush().unwrap();
        }
    }
}

/// A stopped datastore: thin disk `d` with snapshot `s`, checkpointed
/// pages, and flushed batches still in the log (open replays them).
fn build(dir: &Path) {
    Datastore::init(Arc::new(FileBackend::new(dir)), &InitOptions::default()).unwrap();
    let ds = open(dir);
    ds.create_disk("d", DISK_BYTES, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    apply(&ds, 1, false);
    ds.close().unwrap();
    drop(ds);
    let ds = open(dir);
    ds.snapshot_create("d", "s", "").unwrap();
    apply(&ds, 2, false);
    ds.close().unwrap();
    drop(ds);
    let ds = open(dir);
    apply(&ds, 3, true);
    // Dropped without close: the flushed batches stay in the log.
}

/// The same, opened and closed again with a linked clone `c` of `d@s`
/// and an empty zeroedthick disk `z`: a clean checkpoint, shared maps.
fn build_clone(dir: &Path) {
    build(dir);
    let ds = open(dir);
    ds.clone_linked("d@s", "c").unwrap();
    ds.create_disk("z", 1 << 20, Provisioning::Zeroedthick, &mut |_, _| {})
        .unwrap();
    ds.close().unwrap();
}

fn files(dir: &Path) -> Vec<Vec<u8>> {
    FILES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap_or_default())
        .collect()
}

/// The files as `fuzzing::open` takes them (the pool sparse).
fn joined(f: &[Vec<u8>]) -> Vec<u8> {
    let mut f = f.to_vec();
    let pool = f.last_mut().unwrap();
    *pool = fuzzing::sparse_pool(pool);
    fuzzing::join_files(&f.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

fn with(kind: PageKind, parts: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![kind.selector()];
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

/// Pages cut from the datastore in `dir`, named for `datastore_pages`.
fn pages_of(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let sup = std::fs::read(dir.join(FILE_SUPER)).unwrap();
    let sb = Superblock::pick(&sup[..SUPER_SLOT_BYTES], &sup[SUPER_SLOT_BYTES..]).unwrap();
    let slot = (sb.generation % 2) as usize * SUPER_SLOT_BYTES;
    let slot = &sup[slot..slot + SUPER_SLOT_BYTES];
    let cat = std::fs::read(dir.join(catalog_file(sb.generation))).unwrap();
    let cat = &cat[..sb.catalog_bytes as usize];
    let journal = std::fs::read(dir.join(journal_file(sb.generation))).unwrap();
    let h = decode_batch_header(&journal).expect("a batch in the log");
    let batch = &journal[..BATCH_HEADER_BYTES + h.payload_bytes as usize];
    let payload = &batch[BATCH_HEADER_BYTES..];
    let pool = std::fs::read(dir.join(FILE_POOL)).unwrap();
    let refs = std::fs::read(dir.join(FILE_REFCOUNT)).unwrap();
    let c = Catalog::decode(cat).unwrap();
    let d = c.disks.iter().find(|d| d.name == "d").unwrap();
    let v = c.versions.iter().find(|v| v.id == d.head).unwrap();
    let node = |g: u64| &pool[(g * GRAIN_BYTES) as usize..((g + 1) * GRAIN_BYTES) as usize];
    let root = v.root;
    let leaf = decode_map_node(node(root), root).unwrap().entries[0];
    assert!(decode_map_node(node(leaf), leaf).is_ok());
    let g = |x: u64| x.to_le_bytes();
    let page0 = &refs[..GRAIN_BYTES as usize];
    vec![
        ("valid_super_slot", with(PageKind::SuperSlot, &[slot])),
        (
            "valid_super_slot_fixed",
            with(PageKind::SuperSlotFixedCrc, &[slot]),
        ),
        ("valid_super_file", with(PageKind::SuperFile, &[&sup])),
        ("valid_batch", with(PageKind::Batch, &[batch])),
        ("valid_records", with(PageKind::Records, &[payload])),
        ("valid_journal", with(PageKind::Journal, &[&journal])),
        (
            "valid_map_root",
            with(PageKind::MapNode, &[&g(root), node(root)]),
        ),
        (
            "valid_map_leaf",
            with(PageKind::MapNode, &[&g(leaf), node(leaf)]),
        ),
        (
            "valid_map_leaf_fixed",
            with(PageKind::MapNodeFixedCrc, &[&g(leaf), node(leaf)]),
        ),
        (
            "valid_count_page",
            with(PageKind::CountPage, &[&g(0), page0]),
        ),
        (
            "valid_count_page_blank_ok",
            with(PageKind::CountPageBlankOk, &[&g(0), page0]),
        ),
        (
            "valid_count_page_fixed",
            with(PageKind::CountPageFixedCrc, &[&g(0), page0]),
        ),
        ("valid_catalog", with(PageKind::Catalog, &[cat])),
        (
            "blank_count_page",
            with(PageKind::CountPageBlankOk, &[&g(5), &[0u8; 4096]]),
        ),
    ]
    .into_iter()
    .map(|(n, b)| (n.to_string(), b))
    .collect()
}

/// Writes the seeds of both targets from datastores built here.
#[test]
#[ignore = "writes fuzz/corpus; run by hand to regenerate the seeds"]
fn write_seeds() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    build(a.path());
    build_clone(b.path());
    let open_dir = corpus("datastore_open");
    std::fs::create_dir_all(&open_dir).unwrap();
    std::fs::write(open_dir.join("valid_replay"), joined(&files(a.path()))).unwrap();
    std::fs::write(open_dir.join("valid_clone"), joined(&files(b.path()))).unwrap();
    let pages_dir = corpus("datastore_pages");
    std::fs::create_dir_all(&pages_dir).unwrap();
    for (name, bytes) in pages_of(a.path()) {
        std::fs::write(pages_dir.join(name), bytes).unwrap();
    }
}

/// Packed streams (docs/FORMAT.md §18.8) with real fragments, zstd and
/// LZ4, singles, pairs and quads (zstd): the first two grains of a stream whose first
/// grain spills into the second.
fn packed_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use strata_format::packed::{encode_stream, Codec, Piece};
    // Letters of an eight-letter alphabet at random: about 3 bits a
    // byte, so each grain compresses to some 1.5 KiB and the stream
    // spans grains.
    let plain = |i: usize, bytes: usize| {
        let mut x = 0x2545_f491_4f6c_dd1du64 ^ i as u64;
        (0..bytes)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b"strapack"[(x >> 40) as usize % 8]
            })
            .collect::<Vec<u8>>()
    };
    // The longest run of `spans` that `v` is aligned to, but every third
    // fragment a single; quads with zstd (LZ4 keeps too little of them).
    let seed = |spans: &[u8]| {
        let (mut v, mut made) = (1000u64, Vec::new());
        for i in 0..12 {
            let span = spans
                .iter()
                .copied()
                .find(|&n| v.is_multiple_of(u64::from(n)) && i % 3 != 2)
                .unwrap_or(1);
            let bytes = 4096 * usize::from(span);
            let codec = if i % 3 == 0 && span < 4 {
                Codec::Lz4
            } else {
                Codec::Zstd
            };
            let c = match codec {
                Codec::Lz4 => lz4::block::compress(&plain(i, bytes), None, false).unwrap(),
                Codec::Zstd => zstd::bulk::compress(&plain(i, bytes), 19).unwrap(),
            };
            made.push((v, span, codec, c));
            v += u64::from(span);
        }
        let pieces: Vec<Piece<'_>> = made
            .iter()
            .map(|(v, span, codec, c)| Piece {
                v: *v,
                span: *span,
                codec: *codec,
                len: c.len(),
                stored: c,
            })
            .collect();
        let s = encode_stream(&pieces).unwrap();
        assert!(s.spills[0], "the seed's first grain spills");
        let read = s.starts.iter().filter(|&&g| g == 0).count();
        (s.grains[..8192].to_vec(), read)
    };
    vec![
        ("valid_singles", seed(&[]).0),
        ("valid_pairs", seed(&[2]).0),
        ("valid_quads", seed(&[4, 2]).0),
    ]
}

/// Writes the packed-grain target's seeds.
#[test]
#[ignore = "writes fuzz/corpus; run by hand to regenerate the seeds"]
fn write_packed_seeds() {
    let dir = corpus("packed_grain");
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in packed_seeds() {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
}

#[test]
fn every_packed_seed_reads_without_panic_and_the_valid_ones_read_whole() {
    let n = replay("packed_grain", |name, input| {
        let s = fuzzing::packed_grain(input);
        if name.starts_with("valid_") {
            let p = strata_format::packed::decode_packed(&input[..4096]).unwrap();
            // As given, and again with the CRC set (the same): every
            // fragment starting in the first grain, its spill included.
            assert!(s.decoded && s.decoded_fixed, "{name}: {s:?}");
            assert!(p.spills, "{name}");
            assert_eq!(s.fragments_read, 2 * p.fragments.len(), "{name}: {s:?}");
        }
    });
    assert!(n >= 2, "only {n} seeds");
    // The committed seeds are what the code makes now.
    for (name, bytes) in packed_seeds() {
        assert_eq!(
            std::fs::read(corpus("packed_grain").join(name)).unwrap(),
            bytes,
            "{name}"
        );
    }
    // One damaged byte anywhere in a fragment, its spilled rest in the
    // next grain included: it is refused by its CRC (never decompressed
    // to other bytes).
    for (_, good) in packed_seeds() {
        let p = strata_format::packed::decode_packed(&good[..4096]).unwrap();
        let whole = 2 * p.fragments.len();
        let q = strata_format::packed::decode_packed(&good[4096..]).unwrap();
        let mut at: Vec<usize> = p
            .fragments
            .iter()
            .map(|f| f.offset as usize + f.len as usize / 3)
            .filter(|&a| a < 4096)
            .collect();
        at.push(4096 + q.data_start() + q.carry_in as usize / 2);
        for a in at {
            let mut b = good.clone();
            b[a] ^= 0x20;
            let s = fuzzing::packed_grain(&b);
            assert!(s.fragments_read < whole, "{a}: {s:?}");
        }
    }
}

fn replay(target: &str, mut each: impl FnMut(&str, &[u8])) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(corpus(target)).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        each(&name, &std::fs::read(&path).unwrap());
        n += 1;
    }
    n
}

#[test]
fn every_page_seed_decodes_without_panic_and_the_real_ones_decode() {
    let n = replay("datastore_pages", |name, input| {
        let s = fuzzing::pages(input);
        if name.starts_with("valid_") || name.starts_with("blank_") {
            assert!(s.decoded, "{name}: {s:?}");
        }
    });
    assert!(n >= 14, "only {n} seeds");
}

#[test]
fn the_real_datastores_open_and_read_back_what_was_written() {
    let crc = |b: &[u8]| crc32c::crc32c(b);
    let (d3, s1) = (contents(3), contents(1));
    let n = replay("datastore_open", |name, input| {
        let s = fuzzing::open(input);
        if !name.starts_with("valid_") {
            return;
        }
        assert_eq!(s.open_error, None, "{name}");
        assert_eq!(s.check_errors, Some(vec![]), "{name}");
        assert!(s.wrote, "{name}: the write after check failed");
        let read = |t: &str| {
            let r = s
                .reads
                .iter()
                .find(|r| r.target == t)
                .unwrap_or_else(|| panic!("{name}: {t} not read: {s:?}"));
            assert!(r.whole && r.failed_reads == 0, "{name}: {r:?}");
            r.crc
        };
        assert_eq!(read("d"), crc(&d3), "{name}: d");
        assert_eq!(read("d@s"), crc(&s1), "{name}: d@s");
        if name == "valid_clone" {
            assert_eq!(read("c"), crc(&s1), "{name}: c");
            assert_eq!(read("z"), crc(&[0u8; 1 << 20]), "{name}: z");
        }
    });
    assert!(n >= 2, "only {n} seeds");
}

/// Damaged copies of the real datastore: open or read fails, or reads
/// what was written; `fuzzing::open` never panics.
#[test]
fn damaged_datastores_are_refused_or_read_right() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let f = files(dir.path());
    let good = contents(3);
    for (i, file) in f.iter().enumerate() {
        for at in (0..file.len()).step_by(997.max(file.len() / 40)) {
            let mut g = f.clone();
            g[i][at] ^= 0x20;
            let s = fuzzing::open(&joined(&g));
            if let Some(r) = s.reads.iter().find(|r| r.target == "d") {
                // A flipped data byte reads back flipped (data grains carry
                // no checksum), and a damaged last log batch is a torn
                // tail (FORMAT.md §5); other damage never returns other
                // bytes than were written.
                let torn_tail_or_data = FILES[i] == FILE_POOL || FILES[i].starts_with("journal");
                if !torn_tail_or_data && r.failed_reads == 0 {
                    assert_eq!(r.crc, crc32c::crc32c(&good), "{} byte {at}", FILES[i]);
                }
            }
        }
    }
}
