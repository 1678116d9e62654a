//! What the agent shows operators: Prometheus metrics, health and readiness,
//! and `/status`, on `http.listen` (127.0.0.1:7472).
//!
//! Metrics and health are shared atomics the loop updates. `/status` is
//! built by the reconcile loop itself, on request, through a channel: the
//! loop owns the election and the held addresses, and answering from its
//! own state means the page can never show a mix of two moments.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use hostlb_api::runtime::admin::{self, Admin, Liveness};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};

use super::status::StatusDoc;
use crate::gossip::{AuthCounters, DetectorCounters};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

/// The takeover histogram's buckets (seconds).
fn takeover_histogram() -> Histogram {
    Histogram::new([0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0])
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    pub op: &'static str,
    pub result: &'static str,
}

pub struct Telemetry {
    registry: Mutex<Registry>,
    pub owned_vips: Gauge,
    /// Of `owned_vips`, those on the virtual interface: several nodes hold
    /// such a VIP at once, so they do not add up to the cluster's VIPs.
    pub virtual_vips: Gauge,
    pub live_members: Gauge,
    /// 1 while this agent cannot hold addresses (no CAP_NET_ADMIN).
    pub cannot_serve: Gauge,
    /// 1 while neither family has an announce interface.
    pub no_announce_interface: Gauge,
    /// Default gateways, by interface and family, that answered and then
    /// fell silent (`announce::gateway`).
    pub gateways_lost: Gauge,
    /// 1 while gossip reaches no other agent and the API shows some running.
    pub gossip_isolated: Gauge,
    /// Interfaces that would answer ARP for VIPs held on another (`arp`).
    pub arp_exposed: Gauge,
    /// 1 while `/readyz` says ready.
    pub ready: Gauge,
    /// VIPs of the cluster no live, eligible, on-link node may announce.
    pub vips_without_candidate: Gauge,
    /// Routed VIPs this node would hold on its virtual interface, that
    /// nobody serves, while its virtual mode is off.
    pub routed_unserved: Gauge,
    /// Conditions that do not stop the node serving but need an operator.
    pub warnings: Mutex<Vec<String>>,
    /// VIPs the firewall closes to all but their Services' ports (0: off).
    pub firewall_vips: Gauge,
    pub firewall_failures: Counter,
    /// Why the last rule set is not in force, while it is not.
    firewall_error: Mutex<Option<String>>,
    pub elections: Counter,
    pub election_seconds: Histogram,
    pub address_ops: Family<OpLabels, Counter>,
    /// From an owner's last beat to this node holding its VIP, by the
    /// move's cause (a host gone or stalled).
    pub takeover_seconds: Family<CauseLabels, Histogram, fn() -> Histogram>,
    /// VIPs that moved here from another node, by cause.
    pub moves: Family<CauseLabels, Counter>,
    pub object_errors: Gauge,
    pub events_dropped: Counter,
    /// Beats in a node's name that it did not prove, by why.
    pub beats_refused: Family<ReasonLabels, Counter>,
    pub api_writes: Family<OpLabels, Counter>,
    pub conflicts: Family<KindLabels, Counter>,
    gossip: Mutex<Option<Arc<AuthCounters>>>,
    gossip_held: Mutex<Option<Arc<AtomicU64>>>,
    claims_refused: Mutex<Option<Arc<super::wire::Refused>>>,
    detector: Mutex<Option<Arc<DetectorCounters>>>,
    /// First reconcile applied.
    pub applied: AtomicBool,
    pub api_healthy: AtomicBool,
    /// The API server took the last write or probe (see `report.rs`): open
    /// watches alone do not show it, a stopping server keeps them for a
    /// minute while refusing everything else.
    pub api_writable: AtomicBool,
    pub carrier: AtomicBool,
    pub leaving: AtomicBool,
    /// The Service policy is not in force for this agent's credential
    /// (see `admission`).
    pub policy_open: AtomicBool,
    liveness: Liveness,
    status: Mutex<Option<mpsc::Sender<oneshot::Sender<StatusDoc>>>>,
}

