//! The in-memory simulator: [`SimBackend`] keeps for every object a
//! durable image and the writes issued since the last sync, and
//! [`SimBackend::crash`] loses, keeps or tears each of them as a power
//! cut would. Also space limits and injected read and write failures.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{Backend, Storage, SECTOR_BYTES};

#[derive(Clone)]
enum Pending {
    Write(u64, Vec<u8>),
    SetLen(u64),
}

/// One file as a disk that can lose power holds it: what reads see now
/// (`live`), what the last [`SimFile::sync`] made durable (`durable`), and
/// the writes and truncations since, in issue order. The simulator's
/// objects are these, and so are the files of tests that cut a real
/// server's power (the cli crate's crashfs).
#[derive(Default, Clone)]
pub struct SimFile {
    pub live: Vec<u8>,
    pub durable: Vec<u8>,
    pending: Vec<Pending>,
}

impl SimFile {
    /// Write `data` at `offset` (growing the file as needed); durable at
    /// the next sync.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        apply(&mut self.live, offset, data);
        self.pending.push(Pending::Write(offset, data.to_vec()));
    }

    /// Truncate or extend (with zeros) to `len` bytes; durable at the
    /// next sync.
    pub fn set_len(&mut self, len: u64) {
        self.live.resize(len as usize, 0);
        self.pending.push(Pending::SetLen(len));
    }

    /// Make every change so far durable.
    pub fn sync(&mut self) {
        for p in std::mem::take(&mut self.pending) {
            match p {
                Pending::Write(offset, data) => apply(&mut self.durable, offset, &data),
                Pending::SetLen(len) => self.durable.resize(len as usize, 0),
            }
        }
    }

    /// Changes not yet durable.
    pub fn unsynced(&self) -> usize {
        self.pending.len()
    }

    /// A power cut: each unsynced write is kept, dropped or torn (a random
    /// subset of its sectors survives), each truncation kept or dropped,
    /// decided by `rng` and counted in `report`; reads then see what
    /// survived.
    pub fn lose_power(&mut self, rng: &mut impl Rng, report: &mut CrashReport) {
        for p in std::mem::take(&mut self.pending) {
            let (offset, data) = match p {
                Pending::SetLen(len) => {
                    // A truncation either reached the disk or did not.
                    if rng.gen_bool(0.5) {
                        report.kept += 1;
                        self.durable.resize(len as usize, 0);
                    } else {
                        report.dropped += 1;
                    }
                    continue;
                }
                Pending::Write(offset, data) => (offset, data),
            };
            match rng.gen_range(0..3) {
                0 => {
                    report.dropped += 1;
                }
                1 => {
                    report.kept += 1;
                    apply(&mut self.durable, offset, &data);
                }
                _ => {
                    report.torn += 1;
                    // Tear at sector granularity, relative to absolute sectors.
                    let mut pos = 0usize;
                    while pos < data.len() {
                        let abs = offset as usize + pos;
                        let next = ((abs / SECTOR_BYTES) + 1) * SECTOR_BYTES;
                        let end = (next - offset as usize).min(data.len());
                        if rng.gen_bool(0.5) {
                            apply(&mut self.durable, abs as u64, &data[pos..end]);
                        }
                        pos = end;
                    }
                }
            }
        }
        self.live = self.durable.clone();
    }
}

#[derive(Default, Clone)]
struct SimObject {
    file: SimFile,
    /// End of space held past the length (`allocate` with `keep_size`).
    held_end: u64,
}

impl SimObject {
    /// Bytes the object takes from the simulated space: the simulator has
    /// no holes, so its whole length, or what is held past it.
    fn footprint(&self) -> u64 {
        (self.file.live.len() as u64).max(self.held_end)
    }
}

