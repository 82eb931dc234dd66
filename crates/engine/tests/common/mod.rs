//! Helpers shared by the engine's integration tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use strata_engine::{Datastore, InitOptions, OpenOptions};
use strata_storage::{Backend, FileBackend, SimBackend};

/// Metadata cache of the simulated tests: 64 pages, so eviction, reloading
/// and checkpoints happen all the time.
pub const SIM_CACHE_BYTES: u64 = 64 * 4096;

/// Open the datastore in a simulated backend with the small cache.
pub fn open_sim(b: &SimBackend) -> Datastore {
    Datastore::open(
        Arc::new(b.clone()) as Arc<dyn Backend>,
        &OpenOptions {
            cache_bytes: SIM_CACHE_BYTES,
            ..Default::default()
        },
        None,
    )
    .expect("open the simulated datastore")
}

/// A new datastore of `capacity_bytes` in a new simulated backend, open
/// with the small cache, and the backend (to crash it).
pub fn new_sim(capacity_bytes: u64) -> (SimBackend, Datastore) {
    let b = SimBackend::new();
    Datastore::init(
        Arc::new(b.clone()) as Arc<dyn Backend>,
        &InitOptions { capacity_bytes },
    )
    .expect("init the simulated datastore");
    let ds = open_sim(&b);
    (b, ds)
}

/// Open the datastore in directory `dir`, with the default options.
pub fn open_dir(dir: &Path) -> strata_engine::Result<Datastore> {
    Datastore::open(
        Arc::new(FileBackend::new(dir)),
        &OpenOptions::default(),
        None,
    )
}

/// A new datastore in directory `dir` (default options), open.
pub fn init_dir(dir: &Path) -> Datastore {
    Datastore::init(Arc::new(FileBackend::new(dir)), &InitOptions::default())
        .expect("init the datastore");
    open_dir(dir).expect("open the new datastore")
}

/// Every byte of `target` (a disk or DISK@SNAP), through `read_at`.
pub fn read_all(ds: &Datastore, target: &str) -> Vec<u8> {
    use strata_block::BlockDevice;
    let h = ds.open_disk(target).unwrap();
    let mut buf = vec![0u8; h.size_bytes() as usize];
    h.read_at(&mut buf, 0).unwrap();
    buf
}

/// A progress callback for a pass that cuts the power of `b` (with
/// `seed`) at its `cut_at`-th call: one call per region of the space
/// passes.
pub fn cut_at_call(b: &SimBackend, cut_at: u64, seed: u64) -> impl FnMut(u64, u64) {
    let b = b.clone();
    let mut calls = 0;
    move |_, _| {
        calls += 1;
        if calls == cut_at {
            b.crash(seed);
        }
    }
}
