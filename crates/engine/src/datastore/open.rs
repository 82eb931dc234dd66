//! Making and opening a datastore: init, open (recovery over the two logs,
//! damaged-slot fallback, upgrade from format version 1), and close.

use std::fs::File;
use std::sync::Arc;

use strata_format::{
    catalog_file, journal_file, SuperPick, Superblock, FILE_POOL, FILE_REFCOUNT, FILE_SUPER,
    FORMAT_VERSION_V1, GRAIN_BYTES, SUPER_SLOT_BYTES,
};
use strata_storage::{Backend, Storage};

use crate::catalog::Catalog;
use crate::error::{err, Error, ErrorKind, Result};
use crate::journal::{GenerationLog, LogFiles};
use crate::meta::Meta;
use crate::store::{now_unix, CheckpointState, CommitState, Store, StoreParts};

use super::{Datastore, InitOptions, OpenOptions, RECLAIM_STEP_GRAINS};

/// Read the catalog a superblock names, checking its checksum.
pub(crate) fn read_catalog(backend: &dyn Backend, sb: &Superblock) -> Result<Catalog> {
    if sb.catalog_bytes > 1 << 30 {
        return err(
            ErrorKind::Corrupt,
            "catalog length in the superblock is absurd",
        );
    }
    let name = catalog_file(sb.generation);
    let cat_file = backend.open(name, false)?;
    // Nothing is allocated from the superblock's word alone.
    let on_disk = cat_file
        .len()
        .map_err(|e| Error::new(ErrorKind::Io, format!("{name}: {e}")))?;
    if sb.catalog_bytes > on_disk {
        return err(
            ErrorKind::Corrupt,
            format!(
                "{name} of generation {} holds {on_disk} bytes; the superblock says {}",
                sb.generation, sb.catalog_bytes
            ),
        );
    }
    let mut cat = vec![0u8; sb.catalog_bytes as usize];
    cat_file.read_at(&mut cat, 0)?;
    let crc = crc32c::crc32c(&cat);
    if crc != sb.catalog_checksum {
        return err(
            ErrorKind::Corrupt,
            format!(
                "{name} of generation {} fails its checksum (stored {:#010x}, computed {crc:#010x})",
                sb.generation, sb.catalog_checksum
            ),
        );
    }
    Catalog::decode(&cat)
}

impl Datastore {
    /// Create a new, empty datastore in `backend`.
    pub fn init(backend: Arc<dyn Backend>, opts: &InitOptions) -> Result<()> {
        if backend.exists(FILE_SUPER) {
            return err(
                ErrorKind::AlreadyExists,
                format!("{} already holds a datastore", backend.describe()),
            );
        }
        let catalog = Catalog::new().encode();
        let mut uuid = [0u8; 16];
        rand::Rng::fill(&mut rand::thread_rng(), &mut uuid);
        let sb = Superblock {
            version: strata_format::FORMAT_VERSION,
            generation: 1,
            capacity_bytes: opts.capacity_bytes,
            pool_grains: 0,
            catalog_bytes: catalog.len() as u64,
            catalog_checksum: crc32c::crc32c(&catalog),
            uuid,
            created_unix_secs: now_unix(),
            ro_compat: 0,
            compat: 0,
            incompat: 0,
        };
        for f in [FILE_POOL, FILE_REFCOUNT, journal_file(0), journal_file(1)] {
            backend.open(f, true)?.sync()?;
        }
        let c = backend.open(catalog_file(1), true)?;
        c.write_at(&catalog, 0)?;
        c.sync()?;
        // The superblock last: a datastore exists once it is durable.
        let s = backend.open(FILE_SUPER, true)?;
        s.write_at(&sb.encode(), SUPER_SLOT_BYTES as u64)?;
        s.sync()?;
        Ok(())
    }

