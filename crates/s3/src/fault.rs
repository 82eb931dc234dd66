//! An object store in memory that fails on purpose, for crash tests that
//! need no S3 server (built with the `testing` feature only).
//!
//! A [`FaultStore`] keeps its objects in `object_store`'s `InMemory` and
//! passes every request through a plan:
//! - a **crash** ends the process as the store sees it: at the request a
//!   rule picks, either before it takes effect ([`Crash::Before`]) or after
//!   it did, its answer lost ([`Crash::After`]); from then on every request
//!   of that process fails, as none would arrive from a dead one.
//!   [`FaultStore::restart`] is the process coming back: a new client of
//!   the same objects, with no faults planned;
//! - **transient failures**, chosen by a seeded generator, fail a request
//!   now and then (half of them after it took effect), as a store answering
//!   503 or a connection lost before the answer.
//!
//! Create-only PUTs keep `InMemory`'s semantics (a second create of a key is
//! refused), which is what fencing relies on (FORMAT.md §11.1).

use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt as _, PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};

use crate::Backend;

/// A request, as the plan sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A PUT that replaces.
    Put,
    /// A create-only PUT.
    Create,
    Get,
    List,
    Delete,
    Copy,
}

impl Op {
    /// Whether the request changes what the store holds.
    pub fn mutates(self) -> bool {
        matches!(self, Op::Put | Op::Create | Op::Delete | Op::Copy)
    }
}

/// Where a crash cuts a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crash {
    /// The request never reaches the store.
    Before,
    /// The request takes effect; its answer is lost.
    After,
}

/// One request offered to a crash rule.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub op: Op,
    /// The object's key (with the datastore's prefix), or a listing's prefix.
    pub key: &'a str,
    /// Requests that changed the store before this one, in this process.
    pub mutations_before: u64,
}

type Rule = Box<dyn FnMut(&Request) -> Option<Crash> + Send>;

struct Plan {
    rng: StdRng,
    /// Transient failures per million requests.
    fail_ppm: u32,
    rule: Option<Rule>,
    /// What ended the process, once it has.
    crashed: Option<String>,
    mutations: u64,
    failures: u64,
}

/// An in-memory object store with planned crashes and failures.
#[derive(Clone)]
pub struct FaultStore {
    mem: Arc<InMemory>,
    plan: Arc<Mutex<Plan>>,
    seed: u64,
}

impl fmt::Display for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in-memory fault store (seed {})", self.seed)
    }
}

impl fmt::Debug for FaultStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FaultStore {
    /// An empty store with no faults planned; `seed` drives transient
    /// failures.
    pub fn new(seed: u64) -> Self {
        FaultStore::over(Arc::new(InMemory::new()), seed)
    }

    fn over(mem: Arc<InMemory>, seed: u64) -> Self {
        FaultStore {
            mem,
            plan: Arc::new(Mutex::new(Plan {
                rng: StdRng::seed_from_u64(seed),
                fail_ppm: 0,
                rule: None,
                crashed: None,
                mutations: 0,
                failures: 0,
            })),
            seed,
        }
    }

    /// This store as a client backend (`Options::backend`).
    pub fn backend(&self) -> Backend {
        Backend(Arc::new(self.clone()))
    }

    /// Crash where `rule` says, at the first request it answers Some for.
    pub fn crash_when(&self, rule: impl FnMut(&Request) -> Option<Crash> + Send + 'static) {
        self.plan.lock().unwrap().rule = Some(Box::new(rule));
    }

    /// Crash at the `n`-th request (from 0) that changes the store.
    pub fn crash_at_mutation(&self, n: u64, how: Crash) {
        self.crash_when(move |r| (r.op.mutates() && r.mutations_before == n).then_some(how));
    }

    /// Crash at the `nth` (from 0) request changing a key that contains
    /// `part` (a datastore's `/s/` for segments, `/m/` for manifests ...).
    pub fn crash_at_key(&self, part: &'static str, nth: usize, how: Crash) {
        let mut seen = 0;
        self.crash_when(move |r| {
            if !r.op.mutates() || !r.key.contains(part) {
                return None;
            }
            seen += 1;
            (seen == nth + 1).then_some(how)
        });
    }

    /// Fail about `per_million` of every million requests, at random from
    /// the seed (half after the request took effect).
    pub fn fail_randomly(&self, per_million: u32) {
        self.plan.lock().unwrap().fail_ppm = per_million;
    }

