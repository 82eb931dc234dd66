//! Object-store datastores through the CLI, against a real SeaweedFS on
//! loopback: `init --object-store` on one host, `attach` from another, and
//! every refusal a user can run into on the way.

mod common;

use std::process::Command;

use common::strata;
use strata_objstore::{testing, Bytes, ObjectStore, Options, StoreUrl};

/// One host: its own local directory (`Host::empty()`).
use common::Store as Host;

/// A fresh prefix in the test bucket, or None when SeaweedFS is missing.
fn url(name: &str) -> Option<String> {
    testing::shared()?;
    Some(format!(
        "s3://strata-cli-test/{name}-{:08x}",
        rand::random::<u32>()
    ))
}

#[test]
fn init_on_one_host_and_attach_from_another() {
    let Some(u) = url("two-hosts") else { return };
    let a = Host::empty();
    let out = a.ok(&["init", "--object-store", &u]);
    assert!(
        out.contains(&format!("initialised object-store datastore {u}")),
        "{out}"
    );
    assert!(
        out.contains("conditional writes: honoured (1 of 8 concurrent creates"),
        "{out}"
    );
    assert!(a.path().join("strata.objstore").exists());

    let b = Host::empty();
    let j = b.json(&["attach", "--object-store", &u]);
    let sa = a.json(&["status"]);
    assert_eq!(j["root"]["uuid"], sa["root"]["uuid"], "the same datastore");
    assert_ne!(
        j["me"]["host"], sa["me"]["host"],
        "two hosts, two identities"
    );
    assert_eq!(j["root"]["created_by"], sa["me"], "A created it");
    assert_eq!(j["disks"], serde_json::json!([]));
    assert_eq!(j["probe"]["accepted"], 1);

    // Attaching again (same directory, same store) keeps the identity; a
    // deleted local directory is simply made again.
    let again = b.json(&["attach", "--object-store", &u]);
    assert_eq!(again["me"], j["me"]);
    std::fs::remove_dir_all(b.path()).unwrap();
    let fresh = b.json(&["attach", "--object-store", &u]);
    assert_eq!(fresh["root"]["uuid"], sa["root"]["uuid"]);
    let st = b.ok(&["status"]);
    assert!(st.contains(&format!("datastore:    {u} (id ")), "{st}");
    assert!(st.contains("disks:        none"), "{st}");
}

#[test]
fn init_refuses_a_prefix_in_use_and_attach_one_that_is_empty() {
    let Some(u) = url("refusals") else { return };
    let a = Host::empty();
    let e = a.fails(&["attach", "--object-store", &u]);
    assert!(e.contains(&format!("no strata datastore at {u}")), "{e}");
    assert!(e.contains("strata init --object-store"), "{e}");
    assert!(
        !a.path().join("strata.objstore").exists(),
        "nothing written on refusal"
    );

    a.ok(&["init", "--object-store", &u]);
    let b = Host::empty();
    let e = b.fails(&["init", "--object-store", &u]);
    assert!(e.contains("already holds strata datastore"), "{e}");
    assert!(e.contains("strata attach --object-store"), "{e}");

    // A prefix that holds someone else's objects.
    let other = url("foreign").unwrap();
    let store =
        ObjectStore::connect(&StoreUrl::parse(&other).unwrap(), &Options::default()).unwrap();
    store
        .put("backups/vm1.img", Bytes::from_static(b"not strata"))
        .unwrap();
    let e = b.fails(&["init", "--object-store", &other]);
    assert!(e.contains("is not empty (it holds backups/vm1.img)"), "{e}");

    // The same directory for a second store, or for a local datastore.
    let e = a.fails(&["attach", "--object-store", &other]);
    assert!(
        e.contains(&format!("already the local directory of {u}")),
        "{e}"
    );
    let local = common::Store::new();
    let o = Command::new(strata())
        .arg("--datastore")
        .arg(local.path())
        .args(["init", "--object-store", &u])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("holds a local datastore"), "{e}");

    for bad in ["s3://x", "http://host/bucket", "s3://Bad_Bucket/p"] {
        let e = b.fails(&["init", "--object-store", bad]);
        assert!(e.contains("is not an object-store URL"), "{bad}: {e}");
    }
    let e = b.fails(&["init", "--object-store", &u, "--capacity", "1G"]);
    assert!(e.contains("cannot be used with"), "{e}");
}

#[test]
fn other_commands_say_they_do_not_work_on_object_stores_yet() {
    let Some(u) = url("not-yet") else { return };
    let a = Host::empty();
    a.ok(&["init", "--object-store", &u]);
    let e = a.fails(&["list"]);
    assert!(
        e.contains("'list' does not work on object-store datastores yet"),
        "{e}"
    );
    let e = a.fails(&["create", "d", "--size", "1G"]);
    assert!(e.contains("'create' does not work"), "{e}");
    let e = a.fails(&["serve", "--nbd-unix", "/nonexistent/x.sock"]);
    assert!(e.contains("'serve' does not work"), "{e}");
    // A local datastore is not made beside it.
    let e = a.fails(&["init"]);
    assert!(
        e.contains("a local datastore needs a directory of its own"),
        "{e}"
    );
    assert!(!a.path().join("strata.super").exists());
}

#[test]
fn wrong_credentials_are_named() {
    let Some(u) = url("creds") else { return };
    let a = Host::empty();
    let o = Command::new(strata())
        .arg("--datastore")
        .arg(a.path())
        .args(["init", "--object-store", &u])
        .env("AWS_SECRET_ACCESS_KEY", "wrong")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("AWS_SECRET_ACCESS_KEY"), "{e}");
    assert!(!a.path().join("strata.objstore").exists());
}
