//! A blocking client for S3-compatible object stores, for strata's
//! object-store datastores (docs/FORMAT.md §11).
//!
//! The engine is synchronous; the S3 client (`object_store`) is async. An
//! [`ObjectStore`] owns a small tokio runtime of its own and runs every
//! request on it, so any engine thread can call in and wait. Requests are
//! bounded twice: each HTTP attempt by `Options::request_timeout`, the
//! whole operation (retries included) by `Options::op_timeout`; a store that
//! is down is an [`ErrorKind::Unavailable`] error, never a hang.
//!
//! Create-only writes ([`ObjectStore::put_create`]) are the fencing
//! primitive of §11.6. They are safe to retry: when the store says the key
//! exists, the object is read back, and if it holds exactly the bytes this
//! call wrote (the first attempt succeeded but its answer was lost), the
//! write counts as done. [`ObjectStore::probe`] checks, before a store is
//! used, that it refuses a second create of one key even under concurrency.
//!
//! Credentials and endpoint come from the standard variables
//! (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`); an `http://` endpoint is allowed (a local SeaweedFS or
//! MinIO).
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use bytes::Bytes;

#[cfg(feature = "testing")]
pub mod fault;
#[cfg(feature = "testing")]
pub mod testing;
use futures::TryStreamExt;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    ClientOptions, ObjectStore as _, ObjectStoreExt as _, PutMode, PutOptions, PutPayload,
    RetryConfig,
};

/// The object-store client returns strata's one error (docs/ERRORS.md):
/// a key that is not there is `NotFound`, a create-only write that finds
/// the key taken `AlreadyExists`, a store that does not answer or refuses
/// the credentials `Unavailable` (the message tells which). An error of a
/// request names its object (`s3://BUCKET/PREFIX/KEY`, or the listed
/// prefix) as its place and the request as its op: "put", "create" (a
/// create-only PUT), "get", "head", "list" or "delete".
pub use strata_block::{Error, Kind as ErrorKind};

pub type Result<T> = std::result::Result<T, Error>;

/// `s3://BUCKET/PREFIX`: where a datastore lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreUrl {
    pub bucket: String,
    /// Without leading or trailing `/`; may be empty.
    pub prefix: String,
}

