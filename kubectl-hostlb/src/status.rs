//! `kubectl hostlb status`: the Services with their addresses, pool and
//! announcing node per family; the pools and their use; the agents that
//! are not ready (all of them with `-o wide`).

use std::net::IpAddr;

use hostlb_api::annotations::IP_ALLOCATED_FROM_POOL;
use hostlb_api::rules::{age_key, pool_holding};
use hostlb_api::{AddressRange, Family, IPAddressPool};
use k8s_openapi::api::core::v1::Service;
use serde::Serialize;

use crate::{Fleet, Output, age, table};

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct StatusDoc {
    pub services: Vec<ServiceRow>,
    pub pools: Vec<PoolRow>,
    pub agents: Vec<AgentRow>,
    /// Nodes with no agent record at all.
    pub nodes_without_agent: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServiceRow {
    pub namespace: String,
    pub name: String,
    pub addresses: Vec<String>,
    pub pool: Option<String>,
    /// `NODE on IFACE` per family, as the announcing agent wrote it, or
    /// `routed via NODE,NODE,...` for an address held on virtual
    /// interfaces (both, `;`-separated, when some nodes have it on-link).
    pub ipv4: Option<String>,
    pub ipv6: Option<String>,
    /// The last move of each address, as the node it moved to recorded it
    /// (shown with `-o wide`).
    pub last_moves: Vec<MoveRow>,
}

/// A VIP's move to another node, from that node's record.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct MoveRow {
    pub address: String,
    pub from: String,
    pub to: String,
    pub cause: String,
    /// How long no host may have answered (a host gone or stalled); `None`
    /// for a planned move.
    pub dark_ms: Option<i64>,
    /// How long ago, as `kubectl get` prints ages.
    pub age: String,
    #[serde(skip)]
    ip: Option<IpAddr>,
    #[serde(skip)]
    at: Option<i64>,
}

impl MoveRow {
    /// `node-a -> node-b host-gone (dark 190ms) 2m`, as the wide table
    /// prints it.
    fn line(&self) -> String {
        let dark = self
            .dark_ms
            .map(|d| format!(" (dark {d}ms)"))
            .unwrap_or_default();
        format!(
            "{}: {} -> {} {}{dark} {}",
            self.address, self.from, self.to, self.cause, self.age
        )
    }
}

/// The newest move of each of `addresses` in every agent's record.
fn last_moves(fleet: &Fleet, addresses: &[IpAddr]) -> Vec<MoveRow> {
    let mut rows: Vec<MoveRow> = Vec::new();
    for agent in &fleet.agents {
        let to = agent.metadata.name.clone().unwrap_or_default();
        let Some(st) = &agent.status else { continue };
        for m in &st.recent_moves {
            let Ok(ip) = m.address.parse::<IpAddr>() else {
                continue;
            };
            if !addresses.contains(&ip) {
                continue;
            }
            let row = MoveRow {
                address: ip.to_string(),
                from: m.from.clone(),
                to: to.clone(),
                cause: m.cause.clone(),
                dark_ms: m.dark_ms,
                age: age(fleet.now, m.time.as_ref()),
                ip: Some(ip),
                at: m.time.as_ref().map(|t| t.0.as_millisecond()),
            };
            match rows.iter_mut().find(|r| r.ip == row.ip) {
                Some(r) if r.at < row.at => *r = row,
                Some(_) => {}
                None => rows.push(row),
            }
        }
    }
    rows.sort_by_key(|r| addresses.iter().position(|a| Some(*a) == r.ip));
    rows
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PoolRow {
    pub name: String,
    pub addresses: Vec<String>,
    pub assigned: i64,
    /// Saturates at the largest int64 for large IPv6 pools.
    pub available: i64,
    pub ready: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct AgentRow {
    pub node: String,
    /// `Ready`, `Degraded`, `Starting`, `Stopped`, or `Stale` when the
    /// record has not been written for three minutes.
    pub state: String,
    pub reason: Option<String>,
    pub vips: i64,
    pub members: i64,
    pub isolated: bool,
    pub version: String,
    pub config: String,
    pub heartbeat: String,
    /// `spec.drain`: its operator drained it.
    pub drain: bool,
    /// The drain is in force, as the agent says.
    pub drained: bool,
}

impl AgentRow {
    fn ready(&self) -> bool {
        self.state == "Ready"
    }

    /// Shown without `-o wide`: not ready, or drained.
    fn notable(&self) -> bool {
        !self.ready() || self.drain
    }
}

/// The pools oldest first, as every binary orders them.
pub(crate) fn pools_by_age(fleet: &Fleet) -> Vec<&IPAddressPool> {
    let mut pools: Vec<&IPAddressPool> = fleet.pools.iter().collect();
    pools.sort_by(|a, b| {
        let key = |p: &IPAddressPool| {
            (
                p.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.as_second()),
                p.metadata.name.clone().unwrap_or_default(),
            )
        };
        let (ca, na) = key(a);
        let (cb, nb) = key(b);
        age_key(ca, &na).cmp(&age_key(cb, &nb))
    });
    pools
}

pub(crate) fn addresses(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .collect()
}

pub(crate) fn ranges(pool: &IPAddressPool) -> Vec<AddressRange> {
    pool.addresses_in_force()
        .0
        .iter()
        .filter_map(|a| AddressRange::parse(a).ok())
        .collect()
}

/// The pool holding the Service's addresses, by the rule both binaries use.
pub(crate) fn pool_of(fleet: &Fleet, svc: &Service) -> Option<String> {
    let ips = addresses(svc);
    let pools = pools_by_age(fleet);
    let named = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IP_ALLOCATED_FROM_POOL))
        .map(String::as_str);
    pool_holding(
        &pools,
        named,
        &ips,
        |p| p.metadata.name.as_deref().unwrap_or(""),
        |p, ip| ranges(p).iter().any(|r| r.contains(ip)),
    )
    .and_then(|i| pools[i].metadata.name.clone())
}