struct SimState {
    objects: HashMap<String, SimObject>,
    /// Bumped by every crash; handles of an older epoch fail.
    epoch: u64,
    /// Fail every write once this many more have been issued (fault injection).
    fail_writes_after: Option<u64>,
    /// Fail reads (of one object, or of all when the name is None) once this
    /// many more have been issued (fault injection; cleared by a crash).
    fail_reads: Option<(Option<String>, u64)>,
    /// Total bytes all objects may take (None: unlimited).
    space_limit: Option<u64>,
}

impl SimState {
    fn used(&self) -> u64 {
        self.objects.values().map(|o| o.footprint()).sum()
    }

    /// ENOSPC when growing `name`'s footprint to `end` would pass the limit.
    fn room(&self, name: &str, end: u64) -> io::Result<()> {
        let Some(limit) = self.space_limit else {
            return Ok(());
        };
        let now = self.objects.get(name).map(|o| o.footprint()).unwrap_or(0);
        if end > now && self.used() + (end - now) > limit {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }
}

/// An in-memory backend that can simulate a power cut. Cheap to clone (shared).
#[derive(Clone)]
pub struct SimBackend {
    state: Arc<Mutex<SimState>>,
}

impl Default for SimBackend {
    fn default() -> Self {
        Self::new()
    }
}

/// What a crash did, for test failure messages.
#[derive(Debug, Default, Clone, Copy)]
pub struct CrashReport {
    pub kept: usize,
    pub dropped: usize,
    pub torn: usize,
}

impl SimBackend {
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(SimState {
                objects: HashMap::new(),
                epoch: 0,
                fail_writes_after: None,
                fail_reads: None,
                space_limit: None,
            })),
        }
    }

    /// Limit the space all objects may take together (None: unlimited):
    /// writes, extensions and allocations past it fail with ENOSPC, as on a
    /// full file system. The simulator has no holes: an object takes its
    /// whole length (punching writes zeros), plus what `allocate` holds
    /// past it.
    pub fn limit_space(&self, bytes: Option<u64>) {
        self.state.lock().space_limit = bytes;
    }

    /// Simulate a power cut: each unsynced write is kept, dropped or torn
    /// (a random subset of its sectors survives), decided by `seed`. Handles
    /// opened before the crash fail every later call with an I/O error.
    pub fn crash(&self, seed: u64) -> CrashReport {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut st = self.state.lock();
        st.epoch += 1;
        st.fail_writes_after = None;
        st.fail_reads = None;
        let mut report = CrashReport::default();
        let mut names: Vec<String> = st.objects.keys().cloned().collect();
        names.sort();
        for name in names {
            let obj = st.objects.get_mut(&name).expect("listed");
            obj.file.lose_power(&mut rng, &mut report);
        }
        report
    }

    /// After `n` more writes, every write fails with an I/O error (until the next crash).
    pub fn fail_writes_after(&self, n: u64) {
        self.state.lock().fail_writes_after = Some(n);
    }

    /// After `n` more reads of `object` (of any object when None), every such
    /// read fails with an I/O error, until [`SimBackend::heal_reads`] or the
    /// next crash: a disk that returns EIO.
    pub fn fail_reads_after(&self, object: Option<&str>, n: u64) {
        self.state.lock().fail_reads = Some((object.map(str::to_string), n));
    }

    /// Reads work again.
    pub fn heal_reads(&self) {
        self.state.lock().fail_reads = None;
    }

    /// Total bytes held durably, for tests of space use.
    pub fn durable_len(&self, name: &str) -> u64 {
        self.state
            .lock()
            .objects
            .get(name)
            .map(|o| o.file.durable.len() as u64)
            .unwrap_or(0)
    }
}

fn apply(target: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let end = offset as usize + data.len();
    if target.len() < end {
        target.resize(end, 0);
    }
    target[offset as usize..end].copy_from_slice(data);
}

