//! The address backend on a real kernel, over rtnetlink.
//!
//! One netlink connection carries requests; each [`Events`] subscription opens
//! two of its own, one bound to the link and address multicast groups and one
//! to the route groups, because a socket that both dumps and listens mixes
//! replies with notifications, and a burst of routes that overflows its
//! socket should cost a read of the links, not a resync of every address.
//!
//! # Ownership
//!
//! Ownership lives in two places that back each other up: the `IFA_PROTO`
//! tag in the kernel and the record file. Whether the kernel keeps the tag is
//! decided once, from the running kernel's release (5.18 and later keep it),
//! and checked once against the kernel's answer after the first address is
//! added. It is never inferred from tags seen on other addresses: a host with
//! IPv6 disabled has no kernel-tagged address at all.
//!
//! - **Tags kept**: an address is ours exactly when it carries our tag. An
//!   untagged address is never ours, even if the record lists it: someone
//!   re-added it by hand.
//! - **Tags dropped** (older kernels, or `ifa_proto = false`): the record
//!   alone cannot tell our address from one someone added by hand with the
//!   same IP and prefix after ours expired or was deleted. So a recorded
//!   address is only claimed with evidence only ours have: a finite remaining
//!   lifetime no longer than the one the agent gives its addresses (addresses
//!   added by hand are almost always permanent), and, within a run, only if
//!   the kernel has not reported it deleted since the agent added it. With
//!   `address_lifetime = 0` (forever) there is no such evidence and the
//!   record is trusted: an address that was ours, deleted while the agent was
//!   down, and re-added by hand with the same IP and prefix is then claimed.
//!
//! A record that was unusable at startup (set aside, see `record`) leaves
//! the kernel's evidence alone to say which addresses a previous run left:
//! with tags kept, the tag, as always; with tags dropped, an address counts
//! as a previous run's until `adopt` settles them if it carries what every
//! one of ours carries and hand-added addresses almost never do:
//! `noprefixroute` and a finite remaining lifetime no longer than the
//! agent's. With `address_lifetime = 0` there is no such evidence, and the
//! previous run's addresses are left in place.
//!
//! # Cancellation
//!
//! `add` and `remove` may be cancelled at any await point without leaving an
//! address in the kernel that the backend no longer counts as its own: an
//! address is recorded before it is added, and forgotten only after the
//! kernel confirmed its deletion. A cancelled call may or may not have taken
//! effect in the kernel; calling it again settles it.
//!
//! # Renewal
//!
//! Renewing an address this run holds, with an unchanged prefix length, reads
//! only the addresses of its link (filtered by the kernel, on a connection
//! with strict checking) and then sends one `RTM_NEWADDR` with
//! `NLM_F_REPLACE`, as long as an event subscription is running: the
//! subscription is what tells the backend that the address was deleted
//! meanwhile (and that whatever now holds the IP may be someone else's),
//! which sends the next `add` down the full path. The read closes the window
//! in which that deletion is still queued on the event socket: a replace
//! turns whatever holds the IP into ours (tag, lifetime, flags), so it is
//! only sent when the kernel's address at that IP is still ours. What is
//! left is the time between that read and the replace (one netlink round
//! trip), against someone deleting and re-adding the address in between.

mod add;
mod batch;
mod events;
mod links;
mod listening;
mod ownership;
mod remove;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use hostlb_api::{Family, Prefix};
use rtnetlink::constants::{
    RTMGRP_IPV4_IFADDR, RTMGRP_IPV4_ROUTE, RTMGRP_IPV6_IFADDR, RTMGRP_IPV6_ROUTE, RTMGRP_LINK,
};
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::link::{LinkFlags, LinkMessage};
use rtnetlink::sys::{AsyncSocket, SocketAddr};
use rtnetlink::{Handle, LinkDummy, LinkUnspec};

use super::error::errno;
use super::record::{Loaded, Record, RecordWriter, Snapshot};
use super::routes::{self};
use super::{
    AbortOnDrop, AddressBackend, Applied, DEFAULT_ADDRESS_LIFETIME, EVENT_QUEUE, Error, Events,
    Interface, KernelEvent, Lifetime, LinksRead, OwnedAddress, Result, VipAddress, event_channel,
};
use events::Translator;
use links::describe_link;
use ownership::{KernelAddress, Owned, Presence, State, Tags, tags_of_running_kernel};

/// Where the backend keeps its record and how it tags addresses.
#[derive(Clone, Debug)]
pub struct NetlinkConfig {
    /// Holds `addresses.json`; `/run/lbnodeagent` in production.
    pub run_dir: PathBuf,
    /// Tag added addresses with [`IFA_PROTO_HOSTLB`] and trust the tag where
    /// the kernel keeps it. Turned off only to exercise the record-only path
    /// that kernels before 5.18 take, or if another tool on the host used the
    /// same value.
    pub ifa_proto: bool,
    /// The lifetime the agent gives its addresses
    /// (`announce.address_lifetime`). Where the kernel drops tags, an address
    /// a previous run recorded is only claimed if the kernel counts down no
    /// more than this for it (see the module doc). After lowering it, or
    /// going from forever to a finite lifetime, across a restart on such a
    /// kernel, the previous run's addresses are left alone (they expire by
    /// their old lifetime, or stay if that was forever).
    pub address_lifetime: Lifetime,
    /// Receive buffer of event sockets. Bursts beyond it are lost and
    /// reported as [`KernelEvent::Resync`].
    pub event_buffer_bytes: usize,
}

