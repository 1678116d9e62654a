//! This node's `NodeAgent` record in the API, and every other agent's.
//!
//! Gossip is how agents know each other, and the one thing that must not
//! depend on it is telling a second owner of a VIP apart from a stranger:
//! agents whose gossip never connected (a firewall on UDP 7934, another
//! key, an advertise address nobody reaches) would otherwise each hold
//! every VIP, each taking the others' MACs for hosts configured by hand.
//! So each agent writes its gossip address and MACs into a record named
//! after its Node, and reads everyone's when it needs them ([`Records`]):
//! the core learns the MACs for its conflict rule, and which other agents
//! run (a record written in the last three minutes) to tell an isolated
//! agent from one that is alone.
//!
//! The loop hands the [`Publisher`] the record as it should read; it is
//! written at once the first time, then on change at most every
//! [`MIN_GAP`], and at least every minute as a heartbeat. At 1,000 nodes
//! that is about 17 small status patches a second for the heartbeats; a
//! membership change rewrites every record within [`MIN_GAP`] (200 writes
//! a second for a few seconds), which nothing but `kubectl` reads. A
//! write that fails is tried again with backoff; the loop never waits on
//! it. On SIGTERM the record says `Stopped`; a killed agent's goes stale.
//!
//! A write gets [`WRITE_TIMEOUT`], as the announcing writer's do: across
//! a network that drops packets rather than refusing them, a write waits
//! on a connection that shows no error, and what it carries lands only
//! when TCP retransmits it, tens of seconds after the server is back
//! within reach. Timed out, it is tried again, at once when the agent
//! sees the server answer again ([`Publisher::api_back`]). The abandoned
//! write may still land, long after: TCP retransmits what the closed
//! connection had sent at a backoff that reaches a minute and more, so it
//! can arrive after every write that followed it and put back a record
//! that was true before the outage. So each write names the
//! resourceVersion the last one made ([`write_status`]): a late one names
//! a version that is gone, and the API server refuses it (409). A write
//! refused so reads the version now and is made again at once.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hostlb_api::v1::NODE_AGENT_HEARTBEAT_SECS;
use hostlb_api::{NodeAgent, NodeAgentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::Agent;
use super::config::AgentConfig;
use crate::addrs::AddressBackend;
use serde_json::json;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{debug, error, info, warn};

use super::core::AgentRecord;
use super::report::{FIELD_MANAGER, WRITE_TIMEOUT};
use crate::addrs::MacAddr;
use crate::election::{Member, OnLink};
use crate::identity::{Identities, Known};
use std::sync::Arc;

/// Least time between two writes of a changed record.
pub const MIN_GAP: Duration = Duration::from_secs(5);
/// First wait after a failed write, doubling to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// How long SIGTERM waits for the `Stopped` record to be written.
const STOP_WRITE: Duration = Duration::from_secs(1);

pub use hostlb_api::v1::HEARTBEAT_SKEW_SECS;

/// Caps on the lists a record carries, so that one stays a few kB.
pub const MAX_NAMES: usize = 256;
pub const MAX_VIPS: usize = 64;
pub const MAX_INVALID: usize = 32;
/// Moves of VIPs to this node kept in its record.
pub const MAX_MOVES: usize = 8;

/// State values.
pub const STARTING: &str = "Starting";
pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
pub const STOPPED: &str = "Stopped";

/// Every agent's record, read when this node needs the others': at start
/// (before gossip has told anything), while gossip shows no live peer, and
/// when a MAC gossip never named answers for a VIP held here; 2 s apart at
/// first, doubling to a minute while such occasions keep coming (a fleet
/// whose gossip broke everywhere at once lists at most once a minute per
/// agent). Not watched: every agent's record changes when membership
/// does, so at 1,000 nodes a watch would carry each change to all 1,000
/// agents; listed on these occasions only, a healthy cluster reads none.
pub struct Records {
    api: Api<NodeAgent>,
    tx: mpsc::Sender<Result<Vec<NodeAgent>, kube::Error>>,
    rx: mpsc::Receiver<Result<Vec<NodeAgent>, kube::Error>>,
    last_asked: Option<std::time::Instant>,
    /// Least time from the last list to the next.
    gap: Duration,
    in_flight: bool,
    failing: bool,
    /// Every node's identity, learnt from each list (this node's own is
    /// its key, whatever its record said before it was written).
    identities: Option<(Arc<Identities>, String, Known)>,
    /// Lists for identities ([`Records::ask_keys`]): the last, and the
    /// least time to the next, doubling while wants keep coming.
    last_keys: Option<std::time::Instant>,
    keys_gap: Duration,
}

/// How long a list of the records may take: a fleet's records are one
/// small page each, so a list that takes longer waits on a dead connection.
const LIST_TIMEOUT: Duration = Duration::from_secs(10);

/// The least time between two lists for identities, at first and at most:
/// agents that start together write their records a moment after each
/// other's first list; a thousand of them then list a few times each.
pub const KEYS_GAP_MIN: Duration = Duration::from_millis(250);
pub const KEYS_GAP_MAX: Duration = Duration::from_secs(4);

/// Least time between two lists of the records, at first, and at most.
pub const LIST_GAP_MIN: Duration = Duration::from_secs(2);
pub const LIST_GAP_MAX: Duration = Duration::from_secs(60);

impl Records {
    /// Teaches `identities` what each list says, keeping `me`'s own.
    pub fn with_identities(
        mut self,
        identities: Arc<Identities>,
        me: &str,
        mine: Known,
    ) -> Records {
        self.identities = Some((identities, me.to_string(), mine));
        self
    }

    /// Lists the records within [`LIST_GAP_MIN`] of the last list, without
    /// growing the gap of [`Records::ask`]: a node's identity is wanted (its
    /// state or beats arrived, and nothing can be merged or believed of it
    /// until its record is read). False when it must wait; ask again.
    pub fn ask_keys(&mut self) -> bool {
        let now = std::time::Instant::now();
        if self.in_flight {
            return true;
        }
        // A want long after the last starts afresh.
        if self
            .last_keys
            .is_some_and(|t| now.saturating_duration_since(t) > KEYS_GAP_MAX * 4)
        {
            self.keys_gap = KEYS_GAP_MIN;
        }
        if self.last_keys.is_some_and(|t| now < t + self.keys_gap) {
            return false;
        }
        if self.last_keys.is_some() {
            self.keys_gap = (self.keys_gap * 2).min(KEYS_GAP_MAX);
        }
        self.last_keys = Some(now);
        let gap = self.gap;
        self.last_asked = None;
        self.ask();
        self.gap = gap;
        true
    }

    pub fn new(client: &Client) -> Records {
        let (tx, rx) = mpsc::channel(1);
        Records {
            identities: None,
            last_keys: None,
            keys_gap: KEYS_GAP_MIN,
            api: Api::<NodeAgent>::all(client.clone()),
            tx,
            rx,
            last_asked: None,
            gap: LIST_GAP_MIN,
            in_flight: false,
            failing: false,
        }
    }

    /// Lists the records, unless a list is under way or the last ran
    /// within the current gap, which doubles with each list.
    pub fn ask(&mut self) {
        let now = std::time::Instant::now();
        if self.in_flight || self.last_asked.is_some_and(|t| now < t + self.gap) {
            return;
        }
        if self.last_asked.is_some() {
            self.gap = (self.gap * 2).min(LIST_GAP_MAX);
        }
        self.last_asked = Some(now);
        self.in_flight = true;
        let (api, tx) = (self.api.clone(), self.tx.clone());
        tokio::spawn(async move {
            // Bounded as the writes are: the client has no read timeout,
            // and a list whose connection a cut left half open would keep
            // `in_flight`, and so every later list, waiting for good.
            let listed =
                tokio::time::timeout(LIST_TIMEOUT, api.list(&kube::api::ListParams::default()))
                    .await
                    .unwrap_or_else(|_| Err(kube::Error::Service("the list timed out".into())))
                    .map(|l| l.items);
            let _ = tx.send(listed).await;
        });
    }

    /// Gossip reaches peers again: the next trouble lists at once.
    pub fn calm(&mut self) {
        self.gap = LIST_GAP_MIN;
    }

    /// The next list's records, as the core needs them, judged fresh at
    /// the time they arrive. A failed list is logged once until one
    /// succeeds (a missing CRD or rule: the agent works on without them).
    pub async fn listed(&mut self) -> Option<Vec<AgentRecord>> {
        let listed = self.rx.recv().await?;
        self.in_flight = false;
        match listed {
            Ok(items) => {
                if std::mem::take(&mut self.failing) {
                    info!("NodeAgent records read again");
                }
                let now = jiff::Timestamp::now();
                if let Some((identities, me, mine)) = &self.identities {
                    let bad = identities.learn(items.iter().filter_map(|r| {
                        let node = r.metadata.name.as_deref()?;
                        Some((node, crate::identity::RecordSays::of(r.status.as_ref())))
                    }));
                    identities.set(me, *mine);
                    for (node, why) in bad {
                        warn!(%node, reason = %why, "the NodeAgent record names an identity that is no key; nothing in that node's name counts until it names one");
                    }
                }
                let mut out: Vec<AgentRecord> =
                    items.iter().filter_map(|r| record_of(r, now)).collect();
                out.sort_by(|a, b| a.node.cmp(&b.node));
                Some(out)
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    warn!(error = %e, "cannot read the NodeAgent records (is deploy/crds/hostlb.io_nodeagents.yaml applied, and deploy/agent/rbac.yaml?); agents whose gossip cannot connect will not recognise each other");
                }
                None
            }
        }
    }
}

