//! Gossip figures behind the shipped defaults (see `gossip/mod.rs`).
//!
//! `cargo bench -p lbnodeagent --bench gossip` prints, at the defaults:
//! - crash and graceful-leave detection over loopback UDP with the
//!   authenticated transport, 3 agents, median and max over the runs;
//! - stability: spurious member removals in a 10-agent cluster: idle, with
//!   four busy threads competing for the two cores, and with 10% of
//!   messages dropped;
//! - gossip bandwidth per node at 10 and 100 members (chitchat's in-memory
//!   transport, paused clock, bytes counted per socket).
//!
//! Environment: `GOSSIP_BENCH_RUNS` (default 12); `GOSSIP_BENCH_SWEEP` adds
//! the sweep used to choose the defaults (`1` for the built-in grid, or a
//! list such as `100:6,200:4` of interval-ms:phi); `GOSSIP_BENCH_QUICK=1`
//! shortens everything (a smoke run).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chitchat::transport::{ChannelTransport, Transport, TransportExt};
use lbnodeagent::election::OnLink;
use lbnodeagent::gossip::counting::CountingTransport;
use lbnodeagent::gossip::frame::OVERHEAD;
use lbnodeagent::gossip::{
    AuthTransport, DEFAULT_INTERVAL, DEFAULT_PHI_THRESHOLD, DEFAULT_REPLAY_WINDOW, GossipConfig,
    GossipKeys, LocalState, MemProbes, Membership, ProbeLink, ProbeNet, ProbeSend, Status,
};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use tokio::time::Instant;

const KEY: [u8; 32] = [0x42; 32];
/// IPv4 + UDP headers, per datagram on the wire.
const IP_UDP_HEADERS: u64 = 28;

#[derive(Clone, Copy, Debug)]
struct Tuning {
    interval: Duration,
    phi: f64,
}

impl Tuning {
    fn shipped() -> Tuning {
        Tuning {
            interval: DEFAULT_INTERVAL,
            phi: DEFAULT_PHI_THRESHOLD,
        }
    }

    fn config(&self, name: &str, addr: SocketAddr, seed: Option<SocketAddr>) -> GossipConfig {
        let mut config = GossipConfig::for_test(name, addr);
        config.interval = self.interval;
        config.phi_threshold = self.phi;
        config.seeds = seed.iter().map(SocketAddr::to_string).collect();
        config
    }
}

impl std::fmt::Display for Tuning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "interval {:?}, phi {}", self.interval, self.phi)
    }
}