    /// The request the process crashed at, once it has.
    pub fn crashed(&self) -> Option<String> {
        self.plan.lock().unwrap().crashed.clone()
    }

    /// Requests that changed the store so far, in this process.
    pub fn mutations(&self) -> u64 {
        self.plan.lock().unwrap().mutations
    }

    /// Transient failures injected so far.
    pub fn failures(&self) -> u64 {
        self.plan.lock().unwrap().failures
    }

    /// The process again after a crash: the same objects, no faults. The
    /// crashed client keeps failing every request.
    pub fn restart(&self) -> FaultStore {
        FaultStore::over(self.mem.clone(), self.seed)
    }

    /// Every key in the store and its size, in key order.
    pub fn objects(&self) -> Vec<(String, u64)> {
        let mem = self.mem.clone();
        let list = async move {
            let mut all: Vec<(String, u64)> = mem
                .list(None)
                .map(|m| m.map(|m| (m.location.to_string(), m.size)))
                .collect::<Vec<_>>()
                .await
                .into_iter()
                .collect::<object_store::Result<_>>()
                .unwrap_or_default();
            all.sort();
            all
        };
        futures::executor::block_on(list)
    }

    /// Decide the fate of one request: an error if the process is gone or
    /// the request fails now; `Some(After)` if it is to take effect and then
    /// fail.
    fn admit(&self, op: Op, key: &str) -> object_store::Result<Option<Crash>> {
        let mut p = self.plan.lock().unwrap();
        if let Some(at) = &p.crashed {
            return Err(gone(format!("the process crashed at {at}")));
        }
        let req = Request {
            op,
            key,
            mutations_before: p.mutations,
        };
        let crash = p.rule.as_mut().and_then(|rule| rule(&req));
        if crash.is_some() {
            p.crashed = Some(format!("{op:?} {key}"));
        }
        let transient = crash.is_none() && p.fail_ppm > 0 && {
            let ppm = p.fail_ppm;
            p.rng.gen_range(0..1_000_000) < ppm
        };
        let fate = match crash {
            Some(Crash::Before) => return Err(gone(format!("crash before {op:?} {key}"))),
            Some(Crash::After) => Some(Crash::After),
            None if transient => {
                p.failures += 1;
                if p.rng.gen_bool(0.5) {
                    return Err(unavailable(op, key));
                }
                Some(Crash::After)
            }
            None => None,
        };
        if op.mutates() {
            p.mutations += 1;
        }
        Ok(fate)
    }

    /// The answer of a request admitted with `fate`.
    fn answer<T>(
        &self,
        fate: Option<Crash>,
        op: Op,
        key: &str,
        r: object_store::Result<T>,
    ) -> object_store::Result<T> {
        match fate {
            Some(_) if self.crashed().is_some() => {
                Err(gone(format!("crash after {op:?} {key} took effect")))
            }
            Some(_) => Err(unavailable(op, key)),
            None => r,
        }
    }
}

impl FaultStore {
    /// A listing's fate, decided before the first page.
    fn admit_list(&self, prefix: Option<&Path>) -> object_store::Result<()> {
        let key = prefix.map_or("", |p| p.as_ref());
        let fate = self.admit(Op::List, key)?;
        self.answer(fate, Op::List, key, Ok(()))
    }
}

fn gone(what: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "fault",
        source: format!("no answer: {what} (crash test)").into(),
    }
}

/// A passing server error, retried by the client like S3's 503.
fn unavailable(op: Op, key: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "fault",
        source: format!("{op:?} {key}: status code: 503 (injected)").into(),
    }
}

