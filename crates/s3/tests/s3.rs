//! The client against a real SeaweedFS on loopback: create-only writes
//! hold under concurrency, listings and ranges are exact, and a store that
//! is down is a prompt, named error.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_s3::testing;
use strata_s3::{Bytes, ErrorKind, ObjectStore, Options, Put, StoreUrl};

fn store(prefix: &str) -> Option<ObjectStore> {
    testing::shared()?;
    let url = StoreUrl::parse(&format!("s3://strata-s3-test/{prefix}")).unwrap();
    Some(ObjectStore::connect(&url, &Options::default()).unwrap())
}

#[test]
fn seaweedfs_passes_the_conditional_write_probe() {
    let Some(s) = store("probe") else { return };
    let r = s.probe().unwrap();
    assert_eq!((r.racers, r.accepted), (8, 1));
    assert!(
        s.list("probe/", None).unwrap().is_empty(),
        "probe object left behind"
    );
}

#[test]
fn a_create_only_write_succeeds_once_and_recognises_its_own_retry() {
    let Some(s) = store("create") else { return };
    let a = Bytes::from_static(b"first writer");
    assert_eq!(s.put_create("m/1", a.clone()).unwrap(), Put::Created);
    assert_eq!(
        s.put_create("m/1", Bytes::from_static(b"second writer"))
            .unwrap(),
        Put::Exists
    );
    // The same bytes again: an earlier attempt of this very write.
    assert_eq!(s.put_create("m/1", a.clone()).unwrap(), Put::Created);
    assert_eq!(s.get("m/1").unwrap(), a);
}

#[test]
fn of_32_concurrent_creates_of_one_key_exactly_one_wins() {
    let Some(s) = store("race") else { return };
    let s = Arc::new(s);
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                let body = Bytes::from(format!("claim by racer {i}"));
                (i, s.put_create("m/0000000000000002", body).unwrap())
            })
        })
        .collect();
    let won: Vec<usize> = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .filter(|(_, p)| *p == Put::Created)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(won.len(), 1, "winners: {won:?}");
    assert_eq!(
        s.get("m/0000000000000002").unwrap(),
        Bytes::from(format!("claim by racer {}", won[0]))
    );
}

#[test]
fn listings_ranges_and_deletes_are_exact() {
    let Some(s) = store("list") else { return };
    for k in ["d/m/0003", "d/m/0001", "d/m/0002", "d/mx", "d/s/0001"] {
        s.put(k, Bytes::from(k.as_bytes().to_vec())).unwrap();
    }
    let keys = |v: Vec<strata_s3::Listed>| v.into_iter().map(|l| l.key).collect::<Vec<_>>();
    assert_eq!(
        keys(s.list("d/m/", None).unwrap()),
        ["d/m/0001", "d/m/0002", "d/m/0003"]
    );
    assert_eq!(
        keys(s.list("d/m/", Some("d/m/0001")).unwrap()),
        ["d/m/0002", "d/m/0003"]
    );
    let l = s.list("d/s/", None).unwrap();
    assert_eq!((l[0].size, l.len()), (8, 1));
    assert!(l[0].modified_ms > 1_600_000_000_000);
    assert_eq!(&s.get_range("d/m/0002", 2..5).unwrap()[..], b"m/0");
    let e = s.get_range("d/m/0002", 2..500).unwrap_err();
    assert_eq!(
        (
            e.place.object.as_deref(),
            e.place.op.as_deref(),
            e.place.offset
        ),
        (
            Some("s3://strata-s3-test/list/d/m/0002"),
            Some("get"),
            Some(2)
        ),
        "{e}"
    );
    s.delete("d/m/0002").unwrap();
    s.delete("d/m/0002").unwrap();
    assert_eq!(s.get_opt("d/m/0002").unwrap(), None);
    let e = s.get("d/m/0002").unwrap_err();
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(
        e.to_string()
            .starts_with("s3://strata-s3-test/list/d/m/0002: get: "),
        "{e}"
    );
}

