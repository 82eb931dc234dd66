//! HTTP: Prometheus `/metrics`, the dashboard at `/` and the JSON API it
//! uses at `/api/v1` (docs/API.md). The API is the control socket's
//! requests over HTTP: each path is one [`Request`], run by the server's
//! [`Backend`], and answered with what `--json` prints for it ([`Render`]).
//! Actions need the server's action token (and are refused from other
//! origins); reads are open on loopback and need a token (the read token
//! or the action token) beyond it, or wherever a read token is set. With
//! TLS credentials the listener speaks HTTPS only. The page's files are
//! embedded in the binary.

use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Uri};
use serde_json::{json, Value};
use strata_api::{Request, Response};
use strata_engine::{Error, ErrorKind};
use strata_stats::{Gauge, StatsRegistry};

/// Requests answered at once, at most (more get 503).
const IN_FLIGHT_MAX: usize = 32;
/// Largest request body accepted.
const BODY_BYTES_MAX: usize = 64 << 10;
/// TLS handshakes under way at once, at most (more connections are closed).
const HANDSHAKES_MAX: usize = 64;
/// How long a client may take over its TLS handshake.
const HANDSHAKE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const STYLE_CSS: &str = include_str!("../assets/style.css");

mod actions;
mod audit;
pub(crate) mod charts;
use actions::{action, action_status};
use audit::Peer;

/// Runs the API's requests: the server's datastore, as its control socket
/// does.
pub(crate) trait Backend: Send + Sync {
    /// Run `req`, asked by `actor` (the event log's: `events`); a long
    /// one (`Request::is_job`) starts as a job and answers
    /// `Response::JobStarted`.
    fn run(&self, req: Request, actor: &str) -> Result<Response, Error>;
    /// Append `e` to the datastore's event log (a dashboard's login).
    fn record(&self, e: &crate::events::Entry<'_>);
    /// Whether its disks have writers (an object store's: the dashboard shows
    /// each disk's writer and generation).
    fn shared(&self) -> bool;
}

/// Gauges of the datastore behind a server, computed at each scrape.
pub(crate) type GaugeFn = Box<dyn Fn() -> Vec<Gauge> + Send + Sync>;

/// What the HTTP listener answers with.
pub(crate) struct Web {
    pub gauges: GaugeFn,
    pub registry: Arc<StatsRegistry>,
    /// None: a server without a datastore (VMDK files only): `/metrics` only.
    pub backend: Option<Arc<dyn Backend>>,
    /// The token actions need (None: actions are off); it grants reads too.
    pub token: Option<String>,
    /// A token that grants reads only (dashboards, scrapers).
    pub read_token: Option<String>,
    /// Whether reads (`/metrics`, the API's GETs) need a token.
    pub reads_need_token: bool,
    /// Whether the listener speaks HTTPS.
    pub https: bool,
    /// This machine's name, accepted in `Host` headers besides addresses.
    pub host_name: String,
    /// Performance over time (None: none kept, no datastore).
    pub charts: Option<Arc<strata_stats::Charts>>,
}

/// The tokens a listener checks.
pub(crate) struct Tokens {
    /// For actions (and reads).
    pub action: Option<String>,
    /// For reads only.
    pub read: Option<String>,
    /// Whether reads need one of them.
    pub reads_need_token: bool,
}

/// What the token a request carries grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grant {
    None,
    Read,
    Actions,
}

impl Grant {
    fn name(self) -> &'static str {
        match self {
            Grant::None => "none",
            Grant::Read => "read",
            Grant::Actions => "actions",
        }
    }
}

impl Web {
    pub fn new(
        gauges: GaugeFn,
        registry: Arc<StatsRegistry>,
        backend: Option<Arc<dyn Backend>>,
        tokens: Tokens,
        https: bool,
    ) -> Web {
        Web {
            gauges,
            registry,
            backend,
            token: tokens.action,
            read_token: tokens.read,
            reads_need_token: tokens.reads_need_token,
            https,
            host_name: own_host_name(),
            charts: None,
        }
    }

