//! A full datastore: writes get ENOSPC, nothing stored is damaged, and space
//! given back by trims is used again.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;

use strata_block::{BlockDevice, ErrorKind};
use strata_engine::{Datastore, InitOptions, OpenOptions, Provisioning};
use strata_storage::{Backend, SimBackend};

#[test]
fn full_datastore_gives_enospc_and_keeps_data() {
    let b = SimBackend::new();
    // 4 MiB of capacity for a 16 MiB thin disk: over-committed on purpose.
    Datastore::init(
        Arc::new(b.clone()),
        &InitOptions {
            capacity_bytes: 4 << 20,
        },
    )
    .unwrap();
    let ds = Datastore::open(
        Arc::new(b.clone()) as Arc<dyn Backend>,
        &OpenOptions::default(),
        None,
    )
    .unwrap();
    ds.create_disk("d", 16 << 20, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let h = ds.open_disk("d").unwrap();
    let chunk = 256 << 10;
    let mut written = 0u64;
    let err = loop {
        let data = vec![(written / chunk as u64) as u8 + 1; chunk];
        match h.write_at(&data, written, false) {
            Ok(()) => written += chunk as u64,
            Err(e) => break e,
        }
        assert!(written < 16 << 20, "capacity was never enforced");
    };
    assert_eq!(err.kind, ErrorKind::NoSpace, "{err}");
    assert!(written >= 3 << 20, "only {written} bytes fit in 4 MiB");
    // Everything acknowledged reads back; the failed write left nothing.
    let mut buf = vec![0u8; chunk];
    for i in 0..written / chunk as u64 {
        h.read_at(&mut buf, i * chunk as u64).unwrap();
        assert!(buf.iter().all(|&x| x == i as u8 + 1), "chunk {i} damaged");
    }
    h.read_at(&mut buf, written).unwrap();
    assert!(buf.iter().all(|&x| x == 0), "a refused write must not land");
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
    // Trim 1 MiB: the space comes back for new writes (no flush needed).
    h.unmap(0, 1 << 20).unwrap();
    h.write_at(&vec![0xAB; 1 << 20], written, false).unwrap();
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
    // A zeroed-thick disk cannot reserve what is not there.
    let e = ds
        .create_disk("t", 8 << 20, Provisioning::Zeroedthick, &mut |_, _| {})
        .unwrap_err();
    assert_eq!(e.kind, strata_engine::ErrorKind::NoSpace);
}

/// The log files do not keep the length of the longest generation ever
/// (FORMAT.md §5, checkpoint step 6): a generation of many small flushes
/// grows one file past 2 MiB; two checkpoints later, with little written,
/// both files are short again, and everything reads back after reopening.
#[test]
fn log_files_shrink_back_after_a_busy_generation() {
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
    let open = || {
        Datastore::open(
            Arc::new(b.clone()) as Arc<dyn Backend>,
            &OpenOptions::default(),
            None,
        )
        .unwrap()
    };
    let ds = open();
    ds.create_disk("d", 16 << 20, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let h = ds.open_disk("d").unwrap();
    let lens = || {
        [0, 1].map(|i| {
            b.open(strata_format::journal_file(i), false)
                .unwrap()
                .len()
                .unwrap()
        })
    };
    // Each flush is one batch padded to 4 KiB.
    for i in 0..700u64 {
        h.write_at(&[(i % 251) as u8 + 1; 4096], i * 4096, false)
            .unwrap();
        ds.flush().unwrap();
    }
    let busy = lens();
    assert!(busy.iter().any(|&l| l > 2 << 20), "{busy:?}");
    for round in 0..3u64 {
        ds.close().unwrap(); // a checkpoint; the datastore stays usable
        h.write_at(&[0xEE; 4096], (800 + round) * 4096, false)
            .unwrap();
        ds.flush().unwrap();
    }
    let quiet = lens();
    assert!(
        quiet.iter().all(|&l| l <= 1 << 20),
        "log files {busy:?} -> {quiet:?}"
    );
    drop(h);
    drop(ds);
    b.crash(3);
    let ds = open();
    let h = ds.open_disk("d").unwrap();
    let mut buf = vec![0u8; 4096];
    for i in [0u64, 350, 699] {
        h.read_at(&mut buf, i * 4096).unwrap();
        assert!(buf.iter().all(|&x| x == (i % 251) as u8 + 1), "grain {i}");
    }
    h.read_at(&mut buf, 802 * 4096).unwrap();
    assert!(buf.iter().all(|&x| x == 0xEE));
    assert!(ds.check().unwrap().is_clean());
}