/// One record as the core sees it; `None` without a name.
fn record_of(r: &NodeAgent, now: jiff::Timestamp) -> Option<AgentRecord> {
    let node = r.metadata.name.clone()?;
    let status = r.status.clone().unwrap_or_default();
    let macs: BTreeSet<MacAddr> = status.macs.iter().filter_map(|m| m.parse().ok()).collect();
    Some(AgentRecord {
        node,
        macs,
        fresh: r.fresh(now),
    })
}

/// The election's members as the records tell them, for tools that read
/// only the API (`kubectl hostlb explain`): each node whose agent runs
/// (fresh record) and stands (`Ready` or `Degraded`; a `Starting` agent is
/// no candidate), on the prefixes its record lists.
pub fn members_of(records: &[NodeAgent], now: jiff::Timestamp) -> Vec<Member> {
    records
        .iter()
        .filter(|r| record_of(r, now).is_some_and(|a| a.fresh))
        .filter_map(|r| {
            let status = r.status.as_ref()?;
            if status.state != READY && status.state != DEGRADED {
                return None;
            }
            let on_link = status
                .interfaces
                .iter()
                .flat_map(|i| {
                    i.prefixes.iter().filter_map(|p| {
                        Some(OnLink {
                            prefix: p.parse().ok()?,
                            interface: i.name.clone(),
                            announce: i.announce,
                            upstream_lost: false,
                        })
                    })
                })
                .collect();
            Some(Member {
                node: r.metadata.name.as_deref()?.into(),
                leaving: false,
                drained: status.drained,
                virtual_mode: status.virtual_mode,
                on_link,
            })
        })
        .collect()
}