    /// What the request's `Authorization: Bearer` token grants.
    fn grant(&self, headers: &HeaderMap) -> Grant {
        let Some(given) = bearer(headers) else {
            return Grant::None;
        };
        if self.token.as_deref().is_some_and(|t| same_secret(given, t)) {
            Grant::Actions
        } else if self
            .read_token
            .as_deref()
            .is_some_and(|t| same_secret(given, t))
        {
            Grant::Read
        } else {
            Grant::None
        }
    }

    /// Refusal of a read without a token where reads need one.
    fn authorize_read(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        if !self.reads_need_token || self.grant(headers) != Grant::None {
            return Ok(());
        }
        Err(match bearer(headers) {
            None => Refusal::new(
                401,
                "refused",
                "reading this server needs a token (Authorization: Bearer TOKEN: the file given \
                 to serve --http-read-token, or --http-token)",
            ),
            Some(_) => Refusal::new(403, "refused", "wrong token"),
        })
    }
}

/// The token of an `Authorization: Bearer TOKEN` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    header_value(headers, "Authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// Read the token in `path`, or make a new random one there (0600).
/// `option` says what the token is for, in messages.
pub(crate) fn load_or_make_token(option: &str, path: &Path) -> Result<String, Error> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |what: &str, e: std::io::Error| {
        Error::new(
            ErrorKind::Io,
            format!("{option} {}: {what}: {e}", path.display()),
        )
    };
    match std::fs::read_to_string(path) {
        Ok(s) => {
            let t = s.trim().to_string();
            if t.len() < 16 || !t.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "{option} {}: the token must be at least 16 printable characters \
                         (remove the file to have a new one made)",
                        path.display()
                    ),
                ));
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut raw = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| f.read_exact(&mut raw))
                .map_err(|e| io("read /dev/urandom", e))?;
            let t: String = raw.iter().map(|b| format!("{b:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .map_err(|e| io("create", e))?;
            writeln!(f, "{t}")
                .and_then(|_| f.sync_all())
                .map_err(|e| io("write", e))?;
            Ok(t)
        }
        Err(e) => Err(io("read", e)),
    }
}

/// The address `--http` binds: `PORT` alone means loopback.
pub fn bind_address(a: &str) -> String {
    let a = a.trim();
    let port = a.strip_prefix(':').unwrap_or(a);
    if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) {
        format!("127.0.0.1:{port}")
    } else {
        a.to_string()
    }
}

/// The HTTP listener of a server: hyper (through axum) on a small tokio
/// runtime of its own; each request is answered on a blocking thread,
/// since requests run against the datastore synchronously.
pub(crate) struct HttpServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The TLS configuration new connections get (HTTPS only).
    tls: Option<Arc<parking_lot::RwLock<Arc<rustls::ServerConfig>>>>,
    /// The charts' sampler, stopped with the listener.
    pub sampler: Option<strata_stats::Sampler>,
}

