//! Unit tests of the storage crate (lib.rs, file.rs, sim.rs).

use std::fs::File;
use std::os::unix::io::AsRawFd;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use strata_block::AlignedBuf;

use super::*;

/// A cache-none handle reads and writes the same bytes as a buffered
/// one at any offset, length and buffer alignment (aligned I/O goes
/// straight through, the rest read-modify-writes whole blocks), and
/// its aligned reads really bypass the page cache.
#[test]
fn direct_io_handles_any_offset_length_and_buffer() {
    let d = tempfile::tempdir().unwrap();
    let b = FileBackend::new(d.path());
    b.open("f", true).unwrap().set_len(64 << 10).unwrap();
    let s = match b.open_direct("f", false) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("skipped: no O_DIRECT under {}: {e}", d.path().display());
            return;
        }
    };
    let mut model = vec![0u8; 96 << 10];
    let mut rng = StdRng::seed_from_u64(11);
    let mut backing = AlignedBuf::zeroed(40 << 10);
    for round in 0..300u32 {
        let len = match round % 4 {
            0 => 4096 * rng.gen_range(1..4usize),
            1 => rng.gen_range(1..9000),
            _ => 512 * rng.gen_range(1..20usize),
        };
        let off = match round % 3 {
            0 => 4096 * rng.gen_range(0..16u64),
            _ => rng.gen_range(0..(72u64 << 10)),
        };
        // Offset 0 of `backing` is aligned; 1..4095 is not.
        let skew = if round % 2 == 0 {
            0
        } else {
            rng.gen_range(1..4096)
        };
        let buf = &mut backing[skew..skew + len];
        if round % 5 == 4 {
            s.read_at(buf, off).unwrap();
            assert_eq!(
                &buf[..],
                &model[off as usize..off as usize + len],
                "round {round}"
            );
        } else {
            rng.fill(&mut buf[..]);
            s.write_at(buf, off).unwrap();
            model[off as usize..off as usize + len].copy_from_slice(buf);
        }
    }
    s.sync().unwrap();
    // Another (buffered) handle sees what the direct one wrote.
    let len = s.len().unwrap() as usize;
    let mut all = vec![0u8; len];
    b.open("f", false).unwrap().read_at(&mut all, 0).unwrap();
    assert_eq!(all, model[..len]);
    // Past the end reads zeros, aligned or not.
    let mut tail = AlignedBuf::zeroed(8192);
    tail.fill(7);
    s.read_at(&mut tail, (len as u64).next_multiple_of(4096))
        .unwrap();
    assert!(tail.iter().all(|&x| x == 0));
    // An aligned direct read leaves the page cache cold: mincore on a
    // mapping of a freshly written and evicted range says not resident.
    let f = File::open(d.path().join("f")).unwrap();
    // SAFETY: plain syscalls on an owned descriptor and our own mapping.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        let mut page = AlignedBuf::zeroed(4096);
        s.read_at(&mut page, 8192).unwrap();
        let map = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            8192,
        );
        assert_ne!(map, libc::MAP_FAILED);
        let mut vec = [0u8; 1];
        assert_eq!(libc::mincore(map, 4096, vec.as_mut_ptr()), 0);
        libc::munmap(map, 4096);
        assert_eq!(
            vec[0] & 1,
            0,
            "a direct read brought the page into the page cache"
        );
    }
}

#[test]
fn synced_writes_survive_a_crash_and_old_handles_fail() {
    let b = SimBackend::new();
    let s = b.open("f", true).unwrap();
    s.write_at(&[1u8; 512], 0).unwrap();
    s.sync().unwrap();
    s.write_at(&[2u8; 512], 512).unwrap();
    b.crash(7);
    let mut buf = [0u8; 512];
    assert!(
        s.read_at(&mut buf, 0).is_err(),
        "pre-crash handle must fail"
    );
    let s2 = b.open("f", false).unwrap();
    s2.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [1u8; 512]);
}