/// Whether `record` stands for an agent that runs now.
pub fn is_fresh(record: &NodeAgent, now: jiff::Timestamp) -> bool {
    record.fresh(now)
}

/// Writes this node's record.
pub struct Publisher {
    tx: watch::Sender<Option<NodeAgentStatus>>,
    /// Ends a failed write's backoff: the API server answers again.
    back: Arc<Notify>,
    api: Api<NodeAgent>,
    node: String,
    task: JoinHandle<()>,
}

impl Publisher {
    pub fn start(client: &Client, node: &str) -> Publisher {
        let api = Api::<NodeAgent>::all(client.clone());
        let (tx, rx) = watch::channel(None);
        let back = Arc::new(Notify::new());
        let task = tokio::spawn(publish(api.clone(), node.to_string(), rx, back.clone()));
        Publisher {
            tx,
            back,
            api,
            node: node.to_string(),
            task,
        }
    }

    /// The record as it should read now (its heartbeat time is the
    /// publisher's); written when it differs from the last.
    pub fn set(&self, mut status: NodeAgentStatus) {
        self.tx.send_if_modified(|current| {
            let last_change = current.as_ref().and_then(|c| c.last_change_time.clone());
            status.last_change_time = last_change.clone();
            if current.as_ref() == Some(&status) {
                false
            } else {
                status.last_change_time = Some(Time(jiff::Timestamp::now()));
                *current = Some(status);
                true
            }
        });
    }