fn free_addr() -> SocketAddr {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A node's state as in a small production cluster: one v4 and one v6
/// on-link prefix, ten held VIPs, the announce interface's MAC.
fn realistic_state(n: u32) -> LocalState {
    let third = (n % 250) as u8;
    LocalState {
        status: Status::Alive,
        virtual_mode: true,
        on_link: vec![
            OnLink {
                prefix: "192.168.10.0/24".parse().unwrap(),
                interface: "eth0".into(),
                announce: true,
                upstream_lost: false,
            },
            OnLink {
                prefix: "2001:db8:10::/64".parse().unwrap(),
                interface: "eth0".into(),
                announce: true,
                upstream_lost: false,
            },
        ]
        .into(),
        vips: (0..10u8)
            .map(|i| IpAddr::from([10, 96, third, i]))
            .collect::<BTreeSet<_>>()
            .into(),
        macs: [lbnodeagent::addrs::MacAddr([
            2,
            0,
            (n >> 16) as u8,
            (n >> 8) as u8,
            n as u8,
            1,
        ])]
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into(),
        revision: 0,
        digest: None,
        drained: false,
        behind: Default::default(),
    }
}

/// Drops a fraction of the failure detector's messages on send, as
/// `drop_message` does for chitchat's.
struct Lossy {
    inner: AuthTransport,
    loss: f64,
}

struct LossySend {
    inner: Arc<dyn ProbeSend>,
    loss: f64,
    rng: std::sync::Mutex<SmallRng>,
}

impl ProbeSend for LossySend {
    fn send(&self, to: SocketAddr, payload: &[u8]) {
        if !self.rng.lock().unwrap().random_bool(self.loss) {
            self.inner.send(to, payload);
        }
    }
}

impl ProbeNet for Lossy {
    fn attach(&self, listen: SocketAddr) -> Result<ProbeLink, String> {
        let link = self.inner.attach(listen)?;
        Ok(ProbeLink {
            send: Arc::new(LossySend {
                inner: link.send,
                loss: self.loss,
                rng: std::sync::Mutex::new(SmallRng::seed_from_u64(listen.port().into())),
            }),
            recv: link.recv,
        })
    }
}

async fn udp_cluster(n: usize, tuning: Tuning) -> Vec<Membership> {
    udp_cluster_with(n, tuning, 0.0).await
}

/// `loss`: fraction of messages each node drops on send.
async fn udp_cluster_with(n: usize, tuning: Tuning, loss: f64) -> Vec<Membership> {
    let first = free_addr();
    let mut nodes = Vec::new();
    for i in 0..n {
        let addr = if i == 0 { first } else { free_addr() };
        let seed = (i > 0).then_some(first);
        let config = tuning.config(&format!("n{i:03}"), addr, seed);
        let auth = AuthTransport::new(
            GossipKeys::from_keys(&[KEY]).unwrap(),
            DEFAULT_REPLAY_WINDOW,
        );
        let probes = Lossy {
            inner: auth.clone(),
            loss,
        };
        let transport: Box<dyn Transport> = if loss > 0.0 {
            auth.drop_message(loss)
        } else {
            Box::new(auth)
        };
        nodes.push(
            Membership::start(
                &config,
                realistic_state(i as u32),
                transport.as_ref(),
                &probes,
            )
            .await
            .unwrap(),
        );
    }
    for node in &nodes {
        let mut views = node.views();
        tokio::time::timeout(
            Duration::from_secs(20),
            views.wait_for(|v| v.members.len() == n),
        )
        .await
        .expect("cluster forms")
        .unwrap();
    }
    nodes
}

/// Time until every survivor's view has dropped `name`.
async fn until_dropped(survivors: &[Membership], name: &str, limit: Duration) -> Option<Duration> {
    let started = Instant::now();
    for node in survivors {
        let mut views = node.views();
        let left = limit.checked_sub(started.elapsed())?;
        tokio::time::timeout(left, views.wait_for(|v| v.member(name).is_none()))
            .await
            .ok()?
            .ok()?;
    }
    Some(started.elapsed())
}

struct Summary {
    samples: Vec<Duration>,
    failures: usize,
}

impl Summary {
    fn new() -> Summary {
        Summary {
            samples: Vec::new(),
            failures: 0,
        }
    }

    fn add(&mut self, sample: Option<Duration>) {
        match sample {
            Some(d) => self.samples.push(d),
            None => self.failures += 1,
        }
    }

    fn line(&mut self) -> String {
        self.samples.sort();
        let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1e3);
        if self.samples.is_empty() {
            return format!("no sample ({} timed out)", self.failures);
        }
        let n = self.samples.len();
        let median = if n % 2 == 1 {
            self.samples[n / 2]
        } else {
            (self.samples[n / 2 - 1] + self.samples[n / 2]) / 2
        };
        format!(
            "median {}, min {}, max {} over {} runs{}",
            ms(median),
            ms(self.samples[0]),
            ms(self.samples[n - 1]),
            n,
            if self.failures > 0 {
                format!(", {} TIMED OUT", self.failures)
            } else {
                String::new()
            }
        )
    }
}