impl Telemetry {
    pub fn new() -> Arc<Telemetry> {
        let mut registry = Registry::with_prefix("hostlb_agent");
        let buckets = [
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        ];
        let t = Telemetry {
            registry: Mutex::new(Registry::default()),
            owned_vips: Gauge::default(),
            virtual_vips: Gauge::default(),
            live_members: Gauge::default(),
            cannot_serve: Gauge::default(),
            no_announce_interface: Gauge::default(),
            gateways_lost: Gauge::default(),
            gossip_isolated: Gauge::default(),
            arp_exposed: Gauge::default(),
            ready: Gauge::default(),
            vips_without_candidate: Gauge::default(),
            routed_unserved: Gauge::default(),
            warnings: Mutex::new(Vec::new()),
            firewall_vips: Gauge::default(),
            firewall_failures: Counter::default(),
            firewall_error: Mutex::new(None),
            elections: Counter::default(),
            election_seconds: Histogram::new(buckets),
            address_ops: Family::default(),
            takeover_seconds: Family::new_with_constructor(takeover_histogram),
            moves: Family::default(),
            object_errors: Gauge::default(),
            events_dropped: Counter::default(),
            beats_refused: Family::default(),
            api_writes: Family::default(),
            conflicts: Family::default(),
            gossip: Mutex::new(None),
            gossip_held: Mutex::new(None),
            claims_refused: Mutex::new(None),
            detector: Mutex::new(None),
            applied: AtomicBool::new(false),
            api_healthy: AtomicBool::new(true),
            api_writable: AtomicBool::new(true),
            carrier: AtomicBool::new(true),
            leaving: AtomicBool::new(false),
            policy_open: AtomicBool::new(false),
            liveness: Liveness::default(),
            status: Mutex::new(None),
        };
        registry.register(
            "owned_vips",
            "Addresses this node holds",
            t.owned_vips.clone(),
        );
        registry.register(
            "virtual_vips",
            "Of owned_vips, the addresses held on the virtual interface for routing software to export; every eligible node holds such an address at once (one route per node: ECMP)",
            t.virtual_vips.clone(),
        );
        registry.register(
            "live_members",
            "Live, alive gossip members, this node included",
            t.live_members.clone(),
        );
        registry.register(
            "cannot_serve",
            "1 while this agent cannot hold addresses (no CAP_NET_ADMIN) and stands in no election",
            t.cannot_serve.clone(),
        );
        registry.register(
            "no_announce_interface",
            "1 while this agent has no announce interface (the configured one is missing, or no default route): it stands in no election for addresses on a host subnet",
            t.no_announce_interface.clone(),
        );
        registry.register(
            "gateways_lost",
            "Default gateways (one per interface and family) that answered this agent and then fell silent: it is the last resort for the VIPs on those networks",
            t.gateways_lost.clone(),
        );
        registry.register(
            "ready",
            "1 while /readyz says ready (every reason it may not be is there and in `lbnodeagent status`)",
            t.ready.clone(),
        );
        registry.register(
            "vips_without_candidate",
            "Addresses of the cluster that no live, eligible, on-link node may announce, by this agent's election: nobody answers for them",
            t.vips_without_candidate.clone(),
        );
        registry.register(
            "routed_vips_unserved",
            "Routed addresses no node serves that this node would hold on its virtual interface, were its virtual mode on; above 0 the agent is not ready",
            t.routed_unserved.clone(),
        );
        registry.register(
            "arp_exposed_interfaces",
            "Interfaces that would answer ARP for, or announce, VIPs held on another interface (net.ipv4.conf.*.arp_ignore / arp_announce at the kernel's defaults)",
            t.arp_exposed.clone(),
        );
        registry.register(
            "gossip_isolated",
            "1 while gossip reaches no other agent although the API shows agents running on other nodes (NodeAgent records): the agent acts as if partitioned",
            t.gossip_isolated.clone(),
        );
        registry.register(
            "firewall_vips",
            "Addresses the agent's firewall (nftables table inet hostlb) closes to all but their Services' ports and ICMP; 0 while it is off",
            t.firewall_vips.clone(),
        );
        registry.register(
            "firewall_failures",
            "Rule sets nft refused or could not be run for; the firewall is tried again every 10 s and /readyz shows why",
            t.firewall_failures.clone(),
        );
        registry.register(
            "elections",
            "Reconcile passes that re-ran the election",
            t.elections.clone(),
        );
        registry.register(
            "election_duration_seconds",
            "Time to update the election and compute this node's duties",
            t.election_seconds.clone(),
        );
        registry.register(
            "address_operations",
            "Kernel address adds, renewals and removals by result",
            t.address_ops.clone(),
        );
        registry.register(
            "takeover_seconds",
            "From the last beat of an owner gone or stalled to this node holding one of its VIPs, by cause",
            t.takeover_seconds.clone(),
        );
        registry.register(
            "vip_moves",
            "VIPs that moved to this node from another, by cause",
            t.moves.clone(),
        );
        registry.register(
            "object_errors",
            "Kubernetes objects left out because they could not be used",
            t.object_errors.clone(),
        );
        registry.register(
            "beats_refused",
            "Owner, relay or leaving beats in a node's name that the node did not prove, dropped, by reason: unproved (no proof, or not its key's: a forgery by a key holder), replayed, unknown (its identity not yet read from the records), address (an agent without an identity, from an address its node does not have)",
            t.beats_refused.clone(),
        );
        registry.register(
            "events_dropped",
            "Kubernetes Events not sent because the queue was full",
            t.events_dropped.clone(),
        );
        registry.register(
            "api_writes",
            "Annotation patches and Events written to the API server by result",
            t.api_writes.clone(),
        );
        registry.register(
            "address_conflicts",
            "Another MAC answered for a VIP held here: another hostlb node (kind hostlb) or a host hostlb does not know (kind foreign)",
            t.conflicts.clone(),
        );
        *t.registry.lock().expect("fresh") = registry;
        Arc::new(t)
    }