/// The configuration of an HTTPS listener: `config` (from
/// `strata_nbd::server_config`) offering HTTP/1.1 by ALPN.
pub(crate) fn https_config(mut config: rustls::ServerConfig) -> Arc<rustls::ServerConfig> {
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

impl HttpServer {
    /// Use `config` for connections from now on (renewed credentials);
    /// false when the listener speaks plain HTTP.
    pub fn set_tls(&self, config: Arc<rustls::ServerConfig>) -> bool {
        match &self.tls {
            Some(t) => {
                *t.write() = config;
                true
            }
            None => false,
        }
    }

    /// Stop listening; requests being answered finish, idle connections
    /// close (waiting about a second at most).
    pub fn stop(mut self) {
        self.sampler = None;
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn http_io(what: &str, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Io, what).caused_by(e)
}

/// A non-blocking listener on `bind` (HOST:PORT) and the address it got.
fn bind_listener(bind: &str) -> Result<(std::net::TcpListener, std::net::SocketAddr), Error> {
    let what = format!("bind http {bind}");
    let listener = std::net::TcpListener::bind(bind).map_err(|e| http_io(&what, e))?;
    let addr = listener.local_addr().map_err(|e| http_io(&what, e))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| http_io("http listener", e))?;
    Ok((listener, addr))
}

/// Bind `bind` and answer on it until stopped; HTTPS only when `tls` is
/// given (see [`https_config`]).
pub(crate) fn start(
    bind: &str,
    web: Web,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> Result<HttpServer, Error> {
    let tls = tls.map(|c| Arc::new(parking_lot::RwLock::new(c)));
    let handshake_config = tls.clone();
    let (listener, addr) = bind_listener(bind)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(IN_FLIGHT_MAX)
        .thread_name("http")
        .enable_all()
        .build()
        .map_err(|e| http_io("http runtime", e))?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let app = router(Arc::new(web));
    let thread = std::thread::Builder::new()
        .name("http".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!("http listener: {e}");
                        return;
                    }
                };
                // On stop: no new connections, requests being answered
                // finish, idle keep-alive connections close; half a second
                // at most.
                let (graceful, when) = tokio::sync::oneshot::channel::<()>();
                let until = async {
                    let _ = when.await;
                };
                let serving = match handshake_config {
                    None => tokio::spawn(std::future::IntoFuture::into_future(
                        axum::serve(listener, app).with_graceful_shutdown(until),
                    )),
                    Some(config) => {
                        let (ready, rx) = tokio::sync::mpsc::channel(HANDSHAKES_MAX);
                        let handshaking = tokio::spawn(handshakes(listener, config, ready));
                        let tls = TlsListener { rx, addr };
                        tokio::spawn(async move {
                            let r = axum::serve(tls, app).with_graceful_shutdown(until).await;
                            handshaking.abort();
                            r
                        })
                    }
                };
                let _ = rx.await;
                let _ = graceful.send(());
                let _ = tokio::time::timeout(std::time::Duration::from_millis(500), serving).await;
            });
            rt.shutdown_timeout(std::time::Duration::from_millis(500));
        })
        .map_err(|e| http_io("spawn http thread", e))?;
    Ok(HttpServer {
        addr,
        stop: Some(tx),
        thread: Some(thread),
        tls,
        sampler: None,
    })
}

/// What the listener answers with: every request goes to [`dispatch`],
/// with the address it came from.
fn router(
    web: Arc<Web>,
) -> axum::extract::connect_info::IntoMakeServiceWithConnectInfo<axum::Router, Peer> {
    let in_flight = Arc::new(AtomicUsize::new(0));
    axum::Router::new()
        .fallback(
            move |axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<Peer>,
                  method: Method,
                  uri: Uri,
                  headers: HeaderMap,
                  body: Result<Bytes, axum::extract::rejection::BytesRejection>| {
                let served = Served {
                    web: web.clone(),
                    in_flight: in_flight.clone(),
                    peer: peer.0,
                };
                async move { dispatch(served, method, uri, headers, body).await }
            },
        )
        .layer(axum::extract::DefaultBodyLimit::max(BODY_BYTES_MAX))
        .into_make_service_with_connect_info::<Peer>()
}

type TlsStream = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// Connections whose TLS handshake has finished, for axum.
struct TlsListener {
    rx: tokio::sync::mpsc::Receiver<(TlsStream, SocketAddr)>,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TlsStream, SocketAddr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The handshakes ended (on stop): nothing more to accept.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// Accept TCP connections and run their TLS handshakes, each in a task of
/// its own with [`HANDSHAKE_LIMIT`], at most [`HANDSHAKES_MAX`] at once
/// (more are closed at once): a client that stalls its handshake holds
/// up nobody else.
async fn handshakes(
    listener: tokio::net::TcpListener,
    config: Arc<parking_lot::RwLock<Arc<rustls::ServerConfig>>>,
    ready: tokio::sync::mpsc::Sender<(TlsStream, SocketAddr)>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_MAX));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors, most likely: wait for some to close.
                tracing::warn!("https: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tracing::debug!("https: {peer}: too many handshakes under way; closed");
            continue;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(config.read().clone());
        let ready = ready.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!("https: {peer}: TLS handshake failed: {e}"),
                Err(_) => tracing::debug!("https: {peer}: no TLS handshake within the limit"),
            }
        });
    }
}

