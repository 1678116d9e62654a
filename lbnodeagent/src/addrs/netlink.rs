//! The address backend on a real kernel, over rtnetlink.
//!
//! One netlink connection carries requests; each [`Events`] subscription opens
//! its own, bound to the link and address multicast groups, because a socket
//! that both dumps and listens mixes replies with notifications.
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

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use futures::{StreamExt, TryStreamExt};
use hostlb_api::{Family, Prefix};
use rtnetlink::constants::{RTMGRP_IPV4_IFADDR, RTMGRP_IPV6_IFADDR, RTMGRP_LINK};
use rtnetlink::packet_core::NetlinkPayload;
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressProtocol, CacheInfo,
};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::sys::{AsyncSocket, SocketAddr};
use rtnetlink::{Handle, LinkDummy, LinkUnspec, RouteMessageBuilder};

use super::error::errno;
use super::record::{Entry, Loaded, Record, RecordWriter, Snapshot};
use super::routes::{self, Route};
use super::{
    AbortOnDrop, AddressBackend, Applied, DEFAULT_ADDRESS_LIFETIME, EVENT_QUEUE, Error, Events,
    IFA_PROTO_HOSTLB, Interface, KernelEvent, Lifetime, MacAddr, OwnedAddress, Result, VipAddress,
    event_channel,
};

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

/// Requests a batch keeps in flight on the netlink connection at once: the
/// kernel handles them one by one anyway, and this keeps the socket's
/// buffers far from full.
const IN_FLIGHT: usize = 64;

fn family_of(v6: bool) -> Family {
    if v6 { Family::V6 } else { Family::V4 }
}

/// Where the running kernel's release is (what `uname -r` prints).
const OS_RELEASE: &str = "/proc/sys/kernel/osrelease";

/// Whether a kernel of this release keeps `IFA_PROTO`: 5.18 and later do.
/// Distribution suffixes are ignored (`5.14.0-362.el9.x86_64`,
/// `6.18.44-fc-v657`); `None` when the release does not start with a
/// version number.
fn release_keeps_tags(release: &str) -> Option<bool> {
    fn leading_number(s: &str) -> Option<u32> {
        let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        s[..end].parse().ok()
    }
    let mut parts = release.trim().split('.');
    let major = leading_number(parts.next()?)?;
    let minor = match parts.next() {
        Some(minor) => leading_number(minor)?,
        None => 0,
    };
    Some((major, minor) >= (5, 18))
}

/// Whether the kernel keeps our tag, and so whether the tag alone decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tags {
    Kept,
    /// Dropped by the kernel, or not sent (`ifa_proto = false`): the record
    /// decides, with the lifetime as evidence.
    Dropped,
}

/// What the backend knows about one of its addresses in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Presence {
    /// Added or found by this run, and no deletion reported since by a
    /// running event subscription: renewing it needs no dump.
    Held,
    /// Not known: an add in flight or failed, events lost, or no subscription
    /// was watching. The next `add` reads the kernel.
    Unverified,
    /// The kernel reported it deleted by someone else (by hand, expiry, link
    /// deletion). Whatever holds that IP now, the agent did not add: an
    /// untagged address there is never ours.
    Removed,
}

/// An address this run added or adopted.
#[derive(Clone, Debug)]
struct Owned {
    address: OwnedAddress,
    /// The longest lifetime this run may have left the kernel counting down
    /// for it: where tags are dropped, a longer remaining lifetime proves the
    /// address is someone else's.
    lifetime: Lifetime,
    presence: Presence,
}

type Key = (u32, IpAddr);

/// Which addresses this run owns, shared with event subscriptions so they
/// can tell our removed addresses from everyone else's.
struct State {
    /// Added or adopted by this run and not removed since, by (ifindex, ip).
    owned: BTreeMap<Key, Owned>,
    /// Listed by a previous run's record and not yet settled by `adopt`;
    /// still ours, so they stay in the record.
    previous: BTreeSet<Entry>,
    /// The previous run's record was unusable and set aside; until `adopt`,
    /// where tags are dropped, its addresses are recognised by the kernel's
    /// evidence alone (see the module doc).
    record_lost: bool,
    tags: Tags,
    /// The first address added is read back once to check [`Tags`] against
    /// what the kernel did with its tag.
    probe_pending: bool,
    /// Deletions this backend made whose notification some running
    /// subscription has yet to see (one count per subscription), so that it
    /// does not report them as someone else's.
    own_deletes: HashMap<Key, u32>,
    /// Running event subscriptions.
    subscriptions: u32,
    /// Numbers record snapshots (see [`State::snapshot`]).
    record_seq: u64,
    /// Interfaces whose `promote_secondaries` this run turned on.
    promoted: BTreeSet<String>,
}

impl State {
    /// Where tags are dropped: whether the record makes `a` ours. The owned
    /// entry (this run's knowledge) takes precedence over the previous run's
    /// record; both need the lifetime evidence.
    fn claims(&self, interface: &str, a: &KernelAddress, configured: Lifetime) -> bool {
        match self.owned.get(&(a.ifindex, a.ip)) {
            Some(o) if o.presence == Presence::Removed => false,
            Some(o) if o.address.prefix_len == a.prefix_len => {
                counts_down_within(a.valid_secs, o.lifetime)
            }
            _ => {
                let recorded = self.previous.contains(&Entry {
                    interface: interface.to_string(),
                    address: a.ip,
                    prefix_len: a.prefix_len,
                });
                let evidence = counts_down_within(a.valid_secs, configured);
                let looks_ours =
                    a.noprefixroute && configured.kernel_seconds().is_some() && evidence;
                (recorded && evidence) || (self.record_lost && looks_ours)
            }
        }
    }

