//! crashfs: a flat file system served over FUSE from the test process,
//! in memory, that can lose power.
//!
//! Every file is a `strata_storage::SimFile`, as the engine's simulator
//! keeps its objects: what reads see now, what the last `fsync` of that
//! file made durable, and the writes and truncations since then in order.
//! Names (create, rename, unlink, sockets) are durable at once: the test
//! is about data.
//!
//! [`CrashFs::cut`] is the power cut. From that moment every request
//! fails with EIO (nothing more reaches the "disk"), and each file's
//! pending changes are kept, lost or torn (a random subset of its 512-byte
//! sectors survives), decided by a seed, as `strata_storage::SimBackend`
//! does for the engine's own simulations. [`CrashFs::write_image`] then
//! writes what survived into a real directory.
//!
//! It runs under a real `strata serve`, so writes reach it from wherever
//! the server issues them, including its rings: the FUSE request names
//! the thread, and a thread inside `io_uring_enter` or `io_submit` (or a
//! kernel io_uring worker) is carrying out a ring's submission. The cut report
//! counts the pending writes that came that way: writes from a ring that
//! no fsync had covered when the power went.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, WriteFlags,
};
use rand::rngs::StdRng;
use rand::SeedableRng;
use strata_storage::{CrashReport, SimFile};

const TTL: Duration = Duration::ZERO;

struct Node {
    kind: FileType,
    file: SimFile,
    /// How many of the file's unsynced writes rings issued.
    unsynced_from_rings: usize,
}

impl Node {
    fn new(kind: FileType) -> Node {
        Node {
            kind,
            file: SimFile::default(),
            unsynced_from_rings: 0,
        }
    }
}

#[derive(Default)]
struct State {
    cut: bool,
    next_ino: u64,
    names: BTreeMap<String, u64>,
    nodes: HashMap<u64, Node>,
    /// Writes that rings issued, all files, all time.
    ring_writes: u64,
}

/// What a power cut did.
#[derive(Debug, Default, Clone, Copy)]
pub struct CutReport {
    /// Unsynced writes and truncations: kept whole, dropped, torn.
    pub changes: CrashReport,
    /// Of the unsynced writes, those a ring issued.
    pub from_rings: usize,
    /// Writes from rings before the cut, synced or not.
    pub ring_writes: u64,
}

struct Fs {
    st: Arc<Mutex<State>>,
    born: SystemTime,
}

impl Fs {
    fn attr(&self, ino: u64, node: &Node) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size: node.file.live.len() as u64,
            blocks: (node.file.live.len() as u64).div_ceil(512),
            atime: self.born,
            mtime: self.born,
            ctime: self.born,
            crtime: self.born,
            kind: node.kind,
            perm: if node.kind == FileType::Directory {
                0o755
            } else {
                0o644
            },
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The state, or EIO once the power is cut.
    fn state(&self) -> Result<std::sync::MutexGuard<'_, State>, Errno> {
        let st = self.st.lock().unwrap();
        if st.cut {
            return Err(Errno::EIO);
        }
        Ok(st)
    }

    fn make(&self, name: &OsStr, kind: FileType) -> Result<FileAttr, Errno> {
        let name = name.to_str().ok_or(Errno::EINVAL)?;
        let mut st = self.state()?;
        if st.names.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        st.next_ino += 1;
        let ino = st.next_ino;
        st.names.insert(name.to_string(), ino);
        let node = Node::new(kind);
        let attr = self.attr(ino, &node);
        st.nodes.insert(ino, node);
        Ok(attr)
    }
}

