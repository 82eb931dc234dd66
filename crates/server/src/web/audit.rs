//! Who asks the HTTP API, for the event log (`events`, docs/FORMAT.md
//! §13): the peer's address (axum's connect info, from either listener)
//! with the token it showed; the dashboard's logins; `GET
//! /api/v1/events`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::connect_info::Connected;
use axum::http::HeaderMap;
use axum::serve::IncomingStream;
use strata_api::Request;
use strata_engine::{Error, ErrorKind};

use super::{bearer, query_params, Backend, Grant, Refusal, TlsListener, Web};

/// The address a request came from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for Peer {
    fn connect_info(s: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Peer(*s.remote_addr())
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(s: IncomingStream<'_, TlsListener>) -> Self {
        Peer(*s.remote_addr())
    }
}

/// `api action-token from 127.0.0.1:5555`: who asks, by the token it
/// showed (the token itself is never written anywhere) and its address.
pub(super) fn actor(grant: Grant, peer: SocketAddr) -> String {
    match grant {
        Grant::Actions => format!("api action-token from {peer}"),
        Grant::Read => format!("api read-token from {peer}"),
        Grant::None => format!("api from {peer}"),
    }
}

/// Refused logins are logged at most once this often, so that a stream of
/// wrong tokens (anyone who reaches the port can send them) cannot push
/// the history out of the bounded log.
const REFUSED_LOGIN_EVERY: Duration = Duration::from_secs(10);

/// When the last refused login was logged (ms since the epoch; 0: never).
static REFUSED_LOGGED_MS: AtomicU64 = AtomicU64::new(0);

/// Whether a refused login may be logged now ([`REFUSED_LOGIN_EVERY`]).
fn refused_may_log() -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let last = REFUSED_LOGGED_MS.load(Ordering::Acquire);
    now.saturating_sub(last) >= REFUSED_LOGIN_EVERY.as_millis() as u64
        && REFUSED_LOGGED_MS
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
}

/// `GET /api/v1?login=1`, what the dashboard asks when a token is pasted
/// into it: a `login` event, refused for a wrong token or none (those at
/// most once per [`REFUSED_LOGIN_EVERY`]).
pub(super) fn login(
    web: &Web,
    backend: &dyn Backend,
    headers: &HeaderMap,
    query: Option<&str>,
    actor: &str,
) {
    let asked = query_params(query)
        .map(|q| q.iter().any(|(k, _)| k == "login"))
        .unwrap_or(false);
    if !asked {
        return;
    }
    let refused = |why: &str| Error::new(ErrorKind::Refused, why.to_string());
    let (result, detail) = match (web.grant(headers), bearer(headers)) {
        (Grant::Actions, _) => (Ok(()), "granted actions"),
        (Grant::Read, _) => (Ok(()), "granted reads"),
        (Grant::None, Some(_)) => (Err(refused("wrong token")), "granted nothing"),
        (Grant::None, None) => (Err(refused("no token")), "granted nothing"),
    };
    if result.is_err() && !refused_may_log() {
        return;
    }
    backend.record(&crate::events::Entry {
        kind: "login",
        target: "",
        actor,
        result: result.as_ref().map(|_| ()),
        detail: Some(detail.to_string()),
    });
}

/// `GET /api/v1/events[?limit=N][&target=NAME]`.
pub(super) fn events_request(query: Option<&str>) -> Result<Request, Refusal> {
    let mut limit = None;
    let mut target = None;
    for (k, v) in query_params(query)? {
        match k.as_str() {
            "limit" => {
                limit = Some(v.parse().map_err(|_| {
                    Refusal::new(400, "invalid_argument", "limit is a number of events")
                })?)
            }
            "target" => target = Some(v),
            _ => {}
        }
    }
    Ok(Request::Events { limit, target })
}
