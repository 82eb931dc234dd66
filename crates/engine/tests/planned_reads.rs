//! Reads planned for a ring (`BlockDevice::plan_read`, `--aio io_uring`,
//! from the direct descriptor under `--cache none`, else through the page
//! cache): the plan holds the I/O gate until the caller's
//! reads are in, and a caller that holds plans is told the device is busy
//! instead of being made to wait for a snapshot that waits for it (the
//! deadlock ARCHITECTURE.md's io_uring design closes). Writes are planned
//! (`plan_write`) under `--cache none`: in place, or to new grains that
//! the plan installs when it is finished.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

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

/// The one plan `plan_write` gives for `buf` at `offset`.
fn planned_write(d: &strata_engine::DiskHandle, buf: &[u8], offset: u64) -> strata_block::IoPlan {
    match d.plan_write(buf, offset, false) {
        Some(Ok(Planned::Plan(p))) => p,
        Some(Ok(Planned::Busy)) => panic!("write at {offset}: busy"),
        Some(Err(e)) => panic!("write at {offset}: {e}"),
        None => panic!("write at {offset}: not planned"),
    }
}

/// Carry out a one-piece write plan as a transport would; the request's
/// outcome.
fn carry_out(mut plan: strata_block::IoPlan, buf: &[u8]) -> bool {
    assert!(plan.write);
    assert_eq!(plan.pieces.len(), 1, "{:?}", plan.pieces);
    let piece = plan.pieces[0];
    assert_eq!((piece.buf_offset, piece.len), (0, buf.len()));
    assert_eq!(pwrite_at(plan.fd, buf, piece.file_offset), buf.len());
    plan.finish(true)
}

fn read_back(d: &strata_engine::DiskHandle, offset: u64, len: usize) -> AlignedBuf {
    let mut back = AlignedBuf::zeroed(len);
    d.read_at(&mut back, offset).unwrap();
    back
}

#[test]
fn writes_are_planned_in_place_or_to_new_grains_installed_when_they_are_done() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, d, _) = seven_at_grain_4(dir.path());

    // Grains 4 and 5 are the disk's own: an overwrite there is planned as
    // one run of the pool, and nobody else may plan that range meanwhile.
    let mut new = AlignedBuf::zeroed(8192);
    new.fill(9);
    let plan = planned_write(&d, &new, 16384);
    let in_place = plan.pieces[0].file_offset;
    assert!(
        d.plan_write(&new[..4096], 20480, false).is_none(),
        "a range a planned write holds goes to write_at, which waits for it"
    );
    assert!(carry_out(plan, &new));
    assert!(read_back(&d, 16384, 8192).iter().all(|&b| b == 9));

    // Grain 3 is a hole: the write is planned to a new grain, which the
    // map names only once the write is done. A failed write gives the
    // grain back and leaves the hole.
    let mut one = AlignedBuf::zeroed(4096);
    one.fill(3);
    let mut plan = planned_write(&d, &one, 12288);
    let fresh = plan.pieces[0].file_offset;
    assert_ne!(fresh, in_place);
    assert_eq!(pwrite_at(plan.fd, &one, fresh), 4096);
    assert!(
        read_back(&d, 12288, 4096).iter().all(|&b| b == 0),
        "not installed before the plan is finished"
    );
    assert!(!plan.finish(false), "a failed write stays failed");
    drop(plan);
    assert!(read_back(&d, 12288, 4096).iter().all(|&b| b == 0));
    assert!(carry_out(planned_write(&d, &one, 12288), &one));
    assert!(read_back(&d, 12288, 4096).iter().all(|&b| b == 3));

    // Zeros a thin disk does not store, a misaligned request: left to
    // write_at.
    assert!(d
        .plan_write(&AlignedBuf::zeroed(4096), 16384, false)
        .is_none());
    assert!(d.plan_write(&one[..512], 16384 + 512, false).is_none());

    // After a snapshot grain 4 is shared: the write goes to a new grain,
    // and the snapshot keeps the old one.
    ds.snapshot_create("d", "s", "").unwrap();
    let plan = planned_write(&d, &one, 16384);
    assert_ne!(plan.pieces[0].file_offset, in_place, "a new grain");
    assert!(carry_out(plan, &one));
    // Now the disk's own again: in place.
    let again = planned_write(&d, &one, 16384);
    let copied = again.pieces[0].file_offset;
    assert!(carry_out(again, &one));
    assert_ne!(copied, in_place);

    // Durable after a flush; the snapshot kept what it saw; check is clean.
    ds.flush().unwrap();
    drop(d);
    drop(ds);
    let ds = open(dir.path(), true);
    let d = ds.open_disk("d").unwrap();
    let back = read_back(&d, 12288, 12288);
    assert!(back[..8192].iter().all(|&b| b == 3));
    assert!(back[8192..].iter().all(|&b| b == 9));
    let snap = ds.open_disk("d@s").unwrap();
    let back = read_back(&snap, 12288, 12288);
    assert!(back[..4096].iter().all(|&b| b == 3));
    assert!(back[4096..].iter().all(|&b| b == 9), "the snapshot's data");
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);

    // A write whose ring failed with it in flight may still land: its new
    // grain is neither installed nor given back, and the datastore stops.
    let mut lost = planned_write(&d, &one, 65536);
    lost.lose();
    assert!(!lost.finish(true), "a lost write is not answered as done");
    drop(lost);
    assert!(d.write_at(&one, 0, false).is_err(), "fail-stopped");

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

