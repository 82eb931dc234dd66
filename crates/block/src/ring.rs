//! An io_uring shared by two threads of one connection: one queues reads
//! and submits them in batches, the other waits for their completions.
//! ARCHITECTURE.md, "Direct I/O through io_uring".

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types, EnterFlags, IoUring};
use parking_lot::Mutex;

use crate::aio::Aio;

pub use crate::ring_req::Io;

/// A ring: submission side behind one lock, completion side behind another,
/// so one thread may queue while another reaps. Or, made by
/// [`Ring::native`], a Linux native AIO context behind the same calls.
pub struct Ring {
    kind: Kind,
}

enum Kind {
    Uring(Uring),
    Native(Aio),
}

struct Uring {
    ring: IoUring,
    /// Held while pushing to the submission queue or submitting it:
    /// entries queued since the last submission.
    sq: Mutex<u32>,
    /// Held while taking completions off the queue (not while waiting
    /// for one), so one thread may take what is in while another waits.
    cq: Mutex<()>,
    /// Made by [`Ring::for_one_thread`]: completions are posted only
    /// when the thread enters the kernel asking for them.
    deferred: bool,
}

fn again(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EAGAIN))
}

impl Ring {
    /// A ring of `entries` submission slots (completions: twice that).
    /// Fails where io_uring is not available (an old kernel, a seccomp
    /// filter, `kernel.io_uring_disabled`); the caller then reads by itself.
    ///
    /// Its operations are issued inline by the submitting thread, inside
    /// `io_uring_enter` (the file system's mapping, the block layer, the
    /// device's doorbell): cheapest in CPU. Handing small ones to the
    /// kernel's io-wq threads (`IOSQE_ASYNC`) was tried for vhost-user
    /// queues and lost once they submit each request as it is planned
    /// (PERFORMANCE.md).
    pub fn new(entries: u32) -> io::Result<Ring> {
        Ok(Self::uring(IoUring::new(entries)?, false))
    }

    /// A ring that one thread both submits to and reaps, and the one
    /// that makes it (`IORING_SETUP_SINGLE_ISSUER | DEFER_TASKRUN`): the
    /// kernel posts completions only when that thread asks for them
    /// ([`Ring::reap_some`]), not by interrupting it at each one. Where
    /// the kernel cannot (before 6.1), an ordinary ring.
    pub fn for_one_thread(entries: u32) -> io::Result<Ring> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(entries);
        let (ring, deferred) = match ring {
            Ok(r) => (r, true),
            Err(_) => (IoUring::new(entries)?, false),
        };
        Ok(Self::uring(ring, deferred))
    }

    /// A `Ring` over the io_uring `ring` (`deferred`: set up with
    /// `DEFER_TASKRUN`).
    fn uring(ring: IoUring, deferred: bool) -> Ring {
        Ring {
            kind: Kind::Uring(Uring {
                ring,
                sq: Mutex::new(0),
                cq: Mutex::new(()),
                deferred,
            }),
        }
    }

    /// A Linux native AIO context for `depth` operations in flight (QEMU's
    /// `aio=native`; crate::aio). Its operations are issued inline by
    /// [`Ring::submit`], and asynchronous only on `O_DIRECT` files.
    pub fn native(depth: u32) -> io::Result<Ring> {
        Ok(Ring {
            kind: Kind::Native(Aio::new(depth)?),
        })
    }

    /// Queue the read or write `io`; it starts at the next
    /// [`Ring::submit`] (or earlier, when the queue is full and is
    /// submitted to make room). Its completion carries `io.user_data`.
    ///
    /// # Safety
    /// `io.ptr[..io.len]` must stay valid, and be neither written (nor, for a
    /// read, read) by anyone else, until this completion has been reaped;
    /// `io.fd` must stay open until then.
    pub unsafe fn push_io(&self, io: Io) -> io::Result<()> {
        match &self.kind {
            // SAFETY: the caller's contract, passed on.
            Kind::Uring(r) => unsafe { r.push_io(io) },
            Kind::Native(a) => unsafe { a.push_io(io) },
        }
    }

    /// Queue a no-op whose completion carries `user_data` (a wake-up for
    /// the reaping thread).
    pub fn push_nop(&self, user_data: u64) -> io::Result<()> {
        match &self.kind {
            Kind::Uring(r) => r.push_nop(user_data),
            Kind::Native(a) => a.push_nop(user_data),
        }
    }

    /// Start everything queued with one system call (none when nothing
    /// was queued since the last).
    pub fn submit(&self) -> io::Result<()> {
        match &self.kind {
            Kind::Uring(r) => r.submit(),
            Kind::Native(a) => a.submit(),
        }
    }

    /// Wait until at least one completion is in, then hand every one in to
    /// `f` as (user_data, result: bytes, or a negated errno).
    pub fn reap(&self, f: impl FnMut(u64, i32)) -> io::Result<()> {
        self.reap_some(true, f).map(|_| ())
    }

    /// Hand every completion in to `f` (as [`Ring::reap`]); with `wait`,
    /// first wait until there is one. Returns how many were handed over.
    pub fn reap_some(&self, wait: bool, f: impl FnMut(u64, i32)) -> io::Result<usize> {
        match &self.kind {
            Kind::Uring(r) => r.reap_some(wait, f),
            Kind::Native(a) => a.reap_some(wait, f),
        }
    }

    /// Have the kernel signal the eventfd `fd` whenever a completion is
    /// posted (for a thread that waits for other events too, in epoll).
    pub fn register_eventfd(&self, fd: RawFd) -> io::Result<()> {
        match &self.kind {
            Kind::Uring(r) => r.register_eventfd(fd),
            Kind::Native(a) => a.register_eventfd(fd),
        }
    }
}

