//! Types shared by the allocator and the node agent: the `hostlb.io/v1`
//! custom resources, label selectors with Kubernetes' semantics and errors,
//! pool address ranges, and the annotation and label names of the contract.
//!
//! Nothing here talks to a cluster; both binaries build their decisions on
//! these plain values.
// One exception, documented where it is: `logging::quiet_on_closed_pipe`.
#![deny(unsafe_code)]

pub mod address;
pub mod annotations;
pub mod backlog;
pub mod crds;
#[cfg(feature = "logging")]
pub mod logging;
pub mod rules;
#[cfg(feature = "runtime")]
pub mod runtime;
pub mod scope;
pub mod selector;
pub mod snapshot;
pub mod v1;
mod validation;
#[cfg(feature = "watch")]
pub mod watch;

/// The version and the commit this build came from, e.g. `0.1.0+3f2a…`:
/// `--version`, the log, User-Agents and the NodeAgent record all say it.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "+", env!("HOSTLB_COMMIT"));

pub use address::{AddressError, AddressRange, Family, Prefix};
pub use scope::Scope;
pub use selector::{LabelSelector, Selector, SelectorError};
pub use v1::{
    IPAddressPool, IPAddressPoolSpec, L2Advertisement, L2AdvertisementSpec, NodeAgent,
    NodeAgentConflict, NodeAgentInterface, NodeAgentMove, NodeAgentStatus,
};
