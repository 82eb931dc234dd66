//! `strata serve`: export every disk of a datastore of either kind (a
//! local one, or a directory attached to an object store) over NBD,
//! vhost-user-blk and FUSE, answer CLI commands on the control socket and
//! HTTP, and shut down cleanly (flush, and checkpoint or commit) on
//! SIGTERM/SIGINT. One lifecycle for both kinds: what differs is opening
//! the datastore and its background work (alarms and free-space return
//! for a local one, garbage collection for an object store).

use std::collections::HashMap;
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use strata_api::VmdkServerStatus;
use strata_block::BlockDevice;
use strata_engine::{AlarmKind, AlarmState, AlarmStatus, Error, ErrorKind};
use strata_nbd::{
    Authz, ExportInfo, ExportProvider, NbdServer, ServerOptions, TlsMode, TlsOptions,
};
use strata_stats::{Gauge, StatsDevice, StatsRegistry};
use strata_vhost::VhostBlkServer;
use strata_vmdk::VmdkImage;

use crate::vmdk_ops::Access;
use crate::{control, holders};

mod config;
mod exports;
mod passes;
mod running;
mod vhost;
mod vmdks;
pub use config::{loopback_only, Aio, ServeConfig, SocketOwner, VhostDevice, VmdkExport};
use exports::{listen_fuse, Exports};
use running::Running;
use vhost::listen_vhost;
use vmdks::{
    export_list, flush_vmdks, open_vmdks, record_holders, vmdk_control_sockets, vmdk_exports,
    OpenedVmdk,
};

/// Threads per connection that run its requests (`--io-threads`): 16
/// under `--cache none`, where each waits for the disk, else the
/// transport's own `writeback` default.
fn io_threads(args: &ServeConfig, writeback: usize) -> usize {
    match args.io_threads {
        Some(n) => n as usize,
        None if args.direct_io => 16,
        None => writeback,
    }
}

/// Under writeback, NBD WRITEs up to this size (without FUA) are carried
/// out by the connection's reader (`ServerOptions::inline_write_bytes`).
const INLINE_WRITE_BYTES: u32 = 64 << 10;

/// NBD server options from the command line.
pub(crate) fn nbd_options(args: &ServeConfig) -> Result<ServerOptions, Error> {
    let default = ServerOptions::default();
    Ok(ServerOptions {
        workers_per_connection: io_threads(args, default.workers_per_connection),
        read_ahead_bytes: args.nbd_read_ahead,
        // Under writeback too: a read the page cache holds completes
        // inside the submission, and the reader answers it itself.
        ring_io: args.aio.ring(),
        native_aio: args.aio == Aio::Native,
        // Under --cache none the ring's requests go to the device and the
        // connection is one thread (PERFORMANCE.md, "NBD's two modes").
        one_thread: args.direct_io,
        poll: args.nbd_poll,
        sched_slice: args.nbd_sched_slice,
        // Under writeback a small write is a copy into the page cache:
        // cheaper on the reader than handed to a worker.
        inline_write_bytes: if args.direct_io {
            0
        } else {
            INLINE_WRITE_BYTES
        },
        tls: load_tls(args)?,
        max_connections: args.max_connections,
        max_connections_per_export: args.max_connections_per_export,
        handshake_timeout: args.handshake_timeout,
        ..default
    })
}

/// The NBD TLS setup `--tls-creds` names, loaded now (None without it).
pub(crate) fn load_tls(args: &ServeConfig) -> Result<Option<TlsOptions>, Error> {
    let Some(dir) = &args.tls_creds else {
        return Ok(None);
    };
    let mode = if args.tls_require {
        TlsMode::Require
    } else {
        TlsMode::Allow
    };
    let bad = |what: &str, p: &Path, e: std::io::Error| {
        let msg = format!("{what} in {}: {e}", p.display());
        Error::new(ErrorKind::InvalidArgument, msg)
    };
    // Access by identity means nothing unless identities are verified.
    let verify = args.tls_verify_peer || args.tls_authz.is_some();
    let mut tls =
        TlsOptions::load(dir, mode, verify).map_err(|e| bad("TLS credentials", dir, e))?;
    if let Some(p) = &args.tls_authz {
        let authz = Authz::load(p).map_err(|e| bad("TLS access rules", p, e))?;
        tls.authz = Some(Arc::new(authz));
    }
    Ok(Some(tls))
}

