//! Model-based test: random sequences of I/O, snapshot, clone, extend,
//! capacity growth and reopen, compared byte for byte with an in-memory model of every disk and
//! every snapshot, and `check` clean after each sequence.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;
use strata_block::{BlockDevice, Fill, ReadFill, ZeroOptions};
use strata_engine::{Datastore, FullClone, InitOptions, Provisioning, SpaceWork};
use strata_storage::SimBackend;

#[derive(Debug, Clone)]
enum Op {
    Write {
        disk: usize,
        sector: u64,
        sectors: u64,
        byte: u8,
    },
    Trim {
        disk: usize,
        sector: u64,
        sectors: u64,
    },
    Zero {
        disk: usize,
        sector: u64,
        sectors: u64,
    },
    Snap {
        disk: usize,
    },
    Revert {
        disk: usize,
        snap: usize,
    },
    DeleteSnap {
        disk: usize,
        snap: usize,
    },
    LinkedClone {
        disk: usize,
        snap: usize,
    },
    FullClone {
        disk: usize,
        snap: Option<usize>,
        thick: bool,
    },
    Extend {
        disk: usize,
        add_sectors: u64,
    },
    Remove {
        disk: usize,
    },
    /// Literal zeros through `write_at` (zero detection on thin disks).
    WriteZeros {
        disk: usize,
        sector: u64,
        sectors: u64,
    },
    Convert {
        disk: usize,
        to: u8,
    },
    PunchZero {
        disk: usize,
    },
    Defrag {
        disk: usize,
    },
    /// `defrag --free-space`: live grains move down, the pool end follows.
    FreeSpace,
    Flush,
    Reopen,
    Reclaim {
        budget: u64,
    },
    /// Try a capacity just below used + reserved (refused, nothing
    /// changes), then grow the capacity by `mib` MiB.
    Grow {
        mib: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let d = 0usize..4;
    prop_oneof![
        10 => (d.clone(), 0u64..20000, 1u64..300, any::<u8>()).prop_map(|(disk, sector, sectors, byte)| Op::Write { disk, sector, sectors, byte }),
        2 => (d.clone(), 0u64..20000, 1u64..3000).prop_map(|(disk, sector, sectors)| Op::Trim { disk, sector, sectors }),
        2 => (d.clone(), 0u64..20000, 1u64..3000).prop_map(|(disk, sector, sectors)| Op::Zero { disk, sector, sectors }),
        3 => d.clone().prop_map(|disk| Op::Snap { disk }),
        2 => (d.clone(), 0usize..8).prop_map(|(disk, snap)| Op::Revert { disk, snap }),
        2 => (d.clone(), 0usize..8).prop_map(|(disk, snap)| Op::DeleteSnap { disk, snap }),
        1 => (d.clone(), 0usize..8).prop_map(|(disk, snap)| Op::LinkedClone { disk, snap }),
        1 => (d.clone(), proptest::option::of(0usize..8), any::<bool>()).prop_map(|(disk, snap, thick)| Op::FullClone { disk, snap, thick }),
        1 => (d.clone(), 1u64..5000).prop_map(|(disk, add_sectors)| Op::Extend { disk, add_sectors }),
        1 => d.clone().prop_map(|disk| Op::Remove { disk }),
        2 => (d.clone(), 0u64..20000, 1u64..3000).prop_map(|(disk, sector, sectors)| Op::WriteZeros { disk, sector, sectors }),
        1 => (d.clone(), 0u8..3).prop_map(|(disk, to)| Op::Convert { disk, to }),
        1 => d.clone().prop_map(|disk| Op::PunchZero { disk }),
        1 => d.prop_map(|disk| Op::Defrag { disk }),
        1 => Just(Op::FreeSpace),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        2 => (1u64..2000).prop_map(|budget| Op::Reclaim { budget }),
        1 => (1u64..256).prop_map(|mib| Op::Grow { mib }),
    ]
}

#[derive(Default)]
struct Model {
    /// disk name -> contents
    disks: BTreeMap<String, Vec<u8>>,
    /// disk name -> [(snapshot name, contents)], in creation order
    snaps: BTreeMap<String, Vec<(String, Vec<u8>)>>,
    next: u32,
}

fn open(b: &SimBackend) -> Datastore {
    common::open_sim(b)
}

fn pattern(byte: u8, sector: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| byte ^ ((sector as usize * 512 + i) / 512) as u8 ^ (i as u8).rotate_left(3))
        .collect()
}

