//! Sharing an address: whose terms agree, whose ports clash, and who gives way in a contest.

use std::net::IpAddr;

use super::*;

impl Allocator {
    /// Whether `svc` may hold `ip` next to its current holders; `Err` names
    /// the holder and the rule broken.
    pub(super) fn shareable(
        &self,
        svc: &ServiceRequest,
        ip: IpAddr,
    ) -> Result<(), (String, String)> {
        let Some(h) = self.holders.get(&ip) else {
            return Ok(());
        };
        let others: Vec<(&String, &Vec<Port>)> =
            h.services.iter().filter(|(k, _)| **k != svc.key).collect();
        let Some((first, _)) = others.first() else {
            return Ok(());
        };
        let holder = (*first).clone();
        if let Some(why) = terms_conflict(&h.sharing, &h.backend, svc) {
            return Err((holder, why));
        }
        if let Some(why) = self.namespace_conflict(svc, &others) {
            return Err((holder, why));
        }
        match port_clash(svc, &others) {
            Some((_, why)) => Err((holder, why)),
            None => Ok(()),
        }
    }

    /// Why `svc` may not join holders of another namespace, if it may not:
    /// unless the holders' pool shares across namespaces, a sharing key is
    /// its namespace's own.
    fn namespace_conflict(
        &self,
        svc: &ServiceRequest,
        others: &[(&String, &Vec<Port>)],
    ) -> Option<String> {
        let (other, _) = others
            .iter()
            .find(|(k, _)| namespace_of(k) != svc.namespace)?;
        let pool = self.allocs.get(*other).map(|a| a.pool.as_str())?;
        if self
            .pools
            .iter()
            .any(|p| p.name == pool && p.share_across_namespaces)
        {
            return None;
        }
        Some(format!(
            "it is held by a Service of namespace {:?}, and pool {pool} does not share addresses across namespaces (spec.shareAcrossNamespaces)",
            namespace_of(other)
        ))
    }

    /// The Services that must give `ip` up for `svc`, when `svc` is older
    /// than all of them; otherwise why it cannot have it.
    pub(super) fn contest(
        &self,
        svc: &ServiceRequest,
        ip: IpAddr,
    ) -> Result<Vec<String>, AllocError> {
        match self.shareable(svc, ip) {
            Ok(()) => Ok(Vec::new()),
            Err((holder, why)) => {
                let h = &self.holders[&ip];
                let others: Vec<&String> = h.services.keys().filter(|k| **k != svc.key).collect();
                let mine = svc.rank();
                let older_than_all = others.iter().all(|k| {
                    self.ages.get(*k).is_some_and(|(edited, t, name)| {
                        (mine.0, mine.1, mine.2) < (*edited, *t, name.as_str())
                    })
                });
                if older_than_all {
                    Ok(others.into_iter().cloned().collect())
                } else {
                    Err(AllocError::InUse { ip, holder, why })
                }
            }
        }
    }

    pub(super) fn evict(&mut self, keys: &[String]) {
        for k in keys {
            self.release(k);
        }
    }
}

/// Why `svc` cannot share an address held on these terms, if it cannot.
pub(super) fn terms_conflict(
    sharing: &Option<String>,
    backend: &Backend,
    svc: &ServiceRequest,
) -> Option<String> {
    Some(match (sharing, &svc.sharing_key) {
        (None, _) => "it does not allow sharing (no hostlb.io/allow-shared-ip)".to_string(),
        (_, None) => "this Service does not allow sharing (no hostlb.io/allow-shared-ip)".to_string(),
        (Some(a), Some(b)) if a != b => format!("sharing key {b:?} differs from {a:?}"),
        _ if [backend, &svc.backend].contains(&&Backend::LocalUnselected) => {
            "a Service with externalTrafficPolicy: Local and no selector shares with none (its endpoints cannot be compared)".to_string()
        }
        _ if !backend.shares_with(&svc.backend) => {
            "shared addresses need externalTrafficPolicy: Cluster on all Services, or the same pod selector".to_string()
        }
        _ => return None,
    })
}

/// The namespace of a Service key, `namespace/name`.
fn namespace_of(key: &str) -> &str {
    key.split_once('/').map_or("", |(ns, _)| ns)
}

/// The first of `others` using a port `svc` uses, and the words for it.
pub(super) fn port_clash(
    svc: &ServiceRequest,
    others: &[(&String, &Vec<Port>)],
) -> Option<(String, String)> {
    others.iter().find_map(|(k, ports)| {
        svc.ports
            .iter()
            .find(|p| ports.contains(p))
            .map(|p| ((*k).clone(), format!("port {p} is used by {k}")))
    })
}
