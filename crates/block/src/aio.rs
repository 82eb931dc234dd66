//! Linux native AIO (`io_setup`, `io_submit`, `io_getevents`) behind the
//! same calls as an io_uring ring (ring.rs): QEMU's `aio=native`.
//!
//! Why a second kind of ring: a direct read's completion reaches an
//! io_uring submitter as task work, run only when that thread next enters
//! the kernel, which wakes a thread asleep in another loop (a vhost-user
//! queue's epoll) twice: once to run the task work, once for the eventfd
//! it then signals. Native AIO writes the completion into the context's
//! ring and signals the eventfd from the device's interrupt, so the
//! sleeping thread is woken once, with the completion already there.
//! Issue is always inline (`io_submit` runs the file system's mapping and
//! the block layer in the caller), and only `O_DIRECT` files are
//! asynchronous: under `--cache none` that is every grain file.
//! ARCHITECTURE.md, "Direct I/O through io_uring".

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use parking_lot::Mutex;

use crate::ring_req::Io;

const IOCB_CMD_PREAD: u16 = 0;
const IOCB_CMD_PWRITE: u16 = 1;
const IOCB_CMD_POLL: u16 = 5;
const IOCB_FLAG_RESFD: u32 = 1;

/// `struct iocb` of <linux/aio_abi.h>, as laid out on a little-endian
/// machine (`aio_key` before `aio_rw_flags`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Iocb {
    data: u64,
    key: u32,
    rw_flags: i32,
    opcode: u16,
    reqprio: i16,
    fildes: u32,
    buf: u64,
    nbytes: u64,
    offset: i64,
    reserved2: u64,
    flags: u32,
    resfd: u32,
}

/// `struct io_event`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct IoEvent {
    data: u64,
    obj: u64,
    res: i64,
    res2: i64,
}

const _: () = assert!(std::mem::size_of::<Iocb>() == 64);
const _: () = assert!(std::mem::size_of::<IoEvent>() == 32);
#[cfg(not(target_endian = "little"))]
compile_error!("the iocb layout here is the little-endian one");

/// User data of the no-op that wakes a reaper after a submission took
/// completions to make room (never handed over).
const WAKE: u64 = u64::MAX - 1;

/// How many completions one `io_getevents` takes at most.
const BATCH: usize = 64;

fn syscall_result(r: libc::c_long) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A native AIO context with its submission queue.
pub struct Aio {
    ctx: libc::c_ulong,
    /// Operations queued since the last submission.
    queued: Mutex<Vec<Iocb>>,
    /// Completions taken by a submission that had to make room, handed
    /// over by the next reap.
    early: Mutex<VecDeque<(u64, i32)>>,
    /// The eventfd every completion signals (-1: none).
    resfd: AtomicI32,
    /// Always readable: a no-op is a poll of it, done at once.
    ready: OwnedFd,
    /// How many operations the context holds at most.
    depth: usize,
}

// SAFETY: the context is a kernel handle usable from any thread; the
// queues are behind locks.
unsafe impl Send for Aio {}
unsafe impl Sync for Aio {}

impl Aio {
    /// A context for `depth` operations in flight. Fails where native AIO
    /// is not available (or `fs.aio-max-nr` is used up).
    pub fn new(depth: u32) -> io::Result<Aio> {
        let mut ctx: libc::c_ulong = 0;
        // SAFETY: io_setup writes the context id into `ctx`.
        syscall_result(unsafe { libc::syscall(libc::SYS_io_setup, depth, &mut ctx) })?;
        let ready = match crate::eventfd::new_eventfd(1) {
            Ok(fd) => fd,
            Err(e) => {
                // SAFETY: the context was set up above and holds nothing.
                unsafe { libc::syscall(libc::SYS_io_destroy, ctx) };
                return Err(e);
            }
        };
        Ok(Aio {
            ctx,
            queued: Mutex::new(Vec::new()),
            early: Mutex::new(VecDeque::new()),
            resfd: AtomicI32::new(-1),
            ready,
            depth: depth as usize,
        })
    }

    fn with_resfd(&self, mut cb: Iocb) -> Iocb {
        let resfd = self.resfd.load(Ordering::Relaxed);
        if resfd >= 0 {
            cb.flags |= IOCB_FLAG_RESFD;
            cb.resfd = resfd as u32;
        }
        cb
    }

    fn queue(&self, cb: Iocb) -> io::Result<()> {
        let full = {
            let mut q = self.queued.lock();
            q.push(cb);
            q.len() >= self.depth
        };
        if full {
            self.submit()?;
        }
        Ok(())
    }

    /// Queue the read (or write) `io`; as the io_uring ring's `push_io`.
    ///
    /// # Safety
    /// `io.ptr[..io.len]` must stay valid, and be touched by no one else,
    /// until this completion has been reaped; `io.fd` must stay open
    /// until then.
    pub unsafe fn push_io(&self, io: Io) -> io::Result<()> {
        self.queue(self.with_resfd(Iocb {
            data: io.user_data,
            opcode: if io.write {
                IOCB_CMD_PWRITE
            } else {
                IOCB_CMD_PREAD
            },
            fildes: io.fd as u32,
            buf: io.ptr as u64,
            nbytes: io.len as u64,
            offset: io.offset as i64,
            ..Iocb::default()
        }))
    }