    pub fn op(&self, op: &'static str, ok: bool) {
        self.address_ops
            .get_or_create(&OpLabels {
                op,
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    pub fn beat_refused(&self, reason: &'static str) {
        self.beats_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    pub fn conflict(&self, kind: &'static str) {
        self.conflicts.get_or_create(&KindLabels { kind }).inc();
    }

    pub fn write(&self, op: &'static str, ok: bool) {
        self.api_writes
            .get_or_create(&OpLabels {
                op,
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    pub fn set_gossip_counters(&self, c: Arc<AuthCounters>) {
        *self.gossip.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    pub fn set_gossip_held(&self, held: Arc<AtomicU64>) {
        *self.gossip_held.lock().unwrap_or_else(|e| e.into_inner()) = Some(held);
    }

    pub fn set_claims_refused(&self, refused: Arc<super::wire::Refused>) {
        *self
            .claims_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(refused);
    }

    pub fn set_detector_counters(&self, c: Arc<DetectorCounters>) {
        *self.detector.lock().unwrap_or_else(|e| e.into_inner()) = Some(c);
    }

    pub fn set_status_channel(&self, tx: mpsc::Sender<oneshot::Sender<StatusDoc>>) {
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
    }

    pub fn beat(&self) {
        self.liveness.turned();
    }

    /// Notes whether the server took the last request, for `/readyz`; a
    /// change is logged once.
    pub fn api_answered(&self, ok: bool) {
        let was = self.api_writable.swap(ok, Ordering::Relaxed);
        if was && !ok {
            tracing::warn!("the API server does not take requests; degraded until it does");
        } else if !was && ok {
            tracing::info!("the API server takes requests again");
        }
    }

    pub fn warnings(&self) -> Vec<String> {
        let mut w = self
            .warnings
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        w.extend(
            self.firewall_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        );
        w
    }

    pub fn firewall_applied(&self, vips: usize) {
        self.firewall_vips.set(vips as i64);
        *self
            .firewall_error
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Counts a failure; `true` when its message is news.
    pub fn firewall_failed(&self, message: String) -> bool {
        self.firewall_failures.inc();
        let mut e = self
            .firewall_error
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let news = e.as_deref() != Some(message.as_str());
        *e = Some(message);
        news
    }

    /// Why the node is not ready, or `None`.
    pub fn not_ready(&self) -> Option<&'static str> {
        if self.leaving.load(Ordering::Relaxed) {
            Some("the agent is shutting down")
        } else if self.cannot_serve.get() > 0 {
            Some(
                "not a candidate: no CAP_NET_ADMIN, so this agent cannot add addresses; its peers serve",
            )
        } else if self.no_announce_interface.get() > 0 {
            Some(
                "not a candidate on the host's subnets: no announce interface (announce.interface not found, or no default route); its peers serve",
            )
        } else if !self.applied.load(Ordering::Relaxed) {
            Some("waiting for the first reconcile (every watch listed, gossip started)")
        } else if self.routed_unserved.get() > 0 {
            Some(
                "not ready: routed VIPs that no node serves would be held here, but virtual mode is off (the virtual interface, announce.virtual_interface, is missing or turned off); create it (docs/routing.md) and the agent takes them within a second",
            )
        } else if !self.carrier.load(Ordering::Relaxed) {
            Some("the announce interface has no carrier")
        } else if self.gossip_isolated.get() > 0 {
            Some(
                "degraded: gossip is isolated: the API shows agents running on other nodes and gossip reaches none of them; acting as if partitioned (check UDP 7934 between the hosts, gossip.key_file, gossip.cluster_id)",
            )
        } else if !self.api_healthy.load(Ordering::Relaxed) {
            Some("degraded: the API server is unreachable; electing from the last known objects")
        } else if !self.api_writable.load(Ordering::Relaxed) {
            Some("degraded: the API server refuses writes; annotations and Events wait")
        } else if self.policy_open.load(Ordering::Relaxed) {
            Some(
                "degraded: the Service policy is not in force: this agent's credential can rewrite any Service; apply deploy/agent/policy.yaml (policy-v1beta1.yaml on Kubernetes 1.28 and 1.29, with the ValidatingAdmissionPolicy feature gate and API on)",
            )
        } else {
            None
        }
    }

    pub fn render(&self) -> String {
        let mut out = admin::encode(&self.registry.lock().unwrap_or_else(|e| e.into_inner()));
        // Gossip drops are counted by the transport; rendered from its
        // snapshot so the two never disagree.
        if let Some(c) = &*self.gossip.lock().unwrap_or_else(|e| e.into_inner()) {
            let s = c.snapshot();
            let body = out.trim_end_matches("# EOF\n").to_string();
            out = body;
            out.push_str(
                "# HELP hostlb_agent_gossip_frames_dropped Gossip datagrams dropped, by reason.\n",
            );
            out.push_str("# TYPE hostlb_agent_gossip_frames_dropped counter\n");
            let by_reason = [
                ("oversized", s.dropped_oversized),
                ("malformed", s.dropped_malformed),
                ("bad_mac", s.dropped_bad_mac),
                ("stale", s.dropped_stale),
                ("replayed", s.dropped_replayed),
                ("misdirected", s.dropped_misdirected),
                ("other_version", s.dropped_other_version),
                ("loopback", s.dropped_loopback),
                ("backlog", s.dropped_backlog),
            ];
            for (reason, n) in by_reason {
                out.push_str(&format!(
                    "hostlb_agent_gossip_frames_dropped_total{{reason=\"{reason}\"}} {n}\n"
                ));
            }
            out.push_str(
                "# HELP hostlb_agent_gossip_state_refused Nodes' parts of received gossip not merged (see docs/agent.md, \"Security model\"): not signed by their node (refused), their node's identity not read yet (unknown), or cut at their last manifest (cut).\n\
                 # TYPE hostlb_agent_gossip_state_refused counter\n",
            );
            for (reason, n) in [
                ("refused", c.state_refused.load(Ordering::Relaxed)),
                ("unknown", c.state_unknown.load(Ordering::Relaxed)),
                ("cut", c.state_cut.load(Ordering::Relaxed)),
            ] {
                out.push_str(&format!(
                    "hostlb_agent_gossip_state_refused_total{{reason=\"{reason}\"}} {n}\n"
                ));
            }
            let held = self
                .gossip_held
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map_or(0, |h| h.load(Ordering::Relaxed));
            let (downs, rejected) = self
                .detector
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map_or((0, 0), |d| {
                    (
                        d.downs.load(Ordering::Relaxed),
                        d.rejected.load(Ordering::Relaxed),
                    )
                });
            let counters = [
                (
                    "gossip_sent_bytes",
                    "Gossip bytes sent on the wire, frames included.",
                    s.bytes_sent,
                ),
                (
                    "gossip_received_bytes",
                    "Gossip bytes received on the wire.",
                    s.bytes_received,
                ),
                (
                    "gossip_send_failed",
                    "Gossip datagrams the kernel refused to send (no route, a firewall) or that could not be sealed.",
                    s.send_failed,
                ),
                (
                    "gossip_messages_fragmented",
                    "Gossip messages sent in two datagrams.",
                    s.messages_fragmented,
                ),
                (
                    "gossip_messages_too_large",
                    "Gossip messages dropped because even two datagrams could not carry them.",
                    s.send_too_large,
                ),
                (
                    "gossip_rounds_held",
                    "Gossip exchanges not started to stay within gossip.max_bandwidth.",
                    held,
                ),
                (
                    "gossip_members_down",
                    "Peers the failure detector declared down (crashed, partitioned or left).",
                    downs,
                ),
                (
                    "gossip_probes_refused",
                    "Authenticated failure-detector messages that could not be read.",
                    rejected,
                ),
            ];
            for (name, help, n) in counters {
                out.push_str(&format!(
                    "# HELP hostlb_agent_{name} {help}\n# TYPE hostlb_agent_{name} counter\nhostlb_agent_{name}_total {n}\n"
                ));
            }
            out.push_str(&format!(
                "# HELP hostlb_agent_gossip_largest_message_bytes The largest gossip message sent.\n\
                 # TYPE hostlb_agent_gossip_largest_message_bytes gauge\n\
                 hostlb_agent_gossip_largest_message_bytes {}\n",
                s.largest_sent
            ));
            out.push_str("# EOF\n");
        }
        // What the wire said of watched VIPs that did not count as a claim:
        // counted, never logged one by one (a flood is a counter).
        if let Some(r) = &*self
            .claims_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        {
            let mut body = out.trim_end_matches("# EOF\n").to_string();
            body.push_str(
                "# HELP hostlb_agent_claims_refused Claims on a watched VIP that did not count: an advertisement sent from off the link (off_link), or heard on another interface than the VIP's (other_interface).\n\
                 # TYPE hostlb_agent_claims_refused counter\n",
            );
            for (reason, n) in [
                ("off_link", r.off_link.load(Ordering::Relaxed)),
                ("other_interface", r.other_interface.load(Ordering::Relaxed)),
            ] {
                body.push_str(&format!(
                    "hostlb_agent_claims_refused_total{{reason=\"{reason}\"}} {n}\n"
                ));
            }
            body.push_str("# EOF\n");
            out = body;
        }
        out
    }

    async fn status(&self) -> Option<StatusDoc> {
        let tx = self
            .status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        let (reply, rx) = oneshot::channel();
        tx.send(reply).await.ok()?;
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .ok()?
            .ok()
    }
}

impl Admin for Telemetry {
    const LOOP: &'static str = "the reconcile loop";
    fn metrics(&self) -> String {
        self.render()
    }
    fn liveness(&self) -> &Liveness {
        &self.liveness
    }
    fn not_ready(&self) -> Option<String> {
        Telemetry::not_ready(self).map(str::to_string)
    }
    fn warnings(&self) -> Vec<String> {
        Telemetry::warnings(self)
    }
}

/// The shared admin routes, and `/status`.
pub fn router(t: Arc<Telemetry>) -> Router {
    let status = Router::new()
        .route(
            "/status",
            get(|State(t): State<Arc<Telemetry>>| async move {
                match t.status().await {
                    Some(doc) => (
                        [("content-type", "application/json")],
                        serde_json::to_string(&doc).expect("status serializes"),
                    )
                        .into_response(),
                    None => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the reconcile loop did not answer",
                    )
                        .into_response(),
                }
            }),
        )
        .with_state(t.clone());
    admin::router(t).merge(status)
}
