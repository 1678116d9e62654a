//! After a round's quiet: every address answered by its elected winner
//! alone (and nobody answering an address no Service holds), each host's
//! kernel addresses and nftables table exactly what the election and the
//! Services say, the records and the announcing annotations in agreement,
//! and no agent that panicked or grew past [`MEMORY_BOUND`].
//!
//! The election is computed here as `kubectl hostlb` computes it, from the
//! API alone: the agents' own word is what is being checked.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Instant;

use hostlb_api::Scope;
use kubectl_hostlb::Fleet;

use super::bed::Bed;
use super::checker::{ANSWER_WITHIN, Violation, windows};

/// An agent's resident memory, at most: the 1,000-VIP holder measured 29
/// MB (docs/agent.md, "Measured"), the bed's agents hold a handful; twice
/// the largest figure measured, well under the unit's `MemoryMax` (256 MB),
/// which would kill it first.
pub const MEMORY_BOUND_KIB: u64 = 64 * 1024;

/// What the API says after the quiet.
pub struct Expected {
    /// Each Service address and its winner (none: no candidate).
    pub winners: BTreeMap<IpAddr, Option<String>>,
    /// Each address's Service, and the Service's ports.
    pub services: BTreeMap<IpAddr, (String, Vec<u16>)>,
    fleet: Fleet,
}

impl Expected {
    /// The addresses the election gives `node`.
    fn wins(&self, node: &str) -> BTreeSet<IpAddr> {
        self.winners
            .iter()
            .filter(|(_, w)| w.as_deref() == Some(node))
            .map(|(ip, _)| *ip)
            .collect()
    }
}

pub fn expected(bed: &Bed) -> Result<Expected, String> {
    let config = bed.admin_config();
    let fleet = bed.api_rt.run(move || async move {
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        Fleet::load(&client, &Scope::default())
            .await
            .map_err(|e| e.to_string())
    })?;
    let election = fleet.election();
    let mut winners = BTreeMap::new();
    let mut services = BTreeMap::new();
    for svc in fleet.load_balancers() {
        let name = svc.metadata.name.clone().unwrap_or_default();
        let ports: Vec<u16> = svc
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|ps| ps.iter().map(|p| p.port as u16).collect())
            .unwrap_or_default();
        for i in svc
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .into_iter()
            .flatten()
        {
            if let Some(ip) = i.ip.as_ref().and_then(|ip| ip.parse::<IpAddr>().ok()) {
                winners.insert(ip, election.winner(ip).map(str::to_string));
                services.insert(ip, (name.clone(), ports.clone()));
            }
        }
    }
    Ok(Expected {
        winners,
        services,
        fleet,
    })
}

