//! `strata serve --fuse DIR`: disks as files, checked against what NBD
//! clients (qemu-io, qemu-img) see of the same disks, and the mount's life
//! cycle (appearing exports, SIGTERM, a stale mount after kill -9).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use crate::common;
use common::*;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn tools() -> bool {
    have_fuse() && have("qemu-io") && have("qemu-img")
}

fn is_mounted(p: &Path) -> bool {
    let want = p.to_str().unwrap().replace(' ', "\\040");
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

/// Lazily unmounts on drop what a failed test (a killed server) left.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = run("umount", &["-l", self.0.to_str().unwrap()]);
        }
    }
}

/// Serve `s` with the FUSE mount on `<tmp>/mnt`; returns when `first`
/// shows in it. The tuple drops the server (kill) before the unmount.
fn serve_fuse(s: &Store, first: &str) -> (Server, PathBuf, Unmount) {
    let mnt = s.dir.path().join("mnt");
    let srv = s.serve_with(&["--fuse", mnt.to_str().unwrap()]);
    let f = mnt.join(first);
    eventually("the FUSE file appears", Duration::from_secs(10), || {
        f.exists()
    });
    (srv, mnt.clone(), Unmount(mnt))
}

fn names(mnt: &Path) -> Vec<String> {
    let out = run_ok("ls", &["-a", mnt.to_str().unwrap()]);
    out.lines().map(String::from).collect()
}

/// qemu-io prints failed pattern checks and still exits 0: check its words.
fn qemu_io_verify(uri: &str, cmd: &str) {
    let out = qemu_io_ok(&["-r", "-f", "raw"], uri, &[cmd]);
    assert!(out.contains("read "), "qemu-io {cmd}: {out}");
}

fn allocated(s: &Store, disk: &str) -> u64 {
    s.json(&["info", disk])["allocated_bytes"].as_u64().unwrap()
}

#[test]
fn fuse_file_and_nbd_see_the_same_bytes() {
    if !tools() {
        return;
    }
    each_kind(fuse_file_and_nbd_see_the_same_bytes_on);
}

