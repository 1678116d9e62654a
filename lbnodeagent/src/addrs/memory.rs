//! An in-memory kernel and backend with the netlink backend's semantics, for
//! tests of the reconcile loop: links with on-link prefixes, default routes,
//! addresses tagged ours or not, lifetimes on Tokio's clock (so
//! `time::pause` drives expiry) and the same events.
//!
//! The "kernel" is shared between backends made by [`MemoryBackend::restart`],
//! which models an agent restart: the new backend owns nothing until it
//! adopts what the old one left.
//!
//! It models a kernel that keeps tags, and ownership follows the netlink
//! rules for one: an address is ours exactly when it carries our tag. An
//! untagged address is never touched, even at an IP this backend added
//! before (someone re-added it by hand after ours went), and `add` answering
//! [`Applied::NotOurs`] stops counting that IP as ours.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use hostlb_api::{Family, Prefix};
use tokio::time::Instant;

use super::{
    AddressBackend, Applied, EVENT_QUEUE, Error, EventSender, Events, Interface, KernelEvent,
    Lifetime, MacAddr, OwnedAddress, Result, VipAddress, event_channel,
};

/// An address in the in-memory kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryAddress {
    pub interface: String,
    pub ifindex: u32,
    pub ip: IpAddr,
    pub prefix_len: u8,
    /// Tagged as added by hostlb (this run or an earlier one).
    pub ours: bool,
    pub lifetime: Lifetime,
    /// When the kernel drops it unless renewed; `None` for forever.
    pub expires: Option<Instant>,
    /// How many times `add` renewed it after adding it.
    pub renewals: u32,
}

#[derive(Clone, Debug)]
struct Link {
    name: String,
    mac: Option<MacAddr>,
    carrier: bool,
    prefixes: Vec<Prefix>,
}

struct Subscriber {
    tx: EventSender,
    owned: Arc<Mutex<BTreeSet<(u32, IpAddr)>>>,
}

#[derive(Default)]
struct Kernel {
    links: BTreeMap<u32, Link>,
    defaults: BTreeMap<Family, u32>,
    addresses: Vec<MemoryAddress>,
    dummy_supported: bool,
    /// Reads of the links fail, as a dump the kernel cuts short does.
    links_unreadable: bool,
    subscribers: Vec<Subscriber>,
}

impl Kernel {
    fn link_by_name(&self, name: &str) -> Option<(u32, &Link)> {
        self.links
            .iter()
            .find(|(_, l)| l.name == name)
            .map(|(i, l)| (*i, l))
    }

    fn describe(&self, index: u32) -> Option<Interface> {
        let l = self.links.get(&index)?;
        Some(Interface {
            name: l.name.clone(),
            index,
            mac: l.mac,
            carrier: l.carrier,
            prefixes: l.prefixes.clone(),
        })
    }

    fn broadcast(&mut self, event: impl Fn(&BTreeSet<(u32, IpAddr)>) -> Option<KernelEvent>) {
        self.subscribers.retain(|s| {
            let owned = s.owned.lock().unwrap_or_else(|e| e.into_inner());
            match event(&owned) {
                Some(e) => s.tx.send(e),
                None => !s.tx.is_closed(),
            }
        });
    }

    /// Drops addresses matching `gone`, telling each subscriber about the ones
    /// it owns.
    fn drop_addresses(&mut self, gone: impl Fn(&MemoryAddress) -> bool) {
        let (removed, kept) = std::mem::take(&mut self.addresses)
            .into_iter()
            .partition::<Vec<_>, _>(gone);
        self.addresses = kept;
        for a in removed {
            self.broadcast(|owned| {
                owned
                    .contains(&(a.ifindex, a.ip))
                    .then(|| KernelEvent::AddressRemoved(owned_address(&a)))
            });
        }
    }
}

fn owned_address(a: &MemoryAddress) -> OwnedAddress {
    OwnedAddress {
        interface: a.interface.clone(),
        ifindex: a.ifindex,
        ip: a.ip,
        prefix_len: a.prefix_len,
    }
}