    /// Open a datastore, recovering from its log (docs/FORMAT.md §5,
    /// "Recovery"), and upgrading a version-1 datastore first (§8). `lock`
    /// is held for the lifetime of the datastore (the caller took it).
    #[expect(clippy::too_many_lines)]
    pub fn open(backend: Arc<dyn Backend>, opts: &OpenOptions, lock: Option<File>) -> Result<Self> {
        let where_ = backend.describe();
        let (super_file, pick) = read_superblock(backend.as_ref())?;
        let sb = pick.current;
        if sb.version == FORMAT_VERSION_V1 {
            let catalog = read_catalog(backend.as_ref(), &sb)?;
            crate::upgrade::upgrade_v1(backend.as_ref(), &sb, catalog)?;
            return Self::open(backend, opts, lock);
        }
        // A crash between steps 5 and 6 of an upgrade.
        crate::upgrade::finish(backend.as_ref())?;
        let mut open_warnings = Vec::new();
        // Which slots hold a superblock (a checkpoint must not overwrite
        // the only one, FORMAT.md §2); a never-written slot does not.
        let slot_valid = pick.valid;
        if let Some((slot, e)) = &pick.damaged {
            let w = damaged_slot(*slot, e, &sb);
            tracing::error!("{where_}: {w}");
            open_warnings.push(w);
        }
        let catalog = read_catalog(backend.as_ref(), &sb)?;
        let pool = if opts.direct_io {
            backend.open_direct(FILE_POOL, false)?
        } else {
            backend.open(FILE_POOL, false)?
        };
        let refs = backend.open(FILE_REFCOUNT, false)?;
        let mut meta = Meta::new(
            pool.clone(),
            refs.clone(),
            opts.cache_bytes,
            catalog,
            sb.pool_grains,
        );
        let journal_files = [
            backend.open(journal_file(0), true)?,
            backend.open(journal_file(1), true)?,
        ];
        let logs = LogFiles::new(journal_files);
        let (gen, log, replayed) = replay_chain(&logs, &mut meta, sb.generation)?;
        let writer = logs.resume(gen, &log);
        refuse_newer_logs(&logs, gen, &where_)?;
        meta.finish_open()
            .map_err(|e| Error::new(e.kind, format!("{where_}: {}", e.message)))?;
        // The reserved tail as the pool file's length finds it (§7.1).
        meta.set_tail_end(pool.len()? / GRAIN_BYTES);
        let inner = Arc::new(Store::new(StoreParts {
            direct_io: opts.direct_io,
            backend,
            pool,
            refs,
            super_file,
            meta,
            commit: CommitState {
                log: writer,
                synced_mutations: 0,
            },
            checkpoint: CheckpointState {
                logs,
                sb,
                slot_valid,
                images: Vec::new(),
            },
            open_warnings,
            replayed_batches: replayed,
            lock,
        }));
        if replayed > 0 {
            tracing::info!("replayed {replayed} log batches");
        }
        let ds = Datastore { inner };
        {
            let mut m = ds.inner.meta.lock();
            if let Err(e) = ds.inner.hold_reservation(&mut m, 0, 0) {
                tracing::warn!("{where_}: reservations are not all held on the host: {e}");
            }
        }
        ds.drop_held()?;
        // Make the recovered state a checkpoint, so the log starts empty.
        ds.inner.commit(true)?;
        Ok(ds)
    }

    /// How many log batches open replayed: not 0 when the last process
    /// that had the datastore open did not close it cleanly (a clean close
    /// ends with a checkpoint, which leaves the log empty).
    pub fn replayed_batches(&self) -> usize {
        self.inner.replayed_batches
    }

    /// Finish reclaiming, flush everything and checkpoint (clean shutdown).
    pub fn close(&self) -> Result<()> {
        self.stop_reclaimer();
        while self.reclaim(RECLAIM_STEP_GRAINS)? {
            self.inner.commit(false)?;
        }
        self.inner.commit(true)
    }
}

/// Replay the log of generation `gen` (the superblock's), then the next
/// ones while each log ends by naming the next (a checkpoint that did not
/// finish writing its superblock, or a damaged newer slot): the last
/// generation replayed, its log (emptied of its batches; where writing
/// resumes), and how many batches were replayed.
fn replay_chain(
    logs: &LogFiles,
    meta: &mut Meta,
    mut gen: u64,
) -> Result<(u64, GenerationLog, usize)> {
    let mut replayed = 0;
    let mut log = logs.read_generation(gen)?;
    loop {
        replayed += log.batches.len();
        for recs in std::mem::take(&mut log.batches) {
            for r in recs {
                meta.replay(r)?;
            }
        }
        let Some(next) = log.ended_for else { break };
        if next <= gen || next % 2 == gen % 2 {
            break;
        }
        let following = logs.read_generation(next)?;
        if following.batches.is_empty() {
            break;
        }
        gen = next;
        log = following;
    }
    Ok((gen, log, replayed))
}

/// Refuse to open when a log file begins with a generation newer than
/// `gen`, the last the superblock leads to: a newer superblock was lost,
/// and opening without it would drop flushed writes (FORMAT.md §2).
fn refuse_newer_logs(logs: &LogFiles, gen: u64, where_: &str) -> Result<()> {
    for (file, first) in logs.first_generations()?.into_iter().enumerate() {
        if let Some(g) = first.filter(|&g| g > gen) {
            return err(
                ErrorKind::Corrupt,
                format!(
                    "{where_}: {} begins with a valid log of generation {g}, newer than what \
                     the superblock leads to ({gen}): a newer superblock was lost; refusing to \
                     open without it",
                    journal_file(file as u64)
                ),
            );
        }
    }
    Ok(())
}

/// The superblock file and its two slots' verdict (FORMAT.md §2); no
/// datastore here when there is no such file.
fn read_superblock(backend: &dyn Backend) -> Result<(Arc<dyn Storage>, SuperPick)> {
    let where_ = backend.describe();
    if !backend.exists(FILE_SUPER) {
        return err(
            ErrorKind::NotFound,
            format!("no datastore in {where_} (run 'strata init' first)"),
        );
    }
    let super_file = backend.open(FILE_SUPER, false)?;
    let mut slots = vec![0u8; 2 * SUPER_SLOT_BYTES];
    super_file.read_at(&mut slots, 0)?;
    let pick = Superblock::pick_slots(&slots[..SUPER_SLOT_BYTES], &slots[SUPER_SLOT_BYTES..])
        .map_err(|e| Error::new(ErrorKind::Corrupt, format!("{where_}: {FILE_SUPER}: {e}")))?;
    Ok((super_file, pick))
}

/// What `check` reports of a damaged superblock slot when the datastore
/// opened from the other one, `sb`.
fn damaged_slot(slot: usize, e: &impl std::fmt::Display, sb: &Superblock) -> String {
    format!(
        "{FILE_SUPER} slot {slot} (byte {}) is damaged: {e}; opened from slot {} (generation {})",
        slot * SUPER_SLOT_BYTES,
        sb.generation % 2,
        sb.generation
    )
}
