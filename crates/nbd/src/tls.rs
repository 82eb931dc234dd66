//! NBD over TLS (the protocol's `NBD_OPT_STARTTLS`): credentials in
//! QEMU's x509 directory layout, and [`Link`], the stream a connection is
//! served on, which turns into a TLS session in place when the client asks
//! for one.
//!
//! A connection's socket is cloned into a reader (the connection thread)
//! and writers (the workers, which write whole replies under the
//! connection's reply lock). Once TLS is up, every handle shares one
//! `rustls` session:
//! - a writer takes the session's `wire` lock, encrypts its bytes under the
//!   `state` lock, releases that, and sends the records while still holding
//!   `wire`, so records reach the socket in the order they were sealed;
//! - the reader reads ciphertext from the socket without any lock, then
//!   hands it to the session under `state`; anything the session must
//!   answer by itself (an alert, a key update) goes out through the
//!   writers' path (`wire` first, then `state`: one order everywhere).
//!
//! A connection that ends ends its TLS session first: shutting down a
//! [`Link`]'s sending side sends the session's close_notify, unless a
//! send already failed (a record may be cut off: more records would be
//! garbage) or a writer is still at the socket (it may be stuck there;
//! the shutdown is what frees it).

use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::SingleCertAndKey;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

use crate::{Authz, NbdStream};

mod keys;
use keys::creds_error;

/// Whether a server that has credentials insists on TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Every option but `STARTTLS` and `ABORT` is refused with
    /// `NBD_REP_ERR_TLS_REQD` until TLS is up (the spec's FORCEDTLS);
    /// `EXPORT_NAME` before it ends the connection.
    Require,
    /// Clients may use TLS or not.
    Allow,
}

/// A server's TLS setup: its credentials, loaded, and the mode.
#[derive(Clone)]
pub struct TlsOptions {
    pub mode: TlsMode,
    pub(crate) config: Arc<ServerConfig>,
    /// Where the credentials came from (for messages).
    pub dir: PathBuf,
    /// Whether clients must present a certificate the CA signed.
    pub verify_peer: bool,
    /// Who may open which export (None: every client, every export).
    pub authz: Option<Arc<Authz>>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("mode", &self.mode)
            .field("dir", &self.dir)
            .field("verify_peer", &self.verify_peer)
            .field("authz", &self.authz.as_ref().map(|a| &a.path))
            .finish()
    }
}

impl TlsOptions {
    /// Load credentials from `dir`, laid out as QEMU's `tls-creds-x509`
    /// expects for a server: `server-cert.pem` (the server's certificate,
    /// then any intermediates), `server-key.pem` (its private key), and
    /// `ca-cert.pem` (the CA that signs client certificates), needed only
    /// with `verify_peer`.
    pub fn load(dir: &Path, mode: TlsMode, verify_peer: bool) -> io::Result<Self> {
        let mut config = server_config(dir, verify_peer)?;
        // No resumption tickets: each connection is a full handshake, and
        // nothing is sent after the handshake that a client did not ask for.
        config.send_tls13_tickets = 0;
        Ok(TlsOptions {
            mode,
            config: Arc::new(config),
            dir: dir.to_path_buf(),
            verify_peer,
            authz: None,
        })
    }
}

