//! What may reach a VIP on this host. A VIP is a secondary address, so
//! every daemon bound to `0.0.0.0` or `::` (sshd, the kubelet, exporters)
//! answers on it too, to whoever reaches the VIP: often the whole world,
//! since firewalls are written per address. The agent's own firewall lets
//! through only what the VIP's Services serve (their ports, every Service
//! sharing the address) and ICMP, and drops the rest.
//!
//! The rule set follows the cluster, not this node's ownership: every
//! Service address is in it whether held here or not, so a VIP that moves
//! here is closed from its first packet, and a move changes no rule.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::election::{Cluster, ServicePort};

/// The firewall in force: every VIP of the cluster, and the ports open on
/// each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Firewall {
    pub vips: BTreeSet<IpAddr>,
    pub open: BTreeSet<(IpAddr, ServicePort)>,
}

impl Firewall {
    /// From the cluster's Services: every address, and the ports of every
    /// Service that shares it.
    pub fn of(cluster: &Cluster) -> Firewall {
        let mut f = Firewall::default();
        for s in &cluster.services {
            for ip in &s.addresses {
                f.vips.insert(*ip);
                f.open.extend(s.ports.iter().map(|p| (*ip, *p)));
            }
        }
        f
    }

    /// The same without `own`, this host's own addresses (a pool that
    /// wrongly holds one must not cut the host off from its operators).
    /// Only this host's: another Node's address in a pool is a VIP here
    /// like any other, so a host's credentials that write a VIP into its
    /// own Node object open nothing on the others.
    pub fn without(&self, own: &BTreeSet<IpAddr>) -> Firewall {
        if !own.iter().any(|ip| self.vips.contains(ip)) {
            return self.clone();
        }
        Firewall {
            vips: self.vips.difference(own).copied().collect(),
            open: self
                .open
                .iter()
                .filter(|(ip, _)| !own.contains(ip))
                .copied()
                .collect(),
        }
    }
}

/// What the shell makes of the firewall: replace it, or remove it (turned
/// off by a reload).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FirewallPlan {
    On(Firewall),
    Off,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::{NodeInfo, Protocol, ServiceInfo};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn port(protocol: Protocol, port: u16) -> ServicePort {
        ServicePort { protocol, port }
    }

    #[test]
    fn every_service_sharing_an_address_opens_its_ports_there() {
        let v = ip("10.0.1.1");
        let w = ip("fd00::1:1");
        let cluster = Cluster {
            nodes: vec![NodeInfo {
                name: "a".into(),
                addresses: vec![ip("10.0.0.11")],
                ..NodeInfo::default()
            }],
            services: vec![
                ServiceInfo {
                    key: "ns/web".into(),
                    addresses: vec![v, w],
                    ports: vec![port(Protocol::Tcp, 80), port(Protocol::Tcp, 443)],
                    ..ServiceInfo::default()
                },
                ServiceInfo {
                    key: "ns/dns".into(),
                    addresses: vec![v],
                    ports: vec![port(Protocol::Udp, 53)],
                    ..ServiceInfo::default()
                },
                ServiceInfo {
                    key: "ns/closed".into(),
                    addresses: vec![ip("10.0.1.2")],
                    ..ServiceInfo::default()
                },
                ServiceInfo {
                    key: "ns/on-a-node".into(),
                    addresses: vec![ip("10.0.0.11")],
                    ports: vec![port(Protocol::Tcp, 22)],
                    ..ServiceInfo::default()
                },
            ],
            ..Cluster::default()
        };
        let own = BTreeSet::from([ip("10.0.0.99")]);
        let f = Firewall::of(&cluster).without(&own);
        assert_eq!(
            f.vips,
            [v, w, ip("10.0.1.2"), ip("10.0.0.11")].into(),
            "another Node's address in a pool is closed like any VIP"
        );
        let here = Firewall::of(&cluster).without(&BTreeSet::from([ip("10.0.0.11")]));
        assert!(
            !here.vips.contains(&ip("10.0.0.11"))
                && !here.open.iter().any(|(a, _)| *a == ip("10.0.0.11")),
            "this host's own address is never closed: {here:?}"
        );
        assert_eq!(
            f.open,
            [
                (v, port(Protocol::Tcp, 80)),
                (v, port(Protocol::Tcp, 443)),
                (v, port(Protocol::Udp, 53)),
                (w, port(Protocol::Tcp, 80)),
                (w, port(Protocol::Tcp, 443)),
                (ip("10.0.0.11"), port(Protocol::Tcp, 22)),
            ]
            .into()
        );
    }
}
