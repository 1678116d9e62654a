//! The hostlb node agent: elects one node per VIP and holds the VIP as a
//! kernel address there.
#![deny(unsafe_code)]

pub mod addrs;
pub mod agent;
pub mod announce;
pub mod bounds;
pub mod drain;
pub mod election;
pub mod firewall;
pub mod gossip;
pub mod heap;
pub mod identity;
pub mod inputs;
pub mod model;
pub mod resident;
/// The agent core's seeded simulation and its checker: many cores on one
/// clock, beside the core and built only for its tests, the `sim` binary
/// and the `sim` feature, never into the agent.
#[cfg(any(test, feature = "sim"))]
#[doc(hidden)]
pub mod sim;
pub mod simulate;

/// The release and the commit it was built from (`api/build.rs`), as
/// `--version`, the log, gossip and the NodeAgent record show it.
pub use hostlb_api::VERSION;
