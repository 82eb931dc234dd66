//! `strata serve`'s options, and the server configuration they make.

use std::path::PathBuf;

use clap::Args;
use strata_api::units::{invalid, parse_size};
use strata_api::Error;
use strata_datastore::AutoCompact;
use strata_server::moving::Mirror;
use strata_server::serve::{loopback_only, Aio, ServeConfig, SocketOwner, VhostDevice, VmdkExport};
use strata_server::web::bind_address;

// The groups of `strata serve -h`, in the order they are listed.
const NBD: &str = "NBD";
const LOCAL: &str = "vhost-user-blk and FUSE";
const ACCESS: &str = "TLS and access";
const HTTP: &str = "HTTP dashboard, API and metrics";
const IO: &str = "I/O, caching and space";
const SOURCES: &str = "Datastore and VMDK files";
const STORE: &str = "Object-store datastores";

/// Examples at the end of `strata serve --help`.
pub const SERVE_EXAMPLES: &str = "Examples:
  # A local datastore (made if missing): NBD on a Unix socket, the dashboard on 127.0.0.1:9100
  strata -d /srv/strata serve --init --nbd-unix /run/strata/nbd.sock --http 9100
  qemu-img info 'nbd+unix:///vm1?socket=/run/strata/nbd.sock'

  # Disk vm1 to a QEMU guest over vhost-user-blk (the guest's memory must be shared)
  strata serve --cache none --vhost-user-blk vm1=/run/strata/vm1.vhost
  qemu-system-x86_64 -m 4G \\
    -object memory-backend-memfd,id=mem,size=4G,share=on -machine memory-backend=mem \\
    -chardev socket,id=vm1,path=/run/strata/vm1.vhost,reconnect=1 \\
    -device vhost-user-blk-pci,chardev=vm1,num-queues=2 ...

  # Every disk as a file DIR/DISK, every snapshot as DIR/DISK@SNAP (FUSE)
  strata serve --fuse /mnt/strata
  qemu-img compare /mnt/strata/vm1 /mnt/strata/vm1@s1";