    /// Counts `vip` as ours before the kernel has it: unverified until the
    /// kernel confirms, and with the longer of its old and new lifetimes
    /// (until then the kernel may count down either). The entry before.
    fn own(&mut self, vip: &VipAddress) -> Option<Owned> {
        let key = (vip.ifindex, vip.ip);
        let before = self.owned.get(&key).cloned();
        let lifetime = before
            .as_ref()
            .map_or(vip.lifetime, |b| longer(b.lifetime, vip.lifetime));
        self.owned.insert(
            key,
            Owned {
                address: OwnedAddress {
                    interface: vip.interface.clone(),
                    ifindex: vip.ifindex,
                    ip: vip.ip,
                    prefix_len: vip.prefix_len,
                },
                lifetime,
                presence: Presence::Unverified,
            },
        );
        before
    }

    /// Drops `ip` (one prefix length, or all) from what this run owns and
    /// from the previous run's record.
    /// Whether anything changed (and the record must be written).
    fn forget(&mut self, interface: &str, key: Key, prefix_len: Option<u8>) -> bool {
        let matches = |len: u8| prefix_len.is_none_or(|p| p == len);
        let owned = self
            .owned
            .get(&key)
            .is_some_and(|o| matches(o.address.prefix_len))
            && self.owned.remove(&key).is_some();
        let before = self.previous.len();
        self.previous
            .retain(|e| !(e.interface == interface && e.address == key.1 && matches(e.prefix_len)));
        owned || self.previous.len() != before
    }

    /// The record's entries now, numbered so that a write of an older
    /// snapshot never replaces a newer one.
    fn snapshot(&mut self) -> Snapshot {
        self.record_seq += 1;
        Snapshot {
            seq: self.record_seq,
            entries: self.entries(),
        }
    }

    fn entries(&self) -> BTreeSet<Entry> {
        let mut out = self.previous.clone();
        out.extend(self.owned.values().map(|o| Entry {
            interface: o.address.interface.clone(),
            address: o.address.ip,
            prefix_len: o.address.prefix_len,
        }));
        out
    }
}

/// The evidence where tags are dropped: a finite remaining lifetime no
/// longer than `lifetime`, or anything if `lifetime` is forever.
fn counts_down_within(valid_secs: Option<u32>, lifetime: Lifetime) -> bool {
    match lifetime.kernel_seconds() {
        None => true,
        Some(max) => valid_secs.is_some_and(|v| v <= max),
    }
}

