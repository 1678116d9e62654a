//! This node's links as the reconcile loop uses them: what it publishes in
//! gossip (the on-link prefixes of every link, marked when on an announce
//! interface) and how an election [`Duty`], which names interfaces, becomes
//! a [`VipAddress`] with the ifindex the backend needs and a [`Target`] with
//! the MAC the announcer needs. Pure: the loop reads the kernel, this
//! decides.

use std::collections::BTreeMap;
use std::net::IpAddr;

use hostlb_api::Family;

use crate::election::{Duty, OnLink};
use crate::model::Target;
use crate::model::{Interface, Lifetime, UpstreamLost, VipAddress};

/// How a VIP is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Won the election: a secondary address on an on-link interface; the
    /// kernel answers ARP/ND for it.
    Local,
    /// Off-link: `/32` or `/128` on the virtual interface for routing
    /// software to export.
    Virtual,
}

/// An address the loop wants the kernel to hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub vip: VipAddress,
    pub mode: Mode,
    /// Where to send gratuitous ARP / unsolicited NA; `None` in virtual
    /// mode or on a link without a MAC.
    pub target: Option<Target>,
}

/// A snapshot of the node's links.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Links {
    pub all: Vec<Interface>,
    /// The announce interface per family (the default-route one, or the
    /// configured one); `None` when there is none (no default route).
    pub announce_v4: Option<u32>,
    pub announce_v6: Option<u32>,
    /// The virtual interface, when virtual mode is on and it exists.
    pub virtual_link: Option<Interface>,
    /// The host's local unicast addresses as the kernel has them (its own
    /// and the VIPs held here), sorted: the firewall leaves the host's own
    /// alone (see `Core::plan_firewall`).
    pub local: Vec<IpAddr>,
    /// The default routes' gateways, which the agent checks it reaches
    /// (see `agent::upstream`).
    pub gateways: Vec<crate::model::Gateway>,
}

impl Links {
    pub fn by_name(&self, name: &str) -> Option<&Interface> {
        self.all.iter().find(|i| i.name == name)
    }

    pub fn by_index(&self, index: u32) -> Option<&Interface> {
        self.all.iter().find(|i| i.index == index)
    }

    fn announce_index(&self, family: Family) -> Option<u32> {
        match family {
            Family::V4 => self.announce_v4,
            Family::V6 => self.announce_v6,
        }
    }

    /// Whether `index` is an announce interface of either family.
    pub fn is_announce(&self, index: u32) -> bool {
        self.announce_v4 == Some(index) || self.announce_v6 == Some(index)
    }