    /// An operation that completes at once with `user_data`: a poll of
    /// the always-readable eventfd.
    fn nop(&self, user_data: u64) -> Iocb {
        self.with_resfd(Iocb {
            data: user_data,
            opcode: IOCB_CMD_POLL,
            fildes: self.ready.as_raw_fd() as u32,
            buf: libc::POLLIN as u64,
            ..Iocb::default()
        })
    }

    /// Queue an operation that completes at once with `user_data`.
    pub fn push_nop(&self, user_data: u64) -> io::Result<()> {
        self.queue(self.nop(user_data))
    }

    /// Start every queued operation. One the kernel refuses outright (a
    /// bad descriptor, a misaligned direct transfer) completes with its
    /// error, as an io_uring would report it; when the context is full,
    /// completions are taken (kept for the next reap) to make room.
    pub fn submit(&self) -> io::Result<()> {
        let mut q = self.queued.lock();
        let mut ptrs: Vec<*mut Iocb> = q.iter_mut().map(|c| c as *mut Iocb).collect();
        let mut at = 0;
        while at < ptrs.len() {
            let rest = &mut ptrs[at..];
            // SAFETY: the pointers name the live iocbs of `q`, which stays
            // locked and unchanged until they are all submitted; the kernel
            // copies each before io_submit returns.
            let r = syscall_result(unsafe {
                libc::syscall(
                    libc::SYS_io_submit,
                    self.ctx,
                    rest.len() as libc::c_long,
                    rest.as_mut_ptr(),
                )
            });
            match r {
                Ok(n) => at += n,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR) => {}
                    Some(libc::EAGAIN) => {
                        let mut got = Vec::new();
                        self.get_events(1, &mut |ud, res| got.push((ud, res)))?;
                        self.keep_for_reaper(got);
                    }
                    Some(errno) => {
                        self.keep_for_reaper([(q[at].data, -errno)]);
                        at += 1;
                    }
                    None => return Err(e),
                },
            }
        }
        q.clear();
        Ok(())
    }

    /// Keep completions that a submission took (to make room) or made up
    /// (an operation refused) for the next reap, and wake a reaper that
    /// may be asleep in `io_getevents` waiting for them: a no-op (skipped
    /// by the reap), which also signals the eventfd of one that polls.
    fn keep_for_reaper(&self, got: impl IntoIterator<Item = (u64, i32)>) {
        self.early.lock().extend(got);
        let mut wake = self.nop(WAKE);
        let mut ptr = &mut wake as *mut Iocb;
        // SAFETY: one live iocb, copied by the kernel. Should it fail (a
        // full context), the reaper still wakes at the next completion.
        unsafe { libc::syscall(libc::SYS_io_submit, self.ctx, 1, &mut ptr) };
    }

    /// Take up to [`BATCH`] completions, waiting for at least `min`: how
    /// many were taken, and how many of them handed to `f` (not wake-ups).
    fn get_events(&self, min: usize, f: &mut impl FnMut(u64, i32)) -> io::Result<(usize, usize)> {
        let mut events = [IoEvent::default(); BATCH];
        let zero = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let timeout: *const libc::timespec = if min == 0 { &zero } else { std::ptr::null() };
        loop {
            // SAFETY: `events` has room for BATCH events; `timeout` is
            // null (wait) or points at a live timespec.
            let r = syscall_result(unsafe {
                libc::syscall(
                    libc::SYS_io_getevents,
                    self.ctx,
                    min as libc::c_long,
                    BATCH as libc::c_long,
                    events.as_mut_ptr(),
                    timeout,
                )
            });
            match r {
                Ok(n) => {
                    let mut handed = 0;
                    for e in events[..n].iter().filter(|e| e.data != WAKE) {
                        f(e.data, e.res as i32);
                        handed += 1;
                    }
                    return Ok((n, handed));
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Hand every completion in to `f` (user data, bytes or a negated
    /// errno); with `wait`, first wait until there is one. How many.
    pub fn reap_some(&self, wait: bool, mut f: impl FnMut(u64, i32)) -> io::Result<usize> {
        let mut n = 0;
        loop {
            let early: Vec<(u64, i32)> = self.early.lock().drain(..).collect();
            n += early.len();
            for (ud, res) in early {
                f(ud, res);
            }
            let min = if wait && n == 0 { 1 } else { 0 };
            let (taken, handed) = self.get_events(min, &mut f)?;
            n += handed;
            if taken < BATCH && (n > 0 || !wait) {
                return Ok(n);
            }
        }
    }

    /// Have every completion (of operations queued from now on) signal
    /// the eventfd `fd`.
    pub fn register_eventfd(&self, fd: RawFd) -> io::Result<()> {
        self.resfd.store(fd, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for Aio {
    fn drop(&mut self) {
        // SAFETY: the context is ours; destroying it waits for what is in
        // flight (nothing, once its owner has reaped everything).
        unsafe { libc::syscall(libc::SYS_io_destroy, self.ctx) };
    }
}
