//! What the shell checks and keeps on the side: the ARP sysctls, the API
//! server's health, and the peers file `cleanup` reads.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use tracing::{debug, info, warn};

use super::arp;
use super::{Agent, PEERS_FILE};
use crate::addrs::AddressBackend;
use hostlb_api::runtime::notify::{NotifyState, notify};

impl<B: AddressBackend + 'static> Agent<B> {
    /// Whether the host answers ARP for its VIPs on networks they do not
    /// belong to (see `arp`): said in the log when it changes, in
    /// `/readyz`, `status` and a metric while it lasts. A warning, not a
    /// failed readiness: the node serves its own VIPs correctly, and only
    /// the host's settings, which the agent may not change, can fix it.
    pub(super) fn check_arp(&mut self) {
        let links = self.core.links();
        let held_on: BTreeSet<String> = self
            .core
            .held()
            .filter(|(ip, w)| ip.is_ipv4() && w.mode == super::core::links::Mode::Local)
            .map(|(_, w)| w.vip.interface.clone())
            .collect();
        let announce = links
            .announce_v4
            .and_then(|i| links.by_index(i))
            .map(|i| i.name.as_str());
        let virtual_index = links.virtual_link.as_ref().map(|v| v.index);
        let ethernet: Vec<String> = links
            .all
            .iter()
            .filter(|i| i.mac.is_some() && i.carrier && Some(i.index) != virtual_index)
            .map(|i| i.name.clone())
            .collect();
        let all = arp::read("all").unwrap_or_default();
        let by_interface = ethernet
            .iter()
            .filter_map(|n| arp::read(n).map(|s| (n.clone(), s)))
            .collect();
        let warnings: Vec<String> =
            arp::exposures(&held_on, announce, &ethernet, all, &by_interface)
                .iter()
                .map(|e| format!("VIPs exposed on another network: {e}"))
                .collect();
        self.telemetry.arp_exposed.set(warnings.len() as i64);
        let mut current = self
            .telemetry
            .warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *current != warnings {
            if warnings.is_empty() {
                info!("no interface answers ARP for VIPs of another any more");
            }
            for w in &warnings {
                warn!("{w}; docs/agent.md, \"Several networks per host\"");
            }
            *current = warnings;
        }
    }

    /// `/readyz` follows the watches as soon as one fails or recovers;
    /// systemd's STATUS says what a node without a first view waits for.
    pub(super) fn api_health(&mut self) {
        // The server takes requests again after it did not: every watch
        // lists anew, since one the network cut (rather than the server
        // refused) has no error to show and would hear of what changed
        // meanwhile only when TCP retransmits (see `KubeInputs::restart`);
        // and the record, whose write waited out the cut, is written now.
        let answered = self.telemetry.api_writable.load(Ordering::Relaxed);
        if answered && !self.api_answered {
            info!(server = %self.kube.server(), "the API server is back: listing every watched kind again");
            self.kube.restart();
            self.publisher.api_back();
        }
        self.api_answered = answered;
        let healthy = self.kube.api_healthy();
        let was = self.telemetry.api_healthy.swap(healthy, Ordering::Relaxed);
        if was != healthy && !self.telemetry.applied.load(Ordering::Relaxed) && !healthy {
            let status = format!(
                "degraded: waiting for the API server ({}) for a first view of the cluster; not a candidate",
                self.kube.server()
            );
            notify(&[NotifyState::Status(&status)]);
        }
    }

    /// Peers for `cleanup`, which runs after this process is gone; written
    /// on a blocking thread.
    pub(super) fn write_peers(&mut self) {
        let peers = self.core.peers();
        if peers == self.gossip.peers_written {
            return;
        }
        self.gossip.peers_written = peers.clone();
        let dir = self.cfg.run_dir.clone();
        tokio::task::spawn_blocking(move || {
            let text: String = peers.iter().map(|p| format!("{p}\n")).collect();
            let path = dir.join(PEERS_FILE);
            let tmp = dir.join(format!("{PEERS_FILE}.tmp"));
            let written = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&tmp, text))
                .and_then(|()| std::fs::rename(&tmp, &path));
            if let Err(e) = written {
                debug!(error = %e, path = %path.display(), "cannot write the peer list");
            }
        });
    }
}
