//! Which kernel addresses are ours: the tag, the record and the lifetime
//! that tell an address this agent added from one added by hand or by
//! DHCP, and the state that holds what is ours.

use std::collections::hash_map::Entry as MapEntry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

use hostlb_api::Prefix;
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage,
};

use super::NetlinkBackend;
use crate::addrs::record::{Entry, Snapshot};
use crate::addrs::{IFA_PROTO_HOSTLB, Lifetime, OwnedAddress, VipAddress};

impl NetlinkBackend {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    pub(super) fn is_ours(&self, state: &State, interface: &str, a: &KernelAddress) -> bool {
        match a.proto {
            Some(p) => self.config.ifa_proto && p == IFA_PROTO_HOSTLB,
            None => {
                state.tags == Tags::Dropped
                    && state.claims(interface, a, self.config.address_lifetime)
            }
        }
    }

    /// Whether the fast path may renew `vip`: see [`renew`](Self::renew).
    pub(super) fn renewable(&self, state: &State, vip: &VipAddress) -> bool {
        state.subscriptions > 0
            && !state.probe_pending
            && state.owned.get(&(vip.ifindex, vip.ip)).is_some_and(|o| {
                o.presence == Presence::Held
                    && o.address.prefix_len == vip.prefix_len
                    && o.address.interface == vip.interface
            })
    }
}

/// Where the running kernel's release is (what `uname -r` prints).
pub(super) const OS_RELEASE: &str = "/proc/sys/kernel/osrelease";

