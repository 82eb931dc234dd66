//! The server's vhost-user-blk sockets: those `--vhost-user-blk` names at
//! start, and those `strata vhost add` adds to the running server (and
//! `vhost remove` takes away), all served, owned and announced the same
//! way. Each frontend connection opens its disk through `exports` (the
//! same statistics as NBD).

use super::*;

/// How the server serves a vhost-user-blk socket: the export table each
/// connection opens its disk from, and the serve options that say how
/// (queues, I/O threads, polling, socket owner and mode).
pub(super) struct VhostExports {
    pub(super) server: VhostBlkServer,
    exports: Arc<Exports>,
    args: ServeConfig,
}

impl VhostExports {
    pub(super) fn new(exports: Arc<Exports>, args: &ServeConfig) -> Self {
        VhostExports {
            server: VhostBlkServer::new(),
            exports,
            args: args.clone(),
        }
    }

    /// Serve `disk` on a socket at `sock`: the disk must exist now (rather
    /// than fail at connect time), a stale socket file there is replaced,
    /// anything else at the path refused.
    fn start(&self, disk: &str, sock: &Path) -> Result<(), Error> {
        self.exports.open(disk).map_err(|e| {
            let msg = format!("vhost-user-blk {disk} on {}: {e}", sock.display());
            Error::new(ErrorKind::NotFound, msg)
        })?;
        if self.server.listening().iter().any(|l| l.socket == sock) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{} is served already", sock.display()),
            ));
        }
        remove_stale_socket(sock)?;
        let e = self.exports.clone();
        let args = &self.args;
        let opts = strata_vhost::Options {
            queues: args.vhost_queues,
            serial: disk.chars().take(20).collect(),
            io_threads: io_threads(args, 0),
            ring_io: args.aio.ring() && args.direct_io,
            native_aio: args.aio == Aio::Native,
            poll: args.vhost_poll,
            export: disk.to_string(),
            ..Default::default()
        };
        // Its file appears listening, with its mode and owner.
        let l = bind_listening(sock, Some(args))?;
        self.server
            .serve_listener(sock, l, Arc::new(move |name: &str| e.open(name)), opts)
            .map_err(|err| {
                let _ = std::fs::remove_file(sock);
                io_err(&format!("vhost-user-blk on {}", sock.display()), err)
            })
    }
}

impl crate::clients::VhostControl for VhostExports {
    fn add(&self, disk: &str, socket: &Path) -> Result<(), Error> {
        if !socket.is_absolute() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("socket path {} is not absolute", socket.display()),
            ));
        }
        self.start(disk, socket)
    }

    fn server(&self) -> &VhostBlkServer {
        &self.server
    }
}

/// Listen on each `--vhost-user-blk` socket.
pub(super) fn listen_vhost(
    vhost: &VhostExports,
    args: &ServeConfig,
    banner: &mut Vec<String>,
) -> Result<(), Error> {
    for VhostDevice { disk, socket: sock } in &args.vhost_user_blk {
        vhost.start(disk, sock)?;
        say!(banner, "  vhost-user-blk {disk} on {}", sock.display());
        say!(
            banner,
            "    e.g. qemu-system-x86_64 -object memory-backend-memfd,id=mem,size=1G,share=on \\
         -machine memory-backend=mem -chardev socket,id=c0,path={},reconnect=1 \\
         -device vhost-user-blk-pci,chardev=c0",
            sock.display()
        );
    }
    Ok(())
}