impl StoreUrl {
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("'{s}' is not an object-store URL ({why}; expected s3://BUCKET/PREFIX)"),
            )
        };
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| bad("it does not start with s3://"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
        if bucket.len() < 3 || bucket.len() > 63 || !bucket.chars().all(ok) {
            return Err(bad(
                "a bucket name has 3 to 63 lower-case letters, digits, '-' and '.'",
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..")
            || prefix.contains("//")
            || prefix.chars().any(|c| c.is_control())
        {
            return Err(bad("the prefix has an empty, '.' or '..' part"));
        }
        Ok(StoreUrl {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.prefix.is_empty() {
            write!(f, "s3://{}", self.bucket)
        } else {
            write!(f, "s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// Time limits and retries.
#[derive(Debug, Clone)]
pub struct Options {
    /// One HTTP attempt.
    pub request_timeout: Duration,
    /// One operation, retries included.
    pub op_timeout: Duration,
    /// Retries of a failed attempt (server errors, timeouts).
    pub retries: usize,
    /// The endpoint, instead of `AWS_ENDPOINT_URL`.
    pub endpoint: Option<String>,
    /// Access key id and secret, instead of `AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`.
    pub credentials: Option<(String, String)>,
    /// Where requests go instead of S3 at the URL's bucket (tests give the
    /// in-memory store of `testing::fault` here). The URL's prefix still
    /// applies.
    pub backend: Option<Backend>,
}

/// An `object_store` implementation that takes the place of S3.
#[derive(Clone)]
pub struct Backend(pub Arc<dyn object_store::ObjectStore>);

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Backend({})", self.0)
    }
}

impl Default for Options {
    fn default() -> Self {
        Options {
            request_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(30),
            retries: 4,
            endpoint: None,
            credentials: None,
            backend: None,
        }
    }
}

/// Concurrent creates of one key that [`ObjectStore::probe`] sends.
pub const PROBE_RACERS: usize = 8;

/// How long each probe racer may add to the probe's wait. A store may
/// queue conflicting creates of one key behind a per-key lock: SeaweedFS
/// (4.x) makes a waiting create poll that lock once a second, so the k-th
/// of N racers answers after about k seconds (PERFORMANCE.md, "Create-only
/// writes under contention"); twice that is left for a loaded host.
pub const PROBE_WAIT_PER_RACER: Duration = Duration::from_secs(2);

/// How often a create-only write that has no answer yet reads its key
/// (see [`ObjectStore::put_create`]).
pub const CREATE_WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// The outcome of a create-only write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// The object is ours.
    Created,
    /// Another writer's object was there first.
    Exists,
}

/// One object of a listing; `key` is relative to the datastore's prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub key: String,
    pub size: u64,
    /// Last modified, ms since the Unix epoch.
    pub modified_ms: i64,
}

/// What [`ObjectStore::probe`] found.
#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// Concurrent create-only writes of one key that were sent.
    pub racers: usize,
    /// How many of them the store accepted (must be 1).
    pub accepted: usize,
    /// How long the race of creates took, ms (a store that serialises
    /// conflicting creates makes the losers wait).
    pub put_ms: f64,
}

/// A connection to one datastore's prefix in one bucket.
pub struct ObjectStore {
    /// Requests made, by kind (a retried request counts once).
    requests: RequestCounters,
    rt: tokio::runtime::Runtime,
    store: Arc<dyn object_store::ObjectStore>,
    /// The same store with the probe's time limit and no retries.
    probe_store: Arc<dyn object_store::ObjectStore>,
    url: StoreUrl,
    endpoint: String,
    opts: Options,
}

/// Requests an [`ObjectStore`] made, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Requests {
    /// Plain PUTs and create-only PUTs.
    pub puts: u64,
    pub creates: u64,
    /// GETs of whole objects and of byte ranges.
    pub gets: u64,
    pub range_gets: u64,
    /// HEADs (an object's size).
    pub heads: u64,
    pub lists: u64,
    pub deletes: u64,
}

#[derive(Default)]
struct RequestCounters {
    puts: AtomicU64,
    creates: AtomicU64,
    gets: AtomicU64,
    range_gets: AtomicU64,
    heads: AtomicU64,
    lists: AtomicU64,
    deletes: AtomicU64,
}

fn count(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl ObjectStore {
    /// The requests made so far, by kind.
    pub fn requests(&self) -> Requests {
        let c = &self.requests;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Requests {
            puts: l(&c.puts),
            creates: l(&c.creates),
            gets: l(&c.gets),
            range_gets: l(&c.range_gets),
            heads: l(&c.heads),
            lists: l(&c.lists),
            deletes: l(&c.deletes),
        }
    }

    /// Connect to `url` with credentials and endpoint from the environment.
    /// No request is sent yet.
    pub fn connect(url: &StoreUrl, opts: &Options) -> Result<Self> {
        let (store, probe_store, endpoint): (Arc<dyn object_store::ObjectStore>, _, _) =
            if let Some(Backend(b)) = &opts.backend {
                (b.clone(), b.clone(), b.to_string())
            } else {
                let endpoint = opts
                    .endpoint
                    .clone()
                    .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
                    .or_else(|| std::env::var("AWS_ENDPOINT").ok())
                    .unwrap_or_default();
                let store = s3_client(url, &endpoint, opts, opts.request_timeout, opts.retries)?;
                // The probe hears every racer's answer (an unanswered one may
                // have been accepted), and a retried create would be refused
                // as a second create of the key: no retries, and time for a
                // store that queues conflicting creates (see
                // PROBE_WAIT_PER_RACER).
                let probe_timeout =
                    opts.request_timeout + PROBE_WAIT_PER_RACER * PROBE_RACERS as u32;
                let probe_store = s3_client(url, &endpoint, opts, probe_timeout, 0)?;
                (Arc::new(store), Arc::new(probe_store), endpoint)
            };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("strata-s3")
            .enable_all()
            .build()
            .map_err(|e| {
                Error::new(ErrorKind::Io, "cannot start the S3 client runtime")
                    .at(url.to_string())
                    .op("connect")
                    .caused_by(e)
            })?;
        Ok(ObjectStore {
            requests: RequestCounters::default(),
            rt,
            store,
            probe_store,
            url: url.clone(),
            endpoint: if endpoint.is_empty() {
                "AWS S3".to_string()
            } else {
                endpoint
            },
            opts: opts.clone(),
        })
    }

    pub fn url(&self) -> &StoreUrl {
        &self.url
    }

    /// The endpoint requests go to, for messages.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn path(&self, key: &str) -> Path {
        if self.url.prefix.is_empty() {
            Path::from(key)
        } else {
            Path::from(format!("{}/{key}", self.url.prefix))
        }
    }

    /// Run request `op` of `key` on the client's runtime and wait, at most
    /// `op_timeout`.
    fn run<T>(
        &self,
        op: &'static str,
        key: &str,
        f: impl Future<Output = object_store::Result<T>>,
    ) -> Result<T> {
        let limit = self.opts.op_timeout;
        match self
            .rt
            .block_on(async { tokio::time::timeout(limit, f).await })
        {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.error(op, key, e)),
            Err(_) => Err(self.placed(
                Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "no answer from {} within {} s",
                        self.endpoint,
                        limit.as_secs_f64()
                    ),
                ),
                op,
                key,
            )),
        }
    }

    /// `key` as people name it: `s3://BUCKET/PREFIX/KEY`.
    fn describe(&self, key: &str) -> String {
        format!("{}/{key}", self.url)
    }

    /// `e`, about `key`, raised by request `op`.
    fn placed(&self, e: Error, op: &'static str, key: &str) -> Error {
        e.at(self.describe(key)).op(op)
    }

    fn error(&self, op: &'static str, key: &str, e: object_store::Error) -> Error {
        use object_store::Error as E;
        let denied = matches!(&e, E::PermissionDenied { .. } | E::Unauthenticated { .. });
        let kind = match &e {
            E::NotFound { .. } => ErrorKind::NotFound,
            E::AlreadyExists { .. } | E::Precondition { .. } => ErrorKind::AlreadyExists,
            E::NotImplemented { .. } | E::NotSupported { .. } => ErrorKind::Unsupported,
            E::InvalidPath { .. } | E::UnknownConfigurationKey { .. } => ErrorKind::InvalidArgument,
            // Refused credentials, connection refused, timeouts and 5xx
            // after the retries: the server cannot use its store.
            _ => ErrorKind::Unavailable,
        };
        let hint = match kind {
            _ if denied => {
                " (credentials refused: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
                    .to_string()
            }
            ErrorKind::Unavailable => format!(" (endpoint {})", self.endpoint),
            _ => String::new(),
        };
        self.placed(Error::new(kind, format!("{}{hint}", flatten(&e))), op, key)
    }

    /// Write `body` under `key`, replacing what is there.
    pub fn put(&self, key: &str, body: Bytes) -> Result<()> {
        count(&self.requests.puts);
        let path = self.path(key);
        self.run("put", key, async {
            self.store.put(&path, PutPayload::from_bytes(body)).await
        })
        .map(|_| ())
    }

    /// Write `body` under `key` only if no object is there. A retried
    /// request that finds its own earlier success counts as [`Put::Created`].
    ///
    /// A store may hold a create that conflicts with another one in a queue
    /// for seconds (SeaweedFS polls a per-key lock once a second), though
    /// the answer is already decided once the other writer's object is
    /// there. So while the request waits, the key is read every
    /// [`CREATE_WATCH_INTERVAL`]: other bytes under it mean this create has
    /// lost, and the request is dropped. That is safe because a create-only
    /// request can never replace an object: the store still refuses it
    /// whenever it gets to it (FORMAT.md §11.1, rule 2).
    pub fn put_create(&self, key: &str, body: Bytes) -> Result<Put> {
        // A server error is retried: safe for the reason above, as an
        // earlier attempt that took effect makes the next find its bytes.
        let r = retry_server_errors(|| self.put_create_watched(key, body.clone()));
        match r {
            Ok(put) => Ok(put),
            Err(e) if e.kind == ErrorKind::AlreadyExists => match self.get_opt(key)? {
                Some(there) if there == body => Ok(Put::Created),
                _ => Ok(Put::Exists),
            },
            Err(e) => Err(e),
        }
    }

    fn put_create_watched(&self, key: &str, body: Bytes) -> Result<Put> {
        count(&self.requests.creates);
        let path = self.path(key);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        let put = self
            .store
            .put_opts(&path, PutPayload::from_bytes(body.clone()), opts);
        let watch = async {
            loop {
                tokio::time::sleep(CREATE_WATCH_INTERVAL).await;
                // A failed read decides nothing: the request still may.
                if let Ok(got) = self.store.get(&path).await {
                    if let Ok(there) = got.bytes().await {
                        return there == body;
                    }
                }
            }
        };
        self.run("create", key, async {
            tokio::select! {
                r = put => r.map(|_| Put::Created),
                ours = watch => Ok(if ours { Put::Created } else { Put::Exists }),
            }
        })
    }

    fn put_create_once(&self, key: &str, body: Bytes) -> Result<()> {
        count(&self.requests.creates);
        let path = self.path(key);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        self.run("create", key, async {
            self.store
                .put_opts(&path, PutPayload::from_bytes(body), opts)
                .await
        })
        .map(|_| ())
    }

    /// The whole object under `key`.
    pub fn get(&self, key: &str) -> Result<Bytes> {
        count(&self.requests.gets);
        let path = self.path(key);
        self.run("get", key, async {
            self.store.get(&path).await?.bytes().await
        })
    }

    /// The size of the object under `key`, or None if there is none.
    pub fn size_of(&self, key: &str) -> Result<Option<u64>> {
        count(&self.requests.heads);
        let path = self.path(key);
        match self.run("head", key, async { self.store.head(&path).await }) {
            Ok(m) => Ok(Some(m.size)),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The whole object under `key`, or None if there is none.
    pub fn get_opt(&self, key: &str) -> Result<Option<Bytes>> {
        match self.get(key) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Bytes `range` of the object under `key`.
    pub fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        count(&self.requests.range_gets);
        let path = self.path(key);
        let want = range.end - range.start;
        let b = self
            .run("get", key, async {
                self.store.get_range(&path, range.clone()).await
            })
            .map_err(|e| e.offset(range.start))?;
        if b.len() as u64 != want {
            let e = Error::new(
                ErrorKind::Unavailable,
                format!("asked for {want} bytes, got {}", b.len()),
            );
            return Err(self.placed(e, "get", key).offset(range.start));
        }
        Ok(b)
    }

    /// Objects whose keys start with `prefix` (a "directory" ends with
    /// `/`), after `after` if given, in key order.
    pub fn list(&self, prefix: &str, after: Option<&str>) -> Result<Vec<Listed>> {
        self.list_limited(prefix, after, usize::MAX)
    }

    /// The first `n` objects (in key order) whose keys start with `prefix`.
    pub fn list_first(&self, prefix: &str, n: usize) -> Result<Vec<Listed>> {
        self.list_limited(prefix, None, n)
    }

    fn list_limited(&self, prefix: &str, after: Option<&str>, n: usize) -> Result<Vec<Listed>> {
        count(&self.requests.lists);
        let dir = prefix.trim_end_matches('/');
        let base = self.path(dir);
        let offset = after.map(|a| self.path(a));
        let strip = if self.url.prefix.is_empty() {
            0
        } else {
            self.url.prefix.len() + 1
        };
        let mut out: Vec<Listed> = self.run("list", prefix, async {
            let stream = match &offset {
                Some(o) => self.store.list_with_offset(Some(&base), o),
                None => self.store.list(Some(&base)),
            };
            let mut out = Vec::new();
            let mut stream = std::pin::pin!(stream);
            while let Some(m) = stream.try_next().await? {
                let key = m.location.as_ref().get(strip..).unwrap_or("").to_string();
                // `list` is by path segments; keep exact prefix matches only.
                if key.starts_with(prefix) {
                    out.push(Listed {
                        key,
                        size: m.size,
                        modified_ms: m.last_modified.timestamp_millis(),
                    });
                }
                if out.len() >= n {
                    break;
                }
            }
            Ok(out)
        })?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Delete the object under `key` (no error if there is none).
    pub fn delete(&self, key: &str) -> Result<()> {
        count(&self.requests.deletes);
        let path = self.path(key);
        match self.run("delete", key, async { self.store.delete(&path).await }) {
            Err(e) if e.kind == ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    /// Check that the store honours create-only writes (§11.9): 8
    /// concurrent creates of one key with different bodies must leave
    /// exactly one, the one a read returns; one more create must be
    /// refused. The probe object is deleted afterwards.
    #[expect(clippy::too_many_lines)]
    pub fn probe(&self) -> Result<ProbeReport> {
        let key = format!(
            "probe/{:016x}{:016x}",
            rand::random::<u64>(),
            rand::random::<u64>()
        );
        let path = self.path(&key);
        let bodies: Vec<Bytes> = (0..PROBE_RACERS)
            .map(|i| Bytes::from(format!("strata probe {key} racer {i}")))
            .collect();
        let t0 = std::time::Instant::now();
        let results: Vec<object_store::Result<()>> = self.rt.block_on(async {
            let tasks: Vec<_> = bodies
                .iter()
                .map(|b| {
                    let store = self.probe_store.clone();
                    let path = path.clone();
                    let body = b.clone();
                    tokio::spawn(async move {
                        let opts = PutOptions {
                            mode: PutMode::Create,
                            ..PutOptions::default()
                        };
                        store
                            .put_opts(&path, PutPayload::from_bytes(body), opts)
                            .await
                            .map(|_| ())
                    })
                })
                .collect();
            let mut out = Vec::with_capacity(tasks.len());
            for t in tasks {
                out.push(t.await.unwrap_or_else(|e| {
                    Err(object_store::Error::Generic {
                        store: "probe",
                        source: Box::new(e),
                    })
                }))
            }
            out
        });
        let put_ms = t0.elapsed().as_secs_f64() * 1000.0;
        let cleanup = |r: Result<ProbeReport>| {
            let _ = self.delete(&key);
            r
        };
        // A racer answered with a server error is undecided: the store
        // may have carried it out. It is sent again (as put_create does);
        // a 412 then leaves it undecided, and the object read back says
        // whether it was the winner.
        let mut accepted = Vec::new();
        let mut undecided = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            let r = match r {
                Ok(()) => Ok(()),
                Err(e) => match self.error("create", &key, e) {
                    e if is_server_error(&e) => {
                        let again =
                            retry_server_errors(|| self.put_create_once(&key, bodies[i].clone()));
                        if matches!(&again, Err(e) if e.kind == ErrorKind::AlreadyExists) {
                            undecided.push(i);
                        }
                        again
                    }
                    e => Err(e),
                },
            };
            match r {
                Ok(()) => accepted.push(i),
                Err(e) if e.kind == ErrorKind::AlreadyExists => {}
                Err(e) => return cleanup(Err(e)),
            }
        }
        let unsupported = |why: String| {
            Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "the store at {} does not honour create-only writes (If-None-Match: *): \
                     {why}; strata's fencing depends on them, so it cannot use this store",
                    self.endpoint
                ),
            )
            .at(self.url.to_string())
            .op("probe"))
        };
        if accepted.len() > 1 {
            return cleanup(unsupported(format!(
                "it accepted {} of {PROBE_RACERS} concurrent creates of one key",
                accepted.len()
            )));
        }
        let there = match self.get(&key) {
            Ok(b) => b,
            Err(e) => return cleanup(Err(e)),
        };
        let Some(winner) = bodies.iter().position(|b| *b == there) else {
            return cleanup(unsupported(
                "the object read back is none of the racers' bodies".into(),
            ));
        };
        match accepted.first() {
            Some(&a) if a != winner => {
                return cleanup(unsupported(
                    "the object read back is not the one whose create was accepted".into(),
                ))
            }
            None if !undecided.contains(&winner) => {
                return cleanup(unsupported(format!(
                    "it refused all {PROBE_RACERS} concurrent creates of one key, yet one is there"
                )))
            }
            _ => {}
        }
        match retry_server_errors(|| {
            self.put_create_once(&key, Bytes::from_static(b"strata probe: late"))
        }) {
            Ok(()) => {
                return cleanup(unsupported(
                    "it accepted a create of a key that exists".into(),
                ))
            }
            Err(e) if e.kind == ErrorKind::AlreadyExists => {}
            Err(e) => return cleanup(Err(e)),
        }
        cleanup(Ok(ProbeReport {
            racers: PROBE_RACERS,
            accepted: 1,
            put_ms,
        }))
    }
}

