//! What a server exports, by name: the datastore's disks (wherever
//! `move` placed them) and the VMDK images it opened, as NBD exports and
//! as the files of a FUSE mount.

use super::*;

pub(super) struct Exports {
    pub(super) ds: Option<crate::placement::Store>,
    /// Where the datastore's disks live (home or moved elsewhere).
    pub(super) places: Option<Arc<crate::placement::Places>>,
    pub(super) vmdks: Vec<(String, Arc<VmdkImage>)>,
    pub(super) stats: Option<Arc<StatsRegistry>>,
}

impl ExportProvider for Exports {
    fn list(&self) -> Vec<ExportInfo> {
        let mut out: Vec<ExportInfo> = self
            .vmdks
            .iter()
            .map(|(name, img)| ExportInfo {
                name: name.clone(),
                description: format!(
                    "VMDK {} ({}, {} links{})",
                    img.links[0].name,
                    img.links[0].create_type(),
                    img.links.len(),
                    if img.read_only() { ", read-only" } else { "" }
                ),
            })
            .collect();
        if let Some(p) = &self.places {
            out.extend(
                p.export_names()
                    .into_iter()
                    .map(|(name, description)| ExportInfo { name, description }),
            );
        }
        out
    }

    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error> {
        let dev = self.open_raw(name)?;
        Ok(match &self.stats {
            // Every connection to the same export shares one set of statistics.
            Some(reg) => Arc::new(StatsDevice::new(dev, reg.get_or_create(name))),
            None => dev,
        })
    }

    fn contexts(&self, export: &str) -> Vec<String> {
        match self.store_of(export) {
            Some(ds) => crate::bitmaps::names(&*ds, export),
            None => Vec::new(),
        }
    }

    fn context(&self, export: &str, name: &str) -> Option<Arc<dyn strata_nbd::MetaContext>> {
        crate::bitmaps::open(self.store_of(export)?, export, name)
    }
}

impl Exports {
    /// The datastore that holds export `name`'s disk (None for a VMDK).
    fn store_of(&self, name: &str) -> Option<crate::placement::Store> {
        if self.vmdks.iter().any(|(n, _)| n == name) {
            return None;
        }
        let p = self.places.as_ref()?;
        let disk = strata_format::split_target(name).0;
        p.store(&p.place_of(disk)).ok()
    }

    /// The device behind an export, without statistics (for looking at its
    /// size and mode; I/O goes through [`ExportProvider::open`]).
    fn open_raw(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error> {
        match (self.vmdks.iter().find(|(n, _)| n == name), &self.places) {
            (Some((_, img)), _) => Ok(img.clone() as Arc<dyn BlockDevice>),
            // Through the disk's slot, so that a move can switch it.
            (None, Some(p)) => p.slot(name).map(|s| s as Arc<dyn BlockDevice>),
            (None, None) => Err(Error::new(
                ErrorKind::NotFound,
                format!("no export named '{name}'"),
            )),
        }
    }
}

/// The exports as the FUSE directory shows them: the same names as NBD,
/// opened through [`Exports`] so FUSE I/O counts in the statistics.
struct FuseExports(Arc<Exports>);

impl strata_fuse::FuseProvider for FuseExports {
    fn list(&self) -> Vec<strata_fuse::FuseExport> {
        ExportProvider::list(&*self.0)
            .into_iter()
            .filter_map(|e| self.stat(&e.name).ok())
            .collect()
    }

    fn stat(&self, name: &str) -> Result<strata_fuse::FuseExport, Error> {
        // Opening a disk handle is O(1) (no I/O): it gives the current
        // size and whether the export is read-only.
        let dev = self.0.open_raw(name)?;
        // A disk's allocated grains are a counter (O(1)); snapshots and
        // VMDK images show their size.
        let stored_bytes = match &self.0.ds {
            Some(ds) if !self.0.vmdks.iter().any(|(n, _)| n == name) => ds.stored_bytes(name),
            _ => None,
        };
        // Changes through any transport of this server (they all count in
        // the export's statistics).
        let modified = self
            .0
            .stats
            .as_ref()
            .and_then(|r| r.get(name))
            .and_then(|d| d.modified_ms())
            .map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
        Ok(strata_fuse::FuseExport {
            name: name.to_string(),
            read_only: dev.read_only(),
            size_bytes: dev.size_bytes(),
            stored_bytes,
            modified,
        })
    }

    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error> {
        ExportProvider::open(&*self.0, name)
    }

    fn space(&self) -> Option<strata_fuse::FsSpace> {
        // An object store's figures cost requests: statfs takes them at
        // most FS_SPACE_MAX_AGE old. One with no capacity set has none.
        let i = self.0.ds.as_ref()?.space_recent(FS_SPACE_MAX_AGE).ok()?;
        if i.capacity_bytes == 0 {
            return None;
        }
        Some(strata_fuse::FsSpace {
            total_bytes: i.capacity_bytes,
            free_bytes: i.free_bytes,
        })
    }
}

/// How old the space figures `statfs` of the FUSE mount shows may be.
const FS_SPACE_MAX_AGE: Duration = Duration::from_secs(10);

/// Mount `--fuse DIR` when given.
pub(super) fn listen_fuse(
    exports: &Arc<Exports>,
    args: &ServeConfig,
    banner: &mut Vec<String>,
) -> Result<Option<Arc<strata_fuse::FuseServer>>, Error> {
    let Some(dir) = &args.fuse else {
        return Ok(None);
    };
    let what = format!("FUSE mount point {}", dir.display());
    match strata_fuse::prepare_mountpoint(dir) {
        Ok(strata_fuse::Prepared::Ready) => {}
        Ok(strata_fuse::Prepared::StaleUnmounted) => tracing::warn!(
            "{} was a stale FUSE mount (its server had died); unmounted it lazily",
            dir.display()
        ),
        Err(e) => return Err(e.context(what)),
    }
    let opts = strata_fuse::Options {
        allow_other: args.fuse_allow_other,
        ..Default::default()
    };
    let provider = Arc::new(FuseExports(exports.clone()));
    let server = strata_fuse::FuseServer::mount(dir, provider, &opts).map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            " (is /dev/fuse there, and fusermount3 from the fuse3 package for non-root users?)"
        } else {
            ""
        };
        io_err(&format!("{what}: mount{hint}"), e)
    })?;
    say!(
        banner,
        "  FUSE on {}: one file per disk (DISK) and snapshot (DISK@SNAP, read-only){}",
        dir.display(),
        if args.fuse_allow_other {
            ", allow_other"
        } else {
            ""
        }
    );
    say!(banner, "    e.g. qemu-img info {}/DISK", dir.display());
    Ok(Some(Arc::new(server)))
}
