//! The parts of the `strata` command line that its tests reach from
//! outside the binary: how answers print (`output`, and `group` for the
//! group commands' answers). Everything else is in the binary (`main.rs`).

pub mod group;
pub mod output;