impl Default for NetlinkConfig {
    fn default() -> Self {
        NetlinkConfig {
            run_dir: PathBuf::from("/run/lbnodeagent"),
            ifa_proto: true,
            address_lifetime: Lifetime::new(DEFAULT_ADDRESS_LIFETIME),
            event_buffer_bytes: 1 << 20,
        }
    }
}

impl NetlinkConfig {
    /// The production settings with the record under `run_dir` (a temporary
    /// directory in tests).
    pub fn for_test(run_dir: impl Into<PathBuf>) -> Self {
        NetlinkConfig {
            run_dir: run_dir.into(),
            ..NetlinkConfig::default()
        }
    }
}

/// Deletions a batch of removals keeps in flight on the netlink connection
/// at once: the kernel handles them one by one anyway, and this keeps the
/// socket's buffers far from full. Adds go many to a datagram instead
/// (`batch`).
pub(super) const IN_FLIGHT: usize = 64;

/// The multicast groups of route changes, both families.
const ROUTE_GROUPS: u32 = RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE;

/// Notifications as a listening connection hands them over.
type Notifications =
    futures::channel::mpsc::UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>;

/// A netlink connection that only listens: bound to the multicast
/// `groups`, with a receive buffer of `buffer_bytes`, and `filter`
/// attached so that the kernel drops what the agent would only parse and
/// drop. The filter is only an optimisation: without it (`what` names the
/// notifications it drops, in the warning) every notification still
/// arrives and the ones not acted on are dropped by the translator.
fn listening(
    groups: u32,
    buffer_bytes: usize,
    filter: &[socket2::SockFilter],
    what: &str,
) -> Result<(
    rtnetlink::proto::Connection<RouteNetlinkMessage>,
    Notifications,
)> {
    let (mut connection, _, messages) = rtnetlink::new_connection().map_err(Error::Socket)?;
    let socket = connection.socket_mut().socket_mut();
    socket
        .bind(&SocketAddr::new(0, groups))
        .map_err(Error::Socket)?;
    socket.set_rx_buf_sz(buffer_bytes).map_err(Error::Socket)?;
    if let Err(error) = socket2::SockRef::from(&*socket).attach_filter(filter) {
        tracing::warn!(%error, "cannot filter {what} notifications in the kernel; reading them all");
    }
    Ok((connection, messages))
}

/// The address backend of a real host. Create it inside the Tokio runtime
/// that will drive it: its netlink connection is a task on that runtime.
pub struct NetlinkBackend {
    handle: Handle,
    /// With `NETLINK_GET_STRICT_CHK`, so that the kernel honours the link
    /// filter of an address dump: renewal reads one link, not the host.
    strict: Handle,
    config: NetlinkConfig,
    record: RecordWriter,
    state: Arc<Mutex<State>>,
    /// Adds and renewals, many to a datagram.
    batches: batch::Batches,
    _connection: AbortOnDrop,
    _strict_connection: AbortOnDrop,
}

impl NetlinkBackend {
    /// Opens the netlink connection, reads the previous run's record and
    /// decides from the kernel release whether tags are kept.
    pub async fn new(config: NetlinkConfig) -> Result<NetlinkBackend> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(Error::Socket)?;
        let connection = AbortOnDrop(tokio::spawn(connection));
        // Kernels before 4.20 have no strict checking: they ignore the link
        // filter, and the dump is filtered here instead.
        let (strict_connection, strict, _) = rtnetlink::new_connection_with_strict_check()
            .or_else(|_| rtnetlink::new_connection())
            .map_err(Error::Socket)?;
        let strict_connection = AbortOnDrop(tokio::spawn(strict_connection));
        let batches = batch::Batches::new().map_err(Error::Socket)?;
        let record = Record::new(&config.run_dir);
        let (previous, record_lost) = match record.load_or_set_aside()? {
            Loaded::Found(previous) => (previous, false),
            Loaded::SetAside(_) => (BTreeSet::new(), true),
        };
        let tags = if config.ifa_proto {
            tags_of_running_kernel()
        } else {
            Tags::Dropped
        };
        Ok(NetlinkBackend {
            handle,
            strict,
            record: RecordWriter::new(record),
            state: Arc::new(Mutex::new(State {
                owned: BTreeMap::new(),
                previous,
                record_lost,
                tags,
                probe_pending: config.ifa_proto,
                own_deletes: HashMap::new(),
                subscriptions: 0,
                record_seq: 0,
                promoted: BTreeSet::new(),
            })),
            config,
            batches,
            _connection: connection,
            _strict_connection: strict_connection,
        })
    }

    /// Writes `snapshot` to the record, off the runtime.
    async fn save(&self, snapshot: Snapshot) -> Result<()> {
        self.record.save(snapshot).await
    }
}