#[test]
fn wrong_credentials_are_refused_by_name() {
    let Some(fs) = testing::shared() else { return };
    let url = StoreUrl::parse("s3://strata-s3-test/denied").unwrap();
    // Signed with a secret the store does not know.
    let s = ObjectStore::connect(
        &url,
        &Options {
            credentials: Some((testing::ACCESS_KEY.into(), "not-the-secret".into())),
            ..Options::default()
        },
    )
    .unwrap();
    let e = s.put("x", Bytes::from_static(b"x")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e} ({})", fs.endpoint);
    assert!(e.message.contains("credentials refused"), "{}", e.message);
    assert!(e.message.contains("AWS_SECRET_ACCESS_KEY"), "{}", e.message);
}

#[test]
fn a_store_that_is_down_is_a_prompt_named_error() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let url = StoreUrl::parse("s3://strata-s3-test/down").unwrap();
    let s = ObjectStore::connect(
        &url,
        &Options {
            request_timeout: Duration::from_secs(1),
            op_timeout: Duration::from_secs(3),
            retries: 2,
            endpoint: Some(endpoint.clone()),
            credentials: None,
            backend: None,
        },
    )
    .unwrap();
    let t0 = Instant::now();
    let e = s.put_create("m/1", Bytes::from_static(b"x")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
    assert!(e.message.contains(&endpoint), "{}", e.message);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}

#[test]
fn an_outage_is_a_prompt_error_and_the_client_recovers_after_it() {
    use testing::{Fault, FaultProxy};
    let Some(fs) = testing::shared() else { return };
    let proxy = FaultProxy::start(fs.endpoint.trim_start_matches("http://"));
    let url = StoreUrl::parse("s3://strata-s3-test/outage").unwrap();
    let s = ObjectStore::connect(
        &url,
        &Options {
            request_timeout: Duration::from_secs(1),
            op_timeout: Duration::from_secs(4),
            retries: 2,
            endpoint: Some(proxy.endpoint.clone()),
            credentials: None,
            backend: None,
        },
    )
    .unwrap();
    s.put("a", Bytes::from_static(b"before")).unwrap();
    for fault in [Fault::Unavailable, Fault::Stall] {
        proxy.set(fault);
        let t0 = Instant::now();
        let e = s
            .put_create("m/1", Bytes::from_static(b"during"))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable, "{fault:?}: {e}");
        assert!(e.message.contains(&proxy.endpoint), "{}", e.message);
        assert!(
            t0.elapsed() < Duration::from_secs(8),
            "{fault:?}: {:?}",
            t0.elapsed()
        );
        let e = s.get("a").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable, "{fault:?}: {e}");
    }
    proxy.set(Fault::Pass);
    assert_eq!(&s.get("a").unwrap()[..], b"before");
    // Nothing was created during the outage: the create goes through now.
    assert_eq!(
        s.put_create("m/1", Bytes::from_static(b"after")).unwrap(),
        Put::Created
    );
}

/// SeaweedFS sometimes carries out a create-only PUT and answers it 500.
/// The probe must still decide, even when every racer is answered so (the
/// winner is then known only from the object), and a create must report
/// its own success.
#[test]
fn creates_answered_500_after_they_took_effect_are_decided_by_the_object() {
    use testing::{Fault, FaultProxy};
    let Some(fs) = testing::shared() else { return };
    let proxy = FaultProxy::start(fs.endpoint.trim_start_matches("http://"));
    let url = StoreUrl::parse("s3://strata-s3-test/passing-500").unwrap();
    let s = ObjectStore::connect(
        &url,
        &Options {
            endpoint: Some(proxy.endpoint.clone()),
            ..Options::default()
        },
    )
    .unwrap();
    proxy.set(Fault::PassThenFail(8));
    let r = s.probe().unwrap();
    assert_eq!((r.racers, r.accepted), (8, 1));
    assert!(s.list("probe/", None).unwrap().is_empty());

    proxy.set(Fault::PassThenFail(1));
    assert_eq!(
        s.put_create("m/1", Bytes::from_static(b"mine")).unwrap(),
        Put::Created
    );
    assert_eq!(&s.get("m/1").unwrap()[..], b"mine");
    proxy.set(Fault::PassThenFail(1));
    assert_eq!(
        s.put_create("m/1", Bytes::from_static(b"other")).unwrap(),
        Put::Exists
    );
}
