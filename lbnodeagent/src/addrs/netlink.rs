//! The address backend on a real kernel, over rtnetlink.
//!
//! One netlink connection carries requests; each [`Events`] subscription opens
//! its own, bound to the link and address multicast groups, because a socket
//! that both dumps and listens mixes replies with notifications.
//!
//! Ownership lives in two places that back each other up: the `IFA_PROTO`
//! tag in the kernel (5.18 and later) and the record file. An address is ours
//! when it carries our tag, or, where the kernel does not keep tags, when the
//! record lists it. Once the kernel is seen to keep tags, an untagged address
//! is never ours, even if the record lists it: someone re-added it by hand.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{StreamExt, TryStreamExt};
use hostlb_api::{Family, Prefix};
use rtnetlink::constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR, RTMGRP_LINK};
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressMessage, AddressProtocol, CacheInfo,
};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::{AsyncSocket, SocketAddr};
use rtnetlink::{Handle, LinkDummy, LinkUnspec, RouteMessageBuilder};
use tokio::sync::mpsc;

use super::error::errno;
use super::record::{Entry, Record};
use super::routes::{self, Route};
use super::{
    AbortOnDrop, AddressBackend, Applied, Error, Events, IFA_PROTO_HOSTLB, Interface, KernelEvent,
    MacAddr, OwnedAddress, Result, VipAddress,
};

/// Where the backend keeps its record and how it tags addresses.
#[derive(Clone, Debug)]
pub struct NetlinkConfig {
    /// Holds `addresses.json`; `/run/lbnodeagent` in production.
    pub run_dir: PathBuf,
    /// Tag added addresses with [`IFA_PROTO_HOSTLB`] and trust the tag.
    /// Turned off only to exercise the record-only path that kernels before
    /// 5.18 take, or if another tool on the host used the same value.
    pub ifa_proto: bool,
    /// Receive buffer of event sockets. Bursts beyond it are lost and
    /// reported as [`KernelEvent::Resync`].
    pub event_buffer_bytes: usize,
}

