//! `compress` (docs/FORMAT.md §18.5, §18.8) against the simulator: grains
//! that shrink by an eighth are packed into streams, every disk, snapshot
//! and clone reads the same bytes after, a write over a packed grain
//! makes it raw again without touching its neighbours, `check` verifies
//! every stream, a power cut in the middle leaves a consistent datastore
//! that running again finishes, and clients writing during the pass lose
//! nothing.
#![allow(clippy::too_many_lines)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{CompressReport, Datastore, DedupEstimate, PackCodec, Provisioning, SpaceWork};

const SIZE: u64 = 8 << 20;
const GRAIN: u64 = 4096;
const GRAINS: u64 = SIZE / GRAIN;

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Grain `g` of disk `tag`: letters of an eight-letter alphabet (about
/// 3 bits a byte: zstd keeps some 43%), every 5th grain noise (stays
/// raw), every 11th zeros (left to zero reclaim); an odd grain after a
/// multiple of 6 repeats the one before (a pair compresses together).
fn bytes(g: u64, tag: u8) -> Vec<u8> {
    let g = if g % 6 == 1 { g - 1 } else { g };
    let mut x = 0x2545_f491_4f6c_dd1d ^ g << 8 ^ u64::from(tag);
    if g % 11 == 3 {
        return vec![0; GRAIN as usize];
    }
    (0..GRAIN)
        .map(|_| {
            let r = xorshift(&mut x);
            if g % 5 == 1 {
                r as u8
            } else {
                b"diskpack"[(r >> 40) as usize % 8]
            }
        })
        .collect()
}

fn write(ds: &Datastore, disk: &str, grains: impl Iterator<Item = u64>, tag: u8) {
    let h = ds.open_disk(disk).unwrap();
    for g in grains {
        h.write_at(&bytes(g, tag), g * GRAIN, false).unwrap();
    }
    ds.flush().unwrap();
}

/// The pass with zstd, whose pairs and spills are the harder layout.
fn compress(ds: &Datastore, names: &[&str]) -> strata_engine::Result<CompressReport> {
    compress_with(ds, names, PackCodec::Zstd)
}

fn compress_with(
    ds: &Datastore,
    names: &[&str],
    codec: PackCodec,
) -> strata_engine::Result<CompressReport> {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    ds.compress(&names, codec, &SpaceWork::default(), &mut |_, _| {})
}

fn estimate(ds: &Datastore) -> DedupEstimate {
    ds.dedup_estimate(&[], &SpaceWork::default(), &mut |_, _| {})
        .unwrap()
}

const TARGETS: [&str; 5] = ["a", "a@s", "ac", "b", "t"];

/// "a" (all of it; a snapshot "s"; then every 3rd grain of its first
/// half written again with other bytes), "ac" (a linked clone of a@s
/// whose grains 100..150 are its own), "b" (the second half) and "t",
/// zeroed-thick (all of it: never packed).
fn disks(ds: &Datastore) {
    for (d, p) in [
        ("a", Provisioning::Thin),
        ("b", Provisioning::Thin),
        ("t", Provisioning::Zeroedthick),
    ] {
        ds.create_disk(d, SIZE, p, &mut |_, _| {}).unwrap();
    }
    write(ds, "a", 0..GRAINS, 1);
    ds.snapshot_create("a", "s", "").unwrap();
    write(ds, "a", (0..GRAINS / 2).filter(|g| g % 3 == 0), 2);
    ds.clone_linked("a@s", "ac").unwrap();
    write(ds, "ac", 100..150, 3);
    write(ds, "b", GRAINS / 2..GRAINS, 4);
    write(ds, "t", 0..GRAINS, 5);
}

fn read_every(ds: &Datastore) -> Vec<Vec<u8>> {
    TARGETS.iter().map(|t| common::read_all(ds, t)).collect()
}

fn assert_same(ds: &Datastore, want: &[Vec<u8>], what: &str) {
    for (t, w) in TARGETS.iter().zip(want) {
        assert!(
            common::read_all(ds, t) == *w,
            "{what}: the bytes of {t} changed"
        );
    }
    let report = ds.check().unwrap();
    assert!(report.is_clean(), "{what}: {:#?}", report.errors);
}

#[test]
fn grains_that_shrink_are_packed_and_read_back_everywhere() {
    packed_and_read_back(PackCodec::Zstd);
    packed_and_read_back(PackCodec::Lz4);
}

fn packed_and_read_back(codec: PackCodec) {
    let (b, ds) = common::new_sim(256 << 20);
    disks(&ds);
    let want = read_every(&ds);
    let before = estimate(&ds);
    assert_eq!((before.packed_bytes, before.packed_stored_bytes), (0, 0));
    let r = compress_with(&ds, &[], codec).unwrap();
    assert_eq!(r.codec, codec.as_str());
    // The estimate counts packed grains as stored (sharing unchanged)
    // and names their streams, exactly what the pass made.
    let after = estimate(&ds);
    assert_eq!(
        (after.logical_bytes, after.stored_bytes, after.shared_bytes),
        (
            before.logical_bytes,
            before.stored_bytes,
            before.shared_bytes
        ),
        "{after:#?}"
    );
    assert_eq!(after.packed_bytes, r.packed_bytes, "{after:#?} {r:#?}");
    assert_eq!(
        after.packed_stored_bytes, r.stream_bytes,
        "{after:#?} {r:#?}"
    );
    // Packed grains are read only where another grain is mapped at their
    // virtual grain (to be compared, §17.2b): here a@s's beside a's.
    assert!(after.read_bytes < before.read_bytes, "{after:#?}");
    assert!(after.read_bytes > before.read_bytes - r.packed_bytes);
    assert!(r.packed_bytes > 0 && r.raw_bytes > 0, "{r:#?}");
    // Pairs and quads with zstd only (§18.8, §18.9).
    assert_eq!(r.pair_bytes > 0, codec == PackCodec::Zstd, "{r:#?}");
    assert_eq!(r.quad_bytes > 0, codec == PackCodec::Zstd, "{r:#?}");
    assert!(r.pair_bytes + r.quad_bytes <= r.packed_bytes, "{r:#?}");
    assert_eq!(r.regions_skipped, 0, "{r:#?}");
    // zstd: some 43% of what was packed (less for pairs); LZ4 some 80%
    // of this test's bytes: under the eighth either way.
    let most = match codec {
        PackCodec::Zstd => r.packed_bytes / 2,
        PackCodec::Lz4 => r.packed_bytes * 7 / 8,
    };
    assert!(
        r.stream_bytes < most,
        "streams of {} for {}",
        r.stream_bytes,
        r.packed_bytes
    );
    assert_eq!(
        r.used_bytes_before - r.used_bytes_after,
        r.packed_bytes - r.stream_bytes,
        "{r:#?}"
    );
    assert_eq!(ds.info().used_bytes, r.used_bytes_after);
    assert_same(&ds, &want, "after the pass");
    // The thick disk kept its grains: a pass over it alone packs nothing.
    assert_eq!(compress(&ds, &["t"]).unwrap().packed_bytes, 0);
    // Nothing is left to pack, with either codec.
    let again = compress_with(&ds, &[], PackCodec::Lz4).unwrap();
    assert_eq!(again.packed_bytes, 0, "{again:#?}");
    let again = compress(&ds, &[]).unwrap();
    assert_eq!(again.packed_bytes, 0, "{again:#?}");
    assert_same(&ds, &want, "after a second pass");
    // A reopened datastore reads the same (the feature bit, the flags
    // and the counts are durable).
    drop(ds);
    let ds = common::open_sim(&b);
    assert_same(&ds, &want, "reopened");
    // Writes over packed grains: whole grains, a sector inside one (read
    // through its fragment first), one of a pair; neighbours keep their
    // bytes, snapshot and clone theirs.
    let mut want = want;
    let a = ds.open_disk("a").unwrap();
    for (g, at, len) in [
        (2u64, 0u64, 4096usize),
        (8, 512, 512),
        (9, 3584, 512),
        (20, 0, 8192),
    ] {
        let new: Vec<u8> = (0..len).map(|i| (i as u8) ^ 0x77 ^ g as u8).collect();
        let off = g * GRAIN + at;
        a.write_at(&new, off, false).unwrap();
        want[0][off as usize..off as usize + len].copy_from_slice(&new);
    }
    // A trim of packed grains.
    a.unmap(40 * GRAIN, 4 * GRAIN).unwrap();
    want[0][40 * 4096..44 * 4096].fill(0);
    ds.flush().unwrap();
    assert_same(&ds, &want, "after writes over packed grains");
    // Deleting the snapshot, the clone and a disk frees exactly: check
    // counts streams' continuations and flags.
    ds.remove_disk("ac").unwrap();
    ds.snapshot_delete("a", "s").unwrap();
    while ds.reclaim(1 << 20).unwrap() {}
    ds.flush().unwrap();
    let report = ds.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
    assert!(common::read_all(&ds, "a") == want[0]);
    ds.remove_disk("a").unwrap();
    ds.remove_disk("b").unwrap();
    while ds.reclaim(1 << 20).unwrap() {}
    ds.flush().unwrap();
    let report = ds.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
}

#[test]
fn a_power_cut_in_the_middle_of_the_pass_leaves_a_consistent_datastore() {
    for (seed, cut_at) in [(1u64, 1u64), (2, 3), (3, 6)] {
        let (b, ds) = common::new_sim(256 << 20);
        disks(&ds);
        let want = read_every(&ds);
        let whole = {
            let (_b2, other) = common::new_sim(256 << 20);
            disks(&other);
            compress(&other, &[]).unwrap().used_bytes_after
        };
        let mut cut = common::cut_at_call(&b, cut_at, seed);
        let r = ds.compress(&[], PackCodec::Zstd, &SpaceWork::default(), &mut cut);
        assert!(r.is_err(), "the cut after {cut_at} regions never came");
        drop(ds);
        let ds = common::open_sim(&b);
        let what = format!("cut after {cut_at} regions (seed {seed})");
        assert_same(&ds, &want, &what);
        // Running again finishes where one whole pass ends.
        compress(&ds, &[]).unwrap();
        assert_eq!(ds.info().used_bytes, whole, "{what}");
        assert_same(&ds, &want, &format!("{what}, then run again"));
    }
}

#[test]
fn clients_writing_during_the_pass_lose_nothing() {
    let (_b, ds) = common::new_sim(256 << 20);
    disks(&ds);
    let ds = Arc::new(ds);
    let writer = {
        let ds = ds.clone();
        std::thread::spawn(move || {
            let (a, b) = (ds.open_disk("a").unwrap(), ds.open_disk("b").unwrap());
            let mut want_a = common::read_all(&ds, "a");
            let mut want_b = common::read_all(&ds, "b");
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for i in 0..3000u64 {
                let r = xorshift(&mut x);
                let g = r % GRAINS;
                let (h, want) = if r & 1 == 0 {
                    (&a, &mut want_a)
                } else {
                    (&b, &mut want_b)
                };
                // Whole grains, and sectors inside packed ones.
                let (at, len) = if i % 4 == 0 { (1024, 512) } else { (0, 4096) };
                let new = &bytes(g, i as u8)[..len];
                let off = (g * GRAIN + at) as usize;
                h.write_at(new, off as u64, false).unwrap();
                want[off..off + len].copy_from_slice(new);
                if i % 500 == 0 {
                    h.flush().unwrap();
                }
            }
            (want_a, want_b)
        })
    };
    let mut packed = 0;
    for _ in 0..3 {
        packed += compress(&ds, &[]).unwrap().packed_bytes;
    }
    let (want_a, want_b) = writer.join().unwrap();
    assert!(packed > 0);
    assert!(common::read_all(&ds, "a") == want_a, "a");
    assert!(common::read_all(&ds, "b") == want_b, "b");
    let report = ds.check().unwrap();
    assert!(report.is_clean(), "{:#?}", report.errors);
}

/// Passes and writes taking turns (whole grains and sectors over packed
/// ones, which release streams and their spills): the counts stay exact
/// all along.
#[test]
fn writes_between_passes_keep_every_count_exact() {
    let (_b, ds) = common::new_sim(256 << 20);
    disks(&ds);
    let (a, b) = (ds.open_disk("a").unwrap(), ds.open_disk("b").unwrap());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..3 {
        compress(&ds, &[]).unwrap();
        let report = ds.check().unwrap();
        assert!(
            report.is_clean(),
            "round {round} after pass: {:#?}",
            report.errors
        );
        for i in 0..1000u64 {
            let r = xorshift(&mut x);
            let g = r % GRAINS;
            let h = if r & 1 == 0 { &a } else { &b };
            let (at, len) = if i % 4 == 0 { (1024, 512) } else { (0, 4096) };
            let new = &bytes(g, i as u8)[..len];
            h.write_at(new, g * GRAIN + at, false).unwrap();
            if i % 100 == 0 {
                let report = ds.check().unwrap();
                assert!(
                    report.is_clean(),
                    "round {round} write {i}: {:#?}",
                    report.errors
                );
            }
        }
    }
}

/// Large writes over packed grains release their streams a leaf's run at
/// a time (counts logged as they end, consecutive grains in one REF_RUN,
/// FORMAT.md §5): after a power cut, replay rebuilds every count exactly
/// and every flushed byte, whether the released grains were a stream's
/// (spills included), shared with a snapshot, or raw.
#[test]
fn large_writes_over_packed_grains_replay_exact_counts_after_a_power_cut() {
    for seed in [1u64, 2, 3] {
        let (b, ds) = common::new_sim(256 << 20);
        disks(&ds);
        compress(&ds, &[]).unwrap();
        let (a, bd) = (ds.open_disk("a").unwrap(), ds.open_disk("b").unwrap());
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ seed;
        // (disk index into TARGETS, start, end) of each write.
        let mut write_some = |n: u64| {
            let mut spans = Vec::new();
            for _ in 0..n {
                let r = xorshift(&mut x);
                let (h, t) = if r & 1 == 0 { (&a, 0) } else { (&bd, 3) };
                // 8 KiB to 512 KiB, a sector off a grain now and then.
                let len = 8192u64 << ((r >> 8) % 7);
                let align = if r & 2 == 0 { GRAIN } else { 512 };
                let at = (r >> 16) % (SIZE - len) / align * align;
                let data: Vec<u8> = (0..len / GRAIN)
                    .flat_map(|i| bytes(at / GRAIN + i, r as u8))
                    .collect();
                h.write_at(&data, at, false).unwrap();
                spans.push((t, at as usize, (at + len) as usize));
            }
            spans
        };
        write_some(40);
        ds.flush().unwrap();
        let report = ds.check().unwrap();
        assert!(report.is_clean(), "seed {seed}: {:#?}", report.errors);
        let mut want = read_every(&ds);
        // Writes never flushed: the cut may keep any of them or none, so
        // their bytes are left out of the comparison.
        let unflushed = write_some(10);
        b.crash(seed);
        drop((a, bd));
        drop(ds);
        let ds = common::open_sim(&b);
        let report = ds.check().unwrap();
        assert!(
            report.is_clean(),
            "seed {seed}, after the cut: {:#?}",
            report.errors
        );
        let mut got = read_every(&ds);
        for &(t, from, to) in &unflushed {
            want[t][from..to].fill(0);
            got[t][from..to].fill(0);
        }
        for ((t, w), g) in TARGETS.iter().zip(&want).zip(&got) {
            assert!(g == w, "seed {seed}: flushed bytes of {t} changed");
        }
    }
}

/// A disk written in order and packed reads its streams in order: its
/// fragments are about its regions', not one per packed grain (several
/// fragments of one stream grain continue a run, FORMAT.md §10.1).
#[test]
fn a_packed_disk_written_in_order_has_few_fragments() {
    let (_b, ds) = common::new_sim(64 << 20);
    ds.create_disk("s", 4 << 20, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let text: Vec<u8> = b"fragments of one stream grain read as one run. "
        .iter()
        .copied()
        .cycle()
        .take(4 << 20)
        .collect();
    let h = ds.open_disk("s").unwrap();
    h.write_at(&text, 0, false).unwrap();
    ds.flush().unwrap();
    assert_eq!(h.fragments().unwrap(), (1, 1024));
    let r = compress_with(&ds, &["s"], PackCodec::Lz4).unwrap();
    assert_eq!(r.packed_bytes, 4 << 20, "{r:#?}");
    let (fragments, mapped) = h.fragments().unwrap();
    assert_eq!(mapped, 1024);
    // One stream per region (1 MiB) at most.
    assert!((1..=4).contains(&fragments), "{fragments} fragments");
    assert_eq!(common::read_all(&ds, "s"), text);
}

/// Half-dead stream grains (FORMAT.md §18.10): packed, then three runs
/// of four grains of every four written over with noise (raw) while a snapshot keeps the
/// old fragments alive; a pass then moves nothing. Once the snapshot is
/// gone, a pass moves the live quarter into new streams and frees the old
/// grains; every byte reads the same, `check` is clean, and a power cut in
/// the middle of that pass leaves a datastore that running again finishes.
#[test]
fn half_dead_stream_grains_are_repacked_and_freed() {
    for codec in [PackCodec::Zstd, PackCodec::Lz4] {
        for cut in [None, Some(2u64)] {
            half_dead_repacked(codec, cut);
        }
    }
}

fn half_dead_repacked(codec: PackCodec, cut: Option<u64>) {
    let what = format!("{codec:?}, cut {cut:?}");
    let (b, ds) = common::new_sim(64 << 20);
    ds.create_disk("h", SIZE, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    // Text only (grains 0 mod 5 noise and zeros would stay raw).
    write(&ds, "h", 0..GRAINS, 9);
    let first = compress_with(&ds, &["h"], codec).unwrap();
    assert!(
        first.packed_bytes > GRAINS * GRAIN / 2,
        "{what}: {first:#?}"
    );
    assert_eq!(first.repacked_bytes, 0, "{what}");
    ds.snapshot_create("h", "s", "").unwrap();
    let h = ds.open_disk("h").unwrap();
    let mut x = 0x5151_7a7a_0f0f_e1e1u64;
    // Three of every four fragments: grains one by one with LZ4, whole
    // aligned fours with zstd (a run lives while any of its grains
    // does, and §18.10 moves it whole).
    let dies = |g: u64| match codec {
        PackCodec::Lz4 => !g.is_multiple_of(4),
        PackCodec::Zstd => !(g / 4).is_multiple_of(4),
    };
    for g in (0..GRAINS).filter(|&g| dies(g)) {
        let noise: Vec<u8> = (0..GRAIN / 8)
            .flat_map(|_| xorshift(&mut x).to_le_bytes())
            .collect();
        h.write_at(&noise, g * GRAIN, false).unwrap();
    }
    ds.flush().unwrap();
    let want = common::read_all(&ds, "h");
    // The snapshot still names every fragment: nothing is half-dead.
    let kept = compress_with(&ds, &["h"], codec).unwrap();
    assert_eq!(kept.repacked_bytes, 0, "{what}: {kept:#?}");
    ds.snapshot_delete("h", "s").unwrap();
    while ds.reclaim(1 << 20).unwrap() {}
    ds.flush().unwrap();
    let before = ds.info().used_bytes;
    let e0 = estimate(&ds);
    let ds = match cut {
        None => ds,
        Some(cut_at) => {
            let mut cut = common::cut_at_call(&b, cut_at, cut_at);
            let r = ds.compress(&[], codec, &SpaceWork::default(), &mut cut);
            assert!(r.is_err(), "{what}: the cut never came");
            drop(ds);
            let ds = common::open_sim(&b);
            assert!(common::read_all(&ds, "h") == want, "{what}: after the cut");
            let report = ds.check().unwrap();
            assert!(report.is_clean(), "{what}: {:#?}", report.errors);
            ds
        }
    };
    let r = compress_with(&ds, &["h"], codec).unwrap();
    let after = ds.info().used_bytes;
    let e1 = estimate(&ds);
    assert_eq!(r.packed_bytes, 0, "{what}: {r:#?}");
    assert!(cut.is_some() || r.repacked_bytes > 0, "{what}: {r:#?}");
    // The same live bytes in fewer stream grains, and exactly those
    // freed.
    assert_eq!(e1.packed_bytes, e0.packed_bytes, "{what}");
    assert!(
        e1.packed_stored_bytes < e0.packed_stored_bytes,
        "{what}: {e0:#?} {e1:#?}"
    );
    assert_eq!(
        before - after,
        e0.packed_stored_bytes - e1.packed_stored_bytes,
        "{what}"
    );
    assert!(
        common::read_all(&ds, "h") == want,
        "{what}: after repacking"
    );
    let report = ds.check().unwrap();
    assert!(report.is_clean(), "{what}: {:#?}", report.errors);
    // Nothing is half-dead any more.
    let again = compress_with(&ds, &["h"], codec).unwrap();
    assert_eq!(again.repacked_bytes, 0, "{what}: {again:#?}");
    assert_eq!(ds.info().used_bytes, after, "{what}");
}

/// Grain `g` of a text-like disk: words of a small vocabulary, so that a
/// quad of grains compresses together far better than its grains alone
/// (zstd's quads, FORMAT.md §18.9); every 7th grain noise, every 13th
/// zeros.
fn words(g: u64) -> Vec<u8> {
    const VOCAB: [&str; 24] = [
        "grain", "stream", "packed", "virtual", "snapshot", "clone", "region", "layer", "fragment",
        "spill", "count", "entry", "leaf", "pool", "commit", "batch", "read", "write", "zeros",
        "quad", "pair", "codec", "pass", "disk",
    ];
    let mut x = 0x9e37_79b9_7f4a_7c15 ^ g << 16;
    if g % 13 == 5 {
        return vec![0; GRAIN as usize];
    }
    let mut out = Vec::with_capacity(GRAIN as usize + 16);
    while out.len() < GRAIN as usize {
        let r = xorshift(&mut x);
        if g % 7 == 2 {
            out.push(r as u8);
        } else {
            out.extend_from_slice(VOCAB[(r >> 40) as usize % VOCAB.len()].as_bytes());
            out.push(b' ');
        }
    }
    out.truncate(GRAIN as usize);
    out
}

#[test]
fn the_estimate_predicts_what_each_codec_packs() {
    // The estimate packs its sample as the pass packs grains (quads and
    // pairs with zstd, zeros and noise left raw): its ratio for each
    // codec is the pass's within a few percent. A sample of single
    // grains alone put zstd well below what its quads reach.
    const SIZE: u64 = 32 << 20;
    for codec in [PackCodec::Zstd, PackCodec::Lz4] {
        let (_b, ds) = common::new_sim(256 << 20);
        ds.create_disk("w", SIZE, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let h = ds.open_disk("w").unwrap();
        for g in 0..SIZE / GRAIN {
            h.write_at(&words(g), g * GRAIN, false).unwrap();
        }
        drop(h);
        ds.flush().unwrap();
        let e = estimate(&ds);
        // One aligned quad in 64, less the zero grains (never stored).
        let quads = (0..SIZE / GRAIN).filter(|g| (g / 4) % 64 == 0 && g % 13 != 5);
        assert_eq!(e.compress_sampled_grains, quads.count() as u64, "{e:#?}");
        let sampled = (e.compress_sampled_grains * GRAIN) as f64;
        let predicted = match codec {
            PackCodec::Zstd => sampled / e.compress_sampled_bytes_after as f64,
            PackCodec::Lz4 => sampled / e.lz4_sampled_bytes_after as f64,
        };
        let r = compress_with(&ds, &[], codec).unwrap();
        let whole = (r.packed_bytes + r.raw_bytes) as f64;
        let made = whole / (r.stream_bytes + r.raw_bytes) as f64;
        assert!(
            (predicted / made - 1.0).abs() < 0.05,
            "{codec:?}: the estimate said {predicted:.3}x, the pass made {made:.3}x\n{e:#?}\n{r:#?}"
        );
    }
}

fn dedup(ds: &Datastore) -> strata_engine::Result<strata_engine::DedupReport> {
    ds.dedup(&[], &SpaceWork::default(), &mut |_, _| {})
}

/// Three copies of one image packed with `codec` ("p1", "p2" with a
/// snapshot "s", "p3"), and a fourth left raw ("r"), each with a few
/// grains of its own (every 29th, from the copy's tag).
fn packed_copies(ds: &Datastore, codec: PackCodec) -> [&'static str; 5] {
    for (d, tag) in [("p1", 1u8), ("p2", 2), ("p3", 3), ("r", 4)] {
        ds.create_disk(d, SIZE, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let h = ds.open_disk(d).unwrap();
        for g in 0..GRAINS {
            let b = if g % 29 == 7 {
                bytes(g, tag)
            } else {
                bytes(g, 0)
            };
            h.write_at(&b, g * GRAIN, false).unwrap();
        }
        drop(h);
        ds.flush().unwrap();
        if d == "p2" {
            ds.snapshot_create("p2", "s", "").unwrap();
        }
        if d != "r" {
            compress_with(ds, &[d], codec).unwrap();
        }
    }
    ["p1", "p2", "p2@s", "p3", "r"]
}

#[test]
fn packed_copies_are_re_shared_as_the_estimate_said() {
    // FORMAT.md §17.2b: disks packed before they were compared keep a
    // stream each; the pass points every copy at the oldest stream (the
    // others die whole and are freed) and frees the raw copy's grains
    // equal to a packed one.
    for codec in [PackCodec::Lz4, PackCodec::Zstd] {
        let what = format!("{codec:?}");
        let (_b, ds) = common::new_sim(256 << 20);
        let targets = packed_copies(&ds, codec);
        let want: Vec<Vec<u8>> = targets.iter().map(|t| common::read_all(&ds, t)).collect();
        let e0 = estimate(&ds);
        assert!(e0.same_offset_packed_bytes > 0, "{what}: {e0:#?}");
        let r = dedup(&ds).unwrap();
        assert_eq!(
            r.packed_merged_bytes, e0.same_offset_packed_bytes,
            "{what}: {r:#?}"
        );
        assert_eq!((r.grains_kept, r.regions_skipped), (0, 0), "{what}");
        assert_eq!(
            r.used_bytes_before - r.used_bytes_after,
            r.freed_bytes,
            "{what}"
        );
        for (t, w) in targets.iter().zip(&want) {
            assert!(common::read_all(&ds, t) == *w, "{what}: {t} changed");
        }
        let report = ds.check().unwrap();
        assert!(report.is_clean(), "{what}: {:#?}", report.errors);
        let e1 = estimate(&ds);
        // The raw copy's packable grains and the stream grains left with
        // no live fragment are freed, and nothing is left to merge.
        assert_eq!(
            r.freed_bytes,
            e0.same_offset_bytes + e0.packed_stored_bytes - e1.packed_stored_bytes,
            "{what}: {e0:#?} {e1:#?}"
        );
        assert_eq!(
            (e1.same_offset_bytes, e1.same_offset_packed_bytes),
            (0, 0),
            "{what}: {e1:#?}"
        );
        assert_eq!(dedup(&ds).unwrap().freed_bytes, 0, "{what}");
        // With LZ4 (one grain a fragment) the losing streams died whole,
        // but for the copies' own grains: about one copy's streams are
        // left. A zstd quad holding a copy's own grain stays alive, and
        // the next pass repacks those half-dead streams (§18.10), each
        // such quad whole.
        let e2 = if codec == PackCodec::Zstd {
            let c = compress_with(&ds, &["p1", "p2", "p3"], codec).unwrap();
            assert!(c.repacked_bytes > 0, "{what}: {c:#?}");
            let e2 = estimate(&ds);
            assert!(e2.packed_stored_bytes < e1.packed_stored_bytes, "{what}");
            e2
        } else {
            e1
        };
        assert!(
            e2.packed_stored_bytes * 2 < e0.packed_stored_bytes,
            "{what}: {e0:#?} {e2:#?}"
        );
        for (t, w) in targets.iter().zip(&want) {
            assert!(common::read_all(&ds, t) == *w, "{what}: {t} changed");
        }
        // A write to a re-shared packed grain redirects: its neighbours
        // keep their bytes.
        let h = ds.open_disk("p3").unwrap();
        h.write_at(&bytes(3, 9), 3 * GRAIN, false).unwrap();
        drop(h);
        ds.flush().unwrap();
        for (t, w) in targets.iter().zip(&want).filter(|(t, _)| **t != "p3") {
            assert!(common::read_all(&ds, t) == *w, "{what}: {t} changed");
        }
        assert!(ds.check().unwrap().is_clean(), "{what}");
    }
}

#[test]
fn a_power_cut_while_packed_copies_are_re_shared_leaves_a_consistent_datastore() {
    for (seed, cut_at) in [(1u64, 1u64), (2, 4)] {
        let what = format!("cut after {cut_at} regions");
        let (b, ds) = common::new_sim(256 << 20);
        let targets = packed_copies(&ds, PackCodec::Zstd);
        let want: Vec<Vec<u8>> = targets.iter().map(|t| common::read_all(&ds, t)).collect();
        let mut cut = common::cut_at_call(&b, cut_at, seed);
        let r = ds.dedup(&[], &SpaceWork::default(), &mut cut);
        assert!(r.is_err(), "{what}: the cut never came");
        drop(ds);
        let ds = common::open_sim(&b);
        for (t, w) in targets.iter().zip(&want) {
            assert!(common::read_all(&ds, t) == *w, "{what}: {t}");
        }
        let report = ds.check().unwrap();
        assert!(report.is_clean(), "{what}: {:#?}", report.errors);
        dedup(&ds).unwrap();
        let e = estimate(&ds);
        assert_eq!(
            (e.same_offset_bytes, e.same_offset_packed_bytes),
            (0, 0),
            "{what}: {e:#?}"
        );
        for (t, w) in targets.iter().zip(&want) {
            assert!(common::read_all(&ds, t) == *w, "{what}: {t}, run again");
        }
        assert!(ds.check().unwrap().is_clean(), "{what}");
    }
}

#[test]
fn free_space_consolidation_moves_streams_down_by_repacking_them() {
    // FORMAT.md §10.4 with §18.8: stream grains are not moved one by one
    // (a grain and its spill stay adjacent); a zone holding them has them
    // repacked below the new end, so the pool end comes down. The free
    // space below is one run, or (`holes`) first a thousand single
    // grains, where a fragment that spills does not fit, then pairs.
    for (codec, holes) in [
        (PackCodec::Lz4, false),
        (PackCodec::Zstd, false),
        (PackCodec::Lz4, true),
        (PackCodec::Zstd, true),
    ] {
        let what = format!("{codec:?}, holes {holes}");
        let (_b, ds) = common::new_sim(256 << 20);
        for d in ["low", "p"] {
            ds.create_disk(d, SIZE * 2, Provisioning::Thin, &mut |_, _| {})
                .unwrap();
        }
        write(&ds, "low", 0..2 * GRAINS, 7);
        write(&ds, "p", 0..GRAINS, 8);
        ds.snapshot_create("p", "s", "").unwrap();
        write(&ds, "p", (0..GRAINS).filter(|g| g % 3 == 0), 9);
        compress_with(&ds, &["p"], codec).unwrap();
        // Half-dead streams too: a third of the head's packed grains
        // written over.
        write(&ds, "p", (0..GRAINS).filter(|g| g % 3 == 1), 10);
        if holes {
            // No wholly free block: single free grains, then pairs.
            let low = ds.open_disk("low").unwrap();
            for g in (0..GRAINS).step_by(2) {
                low.unmap(g * GRAIN, GRAIN).unwrap();
            }
            for g in (GRAINS..2 * GRAINS).step_by(4) {
                low.unmap(g * GRAIN, 2 * GRAIN).unwrap();
            }
            drop(low);
        } else {
            ds.remove_disk("low").unwrap();
        }
        while ds.reclaim(1 << 20).unwrap() {}
        ds.flush().unwrap();
        let want = [common::read_all(&ds, "p"), common::read_all(&ds, "p@s")];
        let low = holes.then(|| common::read_all(&ds, "low"));
        let e0 = estimate(&ds);
        assert!(e0.packed_bytes > 0, "{what}");
        let r = ds
            .consolidate_free_space(&SpaceWork::default(), &mut |_, _| {})
            .unwrap();
        assert_eq!(r.note, None, "{what}: {r:#?}");
        assert!(r.repacked_bytes > 0, "{what}: {r:#?}");
        assert!(
            r.pool_bytes_after < r.pool_bytes_before * 2 / 3,
            "{what}: {r:#?}"
        );
        assert!(common::read_all(&ds, "p") == want[0], "{what}: p changed");
        if let Some(low) = low {
            assert!(common::read_all(&ds, "low") == low, "{what}: low changed");
        }
        assert!(
            common::read_all(&ds, "p@s") == want[1],
            "{what}: p@s changed"
        );
        let report = ds.check().unwrap();
        assert!(report.is_clean(), "{what}: {:#?}", report.errors);
        // The same packed grains, in no more stream grains than before;
        // in single free grains and pairs a stream is cut where a
        // fragment would spill, and takes some more (some 16% here).
        let e1 = estimate(&ds);
        assert_eq!(e1.packed_bytes, e0.packed_bytes, "{what}");
        let most = e0.packed_stored_bytes * if holes { 5 } else { 4 } / 4;
        assert!(e1.packed_stored_bytes <= most, "{what}: {e0:#?} {e1:#?}");
    }
}
