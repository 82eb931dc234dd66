//! Files in a directory: the [`FileBackend`] and its handles, buffered
//! or with every read and write direct (`O_DIRECT`, through a bounce
//! buffer when the caller's is not aligned), locked as QEMU locks its
//! images, and the free space of the file system under them.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use strata_block::AlignedBuf;

use crate::{Backend, LockMode, Storage, DIRECT_ALIGN, ZEROS};

fn is_direct_aligned(ptr: *const u8, len: usize, offset: u64) -> bool {
    (ptr as usize | len | offset as usize).is_multiple_of(DIRECT_ALIGN)
}

thread_local! {
    /// Each thread's bounce buffer for direct I/O on unaligned buffers,
    /// kept between calls (up to a megabyte; larger ones are freed).
    static BOUNCE: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::zeroed(0));
}

/// Run `f` on an aligned buffer of `len` bytes (contents unspecified).
fn with_bounce<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    const KEEP: usize = 1 << 20;
    BOUNCE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut b) => {
            if b.capacity() < len {
                *b = AlignedBuf::zeroed(len);
            }
            b.set_len(len);
            let r = f(&mut b);
            if b.capacity() > KEEP {
                *b = AlignedBuf::zeroed(0);
            }
            r
        }
        // Re-entered (not done by this crate): a buffer of its own.
        Err(_) => f(&mut AlignedBuf::zeroed(len)),
    })
}

/// Objects are files in one directory.
///
/// [`Storage::try_lock`] takes open-file-description locks
/// (`fcntl(F_OFD_SETLK)`) on the lock bytes of QEMU's image locking
/// protocol, so QEMU and strata refuse each other as they refuse
/// themselves. The locks belong to the open file, not the process: two
/// opens in one process conflict like two processes do, closing another
/// descriptor of the same file does not drop them, and the kernel releases
/// them when the file is closed, also when the process is killed.
pub struct FileBackend {
    dir: PathBuf,
}

impl FileBackend {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Backend for FileBackend {
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn Storage>> {
        let path = self.dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Arc::new(FileStorage::new(file, path)))
    }

    fn open_read_only(&self, name: &str) -> io::Result<Arc<dyn Storage>> {
        let path = self.dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Arc::new(FileStorage::new(file, path)))
    }

    fn open_direct(&self, name: &str, read_only: bool) -> io::Result<Arc<dyn Storage>> {
        let path = self.dir.join(name);
        let file = OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(Arc::new(FileStorage::new_direct(file, path, !read_only)?))
    }

    fn exists(&self, name: &str) -> bool {
        self.dir.join(name).exists()
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        match std::fs::remove_file(self.dir.join(name)) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        std::fs::rename(self.dir.join(from), self.dir.join(to)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("rename {from} to {to} in {}: {e}", self.dir.display()),
            )
        })?;
        // The rename is durable once the directory is.
        File::open(&self.dir)?.sync_all()
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn free_bytes(&self) -> Option<u64> {
        statvfs_free(&self.dir)
    }
}

/// Bytes available to an unprivileged writer on the file system holding `path`.
pub fn statvfs_free(path: &Path) -> Option<u64> {
    let (_, free) = statvfs(path)?;
    Some(free)
}

/// (total bytes, available bytes) of the file system holding `path`.
pub fn statvfs(path: &Path) -> Option<(u64, u64)> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path and st a valid out pointer.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((st.f_blocks as u64 * frsize, st.f_bavail as u64 * frsize))
}

/// The longest write through the page cache that takes
/// `FileStorage::writes`.
const QUEUED_WRITE_MAX: usize = 64 << 10;

struct FileStorage {
    file: File,
    path: PathBuf,
    /// A second descriptor opened with `O_DIRECT` for [`Storage::write_zeros`],
    /// opened on first use; None when the file system refuses it (tmpfs).
    /// Opened at once, and used for every read and write, when `all_direct`.
    direct: std::sync::OnceLock<Option<File>>,
    /// Reads and writes bypass the host page cache (`--cache none`).
    all_direct: bool,
    /// Held around each short write through the page cache (up to
    /// [`QUEUED_WRITE_MAX`]). The kernel takes the file's inode lock
    /// exclusively for every buffered write (ext4, XFS, btrfs), so they
    /// run one at a time anyway; but once a waiter has waited a few ms
    /// the kernel keeps its lock for the oldest waiter, which on busy
    /// cores is asleep and must first be scheduled, and every other writer
    /// waits behind that (up to seconds, with 64 clients on two cores:
    /// PERFORMANCE.md, "Many disks"). Waiting here lets a thread that is
    /// running take it next. Long writes keep the kernel's lock alone: its
    /// waiters spin while the holder runs, which suits a holder that
    /// copies for tens of µs (a lock here cost 512 KiB writes a sixth).
    writes: parking_lot::Mutex<()>,
}

