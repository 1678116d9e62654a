//! `/status` as JSON and `lbnodeagent status` as a page for people: members
//! with their state and prefixes, the VIPs this node holds, and per VIP the
//! winner, the runners-up with score and hash rank, and why every other node
//! lost.

use std::fmt::Write as _;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::agent::core::Core;
use crate::election::VipReport;
use crate::model::FirewallPlan;

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct StatusDoc {
    pub node: String,
    pub ready: bool,
    /// Why not ready, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready: Option<String>,
    pub api_healthy: bool,
    /// Gossip reaches none of these agents, which the API shows running
    /// (their records are fresh): gossip is isolated when not empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolated_from: Vec<String>,
    /// Conditions that do not stop this node serving, but need an
    /// operator (an interface exposing VIPs of another network).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What the agent's firewall lets reach the VIPs, in words; `None`
    /// before the first view of the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firewall: Option<String>,
    /// Its NodeAgent's `spec.drain` says so.
    #[serde(default)]
    pub drain: bool,
    /// The drain is in force: every member elects by it.
    #[serde(default)]
    pub drained: bool,
    /// `interface (IPv4)`: the default gateways this node stopped
    /// reaching; it is the last resort for the VIPs there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways_lost: Vec<String>,
    pub members: Vec<MemberDoc>,
    pub held: Vec<HeldDoc>,
    pub vips: Vec<VipDoc>,
    /// Kubernetes objects left out, with the reason.
    pub object_errors: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct MemberDoc {
    pub node: String,
    pub status: String,
    pub gossip: String,
    pub version: String,
    /// The gossip protocol it speaks (in a dump from before the field, the
    /// protocol of every agent then).
    #[serde(default = "protocol_unsaid")]
    pub protocol: u32,
    /// `prefix@interface`, `*` after an announce interface's.
    pub prefixes: Vec<String>,
    /// The VIPs it answers for on a LAN, as its gossip says.
    pub vips: usize,
    /// The routed VIPs it holds on its virtual interface, by this node's
    /// election: gossip carries only the LAN ones (every eligible node
    /// holds a routed VIP, so nobody contests it). Absent in a dump from
    /// before the field.
    #[serde(default)]
    pub routed: usize,
    /// The resourceVersion of the newest cluster view it has read.
    #[serde(default)]
    pub revision: u64,
    /// What its view holds of what the election reads, as a digest (16
    /// hex digits): two members showing the same one elect alike, whatever
    /// their revisions. Absent from an agent that does not publish it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub view: Option<String>,
    /// Its view is older than this node's, which keeps the VIPs it wins by
    /// the newer view where they are until it catches up.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub behind: bool,
}

fn protocol_unsaid() -> u32 {
    crate::gossip::PROTOCOL_UNSAID
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct HeldDoc {
    pub ip: IpAddr,
    pub interface: String,
    pub prefix_len: u8,
    pub mode: String,
    /// Removal waits for the new winner to show it holds the address.
    #[serde(default)]
    pub handing_over: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct VipDoc {
    pub ip: IpAddr,
    pub services: Vec<String>,
    pub pool: Option<String>,
    pub winner: Option<String>,
    pub interface: Option<String>,
    pub candidates: Vec<CandidateDoc>,
    #[serde(rename = "virtual")]
    pub virtual_nodes: Vec<String>,
    pub excluded: Vec<ExcludedDoc>,
    pub note: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct CandidateDoc {
    pub node: String,
    /// Drained: last in order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drained: bool,
    /// Its gateway toward the VIP's network is lost: last in order too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub upstream_lost: bool,
    /// Holds a sticky VIP: first in order while it is a candidate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    pub score: u32,
    pub hash_rank: usize,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ExcludedDoc {
    pub node: String,
    pub reason: String,
    pub explanation: String,
}

impl VipDoc {
    pub fn from_report(r: &VipReport) -> VipDoc {
        VipDoc {
            ip: r.ip,
            services: r.services.clone(),
            pool: r.pool.clone(),
            winner: r.winner.clone(),
            interface: r.winner_on.as_ref().map(|o| o.interface.clone()),
            candidates: r
                .candidates
                .iter()
                .map(|c| CandidateDoc {
                    node: c.node.clone(),
                    drained: c.drained,
                    upstream_lost: c.upstream_lost,
                    held: c.held,
                    score: c.score,
                    hash_rank: c.hash_rank,
                })
                .collect(),
            virtual_nodes: r.virtual_nodes.clone(),
            excluded: r
                .excluded
                .iter()
                .map(|x| ExcludedDoc {
                    node: x.node.clone(),
                    reason: x.reason.to_string(),
                    explanation: x.reason.explain().to_string(),
                })
                .collect(),
            note: r.note.as_ref().map(|n| n.to_string()),
        }
    }
}

/// The page `lbnodeagent status` prints.
/// What `/status` shows of the core now.
pub fn doc(core: &Core, not_ready: Option<&str>, api_healthy: bool) -> StatusDoc {
    StatusDoc {
        node: core.node().to_string(),
        ready: not_ready.is_none(),
        not_ready: not_ready.map(str::to_string),
        api_healthy,
        warnings: Vec::new(),
        firewall: core.firewall().map(|plan| match plan {
            FirewallPlan::On(f) => format!(
                "on: {} VIPs answer only on their Services' ports ({} address and port pairs) and to ICMP",
                f.vips.len(),
                f.open.len()
            ),
            FirewallPlan::Off => {
                "off (firewall.enabled = false): the VIPs reach every port of this host".into()
            }
        }),
        isolated_from: core.isolated_from(),
        drain: core.drain_requested(),
        drained: core.drained(),
        gateways_lost: core
            .upstream_lost()
            .iter()
            .map(|(interface, family)| format!("{interface} ({family})"))
            .collect(),
        members: core
            .view()
            .nodes
            .iter()
            .map(|n| MemberDoc {
                node: n.node.to_string(),
                status: n.status.as_str().to_string(),
                gossip: n.gossip_addr.to_string(),
                version: n.agent_version.clone(),
                protocol: n.protocol,
                prefixes: n
                    .on_link
                    .iter()
                    .map(|o| {
                        format!(
                            "{}@{}{}{}",
                            o.prefix,
                            o.interface,
                            if o.announce { "*" } else { "" },
                            if o.upstream_lost { "(gateway lost)" } else { "" }
                        )
                    })
                    .collect(),
                vips: n.vips.len(),
                routed: core
                    .election()
                    .duties(&n.node)
                    .iter()
                    .filter(|d| matches!(d, crate::election::Duty::Virtual { .. }))
                    .count(),
                revision: n.revision,
                view: n.digest.map(|d| format!("{d:016x}")),
                behind: core.view_behind(n),
            })
            .collect(),
        held: core
            .holdings()
            .map(|(ip, h, handing_over)| HeldDoc {
                ip,
                interface: h.vip.interface.clone(),
                prefix_len: h.vip.prefix_len,
                mode: format!("{:?}", h.mode).to_lowercase(),
                handing_over,
            })
            .collect(),
        vips: core
            .election()
            .report_all()
            .iter()
            .map(VipDoc::from_report)
            .collect(),
        object_errors: core.object_errors().to_vec(),
    }
}

pub fn render(doc: &StatusDoc) -> String {
    let mut out = String::new();
    let ready = match (&doc.not_ready, doc.ready) {
        (_, true) => "ready".to_string(),
        (Some(why), false) => format!("not ready: {why}"),
        (None, false) => "not ready".to_string(),
    };
    let _ = writeln!(out, "node {}: {ready}", doc.node);
    if let Some(f) = &doc.firewall {
        let _ = writeln!(out, "firewall {f}");
    }
    match (doc.drain, doc.drained) {
        (true, true) => {
            let _ = writeln!(
                out,
                "drained: wins only VIPs no other node can serve (lbnodeagent undrain)"
            );
        }
        (true, false) => {
            let _ = writeln!(
                out,
                "drain asked, not in force: an agent of an older protocol runs (see members)"
            );
        }
        _ => {}
    }
    if !doc.gateways_lost.is_empty() {
        let _ = writeln!(
            out,
            "gateway lost: {}: the last resort for the VIPs there; they move to a node that reaches its gateway, and stay where none does",
            doc.gateways_lost.join(", ")
        );
    }
    for w in &doc.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    if !doc.isolated_from.is_empty() {
        let _ = writeln!(
            out,
            "\ngossip isolated: the API shows agents running on {} but gossip reaches none of them; acting as if partitioned (check UDP 7934 between the hosts, gossip.key_file, gossip.cluster_id, gossip.advertise)",
            doc.isolated_from.join(", ")
        );
    }
    let _ = writeln!(out, "\nmembers ({}):", doc.members.len());
    for m in &doc.members {
        let _ = writeln!(
            out,
            "  {:<20} {:<8} {:<22} protocol {:<2} vips {:<4} routed {:<4} {}",
            m.node,
            m.status,
            m.gossip,
            m.protocol,
            m.vips,
            m.routed,
            m.prefixes.join(" ")
        );
        let _ = writeln!(
            out,
            "  {:<20} view {} revision {}{}",
            "",
            m.view.as_deref().unwrap_or("-"),
            m.revision,
            if m.behind {
                ", older than this node's: the VIPs it wins wait for it"
            } else {
                ""
            }
        );
    }
    let _ = writeln!(out, "\nheld here ({}):", doc.held.len());
    for h in &doc.held {
        let _ = writeln!(
            out,
            "  {}/{} on {} ({}){}",
            h.ip,
            h.prefix_len,
            h.interface,
            h.mode,
            if h.handing_over { ", handing over" } else { "" }
        );
    }
    for v in &doc.vips {
        let _ = writeln!(
            out,
            "\n{}  pool {}  services {}",
            v.ip,
            v.pool.as_deref().unwrap_or("-"),
            v.services.join(", ")
        );
        match (&v.winner, &v.note) {
            (Some(w), _) => {
                let on = v
                    .interface
                    .as_deref()
                    .map(|i| format!(" on {i}"))
                    .unwrap_or_default();
                let _ = writeln!(out, "  winner: {w}{on}");
            }
            (None, Some(n)) => {
                let _ = writeln!(out, "  winner: none ({n})");
            }
            (None, None) if !v.virtual_nodes.is_empty() => {
                let _ = writeln!(
                    out,
                    "  winner: none on a LAN (routed: no node has it on-link)"
                );
            }
            (None, None) => {
                let _ = writeln!(out, "  winner: none (no live, eligible, on-link candidate)");
            }
        }
        for (i, c) in v.candidates.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:>3}. {:<20} score {:<4} hash rank {}",
                i + 1,
                c.node,
                c.score,
                c.hash_rank
            );
        }
        if !v.virtual_nodes.is_empty() {
            let _ = writeln!(
                out,
                "  virtual (routed, every one holds it on its virtual interface): {}",
                v.virtual_nodes.join(", ")
            );
        }
        for x in &v.excluded {
            let _ = writeln!(
                out,
                "  excluded {:<20} {} ({})",
                x.node, x.reason, x.explanation
            );
        }
    }
    if !doc.object_errors.is_empty() {
        let _ = writeln!(out, "\nobjects left out:");
        for e in &doc.object_errors {
            let _ = writeln!(out, "  {e}");
        }
    }
    out
}

/// Fetches `/status` from a running agent: a plain HTTP/1.0 GET on the
/// loopback listener, so the command needs no HTTP client stack.
pub fn fetch(addr: std::net::SocketAddr) -> Result<StatusDoc, String> {
    use std::io::{Read, Write};
    let timeout = std::time::Duration::from_secs(5);
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|e| {
        format!("cannot reach the agent on {addr}: {e}; is `lbnodeagent run` running (systemctl status lbnodeagent)?")
    })?;
    s.set_read_timeout(Some(timeout)).ok();
    s.write_all(format!("GET /status HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(|e| format!("writing to {addr}: {e}"))?;
    let mut body = Vec::new();
    s.read_to_end(&mut body)
        .map_err(|e| format!("reading from {addr}: {e}"))?;
    let text = String::from_utf8_lossy(&body);
    let (head, json) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr} sent no HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "the agent answered {}: {json}",
            head.lines().next().unwrap_or("")
        ));
    }
    serde_json::from_str(json).map_err(|e| format!("unreadable /status from {addr}: {e}"))
}

