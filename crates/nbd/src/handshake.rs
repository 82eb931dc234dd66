//! Fixed-newstyle negotiation: greeting, client flags, option haggling.

use std::io::{self, BufReader, Read, Write};
use std::sync::Arc;

use strata_block::{BlockDevice, Error, Kind};

use crate::authz::{subject, ReadOnly};
use crate::proto::*;
use crate::tls::Link;
use crate::{
    Access, Authz, ExportSlot, MetaContext, NbdStream, Refusal, Shared, TlsMode, OPTION_BYTES_MAX,
};

/// Option payloads up to this size are read and discarded when too large;
/// beyond it the connection is closed.
const OPTION_DISCARD_MAX: u32 = 16 << 20;
/// Options one connection may send before it has to pick an export.
const OPTIONS_MAX: usize = 65_536;

/// A metadata context a connection selected.
#[derive(Clone)]
pub(crate) enum Context {
    /// `base:allocation`, from the device's block status.
    Allocation,
    /// One the export provider offers.
    Other(Arc<dyn MetaContext>),
}

/// What the client chose.
pub(crate) struct Negotiated {
    pub device: Arc<dyn BlockDevice>,
    /// The connection's place on its export, held while it is served.
    pub slot: ExportSlot,
    pub structured: bool,
    /// The metadata contexts selected for this export, with their ids.
    pub contexts: Vec<(u32, Context)>,
    /// The client did not ask for the block sizes (GO without
    /// INFO_BLOCK_SIZE, or EXPORT_NAME): the spec's defaults hold for it,
    /// a minimum block of 1 byte, so its requests may start and end
    /// anywhere (served by read-modify-write where they cut a sector).
    pub byte_granular: bool,
}

/// Whether LIST_META_CONTEXT query `q` names context `c`: the name itself,
/// or a namespace or prefix ending in `:` (`base:`, `qemu:`,
/// `qemu:dirty-bitmap:`).
fn lists(q: &str, c: &str) -> bool {
    q == c || (q.ends_with(':') && c.starts_with(q))
}

pub(crate) fn io_invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Transmission flags of `dev` for a session with or without structured
/// replies (DF is only meaningful, and only allowed, with them).
pub(crate) fn transmission_flags(dev: &dyn BlockDevice, structured: bool) -> u16 {
    let mut f = TF_HAS_FLAGS
        | TF_SEND_FLUSH
        | TF_SEND_FUA
        | TF_SEND_TRIM
        | TF_SEND_WRITE_ZEROES
        | TF_CAN_MULTI_CONN
        | TF_SEND_CACHE
        | TF_SEND_FAST_ZERO;
    if structured {
        f |= TF_SEND_DF;
    }
    if dev.read_only() {
        f |= TF_READ_ONLY;
    }
    f
}

/// Big-endian cursor over an option payload; every read is checked.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A `u32 length, bytes` string of at most [`STRING_BYTES_MAX`] bytes.
    fn string(&mut self) -> Option<&'a str> {
        let n = self.u32()? as usize;
        if n > STRING_BYTES_MAX {
            return None;
        }
        std::str::from_utf8(self.take(n)?).ok()
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One connection's negotiation.
struct Haggle<'a, S: NbdStream> {
    shared: &'a Shared,
    /// The connection's id in the server's registry.
    id: u64,
    conn: &'a mut BufReader<Link<S>>,
    /// Reused for every option reply.
    out: Vec<u8>,
    structured: bool,
    /// The export contexts were selected for, and those contexts.
    meta: Option<(String, Vec<(u32, Context)>)>,
    /// Who may open what, if the server says (`--tls-authz`).
    authz: Option<Arc<Authz>>,
    /// The client's certificate subject, once TLS is up with one.
    who: Option<String>,
}

