//! What the shell checks and keeps on the side: the ARP sysctls, the API
//! server's health, the peers file `cleanup` reads, and start-up's pages,
//! let go once it is over.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

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

    /// Once the agent has been ready for [`START_OVER`], the pages of code
    /// it ran only to start are unmapped (see `crate::resident`), and the
    /// heap gives back the pages start-up freed (`heap::give_back`), on a
    /// blocking thread.
    pub(super) fn drop_start_code(&mut self) {
        let now = std::time::Instant::now();
        match self.start_code {
            StartCode::Starting if self.telemetry.applied.load(Ordering::Relaxed) => {
                self.start_code = StartCode::ReadyAt(now);
            }
            StartCode::ReadyAt(at) if now.saturating_duration_since(at) >= START_OVER => {
                self.start_code = StartCode::Dropped;
                tokio::task::spawn_blocking(|| {
                    match crate::resident::drop_code_pages() {
                        Ok(bytes) => {
                            debug!(mib = bytes >> 20, "unmapped the code pages start-up ran")
                        }
                        Err(e) => debug!(error = %e, "cannot unmap the code pages start-up ran"),
                    }
                    let gave = crate::heap::give_back();
                    debug!(gave, "gave the heap's free pages back");
                });
            }
            _ => {}
        }
    }

    /// Peers for `cleanup`, which runs after this process is gone; written
    /// on a blocking thread.
    pub(super) fn write_peers(&mut self) {
        let peers = self.core.peers();
        if let Some(file) = self.gossip.peers_file.offer(peers) {
            tokio::task::spawn_blocking(move || file.write());
        }
    }
}

/// How long after it became ready an agent's start-up counts as over:
/// its first lists, reconcile, annotation writes and Events are done
/// within seconds even with a thousand Services.
pub const START_OVER: std::time::Duration = std::time::Duration::from_secs(30);

/// Where the agent is in unmapping start-up's code pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StartCode {
    Starting,
    ReadyAt(std::time::Instant),
    Dropped,
}

/// The peers file `cleanup` reads to tell every peer this node left. A
/// starting node's peers change twice within milliseconds (one peer met,
/// then the other), and writes on blocking threads may finish in any
/// order: each write takes the newest list when it runs, and one write at
/// a time, so the last to finish writes the newest. Were an older list to
/// land last, `cleanup` would never tell the peer it lacks, which would
/// take the VIPs over only when gossip shows the node gone, hundreds of
/// milliseconds later.
#[derive(Clone)]
pub(super) struct PeersFile {
    path: PathBuf,
    /// The newest list given.
    newest: Arc<Mutex<Vec<SocketAddr>>>,
    /// Held while writing: one write at a time.
    writing: Arc<Mutex<()>>,
}

impl PeersFile {
    pub(super) fn new(run_dir: &Path) -> PeersFile {
        PeersFile {
            path: run_dir.join(PEERS_FILE),
            newest: Arc::default(),
            writing: Arc::default(),
        }
    }

    /// Notes `peers` as the newest; a handle to write with when they are
    /// news.
    pub(super) fn offer(&self, peers: Vec<SocketAddr>) -> Option<PeersFile> {
        let mut newest = self.newest.lock().unwrap_or_else(|e| e.into_inner());
        if *newest == peers {
            return None;
        }
        *newest = peers;
        Some(self.clone())
    }

    /// Writes the newest list, whole (a temporary file renamed over it).
    pub(super) fn write(&self) {
        let _one = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let peers = self
            .newest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let text: String = peers.iter().map(|p| format!("{p}\n")).collect();
        let tmp = self.path.with_extension("tmp");
        let written = self
            .path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, text))
            .and_then(|()| std::fs::rename(&tmp, &self.path));
        if let Err(e) = written {
            debug!(error = %e, path = %self.path.display(), "cannot write the peer list");
        }
    }
}

#[cfg(test)]
mod peers_tests {
    use super::*;

    #[test]
    fn the_newest_peers_are_written_whichever_write_runs_last() {
        let dir = tempfile::tempdir().unwrap();
        let file = PeersFile::new(dir.path());
        let a: SocketAddr = "10.0.0.1:7934".parse().unwrap();
        let c: SocketAddr = "10.0.0.3:7934".parse().unwrap();
        let first = file.offer(vec![a]).expect("news");
        let second = file.offer(vec![a, c]).expect("news");
        assert!(file.offer(vec![a, c]).is_none(), "the same list is no news");
        // The later write finishes first, the earlier one last.
        second.write();
        first.write();
        let text = std::fs::read_to_string(dir.path().join(PEERS_FILE)).unwrap();
        assert_eq!(text, "10.0.0.1:7934\n10.0.0.3:7934\n");
    }
}
