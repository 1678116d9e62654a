//! Kernel addresses: the one place the agent reads links and routes and adds,
//! renews and removes VIPs.
//!
//! The reconcile loop talks to an [`AddressBackend`]: [`NetlinkBackend`] on a
//! real host, [`MemoryBackend`] in tests. Data flows one way: the loop asks
//! for the announce interface and its on-link prefixes (which go into gossip
//! and the election), adds the VIPs it wins, renews them at a third of their
//! lifetime, removes the ones it loses, and listens to [`KernelEvent`]s to put
//! back what someone removed by hand or to release everything when the
//! carrier drops.
//!
//! Ownership is the invariant everything here protects: the backend touches
//! only addresses it added itself, tagged with [`IFA_PROTO_HOSTLB`] and listed
//! in a record file, so an address added by hand or by DHCP survives even when
//! it equals a VIP.

mod error;
mod memory;
mod netlink;
mod record;
mod routes;

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hostlb_api::Family;
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;

pub use crate::model::{Applied, Interface, Lifetime, MacAddr, OwnedAddress, VipAddress};
pub use error::{Error, Result};
pub use memory::{MemoryAddress, MemoryBackend};
pub use netlink::{NetlinkBackend, NetlinkConfig};

/// The `IFA_PROTO` value on every address the agent adds: `0x68`, ASCII `h`
/// for hostlb. The kernel reserves 1-3 for its own addresses (loopback, router
/// advertisement, link-local) and no common network manager sets this field,
/// so `ip -d addr` shows `proto 0x68` on exactly our VIPs. Kernels before 5.18
/// drop it silently, which is why a record file backs it up (and why, on
/// those kernels, the address lifetime serves as evidence; see `netlink`).
pub const IFA_PROTO_HOSTLB: u8 = 0x68;

/// The default `announce.address_lifetime` (SPEC §6).
pub const DEFAULT_ADDRESS_LIFETIME: Duration = Duration::from_secs(15);

/// The default `announce.virtual_interface`.
pub const DEFAULT_VIRTUAL_INTERFACE: &str = "kube-lb0";

/// A change in the kernel the reconcile loop must react to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelEvent {
    /// One of our addresses disappeared without the backend removing it (by
    /// hand, expiry, link deletion): add it again if still wanted. The
    /// backend keeps the IP on its books until the caller adds or removes
    /// it, but not whatever holds that IP next: if someone re-adds it by hand
    /// first, `add` and `remove` answer [`Applied::NotOurs`] and leave it.
    AddressRemoved(OwnedAddress),
    /// The link went down or lost carrier, or was deleted: release its VIPs.
    /// Carrier events come for every link, only on transitions; the caller
    /// compares `ifindex` with its announce interfaces (a node has many
    /// links, pod veths among them, and may announce on several).
    CarrierLost {
        ifindex: u32,
        interface: String,
    },
    CarrierRegained {
        ifindex: u32,
        interface: String,
    },
    /// Kernel events were lost (netlink buffer overrun, or more than
    /// [`EVENT_QUEUE`] waiting for the caller): re-read everything.
    Resync,
    /// Something a read of the links shows may have changed: a route of
    /// the main table, a link's name, MAC or flags, a link added or
    /// deleted, someone else's address deleted. Coalesced: however many changes came since the subscriber
    /// last took one, it gets one, after the events queued before it.
    LinksChanged,
}

/// How many kernel events may wait for one subscriber. Beyond it the
/// backend stops queueing and owes the subscriber one [`KernelEvent::Resync`]
/// instead, so a stalled consumer costs bounded memory, and a burst (a link
/// with thousands of addresses flushed) one full resync.
pub const EVENT_QUEUE: usize = 1024;

/// What is owed beside the queue. A queue overflowed: the events dropped
/// since are replaced by one [`KernelEvent::Resync`], delivered after the
/// events queued before. The links changed: one
/// [`KernelEvent::LinksChanged`] stands for any number of them, so a burst
/// of route changes neither fills the queue nor costs a read each.
#[derive(Default)]
struct Overflow {
    lost: AtomicBool,
    links_changed: AtomicBool,
    notify: Notify,
}

