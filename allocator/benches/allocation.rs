//! Allocation cost at SPEC §10 scale.
//!
//! `cargo bench -p hostlb-allocator --bench allocation`
//!
//! - `allocate_10k`: 10,000 new Services through the ledger (what the
//!   controller does when they appear). Target < 200 ms.
//! - `rebuild_10k`: a restart: 10,000 Services with addresses in their status
//!   rebuilt into a fresh ledger. Target < 200 ms.
//! - `v6_64_at_100k`: one more allocation from a /64 that already has
//!   100,000 addresses in use (the cost must not grow with use).

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use hostlb_allocator::engine::{
    AllocationSpec, Allocator, FamilyPolicy, PoolSpec, Port, ServiceRequest,
};
use hostlb_allocator::ledger::Ledger;
use hostlb_api::Family;

const SERVICES: usize = 10_000;

fn pools() -> Vec<PoolSpec> {
    let mut scoped = PoolSpec {
        name: "team-a".into(),
        created: Some(1),
        addresses: vec!["10.20.0.0/20".into()],
        auto_assign: true,
        ..Default::default()
    };
    scoped.service_allocation = Some(AllocationSpec {
        priority: Some(10),
        namespaces: vec!["ns-0".into()],
        ..Default::default()
    });
    vec![
        scoped,
        PoolSpec {
            name: "general".into(),
            created: Some(2),
            addresses: vec!["10.0.0.0/16".into(), "fd00::/64".into()],
            auto_assign: true,
            avoid_buggy_ips: true,
            ..Default::default()
        },
    ]
}

/// 10,000 Services across 50 namespaces: a fifth dual-stack, a tenth
/// sharing addresses in pairs (DNS over TCP and UDP).
fn services() -> Vec<ServiceRequest> {
    (0..SERVICES)
        .map(|i| {
            let ns = format!("ns-{}", i % 50);
            let share = i % 10 == 1 || i % 10 == 2;
            ServiceRequest {
                key: format!("{ns}/svc-{i}"),
                namespace: ns,
                created: Some(i as i64),
                primary: Some(Family::V4),
                policy: if i % 5 == 0 {
                    FamilyPolicy::RequireDualStack
                } else {
                    FamilyPolicy::SingleStack
                },
                sharing_key: share.then(|| format!("dns-{}", i / 10)),
                ports: vec![Port {
                    protocol: if i % 10 == 2 {
                        "UDP".into()
                    } else {
                        "TCP".into()
                    },
                    port: if share { 53 } else { 80 },
                }],
                ..Default::default()
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let pools = pools();
    let svcs = services();

    let mut g = c.benchmark_group("allocator");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    g.bench_function("allocate_10k", |b| {
        b.iter_batched(
            || {
                let mut l = Ledger::new();
                l.set_pools(&pools);
                l
            },
            |mut l| {
                for s in &svcs {
                    black_box(l.upsert(s.clone()));
                }
                l
            },
            BatchSize::LargeInput,
        )
    });

    // The statuses the first run wrote.
    let mut first = Ledger::new();
    first.set_pools(&pools);
    for s in &svcs {
        first.upsert(s.clone());
    }
    let with_status: Vec<ServiceRequest> = svcs
        .iter()
        .map(|s| {
            let mut s = s.clone();
            let a = first.answer(&s.key).unwrap().as_ref().unwrap();
            s.current = a.ips.clone();
            s.current_pool = Some(a.pool.clone());
            s
        })
        .collect();
    g.bench_function("rebuild_10k", |b| {
        b.iter_batched(
            || {
                let mut l = Ledger::new();
                l.load(&pools, std::iter::empty());
                for s in &with_status {
                    l.insert(s.clone());
                }
                l
            },
            |mut l| {
                black_box(l.rebuild());
                l
            },
            BatchSize::LargeInput,
        )
    });

    // A /64 with 100,000 addresses in use.
    let mut a = Allocator::new();
    a.set_pools(&[PoolSpec {
        name: "v6".into(),
        created: Some(1),
        addresses: vec!["fd00:1::/64".into()],
        auto_assign: true,
        ..Default::default()
    }]);
    let v6 = |i: usize| ServiceRequest {
        key: format!("d/v6-{i}"),
        namespace: "d".into(),
        created: Some(i as i64),
        primary: Some(Family::V6),
        ..Default::default()
    };
    for i in 0..100_000 {
        a.reconcile(&v6(i), true);
    }
    // Free one address in the middle so the search has to find it.
    a.release("d/v6-50000");
    let probe = v6(100_001);
    g.bench_function("v6_64_at_100k", |b| {
        b.iter(|| {
            let out = a.reconcile(black_box(&probe), true);
            assert!(out.result.is_ok());
            a.release(&probe.key);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
