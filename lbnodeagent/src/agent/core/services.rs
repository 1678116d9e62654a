//! The cluster's Services as the core names them: which Services have
//! each address, oldest first (their annotations and Events), and the
//! objects the last cluster view left out.

use std::collections::BTreeMap;
use std::net::IpAddr;

use tracing::warn;

use crate::election::Cluster;

#[derive(Default)]
pub(super) struct Services {
    /// `namespace/name` of the Services of each address, oldest first.
    of: BTreeMap<IpAddr, Vec<String>>,
    /// Why objects were left out of the last cluster view.
    errors: Vec<String>,
}

impl Services {
    /// A new cluster view, and the objects it left out: each newly left
    /// out is logged once.
    pub(super) fn set(&mut self, cluster: &Cluster, errors: Vec<String>) {
        for e in errors.iter().filter(|e| !self.errors.contains(e)) {
            warn!(error = %e, "object left out");
        }
        self.errors = errors;
        self.of.clear();
        let mut services: Vec<_> = cluster.services.iter().collect();
        services.sort_by(|a, b| {
            hostlb_api::rules::age_key(a.created, &a.key)
                .cmp(&hostlb_api::rules::age_key(b.created, &b.key))
        });
        for s in services {
            for ip in &s.addresses {
                let list = self.of.entry(*ip).or_default();
                if !list.contains(&s.key) {
                    list.push(s.key.clone());
                }
            }
        }
    }

    /// The Services of `ip`, oldest first.
    pub(super) fn of(&self, ip: &IpAddr) -> &[String] {
        self.of.get(ip).map_or(&[], Vec::as_slice)
    }

    /// Every address of the cluster's Services, with its Services.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&IpAddr, &Vec<String>)> {
        self.of.iter()
    }

    pub(super) fn has(&self, ip: &IpAddr) -> bool {
        self.of.contains_key(ip)
    }

    pub(super) fn errors(&self) -> &[String] {
        &self.errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::election::ServiceInfo;

    fn service(key: &str, created: i64, ips: &[&str]) -> ServiceInfo {
        ServiceInfo {
            key: key.into(),
            created: Some(created),
            addresses: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            ..ServiceInfo::default()
        }
    }

    /// Services sharing an address are listed oldest first, each once.
    #[test]
    fn services_of_an_address_are_oldest_first() {
        let mut s = Services::default();
        let cluster = Cluster {
            services: vec![
                service("ns/new", 200, &["10.77.0.1", "10.77.0.1"]),
                service("ns/old", 100, &["10.77.0.1", "10.77.0.2"]),
            ],
            ..Cluster::default()
        };
        s.set(&cluster, vec!["bad pool".into()]);
        let ip: IpAddr = "10.77.0.1".parse().unwrap();
        assert_eq!(s.of(&ip), ["ns/old", "ns/new"]);
        assert!(s.has(&"10.77.0.2".parse().unwrap()));
        assert!(s.of(&"10.77.0.3".parse().unwrap()).is_empty());
        assert_eq!(s.errors(), ["bad pool"]);
        s.set(&Cluster::default(), Vec::new());
        assert!(s.iter().next().is_none() && s.errors().is_empty());
    }
}