/// The in-memory backend. Cloning shares both the kernel and ownership.
#[derive(Clone)]
pub struct MemoryBackend {
    kernel: Arc<Mutex<Kernel>>,
    /// What this agent run added or adopted, by (ifindex, ip).
    owned: Arc<Mutex<BTreeSet<(u32, IpAddr)>>>,
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl MemoryBackend {
    /// An empty kernel whose `dummy` driver works.
    pub fn new() -> MemoryBackend {
        MemoryBackend {
            kernel: Arc::new(Mutex::new(Kernel {
                dummy_supported: true,
                ..Kernel::default()
            })),
            owned: Arc::default(),
        }
    }

    fn kernel(&self) -> MutexGuard<'_, Kernel> {
        self.kernel.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn owned_set(&self) -> MutexGuard<'_, BTreeSet<(u32, IpAddr)>> {
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The same kernel seen by a freshly started agent that owns nothing yet.
    pub fn restart(&self) -> MemoryBackend {
        MemoryBackend {
            kernel: Arc::clone(&self.kernel),
            owned: Arc::default(),
        }
    }

    /// Adds a link with carrier and the given on-link prefixes
    /// (`"10.0.0.0/24"`); returns its index.
    pub fn add_link(&self, name: &str, mac: Option<MacAddr>, prefixes: &[&str]) -> u32 {
        let mut k = self.kernel();
        let index = k.links.keys().next_back().map_or(2, |i| i + 1);
        let prefixes = prefixes
            .iter()
            .map(|p| p.parse::<Prefix>().expect("test prefix").network())
            .collect();
        k.links.insert(
            index,
            Link {
                name: name.to_string(),
                mac,
                carrier: true,
                prefixes,
            },
        );
        k.broadcast(|_| Some(KernelEvent::LinksChanged));
        index
    }

    /// Points the `family` default route at `interface`.
    pub fn set_default_route(&self, family: Family, interface: &str) {
        let mut k = self.kernel();
        let (index, _) = k.link_by_name(interface).expect("known link");
        k.defaults.insert(family, index);
        k.broadcast(|_| Some(KernelEvent::LinksChanged));
    }

    /// Makes reads of the links fail, or work again.
    pub fn set_links_unreadable(&self, unreadable: bool) {
        self.kernel().links_unreadable = unreadable;
    }

    /// Makes creating a `dummy` link fail as on kernels without the driver.
    pub fn set_dummy_supported(&self, supported: bool) {
        self.kernel().dummy_supported = supported;
    }

    /// An address added by someone else (by hand, DHCP): never ours.
    pub fn add_by_hand(&self, interface: &str, ip: IpAddr, prefix_len: u8) {
        self.insert_untracked(interface, ip, prefix_len, false);
    }

    /// A tagged address a previous run left behind.
    pub fn leave_over(&self, interface: &str, ip: IpAddr, prefix_len: u8) {
        self.insert_untracked(interface, ip, prefix_len, true);
    }

    fn insert_untracked(&self, interface: &str, ip: IpAddr, prefix_len: u8, ours: bool) {
        let mut k = self.kernel();
        let (ifindex, _) = k.link_by_name(interface).expect("known link");
        k.addresses.push(MemoryAddress {
            interface: interface.to_string(),
            ifindex,
            ip,
            prefix_len,
            ours,
            lifetime: Lifetime::FOREVER,
            expires: None,
            renewals: 0,
        });
    }

    /// `ip addr del` by hand: subscribers that own the address hear of it.
    pub fn remove_by_hand(&self, interface: &str, ip: IpAddr) {
        self.kernel()
            .drop_addresses(|a| a.interface == interface && a.ip == ip);
    }

    /// Carrier on or off; subscribers hear of transitions.
    pub fn set_carrier(&self, interface: &str, up: bool) {
        let mut k = self.kernel();
        let (index, _) = k.link_by_name(interface).expect("known link");
        let link = k.links.get_mut(&index).expect("just found");
        if link.carrier == up {
            return;
        }
        link.carrier = up;
        let interface = interface.to_string();
        k.broadcast(|_| {
            Some(if up {
                KernelEvent::CarrierRegained {
                    ifindex: index,
                    interface: interface.clone(),
                }
            } else {
                KernelEvent::CarrierLost {
                    ifindex: index,
                    interface: interface.clone(),
                }
            })
        });
    }

    /// Drops the addresses whose lifetime has run out by Tokio's clock, as
    /// the kernel does.
    pub fn expire(&self) {
        let now = Instant::now();
        self.kernel()
            .drop_addresses(|a| a.expires.is_some_and(|t| t <= now));
    }

    /// Tells every subscriber that events were lost.
    pub fn overrun(&self) {
        self.kernel().broadcast(|_| Some(KernelEvent::Resync));
    }

    /// Everything the kernel holds, in the order added.
    pub fn addresses(&self) -> Vec<MemoryAddress> {
        self.kernel().addresses.clone()
    }
}

impl AddressBackend for MemoryBackend {
    async fn announce_interface(
        &self,
        family: Family,
        configured: Option<&str>,
    ) -> Result<Interface> {
        if let Some(name) = configured.filter(|n| !n.is_empty()) {
            return self.interface(name).await;
        }
        let k = self.kernel();
        let index = *k
            .defaults
            .get(&family)
            .ok_or(Error::NoDefaultRoute { family })?;
        k.describe(index).ok_or(Error::InterfaceGone { index })
    }

