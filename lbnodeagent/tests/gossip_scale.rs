//! Gossip at CI scale: the small version of `cargo bench -p lbnodeagent
//! --bench membership`. Fifty agents on loopback UDP with the authenticated
//! transport keep both cores busy in a debug build, so this runs in a test
//! binary of its own (test binaries run one after another).

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use lbnodeagent::election::OnLink;
use lbnodeagent::gossip::{
    AuthTransport, DEFAULT_REPLAY_WINDOW, GossipConfig, GossipKeys, LocalState, Membership, Status,
};

const KEY: [u8; 32] = [0xa1; 32];

/// What an agent publishes: one prefix, one MAC, ten VIPs.
fn local_state(n: u8) -> LocalState {
    LocalState {
        status: Status::Alive,
        virtual_mode: false,
        on_link: vec![OnLink {
            prefix: "10.20.0.0/16".parse().unwrap(),
            interface: "eth0".into(),
            announce: true,
            upstream_lost: false,
        }]
        .into(),
        vips: (0..10)
            .map(|v| IpAddr::from([10, 96, n, v]))
            .collect::<BTreeSet<_>>()
            .into(),
        macs: BTreeSet::from([lbnodeagent::addrs::MacAddr([2, 0, 0, 0, 0, n])]).into(),
        revision: 0,
        digest: None,
        drained: false,
        behind: Default::default(),
    }
}

/// One IPv6 VIP per step of a xorshift: host parts that delta compression
/// cannot shrink.
fn random_v6_vips(count: usize, mut random: u64) -> BTreeSet<IpAddr> {
    (0..count)
        .map(|_| {
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            let mut bytes = [0u8; 16];
            bytes[..4].copy_from_slice(&[0xfd, 0x00, 0x0d, 0xb8]);
            bytes[8..].copy_from_slice(&random.to_be_bytes());
            IpAddr::from(bytes)
        })
        .collect()
}

/// Each agent opens a loopback socket per peer it talks to; fifty agents in
/// one process need a few thousand descriptors.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct given.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Waits until every agent started sees every one of them, with its whole
/// state.
async fn converge(agents: &[(Membership, impl Sized)], states: &[LocalState]) {
    for (i, (membership, _)) in agents.iter().enumerate() {
        let mut views = membership.views();
        let converged = tokio::time::timeout(
            Duration::from_secs(240),
            views.wait_for(|v| {
                v.members.len() == agents.len()
                    && states.iter().enumerate().all(|(i, state)| {
                        v.node(&format!("node-{i:02}"))
                            .is_some_and(|n| n.vips.len() == state.vips.len())
                    })
            }),
        )
        .await;
        assert!(
            matches!(converged, Ok(Ok(_))),
            "node-{i:02} did not see everyone's state; it sees {} members",
            membership.view().members.len()
        );
    }
}

/// The CI-sized run of `cargo bench -p lbnodeagent --bench membership`: 50
/// agents on loopback with the authenticated transport and the shipped
/// settings, two of them holding thousands of VIPs so that newcomers are
/// caught up with deltas as large as chitchat makes them. Everyone must see
/// everyone's whole state, and no message may be lost for its size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_agents_converge_and_the_largest_messages_go_through() {
    raise_open_files_limit();
    const N: usize = 50;
    let addrs: Vec<SocketAddr> = (0..N).map(|_| hostlb_tests::unique_loopback()).collect();
    let seeds = &addrs[..3];
    let mut agents = Vec::new();
    let mut states = Vec::new();
    for (i, &addr) in addrs.iter().enumerate() {
        if i == N - 1 {
            // The last one joins a settled cluster, so the first answer it
            // gets must carry both large states: more than one datagram
            // holds, whatever order the others met in (joining while the
            // others still spread them, every newcomer could catch up on
            // one at a time, and no message would fill the budget).
            converge(&agents, &states).await;
        }
        let mut config = GossipConfig::for_test(&format!("node-{i:02}"), addr);
        config.max_bandwidth = None;
        config.seeds = seeds
            .iter()
            .filter(|s| **s != addr)
            .map(SocketAddr::to_string)
            .collect();
        let transport = AuthTransport::new(
            GossipKeys::from_keys(&[KEY]).unwrap(),
            DEFAULT_REPLAY_WINDOW,
        );
        let counters = transport.counters();
        let mut state = local_state(i as u8);
        if i == 7 || i == 31 {
            state.vips = random_v6_vips(3_000, 0x9e37_79b9_7f4a_7c15 + i as u64).into();
        }
        let membership = Membership::start(&config, state.clone(), &transport, &transport)
            .await
            .unwrap();
        states.push(state);
        agents.push((membership, counters));
    }
    converge(&agents, &states).await;
    let stats: Vec<_> = agents.iter().map(|(_, c)| c.snapshot()).collect();
    let largest = stats.iter().map(|s| s.largest_sent).max().unwrap();
    let too_large: u64 = stats.iter().map(|s| s.send_too_large).sum();
    let oversized: u64 = stats.iter().map(|s| s.dropped_oversized).sum();
    let fragmented: u64 = stats.iter().map(|s| s.messages_fragmented).sum();
    let (downs, rejected) = agents.iter().fold((0, 0), |(downs, rejected), (m, _)| {
        let c = m.detector_counters();
        (
            downs + c.downs.load(std::sync::atomic::Ordering::Relaxed),
            rejected + c.rejected.load(std::sync::atomic::Ordering::Relaxed),
        )
    });
    println!("detector: {downs} downs, {rejected} rejected");
    println!(
        "{N} agents: largest message {largest} B, {fragmented} sent in two datagrams, \
         {too_large} too large, {oversized} oversized datagrams dropped"
    );
    assert_eq!(too_large, 0, "messages too large to send");
    assert_eq!(oversized, 0, "datagrams dropped for their size");
    // Catching up on two nodes' 3,000 VIPs takes deltas that fill
    // chitchat's budget of one UDP datagram: the largest message it sends.
    assert!(largest > 50_000, "largest message only {largest} B");
}
