//! A FUSE file system that shows block devices as regular files.
//!
//! [`FuseServer::mount`] mounts one directory in which every export of a
//! [`FuseProvider`] is a file: `DIR/NAME`, read-write, or read-only (mode
//! 0444, opens for writing refused with `EROFS`) when the export is. The
//! directory is computed from the provider on every lookup and at the start
//! of every directory listing, and the kernel is told to cache no entry and
//! no attribute (TTL 0): exports that come and go, and sizes that grow,
//! show at once.
//!
//! # I/O
//!
//! Every open file gets its own device handle from
//! [`FuseProvider::open`], held until `release`; an export deleted while
//! open answers as its device decides (an error), never with a panic.
//! Files are opened with `FOPEN_DIRECT_IO`: the kernel passes reads and
//! writes through as they come instead of keeping a second copy of the
//! disk in its page cache. Requests may have any offset and length; the
//! device takes only whole 512-byte sectors, so unaligned ones go through
//! an aligned bounce buffer, writes by read-modify-write under a per-file
//! lock (see `rmw.rs`). Reads stop at the end of the device; writes there
//! get `ENOSPC` like a block device's. `O_SYNC`/`O_DSYNC` writes are FUA
//! writes. `fsync` and `flush` (each `close`) flush the device.
//! `fallocate(PUNCH_HOLE|KEEP_SIZE)` unmaps, `fallocate(ZERO_RANGE)` is a
//! `write_zeroes`; `lseek(SEEK_DATA/SEEK_HOLE)` follows `block_status`.
//! Device errors map through [`BlockError::errno`].
//!
//! # Shutdown
//!
//! [`FuseServer::shutdown`] refuses new requests, waits for those under
//! way, drops every device handle and the provider, and unmounts (lazily,
//! with a message, when the mount is busy). After it returns nothing of
//! this crate holds a device. A mount left by a server that died is found
//! by [`prepare_mountpoint`] before mounting again.
//!
//! [`BlockError::errno`]: strata_block::BlockError::errno
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};
use parking_lot::{Mutex, RwLock};
use strata_block::{BlockDevice, BlockError};

use strata_block::bytes::{self as rmw, ByteIo};

mod sessions;
pub use sessions::Session;

/// One export as the directory shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FuseExport {
    /// The file name (`DISK`, `DISK@SNAP`). Names that cannot be file
    /// names (empty, `.`, `..`, containing `/`) are not shown.
    pub name: String,
    /// Writes are refused; the file has mode 0444.
    pub read_only: bool,
    /// The file size.
    pub size_bytes: u64,
    /// Bytes the export takes in its store (`st_blocks`, so `du` shows what
    /// a thin disk holds); None: the file size.
    pub stored_bytes: Option<u64>,
    /// When it last changed (mtime and ctime, so that backup tools that
    /// compare times see a change); None: when the file system was mounted.
    pub modified: Option<SystemTime>,
}

/// The store behind the exports, as `statfs` (`df`) reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    pub total_bytes: u64,
    pub free_bytes: u64,
}

/// Where the file system finds its exports. Called from FUSE threads.
pub trait FuseProvider: Send + Sync {
    /// Every export, in the order to list them.
    fn list(&self) -> Vec<FuseExport>;
    /// One export by name, or why not: `NotFound` when there is no such
    /// export (ENOENT), another kind when it cannot be looked at now (a
    /// store that does not answer is EIO, not "no such file"). The
    /// default searches [`Self::list`].
    fn stat(&self, name: &str) -> Result<FuseExport, BlockError> {
        self.list()
            .into_iter()
            .find(|e| e.name == name)
            .ok_or_else(|| {
                BlockError::new(
                    strata_block::Kind::NotFound,
                    format!("no export named '{name}'"),
                )
            })
    }
    /// Open an export for one open file; `Err(message)` if there is no such
    /// export. The handle is dropped when the file is released.
    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error>;
    /// Capacity and free space of the store behind the exports, for
    /// `statfs`; None: zeros.
    fn space(&self) -> Option<FsSpace> {
        None
    }
}