impl AddressBackend for NetlinkBackend {
    async fn announce_interface(
        &self,
        family: Family,
        configured: Option<&str>,
    ) -> Result<Interface> {
        if let Some(name) = configured.filter(|n| !n.is_empty()) {
            return self.interface(name).await;
        }
        let routes = self.routes().await?;
        let index =
            routes::default_interface(&routes, family).ok_or(Error::NoDefaultRoute { family })?;
        let link = self
            .link_by_index(index)
            .await?
            .ok_or(Error::InterfaceGone { index })?;
        Ok(describe_link(&link, &routes))
    }

    async fn interface(&self, name: &str) -> Result<Interface> {
        let link = self
            .link_by_name(name)
            .await?
            .ok_or_else(|| Error::NoSuchInterface {
                name: name.to_string(),
            })?;
        self.describe(&link).await
    }

    async fn interfaces(&self) -> Result<Vec<Interface>> {
        let routes = self.routes().await?;
        let links = self.links().await?;
        Ok(links.iter().map(|l| describe_link(l, &routes)).collect())
    }

    /// Three netlink dumps (IPv4 and IPv6 routes, links) where the three
    /// calls it stands for make nine, each a round trip to the kernel
    /// worker's thread: most of an idle agent's netlink traffic.
    async fn links_and_announce(&self, configured: Option<&str>) -> LinksRead {
        let read = async { Ok::<_, Error>((self.routes().await?, self.links().await?)) }.await;
        let (routes, links) = match read {
            Ok(read) => read,
            Err(e) => {
                // Each part as its own call would have it.
                let v4 = self.announce_interface(Family::V4, configured).await;
                let v6 = self.announce_interface(Family::V6, configured).await;
                return LinksRead {
                    all: Err(e),
                    announce: [v4, v6],
                    local: Vec::new(),
                    gateways: Vec::new(),
                };
            }
        };
        let all: Vec<Interface> = links.iter().map(|l| describe_link(l, &routes)).collect();
        let announce = match configured.filter(|n| !n.is_empty()) {
            // The same interface for both families.
            Some(name) => match all.iter().find(|i| i.name == name) {
                Some(i) => [Ok(i.clone()), Ok(i.clone())],
                // Perhaps one of a link's alternative names, which the
                // kernel resolves and a dump does not list.
                None => [self.interface(name).await, self.interface(name).await],
            },
            None => [Family::V4, Family::V6].map(|family| {
                let index = routes::default_interface(&routes, family)
                    .ok_or(Error::NoDefaultRoute { family })?;
                all.iter()
                    .find(|i| i.index == index)
                    .cloned()
                    .ok_or(Error::InterfaceGone { index })
            }),
        };
        let gateways = [Family::V4, Family::V6]
            .into_iter()
            .filter_map(|family| routes::default_gateway(&routes, family))
            .filter_map(|(ifindex, addr)| {
                let interface = all.iter().find(|i| i.index == ifindex)?.name.clone();
                Some(crate::model::Gateway {
                    interface,
                    ifindex,
                    addr,
                })
            })
            .collect();
        LinksRead {
            all: Ok(all),
            announce,
            local: routes::local_addresses(&routes),
            gateways,
        }
    }

    async fn ensure_virtual_interface(&self, name: &str) -> Result<Interface> {
        let created = self
            .handle
            .link()
            .add(LinkDummy::new(name).up().build())
            .execute()
            .await;
        let unsupported = match created {
            Ok(()) => {
                tracing::info!(interface = name, "created virtual interface");
                false
            }
            Err(e) if errno(&e) == Some(libc::EEXIST) => false,
            Err(e) if errno(&e) == Some(libc::EOPNOTSUPP) => true,
            Err(e) => return Err(Error::netlink(format!("creating dummy link {name:?}"), e)),
        };
        let Some(link) = self.link_by_name(name).await? else {
            return Err(Error::VirtualInterface {
                name: name.to_string(),
                reason: if unsupported {
                    "this kernel has no dummy link type and no interface of that name exists"
                        .to_string()
                } else {
                    "it disappeared right after it was created".to_string()
                },
            });
        };
        if !link.header.flags.contains(LinkFlags::Up) {
            self.handle
                .link()
                .set(LinkUnspec::new_with_index(link.header.index).up().build())
                .execute()
                .await
                .map_err(|e| Error::netlink(format!("setting {name:?} up"), e))?;
            return self.interface(name).await;
        }
        self.describe(&link).await
    }

