//! A vhost-user frontend for tests: guest memory in a memfd shared with
//! the backend, split virtqueues laid out in it by hand, requests written
//! as descriptor chains and completions read from the used ring, the way
//! a guest's virtio-blk driver and QEMU together would.
#![allow(dead_code)]

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostUserConfigFlags, VhostUserHeaderFlag, VhostUserProtocolFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

pub const MEM_BYTES: usize = 32 << 20;
/// Where buffers may go: everything above the rings.
pub const DATA_BASE: u64 = 1 << 20;
pub const QSIZE: u16 = 64;

pub const F_NEXT: u16 = 1;
pub const F_WRITE: u16 = 2;
pub const F_INDIRECT: u16 = 4;

pub const T_IN: u32 = 0;
pub const T_OUT: u32 = 1;
pub const T_FLUSH: u32 = 4;
pub const T_GET_ID: u32 = 8;
pub const T_DISCARD: u32 = 11;
pub const T_WRITE_ZEROES: u32 = 13;

pub const FEATURE_EVENT_IDX: u64 = 1 << 29;
pub const FEATURE_PROTOCOL: u64 = 1 << 30;

/// One queue's rings in guest memory.
pub struct Vq {
    desc: u64,
    avail: u64,
    used: u64,
    pub kick: EventFd,
    pub call: EventFd,
    avail_idx: u16,
    last_used: u16,
    next_desc: u16,
}

pub struct Guest {
    pub fe: Frontend,
    pub mem: GuestMemoryMmap,
    _file: File,
    pub queues: Vec<Vq>,
    pub features: u64,
    pub protocol: VhostUserProtocolFeatures,
    event_idx: bool,
    /// Our end of the backend channel: what the backend asks of us.
    pub backend_chan: std::os::unix::net::UnixStream,
}

/// Connect to `path`, retrying while the server starts.
fn connect(path: &Path, queues: u64) -> Frontend {
    let t0 = Instant::now();
    loop {
        match Frontend::connect(path, queues) {
            Ok(f) => return f,
            Err(e) if t0.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("connect {}: {e}", path.display()),
        }
    }
}