    /// The API server answers again after it did not: a write that
    /// failed is tried now rather than at the end of its backoff.
    pub fn api_back(&self) {
        self.back.notify_one();
    }

    /// Says `Stopped` (SIGTERM), waiting [`STOP_WRITE`] at most.
    pub async fn stopped(self) {
        self.task.abort();
        let Some(mut status) = self.tx.borrow().clone() else {
            return;
        };
        status.state = STOPPED.into();
        status.reason = Some("the agent was stopped".into());
        status.held_vips = 0;
        let write = write_status(&self.api, &self.node, status, None);
        if tokio::time::timeout(STOP_WRITE, write).await.is_err() {
            debug!("the Stopped record was not written in time");
        }
    }
}

/// Marks `node`'s record `Stopped` with `reason`, keeping the rest (for
/// `cleanup`, after an agent that did not stop cleanly). A node without a
/// record is left without one.
pub async fn mark_stopped(client: &Client, node: &str, reason: &str) -> Result<(), kube::Error> {
    let api = Api::<NodeAgent>::all(client.clone());
    let Some(current) = api.get_opt(node).await? else {
        return Ok(());
    };
    let mut status = current.status.unwrap_or_default();
    status.state = STOPPED.into();
    status.reason = Some(reason.into());
    status.held_vips = 0;
    status.vips.clear();
    status.last_change_time = Some(Time(jiff::Timestamp::now()));
    write_status(&api, node, status, None).await.map(drop)
}

async fn publish(
    api: Api<NodeAgent>,
    node: String,
    mut rx: watch::Receiver<Option<NodeAgentStatus>>,
    back: Arc<Notify>,
) {
    let heartbeat = Duration::from_secs(NODE_AGENT_HEARTBEAT_SECS as u64);
    let mut created = false;
    let mut retry = RETRY_MIN;
    let mut last: Option<NodeAgentStatus> = None;
    let mut failing = false;
    // The record's resourceVersion after this writer's last write: the
    // next one must find it unchanged (see the module's comment).
    let mut version: Option<String> = None;
    // The first record goes out as soon as the loop has one.
    while rx.borrow_and_update().is_none() {
        if rx.changed().await.is_err() {
            return;
        }
    }
    rx.mark_changed();
    loop {
        let wanted = rx.borrow_and_update().clone();
        if let Some(status) = wanted {
            let write = async {
                if !created {
                    create(&api, &node).await?;
                    created = true;
                }
                write_status(&api, &node, status.clone(), version.as_deref()).await
            };
            let result = tokio::time::timeout(WRITE_TIMEOUT, write)
                .await
                .unwrap_or_else(|_| Err(kube::Error::Service("the write timed out".into())));
            // Someone wrote it since (a late write of ours, `cleanup`, an
            // operator): read where it is now and write at once; a read
            // that fails is a failed write like any other.
            let result = match result {
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    debug!(node = %node, "the NodeAgent record changed since this agent wrote it; writing it again");
                    match tokio::time::timeout(WRITE_TIMEOUT, api.get_status(&node)).await {
                        Ok(Ok(now)) => {
                            version = now.metadata.resource_version;
                            continue;
                        }
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(kube::Error::Service("the read timed out".into())),
                    }
                }
                other => other,
            };
            match result {
                Ok(written) => {
                    if std::mem::take(&mut failing) {
                        info!("NodeAgent record written again");
                    }
                    version = Some(written);
                    last = Some(status);
                    retry = RETRY_MIN;
                }
                Err(e) => {
                    if !failing {
                        let forbidden = matches!(&e, kube::Error::Api(s) if s.code == 403);
                        if forbidden {
                            warn!(error = %e, node = %node, "cannot write this node's NodeAgent record: this node's identity may write only the record deploy/agent/kubeconfig.sh made for it, named after its Node; retrying with backoff");
                        } else {
                            warn!(error = %e, node = %node, "cannot write this node's NodeAgent record; retrying with backoff");
                        }
                    }
                    failing = true;
                    tokio::select! {
                        _ = tokio::time::sleep(retry) => {}
                        _ = back.notified() => {}
                    }
                    retry = (retry * 2).min(RETRY_MAX);
                    continue;
                }
            }
        }
        // At most one write every MIN_GAP; a heartbeat when nothing
        // changes.
        tokio::time::sleep(MIN_GAP).await;
        let changed = rx.has_changed().unwrap_or(false) && rx.borrow().as_ref() != last.as_ref();
        if !changed {
            let _ = tokio::time::timeout(heartbeat.saturating_sub(MIN_GAP), rx.changed()).await;
        }
    }
}