#[derive(Args)]
pub struct ServeArgs {
    /// Serve NBD on this Unix socket path
    #[arg(long, help_heading = NBD, value_name = "PATH")]
    pub nbd_unix: Option<PathBuf>,
    /// Serve NBD on this TCP address (e.g. 127.0.0.1:10809)
    #[arg(long, help_heading = NBD, value_name = "HOST:PORT")]
    pub nbd_tcp: Option<String>,
    /// NBD connections served at once
    ///
    /// NBD connections served at once, counting those still negotiating. When all are taken,
    /// a new connection takes the place of the one that has been negotiating longest (counted
    /// in strata_nbd_refused_total{cause="handshake_evicted"}), so stalled handshakes cannot
    /// lock clients out; only when every place is past its handshake is it closed at once
    /// (cause="too_many_connections")
    #[arg(long, help_heading = NBD, value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: u32,
    /// NBD connections per export (0: no own limit)
    ///
    /// NBD connections one export may be open on at once; one more is refused in its
    /// handshake with a reason the client prints (0: only --max-connections limits them)
    #[arg(long, help_heading = NBD, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(0..=65536))]
    pub max_export_connections: u32,
    /// Handshake timeout per read or write, seconds
    ///
    /// Seconds the server waits for each read or write of an NBD client's handshake (TLS
    /// included) before it closes the connection and counts it in
    /// strata_nbd_refused_total{cause="handshake_timeout"} (0: wait for ever)
    #[arg(long, help_heading = NBD, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=86400))]
    pub handshake_timeout: u32,
    /// Read-ahead along a client's BLOCK_STATUS plan
    ///
    /// NBD read-ahead along a client's plan: the ranges a BLOCK_STATUS reply marked as what it
    /// reads next (the dirty ones of qemu:dirty-bitmap:SNAP, else base:allocation's data) are
    /// prefetched this far ahead of its reads into the host page cache, so a backup reading
    /// scattered changes one request at a time keeps the disk busy; 0 turns it off (no effect
    /// with --cache none)
    #[arg(long, help_heading = NBD, value_name = "SIZE", default_value = "8M", value_parser = parse_size)]
    pub nbd_read_ahead: u64,
    /// Busy-poll time per connection, microseconds
    ///
    /// How long, at most, an NBD connection keeps looking for the client's next request and
    /// its ring's next completion before it sleeps while reads or writes are in its ring,
    /// microseconds (under --cache none with `--aio io_uring` or `native`, over a plain
    /// socket, where the connection's one thread reads, starts and answers requests). Costs
    /// CPU while the disk works, none while the connection is idle; 0 turns polling off
    #[arg(long, help_heading = NBD, value_name = "US", default_value_t = 32, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub nbd_poll_us: u32,
    /// CPU time slice of NBD threads, microseconds
    ///
    /// The CPU-scheduler time slice each NBD connection's threads ask for, microseconds
    /// (Linux 6.12 or later; older kernels keep their default). A short slice marks them as
    /// latency-sensitive: run soon after a wake-up, preempted soon when they run long. With
    /// many clients on few cores it shortens the latency tail (64 disks at QD 4 on two cores:
    /// p99 about a third for reads, half for writes) for some throughput (about a tenth
    /// there); with few clients it changes nothing measurable. 0: the kernel's default slice
    #[arg(long, help_heading = NBD, value_name = "US", default_value_t = 100, value_parser = parse_slice_us,
          hide_short_help = true)]
    pub nbd_sched_slice_us: u32,
    /// Serve DISK on a vhost-user-blk SOCKET; repeatable
    ///
    /// Serve DISK (or DISK@SNAP, read-only) to a vhost-user frontend (QEMU's
    /// vhost-user-blk-pci, cloud-hypervisor) on this Unix socket; the guest's memory must be
    /// shared (memory-backend-memfd,share=on). Repeatable. A frontend that disconnects
    /// can reconnect to the same socket
    #[arg(long, help_heading = LOCAL, value_name = "DISK=SOCKET")]
    pub vhost_user_blk: Vec<VhostDevice>,
    /// Queues each vhost-user-blk device offers
    ///
    /// Queues each vhost-user-blk device offers (one worker thread each; the frontend may
    /// use fewer)
    #[arg(long, help_heading = LOCAL, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub vhost_queues: u16,
    /// Adaptive polling per queue, microseconds
    ///
    /// How long, at most, a vhost-user-blk queue's worker keeps looking for the guest's next
    /// request (and its ring's next completion) after the last one before it sleeps,
    /// microseconds. A busy queue is served without a wake-up or a guest kick per request, for
    /// some CPU (QEMU's iothread poll-max-ns). Adaptive: a queue polls while at least a quarter
    /// of its recent polls found something, else it sleeps at once and tries again now and
    /// then, so an idle or lightly used queue spends nothing on it. 0 turns polling off
    #[arg(long, help_heading = LOCAL, value_name = "US", default_value_t = 32, value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub vhost_poll_us: u32,
    /// Mount the disks and snapshots as files on DIR (FUSE)
    ///
    /// Mount a FUSE file system on DIR (created if missing) showing each disk as the file
    /// DIR/DISK (read-write) and each snapshot as DIR/DISK@SNAP (read-only, mode 0444),
    /// appearing and disappearing with them; the file size is the disk size. Direct I/O (no
    /// page cache), any offset and length; fsync flushes, fallocate --punch-hole unmaps.
    /// Unmounted on shutdown; a stale mount left by a crashed server is unmounted first
    #[arg(long, help_heading = LOCAL, value_name = "DIR")]
    pub fuse: Option<PathBuf>,
    /// Let other users use the --fuse files (allow_other)
    ///
    /// Let other users than the one running the server use the --fuse files (the allow_other
    /// mount option; non-root needs user_allow_other in /etc/fuse.conf)
    #[arg(long, help_heading = LOCAL, requires = "fuse")]
    pub fuse_allow_other: bool,
    /// NBD (and HTTP) over TLS with the x509 files in DIR
    ///
    /// NBD over TLS (STARTTLS, on --nbd-tcp and --nbd-unix alike) with the x509 credentials in
    /// DIR, laid out as QEMU's tls-creds-x509 wants them: server-cert.pem, server-key.pem, and
    /// ca-cert.pem (the CA of client certificates, for --tls-verify-peer). The same files serve
    /// qemu-nbd, so clients' setups carry over. SIGHUP reloads them for new connections
    #[arg(long, help_heading = ACCESS, value_name = "DIR")]
    pub tls_creds: Option<PathBuf>,
    /// Require TLS, or allow clients without it
    ///
    /// With --tls-creds: require TLS (every option but STARTTLS is refused before it, the NBD
    /// spec's FORCEDTLS) or allow clients without it
    #[arg(long = "tls", help_heading = ACCESS, value_name = "require|allow", default_value = "require", value_parser = either("require", "allow"), action = clap::ArgAction::Set, requires = "tls_creds")]
    pub tls_require: bool,
    /// Require client certificates signed by the CA
    ///
    /// With --tls-creds: clients must present a certificate signed by the CA in
    /// DIR/ca-cert.pem (QEMU's verify-peer=on)
    #[arg(long, help_heading = ACCESS, requires = "tls_creds")]
    pub tls_verify_peer: bool,
    /// Which client certificate may open which export
    ///
    /// With --tls-creds: which client may open which export, read-write or read-only, by the
    /// subject of its certificate (implies --tls-verify-peer). One rule per line:
    /// `ACCESS EXPORTS IDENTITY`, e.g. `ro vm1@*,vm2 CN=backup1,O=Example` or `rw * *`; the
    /// first rule naming both decides, no rule means no access (docs/SECURITY.md). SIGHUP
    /// reloads it
    #[arg(long, help_heading = ACCESS, value_name = "FILE", requires = "tls_creds")]
    pub tls_authz: Option<PathBuf>,
    /// Serve in the clear beyond loopback (--nbd-tcp, --http)
    ///
    /// Serve --nbd-tcp or --http in the clear on an address other hosts can reach (refused
    /// otherwise: whoever reaches it could read and write every disk; loopback needs no flag)
    #[arg(long, help_heading = ACCESS)]
    pub insecure: bool,
    /// Unlock an encrypted disk at start with its key file; repeatable
    ///
    /// Unlock an encrypted disk at start with the secret in FILE (its raw bytes; mode 0600 or
    /// stricter), so the server serves it; a secret that opens no keyslot stops the start.
    /// Repeatable. Once the server runs, 'strata unlock' does the same with any key source
    #[arg(long, help_heading = ACCESS, value_name = "DISK=FILE")]
    pub unlock: Vec<String>,
    /// Mode of the NBD and vhost-user sockets [default: 0600]
    ///
    /// Permissions of the NBD and vhost-user sockets, octal (e.g. 0660 so that a group such
    /// as libvirt's qemu user can connect); default 0600: only the server's user (the control
    /// socket stays 0600 whatever this says)
    #[arg(long, help_heading = ACCESS, value_name = "MODE", value_parser = parse_mode)]
    pub socket_mode: Option<u32>,
    /// Owner of the NBD and vhost-user sockets
    ///
    /// Owner of the NBD and vhost-user sockets: USER, USER:GROUP or :GROUP (names or ids)
    #[arg(long, help_heading = ACCESS, value_name = "USER[:GROUP]")]
    pub socket_owner: Option<SocketOwner>,
    /// Serve the dashboard, JSON API and /metrics on ADDR
    ///
    /// Serve the dashboard at ADDR/, its JSON API at /api/v1 (docs/API.md) and Prometheus
    /// metrics at /metrics; ADDR is HOST:PORT, or PORT alone for 127.0.0.1:PORT. With
    /// --tls-creds it is HTTPS (the same certificate). An address beyond loopback needs HTTPS
    /// (or --insecure) and a token for reads too (--http-read-token or --http-token)
    #[arg(long, help_heading = HTTP, value_name = "ADDR")]
    pub http: Option<String>,
    /// Token file for actions (and reads)
    ///
    /// Token file for the dashboard's and API's actions (snapshot, clone, extend, convert,
    /// defrag), which grants reads too: read, or created with a random token (mode 0600) when
    /// missing. Without it the HTTP views are read-only
    #[arg(long, help_heading = HTTP, value_name = "FILE")]
    pub http_token: Option<PathBuf>,
    /// Token file for reads only (dashboards, scrapers)
    ///
    /// Token file for reads only (the dashboard's views, the API's GETs, /metrics: for
    /// dashboards and scrapers): read, or created with a random token (mode 0600) when
    /// missing. Once given, reads need a token on loopback too
    #[arg(long, help_heading = HTTP, value_name = "FILE")]
    pub http_read_token: Option<PathBuf>,
    /// Do not collect per-disk I/O statistics
    #[arg(long, help_heading = HTTP)]
    pub no_stats: bool,
    /// Host page cache use (QEMU's cache=)
    ///
    /// How the datastore's pool uses the host page cache, as QEMU's cache= option: writeback
    /// reads and writes through it; none uses direct I/O (O_DIRECT), so data is cached once, by
    /// the guest, and the host's memory is not spent on a second copy (what QEMU, libvirt and
    /// Proxmox run production disks with). Durability is the same in both: a FLUSH makes
    /// every acknowledged write durable. --vmdk images keep the page cache
    #[arg(long = "cache", help_heading = IO, value_name = "none|writeback", default_value = "writeback", value_parser = either("none", "writeback"), action = clap::ArgAction::Set)]
    pub direct_io: bool,
    /// I/O submission (QEMU's aio=)
    ///
    /// How reads and writes reach the disk, as QEMU's aio= option: io_uring (the default) has
    /// each NBD connection (and, under --cache none, each vhost-user-blk queue) put its reads,
    /// and under --cache none its 4 KiB-aligned writes (in place, or to new grains installed
    /// once the data is in), on an io_uring and start them without a thread per request,
    /// completions returned by the transport (under writeback a read the page cache holds is
    /// answered by the connection's own thread; where the kernel refuses io_uring, threads
    /// serve them); native does the same through Linux native AIO (io_submit; needs --cache
    /// none), whose completions wake the server straight from the device's interrupt. Under
    /// --cache none, over a plain socket, an NBD connection is one thread that reads, starts
    /// and answers (--nbd-poll-us); otherwise a second thread answers;
    /// threads runs each request on an I/O thread (--io-threads). FUA writes, misaligned ones
    /// and writes to disks with I/O limits always run on the threads
    #[arg(long = "aio", help_heading = IO, value_name = "io_uring|native|threads", default_value = "io_uring", action = clap::ArgAction::Set)]
    pub aio: Aio,
    /// Request threads per connection [default: by --cache]
    ///
    /// Threads per client connection (NBD or vhost-user-blk) that run its requests, so that
    /// this many are on the disk at once [default: 16 with --cache none, where each waits for
    /// the disk; under writeback 4 for NBD, and none for vhost-user-blk, whose queue workers
    /// then run requests themselves]
    #[arg(long, help_heading = IO, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub io_threads: Option<u16>,
    /// Zero writes allocate nothing on thin disks
    ///
    /// Zero detection: a write of all zeros to a thin disk allocates nothing and releases
    /// what it overwrites (on), or is stored like any other data (off)
    #[arg(long, help_heading = IO, value_name = "on|off", default_value = "on", value_parser = either("on", "off"), action = clap::ArgAction::Set)]
    pub detect_zeroes: bool,
    /// Where new data grains go
    ///
    /// Where new data grains go: regions (each 1 MiB of a disk's virtual space at its offsets
    /// in a block of its own, so random and concurrent writes are laid out in order) or
    /// arrival (next to the previous grain, else in the order writes arrive; for comparison)
    #[arg(long, help_heading = IO, value_name = "regions|arrival", default_value = "regions", value_parser = either("regions", "arrival"), action = clap::ArgAction::Set)]
    pub placement: bool,
    /// Space kept allocated past the pool's end
    ///
    /// Host space kept allocated ahead of the pool's end, so that thin disks' first writes do
    /// not wait for the host file system to allocate (docs/FORMAT.md §7.1, "Readied space"):
    /// follows the rate the pool grows, up to SIZE; 0 turns it off
    #[arg(long, help_heading = IO, value_name = "SIZE", default_value = "512M", value_parser = parse_size)]
    pub ready_ahead: u64,
    /// Consolidate free space in the background
    ///
    /// Free-space consolidation in the background (auto): every 10 s, when the pool file holds
    /// more on the host than the used (and reserved) space by --free-space-threshold plus a
    /// quarter of the used space, run
    /// what 'strata defrag --free-space' does, paced against client I/O; off: only on request
    #[arg(long, help_heading = IO, value_name = "auto|off", default_value = "auto", value_parser = either("auto", "off"), action = clap::ArgAction::Set)]
    pub free_space_policy: bool,
    /// Excess host space that starts consolidation
    ///
    /// See --free-space-policy
    #[arg(long, help_heading = IO, value_name = "SIZE", default_value = "1G", value_parser = parse_size, hide_short_help = true)]
    pub free_space_threshold: u64,
    /// Seconds between background dedup passes, 0: none
    ///
    /// Local datastores: every this many seconds, run what 'strata dedup' does over every
    /// disk (equal grains at the same offset become one; docs/FORMAT.md §17.2), paced against
    /// client I/O, as a job of the server ('strata jobs'; one that freed nothing leaves the
    /// list when done, the log has every pass); the first run comes one interval after the
    /// start, none while another pass runs. 0: only on request
    #[arg(long, help_heading = IO, value_name = "SECONDS", default_value_t = 0)]
    pub dedup_interval: u64,
    /// Pack cold disks every this many seconds, 0: none
    ///
    /// Local datastores: every this many seconds, run what 'strata compress' does over the
    /// disks no client of this server has changed for --compress-cold (their snapshots and
    /// clones come with them; docs/FORMAT.md §18), paced against client I/O, as a job of the
    /// server (one that packed nothing leaves the list when done, the log has every pass); the
    /// first run comes one interval after the start, none while another compress runs.
    /// 0: only on request
    #[arg(long, help_heading = IO, value_name = "SECONDS", default_value_t = 0)]
    pub compress_interval: u64,
    /// Seconds a disk must go unchanged to be packed by --compress-interval
    ///
    /// A disk no client has written, trimmed or zeroed through this server for this long
    /// (counted from the server's start for one not changed since) is cold.
    #[arg(long, help_heading = IO, value_name = "SECONDS", default_value_t = 3600,
          hide_short_help = true)]
    pub compress_cold: u64,
    /// The codec of --compress-interval's passes: lz4 or zstd (as 'strata compress --codec')
    #[arg(long, help_heading = IO, value_name = "lz4|zstd", default_value = "lz4",
          value_parser = strata_api::PackCodec::parse, hide_short_help = true)]
    pub compress_codec: strata_api::PackCodec,
    /// When 'strata move' mirrors client writes
    ///
    /// How 'strata move' converges (docs/MOVE.md): auto copies again what clients changed
    /// until a pass finds little, and mirrors client writes into the target only once the
    /// passes stop shrinking; always mirrors right after the first pass, so a move under
    /// writes ends sooner while each client write until the switch is made twice
    #[arg(long, help_heading = IO, value_name = "auto|always", default_value = "auto", action = clap::ArgAction::Set)]
    pub move_mirror: Mirror,
    /// Create the datastore first if the directory has none
    #[arg(long, help_heading = SOURCES)]
    pub init: bool,
    /// Also serve a VMDK file (and its parents) as it is
    ///
    /// Also serve a VMDK (a descriptor or sparse file; its parent chain is followed) as it is,
    /// read-write where the format allows, as export NAME (default: the file's stem).
    /// Repeatable. Without a datastore in the directory, only the VMDKs are served, each with a
    /// control socket PATH.strata.sock. The files are locked while served: the top link's
    /// exclusively, its parents' shared (other servers may share a base)
    #[arg(long, help_heading = SOURCES, value_name = "[NAME=]PATH")]
    pub vmdk: Vec<VmdkExport>,
    /// Serve the --vmdk images read-only (shared locks)
    ///
    /// Serve the --vmdk images read-only (shared locks only: several readers may serve one file)
    #[arg(long, help_heading = SOURCES)]
    pub vmdk_read_only: bool,
    /// Bound of this host's cache of store data
    ///
    /// Object-store datastores: keep at most SIZE of segments in this host's cache (DIR/cache;
    /// at least 64M). Recorded in the directory, so later commands keep to it too; without it,
    /// the size recorded before, else 8G. Eviction is S3-FIFO: a scan (a backup, a full read)
    /// does not push out what VMs read again and again. Only data already in the store is
    /// cached, so nothing is lost by evicting; the cache survives a restart and is verified
    /// again before use
    #[arg(long, help_heading = STORE, value_name = "SIZE", value_parser = parse_size)]
    pub store_cache: Option<u64>,
    /// Fetch a missed object whole in the background
    ///
    /// Object-store datastores: a read that misses in this host's cache also fetches its
    /// object whole in the background (two at a time, while the cache is under half its bound
    /// or the misses look like a scan; docs/FORMAT.md §11.8), so that the reads after it hit
    /// the cache; off: each read makes only its own requests to the store (a ranged GET per
    /// grain or map node missed), which then can be counted exactly
    #[arg(long, help_heading = STORE, value_name = "on|off", default_value = "on", value_parser = either("on", "off"), action = clap::ArgAction::Set)]
    pub store_prefetch: bool,
    /// Compress grains as segments are sealed
    ///
    /// Object-store datastores: grains of unencrypted disks are LZ4-compressed when a segment
    /// is sealed, kept so where that saves an eighth (docs/FORMAT.md §18.6): fewer bytes
    /// uploaded, stored and fetched; compaction packs the raw grains it moves. Builds before
    /// 2026-12-06 read such segments as an error: while a host still runs one, serve the others
    /// with off (segments as before, version 1; docs/MULTIHOST.md, "Upgrading")
    #[arg(long, help_heading = STORE, value_name = "lz4|off", default_value = "lz4", value_parser = either("lz4", "off"), action = clap::ArgAction::Set, hide_short_help = true)]
    pub store_compress: bool,
    /// How long a FLUSH waits for the store, seconds
    ///
    /// Object-store datastores: how long a FLUSH (or FUA write) waits for the store before it
    /// fails (the writes stay acknowledged and in memory; a later FLUSH uploads them)
    #[arg(long, help_heading = STORE, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub store_timeout: u64,
    /// Seconds between background gc runs (0: none)
    ///
    /// Object-store datastores: collect garbage in the background every this many seconds,
    /// and 5 s after a compaction emptied objects (0: only 'strata gc'); any host may, runs
    /// do not collide
    #[arg(long, help_heading = STORE, value_name = "SECONDS", default_value_t = 3600)]
    pub gc_interval: u64,
    /// Compaction in the background
    ///
    /// Object-store datastores: compaction in the background (auto; docs/FORMAT.md §11.7a):
    /// the writer of a disk rewrites the live grains of its partly live objects, so that gc
    /// can free them, while clients write (objects under 50 % live, 67 % while the disk's
    /// objects hold more than 1.4 times its live bytes, at most as many bytes as they wrote)
    /// and once the disk is idle (--compact-idle); off: only 'strata compact' compacts
    #[arg(long, help_heading = STORE, value_name = "auto|off", default_value = "auto", value_parser = either("auto", "off"), action = clap::ArgAction::Set)]
    pub compact_policy: bool,
    /// Idle seconds before a disk's idle compaction
    ///
    /// Object-store datastores, with --compact-policy auto: compact a disk's objects under
    /// 85 % live once it has had no write for this many seconds, after each burst of writes
    /// (0: no idle passes)
    #[arg(long, help_heading = STORE, value_name = "SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub compact_idle: u64,
    /// Serve DISK incoming, for a live migration; repeatable
    ///
    /// Object-store datastores: serve DISK incoming, for a VM live migration (docs/MOVE.md):
    /// reads follow what its writer on another host commits, and the first write waits for
    /// that writer's 'strata release DISK' (up to --incoming-wait) instead of fencing it.
    /// Repeatable
    #[arg(long, help_heading = STORE, value_name = "DISK")]
    pub incoming: Vec<String>,
    /// How long an incoming disk's first write waits
    ///
    /// How long an incoming disk's first write waits for the release before it fails
    #[arg(long, help_heading = STORE, value_name = "SECONDS", default_value_t = 60, hide_short_help = true)]
    pub incoming_wait: u64,
}