/// Apply `--socket-mode` and `--socket-owner` to a socket file just bound.
fn own_socket(p: &Path, args: &ServeConfig) -> Result<(), Error> {
    if let Some(SocketOwner { uid, gid }) = args.socket_owner {
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::chown(p, uid, gid)
                .map_err(|e| io_err(&format!("setting the owner of socket {}", p.display()), e))?;
        }
    }
    if let Some(m) = args.socket_mode {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m))
            .map_err(|e| io_err(&format!("setting the mode of socket {}", p.display()), e))?;
    }
    Ok(())
}

/// Remove a leftover socket file; refuse to touch anything that is not a socket.
fn remove_stale_socket(p: &Path) -> Result<(), Error> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_socket() => {
            std::fs::remove_file(p).map_err(|e| io_err("remove stale socket", e))
        }
        Ok(_) => Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{} exists and is not a socket; refusing to replace it",
                p.display()
            ),
        )),
        Err(_) => Ok(()),
    }
}

/// A Unix socket listening at `p`, whose file appears only once it
/// listens, with the mode and owner `own` asks for (`--socket-mode`,
/// `--socket-owner`): bound (and listening) under a temporary name beside
/// `p`, owned, then renamed into place. A client that waits for the file
/// and connects (scripts, tests) could otherwise come between bind and
/// listen and be refused, or see the socket before its mode was set.
pub(crate) fn bind_listening(p: &Path, own: Option<&ServeConfig>) -> Result<UnixListener, Error> {
    let name = p
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = p.with_file_name(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let l = private(|| UnixListener::bind(&tmp))
        .map_err(|e| io_err(&format!("bind {}", p.display()), e))?;
    if let Some(args) = own {
        if let Err(e) = own_socket(&tmp, args) {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    }
    std::fs::rename(&tmp, p).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_err(&format!("bind {}", p.display()), e)
    })?;
    Ok(l)
}

/// Run `f` (which creates a socket) with a umask that leaves the new
/// file to its owner alone (mode 0600): sockets are born private, and
/// `--socket-mode` / `--socket-owner` widen them afterwards. The umask is
/// the process's; files other threads create meanwhile come out 0600
/// too, which is never less safe.
fn private<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: umask(2) only swaps the process's file creation mask.
    let old = unsafe { libc::umask(0o177) };
    let r = f();
    // SAFETY: as above, restoring the mask it returned.
    unsafe { libc::umask(old) };
    r
}

/// A line of what the server will announce once it is up ([`Running`]'s
/// banner).
macro_rules! say {
    ($banner:expr, $($arg:tt)*) => {
        $banner.push(format!($($arg)*))
    };
}
pub(crate) use say;

fn io_err(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, format!("{what}: {e}"))
}

