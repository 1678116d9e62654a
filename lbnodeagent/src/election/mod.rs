//! The election (SPEC §5): for every VIP, which node answers for it.
//!
//! Pure and synchronous: no clock, no I/O, no Kubernetes or netlink types.
//! Every agent computes the whole election from the same [`view`] and so
//! reaches the same answer; only the winner acts. The rules live in
//! `engine::Compiled::exclusion` and the ordering in `engine::Compiled::order`;
//! everything else is bookkeeping to make a recompute cheap.

mod engine;
mod hash;
mod node;
mod report;
pub mod view;

pub use engine::{Duty, Election, elect_all};
pub use hash::{order_key, rank_key};
pub use node::NodeName;
pub use report::{Candidate, Excluded, Note, Reason, VipReport};
pub use view::{
    Advertisement, Cluster, Endpoints, Labels, Member, NodeInfo, OnLink, Pool, Preference,
    Protocol, ServiceInfo, ServicePort,
};

#[cfg(test)]
mod tests;
