//! The control-channel relay between a frontend and the rust-vmm daemon.
//!
//! The frontend's socket is accepted here; the daemon gets the other end
//! of a private connection, and two threads copy vhost-user messages
//! (12-byte header, payload, file descriptors passed with SCM_RIGHTS)
//! between them unchanged. The data path does not pass through here:
//! guest memory and the virtqueues' eventfds are handed to the daemon in
//! these messages and used directly.
//!
//! The relay exists for one message the `vhost` crate cannot send: the
//! backend channel's CONFIG_CHANGE_MSG, which tells the frontend to read
//! the configuration space again (a disk grew). On its way through,
//! `SET_BACKEND_REQ_FD` has its descriptor duplicated, and
//! [`BackendChannel::config_changed`] writes the message on that copy.

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

/// `VHOST_USER_SET_BACKEND_REQ_FD` (formerly SET_SLAVE_REQ_FD).
const SET_BACKEND_REQ_FD: u32 = 21;
/// `VHOST_USER_BACKEND_CONFIG_CHANGE_MSG` on the backend channel.
const BACKEND_CONFIG_CHANGE_MSG: u32 = 2;
/// Header flags: protocol version 1.
const VERSION_1: u32 = 0x1;
const HEADER_BYTES: usize = 12;
/// Largest payload relayed (the spec's messages are far smaller; a
/// larger size means a broken or hostile peer).
const MAX_PAYLOAD: usize = 64 * 1024;
/// Most descriptors in one message (memory regions, at most 8 in QEMU's
/// SET_MEM_TABLE; 32 leaves room).
const MAX_FDS: usize = 32;

/// The frontend's end of the backend channel, once it sent one.
#[derive(Default)]
pub struct BackendChannel {
    sock: Mutex<Option<UnixStream>>,
}

impl BackendChannel {
    /// Ask the frontend to read the configuration space again. `false`
    /// when there is no channel (protocol feature not negotiated) or the
    /// write failed.
    pub fn config_changed(&self) -> bool {
        let mut g = self.sock.lock().unwrap();
        let Some(s) = g.as_mut() else { return false };
        let mut h = [0u8; HEADER_BYTES];
        h[0..4].copy_from_slice(&BACKEND_CONFIG_CHANGE_MSG.to_le_bytes());
        h[4..8].copy_from_slice(&VERSION_1.to_le_bytes());
        s.write_all(&h).is_ok()
    }

    fn set(&self, fd: OwnedFd) {
        *self.sock.lock().unwrap() = Some(UnixStream::from(fd));
    }
}

/// `recvmsg` into `buf`, collecting passed descriptors into `fds`.
fn recv_with_fds(s: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: CMSG_SPACE is a pure computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: zeroed msghdr is a valid "empty" value; fields set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    let n = loop {
        // SAFETY: msg points at live buffers for the duration of the call.
        let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    // SAFETY: walking the control buffer the kernel filled, with the
    // CMSG_* helpers and bounds it set.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other(
            "vhost-user message carried too many descriptors",
        ));
    }
    Ok(n)
}

/// `sendmsg` all of `buf` with `fds` attached to its first byte.
fn send_with_fds(s: &UnixStream, buf: &[u8], fds: &[OwnedFd]) -> io::Result<()> {
    if fds.is_empty() {
        let mut w = s;
        return w.write_all(buf);
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let bytes = std::mem::size_of_val(raw.as_slice());
    // SAFETY: pure computations.
    let space = unsafe { libc::CMSG_SPACE(bytes as u32) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut _,
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr, then filled; the control buffer is sized by
    // CMSG_SPACE for the descriptors written into it.
    let n = unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(bytes as u32) as _;
        std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), libc::CMSG_DATA(c), bytes);
        libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    if n < buf.len() {
        let mut w = s;
        w.write_all(&buf[n..])?;
    }
    Ok(())
}