/// Whether `e` is a store's answer of a server error (5xx): the request
/// may or may not have been carried out.
fn is_server_error(e: &Error) -> bool {
    e.kind == ErrorKind::Unavailable && e.message.contains("status code: 5")
}

/// Run `f` again while it fails with a server error, up to 3 more times
/// with a growing pause. The HTTP client retries only idempotent
/// requests, and a create-only PUT is not one to it; SeaweedFS answers
/// some of them with a passing 500. (A store that does not answer at all
/// is not retried here: that is an outage, and the callers say so.)
fn retry_server_errors<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let mut pause = Duration::from_millis(50);
    for _ in 0..3 {
        match f() {
            Err(e) if is_server_error(&e) => {
                std::thread::sleep(pause);
                pause *= 2;
            }
            r => return r,
        }
    }
    f()
}

/// An S3 client for `url` whose HTTP attempts last at most `timeout`.
fn s3_client(
    url: &StoreUrl,
    endpoint: &str,
    opts: &Options,
    timeout: Duration,
    retries: usize,
) -> Result<object_store::aws::AmazonS3> {
    let mut b = AmazonS3Builder::from_env().with_bucket_name(&url.bucket);
    if !endpoint.is_empty() {
        b = b.with_endpoint(endpoint);
    }
    if let Some((id, secret)) = &opts.credentials {
        b = b.with_access_key_id(id).with_secret_access_key(secret);
    }
    let mut b = b
        .with_conditional_put(S3ConditionalPut::ETagMatch)
        .with_retry(RetryConfig {
            max_retries: retries,
            retry_timeout: opts.op_timeout.max(timeout),
            ..RetryConfig::default()
        })
        .with_client_options(
            ClientOptions::new()
                .with_timeout(timeout)
                .with_connect_timeout(Duration::from_secs(5))
                .with_allow_http(endpoint.starts_with("http://")),
        );
    if std::env::var("AWS_REGION").is_err() && std::env::var("AWS_DEFAULT_REGION").is_err() {
        b = b.with_region("us-east-1");
    }
    b.build().map_err(|e| {
        Error::new(ErrorKind::InvalidArgument, "cannot set up the S3 client")
            .at(url.to_string())
            .op("connect")
            .caused_by(e)
    })
}