impl FileStorage {
    fn new(file: File, path: PathBuf) -> Self {
        FileStorage {
            file,
            path,
            direct: std::sync::OnceLock::new(),
            all_direct: false,
            writes: parking_lot::Mutex::new(()),
        }
    }

    /// A handle whose reads and writes all use `O_DIRECT`; fails (saying
    /// why) where the file system has no direct I/O.
    fn new_direct(file: File, path: PathBuf, writable: bool) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let direct = OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "{}: cannot open for direct I/O (cache mode none): {e}; \
                         the file system may not support O_DIRECT (tmpfs does not)",
                        path.display()
                    ),
                )
            })?;
        let cell = std::sync::OnceLock::new();
        let _ = cell.set(Some(direct));
        Ok(FileStorage {
            file,
            path,
            direct: cell,
            all_direct: true,
            writes: parking_lot::Mutex::new(()),
        })
    }

    fn direct(&self) -> Option<&File> {
        self.direct
            .get_or_init(|| {
                use std::os::unix::fs::OpenOptionsExt;
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&self.path)
                    .ok()
            })
            .as_ref()
    }
}

/// QEMU's image locking protocol, which [`FileStorage::try_lock`] follows
/// so that strata and QEMU see each other's locks. Each permission `p` has
/// two lock bytes: an opener that uses `p` holds a read lock on
/// `PERM_BASE + p`; one that does not let others use `p` holds a read lock
/// on `SHARED_BASE + p`. An opener is refused when another open file holds
/// `SHARED_BASE + p` for a `p` it uses, or `PERM_BASE + p` for a `p` it
/// does not share.
mod qemu_lock {
    pub const PERM_BASE: i64 = 100;
    pub const SHARED_BASE: i64 = 200;
    pub const CONSISTENT_READ: i64 = 0;
    pub const WRITE: i64 = 1;
    pub const WRITE_UNCHANGED: i64 = 2;
    pub const RESIZE: i64 = 3;

    /// (permissions used, permissions not shared) of a lock mode: a reader
    /// reads and wants no writer; a writer reads, writes and grows the
    /// file and wants no other writer, nor readers that want no writer.
    pub fn permissions(mode: super::LockMode) -> (&'static [i64], &'static [i64]) {
        match mode {
            super::LockMode::Shared => (&[CONSISTENT_READ], &[WRITE, RESIZE]),
            super::LockMode::Exclusive => (
                &[CONSISTENT_READ, WRITE, WRITE_UNCHANGED, RESIZE],
                &[WRITE, RESIZE],
            ),
        }
    }
}