/// A choice of two words: `yes` parses as true, `no` as false.
fn either(yes: &'static str, no: &'static str) -> impl Fn(&str) -> Result<bool, Error> + Clone {
    move |s| match s {
        _ if s == yes => Ok(true),
        _ if s == no => Ok(false),
        _ => Err(invalid(format!("expected {yes} or {no}"))),
    }
}

fn parse_mode(s: &str) -> Result<u32, Error> {
    match u32::from_str_radix(s.trim_start_matches("0o"), 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(invalid(format!(
            "'{s}': expected an octal mode such as 0660"
        ))),
    }
}

/// 0, or a slice the kernel accepts as it is (100 µs to 100 ms).
fn parse_slice_us(s: &str) -> Result<u32, Error> {
    match s.parse::<u32>() {
        Ok(us) if us == 0 || (100..=100_000).contains(&us) => Ok(us),
        _ => Err(invalid(format!(
            "'{s}': expected 0 (the kernel's default) or 100 to 100000 microseconds"
        ))),
    }
}

/// The server configuration `strata serve`'s options make, refused where
/// they do not go together (the server trusts it: see [`ServeConfig`]).
/// `--unlock DISK=FILE`: the disk and the secret read from the file.
fn unlock_arg(arg: &str) -> Result<(String, strata_api::Secret), Error> {
    let Some((disk, file)) = arg.split_once('=') else {
        return Err(invalid(format!("--unlock {arg:?}: give DISK=FILE")));
    };
    let keys = crate::keys::KeyArgs {
        key_file: Some(file.into()),
        ..Default::default()
    };
    let secret = keys.secret()?.expect("a file was given");
    Ok((disk.to_string(), secret))
}

