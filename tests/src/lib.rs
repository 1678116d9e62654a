//! Test infrastructure shared by hostlb's integration tests: a Kubernetes
//! API server that the unchanged `kube` client and `kubectl` talk to, and
//! network namespaces for real-kernel tests.

pub mod apiserver;
pub mod campaign;
pub mod flood;
pub mod netns;
pub mod probe;
pub mod realserver;
pub mod rng;
pub mod routing;
pub mod switch;

/// The median of durations measured over runs (the upper one of an even
/// count), as the benchmarks report them.
pub fn median(mut v: Vec<std::time::Duration>) -> std::time::Duration {
    v.sort();
    v[v.len() / 2]
}

/// A loopback address and port that nothing else in the tests holds, known
/// before anything binds it (a gossip peer's seeds and advertise address
/// need it). Each call in this process has an address of its own, in a
/// /16 of 127.0.0.0/8 chosen by the process id, so test processes running
/// side by side (nextest runs each test in a process of its own) do not
/// meet; Linux answers for all of 127.0.0.0/8. The port is below the
/// kernel's ephemeral range, so no socket bound to port 0 meanwhile can
/// take it, as one could a port found free that way and bound later.
pub fn unique_loopback() -> std::net::SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let [.., b, c] = std::process::id().to_be_bytes();
    let host = u8::try_from(n % 250 + 1).expect("below 251");
    let port = 20_000 + u16::try_from(n / 250).expect("fewer than 11 million addresses");
    std::net::SocketAddr::from(([127, b, c, host], port))
}