pub fn run(dir: &Path, metadata_cache: u64, args: &ServeConfig) -> Result<ExitCode, Error> {
    let opened = open_vmdks(args)?;
    let home = open_home(dir, metadata_cache, args, &opened)?;
    if let Some(home) = &home {
        refuse_vmdk_names_of_disks(home, &opened)?;
    }
    // From here each part is recorded as it starts, and stopped in the
    // reverse order: by `stop` below, or by drop if a later one fails.
    let mut up = Running::new(stop_flag()?);
    up.home = home.clone();
    up.vmdks = export_list(&opened);
    let registry = Arc::new(StatsRegistry::new());
    let handler = match &home {
        Some(home) => Some(start_datastore(
            dir,
            Home {
                ds: home,
                metadata_cache,
                opened: &opened,
                registry: &registry,
            },
            args,
            &mut up,
        )?),
        None => {
            start_vmdk_controls(&opened, &mut up);
            None
        }
    };
    let exports = Arc::new(Exports {
        ds: home.clone(),
        places: up.places.clone(),
        vmdks: up.vmdks.clone(),
        stats: (!args.no_stats).then(|| registry.clone()),
    });
    let server = NbdServer::new(exports.clone(), nbd_options(args)?);
    let clients = handler.as_ref().map(|h| h.clients.clone());
    if let Some(c) = &clients {
        c.add_nbd(server.session_list());
    }
    // HTTP first: a client that waits for the NBD socket to appear may
    // ask for /metrics at once.
    let gauge_ds = home.clone();
    let refusals = server.refusals();
    up.http = start_http(
        args,
        Box::new(move || {
            let mut g = gauge_ds.as_ref().map(|d| d.gauges()).unwrap_or_default();
            g.extend(refusal_gauges(&refusals));
            g
        }),
        registry,
        handler
            .map(|h| h as Arc<dyn crate::web::Backend>)
            .zip(home.clone()),
        &mut up.banner,
    )?;
    let names = listen_all(&mut up, server, &exports, args, clients.as_deref())?;
    started(dir, home.as_ref(), &names, &up.banner);
    up.wait(args);
    up.stop()?;
    match home {
        Some(_) => stopped(dir),
        None => tracing::info!(event = "stop", "VMDK files flushed"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Bind every client listener: the vhost-user-blk sockets and the FUSE
/// mount first, NBD last, its Unix socket last of all (`listen`), so that
/// a script or test that waits for that socket to appear finds every
/// listener up. The banner keeps NBD's lines first. The export names.
fn listen_all(
    up: &mut Running,
    server: NbdServer,
    exports: &Arc<Exports>,
    args: &ServeConfig,
    clients: Option<&crate::clients::Clients>,
) -> Result<Vec<String>, Error> {
    let names = up.export_names();
    let example = names.first().cloned().unwrap_or_else(|| "DISK".into());
    let local = listen_local(up, exports, args, clients)?;
    let nbd = up.nbd.insert(server);
    listen(nbd, args, &example, &mut up.nbd_socket, &mut up.banner)?;
    up.banner.extend(local);
    Ok(names)
}

/// Serve `exports` on the vhost-user-blk sockets and the FUSE mount
/// asked for; their sessions count in `clients` (a datastore's server),
/// which can add and remove sockets from then on. Their banner lines.
fn listen_local(
    up: &mut Running,
    exports: &Arc<Exports>,
    args: &ServeConfig,
    clients: Option<&crate::clients::Clients>,
) -> Result<Vec<String>, Error> {
    let mut banner = Vec::new();
    let vhost = up
        .vhost
        .insert(Arc::new(vhost::VhostExports::new(exports.clone(), args)));
    listen_vhost(vhost, args, &mut banner)?;
    up.fuse = listen_fuse(exports, args, &mut banner)?;
    if let Some(c) = clients {
        c.set_vhost(vhost.clone());
        if let Some(f) = &up.fuse {
            c.set_fuse(f.clone());
        }
    }
    Ok(banner)
}

/// Log a datastore's server's clean stop: the journal's `stop`, the event
/// log's `server_stop`.
fn stopped(dir: &Path) {
    tracing::info!(event = "stop", datastore = %dir.display(), "datastore flushed and closed");
    crate::events::server_stopped(dir);
}

/// What starting a datastore's server needs besides its directory.
struct Home<'a> {
    ds: &'a crate::placement::Store,
    metadata_cache: u64,
    opened: &'a [OpenedVmdk],
    registry: &'a Arc<StatsRegistry>,
}

/// A `--vmdk` export may not take the name of one of the datastore's disks.
fn refuse_vmdk_names_of_disks(
    home: &crate::placement::Store,
    opened: &[OpenedVmdk],
) -> Result<(), Error> {
    match opened.iter().find(|o| home.exists(&o.name)) {
        Some(o) => Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "VMDK export '{}' ({}) has the name of a disk; name it with NAME=PATH",
                o.name,
                o.path.display()
            ),
        )),
        None => Ok(()),
    }
}