impl<S: NbdStream> Haggle<'_, S> {
    fn reply(&mut self, opt: u32, ty: u32, data: &[&[u8]]) -> io::Result<()> {
        let len: usize = data.iter().map(|d| d.len()).sum();
        self.out.clear();
        self.out.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
        self.out.extend_from_slice(&opt.to_be_bytes());
        self.out.extend_from_slice(&ty.to_be_bytes());
        self.out.extend_from_slice(&(len as u32).to_be_bytes());
        for d in data {
            self.out.extend_from_slice(d);
        }
        self.conn.get_mut().write_all(&self.out)
    }

    fn error(&mut self, opt: u32, ty: u32, msg: &str) -> io::Result<()> {
        let msg = truncate_utf8(msg, STRING_BYTES_MAX);
        self.reply(opt, ty, &[msg.as_bytes()])
    }

    /// The export a client means: the empty name is the first listed.
    fn resolve(&self, name: &str) -> Option<String> {
        if !name.is_empty() {
            return Some(name.to_string());
        }
        self.shared
            .provider
            .list()
            .into_iter()
            .next()
            .map(|e| e.name)
    }

    /// What this client may do with `export` (everything without rules).
    fn grant(&self, export: &str) -> Option<Access> {
        match &self.authz {
            None => Some(Access::ReadWrite),
            Some(a) => a.access(self.who.as_deref(), export),
        }
    }

    /// Resolve and open an export, or explain why not: the option error
    /// to answer with, and the message.
    fn open(&self, name: &str) -> Result<(String, Arc<dyn BlockDevice>), (u32, String)> {
        let Some(name) = self.resolve(name) else {
            return Err((REP_ERR_UNKNOWN, "there is no default export".into()));
        };
        let Some(access) = self.grant(&name) else {
            let who = self
                .who
                .as_deref()
                .unwrap_or("a client without a certificate");
            let what = format!("export '{name}' to {who}: no --tls-authz rule grants it");
            self.shared.refusals.note(Refusal::NotGranted, &what);
            return Err((
                REP_ERR_POLICY,
                format!("export '{name}' is not granted to {who}"),
            ));
        };
        match self.shared.provider.open(&name) {
            Ok(dev) if access == Access::ReadOnly && !dev.read_only() => {
                Ok((name, Arc::new(ReadOnly(dev))))
            }
            Ok(dev) => Ok((name, dev)),
            Err(e) => Err((open_refusal(e.kind), refusal_message(&name, &e))),
        }
    }

    /// Take a place on export `name` for GO or EXPORT_NAME. From here the
    /// connection is past its handshake: it is marked so before the reply
    /// that tells the client, so that a client that opens another
    /// connection as soon as it has the reply never finds this one taken
    /// for a stalled handshake and closed to make room.
    fn take_slot(&self, name: &str, read_only: bool) -> Result<ExportSlot, Error> {
        let slot = self.shared.export_slot(name)?;
        self.shared
            .negotiated(self.id, name, read_only, self.who.as_deref());
        Ok(slot)
    }

    fn negotiated(
        &self,
        name: &str,
        device: Arc<dyn BlockDevice>,
        slot: ExportSlot,
        byte_granular: bool,
    ) -> Negotiated {
        Negotiated {
            device,
            slot,
            byte_granular,
            structured: self.structured,
            contexts: match &self.meta {
                Some((export, selected)) if self.structured && export == name => selected.clone(),
                _ => Vec::new(),
            },
        }
    }

    fn list(&mut self, data: &[u8]) -> io::Result<()> {
        if !data.is_empty() {
            return self.error(OPT_LIST, REP_ERR_INVALID, "LIST takes no data");
        }
        for e in self.shared.provider.list() {
            // Exports a client may not open are not named to it either.
            if self.grant(&e.name).is_none() {
                continue;
            }
            let len = (e.name.len() as u32).to_be_bytes();
            let desc = truncate_utf8(&e.description, STRING_BYTES_MAX);
            self.reply(
                OPT_LIST,
                REP_SERVER,
                &[&len, e.name.as_bytes(), desc.as_bytes()],
            )?;
        }
        self.reply(OPT_LIST, REP_ACK, &[])
    }

    /// INFO or GO. Returns the session for a successful GO.
    fn info(&mut self, opt: u32, data: &[u8]) -> io::Result<Option<Negotiated>> {
        let mut c = Cursor(data);
        let parsed = (|| {
            let name = c.string()?;
            let n = c.u16()? as usize;
            let mut items = Vec::with_capacity(n.min(16));
            for _ in 0..n {
                items.push(c.u16()?);
            }
            c.is_empty().then_some((name, items))
        })();
        let Some((name, items)) = parsed else {
            self.error(opt, REP_ERR_INVALID, "malformed INFO/GO request")?;
            return Ok(None);
        };
        let (name, dev) = match self.open(name) {
            Ok(x) => x,
            Err((code, msg)) => {
                self.error(opt, code, &msg)?;
                return Ok(None);
            }
        };
        // GO takes its place on the export before it answers anything.
        let slot = match opt {
            OPT_GO => match self.take_slot(&name, dev.read_only()) {
                Ok(slot) => Some(slot),
                Err(why) => {
                    self.error(opt, open_refusal(why.kind), &why.message)?;
                    return Ok(None);
                }
            },
            _ => None,
        };
        let flags = transmission_flags(&*dev, self.structured);
        self.reply(
            opt,
            REP_INFO,
            &[
                &INFO_EXPORT.to_be_bytes(),
                &dev.size_bytes().to_be_bytes(),
                &flags.to_be_bytes(),
            ],
        )?;
        if items.contains(&INFO_NAME) {
            self.reply(opt, REP_INFO, &[&INFO_NAME.to_be_bytes(), name.as_bytes()])?;
        }
        if items.contains(&INFO_DESCRIPTION) {
            let desc = self
                .shared
                .provider
                .list()
                .into_iter()
                .find(|e| e.name == name)
                .map(|e| e.description)
                .unwrap_or_default();
            let desc = truncate_utf8(&desc, STRING_BYTES_MAX);
            self.reply(
                opt,
                REP_INFO,
                &[&INFO_DESCRIPTION.to_be_bytes(), desc.as_bytes()],
            )?;
        }
        // Always sent: clients that did not ask still learn our limits.
        let asked = items.contains(&INFO_BLOCK_SIZE);
        self.block_sizes(opt, &*dev, asked)?;
        self.reply(opt, REP_ACK, &[])?;
        Ok(slot.map(|slot| self.negotiated(&name, dev, slot, !asked)))
    }

    /// The INFO_BLOCK_SIZE reply for `dev`. Only a client that `asked`
    /// is held to 512-byte blocks (the spec: a server may assume a client
    /// abides by sizes only once it asked for them in GO); one that did
    /// not gets the default minimum of 1, which it is served with.
    fn block_sizes(&mut self, opt: u32, dev: &dyn BlockDevice, asked: bool) -> io::Result<()> {
        let min: u32 = if asked { 512 } else { 1 };
        let max = self.shared.opts.max_request_bytes;
        let preferred = dev
            .preferred_block_bytes()
            .clamp(512, 1 << 30)
            .next_power_of_two()
            .min(prev_power_of_two(max));
        self.reply(
            opt,
            REP_INFO,
            &[
                &INFO_BLOCK_SIZE.to_be_bytes(),
                &min.to_be_bytes(),
                &preferred.to_be_bytes(),
                &max.to_be_bytes(),
            ],
        )
    }

    fn meta_context(&mut self, opt: u32, data: &[u8]) -> io::Result<()> {
        let set = opt == OPT_SET_META_CONTEXT;
        if set {
            // Whatever happens next, earlier selections are replaced.
            self.meta = None;
            if !self.structured {
                return self.error(
                    opt,
                    REP_ERR_INVALID,
                    "SET_META_CONTEXT needs structured replies first",
                );
            }
        }
        let mut c = Cursor(data);
        let parsed = (|| {
            let name = c.string()?;
            let n = c.u32()?;
            let mut queries = Vec::new();
            for _ in 0..n {
                queries.push(c.string()?);
            }
            c.is_empty().then_some((name, queries))
        })();
        let Some((name, queries)) = parsed else {
            return self.error(opt, REP_ERR_INVALID, "malformed meta context request");
        };
        let name = match self.open(name) {
            Ok((name, _)) => name,
            Err((code, msg)) => return self.error(opt, code, &msg),
        };
        let offered: Vec<String> = std::iter::once(BASE_ALLOCATION.to_string())
            .chain(self.shared.provider.contexts(&name))
            .collect();
        if !set {
            // LIST replies carry id 0 (reserved).
            for c in &offered {
                if queries.is_empty() || queries.iter().any(|q| lists(q, c)) {
                    self.reply(opt, REP_META_CONTEXT, &[&0u32.to_be_bytes(), c.as_bytes()])?;
                }
            }
            return self.reply(opt, REP_ACK, &[]);
        }
        // SET selects each context named exactly; a query for one that
        // does not exist selects nothing (the spec: no reply for it).
        let mut selected: Vec<(u32, Context)> = Vec::new();
        let mut names: Vec<&str> = Vec::new();
        for q in &queries {
            if names.contains(q) || !offered.iter().any(|c| c == q) {
                continue;
            }
            let (id, ctx) = if *q == BASE_ALLOCATION {
                (BASE_ALLOCATION_ID, Context::Allocation)
            } else {
                match self.shared.provider.context(&name, q) {
                    // base:allocation is 1; the others follow.
                    Some(c) => (
                        BASE_ALLOCATION_ID + 1 + names.len() as u32,
                        Context::Other(c),
                    ),
                    None => continue,
                }
            };
            names.push(q);
            self.reply(opt, REP_META_CONTEXT, &[&id.to_be_bytes(), q.as_bytes()])?;
            selected.push((id, ctx));
        }
        self.meta = Some((name, selected));
        self.reply(opt, REP_ACK, &[])
    }

    /// NBD_OPT_EXPORT_NAME: no way to report an error but hanging up.
    fn export_name(&mut self, data: &[u8], no_zeroes: bool) -> io::Result<Negotiated> {
        let name = std::str::from_utf8(data).map_err(|_| io_invalid("export name is not UTF-8"))?;
        // Not the client's protocol error: no such export, or not for it.
        let (name, dev) = self
            .open(name)
            .map_err(|(_, msg)| io::Error::new(io::ErrorKind::NotFound, msg))?;
        let slot = self
            .take_slot(&name, dev.read_only())
            .map_err(io::Error::other)?;
        let mut b = [0u8; 8 + 2 + 124];
        b[..8].copy_from_slice(&dev.size_bytes().to_be_bytes());
        b[8..10].copy_from_slice(&transmission_flags(&*dev, self.structured).to_be_bytes());
        let n = if no_zeroes { 10 } else { b.len() };
        self.conn.get_mut().write_all(&b[..n])?;
        Ok(self.negotiated(&name, dev, slot, true))
    }
}

