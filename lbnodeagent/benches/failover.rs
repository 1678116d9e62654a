//! hostlb against keepalived on the same wire, through the same faults, as
//! a client sees it: an IPv4 VIP probed by ARP and an IPv6 VIP by neighbour
//! solicitation every 10 ms (see `tests/cluster/failover.rs`).
//!
//! ```sh
//! cargo bench -p lbnodeagent --bench failover                # 5 runs, writes docs/benchmarks.md
//! FAILOVER_RUNS=1 FAILOVER_ONLY=hostlb cargo bench -p lbnodeagent --bench failover
//! FAILOVER_ONLY="keepalived (advert_int 0.1" ...            # rows whose subject starts so
//! FAILOVER_FAULT="SIGKILL +" ...                               # faults whose name starts so
//! FAILOVER_LOSS=5 ...          # each node drops 5% of its datagrams (UDP, VRRP) both ways
//! ```
//!
//! Needs root, keepalived (`apt-get install keepalived`), kubectl, python3.

#[path = "../tests/cluster/mod.rs"]
mod cluster;

use std::fmt::Write as _;
use std::time::Duration;

use cluster::failover::{Bed, FAULTS, Fault, IDLE, Sample, Subject, stats};

fn main() {
    hostlb_tests::netns::require_root();
    let runs: usize = std::env::var("FAILOVER_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let only = std::env::var("FAILOVER_ONLY").unwrap_or_default();
    let only_fault = std::env::var("FAILOVER_FAULT").unwrap_or_default();
    let loss: u32 = std::env::var("FAILOVER_LOSS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let window = Duration::from_secs(
        std::env::var("FAILOVER_WINDOW_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    let subjects = [
        Subject::Hostlb { lifetime_s: 6 },
        Subject::Keepalived { advert_ms: 1000 },
        Subject::Keepalived { advert_ms: 100 },
    ];
    let mut table = String::new();
    let _ = writeln!(
        table,
        "| subject | fault | family | takeover ms (min / median / max) | outage ms | lost probes | two MACs answer, ms |"
    );
    let _ = writeln!(table, "|---|---|---|---|---|---|---|");
    let mut at_rest = String::new();
    for subject in subjects {
        if !subject.to_string().starts_with(only.as_str()) {
            continue;
        }
        for fault in FAULTS {
            if !fault.to_string().starts_with(only_fault.as_str()) {
                continue;
            }
            let mut per_family: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
            for run in 0..runs {
                eprintln!("{subject}: {fault}, run {}/{runs}", run + 1);
                let bed = Bed::new(subject);
                bed.lossy(loss);
                let watch = if fault == Fault::Idle { IDLE } else { window };
                let Some(samples) = bed.measure(fault, watch) else {
                    break;
                };
                for (i, s) in samples.into_iter().enumerate() {
                    per_family[i].push(s);
                }
            }
            let cpu: Vec<f64> = per_family[0].iter().filter_map(|s| s.idle_cpu).collect();
            if !cpu.is_empty() {
                let mut sorted = cpu.clone();
                sorted.sort_by(f64::total_cmp);
                let line = format!(
                    "| {subject} | {:.2}% / {:.2}% / {:.2}% |",
                    sorted[0] * 100.0,
                    sorted[sorted.len() / 2] * 100.0,
                    sorted[sorted.len() - 1] * 100.0
                );
                println!("CPU per host at rest: {line}");
                let _ = writeln!(at_rest, "{line}");
            }
            for (family, samples) in ["IPv4", "IPv6"].iter().zip(&per_family) {
                if samples.is_empty() {
                    continue;
                }
                let takeover: Vec<Option<Duration>> = samples.iter().map(|s| s.takeover).collect();
                let outage: Vec<Option<Duration>> =
                    samples.iter().map(|s| Some(s.outage)).collect();
                let lost: Vec<Option<Duration>> = samples
                    .iter()
                    .map(|s| Some(Duration::from_millis(s.lost)))
                    .collect();
                let two: Vec<Option<Duration>> = samples.iter().map(|s| s.two_owners).collect();
                let takeover = if takeover.iter().any(Option::is_none) {
                    format!(
                        "none in {} runs",
                        takeover.iter().filter(|t| t.is_none()).count()
                    )
                } else {
                    stats(&takeover)
                };
                let line = format!(
                    "| {subject} | {fault} | {family} | {takeover} | {} | {} | {} |",
                    stats(&outage),
                    stats(&lost),
                    stats(&two)
                );
                println!("{line}");
                let _ = writeln!(table, "{line}");
            }
        }
    }
    if runs >= 5 && only.is_empty() && only_fault.is_empty() && loss == 0 {
        write_docs(&table, &at_rest, runs, window);
    }
}

fn write_docs(table: &str, at_rest: &str, runs: usize, window: Duration) {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let keepalived = std::process::Command::new("keepalived")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    let window_s = window.as_secs();
    let text = format!(
        r#"# Failover: hostlb and keepalived on the same wire

Written by `cargo bench -p lbnodeagent --bench failover` (as root; needs
keepalived, kubectl and python3), which reproduces it.

**Setup.** Three hosts and a client on one Linux bridge, each in its own
network namespace on one machine ({cpu}, {cores} cores, kernel
{kernel}). The client sends a broadcast ARP request for the IPv4 VIP and a
neighbour solicitation for the IPv6 VIP every 10 ms and records which MAC
answers each. One fault hits the host that answers; the client's replies
are judged for {window_s} s after it. {runs} runs per row, each on a fresh
cluster.

- **hostlb**: three `lbnodeagent`s (release build), the test API server, an L2Advertisement preferring the
  first host (weight 50), `address_lifetime = 6s`, gossip every 100 ms.
- **keepalived** ({keepalived}): VRRP, priorities 150/100/50, one instance
  per family, `advert_int` 1 s (VRRPv2) and 0.1 s (VRRPv3),
  `vrrp_garp_master_delay 0`.

**Columns.** *Takeover*: from the fault to the first answer from another
host (none: the old owner kept answering through the window). *Outage*:
the longest time nobody answered. *Lost probes*: requests in that gap.
*Two MACs answer*: the probe periods answered by more than one MAC, in ms;
*forever* when the old owner and another still both answered at the end of
the window (keepalived's master keeps the address when its daemon dies or
freezes). Min / median / max over the runs.

**Faults.** *SIGKILL + cleanup*: the agent killed and `lbnodeagent cleanup`
run after it, as systemd's `ExecStopPost=` does (hostlb only). *SIGKILL*:
the daemon killed, nothing else (for keepalived, its VRRP child too).
*SIGTERM*: a planned stop. *announce link down*: `ip link set eth0 down` on
the owner. *switch port down*: the owner cut off. *SIGSTOP*: the daemon
frozen. *none (idle 60 s)*: no fault, watched for 60 s: any takeover there
is spurious.

{table}
**At rest** (the idle row): the CPU each host's daemon used while it
served the two VIPs, as a share of one core (all its processes and
threads), min / median / max over the runs.

| subject | CPU per host |
|---|---|
{at_rest}
**Reading it.**

- *A host really gone* (its switch port or its link down): hostlb's owner
  sessions against VRRP's master-down interval (three advertisements plus
  skew). The node next in line for the owner's VIPs hears a signed beat
  from it every 25 ms; after 150 ms of silence it asks the LAN twice in
  30 ms and, with no answer, adds the address. IPv4 and IPv6 take the
  same path.
- *The agent killed under systemd* (SIGKILL + cleanup): `cleanup` sends a
  signed leaving beat, the next node adds the address at once, and
  `cleanup` removes the old one when the new owner answers on the wire.
- *The daemon dies or freezes and the host stays up* (SIGKILL, SIGSTOP, no
  service manager): the old owner's kernel keeps answering. keepalived's
  backup takes the address as well, and both answer until someone steps
  in. hostlb's peers hear the old host answer and stay off until its
  address lapses (`address_lifetime`, 6 s here; its beats said when), then
  the next node answers within tens of milliseconds: the takeover is the
  lifetime, the outage is that short gap.
- *A planned stop* (SIGTERM): hostlb hands over make-before-break (both
  answer for a moment, no probe lost); keepalived sends a priority-0
  advertisement and its backup takes over after a gap.
"#
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/benchmarks.md");
    std::fs::write(&path, text).expect("write docs/benchmarks.md");
    eprintln!("wrote {}", path.display());
}
