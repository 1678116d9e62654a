//! What the agent's core reads, and the adapters fill: addresses and links
//! as the kernel has them, members as gossip shows them, claims heard on
//! the wire. Plain data: nothing here opens a socket or reads a clock, so
//! the core depends on these and on nothing that does.

mod addr;
mod firewall;
mod member;
mod wire;

pub use addr::{
    Applied, Gateway, Interface, Lifetime, MacAddr, OwnedAddress, UpstreamLost, VipAddress,
    solicited_node,
};
pub use firewall::{Firewall, FirewallPlan};
pub use member::{
    DEFAULT_PORT, LocalState, MemberInfo, MembershipView, PROTOCOL, PROTOCOL_DRAIN,
    PROTOCOL_IDENTITY, PROTOCOL_UNSAID, Status,
};
pub use wire::{AnnounceConfig, Claim, Target};
