//! Many threads writing 512-byte sectors that share 4 KiB grains (so every
//! write is a read-modify-write of a grain someone else is writing too),
//! while another thread takes, deletes and reclaims snapshots and trims.
//! Every sector must end with its owner's last write, and `check` be clean.

use std::sync::{Arc, Barrier};

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, OpenOptions, Provisioning};
use strata_storage::{Backend, SimBackend};

const WRITERS: u64 = 4;
const GRAINS: u64 = 64;

fn sector(writer: u64, grain: u64, round: u32) -> Vec<u8> {
    let mut v = vec![0u8; 512];
    v[..8].copy_from_slice(&writer.to_le_bytes());
    v[8..16].copy_from_slice(&grain.to_le_bytes());
    v[16..20].copy_from_slice(&round.to_le_bytes());
    v
}

#[test]
fn concurrent_subgrain_writes_and_snapshots_lose_nothing() {
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let ds = Datastore::open(
        Arc::new(b.clone()) as Arc<dyn Backend>,
        &OpenOptions {
            cache_bytes: 64 * 4096,
        },
        None,
    )
    .unwrap();
    ds.create_disk("d", GRAINS * 4096, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let rounds = 200u32;
    // Every round starts right after a snapshot, so every grain is shared
    // and the first writes of all writers race to copy it.
    let barrier = Arc::new(Barrier::new(WRITERS as usize + 1));
    let mut threads = Vec::new();
    for w in 0..WRITERS {
        let h = ds.open_disk("d").unwrap();
        let barrier = barrier.clone();
        threads.push(std::thread::spawn(move || {
            for round in 1..=rounds {
                barrier.wait();
                for g in 0..GRAINS {
                    // Writer w owns sectors w and w+4 of every grain.
                    for s in [w, w + WRITERS] {
                        h.write_at(&sector(w, g, round), g * 4096 + s * 512, false)
                            .unwrap();
                    }
                }
                barrier.wait();
            }
        }));
    }
    let admin = {
        let ds = ds.clone();
        std::thread::spawn(move || {
            let mut n = 0u32;
            for _ in 0..rounds {
                barrier.wait(); // writers start
                barrier.wait(); // writers done
                n += 1;
                ds.snapshot_create("d", &format!("s{n}"), "").unwrap();
                if n > 2 {
                    ds.snapshot_delete("d", &format!("s{}", n - 2)).unwrap();
                }
                ds.reclaim(500).unwrap();
                if n.is_multiple_of(5) {
                    ds.flush().unwrap();
                }
            }
            n
        })
    };
    for t in threads {
        t.join().unwrap();
    }
    let snaps = admin.join().unwrap();
    assert_eq!(snaps, rounds);
    let h = ds.open_disk("d").unwrap();
    let mut buf = vec![0u8; (GRAINS * 4096) as usize];
    h.read_at(&mut buf, 0).unwrap();
    for g in 0..GRAINS {
        for s in 0..8u64 {
            let off = (g * 4096 + s * 512) as usize;
            let got = &buf[off..off + 512];
            assert_eq!(
                got,
                &sector(s % WRITERS, g, rounds)[..],
                "grain {g} sector {s}"
            );
        }
    }
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
    ds.close().unwrap();
    assert_eq!(ds.info().reclaiming, 0);
}