impl TryFrom<&ServeArgs> for ServeConfig {
    type Error = Error;
    fn try_from(a: &ServeArgs) -> Result<ServeConfig, Error> {
        check(a)?;
        Ok(ServeConfig {
            unlock: a
                .unlock
                .iter()
                .map(|u| unlock_arg(u))
                .collect::<Result<_, _>>()?,
            nbd_unix: a.nbd_unix.clone(),
            nbd_tcp: a.nbd_tcp.clone(),
            tls_creds: a.tls_creds.clone(),
            tls_require: a.tls_require,
            tls_verify_peer: a.tls_verify_peer,
            insecure: a.insecure,
            tls_authz: a.tls_authz.clone(),
            max_connections: a.max_connections as usize,
            max_connections_per_export: a.max_export_connections as usize,
            handshake_timeout: (a.handshake_timeout > 0)
                .then(|| std::time::Duration::from_secs(a.handshake_timeout.into())),
            vhost_user_blk: a.vhost_user_blk.clone(),
            vhost_queues: a.vhost_queues,
            vhost_poll: std::time::Duration::from_micros(a.vhost_poll_us.into()),
            nbd_poll: std::time::Duration::from_micros(a.nbd_poll_us.into()),
            nbd_sched_slice: (a.nbd_sched_slice_us > 0)
                .then(|| std::time::Duration::from_micros(a.nbd_sched_slice_us.into())),
            socket_mode: a.socket_mode,
            socket_owner: a.socket_owner,
            fuse: a.fuse.clone(),
            fuse_allow_other: a.fuse_allow_other,
            direct_io: a.direct_io,
            io_threads: a.io_threads,
            aio: a.aio,
            http: a.http.clone(),
            http_token: a.http_token.clone(),
            http_read_token: a.http_read_token.clone(),
            no_stats: a.no_stats,
            detect_zeroes: a.detect_zeroes,
            placement: a.placement,
            ready_ahead: a.ready_ahead,
            free_space_policy: a.free_space_policy,
            free_space_threshold: a.free_space_threshold,
            dedup_interval: a.dedup_interval,
            compress_interval: a.compress_interval,
            compress_cold: a.compress_cold,
            compress_codec: a.compress_codec,
            init: a.init,
            vmdk: a.vmdk.clone(),
            vmdk_read_only: a.vmdk_read_only,
            store_timeout: a.store_timeout,
            store_cache: a.store_cache,
            gc_interval: a.gc_interval,
            store_prefetch: a.store_prefetch,
            store_compress: a.store_compress,
            store_compact: if a.compact_policy {
                AutoCompact {
                    busy: true,
                    idle_after: (a.compact_idle > 0)
                        .then(|| std::time::Duration::from_secs(a.compact_idle)),
                }
            } else {
                AutoCompact::OFF
            },
            move_mirror: a.move_mirror,
            incoming: a.incoming.clone(),
            incoming_wait: a.incoming_wait,
            nbd_read_ahead: a.nbd_read_ahead,
        })
    }
}