/// Carry out a read plan as the rings do (`strata_block::RingIo`): every
/// piece read into the plan's own buffer when it has one, else into
/// `buf`, then its `after_read` step; the request's outcome.
fn carry_out_read(mut plan: strata_block::IoPlan, buf: &mut [u8]) -> strata_block::BlockResult<()> {
    assert!(!plan.write);
    let fd = plan.fd;
    let pieces = plan.pieces.clone();
    let mut source = plan.source.take();
    {
        let dest: &mut [u8] = match source.as_mut() {
            Some(s) => s,
            None => buf,
        };
        for p in &pieces {
            let n = pread_at(
                fd,
                &mut dest[p.buf_offset..p.buf_offset + p.len],
                p.file_offset,
            );
            assert_eq!(n, p.len, "a piece past the pool's end: {p:?}");
        }
    }
    let r = match plan.after_read.take() {
        Some(f) => f(buf, source.as_deref().unwrap_or(&[])),
        None => Ok(()),
    };
    assert!(plan.finish(r.is_ok()) == r.is_ok());
    r
}

/// One grain of text that compresses (different for every `g`), or of
/// noise that does not.
fn grain_of(g: u64, text: bool) -> Vec<u8> {
    let mut x = g.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..4096u64)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if text {
                b"packed grains read through a plan "[((i + g) % 34) as usize]
                    ^ u8::from(x.is_multiple_of(3))
            } else {
                x as u8
            }
        })
        .collect()
}

/// Packed grains (FORMAT.md §18.8) read through a plan as `read_at`
/// reads them: requests of every shape over packed grains (zstd's pairs
/// and spills, LZ4's singles), raw ones, holes and zeros, from the direct
/// descriptor (aligned requests) and through the page cache (sectors);
/// a damaged stream grain fails the request, never answers other bytes.
#[test]
fn packed_grains_read_through_a_plan_as_read_at_reads_them() {
    for (direct, codec) in [
        (true, strata_engine::PackCodec::Zstd),
        (false, strata_engine::PackCodec::Zstd),
        (true, strata_engine::PackCodec::Lz4),
    ] {
        let dir = tempfile::tempdir().unwrap();
        Datastore::init(
            Arc::new(FileBackend::new(dir.path())),
            &InitOptions::default(),
        )
        .unwrap();
        let ds = open(dir.path(), direct);
        let size = 4u64 << 20;
        ds.create_disk("p", size, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        let d = ds.open_disk("p").unwrap();
        // Text mostly, noise every 7th grain, zeros every 11th, holes
        // every 13th.
        for g in 0..size / 4096 {
            if g % 13 == 0 {
                continue;
            }
            let b = match g % 11 {
                0 => vec![0u8; 4096],
                _ => grain_of(g, g % 7 != 0),
            };
            let mut a = AlignedBuf::zeroed(4096);
            a.copy_from_slice(&b);
            d.write_at(&a, g * 4096, false).unwrap();
        }
        ds.flush().unwrap();
        let r = ds
            .compress(
                &[],
                codec,
                &strata_engine::SpaceWork::default(),
                &mut |_, _| {},
            )
            .unwrap();
        assert!(r.packed_bytes > size / 2, "{r:?}");
        let mut x = 0x5eed_u64;
        let mut next = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let unit = if direct { 4096 } else { 512 };
        let mut planned = 0;
        for i in 0..400 {
            let len = match i % 4 {
                0 => unit,
                1 => 4096,
                _ => (1 + next(64)) * unit,
            };
            let off = next((size - len) / unit + 1) * unit;
            let mut want = AlignedBuf::zeroed(len as usize);
            d.read_at(&mut want, off).unwrap();
            let mut got = AlignedBuf::zeroed(len as usize);
            got.fill(0xee);
            match d.plan_read(&mut got, off, true) {
                Some(Ok(Planned::Plan(plan))) => {
                    carry_out_read(plan, &mut got)
                        .unwrap_or_else(|e| panic!("{len} at {off}: {e}"));
                    planned += 1;
                }
                other => panic!("{len} at {off}: not planned ({})", other.is_some()),
            }
            assert!(
                got[..] == want[..],
                "{len} bytes at {off}, direct {direct}, {codec:?}"
            );
        }
        assert_eq!(planned, 400);

        // Damage inside the first packed stream grain a plan reads: the
        // request fails naming the grain, as read_at does.
        let mut probe = AlignedBuf::zeroed(4096);
        let plan = match d.plan_read(&mut probe, 4096, true) {
            Some(Ok(Planned::Plan(p))) => p,
            _ => panic!("not planned"),
        };
        assert!(plan.source.is_some(), "grain 1 is packed text");
        let at = plan.pieces[0].file_offset;
        drop(plan);
        let mut g = AlignedBuf::zeroed(4096);
        assert_eq!(pread_at(d_fd(&d), &mut g, at), 4096);
        for b in &mut g[200..264] {
            *b ^= 0x5a;
        }
        assert_eq!(pwrite_at(d_fd(&d), &g, at), 4096);
        let mut got = AlignedBuf::zeroed(4096);
        got.fill(0xee);
        let plan = match d.plan_read(&mut got, 4096, true) {
            Some(Ok(Planned::Plan(p))) => p,
            _ => panic!("not planned"),
        };
        let e = carry_out_read(plan, &mut got).unwrap_err();
        assert_eq!(e.kind, strata_block::Kind::Corrupt, "{e}");
        assert!(e.to_string().contains("packed grain"), "{e}");
        let e = d.read_at(&mut got, 4096).unwrap_err();
        assert_eq!(e.kind, strata_block::Kind::Corrupt, "{e}");
    }
}

/// The pool's descriptor a read plan of `d` names.
fn d_fd(d: &strata_engine::DiskHandle) -> std::os::fd::RawFd {
    let mut b = AlignedBuf::zeroed(4096);
    match d.plan_read(&mut b, 0, true) {
        Some(Ok(Planned::Plan(p))) => p.fd,
        _ => panic!("not planned"),
    }
}
