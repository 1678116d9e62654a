//! Gossip between three hosts in their own network namespaces on one
//! bridge, over the real UDP port (7934) with authenticated frames: the
//! cluster forms from one seed, a crashed agent and a leaving one drop out
//! of the others' views within the bounds, and a host with another key never
//! joins. Needs root (namespaces); CI runs it as root.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::time::Duration;

use hostlb_tests::netns::{Lan, NsRuntime, require_root};
use lbnodeagent::election::OnLink;
use lbnodeagent::gossip::{
    AuthTransport, DEFAULT_REPLAY_WINDOW, GossipConfig, GossipKeys, LocalState, Membership, Status,
};

const KEY: [u8; 32] = [0x5a; 32];
const OTHER_KEY: [u8; 32] = [0x3c; 32];
const PORT: u16 = 7934;

thread_local! {
    /// The agent running on this namespace's thread.
    static AGENT: RefCell<Option<Membership>> = const { RefCell::new(None) };
}

fn start(rt: &NsRuntime, name: &str, addr: SocketAddr, seed: Option<SocketAddr>, key: [u8; 32]) {
    let name = name.to_string();
    rt.run(move || async move {
        let mut config = GossipConfig::for_test(&name, addr);
        config.listen = SocketAddr::from(([0, 0, 0, 0], PORT));
        config.advertise = Some(addr);
        config.seeds = seed.iter().map(SocketAddr::to_string).collect();
        let transport = AuthTransport::new(
            GossipKeys::from_keys(&[key]).unwrap(),
            DEFAULT_REPLAY_WINDOW,
        );
        let local = LocalState {
            status: Status::Alive,
            virtual_mode: true,
            on_link: vec![OnLink {
                prefix: "10.77.0.0/24".parse().unwrap(),
                interface: "eth0".into(),
                announce: true,
                upstream_lost: false,
            }]
            .into(),
            vips: Default::default(),
            macs: Default::default(),
            revision: 0,
            digest: None,
            drained: false,
            behind: Default::default(),
        };
        let m = Membership::start(&config, local, &transport, &transport)
            .await
            .unwrap();
        AGENT.with(|a| *a.borrow_mut() = Some(m));
    });
}

/// Members in this namespace's view once `pred` holds, or panics after `within`.
fn wait_view(
    rt: &NsRuntime,
    within: Duration,
    pred: fn(&[String]) -> bool,
) -> (Vec<String>, Duration) {
    rt.run(move || async move {
        let mut views = AGENT.with(|a| a.borrow().as_ref().expect("agent running").views());
        let started = tokio::time::Instant::now();
        let got = tokio::time::timeout(
            within,
            views.wait_for(|v| {
                let names: Vec<String> = v.members.iter().map(|m| m.node.to_string()).collect();
                pred(&names)
            }),
        )
        .await
        .is_ok_and(|r| r.is_ok());
        let names: Vec<String> = views
            .borrow()
            .members
            .iter()
            .map(|m| m.node.to_string())
            .collect();
        assert!(got, "view not as expected within {within:?}: {names:?}");
        (names, started.elapsed())
    })
}

#[test]
fn agents_in_namespaces_gossip_detect_crash_and_leave() {
    require_root();
    let lan = Lan::new(&["a", "b", "c", "x"]).unwrap();
    let rt: Vec<NsRuntime> = lan.hosts.iter().map(|h| h.ns.runtime().unwrap()).collect();
    let addr = |i: usize| SocketAddr::from((lan.hosts[i].ipv4, PORT));
    start(&rt[0], "a", addr(0), None, KEY);
    start(&rt[1], "b", addr(1), Some(addr(0)), KEY);
    start(&rt[2], "c", addr(2), Some(addr(0)), KEY);
    // Same seed, wrong key: never a member anywhere.
    start(&rt[3], "x", addr(3), Some(addr(0)), OTHER_KEY);
    for r in &rt[..3] {
        let (names, _) = wait_view(r, Duration::from_secs(10), |n| n == ["a", "b", "c"]);
        assert_eq!(names, ["a", "b", "c"]);
    }
    let (alone, _) = wait_view(&rt[3], Duration::from_secs(1), |n| n == ["x"]);
    assert_eq!(alone, ["x"]);

    // Crash: c's agent vanishes without a word.
    rt[2].run(|| async { AGENT.with(|a| a.borrow_mut().take()) });
    let (names, took) = wait_view(&rt[0], Duration::from_secs(3), |n| n == ["a", "b"]);
    assert_eq!(names, ["a", "b"]);
    eprintln!("crash of c seen by a after {took:?}");

    // Graceful leave: b says so, keeps gossiping a few rounds, and is gone
    // from a's view long before a crash would be noticed.
    rt[1].run(|| async {
        let m = AGENT.with(|a| a.borrow_mut().take()).unwrap();
        tokio::task::spawn_local(async move { m.leave().await.unwrap() });
    });
    let (names, took) = wait_view(&rt[0], Duration::from_millis(300), |n| n == ["a"]);
    assert_eq!(names, ["a"]);
    eprintln!("leave of b seen by a after {took:?}");
}