/// The parts only a server of a datastore has, started in order: its
/// control socket (one server per directory), placement (which finishes
/// or undoes a move a dead server left), the control thread, the VMDK
/// holder records, and the background work. The handler the HTTP API
/// shares with the control socket.
fn start_datastore(
    dir: &Path,
    home: Home<'_>,
    args: &ServeConfig,
    up: &mut Running,
) -> Result<Arc<control::Handler>, Error> {
    let (ctl_path, ctl) = bind_control(dir)?;
    // A quiesce hook whose unquiesce a dead server skipped runs it now.
    crate::groups::recover(home.ds.dir(), None);
    let config = placement_config(home.metadata_cache, args);
    let places = match crate::placement::Places::open(dir, home.ds.clone(), config) {
        Ok(p) => p,
        Err(e) => {
            let _ = std::fs::remove_file(&ctl_path);
            return Err(e);
        }
    };
    up.places = Some(places.clone());
    let jobs = Arc::new(crate::jobs::Jobs::open(home.ds.dir(), places.clone()));
    up.jobs = Some(jobs.clone());
    let handler = Arc::new(control::Handler {
        ds: home.ds.clone(),
        vmdks: vmdk_exports(home.opened),
        stats: home.registry.clone(),
        jobs,
        mover: Some(places),
        clients: Arc::default(),
    });
    let acceptor = control::spawn_server(ctl, handler.clone(), up.stop.clone());
    up.control.push((acceptor, Some(ctl_path.clone())));
    up.held = record_holders(
        home.opened,
        &vec![Some(ctl_path.clone()); home.opened.len()],
    );
    let mut background = Background::start(home.ds, dir, args, &up.stop);
    // Scheduled snapshots, through the handler's request path.
    let h = handler.clone();
    let with_ctx: crate::ops::schedules::WithCtx = Arc::new(move |f| h.with_ctx(f));
    let runner = crate::ops::schedules::spawn(with_ctx, up.stop.clone());
    background.threads.push(runner);
    spawn_passes(&handler, args, &up.stop, &mut background);
    up.background = Some(background);
    say!(up.banner, "strata: serving {}", home.ds.describe());
    Ok(handler)
}

/// How the datastores a server's moves open are opened: as the one it
/// serves (`serve`'s options).
fn placement_config(metadata_cache: u64, args: &ServeConfig) -> crate::placement::Config {
    crate::placement::Config {
        metadata_cache,
        direct_io: args.direct_io,
        store_timeout: Duration::from_secs(args.store_timeout),
        store_prefetch: args.store_prefetch,
        store_compact: args.store_compact,
        store_compress: args.store_compress,
        moves: crate::move_settings::MoveSettings {
            mirror: args.move_mirror,
            on_step: None,
        },
    }
}

/// The background dedup and compress passes `--dedup-interval` and
/// `--compress-interval` ask for, through the handler's request path.
fn spawn_passes(
    handler: &Arc<control::Handler>,
    args: &ServeConfig,
    stop: &Arc<std::sync::atomic::AtomicBool>,
    background: &mut Background,
) {
    let passes = [
        (args.dedup_interval, passes::Pass::Dedup),
        (
            args.compress_interval,
            passes::Pass::Compress {
                cold: Duration::from_secs(args.compress_cold),
                codec: args.compress_codec,
            },
        ),
    ];
    for (every, pass) in passes.into_iter().filter(|p| p.0 > 0) {
        background.threads.extend(passes::spawn(
            handler.clone(),
            pass,
            Duration::from_secs(every),
            stop.clone(),
        ));
    }
}

/// A server of VMDK files alone: a control socket beside each file (which
/// answers `status`, so that a refused open can name this server, and
/// `vmdk_shrink`) and their holder records.
fn start_vmdk_controls(opened: &[OpenedVmdk], up: &mut Running) {
    let (sockets, acceptors) = vmdk_control_sockets(opened, &up.stop);
    up.held = record_holders(opened, &sockets);
    // An acceptor runs for each socket that could be bound, in order.
    let bound = sockets.iter().flatten().cloned().map(Some);
    up.control = acceptors.into_iter().zip(bound).collect();
    say!(up.banner, "strata: serving VMDK files (no datastore)");
    for (o, sock) in opened.iter().zip(&sockets) {
        say!(
            up.banner,
            "  export {}: {} ({}, {} links{})",
            o.name,
            o.img.links[0].name,
            o.img.links[0].create_type(),
            o.img.links.len(),
            if o.img.read_only() { ", read-only" } else { "" }
        );
        if let Some(s) = sock {
            say!(up.banner, "    control socket {}", s.display());
        }
    }
}

