//! The announcement frames, byte for byte: gratuitous ARP for IPv4 and an
//! unsolicited Neighbor Advertisement for IPv6. Pure functions, so every
//! byte is checked by a unit test without a socket.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::addrs::MacAddr;
pub use crate::model::Claim;

pub const ETH_P_ARP: u16 = 0x0806;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
/// The Ethernet group of ff02::1 (all nodes): 33:33 and its low 32 bits.
pub const ALL_NODES_MAC: MacAddr = MacAddr([0x33, 0x33, 0, 0, 0, 1]);
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// 802.3's minimum frame without the checksum. The kernel sends ARP 42
/// bytes long and lets the NIC pad; padding here keeps the frame valid on
/// virtual NICs that pass runts on unchanged.
const MIN_FRAME: usize = 60;

/// A complete Ethernet frame and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub destination: MacAddr,
    pub ethertype: u16,
    pub bytes: Vec<u8>,
    /// For logs: "arp request", "arp reply", "neighbor advertisement".
    pub kind: &'static str,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpOp {
    Request = 1,
    Reply = 2,
}

fn ethernet(destination: MacAddr, source: MacAddr, ethertype: u16) -> Vec<u8> {
    let mut f = Vec::with_capacity(MIN_FRAME + 32);
    f.extend_from_slice(&destination.0);
    f.extend_from_slice(&source.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// A gratuitous ARP: sender and target IP are both the VIP, sent to
/// broadcast. Switches and hosts differ in which operation they learn from,
/// so the caller sends both. The target hardware address is zero in the
/// request (RFC 5227's announcement) and our own in the reply, because Linux
/// treats a reply as gratuitous, and so overrides a fresh cache entry, only
/// when the target hardware address equals the sender's.
pub fn gratuitous_arp(op: ArpOp, mac: MacAddr, ip: Ipv4Addr) -> Frame {
    let mut f = ethernet(BROADCAST, mac, ETH_P_ARP);
    f.extend_from_slice(&1u16.to_be_bytes()); // hardware: Ethernet
    f.extend_from_slice(&0x0800u16.to_be_bytes()); // protocol: IPv4
    f.push(6);
    f.push(4);
    f.extend_from_slice(&(op as u16).to_be_bytes());
    f.extend_from_slice(&mac.0);
    f.extend_from_slice(&ip.octets());
    match op {
        ArpOp::Request => f.extend_from_slice(&[0; 6]),
        ArpOp::Reply => f.extend_from_slice(&mac.0),
    }
    f.extend_from_slice(&ip.octets());
    f.resize(MIN_FRAME, 0);
    Frame {
        destination: BROADCAST,
        ethertype: ETH_P_ARP,
        bytes: f,
        kind: match op {
            ArpOp::Request => "arp request",
            ArpOp::Reply => "arp reply",
        },
    }
}

/// An unsolicited Neighbor Advertisement (RFC 4861 7.2.6) to all nodes:
/// Override set so caches replace the old owner's MAC, Solicited clear, the
/// Target Link-Layer Address option carrying our MAC, hop limit 255 (which
/// receivers require). The source is the VIP itself: RFC 4861 allows any
/// address of the sending interface, and the VIP is one the moment it is
/// added (no DAD), while the link-local address may still be tentative or
/// absent.
pub fn unsolicited_na(mac: MacAddr, ip: Ipv6Addr) -> Frame {
    let mut icmp = Vec::with_capacity(32);
    icmp.push(136); // Neighbor Advertisement
    icmp.push(0); // code
    icmp.extend_from_slice(&[0, 0]); // checksum, filled below
    icmp.extend_from_slice(&[0x20, 0, 0, 0]); // R=0 S=0 O=1, reserved
    icmp.extend_from_slice(&ip.octets());
    icmp.push(2); // option: Target Link-Layer Address
    icmp.push(1); // length in units of 8 bytes
    icmp.extend_from_slice(&mac.0);
    let sum = icmpv6_checksum(ip, ALL_NODES, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());

    let mut f = ethernet(ALL_NODES_MAC, mac, ETH_P_IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0]); // version 6, no class or flow
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.push(58); // next header: ICMPv6
    f.push(255); // hop limit
    f.extend_from_slice(&ip.octets());
    f.extend_from_slice(&ALL_NODES.octets());
    f.extend_from_slice(&icmp);
    Frame {
        destination: ALL_NODES_MAC,
        ethertype: ETH_P_IPV6,
        bytes: f,
        kind: "neighbor advertisement",
    }
}

/// An RFC 5227 ARP probe for `target`: sender IP 0.0.0.0, so no cache
/// learns anything from it, and any host holding `target` answers with a
/// reply naming its MAC. How an owner checks that nobody else answers for
/// its VIP.
pub fn arp_probe(mac: MacAddr, target: Ipv4Addr) -> Frame {
    Frame {
        kind: "arp probe",
        ..arp_request(mac, Ipv4Addr::UNSPECIFIED, target)
    }
}

/// An ARP request for `target` from `sender`, to broadcast, as the
/// kernel's neighbour table sends one: how the agent checks that its
/// gateway still answers (see `gateway`).
pub fn arp_request(mac: MacAddr, sender: Ipv4Addr, target: Ipv4Addr) -> Frame {
    let mut f = ethernet(BROADCAST, mac, ETH_P_ARP);
    f.extend_from_slice(&1u16.to_be_bytes());
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.push(6);
    f.push(4);
    f.extend_from_slice(&(ArpOp::Request as u16).to_be_bytes());
    f.extend_from_slice(&mac.0);
    f.extend_from_slice(&sender.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&target.octets());
    f.resize(MIN_FRAME, 0);
    Frame {
        destination: BROADCAST,
        ethertype: ETH_P_ARP,
        bytes: f,
        kind: "arp request",
    }
}

/// A duplicate-address-detection style Neighbor Solicitation for `target`
/// (RFC 4862 5.4.2): source `::`, to the target's solicited-node group, no
/// options. A host holding `target` defends it with an advertisement to all
/// nodes carrying its MAC; no cache learns from the solicitation.
pub fn dad_solicitation(mac: MacAddr, target: Ipv6Addr) -> Frame {
    solicitation(mac, Ipv6Addr::UNSPECIFIED, target)
}

/// A Neighbor Solicitation for `target` from `source`, to the target's
/// solicited-node group. From `::` it carries no option (RFC 4861 7.1.1);
/// from an address, its source link-layer address, as the kernel's own
/// resolution does, and the target answers this node alone.
pub fn solicitation(mac: MacAddr, source: Ipv6Addr, target: Ipv6Addr) -> Frame {
    let t = target.octets();
    let group = crate::model::solicited_node(target);
    let group_mac = MacAddr([0x33, 0x33, 0xff, t[13], t[14], t[15]]);
    let mut icmp = Vec::with_capacity(32);
    icmp.push(135); // Neighbor Solicitation
    icmp.push(0);
    icmp.extend_from_slice(&[0, 0]);
    icmp.extend_from_slice(&[0, 0, 0, 0]);
    icmp.extend_from_slice(&t);
    if !source.is_unspecified() {
        icmp.extend_from_slice(&[1, 1]); // source link-layer address, 8 bytes
        icmp.extend_from_slice(&mac.0);
    }
    let sum = icmpv6_checksum(source, group, &icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    let mut f = ethernet(group_mac, mac, ETH_P_IPV6);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&(icmp.len() as u16).to_be_bytes());
    f.push(58);
    f.push(255);
    f.extend_from_slice(&source.octets());
    f.extend_from_slice(&group.octets());
    f.extend_from_slice(&icmp);
    f.resize(f.len().max(MIN_FRAME), 0);
    Frame {
        destination: group_mac,
        ethertype: ETH_P_IPV6,
        bytes: f,
        kind: "neighbor solicitation",
    }
}

/// Any Ethernet ARP frame (reply, gratuitous ARP, or a request using the
/// address as its source) claims its sender IP for its sender MAC. Probes
/// (sender IP 0.0.0.0) claim nothing.
pub fn arp_claim(frame: &[u8]) -> Option<Claim> {
    if frame.len() < 42 || frame[12..14] != ETH_P_ARP.to_be_bytes() {
        return None;
    }
    let arp = &frame[14..];
    if arp[0..2] != [0, 1] || arp[2..4] != [8, 0] || arp[4] != 6 || arp[5] != 4 {
        return None;
    }
    let mac = MacAddr::from_slice(&arp[8..14])?;
    let ip = Ipv4Addr::new(arp[14], arp[15], arp[16], arp[17]);
    if ip.is_unspecified() {
        return None;
    }
    Some(Claim { ip: ip.into(), mac })
}

/// A Neighbor Advertisement (the ICMPv6 message, as a raw ICMPv6 socket
/// receives it) claims its target for the MAC in its Target Link-Layer
/// Address option; without that option it names no MAC and claims nothing.
/// One that RFC 4861 7.1.2 has a receiver drop (a code other than 0, a
/// multicast target) claims nothing either; its hop limit is the caller's
/// to check, the IPv6 header being the socket's.
pub fn na_claim(icmp: &[u8]) -> Option<Claim> {
    if icmp.len() < 24 || icmp[0] != 136 || icmp[1] != 0 {
        return None;
    }
    let target = Ipv6Addr::from(<[u8; 16]>::try_from(&icmp[8..24]).ok()?);
    if target.is_multicast() {
        return None;
    }
    let mut o = 24;
    while o + 8 <= icmp.len() {
        let len = usize::from(icmp[o + 1]) * 8;
        if len == 0 {
            return None;
        }
        if icmp[o] == 2 && len >= 8 {
            return Some(Claim {
                ip: target.into(),
                mac: MacAddr::from_slice(&icmp[o + 2..o + 8])?,
            });
        }
        o += len;
    }
    None
}

/// The Internet checksum over the IPv6 pseudo-header and `message` (whose
/// checksum field must be zero).
pub fn icmpv6_checksum(source: Ipv6Addr, destination: Ipv6Addr, message: &[u8]) -> u16 {
    let mut pseudo = Vec::with_capacity(40 + message.len());
    pseudo.extend_from_slice(&source.octets());
    pseudo.extend_from_slice(&destination.octets());
    pseudo.extend_from_slice(&(message.len() as u32).to_be_bytes());
    pseudo.extend_from_slice(&[0, 0, 0, 58]);
    pseudo.extend_from_slice(message);
    !ones_complement_sum(&pseudo)
}

fn ones_complement_sum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC: MacAddr = MacAddr([0x02, 0x00, 0x5e, 0x10, 0x00, 0x01]);

    #[test]
    fn arp_request_bytes() {
        let f = gratuitous_arp(ArpOp::Request, MAC, Ipv4Addr::new(10, 77, 0, 100));
        #[rustfmt::skip]
        let mut want = vec![
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // to broadcast
            0x02, 0x00, 0x5e, 0x10, 0x00, 0x01, // from our MAC
            0x08, 0x06,                         // ARP
            0x00, 0x01, 0x08, 0x00, 6, 4,       // Ethernet/IPv4, lengths 6 and 4
            0x00, 0x01,                         // request
            0x02, 0x00, 0x5e, 0x10, 0x00, 0x01, // sender MAC
            10, 77, 0, 100,                     // sender IP = VIP
            0, 0, 0, 0, 0, 0,                   // target MAC: unknown
            10, 77, 0, 100,                     // target IP = VIP
        ];
        want.resize(60, 0);
        assert_eq!(f.bytes, want);
        assert_eq!(f.destination, BROADCAST);
        assert_eq!(f.ethertype, ETH_P_ARP);
    }

    #[test]
    fn arp_reply_bytes() {
        let f = gratuitous_arp(ArpOp::Reply, MAC, Ipv4Addr::new(192, 0, 2, 1));
        #[rustfmt::skip]
        let mut want = vec![
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
            0x02, 0x00, 0x5e, 0x10, 0x00, 0x01,
            0x08, 0x06,
            0x00, 0x01, 0x08, 0x00, 6, 4,
            0x00, 0x02,                         // reply
            0x02, 0x00, 0x5e, 0x10, 0x00, 0x01,
            192, 0, 2, 1,
            0x02, 0x00, 0x5e, 0x10, 0x00, 0x01, // target MAC = sender MAC
            192, 0, 2, 1,
        ];
        want.resize(60, 0);
        assert_eq!(f.bytes, want);
    }

    #[test]
    fn neighbor_advertisement_bytes() {
        let ip: Ipv6Addr = "fd00:77::100".parse().unwrap();
        let f = unsolicited_na(MAC, ip);
        #[rustfmt::skip]
        let want = vec![
            0x33, 0x33, 0x00, 0x00, 0x00, 0x01, // to all nodes
            0x02, 0x00, 0x5e, 0x10, 0x00, 0x01,
            0x86, 0xdd,
            0x60, 0, 0, 0,                      // IPv6
            0, 32,                              // payload length
            58, 255,                            // ICMPv6, hop limit 255
            0xfd, 0, 0, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x00, // from the VIP
            0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01,    // to ff02::1
            136, 0,                             // Neighbor Advertisement
            0xf9, 0x9e,                         // checksum (computed independently)
            0x20, 0, 0, 0,                      // Override only
            0xfd, 0, 0, 0x77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, 0x00, // target = VIP
            2, 1, 0x02, 0x00, 0x5e, 0x10, 0x00, 0x01, // target link-layer address
        ];
        assert_eq!(f.bytes, want);
        assert_eq!(f.destination, ALL_NODES_MAC);
        assert_eq!(f.ethertype, ETH_P_IPV6);
    }

    #[test]
    fn checksum_verifies_over_the_finished_message() {
        for ip in ["fd00:77::100", "2001:db8:ffff::ffff", "fe80::1"] {
            let ip: Ipv6Addr = ip.parse().unwrap();
            let f = unsolicited_na(MAC, ip);
            let icmp = &f.bytes[54..];
            let mut pseudo = Vec::new();
            pseudo.extend_from_slice(&ip.octets());
            pseudo.extend_from_slice(&ALL_NODES.octets());
            pseudo.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, 58]);
            pseudo.extend_from_slice(icmp);
            assert_eq!(ones_complement_sum(&pseudo), 0xffff, "{ip}");
        }
    }

    #[test]
    fn ones_complement_sum_folds_carries_and_pads_odd_lengths() {
        assert_eq!(ones_complement_sum(&[0xff, 0xff, 0x00, 0x02]), 0x0002);
        assert_eq!(ones_complement_sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
    }

    #[test]
    fn probes_claim_nothing_and_answers_claim_their_sender() {
        let target: Ipv4Addr = "10.0.0.7".parse().unwrap();
        let probe = arp_probe(MAC, target);
        assert_eq!(probe.bytes.len(), MIN_FRAME);
        assert_eq!(&probe.bytes[28..32], &[0, 0, 0, 0], "sender IP 0");
        assert_eq!(&probe.bytes[38..42], &target.octets());
        assert_eq!(arp_claim(&probe.bytes), None);
        let other = MacAddr([2, 0, 0, 0, 0, 9]);
        let garp = gratuitous_arp(ArpOp::Reply, other, target);
        assert_eq!(
            arp_claim(&garp.bytes),
            Some(Claim {
                ip: target.into(),
                mac: other
            })
        );
        assert_eq!(arp_claim(&garp.bytes[..30]), None);
    }

    #[test]
    fn a_solicitation_goes_to_the_solicited_node_group_from_the_unspecified_address() {
        let target: Ipv6Addr = "fd00::12:3456".parse().unwrap();
        let ns = dad_solicitation(MAC, target);
        assert_eq!(
            ns.destination,
            MacAddr([0x33, 0x33, 0xff, 0x12, 0x34, 0x56])
        );
        let ip6 = &ns.bytes[14..];
        assert_eq!(&ip6[8..24], &Ipv6Addr::UNSPECIFIED.octets());
        let group: Ipv6Addr = "ff02::1:ff12:3456".parse().unwrap();
        assert_eq!(&ip6[24..40], &group.octets());
        let icmp = &ip6[40..64];
        assert_eq!(icmp[0], 135);
        assert_eq!(&icmp[8..24], &target.octets());
        let mut zeroed = icmp.to_vec();
        zeroed[2..4].copy_from_slice(&[0, 0]);
        assert_eq!(
            icmpv6_checksum(Ipv6Addr::UNSPECIFIED, group, &zeroed).to_be_bytes(),
            [icmp[2], icmp[3]]
        );
    }

    /// The gateway checks: an ARP request from this host's address, which
    /// claims that address (as the kernel's own does), and a solicitation
    /// from its link-local address carrying its MAC, checksummed over the
    /// source it names.
    #[test]
    fn a_gateway_check_asks_as_the_kernel_does() {
        let me: Ipv4Addr = "10.0.0.11".parse().unwrap();
        let gw: Ipv4Addr = "10.0.0.1".parse().unwrap();
        let req = arp_request(MAC, me, gw);
        assert_eq!(req.destination, BROADCAST);
        assert_eq!(&req.bytes[20..22], &1u16.to_be_bytes(), "a request");
        assert_eq!(&req.bytes[28..32], &me.octets());
        assert_eq!(&req.bytes[38..42], &gw.octets());
        assert_eq!(arp_claim(&req.bytes).map(|c| c.ip), Some(me.into()));

        let source: Ipv6Addr = "fe80::11".parse().unwrap();
        let router: Ipv6Addr = "fe80::1".parse().unwrap();
        let ns = solicitation(MAC, source, router);
        let ip6 = &ns.bytes[14..];
        assert_eq!(&ip6[8..24], &source.octets());
        let group = crate::model::solicited_node(router);
        assert_eq!(&ip6[24..40], &group.octets());
        let icmp = &ip6[40..72];
        assert_eq!(&icmp[8..24], &router.octets());
        assert_eq!(&icmp[24..26], &[1, 1], "a source link-layer option");
        assert_eq!(&icmp[26..32], &MAC.0);
        let mut zeroed = icmp.to_vec();
        zeroed[2..4].copy_from_slice(&[0, 0]);
        assert_eq!(
            icmpv6_checksum(source, group, &zeroed).to_be_bytes(),
            [icmp[2], icmp[3]]
        );
    }

    #[test]
    fn an_advertisement_claims_its_target_for_its_link_layer_option() {
        let target: Ipv6Addr = "fd00::7".parse().unwrap();
        let na = unsolicited_na(MAC, target);
        let icmp = &na.bytes[14 + 40..];
        assert_eq!(
            na_claim(icmp),
            Some(Claim {
                ip: target.into(),
                mac: MAC
            })
        );
        // No option: nothing to attribute.
        assert_eq!(na_claim(&icmp[..24]), None);
        // A zero-length option ends parsing instead of looping.
        let mut bad = icmp[..24].to_vec();
        bad.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(na_claim(&bad), None);
    }
}