/// What every request is served with: the server's state and how many
/// requests are being answered.
struct Served {
    web: Arc<Web>,
    in_flight: Arc<AtomicUsize>,
    /// Where the request came from.
    peer: SocketAddr,
}

/// One request, on a blocking thread (at most [`IN_FLIGHT_MAX`] at once;
/// more get 503).
async fn dispatch(
    served: Served,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Resp {
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE => {
            return error_response(413, "invalid_argument", "body larger than 64 KiB")
        }
        Err(e) => return error_response(400, "invalid_argument", &format!("body: {e}")),
    };
    let Served {
        web,
        in_flight,
        peer,
    } = served;
    if in_flight.fetch_add(1, Ordering::AcqRel) >= IN_FLIGHT_MAX {
        in_flight.fetch_sub(1, Ordering::AcqRel);
        return error_response(503, "busy", "too many requests at once; try again");
    }
    let n = in_flight.clone();
    let r = tokio::task::spawn_blocking(move || {
        let (method, uri, headers, body) = (&method, &uri, &headers, &body[..]);
        let asked = Incoming {
            method,
            uri,
            headers,
            body,
            peer,
        };
        answer(&web, asked)
    })
    .await;
    n.fetch_sub(1, Ordering::AcqRel);
    r.unwrap_or_else(|_| error_response(500, "io", "the request failed inside the server"))
}

type Resp = axum::response::Response;

fn respond(status: u16, content_type: &str, body: Vec<u8>) -> Resp {
    axum::http::Response::builder()
        .status(status)
        .header("Content-Type", content_type)
        .header(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        )
        .header("X-Content-Type-Options", "nosniff")
        .header("Referrer-Policy", "no-referrer")
        .header("X-Frame-Options", "DENY")
        .header("Cache-Control", "no-store")
        .body(Body::from(body))
        .expect("a valid response")
}

fn text(status: u16, content_type: &str, body: &str) -> Resp {
    respond(status, content_type, body.as_bytes().to_vec())
}

fn json_response(status: u16, v: &Value) -> Resp {
    respond(
        status,
        "application/json",
        serde_json::to_vec(v).expect("serialisable"),
    )
}

fn error_response(status: u16, kind: &str, message: &str) -> Resp {
    json_response(
        status,
        &json!({ "error": { "kind": kind, "message": message } }),
    )
}

/// The HTTP status of each kind (docs/ERRORS.md): 503 for a store that
/// does not answer (a retry may succeed), 507 for no space, 501 for what
/// is not done here, 410 for what went away.
fn http_status(kind: ErrorKind) -> u16 {
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::OutOfRange => 400,
        ErrorKind::NotFound => 404,
        ErrorKind::AlreadyExists
        | ErrorKind::Locked
        | ErrorKind::Refused
        | ErrorKind::ReadOnly
        | ErrorKind::Fenced
        | ErrorKind::Released => 409,
        ErrorKind::Gone => 410,
        ErrorKind::Corrupt | ErrorKind::Io => 500,
        ErrorKind::Unsupported => 501,
        ErrorKind::Unavailable => 503,
        ErrorKind::NoSpace => 507,
    }
}

/// `e` as the control socket answers it too (strata-api's `ReplyError`:
/// kind, message, and the place when one is known).
fn engine_error(e: &Error) -> Resp {
    json_response(
        http_status(e.kind),
        &json!({ "error": strata_api::wire::ReplyError::from(e) }),
    )
}