/// Creates the record, or leaves the one there (server-side apply).
async fn create(api: &Api<NodeAgent>, node: &str) -> Result<(), kube::Error> {
    let object = json!({
        "apiVersion": "hostlb.io/v1",
        "kind": "NodeAgent",
        "metadata": {"name": node},
        "spec": {},
    });
    api.patch(
        node,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Apply(object),
    )
    .await
    .map(drop)
}

/// Writes this node's record's status, and returns its resourceVersion
/// after. With `version`, only over that version: a write that lands
/// after another was made since is refused (409) rather than putting back
/// what was true before.
pub async fn write_status(
    api: &Api<NodeAgent>,
    node: &str,
    mut status: NodeAgentStatus,
    version: Option<&str>,
) -> Result<String, kube::Error> {
    status.heartbeat_time = Some(Time(jiff::Timestamp::now()));
    let identity = status.identity.clone();
    let mut metadata = json!({"name": node});
    if let Some(v) = version {
        metadata["resourceVersion"] = json!(v);
    }
    let patch = json!({
        "apiVersion": "hostlb.io/v1",
        "kind": "NodeAgent",
        "metadata": metadata,
        "status": status,
    });
    let written = api
        .patch_status(
            node,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(patch),
        )
        .await?;
    let written_version = written
        .metadata
        .resource_version
        .clone()
        .unwrap_or_default();
    // A NodeAgent CRD older than the agent drops the field it does not
    // know: peers would then take this node for an agent without an
    // identity, and believe anyone in its name.
    let kept = written.status.and_then(|s| s.identity);
    if identity.is_some() && kept != identity {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, Ordering::Relaxed) {
            error!(
                "the API server dropped this node's identity from its NodeAgent record: the NodeAgent CRD is older than this agent; apply deploy/crds (peers cannot tell this node's beats and gossip from a forger's until then)"
            );
        }
    }
    Ok(written_version)
}

/// The record as it should read now; the [`Publisher`] writes it when it
/// changed.
impl<B: AddressBackend + 'static> Agent<B> {
    /// This node's record as it should read now.
    pub(super) fn record(&self) -> hostlb_api::NodeAgentStatus {
        use hostlb_api::{NodeAgentConflict, NodeAgentInterface, NodeAgentMove};
        let not_ready = self.telemetry.not_ready();
        let state = match not_ready {
            None => READY,
            Some(_) if !self.telemetry.applied.load(Ordering::Relaxed) => STARTING,
            Some(_) => DEGRADED,
        };
        let links = self.core.links();
        let on_link = self.core.on_link();
        let interfaces: Vec<NodeAgentInterface> = links
            .all
            .iter()
            .filter(|i| i.mac.is_some() || on_link.iter().any(|o| o.interface == i.name))
            .map(|i| NodeAgentInterface {
                name: i.name.clone(),
                mac: i.mac.map(|m| m.to_string()).unwrap_or_default(),
                prefixes: on_link
                    .iter()
                    .filter(|o| o.interface == i.name)
                    .map(|o| o.prefix.to_string())
                    .collect(),
                announce: on_link.iter().any(|o| o.interface == i.name && o.announce),
            })
            .collect();
        let mut members: Vec<String> = self
            .core
            .view()
            .members
            .iter()
            .map(|m| m.node.to_string())
            .collect();
        members.sort();
        let members_hash = short_hash(members.join("\n").as_bytes());
        let count = members.len() as i64;
        members.truncate(MAX_NAMES);
        let mut vips: Vec<IpAddr> = self.core.held().map(|(ip, _)| *ip).collect();
        vips.sort();
        let mut invalid: Vec<String> = self.core.object_errors().to_vec();
        invalid.truncate(MAX_INVALID);
        hostlb_api::NodeAgentStatus {
            heartbeat_time: None,
            last_change_time: None,
            version: crate::VERSION.to_string(),
            protocol: Some(crate::gossip::PROTOCOL),
            config_hash: self.config_hash.clone(),
            state: state.to_string(),
            reason: not_ready.map(str::to_string),
            gossip_address: self
                .cfg
                .gossip
                .advertise
                .map(|a| a.to_string())
                .unwrap_or_default(),
            identity: Some(self.identity.public().to_string()),
            macs: links.macs().iter().map(|m| m.to_string()).collect(),
            gossip_isolated: self.core.isolated(),
            members: count,
            member_names: members,
            members_hash,
            virtual_mode: links.virtual_link.is_some(),
            drained: self.core.drained(),
            interfaces,
            held_vips: vips.len() as i64,
            vips: vips.iter().take(MAX_VIPS).map(|v| v.to_string()).collect(),
            invalid_objects: invalid,
            last_conflict: self
                .conflict_seen
                .as_ref()
                .map(|(c, at)| NodeAgentConflict {
                    address: c.ip.to_string(),
                    mac: c.mac.to_string(),
                    node: c.node.clone(),
                    outcome: c.outcome.as_str().to_string(),
                    time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(*at)),
                }),
            recent_moves: self
                .moves
                .iter()
                .map(|(m, at)| NodeAgentMove {
                    address: m.ip.to_string(),
                    from: m.from.clone(),
                    cause: m.cause.as_str().to_string(),
                    dark_ms: m.dark.map(|d| d.as_millis() as i64),
                    time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(*at)),
                })
                .collect(),
        }
    }
}