    async fn add(&self, vip: &VipAddress) -> Result<Applied> {
        if Prefix::new(vip.ip, vip.prefix_len).is_none() {
            return Err(Error::InvalidPrefix {
                ip: vip.ip,
                prefix_len: vip.prefix_len,
            });
        }
        if let Some(renewed) = self.renew(vip).await {
            return renewed;
        }
        self.add_checked(vip).await
    }

    async fn add_many(&self, vips: &[VipAddress]) -> Vec<Result<Applied>> {
        self.add_batch(vips).await
    }

    async fn remove_many(&self, vips: &[VipAddress]) -> Vec<Result<Applied>> {
        self.remove_batch(vips).await
    }

    async fn remove(&self, vip: &VipAddress) -> Result<Applied> {
        let key = (vip.ifindex, vip.ip);
        let on_link = self
            .addresses(Some(Family::of(vip.ip)), Some(vip.ifindex))
            .await?;
        let (ours, foreign): (Vec<&KernelAddress>, Vec<&KernelAddress>) = {
            let state = self.lock();
            on_link
                .iter()
                .filter(|a| a.ip == vip.ip)
                .partition(|a| self.is_ours(&state, &vip.interface, a))
        };
        for a in &ours {
            self.delete_ours(a, &vip.interface, &on_link).await?;
            tracing::info!(ip = %a.ip, prefix_len = a.prefix_len, interface = %vip.interface,
                "removed address");
        }
        {
            // Forgotten only now that the kernel confirmed: a failed or
            // cancelled remove leaves it owned, to be removed again.
            let forgotten = {
                let mut state = self.lock();
                state
                    .forget(&vip.interface, key, None)
                    .then(|| state.snapshot())
            };
            if let Some(snapshot) = forgotten {
                self.save(snapshot).await?;
            }
        }
        if ours.is_empty() && !foreign.is_empty() {
            tracing::warn!(ip = %vip.ip, interface = %vip.interface,
                "address present but not added by hostlb; leaving it alone");
            return Ok(Applied::NotOurs);
        }
        Ok(Applied::Done)
    }

    async fn adopt(&self) -> Result<Vec<OwnedAddress>> {
        let found = self.ours_in_kernel().await?;
        let snapshot = {
            let mut state = self.lock();
            state.previous.clear();
            state.record_lost = false;
            state.owned = found
                .iter()
                .map(|o| {
                    let owned = Owned {
                        address: o.clone(),
                        lifetime: self.config.address_lifetime,
                        presence: Presence::Held,
                    };
                    ((o.ifindex, o.ip), owned)
                })
                .collect();
            state.snapshot()
        };
        self.save(snapshot).await?;
        for o in &found {
            tracing::info!(ip = %o.ip, prefix_len = o.prefix_len, interface = %o.interface,
                "found address of a previous run");
        }
        Ok(found)
    }

    async fn owned(&self) -> Result<Vec<OwnedAddress>> {
        self.ours_in_kernel().await
    }

    async fn subscribe(&self) -> Result<Events> {
        let buffer = self.config.event_buffer_bytes;
        let (connection, mut messages) = listening(
            RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR,
            buffer,
            &events::new_address_filter(),
            "new-address",
        )?;
        // Routes on a socket of their own: a burst of them (a routing
        // daemon's table in main, a flush) that overflows it costs one
        // read of the links, not a resync of every address held.
        let (route_connection, mut route_messages) =
            listening(ROUTE_GROUPS, buffer, &events::route_filter(), "route")?;
        // Bound before the link states are read, so no change falls between.
        let links = self.links().await?;
        let mut translator = Translator::new(Arc::clone(&self.state), &links);
        let handle = self.handle.clone();
        let (tx, mut subscription) = event_channel(EVENT_QUEUE);
        let task = tokio::spawn(async move {
            let connection = AbortOnDrop(tokio::spawn(connection));
            let route_connection = AbortOnDrop(tokio::spawn(route_connection));
            loop {
                let events = tokio::select! {
                    message = messages.next() => {
                        let Some((message, _)) = message else { break };
                        let overrun = matches!(message.payload, NetlinkPayload::Overrun(_));
                        let mut events = translator.translate(message.payload);
                        if overrun {
                            // Carrier changes may be among the lost events:
                            // compare with the kernel's links now, and only
                            // then resync.
                            let links: std::result::Result<Vec<LinkMessage>, _> =
                                handle.link().get().execute().try_collect().await;
                            events.extend(translator.overrun(links.ok().as_deref()));
                        }
                        events
                    }
                    message = route_messages.next() => {
                        let Some((message, _)) = message else { break };
                        match message.payload {
                            NetlinkPayload::Overrun(_) => vec![KernelEvent::LinksChanged],
                            payload => translator.translate(payload),
                        }
                    }
                };
                for event in events {
                    if !tx.send(event) {
                        return;
                    }
                }
            }
            drop((connection, route_connection));
            tracing::warn!("kernel event stream ended");
        });
        subscription.attach(task);
        Ok(subscription)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rtnetlink::packet_route::RouteNetlinkMessage;
    use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage, CacheInfo};
    use rtnetlink::packet_route::link::LinkAttribute;