fn header_value<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// Whether a `Host` header names this machine by address, as `localhost`
/// or by its own short host name (`own`; not with a domain, which another
/// site's could imitate: `own.evil.example`): a page of another site whose
/// name was made to resolve here (DNS rebinding) carries that site's name.
fn host_is_ours(host: &str, own: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((v6, _)) => return v6.parse::<std::net::Ipv6Addr>().is_ok(),
            None => return false,
        }
    } else {
        host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host)
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<IpAddr>().is_ok()
        || (!own.is_empty() && name.eq_ignore_ascii_case(own))
}

/// This machine's host name (without a domain), or "" when unknown.
fn own_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().split('.').next().unwrap_or("").to_string())
        .unwrap_or_default()
}

/// Constant-time comparison (the time does not tell how much matched).
fn same_secret(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// One HTTP request, as [`answer`] takes it.
#[derive(Clone, Copy)]
struct Incoming<'a> {
    method: &'a Method,
    uri: &'a Uri,
    headers: &'a HeaderMap,
    body: &'a [u8],
    peer: SocketAddr,
}

fn answer(web: &Web, asked: Incoming<'_>) -> Resp {
    let Incoming {
        method,
        uri,
        headers,
        body,
        peer,
    } = asked;
    let path = uri.path();
    if path == "/metrics" {
        if let Err(r) = web.authorize_read(headers) {
            return r.response();
        }
        return if method == Method::GET {
            let body =
                strata_stats::render_prometheus(&web.registry.snapshot_all(), &(web.gauges)());
            respond(200, "text/plain; version=0.0.4", body.into_bytes())
        } else {
            error_response(405, "invalid_argument", "GET /metrics")
        };
    }
    // Over HTTPS a page of another site cannot reach this server by a name
    // of its own (the certificate does not name it), so the check is for
    // plain HTTP.
    if !web.https && !header_value(headers, "Host").is_some_and(|h| host_is_ours(h, &web.host_name))
    {
        return error_response(
            421,
            "refused",
            "the Host header must be an IP address, localhost or this machine's name (a page of \
             another site may not reach this server by a name that resolves here)",
        );
    }
    let Some(backend) = &web.backend else {
        return text(
            404,
            "text/plain; charset=utf-8",
            "this server serves VMDK files only (no datastore): try /metrics\n",
        );
    };
    match (method, path) {
        (&Method::GET, "/" | "/index.html") => text(200, "text/html; charset=utf-8", INDEX_HTML),
        (&Method::GET, "/app.js") => text(200, "text/javascript; charset=utf-8", APP_JS),
        (&Method::GET, "/style.css") => text(200, "text/css; charset=utf-8", STYLE_CSS),
        (_, p) if p == "/api/v1" || p.starts_with("/api/v1/") => api(
            web,
            backend.as_ref(),
            &Call {
                method,
                headers,
                body,
                rest: p.strip_prefix("/api/v1").unwrap_or(""),
                query: uri.query(),
                peer,
            },
        ),
        _ => error_response(
            404,
            "not_found",
            "no such page: the dashboard is at /, the API at /api/v1, metrics at /metrics",
        ),
    }
}

