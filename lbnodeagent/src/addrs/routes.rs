//! Reading the routing table: which interface holds the default route and
//! which prefixes are on-link on an interface. Pure functions over dumped
//! route messages, so the choices are unit-tested without a kernel.
//!
//! Prefixes come from routes rather than addresses because that is what
//! "on-link" means to the kernel: a DHCPv6 host holds only `fd00:1::7/128`
//! but reaches `fd00:1::/64` directly through a route its router advertised.

use std::net::IpAddr;

use hostlb_api::{Family, Prefix};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteType,
};

/// The parts of a route the choices below look at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Route {
    pub table: u32,
    pub kind: RouteType,
    pub destination: Prefix,
    pub metric: u32,
    /// Output interfaces in the kernel's order; one unless multipath.
    pub hops: Vec<Hop>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Hop {
    pub ifindex: u32,
    /// Reached through a router (`via`), so not on-link.
    pub gateway: bool,
    /// That router's address, when of the route's own family.
    pub via: Option<IpAddr>,
}

impl Route {
    /// `None` for families other than IPv4 and IPv6 (MPLS, multicast caches).
    pub fn parse(msg: &RouteMessage) -> Option<Route> {
        let h = &msg.header;
        let mut table = u32::from(h.table);
        let mut destination = None;
        let mut metric = 0;
        let mut oif = None;
        let mut gateway = false;
        let mut via = None;
        let mut multipath = None;
        for attr in &msg.attributes {
            match attr {
                RouteAttribute::Table(t) => table = *t,
                RouteAttribute::Destination(a) => destination = route_ip(a),
                RouteAttribute::Priority(p) => metric = *p,
                RouteAttribute::Oif(i) => oif = Some(*i),
                RouteAttribute::Gateway(a) => {
                    gateway = true;
                    via = route_ip(a);
                }
                RouteAttribute::Via(_) => gateway = true,
                RouteAttribute::MultiPath(hops) => {
                    multipath = Some(
                        hops.iter()
                            .map(|nh| Hop {
                                ifindex: nh.interface_index,
                                gateway: nh.attributes.iter().any(|a| {
                                    matches!(a, RouteAttribute::Gateway(_) | RouteAttribute::Via(_))
                                }),
                                via: nh.attributes.iter().find_map(|a| match a {
                                    RouteAttribute::Gateway(a) => route_ip(a),
                                    _ => None,
                                }),
                            })
                            .collect(),
                    )
                }
                _ => {}
            }
        }
        let family = match u8::from(h.address_family) {
            f if f == libc::AF_INET as u8 => Family::V4,
            f if f == libc::AF_INET6 as u8 => Family::V6,
            _ => return None,
        };
        let unspecified = match family {
            Family::V4 => IpAddr::from([0u8; 4]),
            Family::V6 => IpAddr::from([0u8; 16]),
        };
        let destination = Prefix::new(
            destination.unwrap_or(unspecified),
            h.destination_prefix_length,
        )?;
        if destination.family() != family {
            return None;
        }
        let hops = match multipath {
            Some(hops) => hops,
            None => oif
                .map(|ifindex| Hop {
                    ifindex,
                    gateway,
                    via,
                })
                .into_iter()
                .collect(),
        };
        Some(Route {
            table,
            kind: h.kind,
            destination: destination.network(),
            metric,
            hops,
        })
    }

    fn is_main_unicast(&self) -> bool {
        self.table == u32::from(RouteHeader::RT_TABLE_MAIN) && self.kind == RouteType::Unicast
    }
}

/// The host's local unicast addresses: the kernel keeps a `local` route of
/// full length for each address of the host (its own and the VIPs it
/// holds) in the `local` table. Loopback, link-local and multicast ones
/// are left out (no VIP is one); sorted, without duplicates.
pub(super) fn local_addresses(routes: &[Route]) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = routes
        .iter()
        .filter(|r| {
            r.kind == RouteType::Local
                && r.destination.prefix_len() == r.destination.family().bits()
        })
        .map(|r| r.destination.addr())
        .filter(|ip| match ip {
            IpAddr::V4(v4) => !v4.is_loopback() && !v4.is_link_local() && !v4.is_multicast(),
            IpAddr::V6(v6) => {
                !v6.is_loopback() && !v6.is_unicast_link_local() && !v6.is_multicast()
            }
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    }
}