/// Checks the bed against `e`, the wire over `[since, until]`.
pub fn check(
    bed: &Bed,
    e: &Expected,
    since: Instant,
    until: Instant,
    rss_kib: &BTreeMap<String, u64>,
) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut say = |what: String| v.push(Violation { at: until, what });
    // Every node stands: its record fresh and ready, nothing drained.
    for n in &bed.nodes {
        match e.fleet.agent(n).and_then(|a| a.status.as_ref()) {
            None => say(format!("{n}: no record status")),
            Some(s) => {
                if !e.fleet.runs(n) {
                    say(format!("{n}: its record is not fresh"));
                }
                if s.state != "Ready" {
                    say(format!(
                        "{n}: its record says {} ({})",
                        s.state,
                        s.reason.as_deref().unwrap_or("")
                    ));
                }
                if s.drained {
                    say(format!("{n}: still drained after undrain"));
                }
                let held: BTreeSet<IpAddr> = s.vips.iter().filter_map(|x| x.parse().ok()).collect();
                let wins: BTreeSet<IpAddr> = e.wins(n);
                if held != wins {
                    say(format!(
                        "{n}: its record lists {held:?}, the election gives it {wins:?}"
                    ));
                }
            }
        }
    }
    // The wire.
    for (ip, probe) in &bed.probes {
        let sent: Vec<Instant> = probe_sent(probe, since, until);
        let replies: Vec<(Instant, String)> =
            probe.replies().into_iter().map(|r| (r.at, r.mac)).collect();
        let ws = windows(&sent, &replies, ANSWER_WITHIN);
        let macs: BTreeSet<String> = ws.iter().flat_map(|w| w.macs.iter().cloned()).collect();
        let named: Vec<String> = macs
            .iter()
            .map(|m| bed.node_of_mac(m).unwrap_or_else(|| m.clone()))
            .collect();
        match e.winners.get(ip) {
            Some(Some(w)) => {
                let want = bed.lan.host(w).mac().to_string();
                let lost = ws.iter().filter(|x| !x.answered).count();
                if macs != BTreeSet::from([want]) || lost > 0 {
                    say(format!(
                        "{ip}: answered by {named:?} with {lost} of {} requests unanswered; its winner is {w}",
                        ws.len()
                    ));
                }
            }
            Some(None) => {
                if !macs.is_empty() {
                    say(format!(
                        "{ip}: answered by {named:?}, and no node is its candidate"
                    ));
                }
            }
            None => {
                if !macs.is_empty() {
                    say(format!(
                        "{ip}: answered by {named:?}, and no Service holds it"
                    ));
                }
            }
        }
    }
    // Each kernel, and each table.
    let vips: BTreeSet<IpAddr> = e.services.keys().copied().collect();
    let open: BTreeSet<(IpAddr, u16)> = e
        .services
        .iter()
        .flat_map(|(ip, (_, ports))| ports.iter().map(|p| (*ip, *p)))
        .collect();
    for n in &bed.nodes {
        let kernel: BTreeSet<IpAddr> = bed
            .kernel_vips(n)
            .into_iter()
            .map(|(ip, _, _)| ip)
            .collect();
        let wins: BTreeSet<IpAddr> = e.wins(n);
        if kernel != wins {
            say(format!(
                "{n}: its kernel holds {kernel:?}, the election gives it {wins:?}"
            ));
        }
        match table(bed, n) {
            Ok((t_vips, t_open)) => {
                if t_vips != vips || t_open != open {
                    say(format!(
                        "{n}: its table guards {t_vips:?} open to {t_open:?}; the Services have {vips:?} open to {open:?}"
                    ));
                }
            }
            Err(err) => say(format!("{n}: its table: {err}")),
        }
    }
    // The annotations: each family's address announced by its winner.
    for svc in e.fleet.load_balancers() {
        let name = svc.metadata.name.clone().unwrap_or_default();
        let annotations = svc.metadata.annotations.clone().unwrap_or_default();
        for (ip, (owner, _)) in &e.services {
            if *owner != name {
                continue;
            }
            let key = if ip.is_ipv4() {
                "hostlb.io/announcing-IPv4"
            } else {
                "hostlb.io/announcing-IPv6"
            };
            let want = e
                .winners
                .get(ip)
                .cloned()
                .flatten()
                .map(|w| format!("{w},eth0"));
            let got = annotations.get(key).cloned();
            if got != want {
                say(format!(
                    "{name}: {key} is {got:?}, its winner says {want:?}"
                ));
            }
        }
    }
    // Panics and memory.
    for n in &bed.nodes {
        let log = std::fs::read_to_string(bed.log_path(n)).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| l.contains("panicked at")) {
            say(format!("{n}: the agent panicked: {line}"));
        }
        if let Some(kib) = rss_kib.get(n)
            && *kib > MEMORY_BOUND_KIB
        {
            say(format!(
                "{n}: the agent grew to {} MiB (bound {})",
                kib / 1024,
                MEMORY_BOUND_KIB / 1024
            ));
        }
    }
    v
}

fn probe_sent(probe: &crate::probe::ArpProbe, since: Instant, until: Instant) -> Vec<Instant> {
    probe
        .sent()
        .into_iter()
        .filter(|s| *s >= since && *s + ANSWER_WITHIN <= until)
        .collect()
}

/// The VIPs `inet hostlb` on `node` guards, and the (address, TCP port)
/// pairs it opens.
#[allow(clippy::type_complexity)]
fn table(bed: &Bed, node: &str) -> Result<(BTreeSet<IpAddr>, BTreeSet<(IpAddr, u16)>), String> {
    let out = bed
        .lan
        .host(node)
        .ns
        .run(&["nft", "-j", "list", "table", "inet", "hostlb"])
        .map_err(|e| e.to_string())?;
    let json: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
    let mut vips = BTreeSet::new();
    let mut open = BTreeSet::new();
    for item in json["nftables"].as_array().into_iter().flatten() {
        let set = &item["set"];
        let Some(name) = set["name"].as_str() else {
            continue;
        };
        for el in set["elem"].as_array().into_iter().flatten() {
            match name {
                "vips4" | "vips6" => {
                    if let Some(ip) = el.as_str().and_then(|s| s.parse().ok()) {
                        vips.insert(ip);
                    }
                }
                "open4" | "open6" => {
                    let c = &el["concat"];
                    if let (Some(ip), Some(proto), Some(port)) = (
                        c[0].as_str().and_then(|s| s.parse().ok()),
                        c[1].as_str(),
                        c[2].as_u64(),
                    ) && proto == "tcp"
                    {
                        open.insert((ip, port as u16));
                    }
                }
                _ => {}
            }
        }
    }
    Ok((vips, open))
}