/// A request refused before it runs: its status, kind and message.
struct Refusal(u16, &'static str, String);

impl Refusal {
    fn new(status: u16, kind: &'static str, message: &str) -> Self {
        Refusal(status, kind, message.to_string())
    }
    fn response(self) -> Resp {
        error_response(self.0, self.1, &self.2)
    }
}

/// Refusals for an action, before it is parsed: no token configured or
/// given, a wrong one, another origin.
fn authorize(web: &Web, req: &HeaderMap) -> Result<(), Refusal> {
    if web.token.is_none() {
        return Err(Refusal::new(
            403,
            "refused",
            "actions are off on this server: start it with --http-token FILE",
        ));
    }
    if header_value(req, "Sec-Fetch-Site") == Some("cross-site") {
        return Err(Refusal::new(403, "refused", "cross-site request refused"));
    }
    if let Some(origin) = header_value(req, "Origin") {
        let host = header_value(req, "Host").unwrap_or("");
        let scheme = if web.https { "https" } else { "http" };
        if origin != format!("{scheme}://{host}") {
            return Err(Refusal::new(
                403,
                "refused",
                &format!("request from another origin ({origin}) refused"),
            ));
        }
    }
    if bearer(req).is_none() {
        return Err(Refusal::new(
            401,
            "refused",
            "this action needs the server's token (Authorization: Bearer TOKEN; the dashboard \
             asks for it)",
        ));
    }
    match web.grant(req) {
        Grant::Actions => Ok(()),
        Grant::Read => Err(Refusal::new(
            403,
            "refused",
            "this token grants reads only; actions need the --http-token one",
        )),
        Grant::None => Err(Refusal::new(403, "refused", "wrong token")),
    }
}

/// The JSON body of an action (`{}` when there is none). A body over
/// [`BODY_BYTES_MAX`] never gets here: `dispatch` answers 413.
fn body(headers: &HeaderMap, raw: &[u8]) -> Result<Value, Refusal> {
    if raw.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(json!({}));
    }
    let ct = header_value(headers, "Content-Type").unwrap_or("");
    if !ct.trim_start().starts_with("application/json") {
        return Err(Refusal::new(
            415,
            "invalid_argument",
            "a body must be application/json",
        ));
    }
    serde_json::from_slice(raw)
        .map_err(|e| Refusal::new(400, "invalid_argument", &format!("body: {e}")))
}

/// A query string's `name=value` pairs, percent-decoded (`+` is a space).
fn query_params(query: Option<&str>) -> Result<Vec<(String, String)>, Refusal> {
    let mut out = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let dec = |s: &str| {
            percent_decode(&s.replace('+', " ")).ok_or_else(|| {
                Refusal::new(
                    400,
                    "invalid_argument",
                    &format!("bad percent-encoding in the query: {pair}"),
                )
            })
        };
        out.push((dec(k)?, dec(v)?));
    }
    Ok(out)
}

/// A GET of the API: its request, or the answer itself (the API's index,
/// a refusal).
fn get_request(
    web: &Web,
    backend: &dyn Backend,
    headers: &HeaderMap,
    segs: &[&str],
    query: Option<&str>,
) -> Result<Request, Box<Resp>> {
    web.authorize_read(headers)
        .map_err(|r| Box::new(r.response()))?;
    Ok(match segs {
        [] => {
            return Err(Box::new(json_response(
                200,
                &json!({
                    "api": 1,
                    "server": concat!("strata ", env!("CARGO_PKG_VERSION")),
                    "actions": web.token.is_some(),
                    "reads_need_token": web.reads_need_token,
                    "granted": web.grant(headers).name(),
                    "shared": backend.shared(),
                }),
            )))
        }
        ["status"] => Request::Status,
        ["disks"] => Request::List,
        ["disks", d] => Request::Info {
            name: d.to_string(),
        },
        ["disks", d, "snapshots"] => Request::SnapshotList {
            disk: d.to_string(),
        },
        ["disks", d, "changes"] => changes_request(d, query)?,
        ["stats"] => Request::Stats {
            disk: None,
            reset: false,
            recording: None,
        },
        ["charts"] => return Err(Box::new(charts::chart_response(web, query))),
        ["stats", e] if charts::window_asked(query) => {
            return Err(Box::new(charts::window_response(web, e, query)))
        }
        ["stats", e] => Request::Stats {
            disk: Some(e.to_string()),
            reset: false,
            recording: None,
        },
        ["alarms"] => Request::AlarmList,
        ["events"] => audit::events_request(query).map_err(|r| Box::new(r.response()))?,
        ["jobs"] => Request::Jobs,
        ["vhost"] => Request::VhostList,
        ["schedules"] => Request::ScheduleList,
        ["groups"] => Request::GroupList,
        ["groups", g] => Request::GroupInfo {
            name: g.to_string(),
        },
        ["groups", g, "snapshots"] => Request::GroupSnapshotList {
            group: g.to_string(),
        },
        _ => return Err(Box::new(not_found_or_method(segs))),
    })
}

