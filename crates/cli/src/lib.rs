//! The part of the `strata` command line that its tests reach from
//! outside the binary: how answers print (`output`). Everything else is
//! in the binary (`main.rs`).
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::too_many_arguments))] // unit tests are outside the ratchet

pub mod output;
