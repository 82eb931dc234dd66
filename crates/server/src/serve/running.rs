//! A server's one lifecycle: the parts it starts, in order, each recorded
//! here as soon as it is up, and stopped in the reverse order, by
//! [`Running::stop`] after a signal or by drop when a later part fails to
//! start (a bind refused, a mount point taken): then nothing is left
//! behind, no socket file, thread or unflushed datastore. A server of
//! `--vmdk` files alone runs the same lifecycle with no datastore.

use super::*;

/// What a server has started, field by field in the order it starts them.
pub(super) struct Running {
    /// Set when the server stops: the control and background threads end.
    pub(super) stop: Arc<AtomicBool>,
    /// 1. The datastore (None: `--vmdk` files alone), closed last.
    pub(super) home: Option<crate::placement::Store>,
    /// 2. The `--vmdk` exports, flushed after everything that writes them.
    pub(super) vmdks: Vec<(String, Arc<VmdkImage>)>,
    /// 3. Where the datastore's disks live (home, or moved elsewhere).
    pub(super) places: Option<Arc<crate::placement::Places>>,
    /// 4. Control sockets: the datastore's, or one per VMDK file; the
    ///    socket file of each, removed after its thread ended.
    pub(super) control: Vec<(control::Acceptor, Option<PathBuf>)>,
    /// 5. The holder records of the VMDK files (dropping them removes them).
    pub(super) held: Vec<holders::Records>,
    /// 5b. The jobs clients started (stopped at a step's end, after the
    ///     control sockets, so that none starts meanwhile).
    pub(super) jobs: Option<Arc<crate::jobs::Jobs>>,
    /// 6. Alarms and the kind's background work.
    pub(super) background: Option<Background>,
    /// 7. HTTP (dashboard, API, metrics).
    pub(super) http: HttpThread,
    /// 8. NBD, and the Unix socket file it bound.
    pub(super) nbd: Option<NbdServer>,
    pub(super) nbd_socket: Option<PathBuf>,
    /// 9. vhost-user-blk.
    pub(super) vhost: Option<Arc<super::vhost::VhostExports>>,
    /// 10. The FUSE mount.
    pub(super) fuse: Option<Arc<strata_fuse::FuseServer>>,
    /// What each part will say it serves, printed once every part is up
    /// (a server that fails to start announces nothing).
    pub(super) banner: Vec<String>,
}

impl Running {
    /// The names of what is served: the `--vmdk` exports, then the
    /// datastore's disks and snapshots.
    pub(super) fn export_names(&self) -> Vec<String> {
        let vmdks = self.vmdks.iter().map(|(n, _)| n.clone());
        let disks = self.places.iter().flat_map(|p| p.export_names());
        vmdks.chain(disks.map(|(n, _)| n)).collect()
    }

    pub(super) fn new(stop: Arc<AtomicBool>) -> Running {
        Running {
            stop,
            home: None,
            vmdks: Vec::new(),
            places: None,
            control: Vec::new(),
            held: Vec::new(),
            jobs: None,
            background: None,
            http: None,
            nbd: None,
            nbd_socket: None,
            vhost: None,
            fuse: None,
            banner: Vec::new(),
        }
    }

    /// Stop every part in the reverse order of its start; the datastore's
    /// close is the result (what was acknowledged is flushed, or this says
    /// why not).
    pub(super) fn stop(mut self) -> Result<(), Error> {
        tracing::info!(event = "stopping", "shutting down");
        notify_systemd(&[sd_notify::NotifyState::Stopping]);
        self.stop_parts()
    }

    fn stop_parts(&mut self) -> Result<(), Error> {
        self.stop.store(true, Ordering::Release);
        // Unmounts and drops every device handle the mount held.
        if let Some(f) = self.fuse.take() {
            f.shutdown();
        }
        if let Some(v) = self.vhost.take() {
            v.server.shutdown();
        }
        if let Some(s) = self.nbd.take() {
            s.shutdown();
        }
        if let Some(p) = self.nbd_socket.take() {
            let _ = std::fs::remove_file(p);
        }
        if let Some(h) = self.http.take() {
            h.stop();
        }
        if let Some(b) = self.background.take() {
            b.stop();
        }
        self.held.clear();
        for (acceptor, socket) in self.control.drain(..).rev() {
            acceptor.stop();
            if let Some(p) = socket {
                let _ = std::fs::remove_file(p);
            }
        }
        if let Some(jobs) = self.jobs.take() {
            stop_jobs(&jobs);
        }
        if let Some(p) = self.places.take() {
            p.close();
        }
        flush_vmdks(&std::mem::take(&mut self.vmdks));
        match self.home.take() {
            Some(home) => home.close(),
            None => Ok(()),
        }
    }

    /// Wait for SIGTERM or SIGINT, reloading the TLS credentials on
    /// SIGHUP (renewed certificates, for the connections that come next).
    pub(super) fn wait(&self, args: &ServeConfig) {
        // Every listener is up: a systemd unit of Type=notify (the
        // package's strata@.service) counts the server started from here.
        // Without NOTIFY_SOCKET this does nothing.
        notify_systemd(&[sd_notify::NotifyState::Ready]);
        let reload = Arc::new(AtomicBool::new(false));
        if args.tls_creds.is_some() {
            if let Err(e) = signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())
            {
                tracing::warn!("no SIGHUP handler, TLS credentials cannot be reloaded: {e}");
            }
        }
        while !self.stop.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(100));
            if reload.swap(false, Ordering::AcqRel) {
                self.reload_tls(args);
            }
        }
    }

    fn reload_tls(&self, args: &ServeConfig) {
        let https = match (&self.http, &args.tls_creds) {
            (Some(_), Some(dir)) => Some(https_config(dir)),
            _ => None,
        };
        match (load_tls(args), https) {
            (Err(e), _) | (_, Some(Err(e))) => {
                tracing::warn!("TLS credentials not reloaded, the old ones stay: {e}")
            }
            (Ok(tls), https) => {
                if let Some(s) = &self.nbd {
                    s.set_tls(tls);
                }
                if let (Some(h), Some(Ok(c))) = (&self.http, https) {
                    h.set_tls(c);
                }
                tracing::info!(event = "tls_reload", "TLS credentials reloaded");
            }
        }
    }
}

impl Drop for Running {
    /// A server that failed to start (or a panic) still stops what it
    /// started, in order; after `stop` there is nothing left to do.
    fn drop(&mut self) {
        if let Err(e) = self.stop_parts() {
            tracing::error!("closing the datastore failed: {e}");
        }
    }
}

/// How long a stopping server waits for its jobs to reach the end of a
/// step (a region of a pass, a chunk of an import).
const JOBS_STOP_BOUND: Duration = Duration::from_secs(30);

/// Stop the jobs clients started at the end of their current step, so that
/// the datastore closes with none of them writing; log those left (paused,
/// or still in a step), which the next server lists as interrupted.
fn stop_jobs(jobs: &crate::jobs::Jobs) {
    let left = jobs.stop_all(crate::jobs::STOPPED_BY_SHUTDOWN, JOBS_STOP_BOUND);
    if !left.is_empty() {
        tracing::warn!(
            event = "stopping",
            "jobs left unfinished (listed as interrupted by the next server): {}",
            left.join(", ")
        );
    }
}
