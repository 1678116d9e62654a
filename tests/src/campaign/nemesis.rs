//! Carries out a round of the schedule on the bed, at the times it names,
//! and notes when each fault really began and ended (a `kubectl` or an
//! `ip` takes its time, and the checker judges by what happened).
//!
//! Faults overlap: a port is down while any fault wants it down, a link
//! carries the faults of the latest lossy fault still in force, and each
//! partition is its own cut of the switch.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::bed::Bed;
use super::schedule::{Churn, Fault, Kind, Round};
use super::unit::Order;
use crate::switch::{CutId, Dir, LinkFaults};

/// A fault as it happened.
#[derive(Clone, Debug)]
pub struct Applied {
    pub round: usize,
    pub fault: Fault,
    pub start: Instant,
    pub end: Instant,
    /// Why it did nothing, or what it touched (the holder whose address
    /// was deleted, say).
    pub note: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Step {
    Start,
    /// A link flap's `n`th change: odd ones bring the port up.
    Flap(u32),
    End,
}

/// The bed's switch, ports and links as the faults in force want them.
#[derive(Default)]
struct Wire {
    down: BTreeMap<String, usize>,
    lossy: BTreeMap<String, Vec<(usize, LinkFaults)>>,
    cuts: BTreeMap<usize, Vec<CutId>>,
}

/// Runs `round` (number `index`) from now; returns once its last fault
/// ended.
pub fn run_round(
    bed: &Bed,
    index: usize,
    round: &Round,
    say: &mut dyn FnMut(String),
) -> Vec<Applied> {
    let mut steps: Vec<(Duration, usize, Step)> = Vec::new();
    for (i, f) in round.faults.iter().enumerate() {
        steps.push((f.at, i, Step::Start));
        if let Kind::LinkFlap { flaps, .. } = f.kind {
            // Down and up `flaps` times, evenly over the fault's length;
            // the start took it down the first time.
            let changes = 2 * flaps;
            for n in 1..changes {
                steps.push((f.at + f.len * n / changes, i, Step::Flap(n)));
            }
        }
        steps.push((f.end(), i, Step::End));
    }
    steps.sort_by_key(|&(t, i, s)| (t, s == Step::Start, i));
    let t0 = Instant::now();
    let mut wire = Wire::default();
    let mut applied: Vec<Applied> = round
        .faults
        .iter()
        .map(|f| Applied {
            round: index,
            fault: f.clone(),
            start: t0,
            end: t0,
            note: None,
        })
        .collect();
    for (at, i, step) in steps {
        let due = t0 + at;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let fault = &round.faults[i];
        let now = Instant::now();
        match step {
            Step::Start => {
                applied[i].start = now;
                let note = start(bed, &mut wire, i, fault);
                say(format!(
                    "round {index} +{:.3}s start {}{}",
                    now.duration_since(t0).as_secs_f64(),
                    fault,
                    note.as_deref()
                        .map(|n| format!(" ({n})"))
                        .unwrap_or_default()
                ));
                applied[i].note = note;
            }
            Step::Flap(n) => {
                if let Kind::LinkFlap { node, .. } = &fault.kind {
                    port(bed, &mut wire, node, n % 2 == 0);
                }
            }
            Step::End => {
                end(bed, &mut wire, i, fault);
                applied[i].end = Instant::now();
                if fault.len > Duration::from_millis(1) {
                    say(format!(
                        "round {index} +{:.3}s end   {}",
                        now.duration_since(t0).as_secs_f64(),
                        fault.kind.name()
                    ));
                }
            }
        }
    }
    applied
}

/// Takes `node`'s port down (`down`) or lets it up when no other fault
/// wants it down.
fn port(bed: &Bed, wire: &mut Wire, node: &str, down: bool) {
    let n = wire.down.entry(node.to_string()).or_insert(0);
    if down {
        *n += 1;
        if *n == 1 {
            let _ = bed.lan.set_port(node, false);
        }
    } else {
        *n = n.saturating_sub(1);
        if *n == 0 {
            let _ = bed.lan.set_port(node, true);
        }
    }
}

fn links(bed: &Bed, wire: &Wire, node: &str) {
    let faults = wire
        .lossy
        .get(node)
        .and_then(|v| v.last())
        .map(|(_, f)| f.clone())
        .unwrap_or_default();
    let switch = bed.lan.wire.as_ref().expect("a switched LAN");
    switch.set(node, Dir::FromHost, faults.clone());
    switch.set(node, Dir::ToHost, faults);
}

fn rest<'a>(bed: &'a Bed, side: &[String]) -> Vec<&'a str> {
    bed.nodes
        .iter()
        .filter(|n| !side.contains(n))
        .map(String::as_str)
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn start(bed: &Bed, wire: &mut Wire, i: usize, fault: &Fault) -> Option<String> {
    let switch = bed.lan.wire.as_ref().expect("a switched LAN");
    let unit = |node: &str| &bed.units[node];
    match &fault.kind {
        Kind::HostGone { node } | Kind::LinkFlap { node, .. } => port(bed, wire, node, true),
        Kind::Stall { node } => unit(node).send(Order::Stop),
        Kind::KillCleanup { node } => unit(node).send(Order::Kill {
            cleanup: true,
            restart: true,
        }),
        Kind::KillNoCleanup { node, restart } => unit(node).send(Order::Kill {
            cleanup: false,
            restart: *restart,
        }),
        Kind::Upgrade { node } => unit(node).send(Order::Restart),
        Kind::Reload { node } => unit(node).send(Order::Reload),
        Kind::Lossy { node, faults } => {
            wire.lossy
                .entry(node.clone())
                .or_default()
                .push((i, faults.clone()));
            links(bed, wire, node);
        }
        Kind::OneWay { sides } => {
            let id = switch.cut(&strs(&sides.from), &strs(&sides.to), false);
            wire.cuts.insert(i, vec![id]);
        }
        Kind::Partition { side } | Kind::GossipCut { side } => {
            let gossip = matches!(fault.kind, Kind::GossipCut { .. });
            let others = rest(bed, side);
            let ids = vec![
                switch.cut(&strs(side), &others, gossip),
                switch.cut(&others, &strs(side), gossip),
            ];
            wire.cuts.insert(i, ids);
        }
        Kind::ApiOutage => {
            let nodes = strs(&bed.nodes);
            let ids = vec![
                switch.cut(&["api"], &nodes, false),
                switch.cut(&nodes, &["api"], false),
            ];
            wire.cuts.insert(i, ids);
        }
        Kind::AddrDel { index, ipv6 } => {
            let ip: IpAddr = bed.pool[index + if *ipv6 { bed.pool_size } else { 0 }];
            for n in &bed.nodes {
                if let Some((_, len, dev)) =
                    bed.kernel_vips(n).into_iter().find(|(a, _, _)| *a == ip)
                {
                    let r = bed
                        .lan
                        .host(n)
                        .ns
                        .ip(&format!("addr del {ip}/{len} dev {dev}"));
                    return Some(match r {
                        Ok(_) => format!("{ip} deleted on {n}"),
                        Err(e) => format!("{ip} on {n}: {e}"),
                    });
                }
            }
            return Some(format!("nobody held {ip}"));
        }
        Kind::Churn(c) => {
            let r = match c {
                Churn::Create {
                    name,
                    local,
                    endpoints,
                } => bed.create_service(name, *local, endpoints),
                Churn::Delete { name } => bed.delete_service(name),
                Churn::Ports { name, port } => bed.service_port(name, *port),
                Churn::Endpoints { name, endpoints } => bed.endpoints(name, endpoints),
            };
            return r.err().map(|e| format!("refused: {}", e.trim()));
        }
        Kind::Drain { node } => return bed.drain(node, true).err(),
        Kind::Preference { weights } => return bed.preferences(weights).err(),
    }
    None
}

fn end(bed: &Bed, wire: &mut Wire, i: usize, fault: &Fault) {
    let switch = bed.lan.wire.as_ref().expect("a switched LAN");
    match &fault.kind {
        Kind::HostGone { node } => port(bed, wire, node, false),
        // Its last change (odd) brought the port up already.
        Kind::LinkFlap { .. } => {}
        Kind::Stall { node } => bed.units[node].send(Order::Cont),
        Kind::KillNoCleanup {
            node,
            restart: false,
        } => bed.units[node].send(Order::Release),
        Kind::Lossy { node, .. } => {
            if let Some(v) = wire.lossy.get_mut(node) {
                v.retain(|(j, _)| *j != i);
            }
            links(bed, wire, node);
        }
        Kind::OneWay { .. } | Kind::Partition { .. } | Kind::GossipCut { .. } | Kind::ApiOutage => {
            for id in wire.cuts.remove(&i).unwrap_or_default() {
                switch.heal(id);
            }
        }
        Kind::Drain { node } => {
            let _ = bed.drain(node, false);
        }
        _ => {}
    }
}
