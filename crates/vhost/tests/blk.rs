//! The vhost-user-blk backend driven by a test frontend (tests/common) over
//! a real socket and shared memfd guest memory, serving a disk of a real
//! datastore: reads, writes, flush, discard, write-zeroes, GET_ID, the
//! configuration space, several queues, indirect descriptors, reconnects,
//! read-only snapshots, and malformed chains that must get an error status
//! (or nothing) and never take the backend down.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use strata_block::BlockDevice;
use strata_engine::{Datastore, OpenOptions, Provisioning};
use strata_vhost::{Options, VhostBlkServer};

const DISK: u64 = 64 << 20;
const HDR: u64 = DATA_BASE;
const STATUS: u64 = DATA_BASE + 0x100;
const BUF: u64 = DATA_BASE + 0x10000;
const BUF2: u64 = DATA_BASE + 0x200000;

struct Setup {
    _dir: tempfile::TempDir,
    ds: Datastore,
    server: VhostBlkServer,
    sock: PathBuf,
}

fn setup(target: &str, opts: Options) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("ds");
    std::fs::create_dir(&store).unwrap();
    let backend = Arc::new(strata_storage::FileBackend::new(&store));
    Datastore::init(backend.clone(), &Default::default()).unwrap();
    // I/O threads are for direct I/O: test them with it.
    let open = OpenOptions {
        direct_io: opts.io_threads > 0 || opts.ring_io,
        ..OpenOptions::default()
    };
    let ds = Datastore::open(backend, &open, None).unwrap();
    ds.create_disk("d", DISK, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    let sock = dir.path().join("vhost.sock");
    let server = VhostBlkServer::new();
    let ds2 = ds.clone();
    let target = target.to_string();
    server
        .serve(
            &sock,
            Arc::new(move |_: &str| ds2.open_disk(&target).map(|h| h as Arc<dyn BlockDevice>)),
            opts,
        )
        .unwrap();
    Setup {
        _dir: dir,
        ds,
        server,
        sock,
    }
}

fn opts() -> Options {
    Options {
        serial: "strata-test-disk".into(),
        ..Options::default()
    }
}

/// As a server with `--cache none` runs: requests on I/O threads, the
/// pool with O_DIRECT.
fn threaded() -> Options {
    Options {
        io_threads: 4,
        ..opts()
    }
}

/// As a server with `--cache none --aio io_uring` runs (the default):
/// reads through a ring per queue, other requests on I/O threads.
fn ringed() -> Options {
    Options {
        ring_io: true,
        ..threaded()
    }
}

/// As a server with `--cache none --aio native` runs: a native AIO
/// context per queue instead.
fn native() -> Options {
    Options {
        native_aio: true,
        ..ringed()
    }
}

/// Whether this process has a native AIO context (its ring is mapped).
fn has_native_aio() -> bool {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .contains("[aio]")
}

/// Whether this process has an io_uring open.
fn has_io_uring() -> bool {
    std::fs::read_dir("/proc/self/fd").unwrap().any(|f| {
        std::fs::read_link(f.unwrap().path())
            .is_ok_and(|l| l.to_string_lossy() == "anon_inode:[io_uring]")
    })
}

/// A request with the header and status in descriptors of their own and
/// the data in `segs`; returns (status, used len).
fn request(
    g: &mut Guest,
    q: usize,
    ty: u32,
    sector: u64,
    segs: &[(u64, u32)],
    write_data: bool,
) -> (u8, u32) {
    g.write(HDR + q as u64 * 0x400, &header(ty, sector));
    g.write(STATUS + q as u64 * 0x400, &[0xff]);
    let mut chain = vec![(HDR + q as u64 * 0x400, 16, 0)];
    for &(a, l) in segs {
        chain.push((a, l, if write_data { 0 } else { F_WRITE }));
    }
    chain.push((STATUS + q as u64 * 0x400, 1, F_WRITE));
    let head = g.submit(q, &chain);
    let (id, len) = g.wait_used(q);
    assert_eq!(id, head);
    (g.read(STATUS + q as u64 * 0x400, 1)[0], len)
}

fn engine_read(ds: &Datastore, off: u64, len: usize) -> Vec<u8> {
    let h = ds.open_disk("d").unwrap();
    let mut v = vec![0u8; len];
    h.read_at(&mut v, off).unwrap();
    v
}