/// A TLS server configuration from the credentials in `dir`, laid out as
/// QEMU's `tls-creds-x509` expects for a server (see [`TlsOptions::load`]);
/// with `verify_peer`, clients must present a certificate `ca-cert.pem`
/// signed. The HTTPS listener uses it too.
///
/// rustls with aws-lc-rs as its provider, chosen explicitly: it signs with
/// RSA keys of any size from 2048 to 8192 bits (ring took only some sizes),
/// ECDSA P-256, P-384 and P-521 keys and Ed25519 keys, in PKCS#1, SEC1 or
/// PKCS#8 PEM. A key it cannot use is refused by cause (see `keys`).
pub fn server_config(dir: &Path, verify_peer: bool) -> io::Result<ServerConfig> {
    let cert_path = dir.join("server-cert.pem");
    let key_path = dir.join("server-key.pem");
    let pem_error = |path: &Path, e| creds_error(path, keys::pem_problem(&e));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert_path)
        .map_err(|e| pem_error(&cert_path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem_error(&cert_path, e))?;
    if certs.is_empty() {
        return Err(creds_error(&cert_path, "no certificate in it"));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let key = keys::certified_key(&provider, certs, &cert_path, &key_path)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| creds_error(dir, e))?;
    let builder = if verify_peer {
        let ca_path = dir.join("ca-cert.pem");
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&ca_path).map_err(|e| pem_error(&ca_path, e))? {
            roots
                .add(c.map_err(|e| pem_error(&ca_path, e))?)
                .map_err(|e| creds_error(&ca_path, e))?;
        }
        if roots.is_empty() {
            return Err(creds_error(&ca_path, "no CA certificate in it"));
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()
            .map_err(|e| creds_error(&ca_path, e))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    Ok(builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(key))))
}

/// One TLS session shared by every handle on a connection.
struct Session {
    /// Held from sealing records to sending them.
    wire: Mutex<()>,
    state: Mutex<ServerConnection>,
    /// A send failed: what reached the socket may end inside a record.
    broken: AtomicBool,
}

impl Session {
    /// Seal `plain` (empty: nothing of ours) and whatever the session has
    /// to say by itself (an alert, a key update) into `out`.
    fn seal(&self, plain: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        let mut c = self.state.lock();
        c.writer().write_all(plain)?;
        while c.wants_write() {
            c.write_tls(out)?;
        }
        Ok(())
    }

    /// Seal `parts` and send them on `sock`, in order, as one writer.
    fn send(&self, sock: &mut impl Write, parts: &[IoSlice<'_>]) -> io::Result<usize> {
        let _wire = self.wire.lock();
        let mut total = 0;
        let mut out = Vec::new();
        for chunk in parts.iter().flat_map(|p| p.chunks(SEAL_BYTES)) {
            out.clear();
            self.seal(chunk, &mut out)?;
            self.write_records(sock, &out)?;
            total += chunk.len();
        }
        Ok(total)
    }

    /// Send what the session has to say by itself on `sock`.
    fn send_pending(&self, sock: &mut impl Write) -> io::Result<()> {
        let _wire = self.wire.lock();
        let mut out = Vec::new();
        self.seal(&[], &mut out)?;
        self.write_records(sock, &out)
    }

    /// End the session: seal its close_notify and send it on `sock`, as
    /// one writer. Nothing when a send failed before or another writer
    /// holds the socket; sent once however often it is asked.
    fn close(&self, sock: &mut impl Write) -> io::Result<()> {
        if self.broken.load(Ordering::Acquire) {
            return Ok(());
        }
        let Some(_wire) = self.wire.try_lock() else {
            return Ok(());
        };
        let mut out = Vec::new();
        {
            let mut c = self.state.lock();
            c.send_close_notify();
            while c.wants_write() {
                c.write_tls(&mut out)?;
            }
        }
        self.write_records(sock, &out)?;
        sock.flush()
    }

    /// Write sealed records whole, or mark the session broken.
    fn write_records(&self, sock: &mut impl Write, records: &[u8]) -> io::Result<()> {
        sock.write_all(records)
            .inspect_err(|_| self.broken.store(true, Ordering::Release))
    }
}

/// Plaintext sealed and sent per step of a long write.
const SEAL_BYTES: usize = 256 << 10;
/// Ciphertext read from the socket at once (a little more than one
/// record, so the session never holds much more plaintext than that).
const READ_TLS_BYTES: usize = 17 << 10;

/// Promised bytes below this are not worth a `setsockopt`: the reader
/// wakes at the first byte.
const WAKE_MIN: usize = 64 << 10;
/// The most a blocked reader waits for (the kernel caps it too, at half
/// the largest receive buffer).
const WAKE_MAX: usize = 1 << 20;
/// The ciphertext of a record the session may hold unfinished, taken off
/// the socket already: a TLS 1.2 record's most (2^14 + 2048 bytes) and
/// its header, rounded up.
const PARTIAL_RECORD_MAX: usize = 20 << 10;

/// The stream a connection is served on: its socket, plain until the
/// client's `STARTTLS`, a TLS session on it after. Clones share the
/// session.
pub struct Link<S> {
    sock: S,
    tls: Arc<OnceLock<Session>>,
    /// Ciphertext read but not yet taken by the session (reader only).
    pending: Vec<u8>,
    taken: usize,
    /// Bytes the reader will be given before it needs anything else (a
    /// WRITE's payload): the socket need not wake it before they are
    /// there (reader only; see [`Link::expect`]).
    expected: usize,
    /// The socket's wake threshold as last set (1: the kernel's default).
    wake: usize,
}

impl<S: NbdStream> Link<S> {
    pub(crate) fn new(sock: S) -> Self {
        Self::on(sock, Arc::new(OnceLock::new()))
    }

