//! Test infrastructure shared by hostlb's integration tests: a Kubernetes
//! API server that the unchanged `kube` client and `kubectl` talk to, and
//! network namespaces for real-kernel tests.

pub mod apiserver;
pub mod netns;
pub mod probe;
pub mod realserver;
pub mod rng;
pub mod routing;

/// The median of durations measured over runs (the upper one of an even
/// count), as the benchmarks report them.
pub fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}

/// A loopback address with a port that no other caller in this process has
/// had, known before anything binds it (a gossip peer's seeds and advertise
/// address need it). Off 127.0.0.1: a port found free there and bound later
/// could meanwhile be taken by another peer's ephemeral loopback sockets,
/// as tests run in parallel. Linux answers for all of 127.0.0.0/8.
pub fn unique_loopback() -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let host = u8::try_from(n % 250 + 1).expect("below 251");
    let port = 20_000 + u16::try_from(n / 250).expect("fewer than 11 million addresses");
    std::net::SocketAddr::from(([127, 0, 3, host], port))
}
