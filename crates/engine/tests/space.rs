//! A full datastore: writes get ENOSPC, nothing stored is damaged, and space
//! given back by trims is used again.

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
