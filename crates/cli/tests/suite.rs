//! The command-line tool's integration tests, one binary: each file of
//! this directory is a module of it (`cargo test -p strata --test suite
//! MODULE::`), sharing the helpers of `common/` and one SeaweedFS per run.
//! One binary instead of one per file: they linked the same dependencies
//! 37 times (`make test` lists the tests and runs each module as an item
//! of its own, scripts/run-tests.py).
#![allow(clippy::too_many_lines, clippy::too_many_arguments)] // test code is outside the ratchet (crates/tidy)

mod common;
// The vhost-user-blk test frontend of crates/vhost's tests.
#[path = "../../vhost/tests/common/mod.rs"]
mod vfront;

mod alarms;
mod backup;
mod backup_scripts;
mod bench_quick;
mod cache;
mod cli;
mod clients;
mod clone;
mod compress;
mod dashboard;
mod dedup;
mod defrag;
mod encryption;
mod events;
mod fuse;
mod groups;
mod guest;
mod hostile;
mod interlocks;
mod limits;
mod r#move;
mod nbd_protocol;
mod nbd_stress;
mod nbd_unaligned;
mod objstore;
mod output;
mod package;
mod power_cut;
mod provisioning;
mod schedules;
mod stats;
mod three_hosts;
mod tls;
mod vhost;
mod vmdk;
mod vmdk_lock;
mod vmdk_shrink_online;