/// Crash (drop without leaving) and graceful leave of the third of three
/// agents, each on a fresh cluster warmed up for `warmup`.
async fn detection(
    tuning: Tuning,
    runs: usize,
    warmup: Duration,
) -> (Summary, Summary, Vec<Duration>) {
    let mut crash = Summary::new();
    let mut leave = Summary::new();
    let mut timeouts = Vec::new();
    for _ in 0..runs {
        let mut nodes = udp_cluster(3, tuning).await;
        tokio::time::sleep(warmup).await;
        let victim = nodes.pop().unwrap();
        let id = victim.chitchat_id().clone();
        if let Some(t) = nodes[0]
            .chitchat()
            .lock()
            .await
            .failure_detection_timeout(&id)
        {
            timeouts.push(t);
        }
        drop(victim);
        crash.add(until_dropped(&nodes, "n002", Duration::from_secs(10)).await);
        drop(nodes);

        let mut nodes = udp_cluster(3, tuning).await;
        tokio::time::sleep(warmup).await;
        let victim = nodes.pop().unwrap();
        let started = Instant::now();
        let task = tokio::spawn(victim.leave());
        let dropped = until_dropped(&nodes, "n002", Duration::from_secs(10)).await;
        leave.add(dropped.map(|_| started.elapsed()));
        let _ = task.await;
    }
    (crash, leave, timeouts)
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stress {
    Idle,
    /// Four spinning threads on the two cores.
    Busy,
    /// 10% of messages dropped.
    Lossy,
}

/// Member removals seen by any node of an `n`-node cluster over `period`,
/// though nobody left: false positives of the failure detector.
async fn spurious_removals(n: usize, tuning: Tuning, period: Duration, stress: Stress) -> usize {
    let loss = if stress == Stress::Lossy { 0.1 } else { 0.0 };
    let nodes = udp_cluster_with(n, tuning, loss).await;
    let stop = Arc::new(AtomicBool::new(false));
    let hogs: Vec<_> = (0..if stress == Stress::Busy { 4 } else { 0 })
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    let mut watchers = Vec::new();
    for node in &nodes {
        let mut views = node.views();
        watchers.push(tokio::spawn(async move {
            let mut removals = 0;
            let mut last = views.borrow().members.len();
            while views.changed().await.is_ok() {
                let now = views.borrow().members.len();
                if now < last {
                    removals += last - now;
                }
                last = now;
            }
            removals
        }));
    }
    tokio::time::sleep(period).await;
    stop.store(true, Ordering::Relaxed);
    for hog in hogs {
        hog.join().unwrap();
    }
    drop(nodes);
    let mut total = 0;
    for watcher in watchers {
        total += watcher.await.unwrap();
    }
    total
}

/// Bytes per second per node, in a paused-clock in-memory cluster.
fn bandwidth(n: usize, interval: Duration, measure: Duration) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async move {
        let transport = CountingTransport::new(ChannelTransport::default());
        let probes = MemProbes::default();
        let addr = |i: usize| SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 7934));
        let mut nodes = Vec::new();
        for i in 0..n {
            let mut config = GossipConfig::for_test(&format!("node-{i:03}"), addr(i));
            config.interval = interval;
            config.seeds = vec![addr(0).to_string()];
            nodes.push(
                Membership::start(&config, realistic_state(i as u32), &transport, &probes)
                    .await
                    .unwrap(),
            );
        }
        for node in &nodes {
            let mut views = node.views();
            tokio::time::timeout(Duration::from_secs(120), views.wait_for(|v| v.members.len() == n))
                .await
                .expect("in-memory cluster forms")
                .unwrap();
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
        transport.reset();
        probes.reset();
        tokio::time::sleep(measure).await;
        let traffic = transport.traffic();
        let probe_sent: Vec<(u64, u64)> = (0..n).map(|i| probes.sent(addr(i))).collect();
        let secs = measure.as_secs_f64();
        let sent: Vec<f64> = traffic.values().map(|t| t.bytes_sent as f64 / secs).collect();
        let frame = OVERHEAD as u64 + IP_UDP_HEADERS;
        let probe_wire: f64 =
            probe_sent.iter().map(|(d, b)| (b + d * frame) as f64).sum::<f64>() / n as f64 / secs;
        let wire: Vec<f64> = traffic
            .values()
            .map(|t| (t.bytes_sent + t.messages_sent * frame) as f64 / secs + probe_wire)
            .collect();
        let msgs: f64 = (traffic.values().map(|t| t.messages_sent).sum::<u64>()
            + probe_sent.iter().map(|(d, _)| d).sum::<u64>()) as f64
            / n as f64
            / secs;
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let max = |v: &[f64]| v.iter().cloned().fold(0.0, f64::max);
        // The failure detector's current timeout for every peer, at node 0:
        // how it scales with cluster size (more relays, shorter intervals).
        let timeouts: Vec<f64> = {
            let chitchat = nodes[0].chitchat();
            let c = chitchat.lock().await;
            let ids: Vec<_> = c.live_nodes().cloned().collect();
            ids.iter()
                .filter_map(|id| c.failure_detection_timeout(id))
                .map(|t| t.as_secs_f64() * 1e3)
                .collect()
        };
        drop(nodes);
        format!(
            "{n:>3} members @ {interval:?}: sent per node {:>8.0} B/s mean, {:>8.0} max (chitchat payload); \
             {:>8.0} B/s mean on the wire with the failure detector's {probe_wire:.0} (+{OVERHEAD} B frame, +{IP_UDP_HEADERS} B IPv4/UDP per datagram); \
             {msgs:.1} datagrams/s; received ≈ sent; detector timeout {:.0} ms mean, {:.0} ms min",
            mean(&sent),
            max(&sent),
            mean(&wire),
            mean(&timeouts),
            timeouts.iter().cloned().fold(f64::INFINITY, f64::min),
        )
    })
}