impl Backend for SimBackend {
    fn open(&self, name: &str, create: bool) -> io::Result<Arc<dyn Storage>> {
        let mut st = self.state.lock();
        if !st.objects.contains_key(name) {
            if !create {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("sim:{name}: not found"),
                ));
            }
            st.objects.insert(name.to_string(), SimObject::default());
        }
        Ok(Arc::new(SimStorage {
            backend: self.clone(),
            name: name.to_string(),
            epoch: st.epoch,
        }))
    }

    fn exists(&self, name: &str) -> bool {
        self.state.lock().objects.contains_key(name)
    }

    fn remove(&self, name: &str) -> io::Result<()> {
        self.state.lock().objects.remove(name);
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        let mut st = self.state.lock();
        let obj = st.objects.remove(from).ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("sim:{from}: not found"))
        })?;
        st.objects.insert(to.to_string(), obj);
        Ok(())
    }

    fn describe(&self) -> String {
        "sim".into()
    }

    fn free_bytes(&self) -> Option<u64> {
        let st = self.state.lock();
        st.space_limit.map(|l| l.saturating_sub(st.used()))
    }
}

struct SimStorage {
    backend: SimBackend,
    name: String,
    epoch: u64,
}

impl SimStorage {
    fn with<T>(&self, f: impl FnOnce(&mut SimState) -> io::Result<T>) -> io::Result<T> {
        let mut st = self.backend.state.lock();
        if st.epoch != self.epoch {
            return Err(io::Error::other(format!(
                "sim:{}: storage lost in a simulated crash",
                self.name
            )));
        }
        f(&mut st)
    }
}

impl Storage for SimStorage {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(|st| {
            if let Some((name, n)) = st.fail_reads.as_mut() {
                if name.as_deref().is_none_or(|x| x == self.name) {
                    if *n == 0 {
                        return Err(io::Error::other(format!(
                            "sim:{}: injected read failure at {offset}",
                            self.name
                        )));
                    }
                    *n -= 1;
                }
            }
            let obj = st
                .objects
                .get(&self.name)
                .ok_or_else(|| io::Error::other("removed"))?;
            let live = &obj.file.live;
            let start = (offset as usize).min(live.len());
            let end = (offset as usize + buf.len()).min(live.len());
            let n = end - start;
            buf[..n].copy_from_slice(&live[start..end]);
            buf[n..].fill(0);
            Ok(())
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.with(|st| {
            if let Some(n) = st.fail_writes_after.as_mut() {
                if *n == 0 {
                    return Err(io::Error::other("sim: injected write failure"));
                }
                *n -= 1;
            }
            st.room(&self.name, offset + buf.len() as u64)?;
            let obj = st
                .objects
                .get_mut(&self.name)
                .ok_or_else(|| io::Error::other("removed"))?;
            obj.file.write(offset, buf);
            Ok(())
        })
    }

    fn sync(&self) -> io::Result<()> {
        self.with(|st| {
            let obj = st
                .objects
                .get_mut(&self.name)
                .ok_or_else(|| io::Error::other("removed"))?;
            obj.file.sync();
            Ok(())
        })
    }

    fn len(&self) -> io::Result<u64> {
        self.with(|st| {
            let obj = st
                .objects
                .get(&self.name)
                .ok_or_else(|| io::Error::other("removed"))?;
            Ok(obj.file.live.len() as u64)
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with(|st| {
            st.room(&self.name, len)?;
            let obj = st
                .objects
                .get_mut(&self.name)
                .ok_or_else(|| io::Error::other("removed"))?;
            obj.file.set_len(len);
            Ok(())
        })
    }

    fn allocate(&self, offset: u64, len: u64, keep_size: bool) -> io::Result<()> {
        if !keep_size {
            if offset + len > self.len()? {
                self.set_len(offset + len)?;
            }
            return Ok(());
        }
        self.with(|st| {
            st.room(&self.name, offset + len)?;
            let obj = st
                .objects
                .get_mut(&self.name)
                .ok_or_else(|| io::Error::other("removed"))?;
            obj.held_end = obj.held_end.max(offset + len);
            Ok(())
        })
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = {
            let l = self.len()?;
            (offset + len).min(l)
        };
        if end <= offset {
            return Ok(());
        }
        self.write_at(&vec![0u8; (end - offset) as usize], offset)
    }
}