#[test]
fn crash_tears_multi_sector_writes_at_sector_granularity() {
    let mut saw_torn_mix = false;
    for seed in 0..64 {
        let b = SimBackend::new();
        let s = b.open("f", true).unwrap();
        s.write_at(&[9u8; 4096], 0).unwrap();
        b.crash(seed);
        let s2 = b.open("f", false).unwrap();
        let mut buf = vec![0u8; 4096];
        s2.read_at(&mut buf, 0).unwrap();
        for sector in buf.chunks(512) {
            assert!(
                sector.iter().all(|&x| x == sector[0]),
                "sector must be whole"
            );
        }
        let nines = buf.chunks(512).filter(|c| c[0] == 9).count();
        if nines > 0 && nines < 8 {
            saw_torn_mix = true;
        }
    }
    assert!(saw_torn_mix, "some seed must tear a write");
}

#[test]
fn holes_are_told_apart_from_data() {
    let d = tempfile::tempdir().unwrap();
    let f = FileBackend::new(d.path()).open("f", true).unwrap();
    f.write_at(&vec![7u8; 1 << 20], 0).unwrap();
    f.sync().unwrap();
    f.set_len(4 << 20).unwrap();
    assert!(!f.is_hole(0, 4096).unwrap(), "written data");
    assert!(!f.is_hole(0, 2 << 20).unwrap(), "data, then a hole");
    // Past the data: the extended length is a hole (or, on a file
    // system without SEEK_DATA, unknown: false).
    let tail = f.is_hole(2 << 20, 1 << 20).unwrap();
    f.punch_hole(256 << 10, 256 << 10).unwrap();
    let punched = f.is_hole(256 << 10, 256 << 10).unwrap();
    assert_eq!(
        punched, tail,
        "a punched range is a hole where one can tell"
    );
    assert!(!f.is_hole(256 << 10, 512 << 10).unwrap(), "hole, then data");
    // The simulator cannot tell: never a hole.
    let sim = SimBackend::new().open("f", true).unwrap();
    assert!(!sim.is_hole(0, 4096).unwrap());
}

#[test]
fn ofd_locks_share_reads_and_exclude_writers() {
    let d = tempfile::tempdir().unwrap();
    let b = FileBackend::new(d.path());
    b.open("f", true).unwrap();
    let r1 = b.open_read_only("f").unwrap();
    let r2 = b.open_read_only("f").unwrap();
    r1.try_lock(LockMode::Shared).unwrap();
    r2.try_lock(LockMode::Shared).unwrap();
    let w = b.open("f", false).unwrap();
    let e = w.try_lock(LockMode::Exclusive).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
    drop((r1, r2));
    w.try_lock(LockMode::Exclusive).unwrap();
    let r3 = b.open_read_only("f").unwrap();
    let e = r3.try_lock(LockMode::Shared).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
    let w2 = b.open("f", false).unwrap();
    let e = w2.try_lock(LockMode::Exclusive).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock, "{e}");
    // A refused opener leaves no bytes behind: once the writer is gone,
    // another can lock.
    drop(w);
    w2.try_lock(LockMode::Exclusive).unwrap();
}

#[test]
fn file_backend_reads_zeros_past_end_and_punches() {
    let dir = tempfile::tempdir().unwrap();
    let b = FileBackend::new(dir.path());
    let s = b.open("x", true).unwrap();
    s.write_at(&[5u8; 8192], 0).unwrap();
    s.punch_hole(0, 4096).unwrap();
    let mut buf = vec![1u8; 8192 + 100];
    s.read_at(&mut buf, 0).unwrap();
    assert!(buf[..4096].iter().all(|&x| x == 0));
    assert!(buf[4096..8192].iter().all(|&x| x == 5));
    assert!(buf[8192..].iter().all(|&x| x == 0));
    assert!(b.free_bytes().is_some());
}