/// The longer of two lifetimes, forever being the longest.
fn longer(a: Lifetime, b: Lifetime) -> Lifetime {
    match (a.duration(), b.duration()) {
        (Some(x), Some(y)) => Lifetime::new(x.max(y)),
        _ => Lifetime::FOREVER,
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// An address as dumped by the kernel.
#[derive(Clone, Debug)]
struct KernelAddress {
    ifindex: u32,
    ip: IpAddr,
    prefix_len: u8,
    proto: Option<u8>,
    /// Remaining valid lifetime in seconds; `None` for forever.
    valid_secs: Option<u32>,
    /// `IFA_F_SECONDARY`: another address of the same subnet is the primary.
    secondary: bool,
    /// `IFA_F_NOPREFIXROUTE`, which every address of ours has.
    noprefixroute: bool,
    message: AddressMessage,
}

impl KernelAddress {
    fn parse(m: &AddressMessage) -> Option<KernelAddress> {
        let mut address = None;
        let mut local = None;
        let mut proto = None;
        let mut valid_secs = None;
        let mut secondary = m.header.flags.contains(AddressHeaderFlags::Secondary);
        let mut noprefixroute = false;
        for attr in &m.attributes {
            match attr {
                AddressAttribute::Address(ip) => address = Some(*ip),
                AddressAttribute::Local(ip) => local = Some(*ip),
                AddressAttribute::Protocol(p) => proto = Some(u8::from(*p)),
                AddressAttribute::CacheInfo(ci) if ci.ifa_valid != u32::MAX => {
                    valid_secs = Some(ci.ifa_valid);
                }
                AddressAttribute::Flags(f) => {
                    secondary |= f.contains(AddressFlags::Secondary);
                    noprefixroute = f.contains(AddressFlags::Noprefixroute);
                }
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
            valid_secs,
            secondary,
            noprefixroute,
            message: m.clone(),
        })
    }

    fn key(&self) -> Key {
        (self.ifindex, self.ip)
    }

    /// Another IPv4 address on the same link with the same prefix length in
    /// the same subnet as `self`: the kernel makes one of them the primary
    /// and the others its secondaries.
    fn shares_subnet_with(&self, other: &KernelAddress) -> bool {
        shares_subnet(self.ifindex, self.ip, self.prefix_len, other)
    }
}

/// Whether `other` is another IPv4 address on link `ifindex` in the subnet
/// `ip/prefix_len`, with the same prefix length: the kernel makes the first
/// of such addresses the primary and the others its secondaries.
fn shares_subnet(ifindex: u32, ip: IpAddr, prefix_len: u8, other: &KernelAddress) -> bool {
    ip.is_ipv4()
        && other.ip.is_ipv4()
        && other.ifindex == ifindex
        && other.ip != ip
        && other.prefix_len == prefix_len
        && Prefix::new(ip, prefix_len).is_some_and(|p| p.contains(other.ip))
}

/// A deletion about to be sent: running subscriptions are told to expect its
/// notification, so they do not report it as someone else's. Dropped without
/// [`happened`](Self::happened) (the kernel refused, the address was gone
/// already, or the call was cancelled), the expectation is withdrawn; if a
/// cancelled deletion did take effect, its notification is then reported,
/// which is harmless (the address is still owned, so the caller decides).
struct ExpectedDelete<'a> {
    state: &'a Mutex<State>,
    key: Key,
    count: u32,
}

impl<'a> ExpectedDelete<'a> {
    fn new(state: &'a Mutex<State>, key: Key) -> ExpectedDelete<'a> {
        let mut s = lock(state);
        let count = s.subscriptions;
        if count > 0 {
            *s.own_deletes.entry(key).or_default() += count;
        }
        ExpectedDelete { state, key, count }
    }

    /// The kernel confirmed: each subscription consumes its count when the
    /// notification arrives.
    fn happened(mut self) {
        self.count = 0;
    }
}

impl Drop for ExpectedDelete<'_> {
    fn drop(&mut self) {
        if self.count == 0 {
            return;
        }
        let mut s = lock(self.state);
        if let MapEntry::Occupied(mut e) = s.own_deletes.entry(self.key) {
            *e.get_mut() = e.get().saturating_sub(self.count);
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
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
            _connection: connection,
            _strict_connection: strict_connection,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn is_ours(&self, state: &State, interface: &str, a: &KernelAddress) -> bool {
        match a.proto {
            Some(p) => self.config.ifa_proto && p == IFA_PROTO_HOSTLB,
            None => {
                state.tags == Tags::Dropped
                    && state.claims(interface, a, self.config.address_lifetime)
            }
        }
    }

    /// Writes `snapshot` to the record, off the runtime.
    async fn save(&self, snapshot: Snapshot) -> Result<()> {
        self.record.save(snapshot).await
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
        // IPv6 VIPs are deprecated from the start (preferred 0): RFC 6724
        // then never picks them as the source of the node's own connections,
        // which would break when the VIP moves. They still accept traffic and
        // answer neighbour solicitations. An IPv4 VIP kept forever needs no
        // lifetimes at all.
        let valid = vip.lifetime.kernel_seconds();
        if valid.is_some() || vip.ip.is_ipv6() {
            let mut ci = CacheInfo::default();
            ci.ifa_valid = valid.unwrap_or(u32::MAX);
            ci.ifa_preferred = if vip.ip.is_ipv6() { 0 } else { ci.ifa_valid };
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

    /// Deletes one of our addresses from the kernel; the caller forgets it
    /// once this returns `Ok`.
    ///
    /// An IPv4 address that is the primary of its subnet takes that subnet's
    /// secondaries with it unless `promote_secondaries` is on. Removal never
    /// writes that sysctl (a hardened unit cannot: `ProtectKernelTunables`):
    /// if it is off, the addresses the kernel dropped with ours are put back
    /// at once, exactly as they were (as `ip addr restore` does), so they are
    /// gone for one netlink round trip, not lost. The deletion and the
    /// restore run as one task, so a cancelled `remove` cannot stop between
    /// them.
    async fn delete_ours(
        &self,
        a: &KernelAddress,
        interface: &str,
        on_link: &[KernelAddress],
    ) -> Result<()> {
        let behind: Vec<KernelAddress> = if a.secondary {
            Vec::new()
        } else {
            on_link
                .iter()
                .filter(|o| a.shares_subnet_with(o))
                .cloned()
                .collect()
        };
        if behind.is_empty()
            || promotes_secondaries(&self.current_name(a.ifindex, interface).await?)
        {
            return delete_one(&self.handle, &self.state, a).await;
        }
        let handle = self.handle.clone();
        let strict = self.strict.clone();
        let state = Arc::clone(&self.state);
        let a = a.clone();
        let task = tokio::spawn(async move {
            // Their deletions are the backend's doing, not someone else's.
            let expected: Vec<ExpectedDelete> = behind
                .iter()
                .map(|b| ExpectedDelete::new(&state, b.key()))
                .collect();
            delete_one(&handle, &state, &a).await?;
            let now = read_link_addresses(&strict, Family::V4, a.ifindex).await?;
            for (b, expected) in behind.iter().zip(expected) {
                if now
                    .iter()
                    .any(|n| n.ip == b.ip && n.prefix_len == b.prefix_len)
                {
                    continue;
                }
                expected.happened();
                let mut request = handle.address().add(b.ifindex, b.ip, b.prefix_len);
                *request.message_mut() = b.message.clone();
                match request.execute().await {
                    Ok(()) => {
                        tracing::info!(ip = %b.ip, prefix_len = b.prefix_len, removed = %a.ip,
                        "put back an address the kernel deleted with the removed VIP (promote_secondaries is off)")
                    }
                    Err(e) => {
                        tracing::error!(ip = %b.ip, prefix_len = b.prefix_len, removed = %a.ip, error = %e,
                        "cannot put back an address the kernel deleted with the removed VIP; add it again, and set net.ipv4.conf.all.promote_secondaries=1")
                    }
                }
            }
            Ok(())
        });
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down, and the caller with it.
            Err(_) => Ok(()),
        }
    }

    /// The name the kernel uses now for link `ifindex`, in case it was
    /// renamed.
    async fn current_name(&self, ifindex: u32, interface: &str) -> Result<String> {
        Ok(self
            .link_by_index(ifindex)
            .await?
            .and_then(|l| link_name(&l))
            .unwrap_or_else(|| interface.to_string()))
    }

    /// `sysctl net.ipv4.conf.<interface>.promote_secondaries=1`, unless it is
    /// in effect already. Only for a VIP that becomes the primary of its
    /// subnet: addresses added to that subnet later become its secondaries,
    /// and if the VIP expires (the agent died) they would expire with it.
    /// Best effort: removal does not need it (see
    /// [`delete_ours`](Self::delete_ours)). Like every `/proc/sys/net` file
    /// it belongs to the network namespace of the calling thread, which is
    /// the namespace the backend manages (the agent's threads all live in
    /// the host's).
    async fn promote_secondaries(&self, ifindex: u32, interface: &str) -> Result<()> {
        // A link that is gone took its addresses with it.
        if self.link_by_index(ifindex).await?.is_none() {
            return Ok(());
        }
        let name = self.current_name(ifindex, interface).await?;
        if promotes_secondaries(&name) {
            return Ok(());
        }
        std::fs::write(promote_secondaries_path(&name), "1\n").map_err(|source| {
            Error::PromoteSecondaries {
                interface: name.clone(),
                source,
            }
        })?;
        if self.lock().promoted.insert(name.clone()) {
            tracing::info!(interface = %name,
                "turned on net.ipv4.conf.{name}.promote_secondaries, so that a VIP that is the primary address of its subnet does not take the subnet's other addresses with it when it expires");
        }
        Ok(())
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

    /// The addresses of one family on one link, filtered by the kernel.
    async fn link_addresses(&self, family: Family, ifindex: u32) -> Result<Vec<KernelAddress>> {
        read_link_addresses(&self.strict, family, ifindex).await
    }

    /// Whether the fast path may renew `vip`: see [`renew`](Self::renew).
    fn renewable(&self, state: &State, vip: &VipAddress) -> bool {
        state.subscriptions > 0
            && !state.probe_pending
            && state.owned.get(&(vip.ifindex, vip.ip)).is_some_and(|o| {
                o.presence == Presence::Held
                    && o.address.prefix_len == vip.prefix_len
                    && o.address.interface == vip.interface
            })
    }

    /// The fast path of `add`: an address this run holds, renewed with the
    /// same prefix length by one read of its link and one replace. `None`
    /// when the full path is needed: no subscription is watching for
    /// deletions, the address was reported deleted or is not known to be
    /// there, its prefix length changes, the tag check is still due, or the
    /// kernel's address at that IP is not (or no longer) ours.
    async fn renew(&self, vip: &VipAddress) -> Option<Result<Applied>> {
        let key = (vip.ifindex, vip.ip);
        if !self.renewable(&self.lock(), vip) {
            return None;
        }
        // A replace would make whatever holds the IP ours: read first. A
        // deletion still queued on the event socket is then seen here.
        let current = self
            .link_addresses(Family::of(vip.ip), vip.ifindex)
            .await
            .ok()?;
        {
            let mut state = self.lock();
            let mut at_ip = current.iter().filter(|a| a.ip == vip.ip);
            let still_ours = match (at_ip.next(), at_ip.next()) {
                (Some(a), None) => {
                    a.prefix_len == vip.prefix_len && self.is_ours(&state, &vip.interface, a)
                }
                _ => false,
            };
            if !still_ours || !self.renewable(&state, vip) {
                return None;
            }
            // Until the kernel confirms, it counts down either lifetime.
            let o = state.owned.get_mut(&key)?;
            o.lifetime = longer(o.lifetime, vip.lifetime);
        }
        let result = self.add_to_kernel(vip).await;
        let mut state = self.lock();
        let o = state.owned.get_mut(&key);
        Some(match result {
            Ok(()) => {
                if let Some(o) = o {
                    o.lifetime = vip.lifetime;
                }
                Ok(Applied::Done)
            }
            Err(e) => {
                if let Some(o) = o.filter(|o| o.presence == Presence::Held) {
                    o.presence = Presence::Unverified;
                }
                Err(add_error(vip, e))
            }
        })
    }

    /// The full path of `add`: reads the link's addresses to decide
    /// ownership, replaces an old prefix length, adds.
    async fn add_checked(&self, vip: &VipAddress) -> Result<Applied> {
        let key = (vip.ifindex, vip.ip);
        let on_link = self
            .addresses(Some(Family::of(vip.ip)), Some(vip.ifindex))
            .await?;
        let stale: std::result::Result<Vec<&KernelAddress>, Option<Snapshot>> = {
            let mut state = self.lock();
            let (ours, foreign): (Vec<&KernelAddress>, Vec<&KernelAddress>) = on_link
                .iter()
                .filter(|a| a.ip == vip.ip)
                .partition(|a| self.is_ours(&state, &vip.interface, a));
            if foreign.is_empty() {
                Ok(ours
                    .into_iter()
                    .filter(|a| a.prefix_len != vip.prefix_len)
                    .collect())
            } else {
                // Nothing of ours holds this IP any more (someone re-added
                // it after ours went): stop counting it as ours.
                Err((ours.is_empty() && state.forget(&vip.interface, key, None))
                    .then(|| state.snapshot()))
            }
        };
        let stale = match stale {
            Ok(stale) => stale,
            Err(forgotten) => {
                tracing::warn!(ip = %vip.ip, interface = %vip.interface,
                    "address already present and not added by hostlb; leaving it alone");
                if let Some(snapshot) = forgotten {
                    self.save(snapshot).await?;
                }
                return Ok(Applied::NotOurs);
            }
        };
        // Our own address with an old prefix length (the on-link route
        // changed): IPv4 would keep both, so remove the old one first. It is
        // forgotten only once the kernel confirmed, so a failure or a
        // cancellation leaves it owned.
        for a in &stale {
            self.delete_ours(a, &vip.interface, &on_link).await?;
            let forgotten = {
                let mut state = self.lock();
                state
                    .forget(&vip.interface, key, Some(a.prefix_len))
                    .then(|| state.snapshot())
            };
            if let Some(snapshot) = forgotten {
                self.save(snapshot).await?;
            }
        }
        let (before, snapshot) = {
            let mut state = self.lock();
            let before = state.own(vip);
            (before, state.snapshot())
        };
        // Recorded before the kernel has it: a crash in between leaves a
        // record of a missing address (harmless), never an unrecorded one.
        if let Err(e) = self.save(snapshot).await {
            restore(&mut self.lock().owned, key, before);
            return Err(e);
        }
        if becomes_primary(vip, &on_link) {
            // Whatever is added to this subnet later becomes its secondary,
            // and would go with it when it is deleted or expires.
            if let Err(e) = self.promote_secondaries(vip.ifindex, &vip.interface).await {
                tracing::warn!(ip = %vip.ip, error = %e,
                    "the VIP is the primary address of its subnet; addresses added to that subnet later go with it when it expires");
            }
        }
        if let Err(e) = self.add_to_kernel(vip).await {
            let forgotten = {
                let mut state = self.lock();
                match before {
                    None => {
                        state.owned.remove(&key);
                        Some(state.snapshot())
                    }
                    Some(_) => {
                        if let Some(o) = state.owned.get_mut(&key) {
                            o.presence = Presence::Unverified;
                        }
                        None
                    }
                }
            };
            if let Some(snapshot) = forgotten {
                // The add's error is the one to report.
                let _ = self.save(snapshot).await;
            }
            return Err(add_error(vip, e));
        }
        {
            let mut state = self.lock();
            if let Some(o) = state.owned.get_mut(&key) {
                o.lifetime = vip.lifetime;
                // Unless a deletion was reported meanwhile.
                if o.presence == Presence::Unverified {
                    o.presence = Presence::Held;
                }
            }
        }
        if before.is_none() {
            tracing::info!(ip = %vip.ip, prefix_len = vip.prefix_len, interface = %vip.interface,
                "added address");
        }
        if self.lock().probe_pending {
            self.probe_tags(vip).await;
        }
        Ok(Applied::Done)
    }

    /// `add_many`: one read of each link's addresses, one record write for
    /// what is new, and the requests in flight together (a failed host's
    /// thousand VIPs are one batch, and so is every renewal). Ownership is
    /// decided from that read exactly as [`add_checked`](Self::add_checked)
    /// does; an address of ours with another prefix length (its on-link
    /// route changed) takes that single path, which replaces it.
    async fn add_batch(&self, vips: &[VipAddress]) -> Vec<Result<Applied>> {
        let mut results: Vec<Option<Result<Applied>>> = vips.iter().map(|_| None).collect();
        let mut groups: BTreeMap<(u32, bool), Vec<usize>> = BTreeMap::new();
        for (i, vip) in vips.iter().enumerate() {
            if Prefix::new(vip.ip, vip.prefix_len).is_none() {
                results[i] = Some(Err(Error::InvalidPrefix {
                    ip: vip.ip,
                    prefix_len: vip.prefix_len,
                }));
                continue;
            }
            groups
                .entry((vip.ifindex, vip.ip.is_ipv6()))
                .or_default()
                .push(i);
        }
        let reads = futures::future::join_all(
            groups
                .keys()
                .map(|&(ifindex, v6)| self.addresses(Some(family_of(v6)), Some(ifindex))),
        )
        .await;
        let mut single = Vec::new();
        // (index, the entry before, becomes the primary of its subnet)
        let mut send: Vec<(usize, Option<Owned>, bool)> = Vec::new();
        let snapshot = {
            let mut state = self.lock();
            let entries_before = state.entries();
            for ((_, indexes), read) in groups.iter().zip(reads) {
                let Ok(on_link) = read else {
                    // The single path reads again and reports its own error.
                    single.extend(indexes);
                    continue;
                };
                for &i in indexes {
                    let vip = &vips[i];
                    let key = (vip.ifindex, vip.ip);
                    let (ours, foreign): (Vec<&KernelAddress>, Vec<&KernelAddress>) = on_link
                        .iter()
                        .filter(|a| a.ip == vip.ip)
                        .partition(|a| self.is_ours(&state, &vip.interface, a));
                    if !foreign.is_empty() {
                        if ours.is_empty() {
                            state.forget(&vip.interface, key, None);
                        }
                        tracing::warn!(ip = %vip.ip, interface = %vip.interface,
                            "address already present and not added by hostlb; leaving it alone");
                        results[i] = Some(Ok(Applied::NotOurs));
                        continue;
                    }
                    if ours.iter().any(|a| a.prefix_len != vip.prefix_len) {
                        single.push(i);
                        continue;
                    }
                    let before = state.own(vip);
                    let primary = ours.is_empty() && becomes_primary(vip, &on_link);
                    send.push((i, before, primary));
                }
            }
            (state.entries() != entries_before).then(|| state.snapshot())
        };
        // Recorded before the kernel has them, as in `add_checked`.
        if let Some(snapshot) = snapshot
            && let Err(e) = self.save(snapshot).await
        {
            let mut state = self.lock();
            for (i, before, _) in send.drain(..) {
                let vip = &vips[i];
                restore(&mut state.owned, (vip.ifindex, vip.ip), before);
                results[i] = Some(Err(Error::RecordWrite {
                    path: self.config.run_dir.join(super::record::FILE_NAME),
                    source: std::io::Error::other(e.to_string()),
                }));
            }
        }
        let mut promoted = BTreeSet::new();
        for (i, _, primary) in &send {
            let vip = &vips[*i];
            if *primary
                && promoted.insert(vip.ifindex)
                && let Err(e) = self.promote_secondaries(vip.ifindex, &vip.interface).await
            {
                tracing::warn!(ip = %vip.ip, error = %e,
                    "the VIP is the primary address of its subnet; addresses added to that subnet later go with it when it expires");
            }
        }
        // Collected first: a stream over a borrowing closure is not `Send`.
        let requests: Vec<_> = send
            .iter()
            .map(|(i, _, _)| self.add_to_kernel(&vips[*i]))
            .collect();
        let outcomes: Vec<std::result::Result<(), rtnetlink::Error>> =
            futures::stream::iter(requests)
                .buffered(IN_FLIGHT)
                .collect()
                .await;
        let mut first_new = None;
        let snapshot = {
            let mut state = self.lock();
            let mut changed = false;
            for ((i, before, _), outcome) in send.into_iter().zip(outcomes) {
                let vip = &vips[i];
                let key = (vip.ifindex, vip.ip);
                match outcome {
                    Ok(()) => {
                        if let Some(o) = state.owned.get_mut(&key) {
                            o.lifetime = vip.lifetime;
                            // Unless a deletion was reported meanwhile.
                            if o.presence == Presence::Unverified {
                                o.presence = Presence::Held;
                            }
                        }
                        if before.is_none() {
                            tracing::debug!(ip = %vip.ip, prefix_len = vip.prefix_len,
                                interface = %vip.interface, "added address");
                            first_new.get_or_insert(i);
                        }
                        results[i] = Some(Ok(Applied::Done));
                    }
                    Err(e) => {
                        match before {
                            None => {
                                state.owned.remove(&key);
                                changed = true;
                            }
                            Some(_) => {
                                if let Some(o) = state.owned.get_mut(&key) {
                                    o.presence = Presence::Unverified;
                                }
                            }
                        }
                        results[i] = Some(Err(add_error(vip, e)));
                    }
                }
            }
            changed.then(|| state.snapshot())
        };
        if let Some(snapshot) = snapshot {
            // The adds' errors are the ones to report.
            let _ = self.save(snapshot).await;
        }
        if let Some(i) = first_new
            && self.lock().probe_pending
        {
            self.probe_tags(&vips[i]).await;
        }
        for i in single {
            results[i] = Some(self.add_checked(&vips[i]).await);
        }
        results
            .into_iter()
            .map(|r| r.expect("every address has a result"))
            .collect()
    }

    /// `remove_many`: one read of each link's addresses and one record write;
    /// the deletions in flight together. An address that is the primary of
    /// its subnet, with others behind it, takes the single path, which reads
    /// the link again and puts back what the kernel takes with it.
    async fn remove_batch(&self, vips: &[VipAddress]) -> Vec<Result<Applied>> {
        let mut results: Vec<Option<Result<Applied>>> = vips.iter().map(|_| None).collect();
        let mut groups: BTreeMap<(u32, bool), Vec<usize>> = BTreeMap::new();
        for (i, vip) in vips.iter().enumerate() {
            groups
                .entry((vip.ifindex, vip.ip.is_ipv6()))
                .or_default()
                .push(i);
        }
        let reads = futures::future::join_all(
            groups
                .keys()
                .map(|&(ifindex, v6)| self.addresses(Some(family_of(v6)), Some(ifindex))),
        )
        .await;
        let mut single = Vec::new();
        // (index, our addresses at its IP, someone else's is there too)
        let mut delete: Vec<(usize, Vec<KernelAddress>, bool)> = Vec::new();
        {
            let state = self.lock();
            for ((_, indexes), read) in groups.iter().zip(reads) {
                let Ok(on_link) = read else {
                    single.extend(indexes);
                    continue;
                };
                for &i in indexes {
                    let vip = &vips[i];
                    let (ours, foreign): (Vec<&KernelAddress>, Vec<&KernelAddress>) = on_link
                        .iter()
                        .filter(|a| a.ip == vip.ip)
                        .partition(|a| self.is_ours(&state, &vip.interface, a));
                    let behind = ours
                        .iter()
                        .any(|a| !a.secondary && on_link.iter().any(|o| a.shares_subnet_with(o)));
                    if behind {
                        single.push(i);
                    } else {
                        delete.push((i, ours.into_iter().cloned().collect(), !foreign.is_empty()));
                    }
                }
            }
        }
        let requests: Vec<_> = delete
            .iter()
            .map(|(_, ours, _)| delete_all(&self.handle, &self.state, ours))
            .collect();
        let outcomes: Vec<Result<()>> = futures::stream::iter(requests)
            .buffered(IN_FLIGHT)
            .collect()
            .await;
        let snapshot = {
            let mut state = self.lock();
            let mut changed = false;
            for ((i, ours, foreign), outcome) in delete.into_iter().zip(outcomes) {
                let vip = &vips[i];
                results[i] = Some(match outcome {
                    Ok(()) => {
                        // Forgotten only now that the kernel confirmed.
                        changed |= state.forget(&vip.interface, (vip.ifindex, vip.ip), None);
                        for a in &ours {
                            tracing::debug!(ip = %a.ip, prefix_len = a.prefix_len,
                                interface = %vip.interface, "removed address");
                        }
                        if ours.is_empty() && foreign {
                            tracing::warn!(ip = %vip.ip, interface = %vip.interface,
                                "address present but not added by hostlb; leaving it alone");
                            Ok(Applied::NotOurs)
                        } else {
                            Ok(Applied::Done)
                        }
                    }
                    Err(e) => Err(e),
                });
            }
            changed.then(|| state.snapshot())
        };
        if let Some(snapshot) = snapshot
            && let Err(e) = self.save(snapshot).await
        {
            // The addresses are gone; the record still lists them, which
            // the next write corrects.
            tracing::warn!(error = %e, "cannot write the address record");
        }
        for i in single {
            results[i] = Some(self.remove(&vips[i]).await);
        }
        results
            .into_iter()
            .map(|r| r.expect("every address has a result"))
            .collect()
    }

    /// Reads the first address added back, once, to check [`Tags`] against
    /// what the kernel did with its tag: proof either way overrides the
    /// release number (a backport, or a kernel that lies about its version).
    /// A failed read leaves the check to the next add.
    async fn probe_tags(&self, vip: &VipAddress) {
        let Ok(back) = self
            .addresses(Some(Family::of(vip.ip)), Some(vip.ifindex))
            .await
        else {
            return;
        };
        let Some(a) = back
            .iter()
            .find(|a| a.ip == vip.ip && a.prefix_len == vip.prefix_len)
        else {
            return;
        };
        let kept = a.proto == Some(IFA_PROTO_HOSTLB);
        let mut state = self.lock();
        if !std::mem::take(&mut state.probe_pending) {
            return;
        }
        match (state.tags, kept) {
            (Tags::Dropped, true) => {
                tracing::info!(
                    "the kernel keeps address tags although its release predates them; ownership follows the tag"
                );
                state.tags = Tags::Kept;
            }
            (Tags::Kept, false) => {
                tracing::warn!(ip = %vip.ip,
                    "the kernel dropped the tag of an address just added although its release keeps tags; ownership follows the record");
                state.tags = Tags::Dropped;
            }
            _ => {}
        }
    }
}

/// [`Tags`] from the running kernel's release; an unreadable release is
/// treated as old, which only makes ownership stricter.
fn tags_of_running_kernel() -> Tags {
    let release = std::fs::read_to_string(OS_RELEASE).unwrap_or_default();
    match release_keeps_tags(&release) {
        Some(true) => Tags::Kept,
        Some(false) => {
            tracing::info!(
                release = release.trim(),
                "kernel before 5.18 drops address tags; the record and address lifetimes identify ours"
            );
            Tags::Dropped
        }
        None => {
            tracing::warn!(
                release = release.trim(),
                path = OS_RELEASE,
                "cannot read the kernel version; treating it as one that drops address tags"
            );
            Tags::Dropped
        }
    }
}

/// Whether `vip` becomes the primary IPv4 address of its subnet: no other
/// address on the link shares it. A /32 never has secondaries.
fn becomes_primary(vip: &VipAddress, on_link: &[KernelAddress]) -> bool {
    vip.ip.is_ipv4()
        && vip.prefix_len < 32
        && !on_link
            .iter()
            .any(|o| shares_subnet(vip.ifindex, vip.ip, vip.prefix_len, o))
}

fn promote_secondaries_path(interface: &str) -> PathBuf {
    Path::new("/proc/sys/net/ipv4/conf")
        .join(interface)
        .join("promote_secondaries")
}

/// Whether the kernel promotes a secondary when the primary of its subnet on
/// `interface` goes: the interface's setting or `all` (the kernel ORs them).
/// Unreadable counts as off, which only costs a restore.
fn promotes_secondaries(interface: &str) -> bool {
    ["all", interface].iter().any(|conf| {
        std::fs::read_to_string(promote_secondaries_path(conf)).is_ok_and(|v| v.trim() == "1")
    })
}

/// Deletes `a`, expecting its notification (see [`ExpectedDelete`]).
async fn delete_one(handle: &Handle, state: &Mutex<State>, a: &KernelAddress) -> Result<()> {
    let expected = ExpectedDelete::new(state, a.key());
    match handle.address().del(a.message.clone()).execute().await {
        Ok(()) => {
            expected.happened();
            Ok(())
        }
        // Gone already, or its link is: what we wanted.
        Err(e) if matches!(errno(&e), Some(libc::EADDRNOTAVAIL | libc::ENODEV)) => Ok(()),
        Err(e) => Err(Error::netlink(
            format!("removing {}/{} from link {}", a.ip, a.prefix_len, a.ifindex),
            e,
        )),
    }
}

/// Deletes each of `ours`, in turn.
async fn delete_all(handle: &Handle, state: &Mutex<State>, ours: &[KernelAddress]) -> Result<()> {
    for a in ours {
        delete_one(handle, state, a).await?;
    }
    Ok(())
}

/// The addresses of one family on one link, filtered by the kernel where
/// `strict` has `NETLINK_GET_STRICT_CHK` (and here in any case).
async fn read_link_addresses(
    strict: &Handle,
    family: Family,
    ifindex: u32,
) -> Result<Vec<KernelAddress>> {
    let mut request = strict.address().get().set_link_index_filter(ifindex);
    let header = &mut request.message_mut().header;
    header.family = address_family(family);
    header.index = ifindex;
    let msgs: Vec<AddressMessage> = request
        .execute()
        .try_collect()
        .await
        .map_err(|e| Error::netlink(format!("listing addresses of link {ifindex}"), e))?;
    Ok(msgs.iter().filter_map(KernelAddress::parse).collect())
}

/// The error of a refused add, saying what to do.
fn add_error(vip: &VipAddress, e: rtnetlink::Error) -> Error {
    match errno(&e) {
        Some(libc::ENODEV) => Error::InterfaceGone { index: vip.ifindex },
        Some(libc::EACCES) if vip.ip.is_ipv6() => Error::Ipv6Disabled {
            interface: vip.interface.clone(),
        },
        _ => Error::netlink(
            format!("adding {}/{} to {}", vip.ip, vip.prefix_len, vip.interface),
            e,
        ),
    }
}

/// Puts an entry back as it was before a failed change.
fn restore(owned: &mut BTreeMap<Key, Owned>, key: Key, before: Option<Owned>) {
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

    async fn interfaces(&self) -> Result<Vec<Interface>> {
        let routes = self.routes().await?;
        let links = self.links().await?;
        Ok(links.iter().map(|l| describe_link(l, &routes)).collect())
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
        let mut translator = Translator::new(Arc::clone(&self.state), &links);
        let handle = self.handle.clone();
        let (tx, mut subscription) = event_channel(EVENT_QUEUE);
        let task = tokio::spawn(async move {
            let connection = AbortOnDrop(tokio::spawn(connection));
            while let Some((message, _)) = messages.next().await {
                let overrun = matches!(message.payload, NetlinkPayload::Overrun(_));
                let mut events = translator.translate(message.payload);
                if overrun {
                    // Carrier changes may be among the lost events: compare
                    // with the kernel's links now, and only then resync.
                    let links: std::result::Result<Vec<LinkMessage>, _> =
                        handle.link().get().execute().try_collect().await;
                    events.extend(translator.overrun(links.ok().as_deref()));
                }
                for event in events {
                    if !tx.send(event) {
                        return;
                    }
                }
            }
            drop(connection);
            tracing::warn!("kernel event stream ended");
        });
        subscription.attach(task);
        Ok(subscription)
    }
}

/// Turns raw netlink notifications into the few events the agent acts on.
/// While one runs, the backend renews addresses without reading the kernel
/// first: this is what tells it they were deleted.
struct Translator {
    /// Name and carrier of each link, to report transitions only: the kernel
    /// sends `RTM_NEWLINK` for every statistics or flag change.
    links: HashMap<u32, (String, bool)>,
    state: Arc<Mutex<State>>,
}

impl Translator {
    fn new(state: Arc<Mutex<State>>, links: &[LinkMessage]) -> Translator {
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

    fn translate(&mut self, payload: NetlinkPayload<RouteNetlinkMessage>) -> Vec<KernelEvent> {
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
    fn overrun(&mut self, links: Option<&[LinkMessage]>) -> Vec<KernelEvent> {
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

/// Every held address must be read from the kernel again before renewal.
fn unverify(state: &mut State) {
    for o in state.owned.values_mut() {
        if o.presence == Presence::Held {
            o.presence = Presence::Unverified;
        }
    }
}

fn link_states(links: &[LinkMessage]) -> HashMap<u32, (String, bool)> {
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

fn carrier_event(ifindex: u32, interface: String, carrier: bool) -> KernelEvent {
    if carrier {
        KernelEvent::CarrierRegained { ifindex, interface }
    } else {
        KernelEvent::CarrierLost { ifindex, interface }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

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
        // someone else's address, the same IP on another link, another prefix length
        assert!(t.translate(del_address(2, "10.0.0.7", 24)).is_empty());
        assert!(t.translate(del_address(3, "10.0.0.100", 24)).is_empty());
        assert!(t.translate(del_address(2, "10.0.0.100", 32)).is_empty());
        // Reported once: whatever holds the IP later was not added by us.
        assert!(t.translate(del_address(2, "10.0.0.100", 24)).is_empty());
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