#[async_trait]
impl ObjectStore for FaultStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        let op = if matches!(opts.mode, PutMode::Create) {
            Op::Create
        } else {
            Op::Put
        };
        let fate = self.admit(op, location.as_ref())?;
        let r = self.mem.put_opts(location, payload, opts).await;
        self.answer(fate, op, location.as_ref(), r)
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        _opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        Err(object_store::Error::NotImplemented {
            operation: format!("multipart upload of {location}"),
            implementer: self.to_string(),
        })
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let fate = self.admit(Op::Get, location.as_ref())?;
        let r = self.mem.get_opts(location, options).await;
        self.answer(fate, Op::Get, location.as_ref(), r)
    }

    async fn get_ranges(
        &self,
        location: &Path,
        ranges: &[Range<u64>],
    ) -> object_store::Result<Vec<Bytes>> {
        let fate = self.admit(Op::Get, location.as_ref())?;
        let r = self.mem.get_ranges(location, ranges).await;
        self.answer(fate, Op::Get, location.as_ref(), r)
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let me = self.clone();
        locations
            .then(move |p| {
                let me = me.clone();
                async move {
                    let p = p?;
                    let fate = me.admit(Op::Delete, p.as_ref())?;
                    let r = me.mem.delete(&p).await.map(|()| p.clone());
                    me.answer(fate, Op::Delete, p.as_ref(), r)
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.admit_list(prefix) {
            Ok(()) => self.mem.list(prefix),
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        }
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        match self.admit_list(prefix) {
            Ok(()) => self.mem.list_with_offset(prefix, offset),
            Err(e) => stream::once(async move { Err(e) }).boxed(),
        }
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let key = prefix.map_or("", |p| p.as_ref());
        let fate = self.admit(Op::List, key)?;
        let r = self.mem.list_with_delimiter(prefix).await;
        self.answer(fate, Op::List, key, r)
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let fate = self.admit(Op::Copy, to.as_ref())?;
        let r = self.mem.copy_opts(from, to, options).await;
        self.answer(fate, Op::Copy, to.as_ref(), r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, ObjectStore as Client, Options, Put, StoreUrl};

    fn client(f: &FaultStore) -> Client {
        let opts = Options {
            backend: Some(f.backend()),
            ..Options::default()
        };
        Client::connect(&StoreUrl::parse("s3://mem/ds").unwrap(), &opts).unwrap()
    }

    #[test]
    fn a_crash_after_a_put_keeps_it_and_fails_everything_after() {
        let f = FaultStore::new(1);
        let c = client(&f);
        c.put("a", Bytes::from_static(b"1")).unwrap();
        f.crash_at_key("m/", 1, Crash::After);
        assert_eq!(
            c.put_create("m/1", Bytes::from_static(b"x")).unwrap(),
            Put::Created
        );
        let e = c.put_create("m/2", Bytes::from_static(b"y")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
        assert!(e.message.contains("crash after Create"), "{e}");
        let e = c.get("a").unwrap_err();
        assert!(e.message.contains("crashed at Create ds/m/2"), "{e}");
        assert_eq!(f.crashed().as_deref(), Some("Create ds/m/2"));

        let c = client(&f.restart());
        assert_eq!(c.get("m/2").unwrap(), Bytes::from_static(b"y"));
        let keys: Vec<String> = c
            .list("", None)
            .unwrap()
            .into_iter()
            .map(|l| l.key)
            .collect();
        assert_eq!(keys, ["a", "m/1", "m/2"]);
    }

    #[test]
    fn a_crash_before_a_put_loses_it_and_creates_stay_exclusive() {
        let f = FaultStore::new(2);
        let c = client(&f);
        assert_eq!(
            c.put_create("k", Bytes::from_static(b"1")).unwrap(),
            Put::Created
        );
        assert_eq!(
            c.put_create("k", Bytes::from_static(b"2")).unwrap(),
            Put::Exists
        );
        f.crash_at_mutation(f.mutations(), Crash::Before);
        assert!(c.delete("k").is_err());
        let c = client(&f.restart());
        assert_eq!(c.get("k").unwrap(), Bytes::from_static(b"1"));
    }

    #[test]
    fn transient_failures_are_seeded_and_retried_creates_find_their_bytes() {
        let run = |seed| {
            let f = FaultStore::new(seed);
            f.fail_randomly(300_000);
            let c = client(&f);
            let outcomes: Vec<bool> = (0..64)
                .map(|i| c.put(&format!("p/{i}"), Bytes::from_static(b"v")).is_ok())
                .collect();
            // A create-only PUT whose answer was lost is retried and then
            // reads its own bytes back: created, exactly once.
            for i in 0..64 {
                let r = c.put_create(&format!("c/{i}"), Bytes::from(format!("{i}")));
                if let Ok(put) = r {
                    assert_eq!(put, Put::Created);
                }
            }
            (outcomes, f.failures())
        };
        let (a, fa) = run(7);
        assert_eq!(
            run(7),
            (a.clone(), fa),
            "the same seed fails the same requests"
        );
        assert!(a.iter().any(|ok| !ok) && a.iter().any(|ok| *ok), "{a:?}");
    }
}
