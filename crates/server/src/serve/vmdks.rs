//! VMDK images served beside a datastore or alone (`serve --vmdk`): opening
//! them, their exports and holder records, a control socket each, and
//! serving them with no datastore.

use super::*;

/// One `--vmdk` export as opened.
pub(super) struct OpenedVmdk {
    pub(super) name: String,
    pub(super) path: PathBuf,
    pub(super) img: Arc<VmdkImage>,
}

pub(super) fn export_list(v: &[OpenedVmdk]) -> Vec<(String, Arc<VmdkImage>)> {
    v.iter().map(|o| (o.name.clone(), o.img.clone())).collect()
}

/// The exports the control socket may shrink (`vmdk_shrink`).
pub(super) fn vmdk_exports(v: &[OpenedVmdk]) -> Vec<control::VmdkExport> {
    v.iter().map(vmdk_export).collect()
}

pub(super) fn vmdk_export(o: &OpenedVmdk) -> control::VmdkExport {
    control::VmdkExport {
        path: o.path.clone(),
        img: o.img.clone(),
    }
}

/// Record this server as the holder of every file it locked (see holders.rs).
pub(super) fn record_holders(
    v: &[OpenedVmdk],
    sockets: &[Option<PathBuf>],
) -> Vec<holders::Records> {
    v.iter()
        .zip(sockets)
        .map(|(o, sock)| {
            holders::record(
                &o.img,
                crate::vmdk_ops::folder(&o.path),
                "strata serve --vmdk",
                sock.as_deref(),
            )
        })
        .collect()
}

/// Open every `--vmdk [NAME=]PATH`, locked (docs/FORMAT.md §9.5).
pub(super) fn open_vmdks(args: &ServeConfig) -> Result<Vec<OpenedVmdk>, Error> {
    let access = if args.vmdk_read_only {
        Access::Read
    } else {
        Access::Write
    };
    let open = |VmdkExport { name, path }: &VmdkExport| {
        Ok(OpenedVmdk {
            name: name.clone(),
            path: path.clone(),
            img: Arc::new(crate::vmdk_ops::open_vmdk(path, access)?),
        })
    };
    args.vmdk.iter().map(open).collect()
}

/// The control socket of a VMDK-only server for the export opened from
/// `top`: `<top>.strata.sock`, or `<top>.strata-<pid>.sock` when another
/// live server (a read-only one of the same file) answers there already.
pub(super) fn vmdk_socket_path(top: &Path) -> PathBuf {
    let plain = PathBuf::from(format!("{}.strata.sock", top.display()));
    if std::os::unix::net::UnixStream::connect(&plain).is_ok() {
        return PathBuf::from(format!(
            "{}.strata-{}.sock",
            top.display(),
            std::process::id()
        ));
    }
    let _ = std::fs::remove_file(&plain); // left by a killed server
    plain
}

pub(super) fn flush_vmdks(vmdks: &[(String, Arc<VmdkImage>)]) {
    for (n, img) in vmdks {
        if let Err(e) = img.flush() {
            tracing::error!(export = %n, "flushing VMDK export {n} failed: {e}");
        }
    }
}

/// A control socket beside each served VMDK file (`strata vmdk` commands
/// find the server through it); None where it cannot be bound, and
/// refusals then name only the pid.
pub(super) fn vmdk_control_sockets(
    opened: &[OpenedVmdk],
    stop: &Arc<AtomicBool>,
) -> (Vec<Option<PathBuf>>, Vec<control::Acceptor>) {
    let mut sockets: Vec<Option<PathBuf>> = Vec::new();
    let mut ctl_threads = Vec::new();
    for o in opened {
        let p = vmdk_socket_path(&o.path);
        match bind_listening(&p, None) {
            Ok(l) => {
                let status = VmdkServerStatus {
                    server: "strata serve --vmdk".into(),
                    pid: std::process::id(),
                    export: o.name.clone(),
                    file: o.path.display().to_string(),
                    read_only: o.img.read_only(),
                };
                ctl_threads.push(control::spawn_vmdk_server(
                    l,
                    status,
                    vmdk_export(o),
                    stop.clone(),
                ));
                sockets.push(Some(p));
            }
            Err(e) => {
                tracing::warn!(
                    "no control socket for export {} ({}: {e}); refusals will name only the pid",
                    o.name,
                    p.display()
                );
                sockets.push(None);
            }
        }
    }
    (sockets, ctl_threads)
}
