//! The LAN side of the shell: the announcer and the claim reader, and
//! sending announcements and probes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, error, warn};

use crate::announce::packet::Claim;
use crate::announce::{Announcer, Heard, Target};

/// The addresses whose claims reach the loop, each with the index of the
/// interface it is announced on (or asked about): a claim counts only from
/// there.
type Watched = Arc<RwLock<BTreeMap<IpAddr, u32>>>;

/// The wire beside the kernel: announcements and probes go out through
/// the announcer; claims on the addresses the core watches come in.
pub(super) struct Wire {
    pub(super) announcer: Option<Arc<Announcer>>,
    pub(super) claims: Option<mpsc::Receiver<Claim>>,
    /// The reader the task reads from, for [`Wire::received`].
    reader: Option<Arc<crate::announce::Claims>>,
    /// The addresses whose claims reach the loop (a busy LAN carries ARP
    /// for every host on it), shared with the task that reads the wire.
    watched: Watched,
    /// What the wire said that was no claim, for the metrics.
    pub(super) refused: Arc<Refused>,
}

/// Claims on watched addresses that did not count, by why: kept off the
/// loop (a flood of them costs a counter, not a queue or a log line).
#[derive(Debug, Default)]
pub struct Refused {
    /// Neighbor Advertisements with a hop limit other than 255: sent from
    /// off the link, which no owner of an address on it is.
    pub off_link: AtomicU64,
    /// Claims heard on another interface than the address's own: a pod's
    /// veth, another network of the host.
    pub other_interface: AtomicU64,
}

/// What becomes of one thing heard on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admit {
    /// A claim on a watched address, from its own interface.
    Claim(Claim),
    /// Not about a watched address: the LAN's own business.
    Unwatched,
    OffLink,
    OtherInterface,
}

/// The one rule for what the wire may say to the loop: only a claim on a
/// watched address, heard on the interface it is announced on, and (for
/// IPv6) sent on the link. The kernel takes ARP and ND for an address the
/// same way.
fn admit(watched: &BTreeMap<IpAddr, u32>, heard: Heard) -> Admit {
    match watched.get(&heard.claim.ip) {
        None => Admit::Unwatched,
        Some(_) if !heard.on_link => Admit::OffLink,
        Some(at) if *at == heard.ifindex => Admit::Claim(heard.claim),
        Some(_) => Admit::OtherInterface,
    }
}

impl Refused {
    /// Counts `admit`'s refusal, if it is one; the claim if it counts.
    fn sort(&self, admitted: Admit) -> Option<Claim> {
        match admitted {
            Admit::Claim(c) => return Some(c),
            Admit::Unwatched => {}
            Admit::OffLink => {
                self.off_link.fetch_add(1, Ordering::Relaxed);
            }
            Admit::OtherInterface => {
                self.other_interface.fetch_add(1, Ordering::Relaxed);
            }
        }
        None
    }
}

/// Claims waiting for the loop, at most.
const CLAIMS_QUEUED: usize = 8192;