    async fn interface(&self, name: &str) -> Result<Interface> {
        let k = self.kernel();
        let (index, _) = k.link_by_name(name).ok_or_else(|| Error::NoSuchInterface {
            name: name.to_string(),
        })?;
        Ok(k.describe(index).expect("just found"))
    }

    async fn interfaces(&self) -> Result<Vec<Interface>> {
        let k = self.kernel();
        if k.links_unreadable {
            return Err(Error::Socket(std::io::Error::from_raw_os_error(
                libc::ENOBUFS,
            )));
        }
        Ok(k.links.keys().filter_map(|&i| k.describe(i)).collect())
    }

    async fn ensure_virtual_interface(&self, name: &str) -> Result<Interface> {
        let exists = self.kernel().link_by_name(name).is_some();
        if !exists {
            if !self.kernel().dummy_supported {
                return Err(Error::VirtualInterface {
                    name: name.to_string(),
                    reason:
                        "this kernel has no dummy link type and no interface of that name exists"
                            .to_string(),
                });
            }
            self.add_link(name, None, &[]);
        }
        self.interface(name).await
    }

    async fn add(&self, vip: &VipAddress) -> Result<Applied> {
        if Prefix::new(vip.ip, vip.prefix_len).is_none() {
            return Err(Error::InvalidPrefix {
                ip: vip.ip,
                prefix_len: vip.prefix_len,
            });
        }
        let mut k = self.kernel();
        if !k.links.contains_key(&vip.ifindex) {
            return Err(Error::InterfaceGone { index: vip.ifindex });
        }
        let key = (vip.ifindex, vip.ip);
        let expires = vip.lifetime.duration().map(|d| Instant::now() + d);
        match k
            .addresses
            .iter_mut()
            .find(|a| a.ifindex == vip.ifindex && a.ip == vip.ip)
        {
            Some(a) if !a.ours => {
                self.owned_set().remove(&key);
                return Ok(Applied::NotOurs);
            }
            Some(a) => {
                a.prefix_len = vip.prefix_len;
                a.lifetime = vip.lifetime;
                a.expires = expires;
                a.ours = true;
                a.renewals += 1;
            }
            None => k.addresses.push(MemoryAddress {
                interface: vip.interface.clone(),
                ifindex: vip.ifindex,
                ip: vip.ip,
                prefix_len: vip.prefix_len,
                ours: true,
                lifetime: vip.lifetime,
                expires,
                renewals: 0,
            }),
        }
        self.owned_set().insert(key);
        Ok(Applied::Done)
    }