/// The default route the kernel uses for `family`: the lowest metric in
/// the main table, the first in dump order among equals.
fn default_route(routes: &[Route], family: Family) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| {
            r.is_main_unicast()
                && r.destination.family() == family
                && r.destination.prefix_len() == 0
                && !r.hops.is_empty()
        })
        .min_by_key(|r| r.metric)
}

/// The router of the default route of `family` (its first next hop, as
/// for the interface) and the interface it is reached through; `None`
/// when the default route names no router of its own family (a
/// point-to-point link, or an IPv4 route via an IPv6 next hop).
pub(super) fn default_gateway(routes: &[Route], family: Family) -> Option<(u32, IpAddr)> {
    let hop = default_route(routes, family)?.hops.first()?;
    let via = hop.via.filter(|ip| match family {
        Family::V4 => ip.is_ipv4(),
        Family::V6 => ip.is_ipv6(),
    })?;
    Some((hop.ifindex, via))
}

/// The output interface of the default route with the lowest metric in the
/// main table. Equal metrics: the first in dump order, which is the one the
/// kernel uses. A multipath default: its first next hop, because a VIP
/// announced on two uplinks at once would be answered from two MACs.
pub(super) fn default_interface(routes: &[Route], family: Family) -> Option<u32> {
    default_route(routes, family).map(|r| r.hops[0].ifindex)
}

/// The prefixes reached directly (no gateway) through `ifindex` in the main
/// table, both families, sorted and deduplicated. Left out: link-local
/// (fe80::/10, 169.254.0.0/16) and multicast, where no VIP lives, and host
/// routes, which name one neighbour rather than a subnet.
pub(super) fn on_link_prefixes(routes: &[Route], ifindex: u32) -> Vec<Prefix> {
    let mut out: Vec<Prefix> = routes
        .iter()
        .filter(|r| {
            r.is_main_unicast()
                && r.destination.prefix_len() > 0
                && r.destination.prefix_len() < r.destination.family().bits()
                && r.hops.iter().any(|h| h.ifindex == ifindex && !h.gateway)
                && !is_link_local_or_multicast(r.destination)
        })
        .map(|r| r.destination)
        .collect();
    out.sort();
    out.dedup();
    out
}