/// Opens the claim reader: only claims on the watched addresses, from
/// their own interfaces, reach the loop, through a bounded channel whose
/// overflow is dropped (the next probe asks again). It holds a round of
/// announcements (two frames) for 4,000 VIPs: a winner taking over a
/// thousand sends them all at once.
pub(super) fn open_wire(announcer: Option<Arc<Announcer>>) -> Wire {
    let watched: Watched = Arc::default();
    let refused: Arc<Refused> = Arc::default();
    let mut reader = None;
    let claims = match crate::announce::Claims::open() {
        Ok(claims) => {
            let claims = Arc::new(claims);
            reader = Some(claims.clone());
            let (tx, rx) = mpsc::channel(CLAIMS_QUEUED);
            let (filter, refused) = (watched.clone(), refused.clone());
            tokio::spawn(async move {
                loop {
                    match claims.next().await {
                        Ok(heard) => {
                            let admitted =
                                admit(&filter.read().unwrap_or_else(|e| e.into_inner()), heard);
                            if let Some(c) = refused.sort(admitted)
                                && tx.try_send(c).is_err()
                                && tx.is_closed()
                            {
                                return;
                            }
                        }
                        Err(e) => {
                            warn!(error = %e, "reading ARP/ND failed");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            });
            Some(rx)
        }
        Err(e) => {
            error!(error = %e, "cannot watch the wire for second owners");
            None
        }
    };
    Wire {
        announcer,
        claims,
        reader,
        watched,
        refused,
    }
}

impl Wire {
    /// The addresses whose claims reach the loop from now on, and the
    /// interface of each: the kernel's filter first, then the reader's.
    pub(super) fn watch(&mut self, watched: BTreeMap<IpAddr, u32>) {
        if let Some(reader) = &self.reader {
            let ips: BTreeSet<IpAddr> = watched.keys().copied().collect();
            if let Err(e) = reader.watch(&ips) {
                // The reader's own filter still holds: more wake-ups, no loss.
                debug!(error = %e, "cannot set the kernel's ARP filter");
            }
        }
        *self.watched.write().unwrap_or_else(|e| e.into_inner()) = watched;
    }

    /// The claims on watched addresses that reached the host and wait for
    /// the loop, queued or still in the socket (the task that reads it runs
    /// only when the loop lets it). Read before a deadline is stepped, so
    /// that what arrived before it counts: a pre-check's answer left
    /// unread would otherwise be no answer, and a live owner's VIP taken.
    pub(super) fn received(&mut self) -> Option<Vec<Claim>> {
        let (queue, reader) = (self.claims.as_mut()?, self.reader.as_ref()?);
        let mut out = Vec::new();
        while let Ok(c) = queue.try_recv() {
            out.push(c);
        }
        let watched = self.watched.read().unwrap_or_else(|e| e.into_inner());
        // Bounded like the queue: a flood still lets the deadline pass.
        let mut read = 0;
        while read < CLAIMS_QUEUED {
            match reader.try_next() {
                Ok(Some(heard)) => {
                    read += 1;
                    out.extend(self.refused.sort(admit(&watched, heard)));
                }
                Ok(None) => break,
                Err(e) => {
                    debug!(error = %e, "reading ARP/ND failed");
                    break;
                }
            }
        }
        (!out.is_empty()).then_some(out)
    }
}

/// Sends one frame (or round) per target, logging failures: the core
/// decides what to send and when, this only sends it.
pub(super) async fn send_each<F, Fut>(targets: Vec<Target>, send: F)
where
    F: Fn(Target) -> Fut,
    Fut: std::future::Future<Output = crate::announce::Result<()>>,
{
    for t in targets {
        if let Err(e) = send(t).await {
            debug!(ip = %t.ip, error = %e, "sending on the wire failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MacAddr;

    /// A claim counts only on a watched address, from the interface it is
    /// announced on; an advertisement sent from off the link never.
    #[test]
    fn a_claim_counts_only_from_its_addresses_interface() {
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let claim = Claim {
            ip,
            mac: MacAddr([2, 0, 0, 0, 0, 9]),
        };
        let watched = BTreeMap::from([(ip, 2)]);
        let on = |ifindex| Heard {
            claim,
            ifindex,
            on_link: true,
        };
        let routed = Heard {
            on_link: false,
            ..on(2)
        };
        assert_eq!(admit(&watched, on(2)), Admit::Claim(claim));
        assert_eq!(admit(&watched, on(7)), Admit::OtherInterface);
        assert_eq!(admit(&BTreeMap::new(), on(2)), Admit::Unwatched);
        assert_eq!(admit(&watched, routed), Admit::OffLink);
        assert_eq!(admit(&BTreeMap::new(), routed), Admit::Unwatched);
        let refused = Refused::default();
        assert_eq!(refused.sort(admit(&watched, on(7))), None);
        assert_eq!(refused.sort(admit(&watched, routed)), None);
        assert_eq!(refused.sort(admit(&BTreeMap::new(), on(2))), None);
        assert_eq!(refused.sort(admit(&watched, on(2))), Some(claim));
        assert_eq!(refused.other_interface.load(Ordering::Relaxed), 1);
        assert_eq!(refused.off_link.load(Ordering::Relaxed), 1);
    }
}