/// Say what is served and how to stop it, once every listener is up (a
/// failed one ends the server before this with its error, and nothing
/// was announced), and log it as READY=1 is sent next.
fn started(
    dir: &Path,
    home: Option<&crate::placement::Store>,
    names: &[String],
    banner: &[String],
) {
    for line in banner {
        println!("{line}");
    }
    let Some(home) = home else {
        println!("  stop with Ctrl-C or SIGTERM (flushes)");
        tracing::info!(
            event = "start",
            version = env!("CARGO_PKG_VERSION"),
            pid = std::process::id(),
            "serving VMDK files"
        );
        return;
    };
    if names.is_empty() {
        println!(
            "  no disks yet: create one with 'strata create NAME --size 10G' (works while serving)"
        );
    } else {
        println!("  exports: {}", names.join(", "));
    }
    println!(
        "  control socket {} (strata commands use it automatically)",
        dir.join(strata_format::FILE_CONTROL).display()
    );
    for note in home.serving_notes() {
        println!("  {note}");
    }
    println!("  stop with Ctrl-C or SIGTERM ({})", home.kind().on_stop());
    crate::events::server_started(dir, home.recovered());
    tracing::info!(
        event = "start",
        datastore = %dir.display(),
        kind = home.kind().name(),
        version = env!("CARGO_PKG_VERSION"),
        pid = std::process::id(),
        "serving"
    );
}

/// The control socket of the datastore in `dir`. A local datastore's lock
/// is this server's and another server of an attached directory would
/// answer, so a socket file nobody answers is stale.
fn bind_control(dir: &Path) -> Result<(PathBuf, UnixListener), Error> {
    let ctl_path = dir.join(strata_format::FILE_CONTROL);
    if std::os::unix::net::UnixStream::connect(&ctl_path).is_ok() {
        return Err(Error::new(
            ErrorKind::Locked,
            format!(
                "another server of this directory answers at {}: one server per directory",
                ctl_path.display()
            ),
        ));
    }
    let _ = std::fs::remove_file(&ctl_path);
    let ctl = bind_listening(&ctl_path, None)?;
    Ok((ctl_path, ctl))
}

/// Open the datastore `serve` serves, either kind (a local one under its
/// lock, created with `--init`); None: there is none and `--vmdk` files
/// are served alone.
fn open_home(
    dir: &Path,
    metadata_cache: u64,
    args: &ServeConfig,
    opened: &[OpenedVmdk],
) -> Result<Option<crate::placement::Store>, Error> {
    let found = match strata_datastore::probe(dir) {
        Ok(_) => true,
        Err(e) if e.kind == ErrorKind::NotFound => false,
        Err(e) => return Err(e),
    };
    if !found && !args.init {
        if !opened.is_empty() {
            return Ok(None);
        }
        return Err(Error::new(
            ErrorKind::NotFound,
            format!(
                "no datastore at {} (create one with 'strata init')",
                dir.display()
            ),
        ));
    }
    if !found {
        strata_datastore::init(dir, &Default::default())?;
    }
    let opts = strata_datastore::OpenOptions {
        cache_bytes: metadata_cache,
        direct_io: args.direct_io,
        store_timeout: Duration::from_secs(args.store_timeout),
        store_cache: args.store_cache,
        store_prefetch: args.store_prefetch,
        store_compact: args.store_compact,
        store_compress: args.store_compress,
        role: strata_datastore::Role::Server,
        serving: Some(strata_datastore::Serving {
            detect_zeroes: args.detect_zeroes,
            placement_regions: args.placement,
            ready_ahead: args.ready_ahead,
            hot_prefetch: true,
            incoming: strata_datastore::Incoming {
                disks: args.incoming.clone(),
                wait: Duration::from_secs(args.incoming_wait),
            },
        }),
        ..strata_datastore::OpenOptions::default()
    };
    let ds = strata_datastore::open(dir, &opts)?;
    // Keys given at start (`--unlock DISK=FILE`): a wrong one stops the
    // start, naming the disk, rather than serve it locked.
    for (disk, secret) in &args.unlock {
        let slot = ds.unlock(disk, secret.expose())?;
        tracing::info!("unlocked disk '{disk}' (keyslot {slot})");
    }
    Ok(Some(ds))
}