/// 12 hex digits of SHA-256: enough to tell two values apart at a glance.
fn short_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// The configuration in force, hashed without what names the node (its
/// name and its own addresses), so agents configured alike agree.
pub(super) fn config_hash(cfg: &AgentConfig) -> String {
    let mut c = cfg.clone();
    c.node_name.clear();
    c.gossip.node_name.clear();
    c.gossip.advertise = None;
    short_hash(format!("{c:?}").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hostlb_api::v1::NODE_AGENT_STALE_SECS;

    fn agent(name: &str, status: NodeAgentStatus) -> NodeAgent {
        let mut a = NodeAgent::new(name, Default::default());
        a.status = Some(status);
        a
    }

    /// A record counts as a running agent while its heartbeat is recent and
    /// it does not say it stopped; its MACs count whatever its age (a
    /// stale record's node may still answer for an address).
    #[test]
    fn records_are_fresh_by_their_heartbeat_and_keep_their_macs() {
        let now: jiff::Timestamp = "2026-01-01T12:00:00Z".parse().unwrap();
        let at = |secs: i64| Some(Time(now - jiff::SignedDuration::from_secs(secs)));
        let status = |secs, state: &str| NodeAgentStatus {
            heartbeat_time: at(secs),
            state: state.into(),
            macs: vec!["02:00:00:00:00:01".into(), "not a mac".into()],
            ..Default::default()
        };
        let fresh = record_of(&agent("a", status(30, READY)), now).unwrap();
        assert!(fresh.fresh);
        assert_eq!(
            fresh.macs,
            ["02:00:00:00:00:01".parse().unwrap()].into(),
            "a malformed MAC is left out"
        );
        let stale = record_of(&agent("b", status(NODE_AGENT_STALE_SECS + 1, READY)), now).unwrap();
        assert!(!stale.fresh);
        assert_eq!(stale.macs.len(), 1);
        assert!(
            !record_of(&agent("c", status(1, STOPPED)), now)
                .unwrap()
                .fresh
        );
        let never = record_of(&agent("d", NodeAgentStatus::default()), now).unwrap();
        assert!(!never.fresh && never.macs.is_empty());
        // A heartbeat from the future: within clock skew it counts, beyond
        // it the record is not fresh (forged or broken), where it once
        // stayed fresh forever.
        let skewed = record_of(&agent("e", status(-(HEARTBEAT_SKEW_SECS - 5), READY)), now);
        assert!(skewed.unwrap().fresh);
        let future = record_of(&agent("f", status(-(HEARTBEAT_SKEW_SECS + 1), READY)), now);
        assert!(!future.unwrap().fresh);
        let far = record_of(&agent("g", status(-10 * 365 * 86_400, READY)), now);
        assert!(!far.unwrap().fresh);
    }
}