/// How to mount.
#[derive(Debug, Clone)]
pub struct Options {
    /// Let other users than the one who mounted use the files (the
    /// `allow_other` mount option; for non-root users it needs
    /// `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Threads reading requests from the kernel (each with its own cloned
    /// /dev/fuse descriptor).
    pub threads: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            allow_other: false,
            threads: 4,
        }
    }
}

/// The kernel caches no name and no attribute: the provider decides each time.
const TTL: Duration = Duration::ZERO;

const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

/// One open file.
struct Handle {
    dev: Arc<dyn BlockDevice>,
    /// The file's read-modify-write lock (shared by all its handles).
    lock: Arc<RwLock<()>>,
    read_only: bool,
    /// Who opened it and when, for [`FuseServer::sessions`]; the export's
    /// name changes with a rename.
    export: Mutex<String>,
    pid: u32,
    since_unix: u64,
}

/// Inode numbers by name, never reused while mounted (root is 1).
#[derive(Default)]
struct Inodes {
    by_name: HashMap<String, u64>,
    by_ino: HashMap<u64, (String, Arc<RwLock<()>>)>,
    next: u64,
}

impl Inodes {
    fn ino(&mut self, name: &str) -> u64 {
        if let Some(&i) = self.by_name.get(name) {
            return i;
        }
        if self.next < 2 {
            self.next = 2;
        }
        let i = self.next;
        self.next += 1;
        self.by_name.insert(name.to_string(), i);
        self.by_ino
            .insert(i, (name.to_string(), Arc::new(RwLock::new(()))));
        i
    }
}

type DirList = Vec<(u64, FileType, String)>;

struct Shared {
    provider: RwLock<Option<Arc<dyn FuseProvider>>>,
    /// True once shutdown began: requests get ESHUTDOWN. Held shared by
    /// every request for its whole length, so shutdown waits for them.
    closed: RwLock<bool>,
    inodes: Mutex<Inodes>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Handles a forced `rm` or revert took away: EIO until released.
    revoked: Mutex<std::collections::HashSet<u64>>,
    dirs: Mutex<HashMap<u64, DirList>>,
    next_fh: AtomicU64,
    uid: u32,
    gid: u32,
    born: SystemTime,
}

/// The errno of a failed request: NBD's numbers (`Error::errno`), except
/// where a file system has a better one (docs/ERRORS.md): a write to a
/// read-only export is EROFS, a disk another process holds EBUSY.
fn errno(e: &BlockError) -> Errno {
    match e.kind {
        strata_block::Kind::ReadOnly => Errno::EROFS,
        strata_block::Kind::Locked => Errno::EBUSY,
        _ => Errno::from_i32(e.errno()),
    }
}

/// The errno of an export that cannot be opened: ENOENT when there is no
/// such export, else the request errno (a store that does not answer is
/// EIO, a disk another host holds EPERM).
fn open_errno(e: &BlockError) -> Errno {
    match e.kind {
        strata_block::Kind::NotFound | strata_block::Kind::Gone => Errno::ENOENT,
        _ => errno(e),
    }
}

fn eshutdown() -> Errno {
    Errno::from_i32(libc::ESHUTDOWN)
}

fn valid_name(n: &str) -> bool {
    !n.is_empty() && n != "." && n != ".." && !n.contains('/') && !n.contains('\0')
}

impl Shared {
    fn provider(&self) -> Option<Arc<dyn FuseProvider>> {
        self.provider.read().clone()
    }