/// A server's background work: the alarm watcher, and what the
/// datastore's kind runs ([`strata_datastore::Background`]: the
/// free-space policy of a local one, garbage collection of an object
/// store).
struct Background {
    threads: Vec<std::thread::JoinHandle<()>>,
    control: Arc<strata_engine::WorkControl>,
}

impl Background {
    fn start(
        home: &crate::placement::Store,
        dir: &Path,
        args: &ServeConfig,
        stop: &Arc<AtomicBool>,
    ) -> Background {
        let work = strata_datastore::Background {
            free_space_threshold: args.free_space_policy.then_some(args.free_space_threshold),
            gc_interval: (args.gc_interval > 0).then(|| Duration::from_secs(args.gc_interval)),
            control: Arc::default(),
        };
        let mut threads = home.clone().start_background(&work, stop);
        threads.push(spawn_alarm_watcher(
            home.clone(),
            dir.to_path_buf(),
            stop.clone(),
        ));
        Background {
            threads,
            control: work.control,
        }
    }

    fn stop(self) {
        self.control.cancel();
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// How often the alarm watcher evaluates the alarms, and how old the
/// figures it evaluates may be (an object store's cost a LIST and a GET
/// per disk; a local datastore's are always current).
const ALARM_EVERY: Duration = Duration::from_secs(1);
const ALARM_MAX_AGE: Duration = Duration::from_secs(30);

/// Evaluate the datastore's alarms every ALARM_EVERY until `stop`; log
/// each change of state and run the alarm's `--exec` command for it.
/// States start as the last server reported them (`alarm_reports`), so an
/// alarm that changed since is reported at once, one already reported not.
fn spawn_alarm_watcher(
    ds: crate::placement::Store,
    dir: PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("alarms".into())
        .spawn(move || {
            let mut last: HashMap<AlarmKind, AlarmState> = crate::alarm_reports::load(&*ds);
            let mut children: Vec<(String, std::process::Child)> = Vec::new();
            let mut failing = false;
            while !stop.load(Ordering::Acquire) {
                let figures = ds
                    .space_recent(ALARM_MAX_AGE)
                    .and_then(|i| Ok((i.alarms, ds.alarm_rules()?)));
                let (alarms, rules) = match figures {
                    Ok(x) => {
                        failing = false;
                        x
                    }
                    Err(e) => {
                        if !failing {
                            tracing::warn!("alarms: cannot evaluate: {}", e.message);
                        }
                        failing = true;
                        (Vec::new(), Vec::new())
                    }
                };
                for a in &alarms {
                    let previous = last.insert(a.kind, a.state).unwrap_or(AlarmState::Ok);
                    if previous == a.state {
                        continue;
                    }
                    let exec = rules
                        .iter()
                        .find(|r| r.kind == a.kind)
                        .and_then(|r| r.exec.clone());
                    alarm_changed(&dir, a, previous, exec, &mut children);
                    crate::alarm_reports::record(&*ds, a.kind, a.state);
                }
                reap(&mut children);
                // Wake often to stop promptly.
                let next = std::time::Instant::now() + ALARM_EVERY;
                while std::time::Instant::now() < next && !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            reap(&mut children);
        })
        .expect("spawn alarm watcher")
}

/// Log one alarm's change of state and start its command (not waited for).
fn alarm_changed(
    dir: &Path,
    a: &AlarmStatus,
    previous: AlarmState,
    exec: Option<String>,
    children: &mut Vec<(String, std::process::Child)>,
) {
    let kind = a.kind.as_str();
    let msg = format!(
        "{kind} alarm: {} -> {} at {}% (warning at {}%, alarm at {}%)",
        previous.as_str(),
        a.state.as_str(),
        a.percent,
        a.warning_percent,
        a.alarm_percent
    );
    // One event with its figures as fields; its level follows the new
    // state (a journal shows an alarm as an error, a warning as one, the
    // way back to ok as a notice).
    let (state, was) = (a.state.as_str(), previous.as_str());
    let (percent, warning_percent, alarm_percent) = (a.percent, a.warning_percent, a.alarm_percent);
    macro_rules! alarm_event {
        ($level:ident) => {
            tracing::$level!(
                event = "alarm",
                kind,
                state,
                previous = was,
                percent,
                warning_percent,
                alarm_percent,
                "{msg}"
            )
        };
    }
    match a.state {
        AlarmState::Ok => alarm_event!(info),
        AlarmState::Warning => alarm_event!(warn),
        AlarmState::Alarm => alarm_event!(error),
    }
    crate::events::alarm(dir, kind, msg);
    let Some(cmd) = exec else { return };
    let spawned = std::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .env("STRATA_ALARM_KIND", kind)
        .env("STRATA_ALARM_STATE", a.state.as_str())
        .env("STRATA_ALARM_PREVIOUS", previous.as_str())
        .env("STRATA_ALARM_PERCENT", a.percent.to_string())
        .env(
            "STRATA_ALARM_WARNING_PERCENT",
            a.warning_percent.to_string(),
        )
        .env("STRATA_ALARM_ALARM_PERCENT", a.alarm_percent.to_string())
        .env("STRATA_DATASTORE", dir)
        .stdin(std::process::Stdio::null())
        .spawn();
    match spawned {
        Ok(c) => children.push((cmd, c)),
        Err(e) => tracing::error!("{kind} alarm: cannot run '{cmd}': {e}"),
    }
}

/// Collect alarm commands that ended; report those that failed.
fn reap(children: &mut Vec<(String, std::process::Child)>) {
    children.retain_mut(|(cmd, c)| match c.try_wait() {
        Ok(Some(st)) => {
            if !st.success() {
                tracing::error!("alarm command '{cmd}' failed: {st}");
            }
            false
        }
        Ok(None) => true,
        Err(_) => false,
    });
}

pub(crate) type HttpThread = Option<crate::web::HttpServer>;

/// A flag SIGTERM and SIGINT set.
pub(crate) fn stop_flag() -> Result<Arc<AtomicBool>, Error> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| io_err("signal handler", e))?;
    }
    Ok(stop)
}

