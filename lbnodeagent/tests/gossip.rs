//! Gossip membership end to end: agents on loopback UDP with the
//! authenticated transport, and on chitchat's in-memory `ChannelTransport`
//! with paused time for the timing rules. Bounds here are generous so CI is
//! not flaky; `cargo bench -p lbnodeagent --bench gossip` measures the real
//! figures.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use chitchat::transport::ChannelTransport;
use hostlb_tests::unique_loopback;
use lbnodeagent::election::OnLink;
use lbnodeagent::gossip::counting::CountingTransport;
use lbnodeagent::gossip::frame::{self, Header};
use lbnodeagent::gossip::{
    AuthCounters, AuthTransport, DEFAULT_INTERVAL, DEFAULT_REPLAY_WINDOW, GossipConfig, GossipKeys,
    KEY_STATUS, LocalState, MemProbes, Membership, MembershipView, Status, WallClock,
};
use tokio::time::Instant;

const KEY_A: [u8; 32] = [0xa1; 32];
const KEY_B: [u8; 32] = [0xb2; 32];
const KEY_X: [u8; 32] = [0x99; 32];

fn local_state(n: u8) -> LocalState {
    LocalState {
        status: Status::Alive,
        virtual_mode: false,
        on_link: vec![OnLink {
            prefix: format!("10.0.{n}.0/24").parse().unwrap(),
            interface: "eth0".into(),
            announce: true,
            upstream_lost: false,
        }]
        .into(),
        vips: BTreeSet::from([IpAddr::from([10, 0, n, 100])]).into(),
        macs: BTreeSet::from([lbnodeagent::addrs::MacAddr([2, 0, 0, 0, 0, n])]).into(),
        revision: 0,
        digest: None,
        drained: false,
        behind: Default::default(),
    }
}

struct Agent {
    name: String,
    addr: SocketAddr,
    membership: Membership,
    counters: Arc<AuthCounters>,
}

async fn start(name: &str, addr: SocketAddr, seeds: &[SocketAddr], keys: &[[u8; 32]]) -> Agent {
    let mut config = GossipConfig::for_test(name, addr);
    config.seeds = seeds.iter().map(SocketAddr::to_string).collect();
    let transport = AuthTransport::new(GossipKeys::from_keys(keys).unwrap(), DEFAULT_REPLAY_WINDOW);
    let counters = transport.counters();
    let membership = Membership::start(
        &config,
        local_state(addr.port() as u8),
        &transport,
        &transport,
    )
    .await
    .unwrap();
    Agent {
        name: name.to_string(),
        addr,
        membership,
        counters,
    }
}

async fn cluster(names: &[&str], keys: &[[u8; 32]]) -> Vec<Agent> {
    let first = unique_loopback();
    let mut agents = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let addr = if i == 0 { first } else { unique_loopback() };
        let seeds = if i == 0 { vec![] } else { vec![first] };
        agents.push(start(name, addr, &seeds, keys).await);
    }
    for agent in &agents {
        wait_members(agent, names, Duration::from_secs(5)).await;
    }
    agents
}

fn members(view: &MembershipView) -> Vec<String> {
    view.members.iter().map(|m| m.node.to_string()).collect()
}

/// Waits until `agent`'s view satisfies `pred`; returns how long it took.
async fn wait_view(
    agent: &Agent,
    within: Duration,
    what: &str,
    pred: impl Fn(&MembershipView) -> bool,
) -> Duration {
    let started = Instant::now();
    let mut views = agent.membership.views();
    match tokio::time::timeout(within, views.wait_for(|v| pred(v))).await {
        Ok(Ok(_)) => started.elapsed(),
        _ => panic!(
            "{}: not {what} within {within:?}; view: {:?}",
            agent.name,
            members(&agent.membership.view())
        ),
    }
}