/// How the options go together, checked before anything is opened.
fn check(a: &ServeArgs) -> Result<(), Error> {
    if a.nbd_unix.is_none()
        && a.nbd_tcp.is_none()
        && a.vhost_user_blk.is_empty()
        && a.fuse.is_none()
    {
        return Err(invalid(
            "nothing to serve on: give --nbd-unix PATH, --nbd-tcp HOST:PORT, \
             --vhost-user-blk DISK=SOCKET and/or --fuse DIR",
        ));
    }
    if a.aio == Aio::Native && !a.direct_io {
        return Err(invalid(
            "--aio native needs --cache none: native AIO is asynchronous only for direct I/O \
             (through the page cache each request would block its connection); use \
             --aio io_uring, or add --cache none",
        ));
    }
    if let Some(sock) = twice(&a.vhost_user_blk, |d| &d.socket) {
        let sock = sock.display();
        return Err(invalid(format!(
            "--vhost-user-blk: socket {sock} given twice"
        )));
    }
    if let Some(name) = twice(&a.vmdk, |v| &v.name) {
        return Err(invalid(format!(
            "two --vmdk exports are named '{name}'; name them with NAME=PATH"
        )));
    }
    check_http(a)?;
    check_nbd_tcp(a)
}

/// The first key two of `v` have.
fn twice<T, K: PartialEq>(v: &[T], key: impl Fn(&T) -> &K) -> Option<&K> {
    (1..v.len()).find_map(|i| {
        let k = key(&v[i]);
        v[..i].iter().any(|x| key(x) == k).then_some(k)
    })
}