/// `GET /api/v1/disks/D/changes?from=BASE[&to=SNAP][&totals=1]`.
fn changes_request(d: &str, query: Option<&str>) -> Result<Request, Box<Resp>> {
    let q = query_params(query).map_err(|e| Box::new(e.response()))?;
    let get = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let Some(from) = get("from") else {
        return Err(Box::new(error_response(
            400,
            "invalid_argument",
            "changes need ?from=BASE (a snapshot name, id:N, or another version)",
        )));
    };
    Ok(Request::Diff {
        target: match get("to") {
            Some(snap) => format!("{d}@{snap}"),
            None => d.to_string(),
        },
        from,
        totals: get("totals").is_some_and(|v| v != "0" && v != "false"),
    })
}

/// One request to the API: its method, headers and body, and its path
/// below `/api/v1` with the query.
struct Call<'a> {
    method: &'a Method,
    headers: &'a HeaderMap,
    body: &'a [u8],
    rest: &'a str,
    query: Option<&'a str>,
    /// Where it came from (with the token it showed: who asks, for the
    /// event log).
    peer: SocketAddr,
}

fn api(web: &Web, backend: &dyn Backend, call: &Call<'_>) -> Resp {
    let (method, headers, raw) = (call.method, call.headers, call.body);
    let (rest, query) = (call.rest, call.query);
    let mut segs = Vec::new();
    for s in rest.split('/').filter(|s| !s.is_empty()) {
        match percent_decode(s) {
            Some(s) => segs.push(s),
            None => return error_response(400, "invalid_argument", "bad percent-encoding in path"),
        }
    }
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let actor = audit::actor(web.grant(headers), call.peer);
    if method == Method::GET {
        if segs.is_empty() {
            audit::login(web, backend, headers, query, &actor);
        }
        return match get_request(web, backend, headers, &segs, query) {
            Ok(r) => run(backend, r, 200, &actor),
            Err(resp) => *resp,
        };
    }
    if method != Method::POST && method != Method::DELETE {
        return error_response(405, "invalid_argument", "GET, POST or DELETE");
    }
    // An action: is it one at all, then who asks, then what it says.
    if action_status(method, &segs).is_none() {
        return not_found_or_method(&segs);
    }
    let checked = authorize(web, headers)
        .and_then(|()| body(headers, raw))
        .and_then(|b| action(method, &segs, &b));
    match checked {
        Ok((r, status)) => run(backend, r, status, &actor),
        Err(refusal) => refusal.response(),
    }
}

fn not_found_or_method(segs: &[&str]) -> Resp {
    let known = [Method::GET, Method::POST, Method::DELETE]
        .iter()
        .any(|m| action_status(m, segs).is_some());
    if known {
        error_response(
            405,
            "invalid_argument",
            "not with this method (docs/API.md)",
        )
    } else {
        error_response(
            404,
            "not_found",
            &format!("no API path /api/v1/{} (docs/API.md)", segs.join("/")),
        )
    }
}