    async fn remove(&self, vip: &VipAddress) -> Result<Applied> {
        let key = (vip.ifindex, vip.ip);
        self.owned_set().remove(&key);
        let mut k = self.kernel();
        let Some(pos) = k
            .addresses
            .iter()
            .position(|a| a.ifindex == vip.ifindex && a.ip == vip.ip)
        else {
            return Ok(Applied::Done);
        };
        if !k.addresses[pos].ours {
            return Ok(Applied::NotOurs);
        }
        k.addresses.remove(pos);
        Ok(Applied::Done)
    }

    async fn adopt(&self) -> Result<Vec<OwnedAddress>> {
        let found = self.owned().await?;
        *self.owned_set() = found.iter().map(|o| (o.ifindex, o.ip)).collect();
        Ok(found)
    }

    async fn owned(&self) -> Result<Vec<OwnedAddress>> {
        let mut out: Vec<OwnedAddress> = self
            .kernel()
            .addresses
            .iter()
            .filter(|a| a.ours)
            .map(owned_address)
            .collect();
        out.sort();
        Ok(out)
    }

    async fn subscribe(&self) -> Result<Events> {
        let (tx, events) = event_channel(EVENT_QUEUE);
        self.kernel().subscribers.push(Subscriber {
            tx,
            owned: Arc::clone(&self.owned),
        });
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn host() -> MemoryBackend {
        let b = MemoryBackend::new();
        b.add_link(
            "eth0",
            Some(MacAddr([2, 0, 0, 0, 0, 1])),
            &["10.0.0.0/24", "fd00:1::/64"],
        );
        b.set_default_route(Family::V4, "eth0");
        b.set_default_route(Family::V6, "eth0");
        b
    }

    #[tokio::test]
    async fn vip_takes_the_on_link_prefix_and_add_remove_are_idempotent() {
        let b = host();
        let eth0 = b.announce_interface(Family::V6, None).await.unwrap();
        let vip = eth0.vip(ip("fd00:1::100"), Lifetime::FOREVER).unwrap();
        assert_eq!(vip.prefix_len, 64);
        assert!(eth0.vip(ip("fd00:2::1"), Lifetime::FOREVER).is_none());
        assert_eq!(b.add(&vip).await.unwrap(), Applied::Done);
        assert_eq!(b.add(&vip).await.unwrap(), Applied::Done);
        assert_eq!(b.addresses().len(), 1);
        assert_eq!(b.addresses()[0].renewals, 1);
        assert_eq!(b.remove(&vip).await.unwrap(), Applied::Done);
        assert_eq!(b.remove(&vip).await.unwrap(), Applied::Done);
        assert!(b.addresses().is_empty());
    }

    #[tokio::test]
    async fn an_address_added_by_hand_is_never_touched() {
        let b = host();
        let eth0 = b.interface("eth0").await.unwrap();
        b.add_by_hand("eth0", ip("10.0.0.100"), 24);
        let vip = eth0.vip(ip("10.0.0.100"), Lifetime::FOREVER).unwrap();
        assert_eq!(b.add(&vip).await.unwrap(), Applied::NotOurs);
        assert_eq!(b.remove(&vip).await.unwrap(), Applied::NotOurs);
        assert_eq!(b.adopt().await.unwrap(), vec![]);
        let left = b.addresses();
        assert_eq!(left.len(), 1);
        assert!(!left[0].ours);
        assert_eq!(left[0].renewals, 0);
    }

    #[tokio::test]
    async fn restart_adopts_exactly_what_the_previous_run_left() {
        let b = host();
        let eth0 = b.interface("eth0").await.unwrap();
        b.add(&eth0.vip(ip("10.0.0.100"), Lifetime::FOREVER).unwrap())
            .await
            .unwrap();
        b.add_by_hand("eth0", ip("10.0.0.7"), 24);
        let again = b.restart();
        let adopted = again.adopt().await.unwrap();
        assert_eq!(adopted.len(), 1);
        assert_eq!(adopted[0].ip, ip("10.0.0.100"));
    }

    #[tokio::test(start_paused = true)]
    async fn unrenewed_addresses_expire_and_owners_hear_of_it() {
        let b = host();
        let mut events = b.subscribe().await.unwrap();
        let eth0 = b.interface("eth0").await.unwrap();
        let vip = eth0
            .vip(ip("10.0.0.100"), Lifetime::new(Duration::from_secs(3)))
            .unwrap();
        b.add(&vip).await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        b.add(&vip).await.unwrap();
        tokio::time::advance(Duration::from_secs(2)).await;
        b.expire();
        assert_eq!(b.addresses().len(), 1, "renewed at 2 s, so alive at 4 s");
        tokio::time::advance(Duration::from_secs(2)).await;
        b.expire();
        assert!(b.addresses().is_empty());
        assert_eq!(
            events.try_recv(),
            Some(KernelEvent::AddressRemoved(OwnedAddress {
                interface: "eth0".into(),
                ifindex: eth0.index,
                ip: ip("10.0.0.100"),
                prefix_len: 24,
            }))
        );
    }

    #[tokio::test]
    async fn events_report_our_removals_and_carrier_but_not_our_own_removes() {
        let b = host();
        let mut events = b.subscribe().await.unwrap();
        let eth0 = b.interface("eth0").await.unwrap();
        let vip = eth0.vip(ip("10.0.0.100"), Lifetime::FOREVER).unwrap();
        b.add(&vip).await.unwrap();
        b.add_by_hand("eth0", ip("10.0.0.8"), 24);
        b.remove_by_hand("eth0", ip("10.0.0.8"));
        b.remove_by_hand("eth0", ip("10.0.0.100"));
        assert!(matches!(
            events.try_recv(),
            Some(KernelEvent::AddressRemoved(o)) if o.ip == ip("10.0.0.100")
        ));
        b.add(&vip).await.unwrap();
        b.remove(&vip).await.unwrap();
        b.set_carrier("eth0", false);
        b.set_carrier("eth0", false);
        b.overrun();
        assert_eq!(
            events.try_recv(),
            Some(KernelEvent::CarrierLost {
                ifindex: eth0.index,
                interface: "eth0".into()
            })
        );
        assert_eq!(events.try_recv(), Some(KernelEvent::Resync));
        assert_eq!(events.try_recv(), None);
    }

    #[tokio::test]
    async fn an_address_re_added_by_hand_after_ours_went_is_not_ours() {
        let b = host();
        let mut events = b.subscribe().await.unwrap();
        let eth0 = b.interface("eth0").await.unwrap();
        let vip = eth0.vip(ip("10.0.0.100"), Lifetime::FOREVER).unwrap();
        b.add(&vip).await.unwrap();
        b.remove_by_hand("eth0", vip.ip);
        assert!(matches!(
            events.try_recv(),
            Some(KernelEvent::AddressRemoved(o)) if o.ip == vip.ip
        ));
        // Put back by hand before the agent does: someone else's now.
        b.add_by_hand("eth0", vip.ip, 24);
        assert_eq!(b.add(&vip).await.unwrap(), Applied::NotOurs);
        assert_eq!(b.remove(&vip).await.unwrap(), Applied::NotOurs);
        let left = b.addresses();
        assert_eq!(left.len(), 1);
        assert!(!left[0].ours && left[0].renewals == 0, "{left:?}");
        assert_eq!(left[0].lifetime, Lifetime::FOREVER);
        // No longer ours: its removal is nobody's event.
        b.remove_by_hand("eth0", vip.ip);
        assert_eq!(events.try_recv(), None);
    }

    #[tokio::test]
    async fn virtual_interface_needs_a_dummy_driver_or_an_existing_link() {
        let b = host();
        b.set_dummy_supported(false);
        let err = b.ensure_virtual_interface("kube-lb0").await.unwrap_err();
        assert!(
            err.to_string().contains("virtual_interface = \"\""),
            "{err}"
        );
        b.add_link("kube-lb0", None, &[]);
        let lb = b.ensure_virtual_interface("kube-lb0").await.unwrap();
        assert_eq!(
            lb.host_vip(ip("192.0.2.1"), Lifetime::FOREVER).prefix_len,
            32
        );
        assert_eq!(
            lb.host_vip(ip("2001:db8::1"), Lifetime::FOREVER).prefix_len,
            128
        );
    }
}
