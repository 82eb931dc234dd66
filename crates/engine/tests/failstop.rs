//! Fail-stop: an error after a change has begun (here, a count page that
//! cannot be read while a write copies a shared map node) stops every
//! further write, flush and metadata command with an error that gives the
//! cause, `info()` shows it, and reopening recovers everything flushed.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{Datastore, InitOptions, Provisioning};
use strata_storage::SimBackend;

const DISK_BYTES: u64 = 64 << 20;
const WRITTEN: usize = 8 << 20;

fn open(b: &SimBackend) -> Datastore {
    common::open_sim(b)
}

#[test]
fn an_error_inside_a_change_stops_writes_and_loses_nothing_flushed() {
    let mut stopped = 0;
    for after in 0..40u64 {
        let b = SimBackend::new();
        Datastore::init(Arc::new(b.clone()), &InitOptions::default()).unwrap();
        let data: Vec<u8> = (0..WRITTEN).map(|i| (i / 4096) as u8 ^ 0x5a).collect();
        {
            let ds = open(&b);
            ds.create_disk("d", DISK_BYTES, Provisioning::Thin, &mut |_, _| {})
                .unwrap();
            ds.open_disk("d")
                .unwrap()
                .write_at(&data, 0, false)
                .unwrap();
            ds.snapshot_create("d", "s", "").unwrap();
            ds.close().unwrap();
        }
        // Reopen with a cold cache; count pages now fail to read after a
        // few reads, while writes copy the shared leaves.
        let ds = open(&b);
        b.fail_reads_after(Some(strata_format::FILE_REFCOUNT), after);
        let h = ds.open_disk("d").unwrap();
        let mut failed = None;
        for i in 0..64u64 {
            if let Err(e) = h.write_at(&[0xEE; 4096], i * 128 * 1024, false) {
                failed = Some(e);
                break;
            }
        }
        b.heal_reads();
        if failed.is_some() {
            if let Some(f) = ds.info().fail_stop {
                stopped += 1;
                assert!(f.cause.contains("injected read failure"), "{f:?}");
                // Everything that would extend the log is refused now.
                let e = h.write_at(&[1; 4096], 0, false).unwrap_err();
                assert!(e.message.contains("stopped accepting writes"), "{e}");
                assert!(h.flush().is_err());
                assert!(ds.snapshot_create("d", "t", "").is_err());
                // Reads go on.
                let mut buf = vec![0u8; 4096];
                ds.open_disk("d@s").unwrap().read_at(&mut buf, 0).unwrap();
                assert_eq!(buf, data[..4096]);
            }
        }
        // A restart (the power goes, unflushed writes may go with it)
        // recovers the flushed state.
        drop((h, ds));
        b.crash(after);
        let ds = open(&b);
        let mut buf = vec![0u8; WRITTEN];
        ds.open_disk("d@s").unwrap().read_at(&mut buf, 0).unwrap();
        assert!(buf == data, "after {after} reads: the snapshot changed");
        ds.open_disk("d").unwrap().read_at(&mut buf, 0).unwrap();
        for (i, g) in buf.chunks(4096).enumerate() {
            assert!(
                g == &data[i * 4096..(i + 1) * 4096] || g == [0xEE; 4096],
                "after {after} reads: grain {i} of d holds bytes never written there"
            );
        }
        let r = ds.check().unwrap();
        assert!(r.is_clean(), "after {after} reads: {:#?}", r.errors);
        assert!(ds.info().fail_stop.is_none(), "reopening clears fail-stop");
    }
    assert!(
        stopped > 0,
        "no case reached a fail-stop: the test proves nothing"
    );
}