/// The option reply for an export that cannot be opened, by the error's
/// kind (docs/ERRORS.md): `INVALID` for a request that makes no sense,
/// `POLICY` for what the server will not do for this client now,
/// `UNKNOWN` ("the export is not available") for the rest. `UNSUP` is
/// never used here: a client would take it to mean the option itself is
/// unknown.
fn open_refusal(kind: Kind) -> u32 {
    match kind {
        Kind::InvalidArgument | Kind::OutOfRange => REP_ERR_INVALID,
        Kind::ReadOnly | Kind::Refused | Kind::Fenced | Kind::Released => REP_ERR_POLICY,
        Kind::NotFound
        | Kind::AlreadyExists
        | Kind::NoSpace
        | Kind::Unsupported
        | Kind::Locked
        | Kind::Corrupt
        | Kind::Io
        | Kind::Unavailable
        | Kind::Gone => REP_ERR_UNKNOWN,
    }
}

/// What a client prints when `name` cannot be opened: the kind's sentence
/// first (`the server cannot reach its object store`), then the error. A
/// missing export's own message already says it is not there.
fn refusal_message(name: &str, e: &Error) -> String {
    match e.kind {
        Kind::NotFound => format!("cannot open export '{name}': {e}"),
        kind => format!("cannot open export '{name}': {}: {e}", kind.sentence()),
    }
}

