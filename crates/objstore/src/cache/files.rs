//! The cache directory's files: writing a segment's file (through the
//! page cache or past it, under a temporary name of its own), the sparse
//! files that keep the grains reads used of an object evicted whole
//! (§11.8) and which grains they hold, and the listing that finds them at
//! startup.

use super::*;

impl SegmentCache {
    /// The keeper's work (§11.8): the grains reads used of whole object
    /// `seg` become its sparse file. Copied into a file of its own first,
    /// without the lock reads that miss take; then, under it: if `seg` is
    /// still the object held whole, grains read meanwhile are copied too,
    /// the sparse file takes its place and its key is counted by those
    /// grains (a shrink); if it was evicted, the sparse file enters the
    /// main FIFO (or its grains join the one a miss made meanwhile); if
    /// it arrived whole again meanwhile, nothing changes.
    pub(super) fn keep_read_grains(&self, id: SegId, seg: &CachedSegment) {
        if !worth_keeping(seg) {
            return;
        }
        let tmp = unique_tmp(&self.partial_path(id));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp);
        let Ok(file) = file else { return };
        let read = seg.pages_read();
        if !seg.copy_pages(&file, &read) {
            let _ = std::fs::remove_file(&tmp);
            return;
        }
        let copied: HashSet<u32> = read.into_iter().collect();
        let lock = self.partial_lock.lock().unwrap();
        let current = self.segments.read().unwrap().get(&id).cloned();
        let out = match current {
            Some(c) if std::ptr::eq(&*c, seg) => self.shrink_to_read(id, seg, (&tmp, file), copied),
            // Here whole again (fetched anew): that copy stands.
            Some(_) => {
                let _ = std::fs::remove_file(&tmp);
                None
            }
            None => self.keep_evicted(id, seg, (&tmp, file), copied),
        };
        // Under the lock, as when a grain is kept: a miss that keeps a
        // grain of an object this evicts must not find it half gone.
        if let Some(out) = out {
            self.evict(out);
        }
        drop(lock);
    }

    /// `keep_read_grains` when `seg` is still object `id` held whole
    /// (under `partial_lock`): grains read while the `copied` ones were
    /// copied into `file` (at `tmp`) are copied too, and the sparse file
    /// takes the whole one's place; what the cache's policy evicts then,
    /// or None if a copy failed (nothing changed).
    fn shrink_to_read(
        &self,
        id: SegId,
        seg: &CachedSegment,
        (tmp, file): (&Path, File),
        mut copied: HashSet<u32>,
    ) -> Option<Vec<SegId>> {
        loop {
            let more: Vec<u32> = seg
                .pages_read()
                .into_iter()
                .filter(|s| !copied.contains(s))
                .collect();
            if more.is_empty() {
                break;
            }
            if !seg.copy_pages(&file, &more) {
                let _ = std::fs::remove_file(tmp);
                return None;
            }
            copied.extend(more);
        }
        if !self.place_partial(id, tmp, file) {
            return None;
        }
        // Readers take the whole file while it is there; it goes
        // before its entry, so no reader opens it again.
        let _ = std::fs::remove_file(self.path(id));
        self.segments.write().unwrap().remove(&id);
        self.shrunk.fetch_add(1, Relaxed);
        let mut p = self.policy().lock().unwrap();
        p.remove(&id);
        Some(p.grow(id, (copied.len() * GRAIN) as u64, true, Instant::now()))
    }

    /// `keep_read_grains` when object `id` was evicted whole meanwhile
    /// (under `partial_lock`): the `copied` grains in `file` (at `tmp`)
    /// enter the main FIFO as its sparse file, or join the one a miss
    /// made meanwhile; what the policy evicts then, or None if a copy or
    /// the rename failed.
    fn keep_evicted(
        &self,
        id: SegId,
        seg: &CachedSegment,
        (tmp, file): (&Path, File),
        copied: HashSet<u32>,
    ) -> Option<Vec<SegId>> {
        let bytes = (copied.len() * GRAIN) as u64;
        let known = self.partials.read().unwrap().get(&id).cloned();
        match known {
            // A miss kept a grain of it meanwhile: these join it.
            Some(p) => {
                let _ = std::fs::remove_file(tmp);
                let pages: Vec<u32> = copied.into_iter().collect();
                if !seg.copy_pages(&p.file, &pages) {
                    return None;
                }
                self.evicted_kept.fetch_add(1, Relaxed);
                let mut pol = self.policy().lock().unwrap();
                Some(pol.grow(id, bytes, true, Instant::now()))
            }
            None => {
                if !self.place_partial(id, tmp, file) {
                    return None;
                }
                self.evicted_kept.fetch_add(1, Relaxed);
                let mut pol = self.policy().lock().unwrap();
                let kept = Arrival {
                    bytes,
                    main: true,
                    read: true,
                };
                Some(pol.insert(id, kept, Instant::now()))
            }
        }
    }

    /// Keep grain `e` (the bytes it is stored in, `g`, checked) in its
    /// object's sparse file at their offset, unless the object is here whole. Also when the miss started
    /// a fetch of the whole object: the file that replaces the sparse one
    /// then counts the grain as read (see [`Self::replace_partial`]), so a
    /// shrink keeps it; and a fetch that fails leaves the grain kept.
    pub(super) fn keep_grain(&self, e: &Entry, vg: u64, g: &[u8], want_whole: bool) {
        let _g = self.partial_lock.lock().unwrap();
        if let Some(whole) = self.segments.read().unwrap().get(&e.seg) {
            // It arrived meanwhile (the fetch this miss started): the
            // grain was read, which its next shrink must know.
            whole.note_grain(e);
            return;
        }
        let p = match self.partial(e.seg) {
            Some(p) => p,
            None => {
                let Ok(file) = self.make_partial(e.seg, false) else {
                    return;
                };
                let p = Partial::new(file, self.clock_ms(), Some((e.pages().start, vg)));
                self.partials.write().unwrap().insert(e.seg, p.clone());
                p
            }
        };
        if want_whole {
            p.whole_wanted.store(true, Relaxed);
        }
        if p.file.write_all_at(g, e.grain_range().0).is_err() {
            return;
        }
        let out = self
            .policy()
            .lock()
            .unwrap()
            .grow(e.seg, g.len() as u64, true, Instant::now());
        self.evict(out);
    }

    /// [`Self::write_file_now`], noting when the cache directory stops
    /// (says so once) and starts again to take files.
    pub(super) fn write_file(&self, id: SegId, bytes: &[u8], direct: bool) -> Result<File> {
        let r = self.write_file_now(id, bytes, direct);
        let mut u = self.unwritable.lock().unwrap();
        match &r {
            Err(e) => {
                if u.is_none() {
                    tracing::warn!(
                        "{e}: reads go to the store, and no object is fetched whole \
                         for {} s at a time, until the cache directory takes files again",
                        UNWRITABLE_RETRY.as_secs()
                    );
                }
                *u = Some(Instant::now());
            }
            // Told only once the pause is over (a failure can be one
            // directory's, and others take files meanwhile).
            Ok(_) if u.is_some_and(|t| t.elapsed() >= UNWRITABLE_RETRY) => {
                tracing::warn!(
                    "the cache directory {} takes files again",
                    self.dir.display()
                );
                *u = None;
            }
            Ok(_) => {}
        }
        r
    }
    /// Write object `id`'s file. `direct`: past the host's page cache
    /// where the file system allows (an upload's copy, read later if at
    /// all: its first read asks for the whole file, see [`Self::local`]);
    /// otherwise through it (a fetch, read at once).
    fn write_file_now(&self, id: SegId, bytes: &[u8], direct: bool) -> Result<File> {
        self.policy();
        let path = self.path(id);
        let parent = path.parent().expect("segment keys have a directory");
        let io = |what: &str, e: std::io::Error| {
            Error::new(
                ErrorKind::Io,
                format!("cannot {what} cache file {}: {e}", path.display()),
            )
        };
        std::fs::create_dir_all(parent).map_err(|e| io("make the directory of", e))?;
        let tmp = unique_tmp(&path);
        if !(direct && write_direct(&tmp, bytes, &self.direct_bufs).map_err(|e| io("write", e))?) {
            let mut f = File::create(&tmp).map_err(|e| io("create", e))?;
            f.write_all(bytes).map_err(|e| io("write", e))?;
        }
        std::fs::rename(&tmp, &path).map_err(|e| io("rename", e))?;
        File::open(&path).map_err(|e| io("open", e))
    }
}

