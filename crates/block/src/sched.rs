//! A transport's I/O threads asking the CPU scheduler for short slices.
//!
//! Since Linux 6.12 a thread of the normal (fair, EEVDF) class may set its
//! own time slice with `sched_setattr(2)`, passing it as `sched_runtime`
//! (0.1 to 100 ms, no privilege needed). A shorter slice gives the thread
//! an earlier virtual deadline each time it wakes, so it runs sooner after
//! a wake-up and is preempted sooner when it runs long: the scheduler's
//! way of saying "latency-sensitive, little work per wake-up", which is
//! what a thread that reads a request, starts or copies it and answers is.
//!
//! Why strata asks for it (PERFORMANCE.md, "Many disks"): every disk of a
//! datastore writes into one pool file, whose inode lock the kernel takes
//! for each buffered write. When the CPUs are oversubscribed (64 clients
//! on two cores), a connection thread preempted while it holds that lock
//! stalls the writes of every disk until the scheduler picks it again,
//! which with the default slice can take tens of milliseconds; 64
//! processes on 64 files stall one disk each. A short slice brings the
//! preempted holder back sooner.
//!
//! Older kernels ignore the field for this class (or refuse it): the
//! thread then keeps the default slice and nothing else changes.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The smallest and largest slice the kernel accepts (it clamps to these).
pub const MIN_SLICE: Duration = Duration::from_micros(100);
pub const MAX_SLICE: Duration = Duration::from_millis(100);

/// `struct sched_attr` as `sched_setattr(2)` takes it (the first version's
/// 48 bytes plus the utilization clamps: 56).
#[repr(C)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Keep the calling thread in the normal class at its current nice value
/// and ask for `slice` (clamped to [`MIN_SLICE`]..=[`MAX_SLICE`]). Threads
/// it creates afterwards inherit the slice.
pub fn set_thread_slice(slice: Duration) -> io::Result<()> {
    let slice = slice.clamp(MIN_SLICE, MAX_SLICE);
    // SAFETY: getpriority has no memory arguments; -1 can be a valid
    // nice value, so errno tells a failure apart (cleared first).
    let nice = unsafe {
        *libc::__errno_location() = 0;
        let n = libc::getpriority(libc::PRIO_PROCESS, 0);
        if n == -1 && *libc::__errno_location() != 0 {
            return Err(io::Error::last_os_error());
        }
        n
    };
    let attr = SchedAttr {
        size: std::mem::size_of::<SchedAttr>() as u32,
        policy: libc::SCHED_OTHER as u32,
        flags: 0,
        nice,
        priority: 0,
        runtime: slice.as_nanos() as u64,
        deadline: 0,
        period: 0,
        util_min: 0,
        util_max: 0,
    };
    // SAFETY: attr is a live, correctly sized sched_attr for the call's
    // duration; pid 0 is the calling thread; flags must be 0.
    let r = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// [`set_thread_slice`] for a transport's thread: a kernel that refuses it
/// is said once per process (at debug level: the thread just keeps the
/// default slice), not once per connection.
pub fn ask_for_slice(slice: Duration) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if let Err(e) = set_thread_slice(slice) {
        if !SAID.swap(true, Ordering::Relaxed) {
            tracing::debug!("the kernel keeps its default scheduler slice: {e}");
        }
    }
}

/// The calling thread's slice as the kernel reports it
/// (`/proc/thread-self/sched`'s `se.slice`, kernels since 6.6), or `None`.
pub fn thread_slice() -> Option<Duration> {
    let text = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
    slice_of(&text)
}

/// `se.slice` from the text of a `/proc/.../sched` file.
pub fn slice_of(sched: &str) -> Option<Duration> {
    let line = sched.lines().find(|l| l.starts_with("se.slice"))?;
    let ns = line.rsplit(':').next()?.trim().parse::<u64>().ok()?;
    Some(Duration::from_nanos(ns))
}

/// Whether the running kernel honours per-thread slices (Linux 6.12 or
/// later).
pub fn kernel_has_thread_slices() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (6, 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_where_the_kernel_has_them() {
        let before = thread_slice();
        let got = std::thread::spawn(|| {
            set_thread_slice(Duration::from_micros(250)).ok()?;
            let mine = thread_slice();
            // A thread started now inherits it.
            let child = std::thread::spawn(thread_slice).join().unwrap();
            Some((mine, child))
        })
        .join()
        .unwrap();
        match (before, got) {
            // A kernel with EEVDF slices (6.12+) honours and passes it on.
            (Some(_), Some((mine, child))) if kernel_has_thread_slices() => {
                assert_eq!(mine, Some(Duration::from_micros(250)));
                assert_eq!(child, Some(Duration::from_micros(250)));
            }
            // Elsewhere the call may fail or be ignored: nothing to check
            // but that it did not disturb this thread.
            _ => assert_eq!(thread_slice(), before),
        }
    }

    #[test]
    fn out_of_range_slices_are_clamped() {
        let got = std::thread::spawn(|| {
            set_thread_slice(Duration::from_nanos(1)).ok()?;
            thread_slice()
        })
        .join()
        .unwrap();
        if kernel_has_thread_slices() {
            assert_eq!(got, Some(MIN_SLICE));
        }
    }

    #[test]
    fn the_proc_line_is_parsed() {
        let text = "se.exec_start    :   12.5\nse.slice                                     :              1400000\n";
        assert_eq!(slice_of(text), Some(Duration::from_micros(1400)));
        assert_eq!(slice_of("nothing here"), None);
    }
}