impl Uring {
    /// [`Ring::push_io`] on the io_uring.
    ///
    /// # Safety
    /// As [`Ring::push_io`].
    unsafe fn push_io(&self, io: Io) -> io::Result<()> {
        let Io {
            write,
            fd,
            ptr,
            len,
            offset,
            user_data,
        } = io;
        let e = if write {
            opcode::Write::new(types::Fd(fd), ptr, len)
                .offset(offset)
                .build()
        } else {
            opcode::Read::new(types::Fd(fd), ptr, len)
                .offset(offset)
                .build()
        };
        let e = e.user_data(user_data);
        self.push(&e)
    }

    /// [`Ring::push_nop`] on the io_uring.
    fn push_nop(&self, user_data: u64) -> io::Result<()> {
        let e = opcode::Nop::new().build().user_data(user_data);
        // SAFETY: a no-op points at no memory.
        unsafe { self.push(&e) }
    }

    unsafe fn push(&self, e: &io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            {
                let mut queued = self.sq.lock();
                // SAFETY: the only submission queue in use: `sq` is held.
                let mut sq = unsafe { self.ring.submission_shared() };
                // SAFETY: the caller vouches for the memory the entry names.
                if unsafe { sq.push(e) }.is_ok() {
                    *queued += 1;
                    return Ok(());
                }
            }
            // Full: start what is queued to make room.
            self.submit()?;
        }
    }

    /// Start every queued read with one system call (none when nothing
    /// was queued since the last).
    fn submit(&self) -> io::Result<()> {
        loop {
            let r = {
                let mut queued = self.sq.lock();
                if *queued == 0 {
                    return Ok(());
                }
                let r = self.ring.submit();
                if r.is_ok() {
                    // What the kernel did not take yet goes at the next call.
                    // SAFETY: the only submission queue in use: `sq` is held.
                    *queued = unsafe { self.ring.submission_shared() }.len() as u32;
                }
                r
            };
            match r {
                Ok(_) => return Ok(()),
                Err(e) if again(&e) => {}
                // The completion queue is full and the kernel holds
                // completions back: the reaping thread makes room (and
                // may need the submission lock for it, so it is not held
                // while waiting).
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => std::thread::yield_now(),
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Ring::reap_some`] on the io_uring.
    fn reap_some(&self, wait: bool, mut f: impl FnMut(u64, i32)) -> io::Result<usize> {
        if self.deferred && !wait {
            // Have the kernel post what has completed.
            self.enter(0)?;
        }
        loop {
            let mut n = 0;
            {
                let _g = self.cq.lock();
                // SAFETY: the only completion queue in use: `cq` is held.
                let mut cq = unsafe { self.ring.completion_shared() };
                cq.sync();
                for e in &mut cq {
                    f(e.user_data(), e.result());
                    n += 1;
                }
            }
            if n > 0 || !wait {
                return Ok(n);
            }
            // Submit nothing (the queuing thread decides when), wait for one.
            self.enter(1)?;
        }
    }

    /// Enter the kernel to have at least `min` completions posted (run
    /// the completion work of a deferred ring, then wait), submitting
    /// nothing.
    fn enter(&self, min: u32) -> io::Result<()> {
        // SAFETY: no argument structure is passed.
        let r = unsafe {
            self.ring.submitter().enter::<libc::sigset_t>(
                0,
                min,
                EnterFlags::GETEVENTS.bits(),
                None,
            )
        };
        match r {
            Ok(_) => Ok(()),
            Err(e) if again(&e) || e.raw_os_error() == Some(libc::EBUSY) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// [`Ring::register_eventfd`] on the io_uring.
    fn register_eventfd(&self, fd: RawFd) -> io::Result<()> {
        self.ring.submitter().register_eventfd(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    /// `reads` 4 KiB reads of a 64 KiB file queued by one thread through
    /// `ring`, and a no-op, reaped by another, started only once all are
    /// submitted with `reap_after`; each read's data checked.
    fn reads_complete_on_another_thread(ring: &Ring, reads: usize, reap_after: bool) {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let mut bufs: Vec<AlignedBuf> = (0..reads).map(|_| AlignedBuf::zeroed(4096)).collect();
        std::thread::scope(|s| {
            let reap = move || {
                let mut got = Vec::new();
                while got.len() < reads + 1 {
                    ring.reap(|u, r| got.push((u, r))).unwrap();
                }
                got
            };
            let reaper = (!reap_after).then(|| s.spawn(reap));
            for (i, b) in bufs.iter_mut().enumerate() {
                // SAFETY: the buffers outlive the scope, which joins the reaper.
                unsafe {
                    ring.push_io(Io {
                        write: false,
                        fd: f.as_raw_fd(),
                        ptr: b[..].as_mut_ptr(),
                        len: 4096,
                        offset: (i % 16) as u64 * 4096,
                        user_data: i as u64,
                    })
                    .unwrap();
                }
            }
            ring.push_nop(u64::MAX).unwrap();
            ring.submit().unwrap();
            let reaper = reaper.unwrap_or_else(|| s.spawn(reap));
            let mut got = reaper.join().unwrap();
            got.sort();
            let want: Vec<(u64, i32)> = (0..reads as u64)
                .map(|i| (i, 4096))
                .chain([(u64::MAX, 0)])
                .collect();
            // A native no-op is a poll: its result is the events seen.
            let got: Vec<(u64, i32)> = got
                .into_iter()
                .map(|(u, r)| (u, if u == u64::MAX { 0 } else { r }))
                .collect();
            assert_eq!(got, want);
        });
        for (i, b) in bufs.iter().enumerate() {
            let at = (i % 16) * 4096;
            assert_eq!(&b[..], &data[at..at + 4096], "read {i}");
        }
    }

    #[test]
    fn reads_queued_by_one_thread_complete_on_another() {
        let Ok(ring) = Ring::new(4) else {
            eprintln!("io_uring is not available here: skipped");
            return;
        };
        // Ten reads through a four-entry queue: pushing submits to make room.
        reads_complete_on_another_thread(&ring, 10, false);
    }

    #[test]
    fn native_aio_reads_complete_on_another_thread_even_past_its_depth() {
        let ring = Ring::native(4).expect("native AIO");
        // A file in the page cache completes each read inside io_submit,
        // and its completion holds a slot until reaped: 300 reads fill
        // the context long before the reaper starts, and submitting
        // takes completions to make room, kept for the reaper.
        reads_complete_on_another_thread(&ring, 300, true);
        // With the reaper running from the start, asleep in io_getevents
        // when a submission takes what it waits for: the wake-up no-op.
        reads_complete_on_another_thread(&ring, 300, false);
    }

    #[test]
    fn a_native_operation_the_kernel_refuses_completes_with_its_error_and_wakes_the_reaper() {
        let ring = Ring::native(4).expect("native AIO");
        let mut buf = AlignedBuf::zeroed(4096);
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let ring = &ring;
            // Asleep in io_getevents before the refused read is submitted.
            s.spawn(move || {
                let mut got = Vec::new();
                ring.reap(|u, r| got.push((u, r))).unwrap();
                tx.send(got).unwrap();
            });
            std::thread::sleep(std::time::Duration::from_millis(100));
            // SAFETY: the buffer outlives the scope; the kernel refuses
            // the read before touching it.
            let io = Io {
                write: false,
                fd: -1,
                ptr: buf[..].as_mut_ptr(),
                len: 4096,
                offset: 0,
                user_data: 7,
            };
            unsafe { ring.push_io(io) }.unwrap();
            ring.submit().unwrap();
            // A minute is only the bound on noticing a reaper that was
            // never woken; a no-op then releases it, so the test fails
            // rather than hangs.
            match rx.recv_timeout(std::time::Duration::from_secs(60)) {
                Ok(got) => assert_eq!(got, vec![(7, -libc::EBADF)]),
                Err(_) => {
                    ring.push_nop(8).unwrap();
                    ring.submit().unwrap();
                    panic!("the reaper was never woken for the refused read");
                }
            }
        });
    }
}