/// An error and its sources on one line.
fn flatten(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        let t = x.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = x.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::{Crash, FaultStore};

    /// A client of `backend` for `s3://bkt/pre`.
    fn client(backend: Backend) -> ObjectStore {
        let url = StoreUrl::parse("s3://bkt/pre").unwrap();
        let opts = Options {
            backend: Some(backend),
            op_timeout: Duration::from_secs(5),
            ..Options::default()
        };
        ObjectStore::connect(&url, &opts).unwrap()
    }

    #[test]
    fn a_request_that_fails_names_its_object_and_request() {
        let s = client(Backend(Arc::new(object_store::memory::InMemory::new())));
        let e = s.get("disks/0000002a/m/1").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound, "{e}");
        assert_eq!(
            e.place.object.as_deref(),
            Some("s3://bkt/pre/disks/0000002a/m/1")
        );
        assert_eq!((e.place.op.as_deref(), e.place.offset), (Some("get"), None));
        // Display: the object and the request once, then the store's words.
        let text = e.to_string();
        assert!(
            text.starts_with("s3://bkt/pre/disks/0000002a/m/1: get: "),
            "{text}"
        );
        assert_eq!(text.matches("s3://").count(), 1, "{text}");
        // A short range: where in the object.
        s.put("seg", Bytes::from_static(b"12345678")).unwrap();
        let e = s.get_range("seg", 2..500).unwrap_err();
        assert_eq!(e.place.object.as_deref(), Some("s3://bkt/pre/seg"), "{e}");
        assert_eq!(e.place.op.as_deref(), Some("get"), "{e}");
        assert_eq!(e.place.offset, Some(2), "{e}");
    }

    #[test]
    fn every_request_that_finds_the_store_gone_names_its_object_and_request() {
        let f = FaultStore::new(1);
        let s = client(f.backend());
        f.crash_when(|_| Some(Crash::Before));
        let b = || Bytes::from_static(b"x");
        let cases: [(&str, &str, Result<()>); 6] = [
            ("put", "k/put", s.put("k/put", b())),
            (
                "create",
                "k/create",
                s.put_create("k/create", b()).map(|_| ()),
            ),
            ("get", "k/get", s.get("k/get").map(|_| ())),
            ("head", "k/head", s.size_of("k/head").map(|_| ())),
            ("list", "k/", s.list("k/", None).map(|_| ())),
            ("delete", "k/delete", s.delete("k/delete")),
        ];
        for (op, key, r) in cases {
            let e = r.unwrap_err();
            assert_eq!(e.kind, ErrorKind::Unavailable, "{op}: {e}");
            assert_eq!(e.place.op.as_deref(), Some(op), "{e}");
            let object = format!("s3://bkt/pre/{key}");
            assert_eq!(e.place.object.as_deref(), Some(object.as_str()), "{e}");
            assert!(
                e.to_string().starts_with(&format!("{object}: {op}: ")),
                "{e}"
            );
            assert!(e.message.contains("(endpoint "), "{e}");
        }
    }

    #[test]
    fn urls_parse_and_print_back() {
        let u = StoreUrl::parse("s3://strata-test/a/b/").unwrap();
        assert_eq!(u.bucket, "strata-test");
        assert_eq!(u.prefix, "a/b");
        assert_eq!(u.to_string(), "s3://strata-test/a/b");
        let u = StoreUrl::parse("s3://bkt").unwrap();
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("bkt", ""));
        for bad in [
            "http://x/y",
            "s3://",
            "s3://A_B/x",
            "s3://ok-bucket/a/../b",
            "s3://ok-bucket/a//b",
        ] {
            let e = StoreUrl::parse(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidArgument, "{bad}");
            assert!(e.message.contains(bad), "{}", e.message);
        }
    }
}