/// Polls `done` (on tokio time) for things that do not change the view.
async fn wait_until(within: Duration, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "not {what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_members(agent: &Agent, names: &[&str], within: Duration) -> Duration {
    let mut want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    want.sort();
    wait_view(agent, within, &format!("members {want:?}"), |v| {
        members(v) == want
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_form_a_cluster_and_see_each_others_state() {
    let agents = cluster(&["a", "b", "c"], &[KEY_A]).await;
    let view = agents[0].membership.view();
    let c = view.node("c").expect("a sees c");
    assert_eq!(c.gossip_addr, agents[2].addr);
    assert_eq!(c.vips, local_state(agents[2].addr.port() as u8).vips);
    assert_eq!(c.macs, local_state(agents[2].addr.port() as u8).macs);
    assert_eq!(c.agent_version, lbnodeagent::VERSION);
    assert!(
        c.agent_version
            .starts_with(concat!(env!("CARGO_PKG_VERSION"), "+"))
    );
    let member = view.member("c").unwrap();
    assert_eq!(
        member.on_link,
        local_state(agents[2].addr.port() as u8).on_link
    );
    assert_eq!(view.local.node, "a");

    // A published change reaches the others.
    let mut changed = local_state(7);
    std::sync::Arc::make_mut(&mut changed.vips).insert("10.9.9.9".parse().unwrap());
    agents[2].membership.publish(changed.clone()).await;
    for agent in &agents[..2] {
        wait_view(agent, Duration::from_secs(3), "c's new VIPs", |v| {
            v.node("c").is_some_and(|c| c.vips == changed.vips)
        })
        .await;
    }
    for agent in &agents {
        let stats = agent.counters.snapshot();
        assert!(stats.messages_accepted > 0);
        assert_eq!(stats.dropped(), 0, "{}: {stats:?}", agent.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_agent_is_dropped_within_bounds() {
    let mut agents = cluster(&["a", "b", "c"], &[KEY_A]).await;
    let crashed = agents.pop().unwrap();
    drop(crashed.membership); // no leave: as a crash
    let mut slowest = Duration::ZERO;
    for agent in &agents {
        let took = wait_members(agent, &["a", "b"], Duration::from_secs(3)).await;
        slowest = slowest.max(took);
    }
    eprintln!("crash detected after {slowest:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaving_agent_is_dropped_at_once_and_sees_the_handover() {
    let mut agents = cluster(&["a", "b", "c"], &[KEY_A]).await;
    let leaving = agents.pop().unwrap();
    let started = Instant::now();
    leaving.membership.set_leaving().await;
    for agent in &agents {
        wait_members(agent, &["a", "b"], Duration::from_secs(1)).await;
        // Still gossiping: present as a node, marked leaving.
        assert_eq!(
            agent.membership.view().node("c").map(|n| n.status),
            Some(Status::Leaving)
        );
    }
    let detected = started.elapsed();
    // The leaving node keeps a live view of the others: it can watch its
    // VIPs being taken over before it lets go of them.
    wait_members(&leaving, &["a", "b"], Duration::from_secs(1)).await;
    assert_eq!(leaving.membership.view().local.status, Status::Leaving);
    // publish() cannot undo leaving.
    leaving.membership.publish(local_state(9)).await;
    let status = leaving
        .membership
        .chitchat()
        .lock()
        .await
        .self_node_state()
        .get(KEY_STATUS)
        .map(str::to_string);
    assert_eq!(status.as_deref(), Some("leaving"));
    tokio::time::timeout(Duration::from_secs(3), leaving.membership.leave())
        .await
        .expect("leave finishes")
        .unwrap();
    eprintln!("leave detected after {detected:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leave_is_detected_within_a_second() {
    let mut agents = cluster(&["a", "b", "c"], &[KEY_A]).await;
    let leaving = agents.pop().unwrap();
    let task = tokio::spawn(leaving.membership.leave());
    for agent in &agents {
        wait_members(agent, &["a", "b"], Duration::from_secs(1)).await;
    }
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_forgeries_are_dropped_and_counted() {
    // A spy that a lone agent probes as a run-time seed: it captures one
    // genuine frame to tamper with.
    let spy = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let spy_addr = spy.local_addr().unwrap();
    let a_addr = unique_loopback();
    let a = start("a", a_addr, &[], &[KEY_A]).await;
    a.membership.set_seeds([spy_addr]);
    let mut buf = vec![0u8; 65_536];
    let (len, _) = tokio::time::timeout(Duration::from_secs(3), spy.recv_from(&mut buf))
        .await
        .expect("a probes its seed")
        .unwrap();
    let genuine = buf[..len].to_vec();
    a.membership.set_seeds([]);
    let b = start("b", unique_loopback(), &[a_addr], &[KEY_A]).await;
    let c = start("c", unique_loopback(), &[a_addr], &[KEY_A]).await;
    let agents = [a, b, c];
    for agent in &agents {
        wait_members(agent, &["a", "b", "c"], Duration::from_secs(5)).await;
    }
    let target = &agents[1];
    let before = target.counters.snapshot();

    let payload = &genuine[frame::HEADER_LEN..genuine.len() - frame::TAG_LEN];
    let now = WallClock::system().now_ms();
    let reseal = |key: [u8; 32], timestamp_ms: u64, seq: u64| {
        let keys = GossipKeys::from_keys(&[key]).unwrap();
        let header = Header {
            fragment: 0,
            fragments: 1,
            tags: 1,
            sender: 0xdead_beef,
            seq,
            timestamp_ms,
            destination: target.addr,
        };
        let mut out = Vec::new();
        frame::seal_one(&keys, &header, payload, &mut out);
        out
    };
    let mut random = 0x1234_5678_u64;
    let mut next = move || {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        random
    };
    let mut malformed = 0;
    let mut bad_mac = 0;
    for i in 0..300 {
        let len = 1 + (next() % 1_400) as usize;
        let mut junk: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if i % 2 == 0 && junk.len() >= frame::OVERHEAD {
            // Looks like ours up to the tag.
            junk[..4].copy_from_slice(&frame::MAGIC);
            junk[6] = 1;
            bad_mac += 1;
        } else {
            malformed += 1;
        }
        spy.send_to(&junk, target.addr).await.unwrap();
        if i % 20 == 19 {
            // Paced so the kernel's receive buffer does not drop any: the
            // test counts every datagram.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    for len in [genuine.len() - 1, genuine.len() - frame::TAG_LEN, 70, 40, 3] {
        spy.send_to(&genuine[..len], target.addr).await.unwrap();
        if len < frame::OVERHEAD {
            malformed += 1;
        } else {
            bad_mac += 1;
        }
    }
    spy.send_to(&reseal(KEY_X, now, 1), target.addr)
        .await
        .unwrap();
    bad_mac += 1;
    // A frame as if captured a minute ago.
    spy.send_to(&reseal(KEY_A, now - 60_000, 2), target.addr)
        .await
        .unwrap();
    // The genuine frame, sent to the spy: not for b.
    spy.send_to(&genuine, target.addr).await.unwrap();
    spy.send_to(&genuine, target.addr).await.unwrap();
    // A fresh frame for b, twice: the second is a replay.
    let fresh = reseal(KEY_A, now, 3);
    spy.send_to(&fresh, target.addr).await.unwrap();
    spy.send_to(&fresh, target.addr).await.unwrap();

    wait_until(Duration::from_secs(3), "done counting", || {
        let s = target.counters.snapshot();
        s.dropped_malformed - before.dropped_malformed >= malformed
            && s.dropped_bad_mac - before.dropped_bad_mac >= bad_mac
            && s.dropped_stale > before.dropped_stale
            && s.dropped_misdirected - before.dropped_misdirected >= 2
            && s.dropped_replayed > before.dropped_replayed
    })
    .await;
    let after = target.counters.snapshot();
    assert_eq!(
        after.dropped_malformed - before.dropped_malformed,
        malformed
    );
    assert_eq!(after.dropped_bad_mac - before.dropped_bad_mac, bad_mac);
    assert_eq!(after.dropped_stale - before.dropped_stale, 1);
    assert_eq!(after.dropped_misdirected - before.dropped_misdirected, 2);
    assert_eq!(after.dropped_replayed - before.dropped_replayed, 1);

    // The cluster stays formed and gossip keeps running.
    tokio::time::sleep(DEFAULT_INTERVAL * 5).await;
    for agent in &agents {
        assert_eq!(members(&agent.membership.view()), ["a", "b", "c"]);
        assert!(
            tokio::time::timeout(Duration::ZERO, agent.membership.stopped())
                .await
                .is_err(),
            "{} still gossiping",
            agent.name
        );
    }
    assert!(target.counters.snapshot().messages_accepted > before.messages_accepted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_captured_syn_replayed_to_another_node_draws_no_answer() {
    // A spy that a lone agent probes as a run-time seed captures its SYN.
    let spy = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let a = start("a", unique_loopback(), &[], &[KEY_A]).await;
    a.membership.set_seeds([spy.local_addr().unwrap()]);
    let mut buf = vec![0u8; 65_536];
    let (len, _) = tokio::time::timeout(Duration::from_secs(3), spy.recv_from(&mut buf))
        .await
        .expect("a probes its seed")
        .unwrap();
    let syn = buf[..len].to_vec();
    a.membership.set_seeds([]);
    // A node that never heard from a: the SYN would be new to it. Replayed
    // from the victim's address, it would make the node send the victim its
    // whole state.
    let d = start("d", unique_loopback(), &[], &[KEY_A]).await;
    let victim = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    victim.send_to(&syn, d.addr).await.unwrap();
    let answered =
        tokio::time::timeout(Duration::from_millis(500), victim.recv_from(&mut buf)).await;
    assert!(answered.is_err(), "the replayed SYN was answered");
    wait_until(Duration::from_secs(1), "the replay counted", || {
        d.counters.snapshot().dropped_misdirected == 1
    })
    .await;
    assert_eq!(d.counters.snapshot().messages_accepted, 0);

    // The same SYN addressed to d does draw an answer: the silence above is
    // the destination check, not a deaf node.
    let payload = &syn[frame::HEADER_LEN..syn.len() - frame::TAG_LEN];
    let header = Header {
        fragment: 0,
        fragments: 1,
        tags: 1,
        sender: 0x5eed,
        seq: 1,
        timestamp_ms: WallClock::system().now_ms(),
        destination: d.addr,
    };
    let mut for_d = Vec::new();
    frame::seal_one(
        &GossipKeys::from_keys(&[KEY_A]).unwrap(),
        &header,
        payload,
        &mut for_d,
    );
    victim.send_to(&for_d, d.addr).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), victim.recv_from(&mut buf))
        .await
        .expect("d answers a SYN sent to it")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rotation_interoperates_and_a_foreign_key_stays_out() {
    let a_addr = unique_loopback();
    let a = start("a", a_addr, &[], &[KEY_A]).await;
    let rotating = start("r", unique_loopback(), &[a_addr], &[KEY_B, KEY_A]).await;
    let a2 = start("a2", unique_loopback(), &[a_addr], &[KEY_A]).await;
    for agent in [&a, &rotating, &a2] {
        wait_members(agent, &["a", "a2", "r"], Duration::from_secs(5)).await;
    }
    // [B] alone: seeded at a, never let in.
    let foreign = start("b", unique_loopback(), &[a_addr], &[KEY_B]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(members(&a.membership.view()), ["a", "a2", "r"]);
    assert_eq!(members(&foreign.membership.view()), ["b"]);
    assert!(a.counters.snapshot().dropped_bad_mac > 0);
    assert_eq!(foreign.counters.snapshot().messages_accepted, 0);
    // The rotating node would accept [B]; finishing the rotation works.
    let b2 = start("b2", unique_loopback(), &[rotating.addr], &[KEY_B]).await;
    wait_view(&rotating, Duration::from_secs(5), "b2 joined", |v| {
        v.member("b2").is_some()
    })
    .await;
    drop(b2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_larger_than_a_datagram_is_fragmented_and_arrives() {
    let a_addr = unique_loopback();
    let mut config = GossipConfig::for_test("a", a_addr);
    config.seeds = vec![];
    // Split above 40 kB (instead of the UDP limit) so chitchat's ordinary
    // near-64 kB deltas take the fragment path.
    let transport = AuthTransport::new(
        GossipKeys::from_keys(&[KEY_A]).unwrap(),
        DEFAULT_REPLAY_WINDOW,
    )
    .with_max_datagram(40_000);
    let counters = transport.counters();
    let mut big = local_state(1);
    // 8 000 IPv6 VIPs with random host parts: ~300 kB of state that
    // chitchat's delta compression cannot shrink below a datagram.
    let mut random = 0x9e37_79b9_7f4a_7c15_u64;
    big.vips = (0..8_000)
        .map(|_| {
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            let host = random.to_be_bytes();
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0]);
            bytes[8..].copy_from_slice(&host);
            IpAddr::from(bytes)
        })
        .collect::<BTreeSet<_>>()
        .into();
    let a_membership = Membership::start(&config, big.clone(), &transport, &transport)
        .await
        .unwrap();
    let b = start("b", unique_loopback(), &[a_addr], &[KEY_A]).await;
    wait_view(&b, Duration::from_secs(10), "all of a's VIPs", |v| {
        v.node("a").is_some_and(|a| a.vips.len() == big.vips.len())
    })
    .await;
    let stats = counters.snapshot();
    assert!(stats.messages_fragmented > 0, "{stats:?}");
    assert!(b.counters.snapshot().messages_accepted > 0);
    assert_eq!(b.counters.snapshot().dropped(), 0);
    drop(a_membership);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_seeds_join_a_node_started_without_any() {
    let a = start("a", unique_loopback(), &[], &[KEY_A]).await;
    let b = start("b", unique_loopback(), &[], &[KEY_A]).await;
    tokio::time::sleep(DEFAULT_INTERVAL * 3).await;
    assert_eq!(members(&b.membership.view()), ["b"]);
    // The caller hands over Node InternalIPs; our own address among them is
    // ignored.
    b.membership.set_seeds([a.addr, b.addr]);
    for agent in [&a, &b] {
        wait_members(agent, &["a", "b"], Duration::from_secs(3)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_replaces_its_old_generation() {
    let mut agents = cluster(&["a", "b"], &[KEY_A]).await;
    let old = agents.pop().unwrap();
    let old_generation = old.membership.chitchat_id().generation_id;
    drop(old.membership);
    // Restarted on another port (the old one may still be closing).
    let new = start("b", unique_loopback(), &[agents[0].addr], &[KEY_A]).await;
    let new_generation = new.membership.chitchat_id().generation_id;
    assert!(new_generation > old_generation);
    let a = &agents[0];
    wait_view(a, Duration::from_secs(5), "b's new generation", |v| {
        v.node("b").is_some_and(|b| b.generation == new_generation)
    })
    .await;
    // One b, never two, including once the old generation is declared dead.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let view = a.membership.view();
    assert_eq!(members(&view), ["a", "b"]);
    assert_eq!(view.node("b").unwrap().generation, new_generation);
}

// --- deterministic: in-memory transport, paused clock ----------------------

async fn start_in_memory(
    transport: &ChannelTransport,
    probes: &MemProbes,
    name: &str,
    port: u16,
    seed: u16,
) -> Membership {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut config = GossipConfig::for_test(name, addr);
    config.seeds = vec![SocketAddr::from(([127, 0, 0, 1], seed)).to_string()];
    Membership::start(&config, local_state(port as u8), transport, probes)
        .await
        .unwrap()
}

async fn wait_sim(
    m: &Membership,
    within: Duration,
    pred: impl Fn(&MembershipView) -> bool,
) -> Duration {
    let started = Instant::now();
    let mut views = m.views();
    tokio::time::timeout(within, views.wait_for(|v| pred(v)))
        .await
        .unwrap_or_else(|_| panic!("not within {within:?}: {:?}", members(&m.view())))
        .unwrap();
    started.elapsed()
}

#[tokio::test(start_paused = true)]
async fn detection_times_in_simulated_time() {
    let transport = ChannelTransport::default();
    let probes = MemProbes::default();
    let a = start_in_memory(&transport, &probes, "a", 10_001, 10_001).await;
    let b = start_in_memory(&transport, &probes, "b", 10_002, 10_001).await;
    let c = start_in_memory(&transport, &probes, "c", 10_003, 10_001).await;
    for m in [&a, &b, &c] {
        wait_sim(m, Duration::from_secs(5), |v| v.members.len() == 3).await;
    }
    // Let the failure detector settle on the real heartbeat rate.
    tokio::time::sleep(Duration::from_secs(10)).await;
    drop(c);
    let crash = wait_sim(&a, Duration::from_secs(5), |v| v.member("c").is_none()).await;
    // From rest: a second, and the wait for a slower probe cycle to find
    // the dead node (`bounds::REST_WAIT`).
    assert!(
        crash < Duration::from_secs(1) + lbnodeagent::bounds::REST_WAIT,
        "crash detected after {crash:?} of simulated time"
    );
    let started = Instant::now();
    b.set_leaving().await;
    wait_sim(&a, Duration::from_secs(5), |v| v.member("b").is_none()).await;
    let leave = started.elapsed();
    assert!(
        leave <= DEFAULT_INTERVAL * 2,
        "leave detected after {leave:?} of simulated time"
    );
}

#[tokio::test(start_paused = true)]
async fn a_partitioned_node_is_dropped_and_comes_back() {
    let transport = ChannelTransport::default();
    let probes = MemProbes::default();
    let a = start_in_memory(&transport, &probes, "a", 11_001, 11_001).await;
    let b = start_in_memory(&transport, &probes, "b", 11_002, 11_001).await;
    let c = start_in_memory(&transport, &probes, "c", 11_003, 11_001).await;
    for m in [&a, &b, &c] {
        wait_sim(m, Duration::from_secs(5), |v| v.members.len() == 3).await;
    }
    let addr = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    transport.remove_link(addr(11_003), addr(11_001)).await;
    transport.remove_link(addr(11_003), addr(11_002)).await;
    probes.cut(addr(11_003), addr(11_001));
    probes.cut(addr(11_003), addr(11_002));
    wait_sim(&a, Duration::from_secs(3), |v| v.member("c").is_none()).await;
    wait_sim(&c, Duration::from_secs(3), |v| v.members.len() == 1).await;
    transport.add_link(addr(11_003), addr(11_001)).await;
    transport.add_link(addr(11_003), addr(11_002)).await;
    probes.heal(addr(11_003), addr(11_001));
    probes.heal(addr(11_003), addr(11_002));
    for m in [&a, &b, &c] {
        wait_sim(m, Duration::from_secs(10), |v| v.members.len() == 3).await;
    }
}

/// `n` agents in memory on `counting`, seeded by the first, on ports from
/// `base`, each with the byte budget `budget` (`None`: the default); once
/// every one sees them all. With the detector's network, kept as long as
/// they run.
async fn counted_cluster(
    n: u16,
    base: u16,
    budget: Option<u64>,
    counting: &CountingTransport<ChannelTransport>,
) -> (Vec<Membership>, MemProbes) {
    let probes = MemProbes::default();
    let addr = |i: u16| SocketAddr::from(([127, 0, 0, 1], base + i));
    let mut nodes = Vec::new();
    for i in 0..n {
        let mut config = GossipConfig::for_test(&format!("n{i:02}"), addr(i));
        config.seeds = vec![addr(0).to_string()];
        if budget.is_some() {
            config.max_bandwidth = budget;
        }
        nodes.push(
            Membership::start(&config, local_state(i as u8), counting, &probes)
                .await
                .unwrap(),
        );
    }
    for node in &nodes {
        wait_sim(node, Duration::from_secs(30), |v| {
            v.members.len() == n as usize
        })
        .await;
    }
    (nodes, probes)
}

/// At rest (nothing published changes) chitchat's rounds come
/// `REST_ROUNDS` intervals apart, so a node sends a tenth of what a round
/// per interval costs; news still spreads at the interval's pace, because a
/// node that learns it gossips at that pace for a while.
#[tokio::test(start_paused = true)]
async fn at_rest_rounds_are_sparse_and_news_still_spreads_at_the_interval() {
    const N: u16 = 20;
    let counting = CountingTransport::new(ChannelTransport::default());
    let (nodes, _probes) = counted_cluster(N, 13_000, None, &counting).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    counting.reset();
    let secs = 30;
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let per_node = counting
        .traffic()
        .values()
        .map(|t| t.messages_sent)
        .sum::<u64>() as f64
        / N as f64
        / secs as f64;
    eprintln!("at rest: {per_node:.1} messages per node per second");
    // A round per interval to three peers is 3 SYNs and 3 ACKs sent and, on
    // average, 3 SYN-ACKs in reply to others: 90 a second at 100 ms.
    assert!(
        per_node < 12.0,
        "{per_node:.1} chitchat messages per node per second at rest"
    );
    // One node's news reaches every other node within a few intervals.
    let mut state = local_state(7);
    state.revision = 42;
    nodes[7].publish(state).await;
    let mut slowest = Duration::ZERO;
    for node in &nodes {
        let took = wait_sim(node, Duration::from_secs(5), |v| {
            v.nodes.iter().any(|n| n.node == "n07" && n.revision == 42)
        })
        .await;
        slowest = slowest.max(took);
    }
    eprintln!("news reached all {N} nodes in {slowest:?}");
    assert!(
        slowest <= Duration::from_millis(800),
        "news took {slowest:?} to reach all {N} nodes"
    );
}

// --- pacing ----------------------------------------------------------------

/// With a budget below what the cluster would send, each node sends about
/// the budget, gossip goes on (slower), and a crash is still detected.
#[tokio::test(start_paused = true)]
async fn a_bandwidth_budget_caps_what_each_node_sends() {
    use lbnodeagent::gossip::MIN_MAX_BANDWIDTH;
    const N: u16 = 20;
    let budget = MIN_MAX_BANDWIDTH;
    let counting = CountingTransport::new(ChannelTransport::default());
    let (mut nodes, _probes) = counted_cluster(N, 12_000, Some(budget), &counting).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    counting.reset();
    let held_before: u64 = nodes.iter().map(Membership::gossip_held).sum();
    // Member removals seen by anyone while nobody left.
    let removals = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let watchers: Vec<_> = nodes
        .iter()
        .map(|node| {
            let mut views = node.views();
            let removals = removals.clone();
            tokio::spawn(async move {
                let mut last = views.borrow_and_update().members.len();
                while views.changed().await.is_ok() {
                    let now = views.borrow_and_update().members.len();
                    removals.fetch_add(
                        last.saturating_sub(now),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                    last = now;
                }
            })
        })
        .collect();
    // News all the time (each node's revision moves twice a second), so
    // every node gossips at the full pace, which the budget must hold.
    let secs = 30;
    for k in 1..=secs * 2 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (i, node) in nodes.iter().enumerate() {
            let mut state = local_state(i as u8);
            state.revision = k;
            node.publish(state).await;
        }
    }
    // What the pacer charges: chitchat's bytes, 28 B of headers per message
    // (this transport has no frame).
    let rates: Vec<f64> = counting
        .traffic()
        .values()
        .map(|t| (t.bytes_sent + 28 * t.messages_sent) as f64 / secs as f64)
        .collect();
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let max = rates.iter().cloned().fold(0.0, f64::max);
    let held: u64 = nodes.iter().map(Membership::gossip_held).sum::<u64>() - held_before;
    assert!(held > 0, "the budget never held a round back");
    assert!(
        mean <= budget as f64 * 1.1 && max <= budget as f64 * 1.5,
        "sent {mean:.0} B/s mean, {max:.0} B/s max per node over a {budget} B/s budget"
    );
    // Slower, not broken: nobody was dropped, and a crash is still seen.
    let removed = removals.load(std::sync::atomic::Ordering::Relaxed);
    for watcher in watchers {
        watcher.abort();
    }
    assert_eq!(removed, 0, "members removed though nobody left");
    drop(nodes.pop());
    let crash = wait_sim(&nodes[0], Duration::from_secs(10), |v| {
        v.members.len() == N as usize - 1
    })
    .await;
    println!("{N} nodes at {budget} B/s: {mean:.0} B/s mean per node, crash seen after {crash:?}");
}
