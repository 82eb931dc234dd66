//! Who is at the other end of a Unix socket: what the servers' transports
//! (NBD over a Unix socket, vhost-user-blk) name a local client by, and
//! the control socket its user by.

use std::os::fd::RawFd;

/// The process and user at the other end of Unix socket `fd`, when the
/// kernel says (`SO_PEERCRED`).
pub fn peer_cred(fd: RawFd) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the length given, which lives
    // for the call.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred)
}

/// The pid of the process at the other end of Unix socket `fd`, when the
/// kernel says.
pub fn peer_pid(fd: RawFd) -> Option<i32> {
    peer_cred(fd).map(|c| c.pid).filter(|&p| p > 0)
}
