//! The eventfds rings signal their completions to.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// A new non-blocking, close-on-exec eventfd holding `initial`: what a
/// ring signals its completions to (its reaper waits for it in poll(2)
/// or epoll).
pub fn new_eventfd(initial: u32) -> io::Result<OwnedFd> {
    // SAFETY: no pointer is passed; a descriptor returned is new and ours.
    let fd = unsafe { libc::eventfd(initial, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
