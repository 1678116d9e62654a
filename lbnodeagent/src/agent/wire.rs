//! The LAN side of the shell: the announcer and the claim reader, and
//! sending announcements and probes without holding up the loop.

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
    let claims = match crate::announce::Claims::open() {
        Ok(claims) => {
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
        watched,
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