/// Write `bytes` to a new file at `path` with `O_DIRECT`, through a
/// page-aligned buffer this thread keeps: no page-cache pages are made
/// for a copy that may never be read (on this machine, new page-cache
/// pages were half of the CPU a 512k sequential write into the store
/// cost: docs/PERFORMANCE.md). `Ok(false)`: the file system does not take
/// `O_DIRECT` (tmpfs), nothing was written. The buffer comes from and
/// goes back to `bufs` (a few kept).
/// A temporary name beside `path` that no other writer uses: this
/// process's id and a number of its own (two threads of a process may
/// fetch one object at the same time, and one writer's rename must not
/// take the other's file away).
fn unique_tmp(path: &Path) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".tmp{}-{n}", std::process::id()));
    PathBuf::from(name)
}

fn write_direct(path: &Path, bytes: &[u8], bufs: &Mutex<Vec<Vec<u8>>>) -> std::io::Result<bool> {
    use std::os::unix::fs::OpenOptionsExt;
    const ALIGN: usize = 4096;
    const KEEP: usize = 4;
    let f = match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(false),
        Err(e) => return Err(e),
    };
    let padded = bytes.len().div_ceil(ALIGN) * ALIGN;
    let mut b = bufs.lock().unwrap().pop().unwrap_or_default();
    if b.len() < padded + ALIGN {
        b.resize(padded + ALIGN, 0);
    }
    let at = b.as_ptr().align_offset(ALIGN);
    let buf = &mut b[at..at + padded];
    buf[..bytes.len()].copy_from_slice(bytes);
    buf[bytes.len()..].fill(0);
    let r = f.write_all_at(buf, 0);
    let mut kept = bufs.lock().unwrap();
    if kept.len() < KEEP {
        kept.push(b);
    }
    drop(kept);
    r?;
    // The padding off again.
    f.set_len(bytes.len() as u64)?;
    Ok(true)
}

