//! The hostlb node agent: elects one node per VIP and holds the VIP as a
//! kernel address there.
#![forbid(unsafe_code)]

pub mod election;
pub mod inputs;
pub mod simulate;