/// The backend's end of an [`Events`] subscription.
pub(crate) struct EventSender {
    tx: mpsc::Sender<KernelEvent>,
    overflow: Arc<Overflow>,
}

impl EventSender {
    /// Queues `event` without waiting. On a full queue the event is dropped
    /// and a resync owed, and every event after it is dropped too until the
    /// subscriber has taken that resync: the resync reads the kernel after
    /// all of them happened. `false` once the subscriber is gone.
    pub(crate) fn send(&self, event: KernelEvent) -> bool {
        if self.overflow.lost.load(Ordering::SeqCst) {
            return !self.tx.is_closed();
        }
        if event == KernelEvent::LinksChanged {
            if !self.overflow.links_changed.swap(true, Ordering::SeqCst) {
                self.overflow.notify.notify_one();
            }
            return !self.tx.is_closed();
        }
        match self.tx.try_send(event) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.overflow.lost.store(true, Ordering::SeqCst);
                self.overflow.notify.notify_one();
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// A subscription's two ends, with at most `capacity` events queued.
pub(crate) fn event_channel(capacity: usize) -> (EventSender, Events) {
    let (tx, rx) = mpsc::channel(capacity);
    let overflow = Arc::new(Overflow::default());
    (
        EventSender {
            tx,
            overflow: Arc::clone(&overflow),
        },
        Events {
            rx,
            overflow,
            _task: None,
        },
    )
}

/// Kernel events, in order. Subscribe before the first read of the kernel
/// state so that nothing falls between the two.
pub struct Events {
    rx: mpsc::Receiver<KernelEvent>,
    overflow: Arc<Overflow>,
    _task: Option<AbortOnDrop>,
}

impl Events {
    /// Runs `task` (which feeds the sender) for as long as the subscription
    /// lives.
    pub(crate) fn attach(&mut self, task: JoinHandle<()>) {
        self._task = Some(AbortOnDrop(task));
    }

    /// The next event; `None` once the source has stopped (netlink socket
    /// closed or the backend dropped), after which the caller should
    /// subscribe again and resync.
    pub async fn recv(&mut self) -> Option<KernelEvent> {
        loop {
            if let Some(event) = self.try_recv() {
                return Some(event);
            }
            tokio::select! {
                biased;
                event = self.rx.recv() => return event,
                () = self.overflow.notify.notified() => {}
            }
        }
    }

    /// An event if one is waiting, without blocking.
    pub fn try_recv(&mut self) -> Option<KernelEvent> {
        if let Ok(event) = self.rx.try_recv() {
            return Some(event);
        }
        if self.overflow.lost.swap(false, Ordering::SeqCst) {
            // A resync reads the links too.
            self.overflow.links_changed.store(false, Ordering::SeqCst);
            return Some(KernelEvent::Resync);
        }
        self.overflow
            .links_changed
            .swap(false, Ordering::SeqCst)
            .then_some(KernelEvent::LinksChanged)
    }
}

/// Stops a background task with its owner, so a dropped backend or event
/// stream leaves no netlink socket behind.
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The agent's view of kernel addresses. Every method is idempotent and never
/// changes an address the backend did not add.
///
/// Every method may be cancelled (its future dropped) at any point. `add` and
/// `remove` are cancel-safe in this sense: a cancelled call may or may not
/// have taken effect in the kernel, but never leaves there an address the
/// backend no longer counts as its own (ownership is recorded before an
/// address is added and dropped only after the kernel confirmed its
/// deletion); call it again to settle it.
/// One read of the links ([`AddressBackend::links_and_announce`]).
#[derive(Debug)]
pub struct LinksRead {
    pub all: Result<Vec<Interface>>,
    /// The announce interface of IPv4, then of IPv6.
    pub announce: [Result<Interface>; 2],
    /// The host's local unicast addresses (its own and the VIPs it holds),
    /// from the kernel's local routes, sorted; empty where unknown.
    pub local: Vec<IpAddr>,
    /// The default routes' gateways, IPv4 then IPv6, where known.
    pub gateways: Vec<crate::model::Gateway>,
}

pub trait AddressBackend: Send + Sync {
    /// The interface to announce `family` VIPs on: `configured` if set, else
    /// the output interface of the main table's default route with the lowest
    /// metric (for a multipath default route, its first next hop).
    fn announce_interface(
        &self,
        family: Family,
        configured: Option<&str>,
    ) -> impl Future<Output = Result<Interface>> + Send;

    /// A named interface with its prefixes, for L2Advertisement `interfaces`.
    fn interface(&self, name: &str) -> impl Future<Output = Result<Interface>> + Send;

    /// Every link with its on-link prefixes. The agent publishes the
    /// prefixes of all of them, so the election can tell a node that has a
    /// VIP's subnet on an interface it may not announce on (and must then
    /// stay out) from one that has it nowhere (and goes virtual).
    fn interfaces(&self) -> impl Future<Output = Result<Vec<Interface>>> + Send;

    /// [`interfaces`](Self::interfaces), and the announce interface of IPv4
    /// and of IPv6 as [`announce_interface`](Self::announce_interface) gives
    /// them. The agent reads these whenever the kernel says they changed,
    /// so a backend that can answers all three from one read of the links
    /// and routes.
    fn links_and_announce(
        &self,
        configured: Option<&str>,
    ) -> impl Future<Output = LinksRead> + Send {
        async move {
            let all = self.interfaces().await;
            let v4 = self.announce_interface(Family::V4, configured).await;
            let v6 = self.announce_interface(Family::V6, configured).await;
            LinksRead {
                all,
                announce: [v4, v6],
                local: Vec::new(),
                gateways: Vec::new(),
            }
        }
    }

    /// The virtual interface for off-link VIPs: a `dummy` link created on
    /// demand, or an existing link of that name where the kernel has no dummy
    /// driver.
    fn ensure_virtual_interface(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Interface>> + Send;

    /// Adds `vip`, or renews its lifetime if the backend added it before.
    /// Call again at [`Lifetime::renew_every`]. While an event subscription
    /// runs, renewing an address the backend holds reads only its link's
    /// addresses, and renews only if the address there is still ours.
    fn add(&self, vip: &VipAddress) -> impl Future<Output = Result<Applied>> + Send;

    /// Removes `vip` (any prefix length) if the backend added it.
    fn remove(&self, vip: &VipAddress) -> impl Future<Output = Result<Applied>> + Send;

    /// [`add`](Self::add) for many addresses at once, with the results in
    /// the same order. Taking over a failed host's VIPs and renewing what a
    /// node holds are such batches: a backend that can reads each link
    /// once, writes its record once and sends its requests together.
    fn add_many(&self, vips: &[VipAddress]) -> impl Future<Output = Vec<Result<Applied>>> + Send {
        async move {
            let mut out = Vec::with_capacity(vips.len());
            for vip in vips {
                out.push(self.add(vip).await);
            }
            out
        }
    }

    /// [`remove`](Self::remove) for many addresses at once, as
    /// [`add_many`](Self::add_many).
    fn remove_many(
        &self,
        vips: &[VipAddress],
    ) -> impl Future<Output = Vec<Result<Applied>>> + Send {
        async move {
            let mut out = Vec::with_capacity(vips.len());
            for vip in vips {
                out.push(self.remove(vip).await);
            }
            out
        }
    }

    /// At startup: exactly the addresses a previous run of the agent left in
    /// the kernel, which the backend now treats as its own. The caller keeps
    /// (re-adds) or removes each.
    fn adopt(&self) -> impl Future<Output = Result<Vec<OwnedAddress>>> + Send;

    /// The backend's addresses as the kernel has them now, for the periodic
    /// resync against the kernel.
    fn owned(&self) -> impl Future<Output = Result<Vec<OwnedAddress>>> + Send;

    /// Address and link events from now on.
    fn subscribe(&self) -> impl Future<Output = Result<Events>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetime_zero_is_forever_and_fractions_round_up() {
        assert_eq!(Lifetime::new(Duration::ZERO), Lifetime::FOREVER);
        assert_eq!(Lifetime::FOREVER.kernel_seconds(), None);
        assert_eq!(Lifetime::FOREVER.renew_every(), None);
        let l = Lifetime::new(Duration::from_secs(15));
        assert_eq!(l.kernel_seconds(), Some(15));
        assert_eq!(l.renew_every(), Some(Duration::from_secs(5)));
        assert_eq!(
            Lifetime::new(Duration::from_millis(1500)).kernel_seconds(),
            Some(2)
        );
        assert_eq!(
            Lifetime::new(Duration::from_millis(10)).kernel_seconds(),
            Some(1)
        );
    }

    fn carrier_lost(ifindex: u32) -> KernelEvent {
        KernelEvent::CarrierLost {
            ifindex,
            interface: format!("veth{ifindex}"),
        }
    }

    #[tokio::test]
    async fn an_overflowing_queue_delivers_what_it_held_then_one_resync() {
        let (tx, mut events) = event_channel(4);
        for i in 0..10 {
            assert!(tx.send(carrier_lost(i)));
        }
        for i in 0..4 {
            assert_eq!(events.recv().await, Some(carrier_lost(i)));
        }
        assert_eq!(events.recv().await, Some(KernelEvent::Resync));
        assert_eq!(events.try_recv(), None, "one resync for all that was lost");
        // Queueing resumes once the resync is taken.
        assert!(tx.send(carrier_lost(10)));
        assert_eq!(events.recv().await, Some(carrier_lost(10)));
        assert_eq!(events.try_recv(), None);
        // Lost again, seen by try_recv too.
        for i in 0..5 {
            tx.send(carrier_lost(i));
        }
        assert_eq!(
            std::iter::from_fn(|| events.try_recv()).collect::<Vec<_>>(),
            [
                carrier_lost(0),
                carrier_lost(1),
                carrier_lost(2),
                carrier_lost(3),
                KernelEvent::Resync
            ]
        );
        drop(events);
        assert!(!tx.send(carrier_lost(0)), "the subscriber is gone");
    }

    #[tokio::test]
    async fn a_waiting_subscriber_wakes_for_the_resync() {
        let (tx, mut events) = event_channel(1);
        let waiter = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(e) = events.recv().await {
                let resync = e == KernelEvent::Resync;
                got.push(e);
                if resync {
                    return got;
                }
            }
            got
        });
        tokio::task::yield_now().await;
        // Two at once into a queue of one, without the waiter running.
        assert!(tx.send(carrier_lost(1)));
        assert!(tx.send(carrier_lost(2)));
        let got = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(got, [carrier_lost(1), KernelEvent::Resync]);
    }

    #[test]
    fn mac_addresses_print_and_parse_like_ip_does() {
        let mac: MacAddr = "02:0a:FF:00:10:01".parse().unwrap();
        assert_eq!(mac, MacAddr([0x02, 0x0a, 0xff, 0x00, 0x10, 0x01]));
        assert_eq!(mac.to_string(), "02:0a:ff:00:10:01");
        assert!("02:0a:ff:00:10".parse::<MacAddr>().is_err());
        assert!("02:0a:ff:00:10:zz".parse::<MacAddr>().is_err());
        assert_eq!(MacAddr::from_slice(&[1, 2, 3, 4]), None);
    }

    #[test]
    fn a_vip_takes_the_most_specific_on_link_prefix() {
        let iface = Interface {
            name: "eth0".into(),
            index: 2,
            mac: None,
            carrier: true,
            prefixes: ["10.0.0.0/16", "10.0.5.0/24", "fd00::/64"]
                .iter()
                .map(|p| p.parse().unwrap())
                .collect(),
        };
        let vip = |ip: &str| iface.vip(ip.parse().unwrap(), Lifetime::FOREVER);
        assert_eq!(vip("10.0.5.9").unwrap().prefix_len, 24);
        assert_eq!(vip("10.0.6.9").unwrap().prefix_len, 16);
        assert_eq!(vip("fd00::9").unwrap().prefix_len, 64);
        assert_eq!(vip("10.1.0.1"), None);
        assert_eq!(iface.prefixes_of(Family::V6).count(), 1);
    }
}