    fn dir_attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo::ROOT,
            size: 0,
            blocks: 0,
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            crtime: self.born,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn file_attr(&self, ino: u64, size: u64, e: Option<&FuseExport>, read_only: bool) -> FileAttr {
        let stored = e.and_then(|e| e.stored_bytes).unwrap_or(size);
        let modified = e
            .and_then(|e| e.modified)
            .map_or(self.born, |m| m.max(self.born));
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: stored.div_ceil(512),
            atime: modified,
            mtime: modified,
            ctime: modified,
            crtime: self.born,
            kind: FileType::RegularFile,
            perm: if read_only { 0o444 } else { 0o644 },
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn name_of(&self, ino: INodeNo) -> Option<(String, Arc<RwLock<()>>)> {
        self.inodes.lock().by_ino.get(&ino.0).cloned()
    }

    /// The open file `fh`: EBADF when there is none, EIO when it was
    /// revoked ([`FuseServer::revoke`]).
    fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Errno> {
        match self.handles.lock().get(&fh.0) {
            Some(h) => Ok(h.clone()),
            None if self.revoked.lock().contains(&fh.0) => Err(Errno::EIO),
            None => Err(Errno::EBADF),
        }
    }

    /// The attributes of a file as its provider sees them now.
    fn stat(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let (name, _) = self.name_of(ino).ok_or(Errno::ENOENT)?;
        let p = self.provider().ok_or_else(eshutdown)?;
        let e = p.stat(&name).map_err(|e| open_errno(&e))?;
        Ok(self.file_attr(ino.0, e.size_bytes, Some(&e), e.read_only))
    }

    fn listing(&self) -> DirList {
        let mut out: DirList = vec![
            (1, FileType::Directory, ".".into()),
            (1, FileType::Directory, "..".into()),
        ];
        let Some(p) = self.provider() else { return out };
        let list = p.list();
        let mut inodes = self.inodes.lock();
        for e in list.into_iter().filter(|e| valid_name(&e.name)) {
            out.push((inodes.ino(&e.name), FileType::RegularFile, e.name));
        }
        out
    }
}

struct Fs {
    sh: Arc<Shared>,
}

/// Run `f` unless shutdown began; shutdown waits for it.
macro_rules! gate {
    ($self:ident, $reply:ident) => {
        let closed = $self.sh.closed.read();
        if *closed {
            $reply.error(eshutdown());
            return;
        }
    };
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Larger requests than the 128 KiB default when the kernel allows
        // them (fewer round trips for sequential I/O).
        let _ = config.set_max_write(1 << 20);
        // Direct I/O submitted asynchronously (libaio, io_uring, QEMU's
        // aio=native) reaches us as that many requests at once, instead of
        // one at a time per file; let that many be in flight.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        gate!(self, reply);
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let Some(name) = name.to_str().filter(|n| valid_name(n)) else {
            return reply.error(Errno::ENOENT);
        };
        let Some(p) = self.sh.provider() else {
            return reply.error(eshutdown());
        };
        let e = match p.stat(name) {
            Ok(e) => e,
            Err(e) => {
                tracing::debug!("fuse: lookup {name}: {e}");
                return reply.error(open_errno(&e));
            }
        };
        let ino = self.sh.inodes.lock().ino(name);
        let attr = self.sh.file_attr(ino, e.size_bytes, Some(&e), e.read_only);
        reply.entry(&TTL, &attr, Generation(0));
    }