    /// The prefixes this node publishes: those of every link with carrier,
    /// except the virtual interface (whose host routes are not a subnet).
    /// A link without carrier publishes nothing, so the node stops being a
    /// candidate for VIPs there the moment the cable is pulled. A prefix on
    /// an interface whose gateway of its family is `lost` is marked so:
    /// the node is then a candidate of last resort there.
    pub fn on_link(&self, lost: &UpstreamLost) -> Vec<OnLink> {
        let virtual_index = self.virtual_link.as_ref().map(|v| v.index);
        let mut out: Vec<OnLink> = self
            .all
            .iter()
            .filter(|i| i.carrier && Some(i.index) != virtual_index)
            .flat_map(|i| {
                i.prefixes.iter().map(move |p| OnLink {
                    prefix: *p,
                    interface: i.name.clone(),
                    announce: self.announce_index(p.family()) == Some(i.index),
                    upstream_lost: lost.contains(&(i.name.clone(), p.family())),
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The MACs this node may answer from: those of the links whose
    /// prefixes it publishes. Peers map a MAC seen on the wire to this node
    /// with them.
    pub fn macs(&self) -> std::collections::BTreeSet<crate::model::MacAddr> {
        let virtual_index = self.virtual_link.as_ref().map(|v| v.index);
        self.all
            .iter()
            .filter(|i| i.carrier && Some(i.index) != virtual_index && !i.prefixes.is_empty())
            .filter_map(|i| i.mac)
            .collect()
    }

    /// The link without carrier that has an on-link prefix containing `ip`.
    fn down_link_with(&self, ip: IpAddr) -> Option<&str> {
        let virtual_index = self.virtual_link.as_ref().map(|v| v.index);
        self.all
            .iter()
            .find(|i| {
                !i.carrier
                    && Some(i.index) != virtual_index
                    && i.prefixes.iter().any(|p| p.contains(ip))
            })
            .map(|i| i.name.as_str())
    }

    /// What the kernel must hold for `duties`; duties whose interface is
    /// gone (or virtual mode without its interface) are returned apart, for
    /// the log: the next links refresh re-elects without them.
    pub fn wants(
        &self,
        duties: &[Duty],
        lifetime: Lifetime,
    ) -> (BTreeMap<IpAddr, Want>, Vec<(IpAddr, String)>) {
        let mut out = BTreeMap::new();
        let mut missing = Vec::new();
        for duty in duties {
            match duty {
                Duty::Announce { ip, on_link } => match self.by_name(&on_link.interface) {
                    Some(iface) => {
                        let vip = VipAddress {
                            interface: iface.name.clone(),
                            ifindex: iface.index,
                            ip: *ip,
                            prefix_len: on_link.prefix.prefix_len(),
                            lifetime,
                        };
                        out.insert(
                            *ip,
                            Want {
                                vip,
                                mode: Mode::Local,
                                target: Target::on(iface, *ip),
                            },
                        );
                    }
                    None => missing.push((*ip, on_link.interface.clone())),
                },
                // On-link here, on a link that lost carrier (so the node
                // publishes no prefix for it and the election counts it
                // off-link): no virtual address, which routing software
                // would export and which the kernel would answer ARP for
                // the moment the cable is back.
                Duty::Virtual { ip } if self.down_link_with(*ip).is_some() => {
                    let iface = self.down_link_with(*ip).expect("just found");
                    missing.push((*ip, format!("{iface}, which has no carrier")));
                }
                Duty::Virtual { ip } => match &self.virtual_link {
                    Some(v) => {
                        out.insert(
                            *ip,
                            Want {
                                vip: v.host_vip(*ip, lifetime),
                                mode: Mode::Virtual,
                                target: None,
                            },
                        );
                    }
                    None => missing.push((*ip, "the virtual interface".to_string())),
                },
            }
        }
        (out, missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MacAddr;

    fn iface(name: &str, index: u32, carrier: bool, prefixes: &[&str]) -> Interface {
        Interface {
            name: name.into(),
            index,
            mac: Some(MacAddr([2, 0, 0, 0, 0, index as u8])),
            carrier,
            prefixes: prefixes.iter().map(|p| p.parse().unwrap()).collect(),
        }
    }

    fn links() -> Links {
        Links {
            all: vec![
                iface("eth0", 2, true, &["10.0.0.0/24", "fd00::/64"]),
                iface("eth1", 3, true, &["10.9.0.0/24"]),
                iface("eth2", 4, false, &["10.8.0.0/24"]),
                iface("kube-lb0", 5, true, &["10.7.0.1/32"]),
            ],
            announce_v4: Some(2),
            announce_v6: Some(2),
            virtual_link: Some(iface("kube-lb0", 5, true, &[])),
            local: Vec::new(),
            gateways: Vec::new(),
        }
    }

    #[test]
    fn publishes_every_link_with_carrier_except_the_virtual_one() {
        let got: Vec<(String, String, bool)> = links()
            .on_link(&UpstreamLost::new())
            .into_iter()
            .map(|o| (o.interface, o.prefix.to_string(), o.announce))
            .collect();
        assert_eq!(
            got,
            vec![
                ("eth0".into(), "10.0.0.0/24".into(), true),
                ("eth1".into(), "10.9.0.0/24".into(), false),
                ("eth0".into(), "fd00::/64".into(), true),
            ]
        );
    }

    /// A lost gateway marks the prefixes of its interface and family only.
    #[test]
    fn a_lost_gateway_marks_its_interface_and_family() {
        let lost: UpstreamLost = [("eth0".to_string(), Family::V4)].into();
        let got: Vec<(String, String, bool)> = links()
            .on_link(&lost)
            .into_iter()
            .map(|o| (o.interface, o.prefix.to_string(), o.upstream_lost))
            .collect();
        assert_eq!(
            got,
            vec![
                ("eth0".into(), "10.0.0.0/24".into(), true),
                ("eth1".into(), "10.9.0.0/24".into(), false),
                ("eth0".into(), "fd00::/64".into(), false),
            ]
        );
    }

    #[test]
    fn duties_become_addresses_with_ifindex_prefix_and_mac() {
        let l = links();
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let on = |iface: &str, p: &str| OnLink {
            prefix: p.parse().unwrap(),
            interface: iface.into(),
            announce: false,
            upstream_lost: false,
        };
        let duties = vec![
            Duty::Announce {
                ip: ip("10.9.0.7"),
                on_link: on("eth1", "10.9.0.0/24"),
            },
            Duty::Virtual {
                ip: ip("192.0.2.1"),
            },
            Duty::Announce {
                ip: ip("10.5.0.1"),
                on_link: on("gone0", "10.5.0.0/24"),
            },
        ];
        let (wants, missing) = l.wants(&duties, Lifetime::FOREVER);
        let local = &wants[&ip("10.9.0.7")];
        assert_eq!(local.mode, Mode::Local);
        assert_eq!((local.vip.ifindex, local.vip.prefix_len), (3, 24));
        assert_eq!(local.target.unwrap().mac, MacAddr([2, 0, 0, 0, 0, 3]));
        let virt = &wants[&ip("192.0.2.1")];
        assert_eq!(virt.mode, Mode::Virtual);
        assert_eq!((virt.vip.ifindex, virt.vip.prefix_len), (5, 32));
        assert_eq!(virt.target, None);
        assert_eq!(missing, vec![(ip("10.5.0.1"), "gone0".to_string())]);
    }

    /// A carrier lost on an announce interface of either family is warned
    /// about; on another link it is not.
    #[test]
    fn an_announce_interface_is_that_of_either_family() {
        let mut l = links();
        l.announce_v4 = Some(3);
        assert!(l.is_announce(3), "IPv4's");
        assert!(l.is_announce(2), "IPv6's");
        assert!(!l.is_announce(4));
        assert!(!l.is_announce(5), "the virtual interface");
    }

    /// The MACs published: those of links with carrier and a prefix, not
    /// the virtual interface's.
    #[test]
    fn the_macs_published_are_those_of_links_that_publish_prefixes() {
        let mut l = links();
        l.all.push(iface("eth3", 6, true, &[]));
        let mac = |i: u8| MacAddr([2, 0, 0, 0, 0, i]);
        assert_eq!(l.macs(), [mac(2), mac(3)].into());
    }
}
