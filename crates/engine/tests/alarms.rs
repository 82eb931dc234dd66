//! Capacity changes (`grow`) and alarms through the engine's API: alarms
//! move ok → warning → alarm as data is written and disks are created, and
//! back after the capacity grows; the capacity and the thresholds survive a
//! reopen, and a crash at any write of the capacity change leaves the old
//! capacity or (once the call returned) the new one.
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;

use std::sync::Arc;

use strata_block::BlockDevice;
use strata_engine::{
    AlarmKind, AlarmRule, AlarmState, Datastore, DatastoreInfo, ErrorKind, InitOptions,
    Provisioning,
};
use strata_storage::SimBackend;

const MIB: u64 = 1 << 20;

fn state(i: &DatastoreInfo, kind: AlarmKind) -> AlarmState {
    i.alarms
        .iter()
        .find(|a| a.kind == kind)
        .unwrap_or_else(|| panic!("no {kind:?} alarm in {:?}", i.alarms))
        .state
}

fn states(ds: &Datastore) -> (AlarmState, AlarmState) {
    let i = ds.info();
    (
        state(&i, AlarmKind::Usage),
        state(&i, AlarmKind::Overcommit),
    )
}

fn new_store(capacity_bytes: u64) -> (SimBackend, Datastore) {
    let b = SimBackend::new();
    Datastore::init(Arc::new(b.clone()), &InitOptions { capacity_bytes }).unwrap();
    let ds = common::open_sim(&b);
    (b, ds)
}

fn write_mib(ds: &Datastore, disk: &str, from_mib: u64, mib: u64, byte: u8) {
    let h = ds.open_disk(disk).unwrap();
    for i in from_mib..from_mib + mib {
        h.write_at(&vec![byte; MIB as usize], i * MIB, false)
            .unwrap();
    }
    h.flush().unwrap();
}