#[test]
fn reads_writes_flush_discard_and_zeroes_reach_the_engine() {
    reads_writes_flush_discard_and_zeroes_reach_the_engine_with(opts());
}

#[test]
fn reads_writes_flush_discard_and_zeroes_reach_the_engine_on_io_threads() {
    reads_writes_flush_discard_and_zeroes_reach_the_engine_with(threaded());
}

#[test]
fn reads_writes_flush_discard_and_zeroes_reach_the_engine_through_io_uring() {
    reads_writes_flush_discard_and_zeroes_reach_the_engine_with(ringed());
}

#[test]
fn reads_writes_flush_discard_and_zeroes_reach_the_engine_through_native_aio() {
    reads_writes_flush_discard_and_zeroes_reach_the_engine_with(native());
}

fn reads_writes_flush_discard_and_zeroes_reach_the_engine_with(o: Options) {
    let s = setup("d", o);
    let mut g = Guest::connect(&s.sock, 1, 0);
    // Configuration space: capacity, block size, queues, topology.
    let cfg = g.config();
    assert_eq!(
        u64::from_le_bytes(cfg[0..8].try_into().unwrap()),
        DISK / 512
    );
    assert_eq!(u32::from_le_bytes(cfg[20..24].try_into().unwrap()), 512);
    assert_eq!(cfg[24], 3, "physical block = 4 KiB grain");
    assert_eq!(u16::from_le_bytes(cfg[34..36].try_into().unwrap()), 4);
    assert_eq!(cfg[32], 1, "write-back cache");
    assert!(g.features & (1 << 5) == 0, "not read-only");

    // A 64 KiB write split over three uneven segments.
    let off = 3 << 20;
    let data = pattern(off, 65536, 1);
    g.write(BUF, &data[..4096]);
    g.write(BUF2, &data[4096..61440]);
    g.write(BUF + 0x100000, &data[61440..]);
    let segs = [(BUF, 4096), (BUF2, 57344), (BUF + 0x100000, 4096)];
    assert_eq!(request(&mut g, 0, T_OUT, off / 512, &segs, true), (0, 1));
    assert_eq!(
        engine_read(&s.ds, off, 65536),
        data,
        "the engine sees the guest's write"
    );

    // Read it back into other buffers, split differently.
    let out = BUF + 0x300000;
    g.write(out, &[0xaa; 65536]);
    let segs = [(out, 512), (out + 512, 65024)];
    assert_eq!(
        request(&mut g, 0, T_IN, off / 512, &segs, false),
        (0, 65537)
    );
    assert_eq!(g.read(out, 65536), data);

    // What the engine writes (NBD's path) the guest reads.
    let h = s.ds.open_disk("d").unwrap();
    let other = pattern(8 << 20, 8192, 9);
    h.write_at(&other, 8 << 20, false).unwrap();
    assert_eq!(
        request(&mut g, 0, T_IN, (8 << 20) / 512, &[(out, 8192)], false).0,
        0
    );
    assert_eq!(g.read(out, 8192), other);

    assert_eq!(request(&mut g, 0, T_FLUSH, 0, &[], true), (0, 1));

    // The guest turns its write cache off (CONFIG_WCE) and on again.
    use vhost::vhost_user::message::VhostUserConfigFlags;
    use vhost::vhost_user::VhostUserFrontend;
    g.fe.set_config(32, VhostUserConfigFlags::WRITABLE, &[0])
        .unwrap();
    assert_eq!(g.config()[32], 0, "write-through");
    g.write(BUF, &data[..4096]);
    assert_eq!(
        request(&mut g, 0, T_OUT, off / 512, &[(BUF, 4096)], true).0,
        0
    );
    g.fe.set_config(32, VhostUserConfigFlags::WRITABLE, &[1])
        .unwrap();
    assert_eq!(g.config()[32], 1, "write-back again");
    // Other fields are not writable.
    assert!(g
        .fe
        .set_config(0, VhostUserConfigFlags::WRITABLE, &[0; 8])
        .is_err());

    // GET_ID: the serial, NUL-padded to 20 bytes.
    g.write(out, &[0xff; 20]);
    assert_eq!(
        request(&mut g, 0, T_GET_ID, 0, &[(out, 20)], false),
        (0, 21)
    );
    assert_eq!(&g.read(out, 20)[..16], b"strata-test-disk");
    assert_eq!(&g.read(out, 20)[16..], &[0; 4]);

    // Discard the first 32 KiB of the write, write-zeroes (unmap) the rest.
    g.write(BUF, &range(off / 512, 64, 0));
    assert_eq!(request(&mut g, 0, T_DISCARD, 0, &[(BUF, 16)], true).0, 0);
    g.write(BUF, &range(off / 512 + 64, 64, 1));
    assert_eq!(
        request(&mut g, 0, T_WRITE_ZEROES, 0, &[(BUF, 16)], true).0,
        0
    );
    assert_eq!(engine_read(&s.ds, off, 65536), vec![0; 65536]);

    // Past the end, misaligned, unknown type, discard with the unmap flag.
    assert_eq!(
        request(&mut g, 0, T_IN, DISK / 512, &[(out, 512)], false).0,
        1
    );
    assert_eq!(
        request(&mut g, 0, T_IN, DISK / 512 - 1, &[(out, 1024)], false).0,
        1
    );
    assert_eq!(request(&mut g, 0, T_OUT, 0, &[(BUF, 100)], true).0, 1);
    assert_eq!(request(&mut g, 0, 99, 0, &[], true).0, 2);
    g.write(BUF, &range(0, 8, 1));
    assert_eq!(request(&mut g, 0, T_DISCARD, 0, &[(BUF, 16)], true).0, 2);
    g.write(BUF, &range(DISK / 512 - 4, 8, 0));
    assert_eq!(request(&mut g, 0, T_DISCARD, 0, &[(BUF, 16)], true).0, 1);
    drop(g);
    s.server.shutdown();
    assert!(!s.sock.exists(), "the socket file goes at shutdown");
}