fn fuse_file_and_nbd_see_the_same_bytes_on(kind: Kind) {
    let s = Store::of(kind);
    s.ok(&["create", "d1", "--size", "4M"]);
    let (srv, mnt, _unmount) = serve_fuse(&s, "d1");
    let path = mnt.join("d1");
    let uri = s.uri("d1");
    let size = 4usize << 20;
    assert_eq!(std::fs::metadata(&path).unwrap().len(), size as u64);
    assert_eq!(
        std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
        0o644
    );

    // Writes through the file at unaligned offsets and lengths.
    let mut model = vec![0u8; size];
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let writes: &[(usize, usize, u8)] = &[
        (1000, 5, 0x68),
        (70001, 5000, 0xab),
        (511, 2, 0x01),
        (4096, 4096, 0x42),
        (size - 3, 3, 0x7e),
        (1 << 20, 300_000, 0x33),
    ];
    for &(off, len, byte) in writes {
        f.write_all_at(&vec![byte; len], off as u64).unwrap();
        model[off..off + len].fill(byte);
    }
    f.sync_all().unwrap();
    // NBD reads what the file wrote.
    qemu_io_verify(&uri, "read -P 0xab 70001 5000");
    qemu_io_verify(&uri, "read -P 0x01 511 2");
    qemu_io_verify(&uri, "read -P 0x00 513 487");
    let img = s.dir.path().join("via-nbd.raw");
    save(&uri, &img);
    assert!(std::fs::read(&img).unwrap() == model, "NBD image differs");
    assert!(std::fs::read(&path).unwrap() == model, "FUSE file differs");

    // And the other way: NBD writes, the file reads (unaligned too).
    qemu_io_ok(RAW, &uri, &["write -P 0x5a 2097152 65536"]);
    model[2 << 20..(2 << 20) + 65536].fill(0x5a);
    let mut b = vec![0u8; 100];
    f.read_exact_at(&mut b, (2 << 20) - 3).unwrap();
    assert_eq!(b, model[(2 << 20) - 3..(2 << 20) + 97]);
    // A read across the end is short; past it, empty; a write past it fails.
    let mut b = vec![0xffu8; 10];
    assert_eq!(f.read_at(&mut b, size as u64 - 4).unwrap(), 4);
    assert_eq!(&b[..4], &model[size - 4..]);
    assert_eq!(f.read_at(&mut b, size as u64).unwrap(), 0);
    assert!(f.write_at(b"x", size as u64).is_err());

    // Concurrent unaligned writes into the same sectors from several open
    // files: each thread owns every 4th byte; none may be lost to another
    // thread's read-modify-write.
    let threads: Vec<_> = (0..4usize)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let f = OpenOptions::new().write(true).open(&path).unwrap();
                for i in (t..2048).step_by(4) {
                    f.write_all_at(&[0xc0 | t as u8], 3 << 20 | i as u64)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for i in 0..2048 {
        model[(3 << 20) + i] = 0xc0 | (i % 4) as u8;
    }
    assert!(
        std::fs::read(&path).unwrap() == model,
        "lost concurrent writes"
    );

    // Real clients agree the file and the export are the same disk.
    let info = run_ok("qemu-img", &["info", "-f", "raw", path.to_str().unwrap()]);
    assert!(info.contains("4 MiB"), "{info}");
    let cmp = raw_compare(path.to_str().unwrap(), &uri);
    assert!(cmp.status.success(), "{cmp:?}");

    // FUSE I/O counts in the server's statistics like NBD's.
    let st = s.json(&["stats", "d1"]);
    assert!(st["d1"]["write"]["commands"].as_u64().unwrap() >= 6, "{st}");

    // SIGTERM unmounts.
    drop(f);
    assert!(is_mounted(&mnt));
    srv.stop();
    assert!(!is_mounted(&mnt), "still mounted after SIGTERM");
}

#[test]
fn fuse_snapshots_are_read_only_and_the_directory_follows_the_datastore() {
    if !tools() {
        return;
    }
    each_kind(fuse_snapshots_and_the_directory_on);
}

fn fuse_snapshots_and_the_directory_on(kind: Kind) {
    let s = Store::of(kind);
    s.ok(&["create", "d1", "--size", "2M"]);
    let (srv, mnt, _unmount) = serve_fuse(&s, "d1");
    let path = mnt.join("d1");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    f.write_all_at(&[0x11; 65536], 0).unwrap();
    s.ok(&["snapshot", "create", "d1", "s1"]);
    f.write_all_at(&[0x22; 1000], 100).unwrap();

    let snap = mnt.join("d1@s1");
    assert!(snap.exists(), "{:?}", names(&mnt));
    let m = std::fs::metadata(&snap).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o444);
    assert_eq!(m.len(), 2 << 20);
    let e = OpenOptions::new().write(true).open(&snap).unwrap_err();
    assert!(
        matches!(e.raw_os_error(), Some(libc::EROFS) | Some(libc::EACCES)),
        "{e}"
    );
    // The snapshot reads its own bytes, the disk its new ones.
    let mut b = vec![0u8; 2000];
    let sf = OpenOptions::new().read(true).open(&snap).unwrap();
    sf.read_exact_at(&mut b, 99).unwrap();
    assert!(b.iter().all(|&x| x == 0x11));
    f.read_exact_at(&mut b, 99).unwrap();
    assert_eq!(b[0], 0x11);
    assert!(b[1..1001].iter().all(|&x| x == 0x22));
    assert!(b[1001..].iter().all(|&x| x == 0x11));
    qemu_io_verify(&s.uri("d1@s1"), "read -P 0x11 0 65536");
    let cmp = raw_compare(snap.to_str().unwrap(), &s.uri("d1@s1"));
    assert!(cmp.status.success(), "{cmp:?}");

    // The listing: . and .., disks and snapshots as they come and go.
    assert_eq!(names(&mnt), [".", "..", "d1", "d1@s1"]);
    s.ok(&["create", "d2", "--size", "1M"]);
    assert_eq!(names(&mnt), [".", "..", "d1", "d1@s1", "d2"]);
    assert_eq!(std::fs::metadata(mnt.join("d2")).unwrap().len(), 1 << 20);
    s.ok(&["rm", "d2"]);
    assert_eq!(names(&mnt), [".", "..", "d1", "d1@s1"]);
    assert!(!mnt.join("d2").exists());

    // The size follows 'strata extend', also on an open file.
    s.ok(&["extend", "d1", "--size", "3M"]);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);
    f.write_all_at(b"tail", (3 << 20) - 4).unwrap();
    qemu_io_verify(&s.uri("d1"), "read -P 0x6c 3145727 1");

    // A snapshot open in the mount is not deleted from under its reader
    // (docs/INTERLOCKS.md), unless forced: then its reads fail with EIO,
    // the server goes on and the name goes away.
    let e = s.fails_with(6, &["snapshot", "delete", "d1", "s1"]);
    let me = format!("d1@s1 over fuse from pid {} (", std::process::id());
    assert!(e.contains(&me) && e.contains("read-only"), "{e}");
    s.ok(&["snapshot", "delete", "d1", "s1", "--force"]);
    let err = sf.read_at(&mut b, 0).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    drop(sf);
    assert_eq!(names(&mnt), [".", "..", "d1"]);
    // No files are made or removed through the mount.
    assert!(std::fs::File::create(mnt.join("new")).is_err());
    assert!(std::fs::remove_file(&path).is_err());
    assert!(path.exists());
    drop(f);
    srv.stop();
}

