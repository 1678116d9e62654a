//! The hostlb node agent: elects one node per VIP and holds the VIP as a
//! kernel address there.
#![deny(unsafe_code)]

pub mod addrs;
pub mod agent;
pub mod announce;
pub mod election;
pub mod gossip;
pub mod inputs;
pub mod simulate;
