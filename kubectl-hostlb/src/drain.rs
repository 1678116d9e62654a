//! `kubectl hostlb drain NODE` and `undrain NODE`: the node's NodeAgent
//! `spec.drain` written, then the drain followed from the API alone (see
//! `lbnodeagent::drain`): the Services' announcing annotations say where
//! each VIP answers, and the election, computed with the node drained over
//! the members the records publish, says which VIPs stay and why.

use std::collections::BTreeMap;
use std::time::Duration;

use hostlb_api::{Family, Scope};
use kube::Client;
use lbnodeagent::drain::{Outcome, Snapshot, why_it_stays};
use lbnodeagent::election::Election;

use crate::Fleet;
use crate::status::{addresses, announcing, routed};

/// The drain of `node` as the API shows it now.
pub fn snapshot(fleet: &Fleet, node: &str) -> Snapshot {
    let (cluster, _) = fleet.cluster();
    let mut members = lbnodeagent::agent::record::members_of(&fleet.agents, fleet.now);
    for m in &mut members {
        if m.node == node {
            m.drained = true;
        }
    }
    let election = Election::new(&cluster, members);
    let mut held = BTreeMap::new();
    let mut now_at = BTreeMap::new();
    for svc in fleet.load_balancers() {
        let key = format!(
            "{}/{}",
            svc.metadata.namespace.as_deref().unwrap_or_default(),
            svc.metadata.name.as_deref().unwrap_or_default()
        );
        for ip in addresses(svc) {
            let family = Family::of(ip);
            let lan = announcing(svc, family).map(|(n, _)| n);
            let via = routed(svc, family);
            let here = lan.as_deref() == Some(node)
                || via
                    .as_deref()
                    .is_some_and(|v| v.split(',').any(|n| n == node));
            if here {
                held.entry(ip)
                    .and_modify(|s: &mut String| {
                        s.push(',');
                        s.push_str(&key)
                    })
                    .or_insert_with(|| key.clone());
            } else if let Some(n) = lan.filter(|n| !n.is_empty()) {
                now_at.insert(ip, n);
            } else if let Some(v) = via {
                now_at.insert(ip, format!("routed via {v}"));
            }
        }
    }
    let staying = held
        .keys()
        .filter(|ip| election.winner(**ip) == Some(node) || election.duty(node, **ip).is_some())
        .filter_map(|ip| Some((*ip, why_it_stays(&election.explain(*ip)?, node))))
        .collect();
    Snapshot {
        held,
        staying,
        now_at,
        in_force: in_force(fleet, node),
    }
}

/// Whether `node`'s agent acts on the drain, by the records: it says so,
/// or what holds it off.
fn in_force(fleet: &Fleet, node: &str) -> Result<(), String> {
    let older: Vec<String> = fleet
        .agents
        .iter()
        .filter(|a| a.metadata.name.as_deref().is_some_and(|n| fleet.runs(n)))
        .filter(|a| {
            a.status.as_ref().is_some_and(|s| {
                s.protocol.unwrap_or(lbnodeagent::model::PROTOCOL_UNSAID)
                    < lbnodeagent::model::PROTOCOL_DRAIN
            })
        })
        .filter_map(|a| a.metadata.name.clone())
        .collect();
    if !older.is_empty() {
        return Err(format!(
            "agents of a protocol from before drains run on {}; the drain takes force once they are upgraded",
            older.join(", ")
        ));
    }
    match fleet.agent(node).and_then(|a| a.status.as_ref()) {
        Some(s) if s.drained => Ok(()),
        _ if !fleet.runs(node) => Err(format!("{node}'s agent is not running")),
        _ => Err(format!("{node}'s agent has not said it heard of it yet")),
    }
}

/// Follows the drain of `node` from the API (see
/// [`lbnodeagent::drain::follow`]).
pub async fn follow(
    client: &Client,
    scope: &Scope,
    node: &str,
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    lbnodeagent::drain::follow(node, timeout, Duration::from_millis(250), || async {
        let fleet = Fleet::load(client, scope).await?;
        Ok(snapshot(&fleet, node))
    })
    .await
}
