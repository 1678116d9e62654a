//! This node's `NodeAgent` record in the API, and every other agent's.
//!
//! Gossip is how agents know each other, and the one thing that must not
//! depend on it is telling a second owner of a VIP apart from a stranger:
//! agents whose gossip never connected (a firewall on UDP 7934, another
//! key, an advertise address nobody reaches) would otherwise each hold
//! every VIP, each taking the others' MACs for hosts configured by hand.
//! So each agent writes its gossip address and MACs into a record named
//! after its Node, and reads everyone's: the core learns the MACs for its
//! conflict rule, and which other agents run (a record written in the last
//! three minutes) to tell an isolated agent from one that is alone.
//!
//! The loop hands the [`Publisher`] the record as it should read; it is
//! written at once the first time, then on change at most every
//! [`MIN_GAP`], and at least every minute as a heartbeat. At 1,000 nodes
//! that is about 17 writes a second for the heartbeats, and a failover
//! changes a handful of records; each write is one small status patch. A
//! write that fails is tried again with backoff; the loop never waits on
//! it. On SIGTERM the record says `Stopped`; a killed agent's goes stale.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use hostlb_api::v1::{NODE_AGENT_HEARTBEAT_SECS, NODE_AGENT_STALE_SECS};
use hostlb_api::{NodeAgent, NodeAgentStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::core::AgentRecord;
use super::report::FIELD_MANAGER;
use crate::addrs::MacAddr;

/// Least time between two writes of a changed record.
pub const MIN_GAP: Duration = Duration::from_secs(5);
/// First wait after a failed write, doubling to [`RETRY_MAX`].
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// How long SIGTERM waits for the `Stopped` record to be written.
const STOP_WRITE: Duration = Duration::from_secs(1);

/// State values.
pub const STARTING: &str = "Starting";
pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
pub const STOPPED: &str = "Stopped";

/// Every agent's record, kept current by a watch.
pub struct Records {
    store: Store<NodeAgent>,
    changed: Arc<Notify>,
    task: JoinHandle<()>,
}

impl Records {
    pub fn start(client: &Client) -> Records {
        let (store, writer) = reflector::store();
        let changed = Arc::new(Notify::new());
        let notify = changed.clone();
        let api = Api::<NodeAgent>::all(client.clone());
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .backoff(hostlb_api::watch::WatchBackoff::spread())
                .reflect(writer)
                .boxed();
            let mut failing = false;
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                    Ok(_) => {
                        if std::mem::take(&mut failing) {
                            info!("NodeAgent watch recovered");
                        }
                        notify.notify_one();
                    }
                    // Logged once per outage: the other watches say the
                    // same of the server; a missing CRD or rule is this
                    // watch's own (the agent works on, without records).
                    Err(e) if !failing => {
                        failing = true;
                        warn!(error = %e, "cannot watch NodeAgent records (is deploy/crds/hostlb.io_nodeagents.yaml applied, and deploy/agent/rbac.yaml?); agents whose gossip cannot connect will not recognise each other");
                    }
                    Err(_) => {}
                }
            }
        });
        Records {
            store,
            changed,
            task,
        }
    }

    /// Wakes when a record changed.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// What the core needs of every record, judged fresh at `now`.
    pub fn records(&self, now: jiff::Timestamp) -> Vec<AgentRecord> {
        let mut out: Vec<AgentRecord> = self
            .store
            .state()
            .iter()
            .filter_map(|r| record_of(r, now))
            .collect();
        out.sort_by(|a, b| a.node.cmp(&b.node));
        out
    }
}

impl Drop for Records {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One record as the core sees it; `None` without a name.
fn record_of(r: &NodeAgent, now: jiff::Timestamp) -> Option<AgentRecord> {
    let node = r.metadata.name.clone()?;
    let status = r.status.clone().unwrap_or_default();
    let macs: BTreeSet<MacAddr> = status.macs.iter().filter_map(|m| m.parse().ok()).collect();
    let fresh = status.state != STOPPED
        && status
            .heartbeat_time
            .is_some_and(|t| now.duration_since(t.0).as_secs() < NODE_AGENT_STALE_SECS);
    Some(AgentRecord { node, macs, fresh })
}

/// Writes this node's record.
pub struct Publisher {
    tx: watch::Sender<Option<NodeAgentStatus>>,
    api: Api<NodeAgent>,
    node: String,
    task: JoinHandle<()>,
}

impl Publisher {
    pub fn start(client: &Client, node: &str) -> Publisher {
        let api = Api::<NodeAgent>::all(client.clone());
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(publish(api.clone(), node.to_string(), rx));
        Publisher {
            tx,
            api,
            node: node.to_string(),
            task,
        }
    }

    /// The record as it should read now (its heartbeat time is the
    /// publisher's); written when it differs from the last.
    pub fn set(&self, status: NodeAgentStatus) {
        self.tx.send_if_modified(|current| {
            if current.as_ref() == Some(&status) {
                false
            } else {
                *current = Some(status);
                true
            }
        });
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
        let write = write_status(&self.api, &self.node, status);
        if tokio::time::timeout(STOP_WRITE, write).await.is_err() {
            debug!("the Stopped record was not written in time");
        }
    }
}

async fn publish(
    api: Api<NodeAgent>,
    node: String,
    mut rx: watch::Receiver<Option<NodeAgentStatus>>,
) {
    let heartbeat = Duration::from_secs(NODE_AGENT_HEARTBEAT_SECS as u64);
    let mut created = false;
    let mut retry = RETRY_MIN;
    let mut last: Option<NodeAgentStatus> = None;
    let mut failing = false;
    loop {
        let wanted = rx.borrow_and_update().clone();
        if let Some(status) = wanted {
            let result = async {
                if !created {
                    create(&api, &node).await?;
                    created = true;
                }
                write_status(&api, &node, status.clone()).await
            }
            .await;
            match result {
                Ok(()) => {
                    if std::mem::take(&mut failing) {
                        info!("NodeAgent record written again");
                    }
                    last = Some(status);
                    retry = RETRY_MIN;
                }
                Err(e) => {
                    if !failing {
                        warn!(error = %e, node = %node, "cannot write this node's NodeAgent record; retrying with backoff");
                    }
                    failing = true;
                    tokio::time::sleep(retry).await;
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

async fn write_status(
    api: &Api<NodeAgent>,
    node: &str,
    mut status: NodeAgentStatus,
) -> Result<(), kube::Error> {
    status.heartbeat_time = Some(Time(jiff::Timestamp::now()));
    let patch = json!({
        "apiVersion": "hostlb.io/v1",
        "kind": "NodeAgent",
        "metadata": {"name": node},
        "status": status,
    });
    api.patch_status(
        node,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(patch),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