fn prev_power_of_two(x: u32) -> u32 {
    if x == 0 {
        0
    } else {
        1 << (31 - x.leading_zeros())
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

/// Read and drop `n` bytes.
pub(crate) fn discard(r: &mut impl Read, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut r.take(n), &mut io::sink())?;
    if copied < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// Count a handshake that timed out or broke the protocol among the
/// server's refusals (the rest are the client's to end).
pub(crate) fn note_handshake(shared: &Shared, e: &io::Error) {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => shared.refusals.note(
            Refusal::HandshakeTimeout,
            &format!(
                "a client did not finish its handshake within {:?}",
                shared.opts.handshake_timeout.unwrap_or_default()
            ),
        ),
        io::ErrorKind::InvalidData => shared
            .refusals
            .note(Refusal::ProtocolError, &format!("in a handshake: {e}")),
        _ => {}
    }
}

/// Run the handshake. `Ok(None)` when the client ended it without picking
/// an export (ABORT, or the server is shutting down).
#[expect(clippy::too_many_lines)]
pub(crate) fn negotiate<S: NbdStream>(
    shared: &Shared,
    id: u64,
    conn: &mut BufReader<Link<S>>,
) -> io::Result<Option<Negotiated>> {
    // What this connection gets, fixed now (a reload affects later ones).
    let tls = shared.tls();
    let mut hello = [0u8; 18];
    hello[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    hello[16..].copy_from_slice(&(HS_FIXED_NEWSTYLE | HS_NO_ZEROES).to_be_bytes());
    conn.get_mut().write_all(&hello)?;

    let client = read_u32(conn)?;
    if client & CLIENT_FIXED_NEWSTYLE == 0 || client & !CLIENT_FLAGS_KNOWN != 0 {
        return Err(io_invalid(format!("refused client flags {client:#x}")));
    }
    let no_zeroes = client & CLIENT_NO_ZEROES != 0;

    let mut h = Haggle {
        shared,
        id,
        conn,
        out: Vec::with_capacity(256),
        structured: false,
        meta: None,
        authz: tls.as_ref().and_then(|t| t.authz.clone()),
        who: None,
    };
    let mut data = Vec::new();
    for _ in 0..OPTIONS_MAX {
        let mut head = [0u8; 16];
        h.conn.read_exact(&mut head)?;
        let magic = u64::from_be_bytes(head[..8].try_into().expect("8 bytes"));
        let opt = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
        let len = u32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
        if magic != IHAVEOPT {
            return Err(io_invalid(format!("bad option magic {magic:#x}")));
        }
        if len > OPTION_BYTES_MAX {
            if opt == OPT_EXPORT_NAME || len > OPTION_DISCARD_MAX {
                return Err(io_invalid(format!("option {opt} of {len} bytes")));
            }
            discard(h.conn, len as u64)?;
            h.error(opt, REP_ERR_TOO_BIG, "option payload too large")?;
            continue;
        }
        data.clear();
        data.resize(len as usize, 0);
        h.conn.read_exact(&mut data)?;
        if shared.stopping() {
            if opt != OPT_EXPORT_NAME {
                h.error(opt, REP_ERR_SHUTDOWN, "the server is shutting down")?;
            }
            return Ok(None);
        }
        let plain = !h.conn.get_ref().is_tls();
        if plain && tls.as_ref().is_some_and(|t| t.mode == TlsMode::Require) {
            match opt {
                OPT_STARTTLS | OPT_ABORT => {}
                // It has no error reply: the spec says to disconnect.
                OPT_EXPORT_NAME => {
                    shared
                        .refusals
                        .note(Refusal::TlsRequired, "EXPORT_NAME before STARTTLS");
                    // Counted as that, not also as a protocol error.
                    return Err(io::Error::other(
                        "EXPORT_NAME before STARTTLS, and this server requires TLS",
                    ));
                }
                _ => {
                    shared.refusals.note(
                        Refusal::TlsRequired,
                        &format!("option {opt} before STARTTLS"),
                    );
                    h.error(
                        opt,
                        REP_ERR_TLS_REQD,
                        "this server requires TLS: ask for STARTTLS first",
                    )?;
                    continue;
                }
            }
        }
        match opt {
            OPT_EXPORT_NAME => return h.export_name(&data, no_zeroes).map(Some),
            OPT_ABORT => {
                // The client may already be gone; that is fine.
                let _ = h.reply(opt, REP_ACK, &[]);
                return Ok(None);
            }
            OPT_LIST => h.list(&data)?,
            OPT_INFO | OPT_GO => {
                if let Some(n) = h.info(opt, &data)? {
                    return Ok(Some(n));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    h.structured = true;
                    h.reply(opt, REP_ACK, &[])?;
                } else {
                    h.error(opt, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data")?;
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => h.meta_context(opt, &data)?,
            OPT_STARTTLS => match &tls {
                None => h.error(
                    opt,
                    REP_ERR_UNSUP,
                    "TLS is not set up on this server (serve --tls-creds)",
                )?,
                Some(_) if !plain => h.error(opt, REP_ERR_INVALID, "TLS is already up")?,
                Some(_) if !data.is_empty() => {
                    h.error(opt, REP_ERR_INVALID, "STARTTLS takes no data")?
                }
                Some(t) => {
                    // Bytes that came before our answer would be taken as
                    // sent over TLS though they were not (the injection
                    // attack on STARTTLS): a client must wait for the ACK.
                    if !h.conn.buffer().is_empty() {
                        return Err(io_invalid("data sent after STARTTLS before its answer"));
                    }
                    h.reply(opt, REP_ACK, &[])?;
                    match h.conn.get_mut().start_tls(t.config.clone()) {
                        Ok(peer) => h.who = peer.as_deref().and_then(subject),
                        Err(e) => {
                            let what = format!("a client's TLS handshake failed: {e}");
                            shared.refusals.note(Refusal::TlsHandshake, &what);
                            // Counted as that, not as a protocol error.
                            return Err(io::Error::other(what));
                        }
                    }
                    // Nothing chosen in the clear carries over.
                    h.structured = false;
                    h.meta = None;
                }
            },
            _ => h.error(opt, REP_ERR_UNSUP, "option not supported")?,
        }
    }
    Err(io_invalid("too many options"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_rejects_short_and_long_strings() {
        let mut b = 3u32.to_be_bytes().to_vec();
        b.extend_from_slice(b"ab");
        assert!(Cursor(&b).string().is_none());
        let mut b = 5000u32.to_be_bytes().to_vec();
        b.resize(4 + 5000, b'a');
        assert!(Cursor(&b).string().is_none());
        let mut b = 2u32.to_be_bytes().to_vec();
        b.extend_from_slice(b"ok!");
        let mut c = Cursor(&b);
        assert_eq!(c.string(), Some("ok"));
        assert!(!c.is_empty());
    }

    #[test]
    fn list_queries_match_names_and_namespaces() {
        let bm = "qemu:dirty-bitmap:s1";
        assert!(lists(bm, bm) && lists("qemu:", bm) && lists("qemu:dirty-bitmap:", bm));
        assert!(lists("base:", BASE_ALLOCATION));
        assert!(
            !lists("qemu:dirty-bitmap:s", bm),
            "a prefix must end in ':'"
        );
        assert!(!lists("base:", bm) && !lists("qemu:dirty-bitmap:s2", bm));
    }

    #[test]
    fn powers_of_two() {
        assert_eq!(prev_power_of_two(32 << 20), 32 << 20);
        assert_eq!(prev_power_of_two((32 << 20) - 512), 16 << 20);
        assert_eq!(prev_power_of_two(4096), 4096);
    }
}
