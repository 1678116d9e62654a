//! What each node's own identity costs (see `identity`, `gossip::signed`
//! and `gossip::beats`): a beat's proof made and checked, a leaving beat's
//! signature, the key two nodes share, and a node's gossip state signed
//! after a change and checked before it is merged.
//!
//! `cargo bench -p lbnodeagent --bench identity`

use std::hint::black_box;

use chitchat::{Chitchat, ChitchatConfig, ChitchatId, FailureDetectorConfig, ProtocolVersion};
use criterion::{Criterion, criterion_group, criterion_main};
use lbnodeagent::gossip::beats::{BeatMessage, Proof};
use lbnodeagent::gossip::signed::{Kv, NodePart, check, sign_state};
use lbnodeagent::gossip::{LocalState, Status};
use lbnodeagent::identity::NodeKey;

fn beat() -> Vec<u8> {
    let mut out = Vec::new();
    BeatMessage {
        node: "worker-0042.rack01.dc1".into(),
        generation: Some(1_883_428_898_634_465_280),
        lapse: Some((
            std::time::Duration::from_millis(14_000),
            std::time::Duration::from_millis(15_000),
        )),
        leaving: false,
        watching: false,
        silent: None,
    }
    .encode(&mut out);
    out
}

/// A node's chitchat, its state as an agent at rest publishes it (12
/// keys, 100 VIPs), signed.
fn chitchat(key: &NodeKey) -> Chitchat {
    let id = ChitchatId::new(
        "worker-0042.rack01.dc1",
        7,
        "10.20.0.43:7934".parse().unwrap(),
    );
    let config = ChitchatConfig {
        chitchat_id: id,
        cluster_id: "hostlb".into(),
        gossip_interval: std::time::Duration::from_millis(100),
        listen_addr: "10.20.0.43:7934".parse().unwrap(),
        seed_nodes: Vec::new(),
        failure_detector_config: FailureDetectorConfig::default(),
        marked_for_deletion_grace_period: std::time::Duration::from_secs(60),
        catchup_callback: None,
        extra_liveness_predicate: None,
        protocol_version: ProtocolVersion::V1,
    };
    let local = LocalState {
        status: Status::Alive,
        vips: (0..100u32)
            .map(|i| std::net::IpAddr::from([10, 77, (i >> 8) as u8, i as u8]))
            .collect::<std::collections::BTreeSet<_>>()
            .into(),
        ..LocalState::default()
    };
    let mut c = Chitchat::with_chitchat_id_and_seeds(
        config,
        tokio::sync::watch::channel(Default::default()).1,
        lbnodeagent::gossip::initial_key_values("0.1.0", &local),
    );
    sign_state(c.self_node_state(), key);
    c
}

/// That state as a delta from nothing carries it.
fn signed_part(key: &NodeKey) -> NodePart {
    let mut c = chitchat(key);
    let id = c.self_chitchat_id().clone();
    let state = c.self_node_state();
    let mut kvs: Vec<Kv> = state
        .key_values_including_deleted()
        .map(|(k, v)| Kv {
            key: k.to_string(),
            value: v.value.clone(),
            version: v.version,
            set: true,
        })
        .collect();
    kvs.sort_by_key(|kv| kv.version);
    NodePart {
        id,
        last_gc_version: 0,
        from_version_excluded: 0,
        kvs,
        max_version: None,
    }
}

fn bench(c: &mut Criterion) {
    let (a, b) = (NodeKey::from_seed([1; 32]), NodeKey::from_seed([2; 32]));
    let body = beat();
    let ab = a.pair_key(&b.public()).unwrap();
    let ba = b.pair_key(&a.public()).unwrap();
    c.bench_function("beat: proof by pair tag, made", |bench| {
        let mut out = body.clone();
        bench.iter(|| {
            out.truncate(body.len());
            Proof::pair(&mut out, black_box(42), &ab);
        })
    });
    let mut tagged = body.clone();
    Proof::pair(&mut tagged, 42, &ab);
    c.bench_function("beat: proof by pair tag, checked", |bench| {
        bench.iter(|| {
            let (_, proof) = BeatMessage::decode_proved(black_box(&tagged)).unwrap();
            assert!(proof.unwrap().verifies(&a.public(), || Some(ba.clone())));
        })
    });
    c.bench_function("beat: leaving, signed", |bench| {
        let mut out = body.clone();
        bench.iter(|| {
            out.truncate(body.len());
            Proof::sign(&mut out, black_box(42), &a);
        })
    });
    let mut signed = body.clone();
    Proof::sign(&mut signed, 42, &a);
    c.bench_function("beat: leaving, checked", |bench| {
        bench.iter(|| {
            let (_, proof) = BeatMessage::decode_proved(black_box(&signed)).unwrap();
            assert!(proof.unwrap().verifies(&a.public(), || None));
        })
    });
    c.bench_function("pair key derived (once per peer)", |bench| {
        bench.iter(|| black_box(a.pair_key(black_box(&b.public()))))
    });
    let part = signed_part(&a);
    c.bench_function(
        "state: a node's part (12 keys, 100 VIPs) checked",
        |bench| bench.iter(|| assert_eq!(check(black_box(&part), &a.public()), Ok(part.kvs.len()))),
    );
    c.bench_function("state: a change made and signed", |bench| {
        let mut chitchat = chitchat(&a);
        let mut i = 0u64;
        bench.iter(|| {
            i += 1;
            let state = chitchat.self_node_state();
            state.set("revision", i);
            sign_state(state, &a);
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