/// Whether a kernel of this release keeps `IFA_PROTO`: 5.18 and later do.
/// Distribution suffixes are ignored (`5.14.0-362.el9.x86_64`,
/// `6.18.44-fc-v657`); `None` when the release does not start with a
/// version number.
pub(super) fn release_keeps_tags(release: &str) -> Option<bool> {
    pub(super) fn leading_number(s: &str) -> Option<u32> {
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
pub(super) enum Tags {
    Kept,
    /// Dropped by the kernel, or not sent (`ifa_proto = false`): the record
    /// decides, with the lifetime as evidence.
    Dropped,
}

/// What the backend knows about one of its addresses in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Presence {
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
pub(super) struct Owned {
    pub(super) address: OwnedAddress,
    /// The longest lifetime this run may have left the kernel counting down
    /// for it: where tags are dropped, a longer remaining lifetime proves the
    /// address is someone else's.
    pub(super) lifetime: Lifetime,
    pub(super) presence: Presence,
}

pub(super) type Key = (u32, IpAddr);

/// Which addresses this run owns, shared with event subscriptions so they
/// can tell our removed addresses from everyone else's.
pub(super) struct State {
    /// Added or adopted by this run and not removed since, by (ifindex, ip).
    pub(super) owned: BTreeMap<Key, Owned>,
    /// Listed by a previous run's record and not yet settled by `adopt`;
    /// still ours, so they stay in the record.
    pub(super) previous: BTreeSet<Entry>,
    /// The previous run's record was unusable and set aside; until `adopt`,
    /// where tags are dropped, its addresses are recognised by the kernel's
    /// evidence alone (see the module doc).
    pub(super) record_lost: bool,
    pub(super) tags: Tags,
    /// The first address added is read back once to check [`Tags`] against
    /// what the kernel did with its tag.
    pub(super) probe_pending: bool,
    /// Deletions this backend made whose notification some running
    /// subscription has yet to see (one count per subscription), so that it
    /// does not report them as someone else's.
    pub(super) own_deletes: HashMap<Key, u32>,
    /// Running event subscriptions.
    pub(super) subscriptions: u32,
    /// Numbers record snapshots (see [`State::snapshot`]).
    pub(super) record_seq: u64,
    /// Interfaces whose `promote_secondaries` this run turned on.
    pub(super) promoted: BTreeSet<String>,
}

impl State {
    /// Where tags are dropped: whether the record makes `a` ours. The owned
    /// entry (this run's knowledge) takes precedence over the previous run's
    /// record; both need the lifetime evidence.
    pub(super) fn claims(&self, interface: &str, a: &KernelAddress, configured: Lifetime) -> bool {
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
    pub(super) fn own(&mut self, vip: &VipAddress) -> Option<Owned> {
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
    pub(super) fn forget(&mut self, interface: &str, key: Key, prefix_len: Option<u8>) -> bool {
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
    pub(super) fn snapshot(&mut self) -> Snapshot {
        self.record_seq += 1;
        Snapshot {
            seq: self.record_seq,
            entries: self.entries(),
        }
    }

    pub(super) fn entries(&self) -> BTreeSet<Entry> {
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
pub(super) fn counts_down_within(valid_secs: Option<u32>, lifetime: Lifetime) -> bool {
    match lifetime.kernel_seconds() {
        None => true,
        Some(max) => valid_secs.is_some_and(|v| v <= max),
    }
}

/// The longer of two lifetimes, forever being the longest.
pub(super) fn longer(a: Lifetime, b: Lifetime) -> Lifetime {
    match (a.duration(), b.duration()) {
        (Some(x), Some(y)) => Lifetime::new(x.max(y)),
        _ => Lifetime::FOREVER,
    }
}

pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// The dumped addresses by IP, so a batch looks each of its addresses up
/// once instead of scanning the whole dump for each (a renewal of 1,000
/// VIPs on one link compared a million addresses every third of their
/// lifetime).
pub(super) fn by_ip(on_link: &[KernelAddress]) -> HashMap<IpAddr, Vec<&KernelAddress>> {
    let mut at: HashMap<IpAddr, Vec<&KernelAddress>> = HashMap::with_capacity(on_link.len());
    for a in on_link {
        at.entry(a.ip).or_default().push(a);
    }
    at
}

/// An address as dumped by the kernel.
#[derive(Clone, Debug)]
pub(super) struct KernelAddress {
    pub(super) ifindex: u32,
    pub(super) ip: IpAddr,
    pub(super) prefix_len: u8,
    pub(super) proto: Option<u8>,
    /// Remaining valid lifetime in seconds; `None` for forever.
    pub(super) valid_secs: Option<u32>,
    /// `IFA_F_SECONDARY`: another address of the same subnet is the primary.
    pub(super) secondary: bool,
    /// `IFA_F_NOPREFIXROUTE`, which every address of ours has.
    pub(super) noprefixroute: bool,
    pub(super) message: AddressMessage,
}

impl KernelAddress {
    pub(super) fn parse(m: &AddressMessage) -> Option<KernelAddress> {
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

    pub(super) fn key(&self) -> Key {
        (self.ifindex, self.ip)
    }

    /// Another IPv4 address on the same link with the same prefix length in
    /// the same subnet as `self`: the kernel makes one of them the primary
    /// and the others its secondaries.
    pub(super) fn shares_subnet_with(&self, other: &KernelAddress) -> bool {
        shares_subnet(self.ifindex, self.ip, self.prefix_len, other)
    }
}

/// Whether `other` is another IPv4 address on link `ifindex` in the subnet
/// `ip/prefix_len`, with the same prefix length: the kernel makes the first
/// of such addresses the primary and the others its secondaries.
pub(super) fn shares_subnet(
    ifindex: u32,
    ip: IpAddr,
    prefix_len: u8,
    other: &KernelAddress,
) -> bool {
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
pub(super) struct ExpectedDelete<'a> {
    pub(super) state: &'a Mutex<State>,
    pub(super) key: Key,
    pub(super) count: u32,
}

/// [`Tags`] from the running kernel's release; an unreadable release is
/// treated as old, which only makes ownership stricter.
pub(super) fn tags_of_running_kernel() -> Tags {
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

/// Puts an entry back as it was before a failed change.
pub(super) fn restore(owned: &mut BTreeMap<Key, Owned>, key: Key, before: Option<Owned>) {
    match before {
        Some(b) => owned.insert(key, b),
        None => owned.remove(&key),
    };
}

/// Every held address must be read from the kernel again before renewal.
pub(super) fn unverify(state: &mut State) {
    for o in state.owned.values_mut() {
        if o.presence == Presence::Held {
            o.presence = Presence::Unverified;
        }
    }
}

impl<'a> ExpectedDelete<'a> {
    pub(super) fn new(state: &'a Mutex<State>, key: Key) -> ExpectedDelete<'a> {
        let mut s = lock(state);
        let count = s.subscriptions;
        if count > 0 {
            *s.own_deletes.entry(key).or_default() += count;
        }
        ExpectedDelete { state, key, count }
    }

    /// The kernel confirmed: each subscription consumes its count when the
    /// notification arrives.
    pub(super) fn happened(mut self) {
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