    use super::ownership::{ExpectedDelete, counts_down_within, lock, longer, release_keeps_tags};
    use super::*;
    use crate::addrs::KernelEvent;
    use crate::addrs::record::Entry;

    /// A state owning nothing, with no record and no subscription.
    fn bare_state(tags: Tags) -> State {
        State {
            owned: BTreeMap::new(),
            previous: BTreeSet::new(),
            record_lost: false,
            tags,
            probe_pending: false,
            own_deletes: HashMap::new(),
            subscriptions: 0,
            record_seq: 0,
            promoted: BTreeSet::new(),
        }
    }

    fn state(owned: &[OwnedAddress]) -> Arc<Mutex<State>> {
        Arc::new(Mutex::new(State {
            owned: owned
                .iter()
                .map(|o| {
                    let owned = Owned {
                        address: o.clone(),
                        lifetime: Lifetime::FOREVER,
                        presence: Presence::Held,
                    };
                    ((o.ifindex, o.ip), owned)
                })
                .collect(),
            ..bare_state(Tags::Kept)
        }))
    }

    fn translator(owned: &[OwnedAddress]) -> Translator {
        Translator::new(state(owned), &[])
    }

    fn link(index: u32, name: &str, flags: LinkFlags) -> LinkMessage {
        let mut l = LinkMessage::default();
        l.header.index = index;
        l.header.flags = flags;
        l.attributes.push(LinkAttribute::IfName(name.to_string()));
        l
    }