/// The virtual announcing annotation of `family` as written: the nodes
/// holding the address on their virtual interfaces for routing.
pub(crate) fn routed(svc: &Service, family: Family) -> Option<String> {
    let key = hostlb_api::annotations::announcing(family, true);
    svc.metadata
        .annotations
        .as_ref()?
        .get(key)
        .filter(|v| !v.is_empty())
        .cloned()
}

/// `NODE on IFACE` from the announcing annotation of `family`.
pub(crate) fn announcing(svc: &Service, family: Family) -> Option<(String, String)> {
    let key = hostlb_api::annotations::announcing(family, false);
    let value = svc.metadata.annotations.as_ref()?.get(key)?;
    let (node, iface) = value.split_once(',').unwrap_or((value.as_str(), ""));
    Some((node.to_string(), iface.to_string()))
}

pub fn status(fleet: &Fleet, namespace: Option<&str>) -> StatusDoc {
    let not_taken = fleet.not_taken();
    let mut services: Vec<ServiceRow> = fleet
        .load_balancers()
        .filter(|s| namespace.is_none_or(|n| s.metadata.namespace.as_deref() == Some(n)))
        .map(|s| {
            let on = |f| {
                let local = announcing(s, f).map(|(n, i)| format!("{n} on {i}"));
                let routed = routed(s, f).map(|v| format!("routed via {v}"));
                // Nobody announces it because another host answers for it.
                let stranger = || {
                    addresses(s)
                        .iter()
                        .filter(|a| Family::of(**a) == f)
                        .find_map(|a| not_taken.get(&a.to_string()))
                        .map(|(_, mac)| format!("not taken: {mac} (no hostlb node) answers"))
                };
                match (local, routed) {
                    (Some(l), Some(r)) => Some(format!("{l}; {r}")),
                    (None, None) => stranger(),
                    (l, r) => l.or(r),
                }
            };
            ServiceRow {
                namespace: s.metadata.namespace.clone().unwrap_or_default(),
                name: s.metadata.name.clone().unwrap_or_default(),
                addresses: addresses(s).iter().map(|a| a.to_string()).collect(),
                pool: pool_of(fleet, s),
                ipv4: on(Family::V4),
                ipv6: on(Family::V6),
                last_moves: last_moves(fleet, &addresses(s)),
            }
        })
        .collect();
    services.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let pools = pools_by_age(fleet)
        .into_iter()
        .map(|p| {
            let st = p.status.clone().unwrap_or_default();
            PoolRow {
                name: p.metadata.name.clone().unwrap_or_default(),
                addresses: p.addresses_in_force().0.to_vec(),
                assigned: st.assigned_ipv4.saturating_add(st.assigned_ipv6),
                available: st.available_ipv4.saturating_add(st.available_ipv6),
                ready: st
                    .conditions
                    .iter()
                    .find(|c| c.type_ == hostlb_api::v1::conditions::READY)
                    .map(|c| c.status.clone()),
            }
        })
        .collect();
    let mut agents: Vec<AgentRow> = fleet
        .agents
        .iter()
        .map(|a| {
            let st = a.status.clone().unwrap_or_default();
            let node = a.metadata.name.clone().unwrap_or_default();
            let stale = !fleet.runs(&node) && st.state != lbnodeagent::agent::record::STOPPED;
            AgentRow {
                state: if stale {
                    "Stale".into()
                } else {
                    st.state.clone()
                },
                node,
                reason: st.reason.clone(),
                vips: st.held_vips,
                members: st.members,
                isolated: st.gossip_isolated,
                version: st.version.clone(),
                config: st.config_hash.clone(),
                heartbeat: age(fleet.now, st.heartbeat_time.as_ref()),
                drain: a.spec.drain,
                drained: st.drained,
            }
        })
        .collect();
    agents.sort_by(|a, b| a.node.cmp(&b.node));
    let mut nodes_without_agent: Vec<String> = fleet
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .filter(|n| fleet.agent(n).is_none())
        .collect();
    nodes_without_agent.sort();
    StatusDoc {
        services,
        pools,
        agents,
        nodes_without_agent,
    }
}