#[test]
fn header_data_and_status_may_share_descriptors_and_indirect_tables_work() {
    let s = setup("d", opts());
    let mut g = Guest::connect(&s.sock, 1, 0);
    let data = pattern(0, 4096, 3);
    // Header and data in one readable descriptor.
    let mut hd = header(T_OUT, 16).to_vec();
    hd.extend_from_slice(&data);
    g.write(BUF, &hd);
    g.write(STATUS, &[0xff]);
    let head = g.submit(0, &[(BUF, hd.len() as u32, 0), (STATUS, 1, F_WRITE)]);
    assert_eq!(g.wait_used(0), (head, 1));
    assert_eq!(g.read(STATUS, 1)[0], 0);
    assert_eq!(engine_read(&s.ds, 16 * 512, 4096), data);

    // Read with data and status in one writable descriptor, through an
    // indirect table.
    g.write(HDR, &header(T_IN, 16));
    let table = BUF2;
    let mut t = Vec::new();
    for (i, (addr, len, flags)) in [(HDR, 16u32, 0u16), (BUF + 0x8000, 4097, F_WRITE)]
        .iter()
        .enumerate()
    {
        let mut d = [0u8; 16];
        d[0..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        let f = if i == 0 { flags | F_NEXT } else { *flags };
        d[12..14].copy_from_slice(&f.to_le_bytes());
        d[14..16].copy_from_slice(&(i as u16 + 1).to_le_bytes());
        t.extend_from_slice(&d);
    }
    g.write(table, &t);
    g.write(BUF + 0x8000 + 4096, &[0xff]);
    let head = g.submit(0, &[(table, 32, F_INDIRECT)]);
    assert_eq!(g.wait_used(0), (head, 4097));
    assert_eq!(g.read(BUF + 0x8000, 4096), data);
    assert_eq!(g.read(BUF + 0x8000 + 4096, 1)[0], 0);
}

#[test]
fn malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on() {
    malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on_with(opts());
}

#[test]
fn malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on_on_io_threads() {
    malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on_with(threaded());
}

#[test]
fn malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on_through_io_uring() {
    malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on_with(ringed());
}

#[test]
fn malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on_through_native_aio() {
    malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on_with(native());
}

fn malformed_chains_get_an_error_status_or_nothing_and_serving_goes_on_with(o: Options) {
    let s = setup("d", o);
    let mut g = Guest::connect(&s.sock, 1, 0);
    let bad = MEM_BYTES as u64 + 0x1000; // outside guest memory
                                         // Header shorter than 16 bytes.
    g.write(STATUS, &[0xff]);
    let head = g.submit(0, &[(HDR, 8, 0), (STATUS, 1, F_WRITE)]);
    assert_eq!(g.wait_used(0), (head, 1));
    assert_eq!(g.read(STATUS, 1)[0], 1);
    // A readable descriptor after a writable one.
    g.write(HDR, &header(T_IN, 0));
    g.write(STATUS, &[0xff]);
    let head = g.submit(
        0,
        &[
            (HDR, 16, 0),
            (BUF, 512, F_WRITE),
            (BUF2, 512, 0),
            (STATUS, 1, F_WRITE),
        ],
    );
    assert_eq!(g.wait_used(0).0, head);
    assert_eq!(g.read(STATUS, 1)[0], 1);
    // Data outside guest memory.
    g.write(STATUS, &[0xff]);
    let head = g.submit(
        0,
        &[(HDR, 16, 0), (bad, 4096, F_WRITE), (STATUS, 1, F_WRITE)],
    );
    assert_eq!(g.wait_used(0).0, head);
    assert_eq!(g.read(STATUS, 1)[0], 1);
    // A read whose two buffers overlap.
    g.write(STATUS, &[0xff]);
    let head = g.submit(
        0,
        &[
            (HDR, 16, 0),
            (BUF, 4096, F_WRITE),
            (BUF + 2048, 4096, F_WRITE),
            (STATUS, 1, F_WRITE),
        ],
    );
    assert_eq!(g.wait_used(0).0, head);
    assert_eq!(g.read(STATUS, 1)[0], 1);
    // No writable byte at all, and a status byte outside memory: returned
    // with length 0.
    let head = g.submit(0, &[(HDR, 16, 0)]);
    assert_eq!(g.wait_used(0), (head, 0));
    let head = g.submit(0, &[(HDR, 16, 0), (bad, 1, F_WRITE)]);
    assert_eq!(g.wait_used(0), (head, 0));
    // A descriptor loop (next points back at itself) and a `next` out of
    // the table.
    g.submit_raw(
        0,
        40,
        &[(HDR, 16, F_NEXT, 41), (STATUS, 1, F_WRITE | F_NEXT, 41)],
        40,
    );
    let (id, _) = g.wait_used(0);
    assert_eq!(id, 40);
    g.submit_raw(0, 50, &[(HDR, 16, F_NEXT, 999)], 50);
    assert_eq!(g.wait_used(0).0, 50);
    // An indirect table outside memory, and one of odd length.
    let head = g.submit(0, &[(bad, 32, F_INDIRECT)]);
    assert_eq!(g.wait_used(0).0, head);
    let head = g.submit(0, &[(BUF, 17, F_INDIRECT)]);
    assert_eq!(g.wait_used(0).0, head);
    // Still serving.
    let data = pattern(0, 4096, 5);
    g.write(BUF, &data);
    assert_eq!(request(&mut g, 0, T_OUT, 0, &[(BUF, 4096)], true).0, 0);
    assert_eq!(engine_read(&s.ds, 0, 4096), data);
}

#[test]
fn queues_work_side_by_side_and_a_new_frontend_sees_the_data() {
    queues_work_side_by_side_and_a_new_frontend_sees_the_data_with(opts());
}

#[test]
fn queues_work_side_by_side_and_a_new_frontend_sees_the_data_on_io_threads() {
    queues_work_side_by_side_and_a_new_frontend_sees_the_data_with(threaded());
}

#[test]
fn queues_work_side_by_side_and_a_new_frontend_sees_the_data_through_io_uring() {
    queues_work_side_by_side_and_a_new_frontend_sees_the_data_with(ringed());
}

#[test]
fn queues_work_side_by_side_and_a_new_frontend_sees_the_data_without_polling() {
    queues_work_side_by_side_and_a_new_frontend_sees_the_data_with(Options {
        poll: std::time::Duration::ZERO,
        ..ringed()
    });
}

fn queues_work_side_by_side_and_a_new_frontend_sees_the_data_with(o: Options) {
    let s = setup("d", o);
    let mut g = Guest::connect(&s.sock, 2, 0);
    // Requests queued on both queues before waiting for any.
    for q in 0..2usize {
        let data = pattern(q as u64, 4096, q as u8);
        let b = BUF + q as u64 * 0x10000;
        g.write(b, &data);
        let h = HDR + q as u64 * 0x400;
        g.write(h, &header(T_OUT, q as u64 * 8));
        g.submit(
            q,
            &[
                (h, 16, 0),
                (b, 4096, 0),
                (STATUS + q as u64 * 0x400, 1, F_WRITE),
            ],
        );
    }
    for q in 0..2usize {
        g.wait_used(q);
        assert_eq!(g.read(STATUS + q as u64 * 0x400, 1)[0], 0);
    }
    assert_eq!(request(&mut g, 0, T_FLUSH, 0, &[], true).0, 0);
    // Reads queued on both queues before waiting for any: each comes
    // back on its own queue with the other queue's data.
    for q in 0..2usize {
        let b = BUF2 + q as u64 * 0x10000;
        let h = HDR + q as u64 * 0x400;
        g.write(h, &header(T_IN, (1 - q) as u64 * 8));
        g.submit(
            q,
            &[
                (h, 16, 0),
                (b, 4096, F_WRITE),
                (STATUS + q as u64 * 0x400, 1, F_WRITE),
            ],
        );
    }
    for q in 0..2usize {
        assert_eq!(g.wait_used(q).1, 4097);
        assert_eq!(g.read(STATUS + q as u64 * 0x400, 1)[0], 0);
        let other = 1 - q as u64;
        let b = BUF2 + q as u64 * 0x10000;
        assert_eq!(g.read(b, 4096), pattern(other, 4096, other as u8));
    }
    assert_eq!(g.pending_used(0) + g.pending_used(1), 0);
    drop(g);
    // The socket takes the next frontend (QEMU's reconnect).
    let mut g = Guest::connect(&s.sock, 1, FEATURE_EVENT_IDX);
    for q in 0..2u64 {
        assert_eq!(request(&mut g, 0, T_IN, q * 8, &[(BUF2, 4096)], false).0, 0);
        assert_eq!(g.read(BUF2, 4096), pattern(q, 4096, q as u8));
    }
}

#[test]
fn many_requests_in_flight_complete_once_each() {
    many_requests_in_flight_complete_once_each_with(opts());
}

#[test]
fn many_requests_in_flight_complete_once_each_on_io_threads() {
    many_requests_in_flight_complete_once_each_with(threaded());
}

#[test]
fn many_requests_in_flight_complete_once_each_through_io_uring() {
    many_requests_in_flight_complete_once_each_with(ringed());
}

#[test]
fn many_requests_in_flight_complete_once_each_through_io_uring_without_polling() {
    many_requests_in_flight_complete_once_each_with(Options {
        poll: std::time::Duration::ZERO,
        ..ringed()
    });
}

#[test]
fn many_requests_in_flight_complete_once_each_through_native_aio() {
    many_requests_in_flight_complete_once_each_with(native());
}

/// Queue request `i` of a batch on queue 0: a header of type `ty` for
/// `sector` at HDR + 16 i, 4 KiB of data at BUF + 4096 i (`data` put
/// there first; the device writes it for `T_IN`), a status byte at
/// STATUS + i (0xff until answered). Its head.
fn queue_one(g: &mut Guest, i: u64, ty: u32, sector: u64, data: &[u8]) -> u16 {
    let h = HDR + i * 16;
    g.write(h, &header(ty, sector));
    g.write(BUF + i * 4096, data);
    g.write(STATUS + i, &[0xff]);
    let data_flags = if ty == T_IN { F_WRITE } else { 0 };
    g.submit(
        0,
        &[
            (h, 16, 0),
            (BUF + i * 4096, 4096, data_flags),
            (STATUS + i, 1, F_WRITE),
        ],
    )
}

/// Wait until each of `heads` is returned on queue 0, once each, with
/// used length `len`.
fn each_used_once(g: &mut Guest, mut heads: Vec<u16>, len: u32) {
    let mut seen = Vec::new();
    for _ in 0..heads.len() {
        let (head, used) = g.wait_used(0);
        assert_eq!(used, len, "used length of request {head}");
        seen.push(head);
    }
    seen.sort_unstable();
    heads.sort_unstable();
    assert_eq!(seen, heads);
}

fn many_requests_in_flight_complete_once_each_with(o: Options) {
    let s = setup("d", o.clone());
    let mut g = Guest::connect(&s.sock, 1, 0);
    // 16 writes queued at once (3 descriptors each), twice: the first
    // round fills the disk, the second overwrites it in place (through
    // the ring, with one); then 16 reads.
    for seed in [7, 9] {
        let heads: Vec<u16> = (0..16u64)
            .map(|i| queue_one(&mut g, i, T_OUT, i * 8, &pattern(i * 4096, 4096, seed)))
            .collect();
        // A write's used length is its status byte.
        each_used_once(&mut g, heads, 1);
        assert_eq!(g.pending_used(0), 0);
        for i in 0..16u64 {
            assert_eq!(g.read(STATUS + i, 1)[0], 0, "write {i}");
        }
        assert_eq!(engine_read(&s.ds, 0, 65536), pattern(0, 65536, seed));
    }
    // 16 reads queued at once, every other one of a hole, each into its
    // own page-aligned buffer (what the ring takes).
    let heads: Vec<u16> = (0..16u64)
        .map(|i| queue_one(&mut g, i, T_IN, i * 16, &[0xee; 4096]))
        .collect();
    // Data and status.
    each_used_once(&mut g, heads, 4097);
    for i in 0..16u64 {
        assert_eq!(g.read(STATUS + i, 1)[0], 0, "read {i}");
        let want = if i < 8 {
            pattern(i * 8192, 4096, 9)
        } else {
            vec![0; 4096]
        };
        assert_eq!(g.read(BUF + i * 4096, 4096), want, "read {i}");
    }
    if o.ring_io {
        // (Tests run side by side, so another test's server could answer
        // this; each test through io_uring checks it.)
        if o.native_aio {
            assert!(has_native_aio(), "the queues have native AIO contexts");
        } else {
            assert!(has_io_uring(), "the queues have rings");
        }
    }
}

#[test]
fn a_stream_of_large_writes_in_flight_lands_whole_through_io_uring() {
    a_stream_of_large_writes_in_flight_lands_whole_with(ringed());
}

#[test]
fn a_stream_of_large_writes_in_flight_lands_whole_through_io_uring_without_polling() {
    a_stream_of_large_writes_in_flight_lands_whole_with(Options {
        poll: std::time::Duration::ZERO,
        ..ringed()
    });
}

#[test]
fn a_stream_of_large_writes_in_flight_lands_whole_through_native_aio() {
    a_stream_of_large_writes_in_flight_lands_whole_with(native());
}

#[test]
fn a_stream_of_large_writes_in_flight_lands_whole_on_io_threads() {
    a_stream_of_large_writes_in_flight_lands_whole_with(threaded());
}

/// A guest streaming large sequential writes the way `vhost_bench` and
/// fio do: 16 slots in flight, each sent again as soon as it comes back,
/// so the backend sees them one or a few at a time. Through a ring, the
/// second pass overwrites in place: its writes are the ones a queue
/// leaves unsubmitted until the end of their batch (blk.rs,
/// `DEFER_WRITE_BYTES`), and every eighth request is a read of a region
/// the stream does not touch, which must not wait behind them. Each
/// request comes back once, with success, and the disk holds the second
/// pass's data.
fn a_stream_of_large_writes_in_flight_lands_whole_with(o: Options) {
    const SLOTS: u16 = 16;
    const BS: u64 = 128 << 10;
    // Blocks the stream writes; the first pass also writes the next 8,
    // which the second pass reads.
    const N: u64 = 64;
    let s = setup("d", o);
    let mut g = Guest::connect(&s.sock, 1, 0);
    let hdr = |slot: u16| HDR + u64::from(slot) * 32;
    let status = |slot: u16| HDR + u64::from(slot) * 32 + 16;
    let buf = |slot: u16| BUF + u64::from(slot) * BS;
    for seed in [1u8, 2] {
        let blocks = if seed == 1 { N + 8 } else { N };
        // Per slot: the block it is reading (Some) or writing (None).
        let mut reading: Vec<Option<u64>> = vec![None; SLOTS as usize];
        let mut issued = 0u64;
        let mut next = 0u64;
        let mut in_flight = 0;
        let mut send = |g: &mut Guest, slot: u16, reading: &mut Vec<Option<u64>>| -> bool {
            let read = seed == 2 && issued % 8 == 7;
            if !read && next == blocks {
                return false;
            }
            issued += 1;
            let (ty, block) = if read {
                (T_IN, N + issued / 8 % 8)
            } else {
                next += 1;
                g.write(buf(slot), &pattern((next - 1) * BS, BS as usize, seed));
                (T_OUT, next - 1)
            };
            reading[slot as usize] = read.then_some(block);
            g.write(hdr(slot), &header(ty, block * BS / 512));
            g.write(status(slot), &[0xff]);
            let at = slot * 3;
            let data_flags = if read { F_WRITE } else { 0 };
            g.submit_raw(
                0,
                at,
                &[
                    (hdr(slot), 16, F_NEXT, at + 1),
                    (buf(slot), BS as u32, data_flags | F_NEXT, at + 2),
                    (status(slot), 1, F_WRITE, 0),
                ],
                at,
            );
            true
        };
        for slot in 0..SLOTS {
            if send(&mut g, slot, &mut reading) {
                in_flight += 1;
            }
        }
        while in_flight > 0 {
            let (head, _) = g.wait_used(0);
            assert_eq!(head % 3, 0, "head {head} is no slot's");
            let slot = head / 3;
            assert_eq!(g.read(status(slot), 1)[0], 0, "pass {seed}, slot {slot}");
            if let Some(block) = reading[slot as usize] {
                assert!(
                    g.read(buf(slot), BS as usize) == pattern(block * BS, BS as usize, 1),
                    "pass {seed}: the read of block {block} returned other data"
                );
            }
            in_flight -= 1;
            if send(&mut g, slot, &mut reading) {
                in_flight += 1;
            }
        }
        assert_eq!(
            g.pending_used(0),
            0,
            "pass {seed}: a request came back twice"
        );
        assert!(
            engine_read(&s.ds, 0, (N * BS) as usize) == pattern(0, (N * BS) as usize, seed),
            "pass {seed}: the disk does not hold the stream's data"
        );
    }
}

#[test]
fn a_snapshot_is_served_read_only() {
    let s0 = setup("d", opts());
    let h = s0.ds.open_disk("d").unwrap();
    h.write_at(&pattern(0, 4096, 2), 0, false).unwrap();
    s0.ds.snapshot_create("d", "s1", "").unwrap();
    h.write_at(&pattern(0, 4096, 3), 0, false).unwrap();
    let sock2 = s0.sock.with_file_name("snap.sock");
    let ds2 = s0.ds.clone();
    s0.server
        .serve(
            &sock2,
            Arc::new(move |_: &str| ds2.open_disk("d@s1").map(|h| h as Arc<dyn BlockDevice>)),
            opts(),
        )
        .unwrap();
    let mut g = Guest::connect(Path::new(&sock2), 1, 0);
    assert!(g.features & (1 << 5) != 0, "RO offered");
    assert!(
        g.features & (1 << 13) == 0,
        "no DISCARD on a read-only device"
    );
    assert_eq!(request(&mut g, 0, T_IN, 0, &[(BUF, 4096)], false).0, 0);
    assert_eq!(g.read(BUF, 4096), pattern(0, 4096, 2));
    g.write(BUF, &[0; 4096]);
    assert_eq!(request(&mut g, 0, T_OUT, 0, &[(BUF, 4096)], true).0, 1);
    assert_eq!(engine_read(&s0.ds, 0, 4096), pattern(0, 4096, 3));
}

#[test]
fn an_extend_is_announced_and_the_new_capacity_served() {
    let s = setup("d", opts());
    let mut g = Guest::connect(&s.sock, 1, 0);
    assert!(g
        .protocol
        .contains(vhost::vhost_user::message::VhostUserProtocolFeatures::BACKEND_REQ));
    assert_eq!(g.capacity_sectors(), DISK / 512);
    // Past the old end: refused.
    assert_eq!(
        request(&mut g, 0, T_IN, DISK / 512, &[(BUF, 4096)], false).0,
        1
    );
    assert!(
        g.backend_message(std::time::Duration::from_millis(600))
            .is_none(),
        "nothing to announce before the extend"
    );
    s.ds.extend_disk("d", 2 * DISK).unwrap();
    let m = g.backend_message(std::time::Duration::from_secs(5));
    assert_eq!(m, Some((2, 0)), "CONFIG_CHANGE_MSG with no payload");
    assert_eq!(g.capacity_sectors(), 2 * DISK / 512);
    let data = pattern(DISK, 4096, 4);
    g.write(BUF, &data);
    assert_eq!(
        request(&mut g, 0, T_OUT, DISK / 512, &[(BUF, 4096)], true).0,
        0
    );
    assert_eq!(engine_read(&s.ds, DISK, 4096), data);
}