/// A whole-disk read reports as zeros exactly the holes block status
/// reports (from its own lookup, not by asking again).
fn assert_fill_matches_status(h: &dyn BlockDevice, fill: &ReadFill, what: &str) {
    let mut want = ReadFill::new();
    let size = h.size_bytes();
    let mut at = 0;
    while at < size {
        for x in h.block_status(at, size - at).unwrap() {
            want.push(x.len_bytes, if x.hole { Fill::Zeros } else { Fill::Data });
            at += x.len_bytes;
        }
    }
    assert_eq!(*fill, want, "read fill of {what}");
}

/// No grain the disk's head maps reads all zeros (after punchzero or a
/// convert to thin).
fn assert_no_zero_grains(ds: &Datastore, name: &str) {
    let h = ds.open_disk(name).unwrap();
    let size = h.size_bytes();
    let mut buf = vec![0u8; size as usize];
    h.read_at(&mut buf, 0).unwrap();
    let mut at = 0u64;
    for x in h.block_status(0, size).unwrap() {
        if !x.hole {
            let mut g = at;
            while g < at + x.len_bytes {
                let end = (g + 4096).min(size) as usize;
                assert!(
                    buf[g as usize..end].iter().any(|&b| b != 0),
                    "{name}: grain at {g} reads all zeros but is still mapped"
                );
                g += 4096;
            }
        }
        at += x.len_bytes;
    }
}

/// Reclaim everything and make it durable; the used bytes then.
fn settle(ds: &Datastore) -> u64 {
    while ds.reclaim(u64::MAX).unwrap() {}
    ds.flush().unwrap();
    ds.info().used_bytes
}

fn verify(ds: &Datastore, model: &Model) {
    for (name, data) in &model.disks {
        let h = ds.open_disk(name).unwrap();
        assert_eq!(h.size_bytes(), data.len() as u64, "size of {name}");
        let mut buf = vec![0u8; data.len()];
        let fill = h.read_at(&mut buf, 0).unwrap();
        assert_fill_matches_status(&*h, &fill, name);
        assert!(
            buf == *data,
            "contents of disk {name} differ from the model"
        );
        for (sn, sdata) in model.snaps.get(name).into_iter().flatten() {
            let t = format!("{name}@{sn}");
            let h = ds.open_disk(&t).unwrap();
            let mut buf = vec![0u8; sdata.len()];
            h.read_at(&mut buf, 0).unwrap();
            assert!(
                buf == *sdata,
                "contents of snapshot {t} differ from the model"
            );
        }
    }
    let listed: Vec<String> = ds.list_disks().into_iter().map(|d| d.name).collect();
    let expected: Vec<String> = model.disks.keys().cloned().collect();
    assert_eq!(listed, expected);
}