impl FileStorage {
    /// One OFD lock call on the single byte `byte`: `F_OFD_SETLK` with
    /// `l_type`, or `F_OFD_GETLK`, which answers the type of a conflicting
    /// lock of another open file (`F_UNLCK` if none).
    fn ofd_lock(
        &self,
        cmd: libc::c_int,
        l_type: libc::c_int,
        byte: i64,
    ) -> io::Result<libc::c_int> {
        // SAFETY: flock is plain old data; all-zero is a valid value
        // (and l_pid must be 0 for OFD locks).
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = l_type as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        fl.l_start = byte as libc::off_t;
        fl.l_len = 1;
        // SAFETY: fcntl reads (GETLK: and writes) the flock we own for the
        // duration of the call, on a descriptor this FileStorage owns.
        let rc = unsafe { libc::fcntl(self.file.as_raw_fd(), cmd, &mut fl) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(fl.l_type as libc::c_int)
    }

    /// The `O_DIRECT` descriptor of an `all_direct` handle.
    fn direct_file(&self) -> &File {
        // new_direct set it; nothing else does for all_direct handles.
        self.direct
            .get()
            .and_then(|f| f.as_ref())
            .expect("direct descriptor of a cache-none handle")
    }

    /// `pread` on the direct descriptor until `buf` is full; past the end
    /// of the file it reads zeros. `buf`, `offset` and the length are
    /// [`DIRECT_ALIGN`]-aligned.
    fn pread_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let f = self.direct_file();
        let mut done = 0;
        while done < buf.len() {
            match f.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    return Ok(());
                }
                // A short read ends at the end of the file, which a
                // direct read sees at a block boundary only when the file
                // ends there; the rest reads as zeros either way.
                Ok(n) if !n.is_multiple_of(DIRECT_ALIGN) => {
                    buf[done + n..].fill(0);
                    return Ok(());
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.ctx(e, "read (direct)", offset)),
            }
        }
        Ok(())
    }

    /// A read of a cache-none handle: straight into `buf` when it is
    /// aligned (the transports' buffers are), else through an aligned
    /// bounce buffer covering the blocks around it.
    fn read_direct(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        if is_direct_aligned(buf.as_ptr(), buf.len(), offset) {
            return self.pread_direct(buf, offset);
        }
        let start = offset & !(DIRECT_ALIGN as u64 - 1);
        let end = (offset + buf.len() as u64).next_multiple_of(DIRECT_ALIGN as u64);
        with_bounce((end - start) as usize, |b| {
            self.pread_direct(b, start)?;
            let at = (offset - start) as usize;
            buf.copy_from_slice(&b[at..at + buf.len()]);
            Ok(())
        })
    }

    /// A write of a cache-none handle: straight from `buf` when it is
    /// aligned; an aligned range from an unaligned buffer is copied to a
    /// bounce buffer first; a range that starts or ends inside a block
    /// reads the blocks around it, changes them and writes them back
    /// (callers do not write one block from two threads at once: the
    /// engine writes the pool a grain at a time under its stripe locks).
    fn write_direct(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let f = self.direct_file();
        if is_direct_aligned(buf.as_ptr(), buf.len(), offset) {
            return f
                .write_all_at(buf, offset)
                .map_err(|e| self.ctx(e, "write (direct)", offset));
        }
        let start = offset & !(DIRECT_ALIGN as u64 - 1);
        let end = (offset + buf.len() as u64).next_multiple_of(DIRECT_ALIGN as u64);
        with_bounce((end - start) as usize, |b| {
            let at = (offset - start) as usize;
            if at != 0 || at + buf.len() != b.len() {
                // Only the first and last blocks hold bytes to keep.
                let last = b.len() - DIRECT_ALIGN;
                self.pread_direct(&mut b[..DIRECT_ALIGN], start)?;
                if last != 0 {
                    self.pread_direct(&mut b[last..], end - DIRECT_ALIGN as u64)?;
                }
            }
            b[at..at + buf.len()].copy_from_slice(buf);
            f.write_all_at(b, start)
                .map_err(|e| self.ctx(e, "write (direct)", offset))
        })
    }

    fn ctx(&self, e: io::Error, what: &str, offset: u64) -> io::Error {
        io::Error::new(
            e.kind(),
            format!("{} {} at {offset}: {e}", what, self.path.display()),
        )
    }
}

impl Storage for FileStorage {
    fn will_need(&self, offset: u64, len: u64) {
        if self.all_direct {
            // Read-ahead fills the page cache, which direct reads bypass:
            // it would only spend memory and I/O.
            return;
        }
        // SAFETY: plain syscall on an owned descriptor; only a hint.
        unsafe {
            libc::posix_fadvise(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                len as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }

    fn read_fd(&self) -> Option<(std::os::fd::RawFd, bool)> {
        use std::os::fd::AsRawFd;
        match self.direct_fd() {
            Some(fd) => Some((fd, true)),
            None => Some((self.file.as_raw_fd(), false)),
        }
    }

    fn direct_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        if !self.all_direct {
            return None;
        }
        self.direct
            .get()
            .and_then(|d| d.as_ref())
            .map(|f| f.as_raw_fd())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        if self.all_direct {
            return self.read_direct(buf, offset);
        }
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => {
                    buf[done..].fill(0);
                    return Ok(());
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.ctx(e, "read", offset)),
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if self.all_direct {
            return self.write_direct(buf, offset);
        }
        let _one_at_a_time = (buf.len() <= QUEUED_WRITE_MAX).then(|| self.writes.lock());
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| self.ctx(e, "write", offset))
    }