fn is_link_local_or_multicast(p: Prefix) -> bool {
    let under = |net: &str| {
        let net: Prefix = net.parse().expect("constant prefix");
        p.prefix_len() >= net.prefix_len() && net.contains(p.addr())
    };
    match p.family() {
        Family::V4 => under("169.254.0.0/16") || under("224.0.0.0/4"),
        Family::V6 => under("fe80::/10") || under("ff00::/8"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_route::AddressFamily;
    use rtnetlink::packet_route::route::RouteNextHop;

    fn prefix(s: &str) -> Prefix {
        s.parse().unwrap()
    }

    /// A dumped route message as the kernel sends it.
    fn msg(dst: &str, attrs: Vec<RouteAttribute>) -> RouteMessage {
        let p = prefix(dst);
        let mut m = RouteMessage::default();
        m.header.address_family = match p.family() {
            Family::V4 => AddressFamily::Inet,
            Family::V6 => AddressFamily::Inet6,
        };
        m.header.destination_prefix_length = p.prefix_len();
        m.header.table = RouteHeader::RT_TABLE_MAIN;
        m.header.kind = RouteType::Unicast;
        if p.prefix_len() > 0 {
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::from(p.addr())));
        }
        m.attributes.extend(attrs);
        m
    }

    fn gw(ip: &str) -> RouteAttribute {
        RouteAttribute::Gateway(RouteAddress::from(ip.parse::<IpAddr>().unwrap()))
    }

    fn hop(ifindex: u32, gateway: Option<&str>) -> RouteNextHop {
        let mut nh = RouteNextHop::default();
        nh.interface_index = ifindex;
        nh.attributes = gateway.map(gw).into_iter().collect();
        nh
    }

    fn parse_all(msgs: &[RouteMessage]) -> Vec<Route> {
        msgs.iter().filter_map(Route::parse).collect()
    }

    #[test]
    fn lowest_metric_default_wins_and_ties_keep_dump_order() {
        let routes = parse_all(&[
            msg(
                "0.0.0.0/0",
                vec![
                    gw("10.0.0.1"),
                    RouteAttribute::Oif(2),
                    RouteAttribute::Priority(100),
                ],
            ),
            msg(
                "0.0.0.0/0",
                vec![
                    gw("10.1.0.1"),
                    RouteAttribute::Oif(3),
                    RouteAttribute::Priority(50),
                ],
            ),
            msg(
                "0.0.0.0/0",
                vec![
                    gw("10.2.0.1"),
                    RouteAttribute::Oif(4),
                    RouteAttribute::Priority(50),
                ],
            ),
            msg(
                "::/0",
                vec![
                    gw("fe80::1"),
                    RouteAttribute::Oif(5),
                    RouteAttribute::Priority(1024),
                ],
            ),
        ]);
        assert_eq!(default_interface(&routes, Family::V4), Some(3));
        assert_eq!(default_interface(&routes, Family::V6), Some(5));
        assert_eq!(
            default_gateway(&routes, Family::V4),
            Some((3, "10.1.0.1".parse().unwrap()))
        );
        assert_eq!(
            default_gateway(&routes, Family::V6),
            Some((5, "fe80::1".parse().unwrap()))
        );
    }

    #[test]
    fn v4_default_without_metric_counts_as_zero() {
        let routes = parse_all(&[
            msg(
                "0.0.0.0/0",
                vec![
                    gw("10.1.0.1"),
                    RouteAttribute::Oif(3),
                    RouteAttribute::Priority(1),
                ],
            ),
            msg("0.0.0.0/0", vec![gw("10.0.0.1"), RouteAttribute::Oif(2)]),
        ]);
        assert_eq!(default_interface(&routes, Family::V4), Some(2));
    }

    #[test]
    fn multipath_default_uses_the_first_next_hop() {
        let routes = parse_all(&[msg(
            "0.0.0.0/0",
            vec![RouteAttribute::MultiPath(vec![
                hop(7, Some("10.0.0.1")),
                hop(8, Some("10.1.0.1")),
            ])],
        )]);
        assert_eq!(default_interface(&routes, Family::V4), Some(7));
        assert_eq!(
            default_gateway(&routes, Family::V4),
            Some((7, "10.0.0.1".parse().unwrap()))
        );
    }

    /// A default route with no router (a point-to-point link) has no
    /// gateway to check.
    #[test]
    fn a_default_without_a_router_has_no_gateway() {
        let routes = parse_all(&[msg("0.0.0.0/0", vec![RouteAttribute::Oif(4)])]);
        assert_eq!(default_interface(&routes, Family::V4), Some(4));
        assert_eq!(default_gateway(&routes, Family::V4), None);
    }

    #[test]
    fn defaults_outside_the_main_table_or_not_unicast_are_ignored() {
        let mut other_table = msg("0.0.0.0/0", vec![gw("10.0.0.1"), RouteAttribute::Oif(2)]);
        other_table.attributes.push(RouteAttribute::Table(100));
        let mut unreachable = msg("0.0.0.0/0", vec![RouteAttribute::Oif(1)]);
        unreachable.header.kind = RouteType::Unreachable;
        let routes = parse_all(&[other_table, unreachable]);
        assert_eq!(default_interface(&routes, Family::V4), None);
        assert_eq!(default_interface(&routes, Family::V6), None);
    }

    /// The host's addresses, from the `local` table: full-length `local`
    /// routes, not the loopback, link-local or a range like 127.0.0.0/8.
    #[test]
    fn local_addresses_are_the_local_tables_host_routes() {
        let local = |dst: &str, oif: u32| {
            let mut m = msg(dst, vec![RouteAttribute::Oif(oif)]);
            m.header.table = 255;
            m.header.kind = RouteType::Local;
            m
        };
        let mut broadcast = msg("10.0.0.255/32", vec![RouteAttribute::Oif(2)]);
        broadcast.header.table = 255;
        broadcast.header.kind = RouteType::Broadcast;
        let routes = parse_all(&[
            local("10.0.0.7/32", 2),
            local("fd00:1::7/128", 2),
            local("10.0.0.7/32", 2),
            local("127.0.0.0/8", 1),
            local("127.0.0.1/32", 1),
            local("::1/128", 1),
            local("fe80::1/128", 2),
            broadcast,
            msg("10.0.0.0/24", vec![RouteAttribute::Oif(2)]),
        ]);
        let want: Vec<IpAddr> = vec!["10.0.0.7".parse().unwrap(), "fd00:1::7".parse().unwrap()];
        assert_eq!(local_addresses(&routes), want);
    }

    #[test]
    fn on_link_prefixes_are_direct_main_table_routes_on_the_interface() {
        let mut local_table = msg("10.0.0.7/32", vec![RouteAttribute::Oif(2)]);
        local_table.header.table = 255;
        local_table.header.kind = RouteType::Local;
        let routes = parse_all(&[
            // dev eth0 proto kernel scope link
            msg("10.0.0.0/24", vec![RouteAttribute::Oif(2)]),
            // DHCPv6: the /64 comes from a route, the address is a /128
            msg(
                "fd00:1::/64",
                vec![RouteAttribute::Oif(2), RouteAttribute::Priority(100)],
            ),
            msg("fe80::/64", vec![RouteAttribute::Oif(2)]),
            msg("169.254.0.0/16", vec![RouteAttribute::Oif(2)]),
            msg("ff00::/8", vec![RouteAttribute::Oif(2)]),
            // a host route, e.g. to a gateway outside the subnet
            msg("172.31.1.1/32", vec![RouteAttribute::Oif(2)]),
            msg("fd00:1::7/128", vec![RouteAttribute::Oif(2)]),
            // through a router: not on-link
            msg(
                "192.168.0.0/16",
                vec![gw("10.0.0.1"), RouteAttribute::Oif(2)],
            ),
            // on another interface
            msg("10.9.0.0/24", vec![RouteAttribute::Oif(3)]),
            // multipath with one direct hop on the interface
            msg(
                "10.5.0.0/24",
                vec![RouteAttribute::MultiPath(vec![
                    hop(3, Some("10.9.0.1")),
                    hop(2, None),
                ])],
            ),
            // same prefix twice (two metrics) is listed once
            msg(
                "10.0.0.0/24",
                vec![RouteAttribute::Oif(2), RouteAttribute::Priority(5)],
            ),
            msg("0.0.0.0/0", vec![gw("10.0.0.1"), RouteAttribute::Oif(2)]),
            local_table,
        ]);
        assert_eq!(
            on_link_prefixes(&routes, 2),
            vec![
                prefix("10.0.0.0/24"),
                prefix("10.5.0.0/24"),
                prefix("fd00:1::/64")
            ]
        );
        assert_eq!(on_link_prefixes(&routes, 3), vec![prefix("10.9.0.0/24")]);
    }

    #[test]
    fn host_bits_of_a_destination_are_cleared() {
        let routes = parse_all(&[msg("10.0.0.9/24", vec![RouteAttribute::Oif(2)])]);
        assert_eq!(on_link_prefixes(&routes, 2), vec![prefix("10.0.0.0/24")]);
    }
}
