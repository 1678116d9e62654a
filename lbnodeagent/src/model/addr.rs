//! Addresses and links, as the kernel has them.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;
use std::{fmt, str::FromStr};

use hostlb_api::{Family, Prefix};

/// The solicited-node multicast group of `ip` (RFC 4291 2.7.1):
/// `ff02::1:ff00:0/104` and the address's low 24 bits. Neighbour
/// solicitations for `ip` go there, and a host answers them only once it
/// has joined it.
pub fn solicited_node(ip: Ipv6Addr) -> Ipv6Addr {
    let t = ip.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(t[13]),
        u16::from_be_bytes([t[14], t[15]]),
    )
}

/// An Ethernet address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// `None` unless `bytes` is a 6-byte hardware address: tunnels and
    /// point-to-point links have none, and nothing can be announced on them.
    pub fn from_slice(bytes: &[u8]) -> Option<MacAddr> {
        <[u8; 6]>::try_from(bytes).ok().map(MacAddr)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<MacAddr, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let mut out = [0u8; 6];
        if parts.len() != 6 {
            return Err(format!("{s:?} is not a MAC address like 02:00:00:00:00:01"));
        }
        for (slot, part) in out.iter_mut().zip(&parts) {
            *slot = u8::from_str_radix(part, 16)
                .map_err(|_| format!("{s:?} is not a MAC address like 02:00:00:00:00:01"))?;
        }
        Ok(MacAddr(out))
    }
}

/// The default gateway of one family, as the main routing table's
/// lowest-metric default route names it: what the agent checks it still
/// reaches (see `agent::upstream`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Gateway {
    pub interface: String,
    pub ifindex: u32,
    /// Link-local for most IPv6 routers.
    pub addr: IpAddr,
}

impl Gateway {
    pub fn family(&self) -> Family {
        match self.addr {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

/// The interfaces, by name, whose default gateway of a family answered
/// the agent's probes and then stopped.
pub type UpstreamLost = std::collections::BTreeSet<(String, Family)>;

/// A link as the announce logic needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub index: u32,
    /// `None` on links without an Ethernet address, where ARP and NDP cannot
    /// be announced.
    pub mac: Option<MacAddr>,
    /// Administratively up and with carrier (`IFF_UP` and `IFF_LOWER_UP`).
    pub carrier: bool,
    /// On-link prefixes of both families from the main routing table, with
    /// host bits cleared, sorted, without link-local, multicast and host
    /// routes. Taken from routes, not addresses, so a DHCPv6 host holding
    /// only a /128 still shows the /64 its router advertises.
    pub prefixes: Vec<Prefix>,
}

impl Interface {
    pub fn prefixes_of(&self, family: Family) -> impl Iterator<Item = &Prefix> {
        self.prefixes.iter().filter(move |p| p.family() == family)
    }

    /// The most specific on-link prefix containing `ip`, if any.
    pub fn on_link_prefix(&self, ip: IpAddr) -> Option<Prefix> {
        self.prefixes
            .iter()
            .filter(|p| p.contains(ip))
            .max_by_key(|p| p.prefix_len())
            .copied()
    }

    /// `ip` as a secondary address with the prefix length of its on-link
    /// route, so the host answers for it exactly as for its own address;
    /// `None` when `ip` is not on-link here (the caller then uses virtual
    /// mode).
    pub fn vip(&self, ip: IpAddr, lifetime: Lifetime) -> Option<VipAddress> {
        let prefix = self.on_link_prefix(ip)?;
        Some(VipAddress {
            interface: self.name.clone(),
            ifindex: self.index,
            ip,
            prefix_len: prefix.prefix_len(),
            lifetime,
        })
    }

    /// `ip` as a host address (/32, /128) for the virtual interface: there is
    /// no subnet, only a route for routing software to export.
    pub fn host_vip(&self, ip: IpAddr, lifetime: Lifetime) -> VipAddress {
        VipAddress {
            interface: self.name.clone(),
            ifindex: self.index,
            ip,
            prefix_len: Family::of(ip).bits(),
            lifetime,
        }
    }
}

/// How long the kernel keeps an address without renewal
/// (`announce.address_lifetime`): a host whose agent died stops answering
/// within this bound instead of forever.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lifetime(Option<Duration>);

impl Lifetime {
    pub const FOREVER: Lifetime = Lifetime(None);

    /// Zero means forever, as in the config file. Lifetimes are whole seconds
    /// in the kernel: a fraction rounds up, so 1.5 s lasts 2 s.
    pub fn new(lifetime: Duration) -> Lifetime {
        if lifetime.is_zero() {
            Lifetime::FOREVER
        } else {
            Lifetime(Some(lifetime))
        }
    }

    pub fn duration(self) -> Option<Duration> {
        self.0
    }

    /// The seconds the kernel counts down, `None` for forever.
    pub fn kernel_seconds(self) -> Option<u32> {
        self.0.map(|d| {
            let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            u32::try_from(secs.max(1)).unwrap_or(u32::MAX - 1)
        })
    }

    /// When the caller should renew: a third of the lifetime leaves two
    /// tries before the address lapses. `None` for forever.
    pub fn renew_every(self) -> Option<Duration> {
        self.0.map(|d| d / 3)
    }
}

/// A VIP the agent wants the kernel to hold, on one interface.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VipAddress {
    pub interface: String,
    pub ifindex: u32,
    pub ip: IpAddr,
    pub prefix_len: u8,
    pub lifetime: Lifetime,
}

/// An address the backend added, as found in the kernel.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnedAddress {
    pub interface: String,
    pub ifindex: u32,
    pub ip: IpAddr,
    pub prefix_len: u8,
}

impl OwnedAddress {
    pub fn prefix(&self) -> Prefix {
        Prefix::new(self.ip, self.prefix_len).expect("prefix length checked when added")
    }

    /// The address as `add`/`remove` take it, e.g. to remove one found at
    /// start-up (`remove` ignores the lifetime).
    pub fn vip(&self, lifetime: Lifetime) -> VipAddress {
        VipAddress {
            interface: self.interface.clone(),
            ifindex: self.ifindex,
            ip: self.ip,
            prefix_len: self.prefix_len,
            lifetime,
        }
    }
}

/// What `add` or `remove` did. Both are idempotent: adding what is there
/// renews it, removing what is gone succeeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Done,
    /// The interface holds this IP but the agent did not add it (by hand,
    /// DHCP, another tool); it was left exactly as it was.
    NotOurs,
}

#[cfg(test)]
mod solicited_node_tests {
    use super::*;

    #[test]
    fn the_solicited_node_group_keeps_the_low_24_bits() {
        assert_eq!(
            solicited_node("fd00:77::1:2345:6789".parse().unwrap()),
            "ff02::1:ff45:6789".parse::<Ipv6Addr>().unwrap()
        );
    }
}
