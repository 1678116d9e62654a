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