/// Bind the NBD listeners the arguments ask for and say how to connect.
pub(crate) fn listen(
    server: &NbdServer,
    args: &ServeConfig,
    example: &str,
    bound: &mut Option<PathBuf>,
    banner: &mut Vec<String>,
) -> Result<(), Error> {
    // TCP first: the Unix socket's file appears only once it listens
    // (bind_listening), so whoever waits for that file (a script, a test)
    // finds the TCP listener up too.
    if let Some(a) = &args.nbd_tcp {
        let l = TcpListener::bind(a).map_err(|e| io_err(&format!("bind {a}"), e))?;
        let addr = l.local_addr().map_err(|e| io_err("local addr", e))?;
        server.serve_tcp(l).map_err(|e| io_err("serve tcp", e))?;
        say!(banner, "  NBD on tcp {addr}");
        match &args.tls_creds {
            None => say!(banner, "    e.g. nbdinfo nbd://{addr}/{example}"),
            Some(_) => say!(
                banner,
                "    e.g. nbdinfo 'nbds://{addr}/{example}?tls-certificates=CLIENT_CREDS_DIR'"
            ),
        }
    }
    if let Some(p) = &args.nbd_unix {
        remove_stale_socket(p)?;
        let l = bind_listening(p, Some(args))?;
        // Ours from here: removed when the server stops.
        *bound = Some(p.clone());
        server.serve_unix(l).map_err(|e| io_err("serve unix", e))?;
        say!(banner, "  NBD on unix socket {}", p.display());
        say!(
            banner,
            "    e.g. nbdinfo 'nbd+unix:///{example}?socket={}'",
            p.display()
        );
        say!(
            banner,
            "         qemu-img info 'nbd+unix:///{example}?socket={}'",
            p.display()
        );
    }
    Ok(())
}

/// `strata_nbd_refused_total{cause}`: clients the NBD server turned away.
fn refusal_gauges(r: &strata_nbd::Refusals) -> Vec<Gauge> {
    strata_nbd::Refusal::ALL
        .iter()
        .map(|&c| {
            let causes: Vec<&str> = strata_nbd::Refusal::ALL.iter().map(|c| c.name()).collect();
            Gauge::new(
                "strata_nbd_refused_total",
                format!("NBD clients turned away, by cause ({})", causes.join(", ")),
                r.count(c) as f64,
            )
            .label("cause", c.name())
        })
        .collect()
}

