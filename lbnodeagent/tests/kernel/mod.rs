//! Shared by the real-kernel tests: an "agent" (netlink backend and
//! announcer) running inside a host's network namespace, and small readers of
//! `ip` output.

#![allow(dead_code)] // each test file uses a different part

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hostlb_tests::netns::{Host, Netns, NsRuntime};
use lbnodeagent::addrs::{NetlinkBackend, NetlinkConfig};
use lbnodeagent::announce::Announcer;

pub const SECOND: Duration = Duration::from_secs(1);

/// The agent's kernel-facing half on one host: created inside the host's
/// namespace, so its netlink and packet sockets belong there.
pub struct Agent {
    pub backend: Arc<NetlinkBackend>,
    pub announcer: Arc<Announcer>,
    // Last: the runtime stops after the sockets that live on it are dropped.
    rt: NsRuntime,
}

impl Agent {
    pub fn start(ns: &Netns, config: NetlinkConfig) -> Agent {
        let rt = ns.runtime().expect("a runtime inside the namespace");
        let (backend, announcer) = rt.run(move || async move {
            let backend = NetlinkBackend::new(config).await.expect("netlink backend");
            let announcer = Announcer::new().expect("packet socket");
            (Arc::new(backend), Arc::new(announcer))
        });
        Agent {
            backend,
            announcer,
            rt,
        }
    }

    pub fn on_host(host: &Host, run_dir: &Path) -> Agent {
        Agent::start(&host.ns, NetlinkConfig::for_test(run_dir))
    }

    /// Runs `f` with the backend inside the namespace.
    pub fn with<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce(Arc<NetlinkBackend>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let backend = Arc::clone(&self.backend);
        self.rt.run(move || f(backend))
    }

    /// Runs `f` with the backend and announcer inside the namespace.
    pub fn with_both<F, Fut, T>(&self, f: F) -> T
    where
        F: FnOnce(Arc<NetlinkBackend>, Arc<Announcer>) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
        T: Send + 'static,
    {
        let backend = Arc::clone(&self.backend);
        let announcer = Arc::clone(&self.announcer);
        self.rt.run(move || f(backend, announcer))
    }
}

/// The line of `ip -d addr show dev IF` output describing `ip` (address
/// line and its lifetime line joined), or `None`.
pub fn address_line(ns: &Netns, ifname: &str, ip: &str) -> Option<String> {
    let out = ns
        .ip(&format!("-d addr show dev {ifname}"))
        .expect("ip addr show");
    let lines: Vec<&str> = out.lines().collect();
    lines.iter().enumerate().find_map(|(i, l)| {
        let mut words = l.split_whitespace();
        let family = words.next()?;
        let addr = words.next()?;
        ((family == "inet" || family == "inet6") && addr.split('/').next() == Some(ip))
            .then(|| format!("{} {}", l.trim(), lines.get(i + 1).map_or("", |n| n.trim())))
    })
}

/// The valid lifetime in seconds from an [`address_line`]; `None` for
/// forever.
pub fn valid_lft(line: &str) -> Option<u64> {
    let v = line
        .split_whitespace()
        .skip_while(|w| *w != "valid_lft")
        .nth(1)?;
    v.strip_suffix("sec")?.parse().ok()
}