#[test]
fn alarms_move_up_with_usage_and_overcommit_and_back_after_grow() {
    use AlarmState::*;
    let (b, ds) = new_store(16 * MIB);
    let i = ds.info();
    assert!(!i.capacity_follows_fs);
    assert_eq!(i.alarms.len(), 2);
    assert_eq!(states(&ds), (Ok, Ok));

    // Over-allocation: 8 + 12 MiB of thin disks on 16 MiB is 125%.
    ds.create_disk("a", 8 * MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    assert_eq!(states(&ds), (Ok, Ok));
    ds.create_disk("b", 12 * MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    assert_eq!(ds.info().overcommit_percent, 125);
    assert_eq!(states(&ds), (Ok, Warning));

    // Usage: 11 MiB of data (< 75% of 16 MiB even with map nodes), then
    // 12 MiB (75%), then 14 MiB (87.5%).
    write_mib(&ds, "a", 0, 8, 1);
    write_mib(&ds, "b", 0, 3, 2);
    let i = ds.info();
    assert!(i.used_percent < 75, "{i:?}");
    assert_eq!(state(&i, AlarmKind::Usage), Ok);
    write_mib(&ds, "b", 3, 1, 3);
    let i = ds.info();
    assert!((75..85).contains(&i.used_percent), "{i:?}");
    assert_eq!(states(&ds), (Warning, Warning));
    write_mib(&ds, "b", 4, 2, 4);
    assert!(ds.info().used_percent >= 85);
    assert_eq!(states(&ds), (Alarm, Warning));

    // 40 MiB provisioned on 16: 250%.
    ds.create_disk("c", 20 * MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    assert_eq!(states(&ds), (Alarm, Alarm));

    // A capacity below used + reserved is refused and changes nothing.
    let e = ds.set_capacity(8 * MIB).unwrap_err();
    assert_eq!(e.kind, ErrorKind::NoSpace, "{e}");
    assert!(e.message.contains("used"), "{}", e.message);
    assert_eq!(ds.info().capacity_bytes, 16 * MIB);

    // Grow to 64 MiB: 14 MiB used is 21%, 40 MiB provisioned 62%.
    let i = ds.set_capacity(64 * MIB).unwrap();
    assert_eq!(i.capacity_bytes, 64 * MIB);
    assert_eq!(states(&ds), (Ok, Ok));

    // A thick reservation counts as used: 14 + 40 MiB of 64 is 84%.
    ds.create_disk("t", 40 * MIB, Provisioning::Zeroedthick, &mut |_, _| {})
        .unwrap();
    let i = ds.info();
    assert_eq!(i.reserved_bytes, 40 * MIB);
    assert_eq!(state(&i, AlarmKind::Usage), Warning);
    // ...and a capacity that would not hold it is refused.
    assert_eq!(
        ds.set_capacity(48 * MIB).unwrap_err().kind,
        ErrorKind::NoSpace
    );
    // Lowering to just what is needed is allowed.
    let needed = i.used_bytes + i.reserved_bytes;
    assert_eq!(ds.set_capacity(needed).unwrap().used_percent, 100);
    ds.set_capacity(128 * MIB).unwrap();

    // The capacity survives a clean reopen and a crash after it returned.
    ds.close().unwrap();
    drop(ds);
    let ds = common::open_sim(&b);
    assert_eq!(ds.info().capacity_bytes, 128 * MIB);
    ds.set_capacity(96 * MIB).unwrap();
    drop(ds);
    b.crash(5);
    let ds = common::open_sim(&b);
    assert_eq!(ds.info().capacity_bytes, 96 * MIB);
    let r = ds.check().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);

    // Following the file system again (the simulator reports no limit).
    let i = ds.set_capacity(0).unwrap();
    assert!(i.capacity_follows_fs);
    assert!(i.capacity_bytes > 1 << 40);
    drop(ds);
    b.crash(6);
    assert!(common::open_sim(&b).info().capacity_follows_fs);
}

#[test]
fn thresholds_are_kept_in_the_catalog_and_checked() {
    let (b, ds) = new_store(100 * MIB);
    assert_eq!(
        ds.alarm_rules(),
        vec![
            AlarmKind::Usage.default_rule(),
            AlarmKind::Overcommit.default_rule()
        ]
    );
    ds.create_disk("a", 30 * MIB, Provisioning::Thin, &mut |_, _| {})
        .unwrap();
    write_mib(&ds, "a", 0, 25, 7);
    assert_eq!(states(&ds), (AlarmState::Ok, AlarmState::Ok));
    let rule = AlarmRule {
        kind: AlarmKind::Usage,
        warning_percent: 20,
        alarm_percent: 50,
        exec: Some("echo \"$STRATA_ALARM_STATE\" >> /tmp/x".into()),
    };
    assert_eq!(ds.set_alarm(rule.clone()).unwrap(), rule);
    assert_eq!(states(&ds).0, AlarmState::Warning);
    ds.set_alarm(AlarmRule {
        kind: AlarmKind::Overcommit,
        warning_percent: 10,
        alarm_percent: 30,
        exec: None,
    })
    .unwrap();
    assert_eq!(states(&ds).1, AlarmState::Alarm);
    // Bad thresholds: refused, nothing changes.
    for (w, a) in [(0, 10), (60, 50), (50, 101)] {
        let e = ds
            .set_alarm(AlarmRule {
                kind: AlarmKind::Usage,
                warning_percent: w,
                alarm_percent: a,
                exec: None,
            })
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    }
    assert_eq!(ds.alarm_rules()[0], rule);
    // Durable when set_alarm returns: a crash keeps them.
    drop(ds);
    b.crash(1);
    let ds = common::open_sim(&b);
    let rules = ds.alarm_rules();
    assert_eq!(rules[0], rule);
    assert_eq!(rules[1].warning_percent, 10);
    assert_eq!(states(&ds), (AlarmState::Warning, AlarmState::Alarm));
    // The data is what was written.
    let h = ds.open_disk("a").unwrap();
    let mut buf = vec![0u8; MIB as usize];
    h.read_at(&mut buf, 24 * MIB).unwrap();
    assert!(buf.iter().all(|&x| x == 7));
}

/// A crash at each write of a capacity change: before the call returns the
/// datastore opens with the old capacity or the new one, never anything
/// else, and nothing written before is lost; after it returns, the new one.
#[test]
fn a_crash_during_grow_keeps_the_old_capacity_or_the_new() {
    let mut saw_old = false;
    let mut saw_refused = 0;
    for n in 0.. {
        let (b, ds) = new_store(16 * MIB);
        ds.create_disk("a", 8 * MIB, Provisioning::Thin, &mut |_, _| {})
            .unwrap();
        write_mib(&ds, "a", 0, 4, 9);
        b.fail_writes_after(n);
        let r = ds.set_capacity(32 * MIB);
        drop(ds);
        b.crash(n);
        let ds = common::open_sim(&b);
        let cap = ds.info().capacity_bytes;
        match r {
            Ok(_) => assert_eq!(cap, 32 * MIB, "returned, then lost (n = {n})"),
            Err(_) => {
                saw_refused += 1;
                assert!(
                    cap == 16 * MIB || cap == 32 * MIB,
                    "capacity {cap} (n = {n})"
                );
                saw_old |= cap == 16 * MIB;
            }
        }
        let h = ds.open_disk("a").unwrap();
        let mut buf = vec![0u8; (4 * MIB) as usize];
        h.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&x| x == 9), "data lost (n = {n})");
        let report = ds.check().unwrap();
        assert!(report.is_clean(), "n = {n}: {:#?}", report.errors);
        if r.is_ok() {
            break;
        }
        assert!(n < 1000, "the capacity change never completed");
    }
    assert!(saw_old && saw_refused > 0);
}