/// The tokens `--http-token` and `--http-read-token` name (a missing file
/// is made with a new token); reads need one beyond loopback.
fn http_tokens(args: &ServeConfig, local: bool) -> Result<crate::web::Tokens, Error> {
    let invalid = |m: String| Error::new(ErrorKind::InvalidArgument, m);
    let tokens = crate::web::Tokens {
        action: match &args.http_token {
            Some(p) => Some(crate::web::load_or_make_token("action token", p)?),
            None => None,
        },
        read: match &args.http_read_token {
            Some(p) => Some(crate::web::load_or_make_token("read token", p)?),
            None => None,
        },
        reads_need_token: !local || args.http_read_token.is_some(),
    };
    if let (Some(a), Some(r)) = (&args.http_token, &args.http_read_token) {
        if tokens.action == tokens.read {
            return Err(invalid(format!(
                "the action token in {} and the read token in {} are the same: a read token \
                 must not grant actions",
                a.display(),
                r.display()
            )));
        }
    }
    Ok(tokens)
}

/// Serve `/metrics`, the dashboard and the API (`web`) when `--http` is
/// given; `backend` None: a server without a datastore (metrics only),
/// else with the datastore whose exports the charts sample.
pub(crate) fn start_http(
    args: &ServeConfig,
    gauges: crate::web::GaugeFn,
    registry: Arc<StatsRegistry>,
    backend: Option<(Arc<dyn crate::web::Backend>, crate::placement::Store)>,
    banner: &mut Vec<String>,
) -> Result<HttpThread, Error> {
    let (backend, charts_of) = backend.unzip();
    let Some(a) = &args.http else {
        return Ok(None);
    };
    let bind = crate::web::bind_address(a);
    let local = loopback_only(&bind)
        .map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("HTTP address {a}: {e}")))?;
    let tokens = http_tokens(args, local)?;
    let tls = match &args.tls_creds {
        Some(dir) => Some(https_config(dir)?),
        None => None,
    };
    let https = tls.is_some();
    let scheme = if https { "https" } else { "http" };
    let reads_need_token = tokens.reads_need_token;
    let has_backend = backend.is_some();
    let mut web = crate::web::Web::new(gauges, registry.clone(), backend, tokens, https);
    // Charts of a datastore's exports, sampled while the listener runs.
    let sampler = match charts_of {
        Some(ds) => {
            let (charts, sampler) = crate::web::charts::start(registry, ds)
                .map_err(|e| io_err("spawn the charts' sampler", e))?;
            web.charts = Some(charts);
            Some(sampler)
        }
        _ => None,
    };
    let mut h = crate::web::start(&bind, web, tls)?;
    h.sampler = sampler;
    let addr = h.addr;
    if has_backend {
        say!(
            banner,
            "  dashboard on {scheme}://{addr}/ (API: {scheme}://{addr}/api/v1, docs/API.md)"
        );
        match &args.http_token {
            Some(p) => say!(
                banner,
                "    actions need the token in {} (open {scheme}://{addr}/#token=TOKEN)",
                p.display()
            ),
            None => say!(banner, "    read-only: actions need --http-token FILE"),
        }
    }
    if reads_need_token {
        let files: Vec<String> = [&args.http_read_token, &args.http_token]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        say!(banner, "    reads need a token (in {})", files.join(" or "));
    }
    if !local && !https {
        say!(
            banner,
            "    note: {addr} is not loopback and --insecure serves it as plain HTTP"
        );
    }
    say!(banner, "  metrics on {scheme}://{addr}/metrics");
    Ok(Some(h))
}

/// The HTTPS configuration from the credentials in `dir` (no client
/// certificates: requests carry tokens).
fn https_config(dir: &std::path::Path) -> Result<Arc<rustls::ServerConfig>, Error> {
    strata_nbd::server_config(dir, false)
        .map(crate::web::https_config)
        .map_err(|e| {
            let msg = format!("TLS credentials in {}: {e}", dir.display());
            Error::new(ErrorKind::InvalidArgument, msg)
        })
}

/// Tell systemd (the NOTIFY_SOCKET of a Type=notify service) `states`;
/// a failure is logged, never fatal: the server works the same without.
fn notify_systemd(states: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!("cannot notify systemd (NOTIFY_SOCKET): {e}");
    }
}