    /// `df`: the datastore's capacity and free space, in 4 KiB blocks; one
    /// file per export.
    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        gate!(self, reply);
        let Some(p) = self.sh.provider() else {
            return reply.error(eshutdown());
        };
        let sp = p.space().unwrap_or(FsSpace {
            total_bytes: 0,
            free_bytes: 0,
        });
        let files = p.list().len() as u64;
        let b = 4096u64;
        reply.statfs(
            sp.total_bytes / b,
            sp.free_bytes / b,
            sp.free_bytes / b,
            files,
            0,
            b as u32,
            255,
            b as u32,
        );
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        gate!(self, reply);
        if ino == INodeNo::ROOT {
            return reply.attr(&TTL, &self.sh.dir_attr());
        }
        // An open file answers from its own handle (it may outlive the name),
        // with what the provider says it holds while the name is there.
        if let Some(h) = fh.and_then(|fh| self.sh.handle(fh).ok()) {
            let e = self
                .sh
                .name_of(ino)
                .and_then(|(name, _)| self.sh.provider()?.stat(&name).ok());
            let attr = self
                .sh
                .file_attr(ino.0, h.dev.size_bytes(), e.as_ref(), h.read_only);
            return reply.attr(&TTL, &attr);
        }
        match self.sh.stat(ino) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        gate!(self, reply);
        if ino == INodeNo::ROOT {
            return reply.attr(&TTL, &self.sh.dir_attr());
        }
        // Owners, modes and times are fixed; setting them is a no-op (so
        // `touch` and `cp --preserve` do not fail). The size is the disk's:
        // 'strata extend' changes it, truncate only to the same size.
        match self.sh.stat(ino) {
            Ok(a) => match size {
                Some(s) if s != a.size => reply.error(if a.perm == 0o444 {
                    Errno::EROFS
                } else {
                    Errno::EPERM
                }),
                _ => reply.attr(&TTL, &a),
            },
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        gate!(self, reply);
        if ino == INodeNo::ROOT {
            return reply.error(Errno::EISDIR);
        }
        let Some((name, lock)) = self.sh.name_of(ino) else {
            return reply.error(Errno::ENOENT);
        };
        let Some(p) = self.sh.provider() else {
            return reply.error(eshutdown());
        };
        let dev = match p.open(&name) {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!("fuse: open {name}: {e}");
                return reply.error(open_errno(&e));
            }
        };
        let read_only = dev.read_only();
        if read_only && flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        if flags.0 & libc::O_TRUNC != 0 && !read_only {
            // A disk keeps its size; O_TRUNC would mean "make it empty".
            return reply.error(Errno::EPERM);
        }
        let fh = self.sh.next_fh.fetch_add(1, Ordering::Relaxed);
        self.sh.handles.lock().insert(
            fh,
            Arc::new(Handle {
                dev,
                lock,
                read_only,
                export: Mutex::new(name),
                pid: sessions::process_of(req.pid()),
                since_unix: sessions::now_unix(),
            }),
        );
        reply.opened(
            FileHandle(fh),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        );
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        gate!(self, reply);
        let h = match self.sh.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let end = h.dev.size_bytes();
        if offset >= end {
            return reply.data(&[]);
        }
        let len = (end - offset).min(u64::from(size)) as usize;
        let mut buf = vec![0u8; len];
        let io = ByteIo {
            dev: &*h.dev,
            lock: &h.lock,
        };
        match io.read(&mut buf, offset) {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        gate!(self, reply);
        let h = match self.sh.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        if h.read_only {
            return reply.error(Errno::EROFS);
        }
        if data.is_empty() {
            return reply.written(0);
        }
        let end = h.dev.size_bytes();
        if offset >= end {
            return reply.error(Errno::ENOSPC);
        }
        // A write across the end writes what fits (a short write).
        let len = (end - offset).min(data.len() as u64) as usize;
        let fua = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let io = ByteIo {
            dev: &*h.dev,
            lock: &h.lock,
        };
        match io.write(&data[..len], offset, fua) {
            Ok(()) => reply.written(len as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        gate!(self, reply);
        self.flush_handle(fh, reply);
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        // No gate: after shutdown the handle is gone already, which is fine.
        self.sh.handles.lock().remove(&fh.0);
        self.sh.revoked.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        gate!(self, reply);
        self.flush_handle(fh, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        gate!(self, reply);
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let fh = self.sh.next_fh.fetch_add(1, Ordering::Relaxed);
        let list = self.sh.listing();
        self.sh.dirs.lock().insert(fh, list);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        gate!(self, reply);
        // The listing taken at opendir keeps offsets stable through one
        // pass; a pass from the start (rewinddir) sees the exports anew.
        if offset == 0 {
            let list = self.sh.listing();
            self.sh.dirs.lock().insert(fh.0, list);
        }
        let list = self.sh.dirs.lock().get(&fh.0).cloned().unwrap_or_default();
        for (i, (ino, kind, name)) in list.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(*ino), i as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.sh.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // No extended attributes; ENOSYS stops the kernel from asking again.
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Modes are checked where they matter (open refuses writes to
        // read-only exports); ENOSYS makes the kernel stop asking.
        reply.error(Errno::ENOSYS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        // Disks are deleted with 'strata delete', not through the mount.
        reply.error(Errno::EPERM);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EPERM);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EPERM);
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        gate!(self, reply);
        let h = match self.sh.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        if h.read_only {
            return reply.error(Errno::EROFS);
        }
        let size = h.dev.size_bytes();
        let keep = mode & FALLOC_FL_KEEP_SIZE != 0;
        let end = offset.saturating_add(length);
        // The file cannot grow: only requests that keep the size or stay
        // inside it are served.
        if end > size && !keep {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let (from, to) = (offset.min(size), end.min(size));
        let io = ByteIo {
            dev: &*h.dev,
            lock: &h.lock,
        };
        let r = match mode & !FALLOC_FL_KEEP_SIZE {
            // Plain allocation inside the disk: a disk's space is there to
            // write (thin disks take it as they are written).
            0 => Ok(()),
            FALLOC_FL_PUNCH_HOLE => io.zero(from, to - from, &rmw::unmap_whole),
            FALLOC_FL_ZERO_RANGE => io.zero(from, to - from, &rmw::write_zeroes_whole),
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        gate!(self, reply);
        let h = match self.sh.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        let data = match whence {
            libc::SEEK_DATA => true,
            libc::SEEK_HOLE => false,
            _ => return reply.error(Errno::EINVAL),
        };
        match seek(&*h.dev, offset, data) {
            Ok(o) => reply.offset(o),
            Err(e) => reply.error(e),
        }
    }
}

/// `SEEK_DATA` / `SEEK_HOLE` from `offset`: a hole is a range the device
/// promises reads as zeros.
fn seek(dev: &dyn BlockDevice, offset: i64, data: bool) -> Result<i64, Errno> {
    let size = dev.size_bytes();
    let Ok(offset) = u64::try_from(offset) else {
        return Err(Errno::ENXIO);
    };
    if offset >= size {
        return Err(Errno::ENXIO);
    }
    let mut pos = offset - offset % 512;
    while pos < size {
        let exts = dev.block_status(pos, size - pos).map_err(|e| errno(&e))?;
        let before = pos;
        for x in exts {
            if x.len_bytes == 0 {
                break;
            }
            let end = pos + x.len_bytes;
            if end > offset && x.zero != data {
                return Ok(pos.max(offset) as i64);
            }
            pos = end;
        }
        if pos == before {
            return Err(Errno::EIO);
        }
    }
    if data {
        Err(Errno::ENXIO)
    } else {
        Ok(size as i64)
    }
}

impl Fs {
    fn flush_handle(&self, fh: FileHandle, reply: ReplyEmpty) {
        let h = match self.sh.handle(fh) {
            Ok(h) => h,
            Err(e) => return reply.error(e),
        };
        if h.read_only {
            return reply.ok();
        }
        match h.dev.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// A mounted export directory.
pub struct FuseServer {
    sh: Arc<Shared>,
    /// The FUSE connection number (see [`conn_id`]).
    conn: Option<u64>,
    mountpoint: PathBuf,
    session: Mutex<Option<fuser::BackgroundSession>>,
}

impl FuseServer {
    /// Mount `dir` (see [`prepare_mountpoint`] first) and serve it from
    /// background threads until [`Self::shutdown`] (or drop).
    pub fn mount(
        dir: &Path,
        provider: Arc<dyn FuseProvider>,
        opts: &Options,
    ) -> io::Result<FuseServer> {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let sh = Arc::new(Shared {
            provider: RwLock::new(Some(provider)),
            closed: RwLock::new(false),
            inodes: Mutex::new(Inodes::default()),
            handles: Mutex::new(HashMap::new()),
            revoked: Mutex::default(),
            dirs: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            uid,
            gid,
            born: SystemTime::now(),
        });
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("strata".into()),
            fuser::MountOption::Subtype("strata".into()),
            fuser::MountOption::NoDev,
            fuser::MountOption::NoSuid,
            fuser::MountOption::NoExec,
            fuser::MountOption::NoAtime,
        ];
        config.acl = if opts.allow_other {
            fuser::SessionACL::All
        } else {
            fuser::SessionACL::Owner
        };
        config.n_threads = Some(opts.threads.max(1));
        config.clone_fd = true;
        let session = fuser::spawn_mount(Fs { sh: sh.clone() }, dir, &config)?;
        // Now, while the root answers: after shutdown began it does not.
        let conn = CString::new(dir.as_os_str().as_bytes())
            .ok()
            .and_then(|p| conn_id(&p));
        Ok(FuseServer {
            sh,
            conn,
            mountpoint: dir.to_path_buf(),
            session: Mutex::new(Some(session)),
        })
    }

    /// The mounted directory.
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// Stop serving: refuse new requests, wait for those under way, drop
    /// every device handle and the provider, unmount, and wait (a few
    /// seconds at most) for the FUSE threads. Idempotent.
    pub fn shutdown(&self) {
        let Some(session) = self.session.lock().take() else {
            return;
        };
        *self.sh.closed.write() = true;
        self.sh.handles.lock().clear();
        self.sh.dirs.lock().clear();
        *self.sh.provider.write() = None;
        let path = match CString::new(self.mountpoint.as_os_str().as_bytes()) {
            Ok(p) => p,
            Err(_) => return,
        };
        // SAFETY: umount2 with a valid C string.
        let detached = if unsafe { libc::umount2(path.as_ptr(), 0) } == 0 {
            false
        } else {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                false // not mounted any more
            } else {
                // SAFETY: as above.
                let lazy = unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) } == 0;
                tracing::warn!(
                    "FUSE mount {} is busy ({e}); {}",
                    self.mountpoint.display(),
                    if lazy {
                        "detached it lazily (open files get errors)"
                    } else {
                        "could not detach it either"
                    }
                );
                true
            }
        };
        if detached {
            if let Some(c) = self.conn {
                abort_connection(c);
            }
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let joiner = std::thread::Builder::new()
            .name("fuse-join".into())
            .spawn(move || {
                let _ = tx.send(session.join());
            });
        if joiner.is_ok() && rx.recv_timeout(Duration::from_secs(5)).is_err() {
            tracing::warn!(
                "FUSE threads of {} did not stop in 5 s; leaving them \
                 (they hold no disk)",
                self.mountpoint.display()
            );
        }
    }
}

impl Drop for FuseServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Abort FUSE connection `c` through fusectl (mounting fusectl on
/// /sys/fs/fuse/connections first if it is not): files still open on a
/// lazily detached mount then get errors at once, and the FUSE threads end.
fn abort_connection(c: u64) {
    let dir = "/sys/fs/fuse/connections";
    let abort = format!("{dir}/{c}/abort");
    if !Path::new(&abort).exists() {
        let (src, target, fstype) = (c"fusectl", c"/sys/fs/fuse/connections", c"fusectl");
        // SAFETY: mount(2) with valid C strings and no data.
        unsafe {
            libc::mount(
                src.as_ptr(),
                target.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
    }
    if std::fs::write(&abort, "1").is_err() {
        tracing::warn!(
            "could not abort FUSE connection {c} ({abort}); it ends when its files are closed"
        );
    }
}

/// The FUSE connection number of the file system mounted at `path` (its
/// device's minor number, as /sys/fs/fuse/connections names it).
fn conn_id(path: &CString) -> Option<u64> {
    // SAFETY: stat into a zeroed struct with a valid C string.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::stat(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(u64::from(libc::minor(st.st_dev)))
}

/// What [`prepare_mountpoint`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prepared {
    /// A directory, not mounted on (created if it was missing).
    Ready,
    /// A FUSE mount whose server is gone (`ENOTCONN`) was there; it was
    /// unmounted lazily.
    StaleUnmounted,
}

/// Make `dir` ready to mount on: create it if missing; find a FUSE mount
/// left by a server that died (its directory answers `ENOTCONN`) and
/// unmount it lazily; refuse a live mount or a non-directory with a
/// message that says what to do.
pub fn prepare_mountpoint(dir: &Path) -> Result<Prepared, BlockError> {
    use strata_block::Kind;
    let abs = absolute(dir)?;
    let mounted = mount_fstype(&abs);
    let fail = |kind, message: String| Err(BlockError::new(kind, message));
    match (std::fs::metadata(&abs), mounted) {
        (Err(e), Some(fstype)) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            let Ok(c) = CString::new(abs.as_os_str().as_bytes()) else {
                return fail(
                    Kind::InvalidArgument,
                    format!("{} has a NUL byte", abs.display()),
                );
            };
            // SAFETY: umount2 with a valid C string.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } != 0 {
                return fail(
                    Kind::Io,
                    format!(
                        "{} is a stale {fstype} mount (its server is gone) and unmounting it \
                         failed: {}; run 'umount -l {}'",
                        abs.display(),
                        io::Error::last_os_error(),
                        abs.display()
                    ),
                );
            }
            Ok(Prepared::StaleUnmounted)
        }
        (Ok(_), Some(fstype)) => fail(
            Kind::Locked,
            format!(
                "{} is already a mount point ({fstype}); is another 'strata serve --fuse' using \
                 it? Unmount it first (umount {})",
                abs.display(),
                abs.display()
            ),
        ),
        (Err(e), _) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&abs).map_err(|e| {
                BlockError::from(e).context(format_args!("create {}", abs.display()))
            })?;
            Ok(Prepared::Ready)
        }
        (Err(e), _) => Err(BlockError::from(e).at(abs.display().to_string())),
        (Ok(m), None) if !m.is_dir() => fail(
            Kind::InvalidArgument,
            format!("{} is not a directory", abs.display()),
        ),
        (Ok(_), None) => Ok(Prepared::Ready),
    }
}

/// `dir` as an absolute path, its parent resolved (the last component may
/// be a dead mount that cannot be resolved).
fn absolute(dir: &Path) -> Result<PathBuf, BlockError> {
    let abs = if dir.is_absolute() {
        dir.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| BlockError::from(e).context("current directory"))?
            .join(dir)
    };
    match (abs.parent(), abs.file_name()) {
        (Some(p), Some(n)) => match p.canonicalize() {
            Ok(p) => Ok(p.join(n)),
            Err(_) => Ok(abs),
        },
        _ => Ok(abs),
    }
}

/// The file system type mounted at `path` (the topmost mount), if any.
fn mount_fstype(path: &Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = path.as_os_str().as_bytes();
    let mut found = None;
    for line in info.lines() {
        let mut fields = line.split(' ');
        let Some(mp) = fields.nth(4) else { continue };
        if unescape(mp) != want {
            continue;
        }
        let fstype = line
            .split(" - ")
            .nth(1)
            .and_then(|r| r.split(' ').next())
            .unwrap_or("?");
        found = Some(fstype.to_string());
    }
    found
}

/// Undo mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) =
                u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("x"), 8)
            {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), b"/a b");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"/x\0"), b"/x\\0");
        assert_eq!(unescape(r"\"), b"\\");
    }

    #[test]
    fn names_that_cannot_be_files_are_hidden() {
        assert!(valid_name("vm1"));
        assert!(valid_name("vm1@snap"));
        assert!(!valid_name(""));
        assert!(!valid_name("."));
        assert!(!valid_name(".."));
        assert!(!valid_name("a/b"));
    }
}