/// Fill `buf` completely (descriptors may come with any chunk); `Ok(false)`
/// on a clean end of stream before the first byte.
fn recv_exact(s: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<bool> {
    let mut at = 0;
    while at < buf.len() {
        let n = recv_with_fds(s, &mut buf[at..], fds)?;
        if n == 0 {
            if at == 0 {
                return Ok(false);
            }
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        at += n;
    }
    Ok(true)
}

/// Copy messages from `from` to `to` until either side closes; with
/// `channel`, keep a copy of the backend channel the frontend sends.
/// Both sockets are shut down when it returns, so the other direction's
/// relay and the daemon see the end too.
pub fn relay(
    from: &UnixStream,
    to: &UnixStream,
    channel: Option<&BackendChannel>,
) -> io::Result<()> {
    let r = relay_inner(from, to, channel);
    let _ = from.shutdown(std::net::Shutdown::Both);
    let _ = to.shutdown(std::net::Shutdown::Both);
    r
}

fn relay_inner(
    from: &UnixStream,
    to: &UnixStream,
    channel: Option<&BackendChannel>,
) -> io::Result<()> {
    let mut msg = vec![0u8; HEADER_BYTES];
    loop {
        let mut fds = Vec::new();
        msg.resize(HEADER_BYTES, 0);
        if !recv_exact(from, &mut msg[..HEADER_BYTES], &mut fds)? {
            return Ok(());
        }
        let request = u32::from_le_bytes(msg[0..4].try_into().unwrap());
        let size = u32::from_le_bytes(msg[8..12].try_into().unwrap()) as usize;
        if size > MAX_PAYLOAD {
            return Err(io::Error::other(format!(
                "vhost-user message {request} with a {size}-byte payload"
            )));
        }
        msg.resize(HEADER_BYTES + size, 0);
        if size > 0 && !recv_exact(from, &mut msg[HEADER_BYTES..], &mut fds)? {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if let (Some(ch), SET_BACKEND_REQ_FD) = (channel, request) {
            if let Some(fd) = fds.first() {
                ch.set(fd.try_clone()?);
            }
        }
        send_with_fds(to, &msg, &fds)?;
    }
}

/// A private connection for the daemon: a listener on a random abstract
/// socket name (no file, unguessable), connected at once.
pub fn private_pair() -> io::Result<(std::os::unix::net::UnixListener, UnixStream)> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let mut rnd = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut rnd)?;
    let name: String = rnd.iter().map(|b| format!("{b:02x}")).collect();
    let addr = SocketAddr::from_abstract_name(format!("strata-vhost-{name}").as_bytes())?;
    let l = UnixListener::bind_addr(&addr)?;
    let c = UnixStream::connect_addr(&addr)?;
    Ok((l, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_and_descriptors_pass_unchanged_and_the_channel_is_kept() {
        let (front, a) = UnixStream::pair().unwrap();
        let (b, back) = UnixStream::pair().unwrap();
        let ch = BackendChannel::default();
        std::thread::scope(|sc| {
            sc.spawn(|| relay(&a, &b, Some(&ch)));
            // A message with a payload and a descriptor (the backend
            // channel), then one without either.
            let (chan_front, chan_back) = UnixStream::pair().unwrap();
            let mut m = Vec::new();
            m.extend_from_slice(&SET_BACKEND_REQ_FD.to_le_bytes());
            m.extend_from_slice(&1u32.to_le_bytes());
            m.extend_from_slice(&8u32.to_le_bytes());
            m.extend_from_slice(&[7; 8]);
            let fd: OwnedFd = chan_back.into();
            send_with_fds(&front, &m, &[fd]).unwrap();
            let mut got = vec![0u8; m.len()];
            let mut fds = Vec::new();
            assert!(recv_exact(&back, &mut got, &mut fds).unwrap());
            assert_eq!(got, m);
            assert_eq!(fds.len(), 1, "the descriptor went through");
            // The relay kept a copy: a config change reaches the frontend.
            assert!(ch.config_changed());
            let mut h = [0u8; 12];
            let mut cf = &chan_front;
            cf.read_exact(&mut h).unwrap();
            assert_eq!(u32::from_le_bytes(h[0..4].try_into().unwrap()), 2);
            assert_eq!(u32::from_le_bytes(h[8..12].try_into().unwrap()), 0);
            // An oversized payload ends the relay rather than allocating it.
            let mut m = Vec::new();
            m.extend_from_slice(&1u32.to_le_bytes());
            m.extend_from_slice(&1u32.to_le_bytes());
            m.extend_from_slice(&u32::MAX.to_le_bytes());
            (&front).write_all(&m).unwrap();
            let mut rest = Vec::new();
            let _ = (&back).read_to_end(&mut rest);
            assert!(rest.is_empty());
        });
    }
}
