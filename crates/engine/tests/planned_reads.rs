//! Reads planned for a ring (`BlockDevice::plan_read`, `--aio io_uring`,
//! from the direct descriptor under `--cache none`, else through the page
//! cache): the plan holds the I/O gate until the caller's
//! reads are in, and a caller that holds plans is told the device is busy
//! instead of being made to wait for a snapshot that waits for it (the
//! deadlock ARCHITECTURE.md's io_uring design closes). Writes are planned
//! (`plan_write`) only as overwrites in place under `--cache none`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_block::{AlignedBuf, BlockDevice, Fill, Planned};
use strata_engine::{Datastore, InitOptions, OpenOptions, Provisioning};
use strata_storage::FileBackend;

fn open(dir: &std::path::Path, direct_io: bool) -> Datastore {
    let opts = OpenOptions {
        direct_io,
        ..OpenOptions::default()
    };
    Datastore::open(Arc::new(FileBackend::new(dir)), &opts, None).unwrap()
}

/// A direct datastore in `dir` with a 1 MiB thin disk "d" whose grains 4
/// and 5 hold 7s (the data written, also returned).
fn seven_at_grain_4(
    dir: &std::path::Path,
) -> (Datastore, Arc<strata_engine::DiskHandle>, AlignedBuf) {
    Datastore::init(Arc::new(FileBackend::new(dir)), &InitOptions::default()).unwrap();
    let ds = open(dir, true);
    ds.create_disk("d", 1 << 20, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let d = ds.open_disk("d").unwrap();
    let mut data = AlignedBuf::zeroed(8192);
    data.fill(7);
    d.write_at(&data, 16384, false).unwrap();
    (ds, d, data)
}

#[test]
fn a_plan_names_the_pool_runs_fills_the_holes_and_holds_off_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, d, data) = seven_at_grain_4(dir.path());

    // Grain 3 is a hole, 4 and 5 hold data, 6 and 7 are holes.
    let mut buf = AlignedBuf::zeroed(5 * 4096);
    buf.fill(0xee);
    let plan = match d.plan_read(&mut buf, 12288, false) {
        Some(Ok(Planned::Plan(p))) => p,
        _ => panic!("a direct pool plans an aligned read"),
    };
    assert_eq!(plan.pieces.len(), 1, "{:?}", plan.pieces);
    assert_eq!(
        (plan.pieces[0].buf_offset, plan.pieces[0].len),
        (4096, 8192)
    );
    assert!(
        buf[..4096].iter().all(|&b| b == 0),
        "the hole before is zeros"
    );
    assert!(
        buf[12288..].iter().all(|&b| b == 0),
        "the hole after is zeros"
    );
    let runs: Vec<_> = plan.fill.runs().collect();
    assert_eq!(
        runs,
        vec![
            (0..4096, Fill::Zeros),
            (4096..12288, Fill::Data),
            (12288..20480, Fill::Zeros)
        ]
    );
    // Reading the piece where the plan says gives the data written.
    let mut got = AlignedBuf::zeroed(8192);
    assert_eq!(
        pread_at(plan.fd, &mut got, plan.pieces[0].file_offset),
        8192
    );
    assert_eq!(&got[..], &data[..]);

    // A snapshot waits for the gate the plan holds...
    let ds = Arc::new(ds);
    let snapper = {
        let ds = ds.clone();
        std::thread::spawn(move || ds.snapshot_create("d", "s", "").unwrap())
    };
    // ...and meanwhile a caller holding the plan is told the device is
    // busy rather than made to wait (it would wait for itself).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut other = AlignedBuf::zeroed(4096);
    loop {
        match d.plan_read(&mut other, 0, false) {
            Some(Ok(Planned::Busy)) => break,
            Some(Ok(Planned::Plan(_))) => {
                assert!(
                    Instant::now() < deadline,
                    "the snapshot never waited for the gate"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            _ => panic!("planning failed"),
        }
    }
    assert!(!snapper.is_finished(), "the snapshot passed a held plan");
    // Once the read is over the snapshot goes through, and plans again.
    drop(plan);
    snapper.join().unwrap();
    assert!(matches!(
        d.plan_read(&mut other, 0, false),
        Some(Ok(Planned::Plan(_)))
    ));

    // A misaligned request to a direct pool is not planned.
    let mut odd = AlignedBuf::zeroed(4096);
    assert!(d.plan_read(&mut odd[..512], 512, false).is_none());
    drop(d);
    drop(Arc::try_unwrap(ds).ok().unwrap());
    // A pool with the page cache plans through its buffered descriptor,
    // misaligned requests too; reading the pieces from it gives the data.
    let ds = open(dir.path(), false);
    let d = ds.open_disk("d").unwrap();
    let mut odd = vec![0xeeu8; 4096 + 512];
    let mut plan = match d.plan_read(&mut odd[512..], 16384 + 512, false) {
        Some(Ok(Planned::Plan(p))) => p,
        _ => panic!("a pool with the page cache plans a misaligned read"),
    };
    assert_eq!(plan.pieces.len(), 1, "{:?}", plan.pieces);
    let piece = plan.pieces[0];
    assert_eq!((piece.buf_offset, piece.len), (0, 4096));
    let mut got = vec![0u8; piece.len];
    assert_eq!(pread_at(plan.fd, &mut got, piece.file_offset), piece.len);
    assert!(got.iter().all(|&b| b == 7), "the piece names the data");
    plan.finish(true);
}

#[test]
fn only_overwrites_in_place_are_planned_and_a_snapshot_turns_them_back() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, d, _) = seven_at_grain_4(dir.path());

    // Grains 4 and 5 are the disk's own: an overwrite there is planned as
    // one run of the pool, and nobody else may plan that range meanwhile.
    let mut new = AlignedBuf::zeroed(8192);
    new.fill(9);
    let mut plan = match d.plan_write(&new, 16384, false) {
        Some(Ok(Planned::Plan(p))) => p,
        _ => panic!("an overwrite in place of a direct pool is planned"),
    };
    assert!(plan.write);
    assert_eq!(plan.pieces.len(), 1, "{:?}", plan.pieces);
    let piece = plan.pieces[0];
    assert_eq!((piece.buf_offset, piece.len), (0, 8192));
    assert!(
        d.plan_write(&new[..4096], 20480, false).is_none(),
        "a range a planned write holds goes to write_at, which waits for it"
    );
    assert_eq!(pwrite_at(plan.fd, &new, piece.file_offset), 8192);
    plan.finish(true);
    drop(plan);
    let mut back = AlignedBuf::zeroed(8192);
    d.read_at(&mut back, 16384).unwrap();
    assert!(
        back.iter().all(|&b| b == 9),
        "the planned write is read back"
    );

    // A hole to fill, zeros a thin disk does not store, a misaligned
    // request: left to write_at.
    let mut one = AlignedBuf::zeroed(4096);
    one.fill(3);
    assert!(
        d.plan_write(&one, 12288, false).is_none(),
        "grain 3 is a hole"
    );
    assert!(d
        .plan_write(&AlignedBuf::zeroed(4096), 16384, false)
        .is_none());
    assert!(d.plan_write(&one[..512], 16384 + 512, false).is_none());

    // After a snapshot grain 4 is shared: the write must copy, not plan.
    ds.snapshot_create("d", "s", "").unwrap();
    assert!(
        d.plan_write(&one, 16384, false).is_none(),
        "shared after a snapshot"
    );
    d.write_at(&one, 16384, false).unwrap();
    let plan = match d.plan_write(&one, 16384, false) {
        Some(Ok(Planned::Plan(p))) => p,
        _ => panic!("the copy is the disk's own again"),
    };
    assert_ne!(plan.pieces[0].file_offset, piece.file_offset, "a new grain");
    drop(plan);

    // The planned write is durable after a flush, and the snapshot kept
    // what it saw.
    ds.flush().unwrap();
    drop(d);
    drop(ds);
    let ds = open(dir.path(), true);
    let d = ds.open_disk("d").unwrap();
    d.read_at(&mut back, 16384).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 3));
    assert!(back[4096..].iter().all(|&b| b == 9));
    let snap = ds.open_disk("d@s").unwrap();
    snap.read_at(&mut back, 16384).unwrap();
    assert!(back.iter().all(|&b| b == 9), "the snapshot's data");

    // A pool with the page cache plans no write (the caller's writes go
    // through write_at, where buffered writes queue).
    drop((d, snap));
    drop(ds);
    let ds = open(dir.path(), false);
    let d = ds.open_disk("d").unwrap();
    assert!(d.plan_write(&new, 16384, false).is_none());
}

/// `pwrite(2)` on a raw descriptor the plan names (bytes written).
fn pwrite_at(fd: std::os::fd::RawFd, buf: &[u8], offset: u64) -> usize {
    // SAFETY: `buf` is valid for its length; `fd` is open while the plan lives.
    let n = unsafe { libc::pwrite(fd, buf.as_ptr().cast(), buf.len(), offset as libc::off_t) };
    assert!(n >= 0, "pwrite: {}", std::io::Error::last_os_error());
    n as usize
}

/// `pread(2)` on a raw descriptor the plan names (bytes read).
fn pread_at(fd: std::os::fd::RawFd, buf: &mut [u8], offset: u64) -> usize {
    // SAFETY: `buf` is valid for its length; `fd` is open while the plan lives.
    let n = unsafe {
        libc::pread(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            offset as libc::off_t,
        )
    };
    assert!(n >= 0, "pread: {}", std::io::Error::last_os_error());
    n as usize
}