impl Default for NetlinkConfig {
    fn default() -> Self {
        NetlinkConfig {
            run_dir: PathBuf::from("/run/lbnodeagent"),
            ifa_proto: true,
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

/// Which addresses this run owns, shared with event subscriptions so they
/// can tell our removed addresses from everyone else's.
struct State {
    /// Added or adopted by this run and not removed since, by (ifindex, ip).
    owned: BTreeMap<(u32, IpAddr), OwnedAddress>,
    /// Listed by a previous run's record and not yet settled by `adopt`;
    /// still ours, so they stay in the record.
    previous: BTreeSet<Entry>,
    /// The kernel has been seen to keep `IFA_PROTO` on some address.
    proto_honoured: bool,
}

impl State {
    fn recorded(&self, interface: &str, a: &KernelAddress) -> bool {
        self.owned
            .get(&(a.ifindex, a.ip))
            .is_some_and(|o| o.prefix_len == a.prefix_len)
            || self.previous.contains(&Entry {
                interface: interface.to_string(),
                address: a.ip,
                prefix_len: a.prefix_len,
            })
    }

    fn entries(&self) -> BTreeSet<Entry> {
        let mut out = self.previous.clone();
        out.extend(self.owned.values().map(|o| Entry {
            interface: o.interface.clone(),
            address: o.ip,
            prefix_len: o.prefix_len,
        }));
        out
    }
}

/// An address as dumped by the kernel.
#[derive(Clone, Debug)]
struct KernelAddress {
    ifindex: u32,
    ip: IpAddr,
    prefix_len: u8,
    proto: Option<u8>,
    message: AddressMessage,
}

impl KernelAddress {
    fn parse(m: &AddressMessage) -> Option<KernelAddress> {
        let mut address = None;
        let mut local = None;
        let mut proto = None;
        for attr in &m.attributes {
            match attr {
                AddressAttribute::Address(ip) => address = Some(*ip),
                AddressAttribute::Local(ip) => local = Some(*ip),
                AddressAttribute::Protocol(p) => proto = Some(u8::from(*p)),
                _ => {}
            }
        }
        // IPv4 puts the host's own address in IFA_LOCAL (IFA_ADDRESS may be a
        // point-to-point peer); IPv6 only sends IFA_ADDRESS.
        Some(KernelAddress {
            ifindex: m.header.index,
            ip: local.or(address)?,
            prefix_len: m.header.prefix_len,
            proto,
            message: m.clone(),
        })
    }
}

/// The address backend of a real host. Create it inside the Tokio runtime
/// that will drive it: its netlink connection is a task on that runtime.
pub struct NetlinkBackend {
    handle: Handle,
    config: NetlinkConfig,
    record: Arc<Record>,
    state: Arc<Mutex<State>>,
    _connection: AbortOnDrop,
}

impl NetlinkBackend {
    /// Opens the netlink connection and reads the previous run's record.
    pub async fn new(config: NetlinkConfig) -> Result<NetlinkBackend> {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(Error::Socket)?;
        let connection = AbortOnDrop(tokio::spawn(connection));
        let record = Record::new(&config.run_dir);
        let previous = record.load()?;
        let backend = NetlinkBackend {
            handle,
            config,
            record: Arc::new(record),
            state: Arc::new(Mutex::new(State {
                owned: BTreeMap::new(),
                previous,
                proto_honoured: false,
            })),
            _connection: connection,
        };
        let all = backend.addresses(None, None).await?;
        backend.learn(&all);
        Ok(backend)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Kernels from 5.18 put `IFA_PROTO` on their own link-local and
    /// loopback addresses and keep ours; seeing any tag proves they do.
    fn learn(&self, addrs: &[KernelAddress]) {
        if addrs.iter().any(|a| a.proto.is_some()) {
            self.lock().proto_honoured = true;
        }
    }

    fn is_ours(&self, state: &State, interface: &str, a: &KernelAddress) -> bool {
        match a.proto {
            Some(p) => self.config.ifa_proto && p == IFA_PROTO_HOSTLB,
            None => {
                !(self.config.ifa_proto && state.proto_honoured) && state.recorded(interface, a)
            }
        }
    }

    fn store(&self, state: &State) -> Result<()> {
        self.record.store(&state.entries())
    }

    async fn links(&self) -> Result<Vec<LinkMessage>> {
        self.handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| Error::netlink("listing links", e))
    }

    async fn link_by_index(&self, index: u32) -> Result<Option<LinkMessage>> {
        match self
            .handle
            .link()
            .get()
            .match_index(index)
            .execute()
            .try_next()
            .await
        {
            Ok(link) => Ok(link),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(format!("reading link {index}"), e)),
        }
    }

    async fn link_by_name(&self, name: &str) -> Result<Option<LinkMessage>> {
        match self
            .handle
            .link()
            .get()
            .match_name(name)
            .execute()
            .try_next()
            .await
        {
            Ok(link) => Ok(link),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(format!("reading link {name:?}"), e)),
        }
    }

    async fn routes(&self) -> Result<Vec<Route>> {
        let mut out = Vec::new();
        for request in [
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let mut dump = self.handle.route().get(request).execute();
            while let Some(msg) = dump
                .try_next()
                .await
                .map_err(|e| Error::netlink("listing routes", e))?
            {
                out.extend(Route::parse(&msg));
            }
        }
        Ok(out)
    }

    /// Addresses of one family and link, or all of them.
    async fn addresses(
        &self,
        family: Option<Family>,
        ifindex: Option<u32>,
    ) -> Result<Vec<KernelAddress>> {
        let mut request = self.handle.address().get();
        if let Some(ifindex) = ifindex {
            request = request.set_link_index_filter(ifindex);
        }
        if let Some(family) = family {
            request.message_mut().header.family = address_family(family);
        }
        let msgs: Vec<AddressMessage> = request
            .execute()
            .try_collect()
            .await
            .map_err(|e| Error::netlink("listing addresses", e))?;
        Ok(msgs.iter().filter_map(KernelAddress::parse).collect())
    }

    async fn describe(&self, link: &LinkMessage) -> Result<Interface> {
        let routes = self.routes().await?;
        Ok(describe_link(link, &routes))
    }

    async fn add_to_kernel(&self, vip: &VipAddress) -> std::result::Result<(), rtnetlink::Error> {
        let mut request = self
            .handle
            .address()
            .add(vip.ifindex, vip.ip, vip.prefix_len)
            .replace();
        let msg = request.message_mut();
        // No prefix route: the subnet's route already exists (it is how the
        // prefix was found), and one more would outlive a moved VIP. No DAD:
        // the election already decided who holds the address, and DAD would
        // delay answering by a second.
        let mut flags = AddressFlags::Noprefixroute;
        if vip.ip.is_ipv6() {
            flags |= AddressFlags::Nodad;
        }
        msg.attributes.push(AddressAttribute::Flags(flags));
        if let Some(secs) = vip.lifetime.kernel_seconds() {
            let mut ci = CacheInfo::default();
            ci.ifa_valid = secs;
            // IPv6 VIPs are deprecated from the start (preferred 0): RFC 6724
            // then never picks them as the source of the node's own
            // connections, which would break when the VIP moves. They still
            // accept traffic and answer neighbour solicitations.
            ci.ifa_preferred = if vip.ip.is_ipv6() { 0 } else { secs };
            msg.attributes.push(AddressAttribute::CacheInfo(ci));
        } else if vip.ip.is_ipv6() {
            let mut ci = CacheInfo::default();
            ci.ifa_valid = u32::MAX;
            ci.ifa_preferred = 0;
            msg.attributes.push(AddressAttribute::CacheInfo(ci));
        }
        if self.config.ifa_proto {
            // IPv4 replace resets the tag to 0 when it is omitted: always send it.
            msg.attributes
                .push(AddressAttribute::Protocol(AddressProtocol::Other(
                    IFA_PROTO_HOSTLB,
                )));
        }
        request.execute().await
    }

    async fn delete_from_kernel(&self, a: &KernelAddress) -> Result<()> {
        match self.handle.address().del(a.message.clone()).execute().await {
            Ok(()) => Ok(()),
            // Gone already, or its link is: what we wanted.
            Err(e) if matches!(errno(&e), Some(libc::EADDRNOTAVAIL | libc::ENODEV)) => Ok(()),
            Err(e) => Err(Error::netlink(
                format!("removing {}/{} from link {}", a.ip, a.prefix_len, a.ifindex),
                e,
            )),
        }
    }

    async fn names(&self) -> Result<HashMap<u32, String>> {
        Ok(self
            .links()
            .await?
            .iter()
            .filter_map(|l| Some((l.header.index, link_name(l)?)))
            .collect())
    }

    /// Our addresses in the kernel now.
    async fn ours_in_kernel(&self) -> Result<Vec<OwnedAddress>> {
        let names = self.names().await?;
        let all = self.addresses(None, None).await?;
        self.learn(&all);
        let state = self.lock();
        let mut out: Vec<OwnedAddress> = all
            .into_iter()
            .filter_map(|a| {
                let interface = names.get(&a.ifindex)?;
                self.is_ours(&state, interface, &a).then_some(OwnedAddress {
                    interface: interface.clone(),
                    ifindex: a.ifindex,
                    ip: a.ip,
                    prefix_len: a.prefix_len,
                })
            })
            .collect();
        out.sort();
        Ok(out)
    }
}

/// Puts an entry back as it was before a failed change.
fn restore(
    owned: &mut BTreeMap<(u32, IpAddr), OwnedAddress>,
    key: (u32, IpAddr),
    before: Option<OwnedAddress>,
) {
    match before {
        Some(b) => owned.insert(key, b),
        None => owned.remove(&key),
    };
}

fn address_family(family: Family) -> AddressFamily {
    match family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    }
}