pub fn render(doc: &StatusDoc, output: Output) -> String {
    if let Some(s) = crate::structured(doc, output) {
        return s;
    }
    let wide = output == Output::Wide;
    let dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut out = String::from("SERVICES\n");
    if doc.services.is_empty() {
        out.push_str("none\n");
    } else {
        let mut header = vec!["NAMESPACE", "NAME", "ADDRESSES", "POOL", "IPV4", "IPV6"];
        if wide {
            header.push("LAST MOVE");
        }
        out.push_str(&table(
            &header,
            doc.services
                .iter()
                .map(|s| {
                    let mut row = vec![
                        s.namespace.clone(),
                        s.name.clone(),
                        if s.addresses.is_empty() {
                            "<pending>".into()
                        } else {
                            s.addresses.join(",")
                        },
                        dash(&s.pool),
                        dash(&s.ipv4),
                        dash(&s.ipv6),
                    ];
                    if wide {
                        let moves: Vec<String> = s.last_moves.iter().map(MoveRow::line).collect();
                        row.push(if moves.is_empty() {
                            "-".into()
                        } else {
                            moves.join("; ")
                        });
                    }
                    row
                })
                .collect(),
        ));
    }
    out.push_str("\nPOOLS\n");
    if doc.pools.is_empty() {
        out.push_str("none\n");
    } else {
        out.push_str(&table(
            &["NAME", "ADDRESSES", "ASSIGNED", "AVAILABLE", "READY"],
            doc.pools
                .iter()
                .map(|p| {
                    vec![
                        p.name.clone(),
                        p.addresses.join(","),
                        p.assigned.to_string(),
                        p.available.to_string(),
                        dash(&p.ready),
                    ]
                })
                .collect(),
        ));
    }
    let shown: Vec<&AgentRow> = doc.agents.iter().filter(|a| wide || a.notable()).collect();
    let ready = doc.agents.iter().filter(|a| a.ready()).count();
    let drained = doc.agents.iter().filter(|a| a.drain).count();
    out.push_str(&format!(
        "\nAGENTS: {ready} of {} ready{}{}\n",
        doc.agents.len(),
        if drained > 0 {
            format!(", {drained} drained")
        } else {
            String::new()
        },
        if wide || shown.is_empty() {
            ""
        } else if drained > 0 {
            "; not ready or drained:"
        } else {
            "; not ready:"
        }
    ));
    if !shown.is_empty() {
        let mut header = vec!["NODE", "STATE", "VIPS", "MEMBERS", "HEARTBEAT"];
        if wide {
            header.extend(["VERSION", "CONFIG"]);
        }
        header.push("REASON");
        out.push_str(&table(
            &header,
            shown
                .iter()
                .map(|a| {
                    let mut state = a.state.clone();
                    if a.isolated {
                        state.push_str(" (isolated)");
                    }
                    match (a.drain, a.drained) {
                        (true, true) => state.push_str(" (drained)"),
                        (true, false) => state.push_str(" (drain not in force yet)"),
                        _ => {}
                    }
                    let mut row = vec![
                        a.node.clone(),
                        state,
                        a.vips.to_string(),
                        a.members.to_string(),
                        a.heartbeat.clone(),
                    ];
                    if wide {
                        row.extend([a.version.clone(), a.config.clone()]);
                    }
                    row.push(dash(&a.reason));
                    row
                })
                .collect(),
        ));
    }
    if !doc.nodes_without_agent.is_empty() {
        out.push_str(&format!(
            "nodes with no agent: {}\n",
            doc.nodes_without_agent.join(", ")
        ));
    }
    out
}