    /// A handle on `sock` that shares the session `tls` (or will).
    fn on(sock: S, tls: Arc<OnceLock<Session>>) -> Self {
        Link {
            sock,
            tls,
            pending: Vec::new(),
            taken: 0,
            expected: 0,
            wake: 1,
        }
    }

    /// The next `bytes` read are sure to come (the rest of a WRITE's
    /// payload, whose header said how long it is): until they have been
    /// read, a read that has to wait for the socket asks the kernel to
    /// wake it only when most of them are there, not for each segment.
    /// That saves the reader's wake-ups, and the client the cost of
    /// waking it (on loopback, the sender's CPU pays for the receiver's
    /// wake-up).
    pub(crate) fn expect(&mut self, bytes: usize) {
        self.expected = bytes;
    }

    /// Before a read that may block: the wake threshold for the bytes
    /// sure to come on the socket (`coming`), in steps of `WAKE_MIN`, so
    /// a long payload costs a few `setsockopt`s, not one per read.
    ///
    /// At most half of `coming`: a blocking `recv` first copies what is
    /// there (less than the threshold, or it would not sleep), then sleeps
    /// until the threshold's worth of *new* bytes has arrived. With the
    /// threshold at most half of what is coming, what was copied and the
    /// new bytes it waits for never add up to more than will come.
    fn before_blocking(sock: &S, wake: &mut usize, coming: usize) {
        let half = coming / 2;
        let want = if half >= WAKE_MIN {
            half.min(WAKE_MAX) / WAKE_MIN * WAKE_MIN
        } else {
            1
        };
        if want != *wake && sock.set_wake_bytes(want).is_ok() {
            *wake = want;
        }
    }

    /// The socket to poll for what the reader reads next
    /// ([`NbdStream::poll_fd`]), its wake threshold set for that as a
    /// blocking read would set it; none over TLS, whose session may hold
    /// plaintext the socket will not announce.
    pub(crate) fn fd_to_poll(&mut self) -> Option<std::os::fd::RawFd> {
        if self.tls.get().is_some() {
            return None;
        }
        Self::before_blocking(&self.sock, &mut self.wake, self.expected);
        self.sock.poll_fd()
    }

    /// Whether TLS is up on this connection.
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.get().is_some()
    }

    /// End the TLS session, if one is up, with its close_notify (see the
    /// module's doc for when it is left out): the protocol wants it before
    /// the connection ends. Best done before waiting for what was sent to
    /// be delivered ([`NbdStream::linger`]), so that the wait covers it;
    /// [`NbdStream::shutdown_stream`] does it too, for a caller that did not.
    pub(crate) fn end_tls(&self) -> io::Result<()> {
        let Some(s) = self.tls.get() else {
            return Ok(());
        };
        s.close(&mut self.sock.clone_stream()?)
    }

