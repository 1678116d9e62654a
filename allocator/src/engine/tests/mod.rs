//! Engine tests: builders here, topics in the files below.

mod props;
mod rules;
mod scenarios;

use std::net::IpAddr;

use super::*;

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub(super) fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|s| ip(s)).collect()
}

pub(super) fn pool(name: &str, created: i64, addrs: &[&str]) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        created: Some(created),
        addresses: addrs.iter().map(|a| a.to_string()).collect(),
        auto_assign: true,
        ..Default::default()
    }
}

/// A single-stack IPv4 Service in namespace `default` created at `created`.
pub(super) fn svc(name: &str, created: i64) -> ServiceRequest {
    ServiceRequest {
        key: format!("default/{name}"),
        namespace: "default".into(),
        created: Some(created),
        ports: vec![Port {
            protocol: "TCP".into(),
            port: 80,
        }],
        ..Default::default()
    }
}

pub(super) trait SvcExt: Sized {
    fn ns(self, ns: &str) -> Self;
    fn label(self, k: &str, v: &str) -> Self;
    fn v6(self) -> Self;
    fn policy(self, p: FamilyPolicy) -> Self;
    fn request(self, addrs: &[&str]) -> Self;
    fn in_pool(self, pool: &str) -> Self;
    fn share(self, key: &str) -> Self;
    fn ports(self, ports: &[(&str, i32)]) -> Self;
    fn local(self, selector: &str) -> Self;
    fn holding(self, addrs: &[&str], pool: &str) -> Self;
}

impl SvcExt for ServiceRequest {
    fn ns(mut self, ns: &str) -> Self {
        let name = self.key.split('/').nth(1).unwrap().to_string();
        self.namespace = ns.into();
        self.key = format!("{ns}/{name}");
        self
    }
    fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    fn v6(mut self) -> Self {
        self.primary = Some(Family::V6);
        self
    }
    fn policy(mut self, p: FamilyPolicy) -> Self {
        self.policy = p;
        self
    }
    fn request(mut self, addrs: &[&str]) -> Self {
        self.requested = ips(addrs);
        self
    }
    fn in_pool(mut self, pool: &str) -> Self {
        self.requested_pool = Some(pool.into());
        self
    }
    fn share(mut self, key: &str) -> Self {
        self.sharing_key = Some(key.into());
        self
    }
    fn ports(mut self, ports: &[(&str, i32)]) -> Self {
        self.ports = ports
            .iter()
            .map(|(p, n)| Port {
                protocol: p.to_string(),
                port: *n,
            })
            .collect();
        self
    }
    fn local(mut self, selector: &str) -> Self {
        self.backend = if selector.is_empty() {
            Backend::LocalUnselected
        } else {
            Backend::Local(selector.into())
        };
        self
    }
    fn holding(mut self, addrs: &[&str], pool: &str) -> Self {
        self.current = ips(addrs);
        self.current_pool = Some(pool.into());
        self
    }
}

/// Reconcile (allowing new addresses) and return the addresses as text, or
/// the error's message.
pub(super) fn alloc(a: &mut Allocator, s: &ServiceRequest) -> Result<Vec<String>, String> {
    match a.reconcile(s, true).result {
        Ok(Some(x)) => Ok(x.ips.iter().map(|i| i.to_string()).collect()),
        Ok(None) => Err("nothing".into()),
        Err(e) => Err(e.to_string()),
    }
}

pub(super) fn with_pools(specs: &[PoolSpec]) -> Allocator {
    let mut a = Allocator::new();
    a.set_pools(specs);
    a
}