#[test]
fn fuse_punch_hole_unmaps_and_zero_range_zeroes() {
    if !tools() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d1", "--size", "8M"]);
    let (srv, mnt, _unmount) = serve_fuse(&s, "d1");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("d1"))
        .unwrap();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8 | 1).collect();
    f.write_all_at(&data, 0).unwrap();
    f.sync_all().unwrap();
    let before = allocated(&s, "d1");
    assert!(before >= 4 << 20, "allocated {before}");

    let fd = f.as_raw_fd();
    // Unaligned at both ends: the partial sectors are zeroed, the rest unmapped.
    // SAFETY: fallocate on an open descriptor.
    let r = unsafe {
        libc::fallocate(
            fd,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            1000,
            2 << 20,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let after = allocated(&s, "d1");
    assert!(
        after + (2 << 20) - 128 * 1024 <= before,
        "punching 2 MiB freed only {} bytes ({before} -> {after})",
        before - after
    );
    let mut got = vec![0u8; 4 << 20];
    f.read_exact_at(&mut got, 0).unwrap();
    let mut want = data.clone();
    want[1000..1000 + (2 << 20)].fill(0);
    assert!(got == want, "punched range reads wrong");
    qemu_io_verify(&s.uri("d1"), "read -P 0 4096 1048576");

    // ZERO_RANGE, unaligned, inside data.
    let (zoff, zlen) = ((3 << 20) + 100, 10_000usize);
    // SAFETY: as above.
    let r = unsafe { libc::fallocate(fd, libc::FALLOC_FL_ZERO_RANGE, zoff as i64, zlen as i64) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    want[zoff..zoff + zlen].fill(0);
    f.read_exact_at(&mut got, 0).unwrap();
    assert!(got == want, "zeroed range reads wrong");
    // The file size did not change.
    assert_eq!(f.metadata().unwrap().len(), 8 << 20);

    // du: st_blocks is what the thin disk holds, not its size; df: the
    // mount reports the datastore's capacity and free space.
    use std::os::unix::fs::MetadataExt;
    let held = allocated(&s, "d1");
    assert!(held < 4 << 20, "{held}");
    assert_eq!(f.metadata().unwrap().blocks() * 512, held);
    assert_eq!(
        std::fs::metadata(mnt.join("d1")).unwrap().blocks() * 512,
        held
    );
    let cpath = std::ffi::CString::new(mnt.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs fills the zeroed struct it is given.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cpath.as_ptr(), &mut st) }, 0);
    let status = s.json(&["status"]);
    let cap = status["capacity_bytes"].as_u64().unwrap();
    let total = st.f_blocks * st.f_frsize;
    assert!(
        total.abs_diff(cap) < 64 << 20,
        "df total {total}, datastore capacity {cap}"
    );
    assert!(
        st.f_bavail > 0 && st.f_bavail <= st.f_blocks,
        "{} of {}",
        st.f_bavail,
        st.f_blocks
    );
    assert_eq!(st.f_files, 1, "one export");

    // mtime follows changes through any transport (a backup tool that
    // compares times must see them): a write over NBD moves it forward.
    let m1 = std::fs::metadata(mnt.join("d1"))
        .unwrap()
        .modified()
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    qemu_io_ok(RAW, &s.uri("d1"), &["write -P 7 0 4096"]);
    let m2 = std::fs::metadata(mnt.join("d1"))
        .unwrap()
        .modified()
        .unwrap();
    assert!(m2 > m1, "mtime {m1:?} -> {m2:?} after a write over NBD");
    drop(f);
    srv.stop();
}

#[test]
fn fuse_stale_mount_after_kill_is_replaced_and_sigterm_unmounts() {
    if !have_fuse() {
        return;
    }
    let s = Store::new();
    s.ok(&["create", "d1", "--size", "1M"]);
    let (srv, mnt, _unmount) = serve_fuse(&s, "d1");
    srv.kill9();
    // The kernel keeps the mount of a dead server: ENOTCONN.
    assert!(is_mounted(&mnt));
    let e = std::fs::metadata(mnt.join("d1")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
    // The next server finds it, unmounts it and mounts afresh.
    let (srv, mnt, _unmount2) = serve_fuse(&s, "d1");
    assert_eq!(std::fs::metadata(mnt.join("d1")).unwrap().len(), 1 << 20);
    // A second server on the same directory is refused (the datastore is
    // locked anyway; a live mount must not be touched).
    let other = Store::new();
    // (timeout: were it not refused, it would serve until killed)
    let ds = other.path();
    let o = run(
        "timeout",
        &[
            "10",
            strata(),
            "--datastore",
            ds.to_str().unwrap(),
            "serve",
            "--fuse",
            mnt.to_str().unwrap(),
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("already a mount point"), "{err}");
    // SIGTERM with a file held open: the mount goes away all the same.
    let held = std::fs::File::open(mnt.join("d1")).unwrap();
    srv.stop();
    assert!(!is_mounted(&mnt), "still mounted after SIGTERM");
    drop(held);
}
