//! One client session fed to the real server, for the fuzz target
//! `nbd_session` (fuzz/) and for the replay of its corpus in the normal
//! test suite (`tests/fuzz_corpus.rs`). Not part of the server's API.
//!
//! The bytes are what a client sends: the client flags, options, then
//! requests and write payloads. They go into one end of a socket pair
//! whose other end [`NbdServer::serve_connection`] serves, exactly as an
//! accepted connection, against three in-memory exports (`a`: 1 MiB,
//! read-write; `b`: 64 KiB, read-only, with a dirty-bitmap-like context;
//! `c`: 1 MiB, read-write, in a memfd); everything the server answers is
//! read and dropped, while the client's bytes are still being written (so
//! a session may keep as many requests in flight as it sends). The server
//! must neither panic nor hang: the session ends when the input does.
//!
//! The server runs as `strata serve` does by default: with
//! [`ServerOptions::ring_io`] and a reaping thread. `a` and `b` read and
//! write only by themselves, so their requests go to the connection's
//! workers; `c` plans its reads and its 4 KiB-aligned writes
//! (`BlockDevice::plan_read`, `plan_write`) as an engine disk does, so they
//! go through the connection's io_uring, where the kernel offers one (else
//! the workers serve them too: [`Served::planned_requests`] is then 0).

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use strata_block::{
    check_range, BlockDevice, BlockError, BlockResult, ErrorKind, Extent, FilePiece, Fill, Held,
    IoPlan, Planned, ReadFill, ZeroOptions,
};

use crate::{ExportInfo, ExportProvider, MetaContext, NbdServer, ServerOptions};

const GRAIN: u64 = 4096;

/// Bytes in memory; a block is "data" once written.
struct Mem {
    bytes: Mutex<Vec<u8>>,
    read_only: bool,
}

impl Mem {
    fn new(len: usize, read_only: bool) -> Arc<Mem> {
        Arc::new(Mem {
            bytes: Mutex::new(vec![0; len]),
            read_only,
        })
    }
}