    fn sync(&self) -> io::Result<()> {
        self.file.sync_data().map_err(|e| self.ctx(e, "sync", 0))
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn allocated_bytes(&self) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(self.file.metadata()?.blocks() * 512)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| self.ctx(e, "truncate", len))
    }

    fn try_lock(&self, mode: LockMode) -> io::Result<()> {
        let (used, unshared) = qemu_lock::permissions(mode);
        let bytes: Vec<i64> = used
            .iter()
            .map(|p| qemu_lock::PERM_BASE + p)
            .chain(unshared.iter().map(|p| qemu_lock::SHARED_BASE + p))
            .collect();
        // Take our bytes first, then look for others: two openers racing
        // both see each other (and both fail), never neither.
        let mut conflict = None;
        for &b in &bytes {
            if let Err(e) = self.ofd_lock(libc::F_OFD_SETLK, libc::F_RDLCK, b) {
                conflict = Some(e);
                break;
            }
        }
        if conflict.is_none() {
            // Someone refusing to share what we use, or using what we refuse to share.
            let probes = used
                .iter()
                .map(|p| qemu_lock::SHARED_BASE + p)
                .chain(unshared.iter().map(|p| qemu_lock::PERM_BASE + p));
            for b in probes {
                match self.ofd_lock(libc::F_OFD_GETLK, libc::F_WRLCK, b) {
                    Ok(t) if t == libc::F_UNLCK => {}
                    Ok(_) => {
                        conflict = Some(io::Error::from_raw_os_error(libc::EAGAIN));
                        break;
                    }
                    Err(e) => {
                        conflict = Some(e);
                        break;
                    }
                }
            }
        }
        let Some(e) = conflict else { return Ok(()) };
        for &b in &bytes {
            let _ = self.ofd_lock(libc::F_OFD_SETLK, libc::F_UNLCK, b);
        }
        match e.raw_os_error() {
            // No OFD locks here (old kernel, some network file systems):
            // open unlocked, as QEMU does with locking=auto.
            Some(libc::ENOLCK)
            | Some(libc::EOPNOTSUPP)
            | Some(libc::EINVAL)
            | Some(libc::ENOSYS) => Ok(()),
            Some(libc::EAGAIN) | Some(libc::EACCES) => Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{}: another open file holds a conflicting lock",
                    self.path.display()
                ),
            )),
            _ => Err(self.ctx(e, "lock", 0)),
        }
    }

    fn allocate(&self, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let mode = if keep_size {
            libc::FALLOC_FL_KEEP_SIZE
        } else {
            0
        };
        // SAFETY: plain syscall on an owned descriptor.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            // No fallocate here: holding the space means writing it.
            let end = self.len()?;
            if offset + len > end {
                let from = offset.max(end);
                self.write_zeros(from & !4095, offset + len - (from & !4095))?;
                if keep_size {
                    self.set_len(end)?;
                }
            }
            return Ok(());
        }
        Err(self.ctx(e, "allocate", offset))
    }

    fn write_zeros(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(ZEROS.0.len() as u64) as usize;
            let at = offset + done;
            let direct = (at | n as u64).is_multiple_of(4096);
            match self.direct().filter(|_| direct) {
                Some(f) => match f.write_all_at(&ZEROS.0[..n], at) {
                    Ok(()) => {}
                    // Some file systems accept O_DIRECT opens and refuse
                    // the writes: fall back to the page cache.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        self.write_at(&ZEROS.0[..n], at)?
                    }
                    Err(e) => return Err(self.ctx(e, "write zeros", at)),
                },
                None => self.write_at(&ZEROS.0[..n], at)?,
            }
            done += n as u64;
        }
        Ok(())
    }

    fn is_hole(&self, offset: u64, len: u64) -> io::Result<bool> {
        // SAFETY: plain syscall on an owned descriptor; it moves the
        // descriptor's offset, which no other call here uses (pread/pwrite).
        let pos = unsafe {
            libc::lseek(
                self.file.as_raw_fd(),
                offset as libc::off_t,
                libc::SEEK_DATA,
            )
        };
        if pos >= 0 {
            return Ok(pos as u64 >= offset + len);
        }
        match io::Error::last_os_error() {
            // No data at or after `offset`.
            e if e.raw_os_error() == Some(libc::ENXIO) => Ok(true),
            // A file system without SEEK_DATA: assume data.
            e if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
            e => Err(self.ctx(e, "seek data in", offset)),
        }
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        // SAFETY: plain syscall on an owned descriptor.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        // File systems without hole punching: write zeros instead.
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}