fn main() {
    let quick = std::env::var_os("GOSSIP_BENCH_QUICK").is_some();
    let runs: usize = std::env::var("GOSSIP_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(if quick { 3 } else { 12 });
    let sweep: Vec<Tuning> = match std::env::var("GOSSIP_BENCH_SWEEP") {
        Err(_) => Vec::new(),
        Ok(list) if list == "1" => [
            (100, 6.0),
            (100, 8.0),
            (200, 3.0),
            (200, 4.0),
            (200, 6.0),
            (200, 8.0),
        ]
        .iter()
        .map(|&(ms, phi)| Tuning {
            interval: Duration::from_millis(ms),
            phi,
        })
        .collect(),
        Ok(list) => list
            .split(',')
            .map(|pair| {
                let (ms, phi) = pair.split_once(':').expect("interval-ms:phi");
                Tuning {
                    interval: Duration::from_millis(ms.trim().parse().expect("interval in ms")),
                    phi: phi.trim().parse().expect("phi"),
                }
            })
            .collect(),
    };
    let warmup = if quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    let stability = if quick {
        Duration::from_secs(5)
    } else {
        Duration::from_secs(30)
    };
    let measure = if quick {
        Duration::from_secs(10)
    } else {
        Duration::from_secs(60)
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let shipped = Tuning::shipped();
    println!("gossip bench: shipped defaults {shipped}");
    runtime.block_on(async {
        let (mut crash, mut leave, timeouts) = detection(shipped, runs, warmup).await;
        println!("3 agents, loopback UDP, authenticated:");
        println!("  crash detected by both survivors: {}", crash.line());
        println!("  leave detected by both survivors: {}", leave.line());
        if !timeouts.is_empty() {
            let mean = timeouts.iter().sum::<Duration>() / timeouts.len() as u32;
            println!("  chitchat failure_detection_timeout before the crash: mean {mean:?}");
        }
        for stress in [Stress::Idle, Stress::Busy, Stress::Lossy] {
            let removals = spurious_removals(10, shipped, stability, stress).await;
            println!(
                "10 agents for {stability:?}, {stress:?}: {removals} spurious member removals"
            );
        }
    });
    for n in [3, 10, 100] {
        println!("{}", bandwidth(n, shipped.interval, measure));
    }

    if !sweep.is_empty() {
        println!(
            "\nsweep: crash and leave over {runs} runs; spurious removals in 10 agents over {stability:?} busy / lossy"
        );
    }
    for tuning in sweep {
        runtime.block_on(async {
            let (mut crash, mut leave, timeouts) = detection(tuning, runs, warmup).await;
            let busy = spurious_removals(10, tuning, stability, Stress::Busy).await;
            let lossy = spurious_removals(10, tuning, stability, Stress::Lossy).await;
            let mean = if timeouts.is_empty() {
                Duration::ZERO
            } else {
                timeouts.iter().sum::<Duration>() / timeouts.len() as u32
            };
            println!("  {tuning}: detector timeout {mean:.0?}, spurious {busy} / {lossy}");
            println!("    crash {}", crash.line());
            println!("    leave {}", leave.line());
        });
    }
}
