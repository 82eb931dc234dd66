//! [`ServeConfig`], what `serve` serves and how, and the typed values in
//! it that options are parsed into (`FromStr`, with messages that name
//! no option: the CLI's parser says which one).

use std::path::PathBuf;
use std::str::FromStr;

use strata_api::units::invalid;
use strata_engine::{Error, ErrorKind};

/// What `serve` serves and how, in typed values (each field is documented
/// with its option in the CLI). Whoever builds it checks how the values
/// combine, as the CLI's `TryFrom<&ServeArgs>` does, and `run` trusts it:
/// something to serve on, native AIO only with direct I/O, NBD over TCP and
/// HTTP beyond loopback only with TLS or `insecure` (HTTP also with a
/// token for reads), each vhost-user socket and VMDK export name given once.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Encrypted disks to unlock at start, with their secrets (read by
    /// the CLI: `--unlock DISK=FILE`).
    pub unlock: Vec<(String, strata_api::Secret)>,
    /// NBD on this Unix socket.
    pub nbd_unix: Option<PathBuf>,
    /// NBD on this TCP address.
    pub nbd_tcp: Option<String>,
    /// vhost-user-blk devices.
    pub vhost_user_blk: Vec<VhostDevice>,
    /// Queues per vhost-user-blk device.
    pub vhost_queues: u16,
    /// How long a vhost-user-blk queue's worker polls at most (zero: never).
    pub vhost_poll: std::time::Duration,
    /// How long an NBD connection polls at most (zero: never).
    pub nbd_poll: std::time::Duration,
    /// The scheduler slice NBD connection threads ask for (None: the
    /// kernel's default).
    pub nbd_sched_slice: Option<std::time::Duration>,
    /// Mode of the NBD and vhost-user sockets.
    pub socket_mode: Option<u32>,
    /// Owner of the NBD and vhost-user sockets.
    pub socket_owner: Option<SocketOwner>,
    /// Where to mount the FUSE file system of disks and snapshots.
    pub fuse: Option<PathBuf>,
    /// The FUSE mount's allow_other.
    pub fuse_allow_other: bool,
    /// The pool uses direct I/O (`--cache none`).
    pub direct_io: bool,
    /// Threads per client connection; None: the transport's default.
    pub io_threads: Option<u16>,
    /// What carries planned reads and writes.
    pub aio: Aio,
    /// The dashboard, API and metrics on this address.
    pub http: Option<String>,
    /// The HTTP actions' token file.
    pub http_token: Option<PathBuf>,
    /// The HTTP reads' token file (dashboards, scrapers).
    pub http_read_token: Option<PathBuf>,
    /// No per-disk I/O statistics.
    pub no_stats: bool,
    /// Zero detection on writes.
    pub detect_zeroes: bool,
    /// Region placement of new grains (false: in arrival order).
    pub placement: bool,
    /// Host space readied ahead of the pool's end, at most (0: none).
    pub ready_ahead: u64,
    /// Free-space consolidation in the background.
    pub free_space_policy: bool,
    /// Its threshold, in bytes.
    pub free_space_threshold: u64,
    /// Seconds between background dedup passes over every disk (0: none).
    pub dedup_interval: u64,
    /// Seconds between background pack passes over the cold disks (0:
    /// none), how long a disk must be unchanged to be cold, and the codec.
    pub compress_interval: u64,
    pub compress_cold: u64,
    pub compress_codec: strata_api::PackCodec,
    /// Create the datastore first if the directory has none.
    pub init: bool,
    /// VMDK images also served.
    pub vmdk: Vec<VmdkExport>,
    /// The VMDK images read-only.
    pub vmdk_read_only: bool,
    /// Object stores: how long a FLUSH waits for the store, in seconds.
    pub store_timeout: u64,
    /// Object stores: the bound of this host's segment cache, in bytes
    /// (None: the one recorded in the directory, or the default).
    pub store_cache: Option<u64>,
    /// Object stores: seconds between background collections (0: none).
    pub gc_interval: u64,
    /// Object stores: reads that miss in the segment cache also fetch
    /// their objects whole in the background.
    pub store_prefetch: bool,
    /// Object stores: the compaction passes disks run by themselves.
    pub store_compact: strata_datastore::AutoCompact,
    /// Object stores: data segments sealed compressed (FORMAT.md §18.6).
    pub store_compress: bool,
    /// When a move mirrors client writes into its target.
    pub move_mirror: crate::move_settings::Mirror,
    /// Object stores: disks served incoming (a live migration's target).
    pub incoming: Vec<String>,
    /// How long an incoming disk's first write waits for the release, in seconds.
    pub incoming_wait: u64,
    /// NBD read-ahead along what BLOCK_STATUS told a client, in bytes (0: off).
    pub nbd_read_ahead: u64,
    /// NBD over TLS: x509 credentials in QEMU's layout (`server-cert.pem`,
    /// `server-key.pem`, `ca-cert.pem`).
    pub tls_creds: Option<PathBuf>,
    /// With credentials: TLS required (else clients choose).
    pub tls_require: bool,
    /// With credentials: clients must present a certificate the CA signed.
    pub tls_verify_peer: bool,
    /// Serve NBD without TLS on an address other hosts can reach.
    pub insecure: bool,
    /// Who may open which export over TLS (client certificate subjects).
    pub tls_authz: Option<PathBuf>,
    /// NBD connections served at once.
    pub max_connections: usize,
    /// NBD connections one export may be open on at once (0: no limit).
    pub max_connections_per_export: usize,
    /// How long an NBD client may take over its handshake (None: for ever).
    pub handshake_timeout: Option<std::time::Duration>,
}

