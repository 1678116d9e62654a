//! Kernel events: netlink notifications turned into the few the loop
//! acts on (our address removed, carrier lost or back, the links or the
//! main table's routes changed, a resync after an overrun).

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::sync::{Arc, Mutex};

use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::LinkMessage;
use rtnetlink::packet_route::route::{RouteMessage, RouteType};

use super::links::describe_link;
use super::ownership::{KernelAddress, Presence, State, lock, unverify};
use crate::addrs::routes::Route;
use crate::addrs::{Interface, KernelEvent};

/// Where `nlmsg_type` lies in a netlink message's header (after the
/// 32-bit length).
const NLMSG_TYPE_OFFSET: u32 = 4;

/// Where the route message's `rtm_table` and `rtm_type` lie: after the
/// 16-byte netlink header, at 4 and 7 in `struct rtmsg`.
const RTM_TABLE_OFFSET: u32 = 16 + 4;
const RTM_TYPE_OFFSET: u32 = 16 + 7;

/// A socket filter that drops, in the kernel and before they are queued,
/// the notifications the agent would only parse and drop:
///
/// - `RTM_NEWADDR`. The agent acts on deletions only, and a holder renews
///   each of its addresses every third of their lifetime: 1,000 VIPs at
///   the shipped 15 s are 200 notifications a second, each copied to this
///   socket, waking its task, and parsed (allocations and all) only to be
///   dropped, and the same burst at a takeover of them all could overflow
///   the socket and cost a resync.
/// - Route changes outside the main table, and the `local` routes of the
///   `local` table. A read of the links looks at the main table (on-link
///   prefixes, default routes) and at the host's own addresses, which are
///   those `local` routes; but every VIP added or removed makes one, so a
///   takeover of 1,000 would bring 1,000 reads' worth of wake-ups. A host
///   address added or removed by hand is seen at the next safety read
///   instead (see the agent's `SAFETY_READ`). Routes of other tables (a
///   CNI's per-pod tables, a routing daemon's) are never read.
///
/// Each notification comes in a datagram of its own, so the filter reads
/// the first header. Its type is in host byte order and a BPF half-word
/// load reads big-endian, hence the swap.
pub(super) fn event_filter() -> Vec<socket2::SockFilter> {
    let code = |c: u32| u16::try_from(c).expect("BPF opcodes fit 16 bits");
    let message_type = |t: u16| u32::from(u16::from_be_bytes(t.to_ne_bytes()));
    let load = |size: u32, offset: u32| {
        socket2::SockFilter::new(code(libc::BPF_LD | size | libc::BPF_ABS), 0, 0, offset)
    };
    // Jumps count the instructions to skip: `equal` on a match, `other`
    // otherwise.
    let jump_if = |value: u32, equal: u8, other: u8| {
        socket2::SockFilter::new(
            code(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K),
            equal,
            other,
            value,
        )
    };
    let ret = |keep: bool| {
        socket2::SockFilter::new(
            code(libc::BPF_RET | libc::BPF_K),
            0,
            0,
            if keep { u32::MAX } else { 0 },
        )
    };
    let table = |t: u8| u32::from(t);
    vec![
        /* 0 */ load(libc::BPF_H, NLMSG_TYPE_OFFSET),
        /* 1 */ jump_if(message_type(libc::RTM_NEWADDR), 8, 0), // drop
        /* 2 */ jump_if(message_type(libc::RTM_NEWROUTE), 1, 0), // the route
        /* 3 */ jump_if(message_type(libc::RTM_DELROUTE), 0, 5), // the route, or keep
        /* 4 */ load(libc::BPF_B, RTM_TABLE_OFFSET),
        /* 5 */ jump_if(table(libc::RT_TABLE_MAIN), 3, 0), // keep
        /* 6 */ jump_if(table(libc::RT_TABLE_LOCAL), 0, 3), // the type, or drop
        /* 7 */ load(libc::BPF_B, RTM_TYPE_OFFSET),
        /* 8 */ jump_if(u32::from(libc::RTN_LOCAL), 1, 0), // drop, or keep
        /* 9 */ ret(true),
        /* 10 */ ret(false),
    ]
}

/// Whether a route change can change a read of the links: the filter's
/// rule ([`event_filter`]) again, for a socket it could not be attached to.
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
    /// Each link as a read of the links describes it (routes aside), to
    /// report changes only: the kernel sends `RTM_NEWLINK` for changes a
    /// read does not show (statistics, features, queues).
    pub(super) links: HashMap<u32, Interface>,
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
                    _ => vec![],
                }
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l)) => {
                let now = describe_link(&l, &[]);
                let carrier = now.carrier;
                match self.links.insert(l.header.index, now.clone()) {
                    Some(before) if before.carrier != carrier => {
                        vec![carrier_event(now.index, now.name, carrier)]
                    }
                    Some(before) if before == now => vec![],
                    // New, renamed, another MAC, ARP turned on or off.
                    _ => vec![KernelEvent::LinksChanged],
                }
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => {
                match self.links.remove(&l.header.index) {
                    Some(gone) if gone.carrier => {
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
                    (Some(before), Some(link)) if before.carrier != link.carrier => {
                        events.push(carrier_event(index, link.name.clone(), link.carrier));
                    }
                    // Deleted meanwhile, with carrier when last seen.
                    (Some(gone), None) if gone.carrier => {
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

pub(super) fn link_states(links: &[LinkMessage]) -> HashMap<u32, Interface> {
    links
        .iter()
        .map(|l| (l.header.index, describe_link(l, &[])))
        .collect()
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
