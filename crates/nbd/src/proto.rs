//! Numbers on the wire: magics, flags, option and command codes, errnos.
//!
//! Everything is big-endian on the wire; the helpers at the bottom build
//! the fixed-size headers into caller-provided buffers so the hot path
//! never allocates for them.

// Magics.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags sent by the server, and the client flags that answer them.
pub const HS_FIXED_NEWSTYLE: u16 = 1;
pub const HS_NO_ZEROES: u16 = 2;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1;
pub const CLIENT_NO_ZEROES: u32 = 2;
pub const CLIENT_FLAGS_KNOWN: u32 = CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR + 1;
pub const REP_ERR_POLICY: u32 = REP_ERR + 2;
pub const REP_ERR_INVALID: u32 = REP_ERR + 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR + 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR + 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR + 7;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR + 9;

// NBD_INFO_* items of OPT_INFO / OPT_GO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const FLAG_FUA: u16 = 1;
pub const FLAG_NO_HOLE: u16 = 1 << 1;
pub const FLAG_DF: u16 = 1 << 2;
pub const FLAG_REQ_ONE: u16 = 1 << 3;
pub const FLAG_FAST_ZERO: u16 = 1 << 4;
pub const FLAGS_KNOWN: u16 = FLAG_FUA | FLAG_NO_HOLE | FLAG_DF | FLAG_REQ_ONE | FLAG_FAST_ZERO;

// Structured reply chunks.
pub const CHUNK_DONE: u16 = 1;
pub const CHUNK_OFFSET_DATA: u16 = 1;
pub const CHUNK_OFFSET_HOLE: u16 = 2;
pub const CHUNK_BLOCK_STATUS: u16 = 5;
pub const CHUNK_ERROR: u16 = (1 << 15) + 1;

// base:allocation descriptor flags.
pub const STATE_HOLE: u32 = 1;
pub const STATE_ZERO: u32 = 2;

pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id under which `base:allocation` is selected by SET_META_CONTEXT.
pub const BASE_ALLOCATION_ID: u32 = 1;

// The errno values the protocol allows.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Sizes of the fixed headers.
pub const REQUEST_BYTES: usize = 28;
pub const SIMPLE_REPLY_BYTES: usize = 16;
pub const CHUNK_HEADER_BYTES: usize = 20;
/// Chunk header plus the 64-bit offset of an OFFSET_DATA chunk.
pub const DATA_CHUNK_HEADER_BYTES: usize = CHUNK_HEADER_BYTES + 8;
/// A whole OFFSET_HOLE chunk: header, offset and length.
pub const HOLE_CHUNK_BYTES: usize = CHUNK_HEADER_BYTES + 12;

/// Longest string (export name, query) the protocol allows.
pub const STRING_BYTES_MAX: usize = 4096;

/// Keep only errno values a client is required to understand. A host file
/// that may not grow (EFBIG: a file-size limit; EDQUOT: a quota) is out of
/// space to the client: the protocol asks for ENOSPC there.
pub fn wire_errno(errno: i32) -> u32 {
    if errno == libc::EFBIG || errno == libc::EDQUOT {
        return ENOSPC;
    }
    match errno as u32 {
        e @ (EPERM | EIO | ENOMEM | EINVAL | ENOSPC | EOVERFLOW | ENOTSUP | ESHUTDOWN) => e,
        _ => EIO,
    }
}

/// A parsed transmission-phase request header.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    pub flags: u16,
    pub ty: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl Request {
    /// Parse a request header; `None` if the magic is wrong.
    pub fn parse(b: &[u8; REQUEST_BYTES]) -> Option<Request> {
        let magic = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if magic != REQUEST_MAGIC {
            return None;
        }
        Some(Request {
            flags: u16::from_be_bytes([b[4], b[5]]),
            ty: u16::from_be_bytes([b[6], b[7]]),
            cookie: u64::from_be_bytes(b[8..16].try_into().ok()?),
            offset: u64::from_be_bytes(b[16..24].try_into().ok()?),
            len: u32::from_be_bytes(b[24..28].try_into().ok()?),
        })
    }
}

/// Fill a simple reply header.
pub fn simple_reply(out: &mut [u8], errno: u32, cookie: u64) {
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&errno.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
}

/// Fill a structured reply chunk header.
pub fn chunk_header(out: &mut [u8], flags: u16, ty: u16, cookie: u64, payload_len: u32) {
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&ty.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&payload_len.to_be_bytes());
}

/// Cut `s` to at most `max` bytes without splitting a character.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_outside_the_protocol_set_becomes_eio() {
        assert_eq!(wire_errno(22), EINVAL);
        assert_eq!(wire_errno(108), ESHUTDOWN);
        assert_eq!(wire_errno(2), EIO);
        assert_eq!(wire_errno(-1), EIO);
    }

    #[test]
    fn a_host_file_that_may_not_grow_is_out_of_space() {
        assert_eq!(wire_errno(libc::EFBIG), ENOSPC);
        assert_eq!(wire_errno(libc::EDQUOT), ENOSPC);
        assert_eq!(wire_errno(libc::ENOSPC), ENOSPC);
    }

    #[test]
    fn truncation_keeps_characters_whole() {
        assert_eq!(truncate_utf8("abc", 10), "abc");
        assert_eq!(truncate_utf8("aé", 2), "a");
        assert_eq!(truncate_utf8("aé", 3), "aé");
    }

    #[test]
    fn request_parse_checks_magic() {
        let mut b = [0u8; REQUEST_BYTES];
        b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
        b[8..16].copy_from_slice(&7u64.to_be_bytes());
        b[16..24].copy_from_slice(&4096u64.to_be_bytes());
        b[24..28].copy_from_slice(&512u32.to_be_bytes());
        let r = Request::parse(&b).unwrap();
        assert_eq!((r.ty, r.cookie, r.offset, r.len), (CMD_WRITE, 7, 4096, 512));
        b[0] ^= 1;
        assert!(Request::parse(&b).is_none());
    }
}
