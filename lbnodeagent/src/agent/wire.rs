//! The LAN side of the shell: the announcer and the claim reader, and
//! sending announcements and probes.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::{debug, error, warn};

use crate::announce::packet::Claim;
use crate::announce::{Announcer, Target};

/// The wire beside the kernel: announcements and probes go out through
/// the announcer; claims on the addresses the core watches come in.
pub(super) struct Wire {
    pub(super) announcer: Option<Arc<Announcer>>,
    pub(super) claims: Option<mpsc::Receiver<Claim>>,
    /// The reader the task reads from, for [`Wire::received`].
    reader: Option<Arc<crate::announce::Claims>>,
    /// The addresses whose claims reach the loop (a busy LAN carries ARP
    /// for every host on it), shared with the task that reads the wire.
    pub(super) watched: Arc<RwLock<BTreeSet<IpAddr>>>,
}

/// Claims waiting for the loop, at most.
const CLAIMS_QUEUED: usize = 8192;

/// Opens the claim reader: only claims on the watched addresses reach the
/// loop, through a bounded channel whose overflow is dropped (the next
/// probe asks again). It holds a round of announcements (two frames) for
/// 4,000 VIPs: a winner taking over a thousand sends them all at once.
pub(super) fn open_wire(announcer: Option<Arc<Announcer>>) -> Wire {
    let watched: Arc<RwLock<BTreeSet<IpAddr>>> = Arc::default();
    let mut reader = None;
    let claims = match crate::announce::Claims::open() {
        Ok(claims) => {
            let claims = Arc::new(claims);
            reader = Some(claims.clone());
            let (tx, rx) = mpsc::channel(CLAIMS_QUEUED);
            let filter = watched.clone();
            tokio::spawn(async move {
                loop {
                    match claims.next().await {
                        Ok(c) => {
                            let wanted = filter
                                .read()
                                .unwrap_or_else(|e| e.into_inner())
                                .contains(&c.ip);
                            if wanted && tx.try_send(c).is_err() && tx.is_closed() {
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
    }
}

impl Wire {
    /// The addresses whose claims reach the loop from now on: the kernel's
    /// filter first, then the reader's.
    pub(super) fn watch(&mut self, watched: BTreeSet<IpAddr>) {
        if let Some(reader) = &self.reader
            && let Err(e) = reader.watch(&watched)
        {
            // The reader's own filter still holds: more wake-ups, no loss.
            debug!(error = %e, "cannot set the kernel's ARP filter");
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
        while out.len() < CLAIMS_QUEUED {
            match reader.try_next() {
                Ok(Some(c)) if watched.contains(&c.ip) => out.push(c),
                Ok(Some(_)) => {}
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