fn link_name(link: &LinkMessage) -> Option<String> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

fn link_carrier(link: &LinkMessage) -> bool {
    let f = link.header.flags;
    f.contains(LinkFlags::Up) && f.contains(LinkFlags::LowerUp)
}

fn describe_link(link: &LinkMessage, routes: &[Route]) -> Interface {
    let index = link.header.index;
    Interface {
        name: link_name(link).unwrap_or_default(),
        index,
        mac: link.attributes.iter().find_map(|a| match a {
            LinkAttribute::Address(bytes) => MacAddr::from_slice(bytes),
            _ => None,
        }),
        carrier: link_carrier(link),
        prefixes: routes::on_link_prefixes(routes, index),
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
        let family = Family::of(vip.ip);
        let same_ip: Vec<KernelAddress> = self
            .addresses(Some(family), Some(vip.ifindex))
            .await?
            .into_iter()
            .filter(|a| a.ip == vip.ip)
            .collect();
        let key = (vip.ifindex, vip.ip);
        let (stale, before) = {
            let mut state = self.lock();
            let mut stale = Vec::new();
            for a in &same_ip {
                if !self.is_ours(&state, &vip.interface, a) {
                    tracing::warn!(ip = %vip.ip, interface = %vip.interface,
                        "address already present and not added by hostlb; leaving it alone");
                    return Ok(Applied::NotOurs);
                }
                if a.prefix_len != vip.prefix_len {
                    stale.push(a.clone());
                }
            }
            // Recorded before the kernel has it: a crash in between leaves a
            // record of a missing address (harmless), never an unrecorded one.
            let before = state.owned.insert(
                key,
                OwnedAddress {
                    interface: vip.interface.clone(),
                    ifindex: vip.ifindex,
                    ip: vip.ip,
                    prefix_len: vip.prefix_len,
                },
            );
            if let Err(e) = self.store(&state) {
                restore(&mut state.owned, key, before);
                return Err(e);
            }
            (stale, before)
        };
        // Our own address with an old prefix length (the on-link route
        // changed): IPv4 would keep both, so remove the old one first.
        for a in &stale {
            self.delete_from_kernel(a).await?;
        }
        if let Err(e) = self.add_to_kernel(vip).await {
            let mut state = self.lock();
            restore(&mut state.owned, key, before);
            let _ = self.store(&state);
            return Err(match errno(&e) {
                Some(libc::ENODEV) => Error::InterfaceGone { index: vip.ifindex },
                Some(libc::EACCES) if family == Family::V6 => Error::Ipv6Disabled {
                    interface: vip.interface.clone(),
                },
                _ => Error::netlink(
                    format!("adding {}/{} to {}", vip.ip, vip.prefix_len, vip.interface),
                    e,
                ),
            });
        }
        if before.is_none() {
            tracing::info!(ip = %vip.ip, prefix_len = vip.prefix_len, interface = %vip.interface,
                "added address");
        }
        if self.config.ifa_proto && !self.lock().proto_honoured {
            let back = self.addresses(Some(family), Some(vip.ifindex)).await?;
            self.learn(&back);
        }
        Ok(Applied::Done)
    }

    async fn remove(&self, vip: &VipAddress) -> Result<Applied> {
        let same_ip: Vec<KernelAddress> = self
            .addresses(Some(Family::of(vip.ip)), Some(vip.ifindex))
            .await?
            .into_iter()
            .filter(|a| a.ip == vip.ip)
            .collect();
        let key = (vip.ifindex, vip.ip);
        let (ours, foreign, before) = {
            let mut state = self.lock();
            let (ours, foreign): (Vec<KernelAddress>, Vec<KernelAddress>) = same_ip
                .into_iter()
                .partition(|a| self.is_ours(&state, &vip.interface, a));
            // Forgotten before the kernel removes it, so the deletion event is
            // not mistaken for someone else removing our address.
            let before = state.owned.remove(&key);
            let previous = state.previous.clone();
            state
                .previous
                .retain(|e| !(e.interface == vip.interface && e.address == vip.ip));
            if let Err(e) = self.store(&state) {
                restore(&mut state.owned, key, before);
                state.previous = previous;
                return Err(e);
            }
            (ours, foreign, before)
        };
        for a in &ours {
            if let Err(e) = self.delete_from_kernel(a).await {
                if let Some(b) = before {
                    let mut state = self.lock();
                    state.owned.insert(key, b);
                    let _ = self.store(&state);
                }
                return Err(e);
            }
            tracing::info!(ip = %a.ip, prefix_len = a.prefix_len, interface = %vip.interface,
                "removed address");
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
        let mut state = self.lock();
        state.previous.clear();
        state.owned = found
            .iter()
            .map(|o| ((o.ifindex, o.ip), o.clone()))
            .collect();
        self.store(&state)?;
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
        let (mut connection, _, mut messages) =
            rtnetlink::new_connection().map_err(Error::Socket)?;
        let socket = connection.socket_mut().socket_mut();
        socket
            .bind(&SocketAddr::new(
                0,
                RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR,
            ))
            .map_err(Error::Socket)?;
        socket
            .set_rx_buf_sz(self.config.event_buffer_bytes)
            .map_err(Error::Socket)?;
        // Bound before the link states are read, so no change falls between.
        let links = self.links().await?;
        let mut translator = Translator {
            links: HashMap::new(),
            state: Arc::clone(&self.state),
        };
        translator.seed(&links);
        let handle = self.handle.clone();
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let connection = AbortOnDrop(tokio::spawn(connection));
            while let Some((message, _)) = messages.next().await {
                let overrun = matches!(message.payload, NetlinkPayload::Overrun(_));
                for event in translator.translate(message.payload) {
                    if tx.send(event).is_err() {
                        return;
                    }
                }
                if overrun {
                    // Carrier changes may be among the lost events: restart
                    // the comparison from the kernel's current state.
                    let links: std::result::Result<Vec<LinkMessage>, _> =
                        handle.link().get().execute().try_collect().await;
                    if let Ok(links) = links {
                        translator.seed(&links);
                    }
                }
            }
            drop(connection);
            tracing::warn!("kernel event stream ended");
        });
        Ok(Events::new(rx, Some(task)))
    }
}