/// The pages of a data area a sparse file holds (see `Entry::pages`; a
/// version-1 grain's slot): its data extents (`SEEK_DATA` /
/// `SEEK_HOLE`), of which page `i` counts if its 4 KiB at `4096 + 4096 i`
/// lie inside one (writing page `i` makes block `i + 1` data, so this
/// finds exactly the pages written, and those a placed grain touched;
/// a file system that reports the whole file as data gives every page,
/// which only costs a shrink some holes).
pub(super) fn held_pages(file: &File) -> Vec<u32> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut at: libc::off_t = 0;
    loop {
        // SAFETY: lseek on a descriptor this File owns.
        let data = unsafe { libc::lseek(fd, at, libc::SEEK_DATA) };
        if data < 0 {
            break; // ENXIO: no data past `at`
        }
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole <= data {
            break;
        }
        let first = (data as u64)
            .saturating_sub(SEG_DATA_OFFSET as u64)
            .div_ceil(GRAIN as u64);
        let mut slot = first;
        while SegmentInfo::grain_offset(slot as u32) + GRAIN as u64 <= hole as u64 {
            out.push(slot as u32);
            slot += 1;
        }
        at = hole;
    }
    out
}

/// Ask the kernel to read all of `file` into the page cache, in the
/// background (a hint: nothing to do if it fails).
pub(super) fn read_ahead(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a hint on a descriptor this File owns; no memory is passed.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED) };
}

/// The segment files under `dir` (`root` is the cache directory): id,
/// bytes and modification time. Files a process that died left half
/// written (`*.tmpPID-N`) are deleted.
pub(super) fn list_files(root: &Path, dir: &Path, out: &mut Vec<(SegId, u64, SystemTime, bool)>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for ent in rd.flatten() {
        let path = ent.path();
        let Ok(meta) = ent.metadata() else { continue };
        if meta.is_dir() {
            list_files(root, &path, out);
            continue;
        }
        let is_tmp = path
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| x.starts_with("tmp"));
        if is_tmp {
            // Another process's file being written stays.
            let pid = path.extension().and_then(|x| {
                x.to_str()?
                    .strip_prefix("tmp")?
                    .split('-')
                    .next()?
                    .parse::<u32>()
                    .ok()
            });
            if pid.is_none_or(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let Some(key) = path.strip_prefix(root).ok().and_then(|k| k.to_str()) else {
            continue;
        };
        // A sparse file (`KEY.g`) counts the bytes it holds, not its length.
        let (key, partial) = match key.strip_suffix(".g") {
            Some(k) => (k, true),
            None => (key, false),
        };
        let bytes = if partial {
            std::os::unix::fs::MetadataExt::blocks(&meta) * 512
        } else {
            meta.len()
        };
        if let Some(id) = SegId::from_key(key).or_else(|| SegId::payload_from_key(key)) {
            let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            out.push((id, bytes, mtime, partial));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Files written past the page cache hold exactly the bytes (the
    /// padding to the alignment cut off), on a file system that takes
    /// `O_DIRECT` and, where one is mounted, on tmpfs, which does not.
    #[test]
    fn direct_writes_keep_exact_bytes_or_say_they_did_not_write() {
        let bufs = Mutex::new(Vec::new());
        let disk = tempfile::tempdir().unwrap();
        let mut dirs = vec![disk.path().to_path_buf()];
        if Path::new("/dev/shm").is_dir() {
            dirs.push(Path::new("/dev/shm").to_path_buf());
        }
        for dir in &dirs {
            let probe = dir.join(format!("strata-direct-{}", std::process::id()));
            for len in [1usize, 4095, 4096, 4097, 262_144 + 100, 8 << 20] {
                let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
                match write_direct(&probe, &bytes, &bufs).unwrap() {
                    true => assert_eq!(std::fs::read(&probe).unwrap(), bytes, "{len} bytes"),
                    // Only a file system without O_DIRECT says so.
                    false => assert!(dir.starts_with("/dev/shm"), "{}", dir.display()),
                }
            }
            let _ = std::fs::remove_file(&probe);
        }
        assert!(bufs.lock().unwrap().len() <= 4);
    }

    /// A sparse file's extents name exactly the grains written into it.
    #[test]
    fn a_sparse_file_tells_which_grains_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("x.g"))
            .unwrap();
        assert!(held_pages(&f).is_empty());
        let slots = [0u32, 5, 6, 100, 2047];
        for &i in &slots {
            f.write_all_at(&[0xa5; GRAIN], SegmentInfo::grain_offset(i))
                .unwrap();
        }
        assert_eq!(held_pages(&f), slots);
    }
}