fn run(ops: Vec<Op>) {
    let b = SimBackend::new();
    Datastore::init(
        Arc::new(b.clone()),
        &InitOptions {
            capacity_bytes: 1 << 30,
        },
    )
    .unwrap();
    let mut ds = open(&b);
    let mut model = Model::default();
    for (i, size) in [(0, 1u64 << 20), (1, 3 << 20)] {
        let name = format!("d{i}");
        ds.create_disk(&name, size, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        model.disks.insert(name.clone(), vec![0; size as usize]);
        model.snaps.insert(name, vec![]);
    }
    let mut capacity = 1u64 << 30;
    for (i, op) in ops.into_iter().enumerate() {
        let names: Vec<String> = model.disks.keys().cloned().collect();
        if names.is_empty() {
            break;
        }
        let pick = |i: usize| names[i % names.len()].clone();
        match op {
            Op::Write {
                disk,
                sector,
                sectors,
                byte,
            } => {
                let name = pick(disk);
                let data = model.disks.get_mut(&name).unwrap();
                let total = data.len() as u64 / 512;
                let sector = sector % total;
                let sectors = sectors.min(total - sector);
                let buf = pattern(byte, sector, (sectors * 512) as usize);
                ds.open_disk(&name)
                    .unwrap()
                    .write_at(&buf, sector * 512, byte % 7 == 0)
                    .unwrap();
                data[(sector * 512) as usize..((sector + sectors) * 512) as usize]
                    .copy_from_slice(&buf);
            }
            Op::Trim {
                disk,
                sector,
                sectors,
            }
            | Op::Zero {
                disk,
                sector,
                sectors,
            }
            | Op::WriteZeros {
                disk,
                sector,
                sectors,
            } => {
                let name = pick(disk);
                let data = model.disks.get_mut(&name).unwrap();
                let total = data.len() as u64 / 512;
                let sector = sector % total;
                let sectors = sectors.min(total - sector);
                let h = ds.open_disk(&name).unwrap();
                match op {
                    Op::Trim { .. } => h.unmap(sector * 512, sectors * 512).unwrap(),
                    Op::Zero { .. } => h
                        .write_zeroes(sector * 512, sectors * 512, ZeroOptions::default())
                        .unwrap(),
                    // Literal zeros as data: zero detection on thin disks.
                    _ => h
                        .write_at(&vec![0u8; (sectors * 512) as usize], sector * 512, false)
                        .unwrap(),
                }
                data[(sector * 512) as usize..((sector + sectors) * 512) as usize].fill(0);
            }
            Op::Snap { disk } => {
                let name = pick(disk);
                model.next += 1;
                let sn = format!("s{}", model.next);
                ds.snapshot_create(&name, &sn, "model").unwrap();
                let data = model.disks[&name].clone();
                model.snaps.get_mut(&name).unwrap().push((sn, data));
            }
            Op::Revert { disk, snap } => {
                let name = pick(disk);
                let snaps = &model.snaps[&name];
                if snaps.is_empty() {
                    continue;
                }
                let (sn, data) = snaps[snap % snaps.len()].clone();
                ds.snapshot_revert(&name, &sn).unwrap();
                model.disks.insert(name, data);
            }
            Op::DeleteSnap { disk, snap } => {
                let name = pick(disk);
                let snaps = model.snaps.get_mut(&name).unwrap();
                if snaps.is_empty() {
                    continue;
                }
                let (sn, _) = snaps.remove(snap % snaps.len());
                // What the snapshot holds, read while earlier deletions may
                // still be orphans, is exactly what deleting it frees.
                let figure = ds
                    .snapshot_list(&name)
                    .unwrap()
                    .into_iter()
                    .find(|s| s.name == sn)
                    .unwrap()
                    .exclusive_bytes
                    .unwrap();
                let used = settle(&ds);
                ds.snapshot_delete(&name, &sn).unwrap();
                let freed = used - settle(&ds);
                assert_eq!(
                    freed, figure,
                    "deleting {name}@{sn} freed {freed}, figure {figure}"
                );
            }
            Op::LinkedClone { disk, snap } => {
                let name = pick(disk);
                let snaps = &model.snaps[&name];
                if snaps.is_empty() || model.disks.len() >= 8 {
                    continue;
                }
                let (sn, data) = snaps[snap % snaps.len()].clone();
                model.next += 1;
                let new = format!("c{}", model.next);
                ds.clone_linked(&format!("{name}@{sn}"), &new).unwrap();
                model.disks.insert(new.clone(), data);
                model.snaps.insert(new, vec![]);
            }
            Op::FullClone { disk, snap, thick } => {
                let name = pick(disk);
                if model.disks.len() >= 8 {
                    continue;
                }
                let snaps = &model.snaps[&name];
                let (src, data) = match snap {
                    Some(s) if !snaps.is_empty() => {
                        let (sn, data) = snaps[s % snaps.len()].clone();
                        (format!("{name}@{sn}"), data)
                    }
                    _ => (name.clone(), model.disks[&name].clone()),
                };
                model.next += 1;
                let new = format!("f{}", model.next);
                let prov = if thick {
                    Provisioning::Eagerzeroedthick
                } else {
                    Provisioning::Thin
                };
                let c = FullClone {
                    source: &src,
                    name: &new,
                    provisioning: prov,
                    work: Default::default(),
                };
                ds.clone_full(&c, &mut |_, _| {}).unwrap();
                model.disks.insert(new.clone(), data);
                model.snaps.insert(new, vec![]);
            }
            Op::Extend { disk, add_sectors } => {
                let name = pick(disk);
                let data = model.disks.get_mut(&name).unwrap();
                let new = data.len() as u64 + add_sectors * 512;
                ds.extend_disk(&name, new).unwrap();
                data.resize(new as usize, 0);
            }
            Op::Remove { disk } => {
                let name = pick(disk);
                // Half of the removals check the disk's figure; the others
                // leave orphans half reclaimed for the ops that follow.
                if disk % 2 == 0 {
                    let figure = ds
                        .disk_info_with_space(&name)
                        .unwrap()
                        .exclusive_bytes
                        .unwrap();
                    let used = settle(&ds);
                    ds.remove_disk(&name).unwrap();
                    let freed = used - settle(&ds);
                    assert_eq!(
                        freed, figure,
                        "removing {name} freed {freed}, figure {figure}"
                    );
                } else {
                    ds.remove_disk(&name).unwrap();
                }
                model.disks.remove(&name);
                model.snaps.remove(&name);
            }
            Op::Convert { disk, to } => {
                let name = pick(disk);
                let to = [
                    Provisioning::Thin,
                    Provisioning::Zeroedthick,
                    Provisioning::Eagerzeroedthick,
                ][to as usize];
                let info = ds
                    .convert_disk(&name, to, &SpaceWork::default(), &mut |_, _| {})
                    .unwrap();
                assert_eq!(info.provisioning, to);
                let grains = info.size_bytes.div_ceil(4096);
                match to {
                    Provisioning::Eagerzeroedthick => {
                        assert_eq!(
                            info.allocated_bytes,
                            Some(grains * 4096),
                            "{name} eager: all mapped"
                        );
                        assert_eq!(info.tbz, Some(0));
                    }
                    Provisioning::Thin => assert_no_zero_grains(&ds, &name),
                    Provisioning::Zeroedthick => {}
                }
            }
            Op::PunchZero { disk } => {
                let name = pick(disk);
                let thick = ds.disk_info(&name).unwrap().provisioning.is_thick();
                match ds.punch_zero(&name, &SpaceWork::default(), &mut |_, _| {}) {
                    Ok(_) => {
                        assert!(!thick);
                        assert_no_zero_grains(&ds, &name);
                    }
                    Err(e) => assert!(thick, "punchzero of a thin disk failed: {e}"),
                }
            }
            Op::Defrag { disk } => {
                // Grains move, none are added or unshared (FORMAT.md §10);
                // the contents are checked with every other op's.
                let name = pick(disk);
                let used = ds.info().used_bytes;
                match ds.defrag_disk(&name, false, &SpaceWork::default(), &mut |_, _| {}) {
                    Ok(r) => {
                        assert_eq!(r.grains_kept, 0, "{r:?}");
                        assert_eq!(ds.info().used_bytes, used, "{name}: {r:?}");
                        assert_eq!(ds.disk_fragments(&name).unwrap().0, r.fragments_after);
                    }
                    Err(e) => assert_eq!(e.kind, strata_engine::ErrorKind::NoSpace, "{e}"),
                }
            }
            Op::FreeSpace => {
                let r = ds
                    .consolidate_free_space(&SpaceWork::default(), &mut |_, _| {})
                    .unwrap();
                assert_eq!(r.grains_kept, 0, "{r:?}");
                assert_eq!(ds.info().used_bytes, r.used_bytes);
                assert!(r.pool_bytes_after <= r.pool_bytes_before, "{r:?}");
            }
            Op::Flush => ds.flush().unwrap(),
            Op::Reclaim { budget } => {
                ds.reclaim(budget).unwrap();
            }
            Op::Grow { mib } => {
                // Below used + reserved: refused, nothing changes.
                let before = ds.info();
                let needed = before.used_bytes + before.reserved_bytes;
                if needed > 4096 {
                    let e = ds.set_capacity(needed - 4096).unwrap_err();
                    assert_eq!(e.kind, strata_engine::ErrorKind::NoSpace, "{e}");
                    assert_eq!(ds.info().capacity_bytes, capacity);
                }
                // Growing always works (the model's writes then keep fitting).
                capacity += mib << 20;
                assert_eq!(ds.set_capacity(capacity).unwrap().capacity_bytes, capacity);
            }
            Op::Reopen => {
                ds.close().unwrap();
                drop(ds);
                ds = open(&b);
            }
        }
        assert_eq!(ds.info().capacity_bytes, capacity, "capacity after {i}");
    }
    verify(&ds, &model);
    let report = ds.check().unwrap();
    assert!(
        report.is_clean(),
        "check found problems: {:#?}",
        report.errors
    );
    // Everything also survives a clean reopen.
    ds.close().unwrap();
    drop(ds);
    let ds = open(&b);
    verify(&ds, &model);
    let report = ds.check().unwrap();
    assert!(
        report.is_clean(),
        "check after reopen: {:#?}",
        report.errors
    );
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("STRATA_MODEL_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(200),
        max_shrink_iters: 2000,
        .. ProptestConfig::default()
    })]

    #[test]
    fn engine_matches_model(ops in proptest::collection::vec(op(), 1..60)) {
        run(ops);
    }
}

#[test]
fn deep_snapshot_chain_reads_every_level() {
    let mut ops = Vec::new();
    for i in 0..40u8 {
        ops.push(Op::Write {
            disk: 1,
            sector: (i as u64) * 97,
            sectors: 9,
            byte: i,
        });
        ops.push(Op::Snap { disk: 1 });
    }
    run(ops);
}
