//! Kernel events: netlink notifications turned into the few the loop
//! acts on (our address removed, carrier lost or back, the links or the
//! main table's routes changed, a resync after an overrun).

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::sync::{Arc, Mutex};

use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::{LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::{RouteMessage, RouteType};

use super::links::describe_link;
use super::ownership::{KernelAddress, Presence, State, lock, unverify};
use crate::addrs::routes::Route;
use crate::addrs::{Interface, KernelEvent};

/// Where `nlmsg_type` lies in a netlink message's header (after the
/// 32-bit length).
const NLMSG_TYPE_OFFSET: u32 = 4;

/// Where a route message's `rtm_table` and `rtm_type` lie: after the
/// 16-byte netlink header, at 4 and 7 in `struct rtmsg`.
const RTM_TABLE_OFFSET: u32 = 16 + 4;
const RTM_TYPE_OFFSET: u32 = 16 + 7;

/// A socket filter that keeps `RTM_NEWADDR` notifications off the event
/// socket: the kernel drops them before they are queued. The agent acts on
/// deletions and carrier changes only, and a holder renews each of its
/// addresses every third of their lifetime: 1,000 VIPs at the shipped 15 s
/// are 200 notifications a second, each copied to this socket, waking its
/// task, and parsed (allocations and all) only to be dropped, and the
/// same burst at a takeover of them all could overflow the socket and cost
/// a resync. Each notification comes in a datagram of its own, so the
/// filter reads the first header's type; the header is in host byte order
/// and a BPF half-word load reads big-endian, hence the swap.
pub(super) fn new_address_filter() -> [socket2::SockFilter; 4] {
    let new_address = u32::from(u16::from_be_bytes(libc::RTM_NEWADDR.to_ne_bytes()));
    [
        load(libc::BPF_H, NLMSG_TYPE_OFFSET),
        // Equal: on to the next instruction (drop); else skip it (keep).
        jump_if(new_address, 0, 1),
        ret(false),
        ret(true),
    ]
}

/// A socket filter for the route socket that keeps only the changes a read
/// of the links can show. A read looks at the main table (on-link
/// prefixes, default routes) and at the host's own addresses, which are
/// the `local` routes of the `local` table; but every VIP added or removed
/// makes one of those, so a takeover of 1,000 would wake the agent 1,000
/// times for nothing it reads differently. They are dropped, and a host
/// address added by hand with no route of its own in main is seen at the
/// next safety read (the agent's `SAFETY_READ`); its removal is an
/// `RTM_DELADDR`, which the event socket keeps. Routes of other tables (a
/// CNI's per-pod tables, a routing daemon's) are never read. A table
/// beyond 255 is named `RT_TABLE_COMPAT` in the header, so dropped too.
pub(super) fn route_filter() -> [socket2::SockFilter; 7] {
    [
        /* 0 */ load(libc::BPF_B, RTM_TABLE_OFFSET),
        /* 1 */ jump_if(u32::from(libc::RT_TABLE_MAIN), 3, 0), // keep
        /* 2 */ jump_if(u32::from(libc::RT_TABLE_LOCAL), 0, 3), // its type, or drop
        /* 3 */ load(libc::BPF_B, RTM_TYPE_OFFSET),
        /* 4 */ jump_if(u32::from(libc::RTN_LOCAL), 1, 0), // drop, or keep
        /* 5 */ ret(true),
        /* 6 */ ret(false),
    ]
}

fn opcode(c: u32) -> u16 {
    u16::try_from(c).expect("BPF opcodes fit 16 bits")
}

/// Loads `size` bytes at `offset` of the datagram into the accumulator.
fn load(size: u32, offset: u32) -> socket2::SockFilter {
    socket2::SockFilter::new(opcode(libc::BPF_LD | size | libc::BPF_ABS), 0, 0, offset)
}

/// Compares the accumulator with `value`; skips `equal` instructions on a
/// match, `other` otherwise.
fn jump_if(value: u32, equal: u8, other: u8) -> socket2::SockFilter {
    socket2::SockFilter::new(
        opcode(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K),
        equal,
        other,
        value,
    )
}

/// Keeps the datagram whole, or drops it.
fn ret(keep: bool) -> socket2::SockFilter {
    socket2::SockFilter::new(
        opcode(libc::BPF_RET | libc::BPF_K),
        0,
        0,
        if keep { u32::MAX } else { 0 },
    )
}

/// Whether a route change can change a read of the links: the filter's
/// rule ([`route_filter`]) again, for a socket it could not be attached to.
fn route_is_read(route: &RouteMessage) -> bool {
    match Route::parse(route) {
        Some(r) if r.table == u32::from(libc::RT_TABLE_MAIN) => true,
        Some(r) => r.table == u32::from(libc::RT_TABLE_LOCAL) && r.kind != RouteType::Local,
        None => false,
    }
}

/// Turns raw netlink notifications into the few events the agent acts on.
/// While one runs, the backend renews addresses without reading the kernel
/// first: this is what tells it they were deleted.
pub(super) struct Translator {
    /// Each link as a read of the links describes it (routes aside), and
    /// whether it is up, to report changes only: the kernel sends
    /// `RTM_NEWLINK` for changes a read does not show (statistics,
    /// features, queues). Up matters beyond carrier: IPv4 flushes a
    /// link's routes when it goes down, without a word, even when it had
    /// no carrier to lose.
    pub(super) links: HashMap<u32, (Interface, bool)>,
    pub(super) state: Arc<Mutex<State>>,
}

impl Translator {
    pub(super) fn new(state: Arc<Mutex<State>>, links: &[LinkMessage]) -> Translator {
        {
            let mut s = lock(&state);
            if s.subscriptions == 0 {
                // Nobody watched until now: deletions may have gone unseen.
                unverify(&mut s);
            }
            s.subscriptions += 1;
        }
        Translator {
            links: link_states(links),
            state,
        }
    }

    pub(super) fn translate(
        &mut self,
        payload: NetlinkPayload<RouteNetlinkMessage>,
    ) -> Vec<KernelEvent> {
        match payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(m)) => {
                let Some(a) = KernelAddress::parse(&m) else {
                    return vec![];
                };
                let mut state = lock(&self.state);
                if let MapEntry::Occupied(mut e) = state.own_deletes.entry(a.key()) {
                    // The backend's own deletion.
                    *e.get_mut() -= 1;
                    if *e.get() == 0 {
                        e.remove();
                    }
                    return vec![];
                }
                match state.owned.get_mut(&a.key()) {
                    Some(o)
                        if o.address.prefix_len == a.prefix_len
                            && o.presence != Presence::Removed =>
                    {
                        o.presence = Presence::Removed;
                        vec![KernelEvent::AddressRemoved(o.address.clone())]
                    }
                    // Someone else's: a host address gone is one less the
                    // firewall leaves open, and IPv4 flushes the routes
                    // whose source it was without a word.
                    _ => vec![KernelEvent::LinksChanged],
                }
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                let now = link_state(&l);
                let carrier = now.0.carrier;
                match self.links.insert(l.header.index, now.clone()) {
                    Some((before, _)) if before.carrier != carrier => {
                        vec![carrier_event(now.0.index, now.0.name, carrier)]
                    }
                    Some(before) if before == now => vec![],
                    // New, renamed, another MAC, ARP or up turned on or off.
                    _ => vec![KernelEvent::LinksChanged],
                }
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => {
                match self.links.remove(&l.header.index) {
                    Some((gone, _)) if gone.carrier => {
                        vec![carrier_event(gone.index, gone.name, false)]
                    }
                    Some(_) => vec![KernelEvent::LinksChanged],
                    None => vec![],
                }
            }
            NetlinkPayload::InnerMessage(
                RouteNetlinkMessage::NewRoute(r) | RouteNetlinkMessage::DelRoute(r),
            ) if route_is_read(&r) => vec![KernelEvent::LinksChanged],
            _ => vec![],
        }
    }

    /// After an overrun, with the links as the kernel has them now (`None`
    /// if reading them failed): the carrier transitions since the last known
    /// state, then [`KernelEvent::Resync`]. Lost deletions may include ours,
    /// so every held address is checked again at its next renewal.
    pub(super) fn overrun(&mut self, links: Option<&[LinkMessage]>) -> Vec<KernelEvent> {
        {
            let mut state = lock(&self.state);
            unverify(&mut state);
            state.own_deletes.clear();
        }
        let mut events = Vec::new();
        if let Some(links) = links {
            let now = link_states(links);
            let mut indexes: Vec<u32> = self.links.keys().chain(now.keys()).copied().collect();
            indexes.sort_unstable();
            indexes.dedup();
            for index in indexes {
                match (self.links.get(&index), now.get(&index)) {
                    (Some((before, _)), Some((link, _))) if before.carrier != link.carrier => {
                        events.push(carrier_event(index, link.name.clone(), link.carrier));
                    }
                    // Deleted meanwhile, with carrier when last seen.
                    (Some((gone, _)), None) if gone.carrier => {
                        events.push(carrier_event(index, gone.name.clone(), false));
                    }
                    _ => {}
                }
            }
            self.links = now;
        }
        events.push(KernelEvent::Resync);
        events
    }
}

pub(super) fn link_states(links: &[LinkMessage]) -> HashMap<u32, (Interface, bool)> {
    links
        .iter()
        .map(|l| (l.header.index, link_state(l)))
        .collect()
}

/// A link as a read describes it (routes aside), and whether it is up.
fn link_state(link: &LinkMessage) -> (Interface, bool) {
    (
        describe_link(link, &[]),
        link.header.flags.contains(LinkFlags::Up),
    )
}

pub(super) fn carrier_event(ifindex: u32, interface: String, carrier: bool) -> KernelEvent {
    if carrier {
        KernelEvent::CarrierRegained { ifindex, interface }
    } else {
        KernelEvent::CarrierLost { ifindex, interface }
    }
}

impl Drop for Translator {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        state.subscriptions = state.subscriptions.saturating_sub(1);
        if state.subscriptions == 0 {
            // Nobody is left to consume them.
            state.own_deletes.clear();
        }
    }
}