impl Guest {
    /// Set up `nq` queues; `drop_features` are not acked.
    pub fn connect(path: &Path, nq: u16, drop_features: u64) -> Guest {
        let mut fe = connect(path, u64::from(nq));
        // SAFETY: plain syscall; the name is a C string.
        let fd = unsafe { libc::memfd_create(c"guest".as_ptr(), 0) };
        assert!(fd >= 0, "memfd_create");
        // SAFETY: fd was just created and is owned here.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(MEM_BYTES as u64).unwrap();
        let mem = GuestMemoryMmap::<()>::from_ranges_with_files(&[(
            GuestAddress(0),
            MEM_BYTES,
            Some(FileOffset::new(file.try_clone().unwrap(), 0)),
        )])
        .unwrap();
        let host = mem.get_host_address(GuestAddress(0)).unwrap() as u64;

        fe.set_owner().unwrap();
        let offered = fe.get_features().unwrap();
        let features = offered & !drop_features;
        fe.set_features(features).unwrap();
        assert!(offered & FEATURE_PROTOCOL != 0);
        let proto = fe.get_protocol_features().unwrap();
        let want = VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::BACKEND_REQ;
        fe.set_protocol_features(proto & want).unwrap();
        if proto.contains(VhostUserProtocolFeatures::REPLY_ACK) {
            // Every message from now on asks for an acknowledgement, so a
            // backend's refusal shows as an error here.
            fe.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
        }
        // The backend channel, as QEMU offers it.
        let (backend_chan, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        if proto.contains(VhostUserProtocolFeatures::BACKEND_REQ) {
            fe.set_backend_request_fd(&theirs).unwrap();
        }
        drop(theirs);
        if proto.contains(VhostUserProtocolFeatures::MQ) {
            let max_q = fe.get_queue_num().unwrap();
            assert!(max_q >= u64::from(nq), "backend offers {max_q} queues");
        }
        let region = mem.find_region(GuestAddress(0)).unwrap();
        fe.set_mem_table(&[VhostUserMemoryRegionInfo::from_guest_region(region).unwrap()])
            .unwrap();
        let mut queues = Vec::new();
        for q in 0..nq {
            let base = u64::from(q) * 0x4000;
            let vq = Vq {
                desc: base,
                avail: base + 0x1000,
                used: base + 0x2000,
                kick: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
                call: EventFd::new(libc::EFD_NONBLOCK).unwrap(),
                avail_idx: 0,
                last_used: 0,
                next_desc: 0,
            };
            let i = q as usize;
            fe.set_vring_num(i, QSIZE).unwrap();
            fe.set_vring_addr(
                i,
                &VringConfigData {
                    queue_max_size: QSIZE,
                    queue_size: QSIZE,
                    flags: 0,
                    desc_table_addr: host + vq.desc,
                    used_ring_addr: host + vq.used,
                    avail_ring_addr: host + vq.avail,
                    log_addr: None,
                },
            )
            .unwrap();
            fe.set_vring_base(i, 0).unwrap();
            fe.set_vring_call(i, &vq.call).unwrap();
            fe.set_vring_kick(i, &vq.kick).unwrap();
            fe.set_vring_enable(i, true).unwrap();
            queues.push(vq);
        }
        Guest {
            fe,
            mem,
            _file: file,
            queues,
            features,
            protocol: proto,
            event_idx: features & FEATURE_EVENT_IDX != 0,
            backend_chan,
        }
    }

    pub fn config(&mut self) -> Vec<u8> {
        let (_, data) = self
            .fe
            .get_config(0, 60, VhostUserConfigFlags::WRITABLE, &[0u8; 60])
            .unwrap();
        data.to_vec()
    }

    pub fn capacity_sectors(&mut self) -> u64 {
        u64::from_le_bytes(self.config()[0..8].try_into().unwrap())
    }

    pub fn write(&self, addr: u64, data: &[u8]) {
        self.mem.write_slice(data, GuestAddress(addr)).unwrap();
    }

    pub fn read(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    /// Put a chain of descriptors `(addr, len, flags)` (NEXT is added
    /// between them) on queue `q` and kick; returns the head index.
    pub fn submit(&mut self, q: usize, chain: &[(u64, u32, u16)]) -> u16 {
        let vq = &mut self.queues[q];
        let n = chain.len() as u16;
        if vq.next_desc + n > QSIZE {
            vq.next_desc = 0;
        }
        let head = vq.next_desc;
        for (i, &(addr, len, flags)) in chain.iter().enumerate() {
            let idx = head + i as u16;
            let last = i + 1 == chain.len();
            let flags = if last { flags } else { flags | F_NEXT };
            let at = vq.desc + u64::from(idx) * 16;
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&(idx + 1).to_le_bytes());
            self.mem.write_slice(&d, GuestAddress(at)).unwrap();
        }
        vq.next_desc += n;
        self.publish(q, head);
        head
    }

    /// Put raw descriptors at table indices `at..` (any `next`, any flags)
    /// and publish `head`; for malformed chains.
    pub fn submit_raw(&mut self, q: usize, at: u16, descs: &[(u64, u32, u16, u16)], head: u16) {
        let vq = &self.queues[q];
        for (i, &(addr, len, flags, next)) in descs.iter().enumerate() {
            let a = vq.desc + u64::from(at + i as u16) * 16;
            let mut d = [0u8; 16];
            d[0..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&next.to_le_bytes());
            self.mem.write_slice(&d, GuestAddress(a)).unwrap();
        }
        self.publish(q, head);
    }

    fn publish(&mut self, q: usize, head: u16) {
        let vq = &self.queues[q];
        let slot = vq.avail + 4 + u64::from(vq.avail_idx % QSIZE) * 2;
        self.mem.write_obj(head, GuestAddress(slot)).unwrap();
        if self.event_idx {
            // used_event: tell me as soon as the next one is used.
            self.ask_next_used(q);
        }
        let vq = &mut self.queues[q];
        fence(Ordering::SeqCst);
        vq.avail_idx = vq.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(vq.avail_idx, GuestAddress(vq.avail + 2))
            .unwrap();
        fence(Ordering::SeqCst);
        vq.kick.write(1).unwrap();
    }

    /// EVENT_IDX: set queue `q`'s `used_event` so that the backend signals
    /// at the next completion after the ones taken.
    fn ask_next_used(&self, q: usize) {
        let vq = &self.queues[q];
        let used_event = vq.avail + 4 + u64::from(QSIZE) * 2;
        self.mem
            .write_obj(vq.last_used, GuestAddress(used_event))
            .unwrap();
    }

    /// Wait for the next used element of queue `q`: (head, len).
    pub fn wait_used(&mut self, q: usize) -> (u16, u32) {
        self.wait_used_any(&[q]).1
    }

    /// Wait for the next used element of any of `qs`: (queue, (head, len)).
    pub fn wait_used_any(&mut self, qs: &[usize]) -> (usize, (u16, u32)) {
        let t0 = Instant::now();
        loop {
            for &q in qs {
                if let Some(u) = self.try_used(q) {
                    return (q, u);
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "no completion on queues {qs:?} in 20 s"
            );
            let mut p: Vec<libc::pollfd> = qs
                .iter()
                .map(|&q| libc::pollfd {
                    fd: self.queues[q].call.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: valid pollfds, as many as said.
            unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, 50) };
            for &q in qs {
                let _ = self.queues[q].call.read();
            }
        }
    }

    /// The next used element of queue `q`, if there is one: (head, len).
    pub fn try_used(&mut self, q: usize) -> Option<(u16, u32)> {
        if self.event_idx {
            // Re-arm before looking, as a driver enabling callbacks
            // does: the next completion after the ones seen signals.
            self.ask_next_used(q);
        }
        let vq = &mut self.queues[q];
        fence(Ordering::SeqCst);
        let idx: u16 = self.mem.read_obj(GuestAddress(vq.used + 2)).unwrap();
        if idx == vq.last_used {
            return None;
        }
        let e = vq.used + 4 + u64::from(vq.last_used % QSIZE) * 8;
        let id: u32 = self.mem.read_obj(GuestAddress(e)).unwrap();
        let len: u32 = self.mem.read_obj(GuestAddress(e + 4)).unwrap();
        vq.last_used = vq.last_used.wrapping_add(1);
        Some((id as u16, len))
    }

    /// Number of completions not yet taken from queue `q`'s used ring.
    pub fn pending_used(&self, q: usize) -> u16 {
        let vq = &self.queues[q];
        let idx: u16 = self.mem.read_obj(GuestAddress(vq.used + 2)).unwrap();
        idx.wrapping_sub(vq.last_used)
    }
}

impl Guest {
    /// One request on queue 0, waited for: `ty` at `sector` with the
    /// header at `DATA_BASE` and a buffer of `len` bytes after it; the
    /// status byte.
    pub fn blk_io(&mut self, ty: u32, sector: u64, len: u32) -> u8 {
        let (hdr, buf, status) = (DATA_BASE, DATA_BASE + 0x1000, 0x0f_0000);
        self.write(hdr, &header(ty, sector));
        self.write(status, &[0xff]);
        let data = if ty == T_IN { F_WRITE } else { 0 };
        let head = self.submit(0, &[(hdr, 16, 0), (buf, len, data), (status, 1, F_WRITE)]);
        let (id, _) = self.wait_used(0);
        assert_eq!(id, head);
        self.read(status, 1)[0]
    }
}

/// The 16-byte request header.
pub fn header(ty: u32, sector: u64) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&ty.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    h
}

/// A discard / write-zeroes range.
pub fn range(sector: u64, sectors: u32, flags: u32) -> [u8; 16] {
    let mut r = [0u8; 16];
    r[0..8].copy_from_slice(&sector.to_le_bytes());
    r[8..12].copy_from_slice(&sectors.to_le_bytes());
    r[12..16].copy_from_slice(&flags.to_le_bytes());
    r
}

/// Bytes that say where they are: byte i of the block at `off` is
/// `(off + i) * 7 + seed`, so misplaced data shows.
pub fn pattern(off: u64, len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((off + i as u64).wrapping_mul(7) as u8).wrapping_add(seed))
        .collect()
}

impl Guest {
    /// The next message on the backend channel within `limit`: (request, size).
    pub fn backend_message(&self, limit: Duration) -> Option<(u32, u32)> {
        use std::io::Read;
        self.backend_chan.set_read_timeout(Some(limit)).unwrap();
        let mut h = [0u8; 12];
        (&self.backend_chan).read_exact(&mut h).ok()?;
        Some((
            u32::from_le_bytes(h[0..4].try_into().unwrap()),
            u32::from_le_bytes(h[8..12].try_into().unwrap()),
        ))
    }
}
