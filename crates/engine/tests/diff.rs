//! `changed_ranges` reports exactly the grains where two versions differ,
//! checked against reading both versions in full, across snapshots,
//! trims, a revert and an extend that adds a map level.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;

use rand::{Rng, SeedableRng};
use strata_block::{BlockDevice, ZeroOptions};
use strata_engine::{Datastore, InitOptions, OpenOptions, Provisioning};
use strata_storage::{Backend, SimBackend};

const G: u64 = 4096;
const UNMAP: ZeroOptions = ZeroOptions {
    may_unmap: true,
    fast_only: false,
    fua: false,
};

fn read_all(ds: &Datastore, target: &str) -> Vec<u8> {
    let h = ds.open_disk(target).unwrap();
    let mut buf = vec![0u8; h.size_bytes() as usize];
    h.read_at(&mut buf, 0).unwrap();
    buf
}

/// Grains where `b` differs from `a` (a shorter `a` reads zeros past its end),
/// and which of them `b` maps according to block status.
fn brute(ds: &Datastore, a: Option<&str>, b: &str) -> Vec<(u64, bool)> {
    let vb = read_all(ds, b);
    let va = a.map(|a| read_all(ds, a)).unwrap_or_default();
    let hb = ds.open_disk(b).unwrap();
    let mut out = Vec::new();
    for g in 0..(vb.len() as u64 / G) {
        let r = (g * G) as usize..((g + 1) * G) as usize;
        let old = va.get(r.clone()).unwrap_or(&[0u8; G as usize][..]);
        if old != &vb[r] {
            let st = hb.block_status(g * G, G).unwrap();
            out.push((g, !st[0].hole));
        }
    }
    out
}

fn reported(ds: &Datastore, a: Option<&str>, b: &str) -> Vec<(u64, bool)> {
    let mut out = Vec::new();
    for r in ds.changed_ranges(a, b).unwrap() {
        for g in (r.offset / G)..(r.offset + r.len).div_ceil(G) {
            out.push((g, r.mapped));
        }
    }
    out
}

#[test]
fn changed_ranges_match_a_full_comparison() {
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let ds = Datastore::open(
        Arc::new(b) as Arc<dyn Backend>,
        &OpenOptions::default(),
        None,
    )
    .unwrap();
    // 2 MiB = 512 grains: one leaf; the extend below needs a second level.
    ds.create_disk("d", 2 << 20, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let h = ds.open_disk("d").unwrap();
    let mut names: Vec<String> = Vec::new();
    for round in 0..6u8 {
        let size = h.size_bytes();
        for _ in 0..40 {
            let g = rng.gen_range(0..size / G);
            match rng.gen_range(0..4) {
                0 => h.unmap(g * G, G).unwrap(),
                // With unmap, as a trim: zeros kept allocated (NO_HOLE)
                // would be mapped grains that read like the empty disk.
                1 => h.write_zeroes(g * G, G, UNMAP).unwrap(),
                _ => h
                    .write_at(&vec![round + 1; G as usize], g * G, false)
                    .unwrap(),
            }
        }
        let n = format!("s{round}");
        ds.snapshot_create("d", &n, "").unwrap();
        names.push(n);
        if round == 3 {
            ds.extend_disk("d", 8 << 20).unwrap();
        }
        if round == 4 {
            ds.snapshot_revert("d", "s2").unwrap();
        }
    }
    // Live changes after the last snapshot too.
    h.write_at(&vec![99; G as usize], 5 * G, false).unwrap();
    h.unmap(7 * G, G).unwrap();
    let targets: Vec<String> = names
        .iter()
        .map(|n| format!("d@{n}"))
        .chain(["d".to_string()])
        .collect();
    for (i, to) in targets.iter().enumerate() {
        assert_eq!(
            reported(&ds, None, to),
            brute(&ds, None, to),
            "from empty to {to}"
        );
        for from in &targets[..i] {
            let want = brute(&ds, Some(from), to);
            let got = reported(&ds, Some(from), to);
            // changed_ranges compares maps, so it may also report grains
            // rewritten with the same bytes; it must never miss a difference.
            for w in &want {
                assert!(got.contains(w), "{from} -> {to}: missed grain {w:?}");
            }
            for g in &got {
                if !want.contains(g) {
                    let old = read_all(&ds, from);
                    let new = read_all(&ds, to);
                    let r = (g.0 * G) as usize..((g.0 + 1) * G) as usize;
                    assert_eq!(
                        old.get(r.clone()).unwrap_or(&[0; G as usize][..]),
                        &new[r],
                        "{from} -> {to}: grain {g:?}"
                    );
                }
            }
        }
    }
    assert!(ds.changed_ranges(Some("d@s5"), "d@s5").unwrap().is_empty());
    assert!(ds.check().unwrap().is_clean());
}