/// Whether thread `tid`, whose write is being served, issued it for a
/// ring: it is inside `io_uring_enter` (the kernel carries out a
/// submission in the submitter's context when it can) or `io_submit`
/// (native AIO), or it is one of the kernel's io_uring workers
/// (`iou-wrk-*`), which carry out the rest.
fn issued_by_a_ring(tid: u32) -> bool {
    let syscall = std::fs::read_to_string(format!("/proc/{tid}/syscall")).unwrap_or_default();
    let nr = syscall.split(' ').next();
    if [libc::SYS_io_uring_enter, libc::SYS_io_submit]
        .iter()
        .any(|n| nr == Some(&n.to_string()))
    {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{tid}/comm")).is_ok_and(|c| c.starts_with("iou-wrk"))
}

/// The state, or (the power being cut) an EIO reply and a return.
macro_rules! state_or_reply {
    ($fs:ident, $reply:ident) => {
        match $fs.state() {
            Ok(st) => st,
            Err(e) => return $reply.error(e),
        }
    };
}

impl Filesystem for Fs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let st = state_or_reply!(self, reply);
        let found = (parent == INodeNo::ROOT)
            .then(|| name.to_str().and_then(|n| st.names.get(n)))
            .flatten();
        match found {
            Some(&ino) => reply.entry(&TTL, &self.attr(ino, &st.nodes[&ino]), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let st = state_or_reply!(self, reply);
        match st.nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &self.attr(ino.0, n)),
            None => reply.error(Errno::ENOENT),
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
        let mut st = state_or_reply!(self, reply);
        let Some(node) = st.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if let Some(len) = size {
            node.file.set_len(len);
        }
        reply.attr(&TTL, &self.attr(ino.0, node));
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let kind = match mode & libc::S_IFMT {
            libc::S_IFSOCK => FileType::Socket,
            libc::S_IFREG => FileType::RegularFile,
            _ => return reply.error(Errno::EPERM),
        };
        match self.make(name, kind) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        match self.make(name, FileType::RegularFile) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut st = state_or_reply!(self, reply);
        match name.to_str().and_then(|n| st.names.remove(n)) {
            Some(_) => reply.ok(),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        name: &OsStr,
        _newparent: INodeNo,
        newname: &OsStr,
        _flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mut st = state_or_reply!(self, reply);
        let (Some(from), Some(to)) = (name.to_str(), newname.to_str()) else {
            return reply.error(Errno::EINVAL);
        };
        match st.names.remove(from) {
            Some(ino) => {
                st.names.insert(to.to_string(), ino);
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut st = state_or_reply!(self, reply);
        let Some(node) = st.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        if flags.0 & libc::O_TRUNC != 0 {
            node.file.set_len(0);
        }
        reply.opened(FileHandle(0), FopenFlags::empty());
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let st = state_or_reply!(self, reply);
        let Some(node) = st.nodes.get(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let live = &node.file.live;
        let start = (offset as usize).min(live.len());
        let end = (offset as usize + size as usize).min(live.len());
        reply.data(&live[start..end]);
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut st = state_or_reply!(self, reply);
        let ring = issued_by_a_ring(req.pid());
        if ring {
            st.ring_writes += 1;
        }
        let Some(node) = st.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        node.file.write(offset, data);
        if ring {
            node.unsynced_from_rings += 1;
        }
        reply.written(data.len() as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut st = state_or_reply!(self, reply);
        match st.nodes.get_mut(&ino.0) {
            Some(node) => {
                node.file.sync();
                node.unsynced_from_rings = 0;
                reply.ok()
            }
            None => reply.error(Errno::ENOENT),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        match self.state() {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let st = state_or_reply!(self, reply);
        let mut all = vec![
            (1, FileType::Directory, ".".to_string()),
            (1, FileType::Directory, "..".to_string()),
        ];
        for (name, &ino) in &st.names {
            all.push((ino, st.nodes[&ino].kind, name.clone()));
        }
        for (i, (ino, kind, name)) in all.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), (i + 1) as u64, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // 64 GiB, nearly all free.
        reply.statfs(
            16 << 20,
            16 << 20,
            16 << 20,
            1 << 20,
            1 << 20,
            4096,
            255,
            4096,
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut st = state_or_reply!(self, reply);
        let Some(node) = st.nodes.get_mut(&ino.0) else {
            return reply.error(Errno::ENOENT);
        };
        let keep_size = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if mode
            & !(libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE)
            != 0
        {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let len = node.file.live.len() as u64;
        let end = offset + length;
        if zero {
            // Zero what exists (and, without KEEP_SIZE, what the range adds).
            let upto = if keep_size { end.min(len) } else { end };
            if upto > offset {
                node.file
                    .write(offset, &vec![0u8; (upto - offset) as usize]);
            }
        } else if !keep_size && end > len {
            node.file.set_len(end);
        }
        reply.ok();
    }
}

/// A mounted crashfs.
pub struct CrashFs {
    st: Arc<Mutex<State>>,
    session: Option<fuser::BackgroundSession>,
    dir: PathBuf,
}

impl CrashFs {
    /// Mount an empty crashfs on `dir` (an empty directory).
    pub fn mount(dir: &Path) -> CrashFs {
        let mut root = State {
            next_ino: 1,
            ..State::default()
        };
        root.nodes.insert(1, Node::new(FileType::Directory));
        let st = Arc::new(Mutex::new(root));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            fuser::MountOption::FSName("crashfs".into()),
            fuser::MountOption::NoAtime,
        ];
        config.n_threads = Some(4);
        let fs = Fs {
            st: st.clone(),
            born: SystemTime::now(),
        };
        let session = fuser::spawn_mount(fs, dir, &config).expect("mount crashfs");
        CrashFs {
            st,
            session: Some(session),
            dir: dir.to_path_buf(),
        }
    }

    /// Cut the power: every later request fails with EIO, and each
    /// file's pending changes are kept, lost or torn at random (`seed`).
    pub fn cut(&self, seed: u64) -> CutReport {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut st = self.st.lock().unwrap();
        st.cut = true;
        let mut report = CutReport {
            ring_writes: st.ring_writes,
            ..CutReport::default()
        };
        let mut inos: Vec<u64> = st.nodes.keys().copied().collect();
        inos.sort();
        for ino in inos {
            let node = st.nodes.get_mut(&ino).unwrap();
            report.from_rings += node.unsynced_from_rings;
            node.file.lose_power(&mut rng, &mut report.changes);
        }
        report
    }

    /// Write every regular file's durable image into `dir` (created).
    pub fn write_image(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        let st = self.st.lock().unwrap();
        for (name, ino) in &st.names {
            let node = &st.nodes[ino];
            if node.kind == FileType::RegularFile {
                std::fs::write(dir.join(name), &node.file.durable).unwrap();
            }
        }
    }
}

impl Drop for CrashFs {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            if s.umount_and_join().is_err() {
                let c = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: umount2 with a valid C string.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}