    /// Run the server side of a TLS handshake on the socket (under the
    /// socket's current timeouts) and carry every later byte over it.
    /// The client certificate's subject, if it presented one.
    pub(crate) fn start_tls(&mut self, config: Arc<ServerConfig>) -> io::Result<Option<Vec<u8>>> {
        let mut c = ServerConnection::new(config).map_err(io::Error::other)?;
        c.set_buffer_limit(None);
        while c.is_handshaking() {
            match c.complete_io(&mut self.sock) {
                Ok((0, 0)) if c.is_handshaking() => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the client left during the TLS handshake",
                    ))
                }
                Ok(_) => {}
                Err(e) => {
                    // Tell the client why (an alert), if it still listens.
                    let _ = c.write_tls(&mut self.sock);
                    return Err(e);
                }
            }
        }
        let peer = c
            .peer_certificates()
            .and_then(|certs| certs.first())
            .map(|c| c.as_ref().to_vec());
        let _ = self.tls.set(Session {
            wire: Mutex::new(()),
            state: Mutex::new(c),
            broken: AtomicBool::new(false),
        });
        Ok(peer)
    }

    /// `Read::read`, less lowering `expected` by what it returns.
    fn read_inner(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Link {
            sock,
            tls,
            pending,
            taken,
            expected,
            wake,
        } = self;
        let Some(s) = tls.get() else {
            Self::before_blocking(sock, wake, *expected);
            return sock.read(buf);
        };
        loop {
            {
                let mut c = s.state.lock();
                match c.reader().read(buf) {
                    // 0: the client closed the session cleanly.
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            if *taken == pending.len() {
                // The session holds no plaintext and at most one record
                // unfinished: all but that much of what is expected is
                // still to come.
                Self::before_blocking(sock, wake, expected.saturating_sub(PARTIAL_RECORD_MAX));
                pending.resize(READ_TLS_BYTES, 0);
                *taken = 0;
                let n = loop {
                    match sock.read(pending) {
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        r => break r,
                    }
                };
                let n = match n {
                    Ok(n) => n,
                    Err(e) => {
                        pending.clear();
                        return Err(e);
                    }
                };
                pending.truncate(n);
                if n == 0 {
                    // The socket ended: the session says whether cleanly.
                    let mut c = s.state.lock();
                    c.read_tls(&mut io::empty())?;
                    c.process_new_packets().map_err(invalid)?;
                    return match c.reader().read(buf) {
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            Err(io::ErrorKind::UnexpectedEof.into())
                        }
                        r => r,
                    };
                }
            }
            let (result, speak) = {
                let mut c = s.state.lock();
                let mut rest = &pending[*taken..];
                let before = rest.len();
                let r = c.read_tls(&mut rest);
                *taken += before - rest.len();
                let r = r.and_then(|_| c.process_new_packets().map(|_| ()).map_err(invalid));
                (r, c.wants_write())
            };
            if speak {
                let _ = s.send_pending(sock);
            }
            result?;
        }
    }
}

impl<S: NbdStream> Read for Link<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.read_inner(buf)?;
        self.expected = self.expected.saturating_sub(n);
        Ok(n)
    }
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

impl<S: NbdStream> Write for Link<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self.tls.get() {
            None => self.sock.write_vectored(bufs),
            Some(s) => s.send(&mut self.sock, bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sock.flush()
    }
}

impl<S: NbdStream> NbdStream for Link<S> {
    fn clone_stream(&self) -> io::Result<Self> {
        Ok(Link::on(self.sock.clone_stream()?, self.tls.clone()))
    }
    /// Shutting down the sending side ends the TLS session first.
    fn shutdown_stream(&self, how: Shutdown) -> io::Result<()> {
        if how != Shutdown::Read {
            if let Err(e) = self.end_tls() {
                tracing::debug!("NBD: the TLS close_notify was not sent: {e}");
            }
        }
        self.sock.shutdown_stream(how)
    }
    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> io::Result<()> {
        self.sock.set_timeouts(read, write)
    }
    fn tune(&self) -> io::Result<()> {
        self.sock.tune()
    }
}
