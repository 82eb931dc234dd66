//! strata's server: what a datastore of either kind answers, and the
//! process that serves it.
//!
//! The requests and answers (the control protocol's types, their framing
//! and client, the `--json` documents) are strata-api's: a client links
//! that, not this crate.
//!
//! - [`ops`]: one request against one datastore, through
//!   `strata_datastore::Datastore` (the CLI runs it in its own process when
//!   no server holds the datastore); [`vmdk_ops`] the VMDK files';
//!   [`changes`] `diff` for incremental backups, [`bitmaps`] the same as
//!   NBD `qemu:dirty-bitmap:` contexts.
//! - [`serve`]: the running server: exports over NBD, vhost-user-blk and
//!   FUSE, the control socket ([`control`]), jobs ([`jobs`]), placement and
//!   moves ([`placement`], [`moving`]), HTTP ([`web`]: metrics, dashboard,
//!   API), and a clean shutdown; [`logging`] where its log events go;
//!   [`events`] the event log (who changed what, kept in the datastore).
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

mod alarm_reports;
pub mod bitmaps;
pub mod changes;
pub mod clients;
pub mod cloning;
pub mod control;
mod copier;
mod dependents;
pub mod diff_files;
pub mod events;
pub mod groups;
pub mod holders;
mod imports;
pub mod jobs;
pub mod logging;
mod luks_ops;
mod move_settings;
pub mod moving;
pub mod object_store;
pub mod ops;
pub mod placement;
pub mod rbd_diff;
pub mod serve;
pub mod slot;
pub mod vmdk_ops;
pub mod web;