/// What a drain of this node looks like from its own agent (see
/// [`crate::drain`]): the VIPs it still holds; those its own election
/// still gives it, which stay; where the others answer now.
pub fn drain_snapshot(doc: &StatusDoc) -> crate::drain::Snapshot {
    let me = doc.node.as_str();
    let by_ip: std::collections::BTreeMap<IpAddr, &VipDoc> =
        doc.vips.iter().map(|v| (v.ip, v)).collect();
    let services = |ip: &IpAddr| {
        by_ip
            .get(ip)
            .map(|v| v.services.join(","))
            .unwrap_or_default()
    };
    let held: std::collections::BTreeMap<IpAddr, String> =
        doc.held.iter().map(|h| (h.ip, services(&h.ip))).collect();
    let staying = if doc.drained {
        held.keys()
            .filter(|ip| {
                by_ip.get(*ip).is_some_and(|v| {
                    v.winner.as_deref() == Some(me) || v.virtual_nodes.iter().any(|n| n == me)
                })
            })
            .map(|ip| (*ip, "no node that is not drained can serve it".to_string()))
            .collect()
    } else {
        Default::default()
    };
    let now_at = doc
        .vips
        .iter()
        .filter(|v| !held.contains_key(&v.ip))
        .filter_map(|v| {
            let at = match (&v.winner, v.virtual_nodes.is_empty()) {
                (Some(w), _) => w.clone(),
                (None, false) => format!("routed via {}", v.virtual_nodes.join(",")),
                (None, true) => return None,
            };
            Some((v.ip, at))
        })
        .collect();
    crate::drain::Snapshot {
        held,
        staying,
        now_at,
        in_force: if doc.drained || !doc.drain {
            Ok(())
        } else {
            Err("an agent of an older protocol runs in the cluster; upgrade it".into())
        },
    }
}