/// What carries planned reads and writes (QEMU's aio= option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aio {
    /// An io_uring per NBD connection (and, with direct I/O, per
    /// vhost-user-blk queue).
    IoUring,
    /// The same through a Linux native AIO context (only with direct I/O).
    Native,
    /// Each request on an I/O thread.
    Threads,
}

impl Aio {
    /// Planned reads and writes go through a ring (io_uring or native).
    pub fn ring(self) -> bool {
        self != Aio::Threads
    }
}

impl FromStr for Aio {
    type Err = Error;
    fn from_str(s: &str) -> Result<Aio, Error> {
        match s {
            "io_uring" => Ok(Aio::IoUring),
            "native" => Ok(Aio::Native),
            "threads" => Ok(Aio::Threads),
            _ => Err(invalid(format!(
                "'{s}': expected io_uring, native or threads"
            ))),
        }
    }
}

/// A disk (or `DISK@SNAP`) served to a vhost-user frontend on a socket,
/// from `DISK=SOCKET`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostDevice {
    pub disk: String,
    pub socket: PathBuf,
}

impl FromStr for VhostDevice {
    type Err = Error;
    fn from_str(s: &str) -> Result<VhostDevice, Error> {
        match s.split_once('=') {
            Some((disk, socket)) if !disk.is_empty() && !socket.is_empty() => Ok(VhostDevice {
                disk: disk.to_string(),
                socket: PathBuf::from(socket),
            }),
            _ => Err(invalid("expected DISK=SOCKET (e.g. vm1=/run/vm1.sock)")),
        }
    }
}

/// The owner given to the sockets, from `USER`, `USER:GROUP` or `:GROUP`
/// (names or ids), names resolved to ids when parsed; None: unchanged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SocketOwner {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl FromStr for SocketOwner {
    type Err = Error;
    fn from_str(s: &str) -> Result<SocketOwner, Error> {
        let (u, g) = s.split_once(':').unwrap_or((s, ""));
        let id = |name: &str, group| match name {
            "" => Ok(None),
            _ => lookup_id(name, group).map(Some),
        };
        Ok(SocketOwner {
            uid: id(u, false)?,
            gid: id(g, true)?,
        })
    }
}

/// A user or group given by name or number.
fn lookup_id(name: &str, group: bool) -> Result<u32, Error> {
    if let Ok(n) = name.parse::<u32>() {
        return Ok(n);
    }
    let c = std::ffi::CString::new(name).map_err(|_| invalid(format!("bad name {name:?}")))?;
    // SAFETY: getpwnam/getgrnam with a valid C string; the result is read
    // at once (options are parsed before the server starts any thread).
    let id = unsafe {
        if group {
            let g = libc::getgrnam(c.as_ptr());
            (!g.is_null()).then(|| (*g).gr_gid)
        } else {
            let u = libc::getpwnam(c.as_ptr());
            (!u.is_null()).then(|| (*u).pw_uid)
        }
    };
    let what = if group { "group" } else { "user" };
    id.ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no {what} named {name:?}")))
}

/// A VMDK image served as export `name`, from `[NAME=]PATH`: without a
/// name (or with a `/` before the first `=`, which makes it part of the
/// path), the file's stem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmdkExport {
    pub name: String,
    pub path: PathBuf,
}

impl FromStr for VmdkExport {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<VmdkExport, Self::Err> {
        let (name, path) = match s.split_once('=') {
            Some((n, p)) if !n.contains('/') => (n.to_string(), PathBuf::from(p)),
            _ => {
                let p = PathBuf::from(s);
                let stem = p
                    .file_stem()
                    .map(|s| s.to_string_lossy().to_string())
                    .unwrap_or_else(|| s.to_string());
                (stem, p)
            }
        };
        Ok(VmdkExport { name, path })
    }
}

/// Whether `addr` (HOST:PORT) is loopback only: every address it resolves
/// to is (a host that resolves to none is not).
pub fn loopback_only(addr: &str) -> std::io::Result<bool> {
    let addrs: Vec<std::net::SocketAddr> =
        std::net::ToSocketAddrs::to_socket_addrs(addr)?.collect();
    Ok(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_into_typed_values() {
        let d: VhostDevice = "vm1@s=/run/a=b.sock".parse().unwrap();
        assert_eq!(d.disk, "vm1@s");
        assert_eq!(d.socket, PathBuf::from("/run/a=b.sock"));
        for bad in ["vm1", "=/s", "vm1="] {
            let e = bad.parse::<VhostDevice>().unwrap_err();
            assert!(e.message.contains("expected DISK=SOCKET"), "{e}");
        }
        let o: SocketOwner = "0:0".parse().unwrap();
        assert_eq!((o.uid, o.gid), (Some(0), Some(0)));
        let o: SocketOwner = ":7".parse().unwrap();
        assert_eq!((o.uid, o.gid), (None, Some(7)));
        let e = "no-such-user-x".parse::<SocketOwner>().unwrap_err();
        assert_eq!(e.message, "no user named \"no-such-user-x\"");
        let v = |s: &str| -> (String, PathBuf) {
            let v: VmdkExport = s.parse().unwrap();
            (v.name, v.path)
        };
        assert_eq!(v("a=/x/y.vmdk"), ("a".into(), "/x/y.vmdk".into()));
        assert_eq!(v("/x/y.vmdk"), ("y".into(), "/x/y.vmdk".into()));
        assert_eq!(v("/x/a=b.vmdk"), ("a=b".into(), "/x/a=b.vmdk".into()));
        assert_eq!("native".parse::<Aio>().unwrap(), Aio::Native);
        assert!(!Aio::Threads.ring() && Aio::IoUring.ring());
        assert!(loopback_only("127.0.0.1:1").unwrap() && !loopback_only("0.0.0.0:1").unwrap());
    }
}