fn run(backend: &dyn Backend, req: Request, status: u16, actor: &str) -> Resp {
    match backend.run(req, actor) {
        Ok(r) => {
            let status = if matches!(r, Response::JobStarted(_)) {
                202
            } else {
                status
            };
            json_response(status, &r.to_json())
        }
        Err(e) => engine_error(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_by_address_or_localhost_only() {
        for ok in [
            "127.0.0.1:9100",
            "127.0.0.1",
            "localhost:80",
            "LOCALHOST",
            "[::1]:9100",
            "10.1.2.3:9",
            "storage01:9100",
            "STORAGE01",
        ] {
            assert!(host_is_ours(ok, "storage01"), "{ok}");
        }
        for bad in [
            "evil.example:9100",
            "evil.example",
            "[nope]:1",
            "127.0.0.1.evil:1",
            "storage01.evil.example",
            "",
        ] {
            assert!(!host_is_ours(bad, "storage01"), "{bad}");
        }
    }

    #[test]
    fn a_bare_port_binds_loopback() {
        assert_eq!(bind_address("9100"), "127.0.0.1:9100");
        assert_eq!(bind_address(":9100"), "127.0.0.1:9100");
        assert_eq!(bind_address("0.0.0.0:9100"), "0.0.0.0:9100");
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abcdef", "abcdef"));
        assert!(!same_secret("abcdef", "abcdeg"));
        assert!(!same_secret("abcdef", "abcde"));
    }

    #[test]
    fn paths_decode_percent_escapes() {
        assert_eq!(percent_decode("d%40s1").as_deref(), Some("d@s1"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
    }

    #[test]
    fn actions_map_to_the_cli_requests() {
        let b = json!({"name": "s1", "description": "before upgrade"});
        let (r, s) = action(&Method::POST, &["disks", "d", "snapshots"], &b)
            .ok()
            .unwrap();
        assert_eq!(s, 201);
        assert!(
            matches!(r, Request::SnapshotCreate { ref disk, ref snapshot, ref description }
            if disk == "d" && snapshot == "s1" && description == "before upgrade")
        );
        let (r, _) = action(
            &Method::POST,
            &["disks", "d", "extend"],
            &json!({"size": "2G"}),
        )
        .ok()
        .unwrap();
        assert!(matches!(r, Request::Extend { size_bytes, .. } if size_bytes == 2 << 30));
        let (r, _) = action(
            &Method::POST,
            &["disks", "d", "clones"],
            &json!({"name": "c", "snapshot": "s1"}),
        )
        .ok()
        .unwrap();
        assert!(matches!(r, Request::CloneLinked { ref source, .. } if source == "d@s1"));
        assert!(action(&Method::POST, &["disks", "d", "snapshots"], &json!({})).is_err());
        assert!(action(
            &Method::POST,
            &["disks", "d", "convert"],
            &json!({"type": "x"})
        )
        .is_err());
        assert!(action_status(&Method::POST, &["disks", "d"]).is_none());
        let (r, _) = action(
            &Method::POST,
            &["disks", "d", "snapshots", "s1", "rename"],
            &json!({"to": "s2"}),
        )
        .ok()
        .unwrap();
        assert!(
            matches!(r, Request::SnapshotRename { ref disk, ref snapshot, ref to }
            if disk == "d" && snapshot == "s1" && to == "s2")
        );
        assert!(action(&Method::POST, &["disks", "d", "rename"], &json!({})).is_err());
        assert!(
            action_status(&Method::POST, &["vhost"]).is_none(),
            "not over HTTP"
        );
        // Disks made, removed, copied and imported (item 7 of issue 62).
        let b = json!({"name": "n", "size": "1000", "type": "zeroedthick"});
        let (r, s) = action(&Method::POST, &["disks"], &b).ok().unwrap();
        assert_eq!(s, 201);
        assert!(
            matches!(r, Request::Create { size_bytes: 1024, provisioning, .. }
            if provisioning == strata_engine::Provisioning::Zeroedthick)
        );
        let force = json!({"force": true});
        let (r, _) = action(&Method::DELETE, &["disks", "d"], &force)
            .ok()
            .unwrap();
        assert!(matches!(r, Request::Remove { force: true, .. }));
        let full = json!({"name": "c", "full": true});
        let (r, _) = action(&Method::POST, &["disks", "d", "clones"], &full)
            .ok()
            .unwrap();
        assert!(matches!(r, Request::CloneFull { ref source, .. } if source == "d"));
        let imp = json!({"path": "/srv/a.vmdk", "name": "a", "format": "vmdk"});
        let (r, s) = action(&Method::POST, &["imports"], &imp).ok().unwrap();
        assert_eq!(s, 202);
        assert!(matches!(r, Request::Import { .. }));
        let rel = json!({"path": "a.vmdk", "name": "a"});
        assert!(action(&Method::POST, &["imports"], &rel).is_err());
    }
}