/// `--http` beyond loopback: HTTPS (or --insecure) and a token for reads.
fn check_http(a: &ServeArgs) -> Result<(), Error> {
    let Some(addr) = &a.http else {
        for (set, flag) in [
            (a.http_token.is_some(), "--http-token"),
            (a.http_read_token.is_some(), "--http-read-token"),
        ] {
            if set {
                return Err(invalid(format!("{flag} goes with --http ADDR")));
            }
        }
        return Ok(());
    };
    if loopback_only(&bind_address(addr)).map_err(|e| invalid(format!("--http {addr}: {e}")))? {
        return Ok(());
    }
    if a.tls_creds.is_none() && !a.insecure {
        return Err(invalid(format!(
            "--http {addr} is not a loopback address: beyond loopback the dashboard, API and \
             metrics go over HTTPS only, with the server's --tls-creds DIR (docs/SECURITY.md); \
             bind a loopback address, or pass --insecure to serve plain HTTP to the network"
        )));
    }
    if a.http_token.is_none() && a.http_read_token.is_none() {
        return Err(invalid(format!(
            "--http {addr} is not a loopback address: beyond loopback reads need a token too; \
             give --http-read-token FILE (for dashboards and scrapers) and/or --http-token FILE \
             (for actions); a missing file is made with a new random token"
        )));
    }
    Ok(())
}

/// `--nbd-tcp` beyond loopback: only with TLS required, or --insecure.
fn check_nbd_tcp(a: &ServeArgs) -> Result<(), Error> {
    let Some(addr) = &a.nbd_tcp else {
        return Ok(());
    };
    if a.insecure || (a.tls_creds.is_some() && a.tls_require) {
        return Ok(());
    }
    if loopback_only(addr).map_err(|e| invalid(format!("--nbd-tcp {addr}: {e}")))? {
        return Ok(());
    }
    let why = if a.tls_creds.is_some() {
        "--tls allow lets clients in without TLS"
    } else {
        "TLS is off (no --tls-creds)"
    };
    Err(invalid(format!(
        "--nbd-tcp {addr} is reachable from other hosts and {why}: anyone who reaches it could \
         read and write every disk. Give --tls-creds DIR (docs/SECURITY.md), bind a loopback \
         address, or pass --insecure to serve in the clear anyway"
    )))
}
