//! Kernel events: netlink notifications turned into the few the loop
//! acts on (our address removed, carrier lost or back, a resync after an
//! overrun).

use std::collections::HashMap;
use std::collections::hash_map::Entry as MapEntry;
use std::sync::{Arc, Mutex};

use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::LinkMessage;

use super::links::{link_carrier, link_name};
use super::ownership::{KernelAddress, Presence, State, lock, unverify};
use crate::addrs::KernelEvent;

/// Where `nlmsg_type` lies in a netlink message's header (after the
/// 32-bit length).
const NLMSG_TYPE_OFFSET: u32 = 4;

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
    let code = |c: u32| u16::try_from(c).expect("BPF opcodes fit 16 bits");
    let new_address = u32::from(u16::from_be_bytes(libc::RTM_NEWADDR.to_ne_bytes()));
    [
        socket2::SockFilter::new(
            code(libc::BPF_LD | libc::BPF_H | libc::BPF_ABS),
            0,
            0,
            NLMSG_TYPE_OFFSET,
        ),
        // Equal: on to the next instruction (drop); else skip it (keep).
        socket2::SockFilter::new(
            code(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K),
            0,
            1,
            new_address,
        ),
        socket2::SockFilter::new(code(libc::BPF_RET | libc::BPF_K), 0, 0, 0),
        socket2::SockFilter::new(code(libc::BPF_RET | libc::BPF_K), 0, 0, u32::MAX),
    ]
}

/// Turns raw netlink notifications into the few events the agent acts on.
/// While one runs, the backend renews addresses without reading the kernel
/// first: this is what tells it they were deleted.
pub(super) struct Translator {
    /// Name and carrier of each link, to report transitions only: the kernel
    /// sends `RTM_NEWLINK` for every statistics or flag change.
    pub(super) links: HashMap<u32, (String, bool)>,
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
                let index = l.header.index;
                let carrier = link_carrier(&l);
                let name = link_name(&l).unwrap_or_default();
                let was = self.links.insert(index, (name.clone(), carrier));
                match was {
                    Some((_, before)) if before != carrier => {
                        vec![carrier_event(index, name, carrier)]
                    }
                    _ => vec![],
                }
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => {
                match self.links.remove(&l.header.index) {
                    Some((name, true)) => vec![carrier_event(l.header.index, name, false)],
                    _ => vec![],
                }
            }
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
                    (Some((_, before)), Some((name, carrier))) if before != carrier => {
                        events.push(carrier_event(index, name.clone(), *carrier));
                    }
                    // Deleted meanwhile, with carrier when last seen.
                    (Some((name, true)), None) => {
                        events.push(carrier_event(index, name.clone(), false));
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

pub(super) fn link_states(links: &[LinkMessage]) -> HashMap<u32, (String, bool)> {
    links
        .iter()
        .map(|l| {
            (
                l.header.index,
                (link_name(l).unwrap_or_default(), link_carrier(l)),
            )
        })
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