impl BlockDevice for Mem {
    fn size_bytes(&self) -> u64 {
        self.bytes.lock().len() as u64
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<ReadFill> {
        let b = self.bytes.lock();
        check_range(offset, buf.len() as u64, b.len() as u64)?;
        buf.copy_from_slice(&b[offset as usize..offset as usize + buf.len()]);
        Ok(zero_holes(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(ErrorKind::ReadOnly, "read-only"));
        }
        let mut b = self.bytes.lock();
        check_range(offset, buf.len() as u64, b.len() as u64)?;
        b[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.write_zeroes(offset, len, ZeroOptions::default())
    }
    fn write_zeroes(&self, offset: u64, len: u64, _: ZeroOptions) -> BlockResult<()> {
        if self.read_only {
            return Err(BlockError::new(ErrorKind::ReadOnly, "read-only"));
        }
        let mut b = self.bytes.lock();
        check_range(offset, len, b.len() as u64)?;
        b[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        check_range(offset, len, self.size_bytes())?;
        Ok(extents(offset, len))
    }
}

/// The runs of `[offset, offset + len)` cut at grain boundaries, each
/// with whether it lies in a hole: every other grain of the fuzz exports
/// is one (it reads as zeros, whatever was written), so hole chunks and
/// hole extents get sent too.
fn grain_runs(offset: u64, len: u64) -> impl Iterator<Item = (u64, u64, bool)> {
    let end = offset + len;
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let run_end = ((at / GRAIN + 1) * GRAIN).min(end);
        let run = (at, run_end, (at / GRAIN) % 2 == 1);
        at = run_end;
        Some(run)
    })
}

/// Zero the holes of `buf`, read at `offset`; how it is filled.
fn zero_holes(buf: &mut [u8], offset: u64) -> ReadFill {
    let mut f = ReadFill::default();
    for (at, end, hole) in grain_runs(offset, buf.len() as u64) {
        if hole {
            buf[(at - offset) as usize..(end - offset) as usize].fill(0);
        }
        f.push(end - at, if hole { Fill::Zeros } else { Fill::Data });
    }
    f
}

fn extents(offset: u64, len: u64) -> Vec<Extent> {
    grain_runs(offset, len)
        .map(|(at, end, hole)| Extent {
            len_bytes: end - at,
            hole,
            zero: hole,
        })
        .collect()
}

/// Zeros to write from (a memfd has no cheaper way without `unsafe`).
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Bytes in a memfd, laid out as [`Mem`]'s, whose reads and 4 KiB-aligned
/// writes it plans for the server to carry out on that file, as an engine
/// disk plans them on its pool: through the connection's io_uring under
/// [`ServerOptions::ring_io`]. Unaligned writes and the rest it carries
/// out itself, as it does FUA writes (which the server keeps off the
/// ring).
struct MemFile {
    file: Arc<File>,
    len_bytes: u64,
    /// Reads and writes planned, for [`Served::planned_requests`].
    planned: AtomicUsize,
}

impl MemFile {
    fn new(len_bytes: u64) -> Arc<MemFile> {
        // SAFETY: a NUL-terminated name and known flags; the descriptor
        // returned is checked, then owned by the `OwnedFd` alone.
        let fd = unsafe { libc::memfd_create(c"strata-fuzz".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create: {}", io::Error::last_os_error());
        // SAFETY: `fd` was just opened and nothing else owns it.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        file.set_len(len_bytes).expect("ftruncate of a memfd");
        Arc::new(MemFile {
            file: Arc::new(file),
            len_bytes,
            planned: AtomicUsize::new(0),
        })
    }

    /// A plan of `pieces` on the file, holding it open until it is over.
    fn plan(&self, write: bool, pieces: Vec<FilePiece>, fill: ReadFill) -> Planned {
        self.planned.fetch_add(1, Ordering::Relaxed);
        Planned::Plan(IoPlan {
            fd: self.file.as_raw_fd(),
            write,
            pieces,
            fill,
            holds: vec![Box::new(Held(self.file.clone()))],
            source: None,
            after_read: None,
        })
    }
}

fn io_error(e: io::Error) -> BlockError {
    BlockError::new(ErrorKind::Io, e.to_string())
}

impl BlockDevice for MemFile {
    fn size_bytes(&self) -> u64 {
        self.len_bytes
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> BlockResult<ReadFill> {
        check_range(offset, buf.len() as u64, self.len_bytes)?;
        self.file.read_exact_at(buf, offset).map_err(io_error)?;
        Ok(zero_holes(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64, _fua: bool) -> BlockResult<()> {
        check_range(offset, buf.len() as u64, self.len_bytes)?;
        self.file.write_all_at(buf, offset).map_err(io_error)
    }
    fn flush(&self) -> BlockResult<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> BlockResult<()> {
        self.write_zeroes(offset, len, ZeroOptions::default())
    }
    fn write_zeroes(&self, offset: u64, len: u64, _: ZeroOptions) -> BlockResult<()> {
        check_range(offset, len, self.len_bytes)?;
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(ZEROS.len() as u64);
            self.file
                .write_all_at(&ZEROS[..n as usize], at)
                .map_err(io_error)?;
            at += n;
        }
        Ok(())
    }
    fn block_status(&self, offset: u64, len: u64) -> BlockResult<Vec<Extent>> {
        check_range(offset, len, self.len_bytes)?;
        Ok(extents(offset, len))
    }
    /// The data grains are read from the memfd (through the page cache:
    /// no alignment asked), the holes zeroed here.
    fn plan_read(&self, buf: &mut [u8], offset: u64, _wait: bool) -> Option<BlockResult<Planned>> {
        if let Err(e) = check_range(offset, buf.len() as u64, self.len_bytes) {
            return Some(Err(e));
        }
        let fill = zero_holes(buf, offset);
        let pieces = grain_runs(offset, buf.len() as u64)
            .filter(|&(_, _, hole)| !hole)
            .map(|(at, end, _)| FilePiece {
                buf_offset: (at - offset) as usize,
                file_offset: at,
                len: (end - at) as usize,
            })
            .collect();
        Some(Ok(self.plan(false, pieces, fill)))
    }
    /// Only whole 4 KiB blocks, as an engine disk under `--cache none`
    /// plans only writes its direct pool can take.
    fn plan_write(&self, buf: &[u8], offset: u64, _wait: bool) -> Option<BlockResult<Planned>> {
        let len = buf.len() as u64;
        if len == 0 || !offset.is_multiple_of(GRAIN) || !len.is_multiple_of(GRAIN) {
            return None;
        }
        if let Err(e) = check_range(offset, len, self.len_bytes) {
            return Some(Err(e));
        }
        let piece = FilePiece {
            buf_offset: 0,
            file_offset: offset,
            len: buf.len(),
        };
        Some(Ok(self.plan(true, vec![piece], ReadFill::all_data(len))))
    }
}

/// A context that marks every other 64 KiB as "dirty" (flag 1).
struct Stripes;

impl MetaContext for Stripes {
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<(u64, u32)>> {
        let mut out = Vec::new();
        let mut at = offset;
        while at < offset.saturating_add(len) && out.len() < 64 {
            let end = ((at >> 16) + 1) << 16;
            out.push((end - at, ((at >> 16) & 1) as u32));
            at = end;
        }
        Ok(out)
    }
    fn read_next_flags(&self) -> Option<u32> {
        Some(1)
    }
}

struct Exports {
    a: Arc<Mem>,
    b: Arc<Mem>,
    c: Arc<MemFile>,
}

impl ExportProvider for Exports {
    fn list(&self) -> Vec<ExportInfo> {
        ["a", "b", "c"]
            .iter()
            .map(|n| ExportInfo {
                name: n.to_string(),
                description: format!("fuzz export {n}"),
            })
            .collect()
    }
    fn open(&self, name: &str) -> Result<Arc<dyn BlockDevice>, strata_block::Error> {
        match name {
            "a" => Ok(self.a.clone()),
            "b" => Ok(self.b.clone()),
            "c" => Ok(self.c.clone()),
            _ => Err(strata_block::Error::new(
                strata_block::Kind::NotFound,
                format!("no export '{name}'"),
            )),
        }
    }
    fn contexts(&self, export: &str) -> Vec<String> {
        match export {
            "b" => vec!["qemu:dirty-bitmap:s1".into()],
            _ => Vec::new(),
        }
    }
    fn context(&self, export: &str, name: &str) -> Option<Arc<dyn MetaContext>> {
        (export == "b" && name == "qemu:dirty-bitmap:s1").then(|| Arc::new(Stripes) as _)
    }
}

/// What one session came to.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    /// Bytes the server answered.
    pub answered_bytes: usize,
    /// READs and WRITEs of export `c` the server planned, to carry out
    /// through the connection's io_uring: 0 where the kernel offers none
    /// (the workers then serve every request).
    pub planned_requests: usize,
}

/// Serve `input` as one client connection, to its end.
pub fn session(input: &[u8]) -> Served {
    // A server that hangs up early makes the writer below write to a
    // closed socket: an error to it, not a SIGPIPE (libFuzzer's main does
    // not ignore the signal as a Rust program's does).
    static IGNORE_SIGPIPE: std::sync::Once = std::sync::Once::new();
    // SAFETY: setting a signal's disposition to SIG_IGN.
    IGNORE_SIGPIPE.call_once(|| unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    });
    let exports = Arc::new(Exports {
        a: Mem::new(1 << 20, false),
        b: Mem::new(64 << 10, true),
        c: MemFile::new(1 << 20),
    });
    let opts = ServerOptions {
        max_request_bytes: 256 << 10,
        workers_per_connection: 2,
        max_inflight_requests: 8,
        max_inflight_bytes: 1 << 20,
        read_ahead_bytes: 128 << 10,
        ring_io: true,
        ..ServerOptions::default()
    };
    let server = NbdServer::new(exports.clone(), opts);
    let (client, theirs) = UnixStream::pair().expect("socketpair");
    let mut writer = client.try_clone().expect("clone");
    let input = input.to_vec();
    std::thread::scope(|s| {
        let sender = s.spawn(|| {
            // The server may hang up early (a protocol error): fine.
            let _ = writer.write_all(&input);
            let _ = writer.shutdown(Shutdown::Write);
        });
        let reader = s.spawn(|| {
            let mut sink = [0u8; 64 << 10];
            let mut c = &client;
            let mut total = 0;
            while let Ok(n @ 1..) = c.read(&mut sink) {
                total += n;
            }
            total
        });
        let _ = server.serve_connection(theirs);
        // The server's side is closed now: the reader sees end of file.
        let answered = reader.join().unwrap_or(0);
        // Joined explicitly: the end of a scope waits for a thread's
        // closure only, not for the thread to exit, and LeakSanitizer
        // took the thread-local destructor list of one still exiting
        // for a leak.
        let _ = sender.join();
        server.shutdown();
        Served {
            answered_bytes: answered,
            planned_requests: exports.c.planned.load(Ordering::Relaxed),
        }
    })
}