    fn del_address(index: u32, ip: &str, prefix_len: u8) -> NetlinkPayload<RouteNetlinkMessage> {
        let mut m = AddressMessage::default();
        m.header.index = index;
        m.header.prefix_len = prefix_len;
        m.attributes
            .push(AddressAttribute::Address(ip.parse().unwrap()));
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(m))
    }

    fn ours(index: u32, ip: &str, prefix_len: u8) -> OwnedAddress {
        OwnedAddress {
            interface: "eth0".into(),
            ifindex: index,
            ip: ip.parse().unwrap(),
            prefix_len,
        }
    }

    fn kernel_address(ip: &str, prefix_len: u8, valid_secs: Option<u32>) -> KernelAddress {
        let mut m = AddressMessage::default();
        m.header.index = 2;
        m.header.prefix_len = prefix_len;
        m.attributes
            .push(AddressAttribute::Address(ip.parse().unwrap()));
        let mut ci = CacheInfo::default();
        ci.ifa_valid = valid_secs.unwrap_or(u32::MAX);
        m.attributes.push(AddressAttribute::CacheInfo(ci));
        KernelAddress::parse(&m).unwrap()
    }

    #[test]
    fn only_our_removed_addresses_are_reported() {
        let mut t = translator(&[ours(2, "10.0.0.100", 24)]);
        assert_eq!(
            t.translate(del_address(2, "10.0.0.100", 24)),
            vec![KernelEvent::AddressRemoved(ours(2, "10.0.0.100", 24))]
        );
        // someone else's address, the same IP on another link, another
        // prefix length: only a change of the links to read
        let changed = vec![KernelEvent::LinksChanged];
        assert_eq!(t.translate(del_address(2, "10.0.0.7", 24)), changed);
        assert_eq!(t.translate(del_address(3, "10.0.0.100", 24)), changed);
        assert_eq!(t.translate(del_address(2, "10.0.0.100", 32)), changed);
        // Reported once: whatever holds the IP later was not added by us.
        assert_eq!(t.translate(del_address(2, "10.0.0.100", 24)), changed);
        let state = lock(&t.state);
        assert_eq!(
            state.owned[&(2, "10.0.0.100".parse().unwrap())].presence,
            Presence::Removed
        );
    }

    #[test]
    fn our_own_deletions_are_not_reported() {
        let mut t = translator(&[ours(2, "10.0.0.100", 24)]);
        let key = (2, "10.0.0.100".parse().unwrap());
        ExpectedDelete::new(&t.state, key).happened();
        assert!(t.translate(del_address(2, "10.0.0.100", 24)).is_empty());
        assert!(lock(&t.state).own_deletes.is_empty(), "consumed");
        // A deletion the kernel refused (or that was cancelled) leaves no
        // expectation behind, so the next one by hand is reported.
        drop(ExpectedDelete::new(&t.state, key));
        assert_eq!(
            t.translate(del_address(2, "10.0.0.100", 24)),
            vec![KernelEvent::AddressRemoved(ours(2, "10.0.0.100", 24))]
        );
    }

    #[test]
    fn carrier_transitions_are_reported_once() {
        let up = LinkFlags::Up | LinkFlags::LowerUp | LinkFlags::Running;
        let mut t = Translator::new(state(&[]), &[link(2, "eth0", up)]);
        let new = |l| NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l));
        assert!(t.translate(new(link(2, "eth0", up))).is_empty());
        assert_eq!(
            t.translate(new(link(2, "eth0", LinkFlags::Up))),
            vec![KernelEvent::CarrierLost {
                ifindex: 2,
                interface: "eth0".into()
            }]
        );
        assert!(t.translate(new(link(2, "eth0", LinkFlags::Up))).is_empty());
        assert_eq!(
            t.translate(new(link(2, "eth0", up))),
            vec![KernelEvent::CarrierRegained {
                ifindex: 2,
                interface: "eth0".into()
            }]
        );
        // administratively down counts as lost
        assert_eq!(
            t.translate(new(link(2, "eth0", LinkFlags::LowerUp))),
            vec![KernelEvent::CarrierLost {
                ifindex: 2,
                interface: "eth0".into()
            }]
        );
        // a link seen for the first time is no transition, but a change
        // a read of the links shows
        assert_eq!(
            t.translate(new(link(9, "veth9", up))),
            vec![KernelEvent::LinksChanged]
        );
        // deleting a link that had carrier loses it
        assert_eq!(
            t.translate(NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(
                link(9, "veth9", up)
            ))),
            vec![KernelEvent::CarrierLost {
                ifindex: 9,
                interface: "veth9".into()
            }]
        );
    }

    /// What a read of the links shows of a link (its name, MAC, ARP, and
    /// its presence) asks for a read when it changes; what it does not
    /// show asks for nothing.
    #[test]
    fn link_changes_a_read_shows_ask_for_one() {
        let up = LinkFlags::Up | LinkFlags::LowerUp | LinkFlags::Running;
        let with_mac = |mac: [u8; 6], flags| {
            let mut l = link(2, "eth0", flags);
            l.attributes.push(LinkAttribute::Address(mac.to_vec()));
            l
        };
        let mut t = Translator::new(state(&[]), &[with_mac([2, 0, 0, 0, 0, 1], up)]);
        let new = |l| NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l));
        let changed = vec![KernelEvent::LinksChanged];
        // statistics or features: the same link as far as a read goes
        let mut same = with_mac([2, 0, 0, 0, 0, 1], up);
        same.attributes.push(LinkAttribute::Mtu(9000));
        assert!(t.translate(new(same)).is_empty());
        assert_eq!(t.translate(new(with_mac([2, 0, 0, 0, 0, 2], up))), changed);
        assert_eq!(
            t.translate(new(with_mac([2, 0, 0, 0, 0, 2], up | LinkFlags::Noarp))),
            changed
        );
        let mut renamed = with_mac([2, 0, 0, 0, 0, 2], up | LinkFlags::Noarp);
        renamed.attributes[0] = LinkAttribute::IfName("uplink".into());
        assert_eq!(t.translate(new(renamed.clone())), changed);
        assert!(t.translate(new(renamed)).is_empty());
        // deleted without carrier: no carrier event, but a change
        let mut down = link(5, "veth5", LinkFlags::Up);
        assert_eq!(t.translate(new(down.clone())), changed);
        // set down while it had no carrier: IPv4 dropped its routes
        down.header.flags = LinkFlags::empty();
        assert_eq!(t.translate(new(down.clone())), changed);
        assert_eq!(
            t.translate(NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(
                down
            ))),
            changed
        );
    }

    /// Routes of the main table ask for a read of the links; the `local`
    /// routes every address (a VIP among them) brings, and other tables,
    /// do not: the same rule as the socket's filter, for a socket without
    /// one.
    #[test]
    fn main_table_routes_ask_for_a_read_and_local_addresses_do_not() {
        use rtnetlink::packet_route::route::{
            RouteAddress, RouteAttribute, RouteMessage, RouteType,
        };
        let route = |table: u8, kind: RouteType, extra: Option<u32>| {
            let mut m = RouteMessage::default();
            m.header.address_family = rtnetlink::packet_route::AddressFamily::Inet;
            m.header.destination_prefix_length = 24;
            m.header.table = table;
            m.header.kind = kind;
            m.attributes
                .push(RouteAttribute::Destination(RouteAddress::Inet(
                    "10.0.0.0".parse().unwrap(),
                )));
            m.attributes.push(RouteAttribute::Oif(2));
            if let Some(t) = extra {
                m.attributes.push(RouteAttribute::Table(t));
            }
            m
        };
        let mut t = translator(&[]);
        let main = libc::RT_TABLE_MAIN;
        let local = libc::RT_TABLE_LOCAL;
        let changed = vec![KernelEvent::LinksChanged];
        let new = |m| NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(m));
        let del = |m| NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelRoute(m));
        assert_eq!(
            t.translate(new(route(main, RouteType::Unicast, None))),
            changed
        );
        assert_eq!(
            t.translate(del(route(main, RouteType::Unicast, None))),
            changed
        );
        assert_eq!(
            t.translate(new(route(local, RouteType::Broadcast, None))),
            changed
        );
        assert!(
            t.translate(new(route(local, RouteType::Local, None)))
                .is_empty()
        );
        assert!(
            t.translate(del(route(local, RouteType::Local, None)))
                .is_empty()
        );
        assert!(
            t.translate(new(route(100, RouteType::Unicast, None)))
                .is_empty()
        );
        // a table beyond 255 is named by its attribute
        assert!(
            t.translate(new(route(252, RouteType::Unicast, Some(1000))))
                .is_empty()
        );
    }

    /// The route socket's filter, in the kernel: of 100 addresses' `local`
    /// routes, 50 routes of another table and a main-table route, only the
    /// main table's reach the socket; an address with a prefix brings its
    /// main-table prefix route and the `local` table's broadcast route,
    /// which is kept (a read does not use it, but it comes only with host
    /// addresses, never with VIPs).
    #[test]
    fn the_route_filter_keeps_what_a_read_of_the_links_shows() {
        crate::announce::in_new_netns(|| async {
            let (connection, mut messages) =
                listening(ROUTE_GROUPS, 1 << 20, &events::route_filter(), "route").unwrap();
            let _connection = AbortOnDrop(tokio::spawn(connection));
            let mut batch: String = (0..100)
                .map(|i| format!("addr add 10.88.0.{}/32 dev v0\n", i + 1))
                .collect();
            for i in 0..50 {
                batch.push_str(&format!("route add 10.66.{i}.0/24 dev v0 table 100\n"));
            }
            batch.push_str("route add 10.67.0.0/24 dev v0\n");
            batch.push_str("addr add 10.68.0.1/24 dev v0\n");
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("batch");
            std::fs::write(&file, batch).unwrap();
            let ok = std::process::Command::new("ip")
                .arg("-batch")
                .arg(&file)
                .status()
                .unwrap()
                .success();
            assert!(ok);
            let mut seen = Vec::new();
            while let Ok(Some((m, _))) =
                tokio::time::timeout(Duration::from_millis(300), messages.next()).await
            {
                match m.payload {
                    NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewRoute(r)) => {
                        let r = routes::Route::parse(&r).expect("an IPv4 route");
                        seen.push((r.table, r.kind, r.destination.to_string()));
                    }
                    other => panic!("only route notifications: {other:?}"),
                }
            }
            let main = u32::from(libc::RT_TABLE_MAIN);
            let local = u32::from(libc::RT_TABLE_LOCAL);
            use rtnetlink::packet_route::route::RouteType;
            assert_eq!(
                seen,
                vec![
                    (main, RouteType::Unicast, "10.67.0.0/24".to_string()),
                    (main, RouteType::Unicast, "10.68.0.0/24".to_string()),
                    (local, RouteType::Broadcast, "10.68.0.255/32".to_string()),
                ],
            );
        });
    }

    #[test]
    fn overrun_reports_carrier_changes_it_hid_before_asking_for_a_resync() {
        let up = LinkFlags::Up | LinkFlags::LowerUp;
        let mut t = Translator::new(
            state(&[ours(2, "10.0.0.100", 24)]),
            &[
                link(2, "eth0", up),
                link(3, "eth1", LinkFlags::Up),
                link(4, "veth4", up),
            ],
        );
        assert!(t.translate(NetlinkPayload::Overrun(Vec::new())).is_empty());
        // Meanwhile eth0 lost carrier, eth1 gained it, veth4 was deleted and
        // veth5 created.
        let now = [
            link(2, "eth0", LinkFlags::Up),
            link(3, "eth1", up),
            link(5, "veth5", up),
        ];
        let lost = |i: u32, n: &str| KernelEvent::CarrierLost {
            ifindex: i,
            interface: n.into(),
        };
        assert_eq!(
            t.overrun(Some(&now)),
            vec![
                lost(2, "eth0"),
                KernelEvent::CarrierRegained {
                    ifindex: 3,
                    interface: "eth1".into()
                },
                lost(4, "veth4"),
                KernelEvent::Resync,
            ]
        );
        // The comparison continues from the new state.
        let new = |l| NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(l));
        assert!(t.translate(new(link(2, "eth0", LinkFlags::Up))).is_empty());
        // Lost events may have hidden a deletion of ours: checked again at
        // the next renewal.
        assert_eq!(
            lock(&t.state).owned[&(2, "10.0.0.100".parse().unwrap())].presence,
            Presence::Unverified
        );
        // Links unreadable: still a resync.
        assert_eq!(t.overrun(None), vec![KernelEvent::Resync]);
    }

    #[test]
    fn subscriptions_are_counted_and_a_new_one_rechecks_held_addresses() {
        let s = state(&[ours(2, "10.0.0.100", 24)]);
        let key = (2, "10.0.0.100".parse().unwrap());
        let first = Translator::new(Arc::clone(&s), &[]);
        assert_eq!(lock(&s).owned[&key].presence, Presence::Unverified);
        lock(&s).owned.get_mut(&key).unwrap().presence = Presence::Held;
        let second = Translator::new(Arc::clone(&s), &[]);
        assert_eq!(lock(&s).subscriptions, 2);
        assert_eq!(lock(&s).owned[&key].presence, Presence::Held);
        ExpectedDelete::new(&s, key).happened();
        assert_eq!(lock(&s).own_deletes[&key], 2, "one per subscription");
        drop(first);
        drop(second);
        assert_eq!(lock(&s).subscriptions, 0);
        assert!(lock(&s).own_deletes.is_empty());
    }

    #[test]
    fn tag_support_follows_the_kernel_release() {
        for (release, kept) in [
            ("6.18.44-fc-v657", Some(true)),
            ("5.18.0", Some(true)),
            ("5.18-rc1", Some(true)),
            ("6.1.0-18-amd64", Some(true)),
            ("10.0", Some(true)),
            ("5.14.0-362.el9.x86_64", Some(false)),
            ("4.18.0-553.el8_10.x86_64", Some(false)),
            ("5.17.15\n", Some(false)),
            ("6", Some(true)),
            ("", None),
            ("linux", None),
            ("5.x", None),
        ] {
            assert_eq!(release_keeps_tags(release), kept, "{release:?}");
        }
    }

    #[test]
    fn without_tags_a_recorded_address_needs_a_lifetime_only_ours_have() {
        let fifteen = Lifetime::new(Duration::from_secs(15));
        let mut st = State {
            previous: BTreeSet::from([Entry {
                interface: "eth0".into(),
                address: "10.0.0.100".parse().unwrap(),
                prefix_len: 24,
            }]),
            ..bare_state(Tags::Dropped)
        };
        let a = |valid| kernel_address("10.0.0.100", 24, valid);
        // A previous run's address: counting down no more than our lifetime.
        assert!(st.claims("eth0", &a(Some(9)), fifteen));
        assert!(st.claims("eth0", &a(Some(15)), fifteen));
        // Permanent or longer-lived: added by hand after ours went.
        assert!(!st.claims("eth0", &a(None), fifteen));
        assert!(!st.claims("eth0", &a(Some(100)), fifteen));
        // Not recorded, or another prefix length or interface.
        assert!(!st.claims("eth0", &kernel_address("10.0.0.7", 24, Some(9)), fifteen));
        assert!(!st.claims("eth0", &kernel_address("10.0.0.100", 25, Some(9)), fifteen));
        assert!(!st.claims("eth1", &a(Some(9)), fifteen));
        // Forever configured: the record is all there is.
        assert!(st.claims("eth0", &a(None), Lifetime::FOREVER));

        // This run's own address: its own lifetime is the bound, and once
        // the kernel reported it deleted, nothing at that IP is ours.
        let key = (2, "10.0.0.100".parse().unwrap());
        st.owned.insert(
            key,
            Owned {
                address: ours(2, "10.0.0.100", 24),
                lifetime: Lifetime::new(Duration::from_secs(30)),
                presence: Presence::Held,
            },
        );
        assert!(st.claims("eth0", &a(Some(25)), fifteen));
        assert!(!st.claims("eth0", &a(None), fifteen));
        st.owned.get_mut(&key).unwrap().lifetime = Lifetime::FOREVER;
        assert!(st.claims("eth0", &a(None), fifteen));
        st.owned.get_mut(&key).unwrap().presence = Presence::Removed;
        assert!(!st.claims("eth0", &a(None), fifteen));
        assert!(!st.claims("eth0", &a(Some(9)), fifteen));
    }

    #[test]
    fn without_tags_or_record_only_our_kind_of_address_is_a_previous_runs() {
        let fifteen = Lifetime::new(Duration::from_secs(15));
        let mut st = State {
            record_lost: true,
            ..bare_state(Tags::Dropped)
        };
        let a = |valid, noprefixroute| {
            let mut a = kernel_address("10.0.0.100", 24, valid);
            a.noprefixroute = noprefixroute;
            a
        };
        assert!(st.claims("eth0", &a(Some(9), true), fifteen));
        // Added by hand: permanent, longer-lived, or with its prefix route.
        assert!(!st.claims("eth0", &a(None, true), fifteen));
        assert!(!st.claims("eth0", &a(Some(100), true), fifteen));
        assert!(!st.claims("eth0", &a(Some(9), false), fifteen));
        // Forever configured: no evidence at all.
        assert!(!st.claims("eth0", &a(None, true), Lifetime::FOREVER));
        // With a usable record, the record decides.
        st.record_lost = false;
        assert!(!st.claims("eth0", &a(Some(9), true), fifteen));
    }

    #[test]
    fn longer_lifetime_treats_zero_as_forever() {
        let s = |n| Lifetime::new(Duration::from_secs(n));
        assert_eq!(longer(s(5), s(15)), s(15));
        assert_eq!(longer(s(5), Lifetime::FOREVER), Lifetime::FOREVER);
        assert!(counts_down_within(Some(3), s(3)));
        assert!(!counts_down_within(Some(4), s(3)));
        assert!(!counts_down_within(None, s(3)));
        assert!(counts_down_within(None, Lifetime::FOREVER));
    }
}