/// Turns raw netlink notifications into the few events the agent acts on.
struct Translator {
    /// Name and carrier of each link, to report transitions only: the kernel
    /// sends `RTM_NEWLINK` for every statistics or flag change.
    links: HashMap<u32, (String, bool)>,
    state: Arc<Mutex<State>>,
}

impl Translator {
    fn seed(&mut self, links: &[LinkMessage]) {
        self.links = links
            .iter()
            .map(|l| {
                (
                    l.header.index,
                    (link_name(l).unwrap_or_default(), link_carrier(l)),
                )
            })
            .collect();
    }

    fn translate(&mut self, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<KernelEvent> {
        match payload {
            NetlinkPayload::Overrun(_) => vec![KernelEvent::Resync],
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(m)) => {
                let Some(a) = KernelAddress::parse(&m) else {
                    return vec![];
                };
                let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                match state.owned.get(&(a.ifindex, a.ip)) {
                    Some(o) if o.prefix_len == a.prefix_len => {
                        vec![KernelEvent::AddressRemoved(o.clone())]
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
                    Some((_, before)) if before != carrier => vec![if carrier {
                        KernelEvent::CarrierRegained {
                            ifindex: index,
                            interface: name,
                        }
                    } else {
                        KernelEvent::CarrierLost {
                            ifindex: index,
                            interface: name,
                        }
                    }],
                    _ => vec![],
                }
            }
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(l)) => {
                match self.links.remove(&l.header.index) {
                    Some((name, true)) => vec![KernelEvent::CarrierLost {
                        ifindex: l.header.index,
                        interface: name,
                    }],
                    _ => vec![],
                }
            }
            _ => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn translator(owned: &[OwnedAddress]) -> Translator {
        Translator {
            links: HashMap::new(),
            state: Arc::new(Mutex::new(State {
                owned: owned
                    .iter()
                    .map(|o| ((o.ifindex, o.ip), o.clone()))
                    .collect(),
                previous: BTreeSet::new(),
                proto_honoured: true,
            })),
        }
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

    #[test]
    fn only_our_removed_addresses_are_reported() {
        let mut t = translator(&[ours(2, "10.0.0.100", 24)]);
        assert_eq!(
            t.translate(del_address(2, "10.0.0.100", 24)),
            vec![KernelEvent::AddressRemoved(ours(2, "10.0.0.100", 24))]
        );
        // someone else's address, the same IP on another link, another prefix length
        assert!(t.translate(del_address(2, "10.0.0.7", 24)).is_empty());
        assert!(t.translate(del_address(3, "10.0.0.100", 24)).is_empty());
        assert!(t.translate(del_address(2, "10.0.0.100", 32)).is_empty());
    }

    #[test]
    fn carrier_transitions_are_reported_once() {
        let up = LinkFlags::Up | LinkFlags::LowerUp | LinkFlags::Running;
        let mut t = translator(&[]);
        t.seed(&[link(2, "eth0", up)]);
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
        // a link seen for the first time is not a transition
        assert!(t.translate(new(link(9, "veth9", up))).is_empty());
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

    #[test]
    fn overrun_asks_for_a_resync() {
        let mut t = translator(&[]);
        assert_eq!(
            t.translate(NetlinkPayload::Overrun(Vec::new())),
            vec![KernelEvent::Resync]
        );
    }
}
