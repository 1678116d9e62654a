//! The LAN: what to announce where, and claims heard.

use std::net::IpAddr;
use std::time::Duration;

use super::{Interface, MacAddr};

/// `announce.garp_count`, `announce.garp_interval` and
/// `announce.refresh_interval`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AnnounceConfig {
    /// Rounds per announcement; one round is an ARP request and an ARP
    /// reply, or one Neighbor Advertisement.
    pub count: u32,
    pub interval: Duration,
    /// One more round for every held VIP this often, for as long as it is
    /// held: switches that age MAC entries out within minutes, and clients
    /// that let a neighbour entry go stale without asking again, otherwise
    /// flood or lose a quiet VIP's traffic. Off by default: the kernel's
    /// own ARP answers keep ordinary networks current.
    pub refresh: Option<Duration>,
}

impl Default for AnnounceConfig {
    /// Three rounds half a second apart: a switch or host that drops the
    /// first (port still learning, queue full) gets two more chances within
    /// a second.
    fn default() -> Self {
        AnnounceConfig {
            count: 3,
            interval: Duration::from_millis(500),
            refresh: None,
        }
    }
}

/// Where and what to announce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    pub ifindex: u32,
    pub mac: MacAddr,
    pub ip: IpAddr,
}

impl Target {
    /// `None` when the interface has no Ethernet address to announce.
    pub fn on(interface: &Interface, ip: IpAddr) -> Option<Target> {
        Some(Target {
            ifindex: interface.index,
            mac: interface.mac?,
            ip,
        })
    }
}

/// A host on the wire saying it holds `ip`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Claim {
    pub ip: std::net::IpAddr,
    pub mac: MacAddr,
}
