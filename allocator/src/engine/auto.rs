//! Picking a free address in a pool, and the pool, when the Service names none.

use std::net::IpAddr;

use hostlb_api::Family;
use hostlb_api::address::{from_u128, to_u128};

use super::ipset::is_buggy;
use super::pools::{Pool, family_index};
use super::*;

impl Allocator {
    /// The lowest address of family `f` in pool `p` that `svc` may take:
    /// free, or shared under its key; ranges in the order written.
    pub(super) fn pick(&self, svc: &ServiceRequest, p: &Pool, f: Family) -> Option<IpAddr> {
        let used = &self.used[family_index(f)];
        for r in p.ranges.iter().filter(|r| r.family() == f) {
            let (lo, hi) = r.bounds();
            let free = used
                .first_free(lo, hi, p.avoid_buggy_ips)
                .map(|x| from_u128(f, x));
            let shared = svc.sharing_key.as_ref().and_then(|k| {
                self.shared
                    .get(k)?
                    .range(r.first()..=r.last())
                    .copied()
                    .find(|ip| {
                        !(p.avoid_buggy_ips && is_buggy(f, to_u128(*ip)))
                            && self.shareable(svc, *ip).is_ok()
                    })
            });
            let best = match (free, shared) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if best.is_some() {
                return best;
            }
        }
        None
    }

    /// Addresses for every wanted family from pool `i`. The primary family
    /// is always required (a PreferDualStack Service that cannot get it here
    /// tries the next pool); the other only with RequireDualStack.
    pub(super) fn allocate_in(
        &self,
        svc: &ServiceRequest,
        i: usize,
    ) -> Result<Vec<IpAddr>, AllocError> {
        let p = &self.pools[i];
        let mut ips = Vec::new();
        for (n, f) in svc.wanted().into_iter().enumerate() {
            let required = n == 0 || svc.policy == FamilyPolicy::RequireDualStack;
            if !p.has_family(f) {
                if required {
                    return Err(AllocError::NoFamily {
                        pool: p.name.clone(),
                        family: f,
                        policy: svc.policy,
                    });
                }
                continue;
            }
            match self.pick(svc, p, f) {
                Some(ip) => ips.push(ip),
                None if !required => {}
                None if n > 0 => {
                    return Err(AllocError::ExhaustedFamily {
                        pool: p.name.clone(),
                        family: f,
                    });
                }
                None => return Err(AllocError::Exhausted(p.name.clone())),
            }
        }
        Ok(ips)
    }

    pub(super) fn allocate_auto(
        &self,
        svc: &ServiceRequest,
    ) -> Result<(usize, Vec<IpAddr>), AllocError> {
        let mut candidates: Vec<usize> = (0..self.pools.len())
            .filter(|&i| {
                let p = &self.pools[i];
                p.usable() && p.auto_assign && self.admits(p, svc)
            })
            .collect();
        candidates.sort_by(|a, b| self.pools[*a].order_key().cmp(&self.pools[*b].order_key()));
        let mut last = None;
        for &i in &candidates {
            match self.allocate_in(svc, i) {
                Ok(ips) => return Ok((i, ips)),
                Err(e) => last = Some(e),
            }
        }
        match (candidates.len(), last) {
            (0, _) | (_, None) => Err(AllocError::NoPool),
            (1, Some(e)) => Err(e),
            (_, Some(_)) => Err(AllocError::ExhaustedAll(
                candidates
                    .iter()
                    .map(|i| self.pools[*i].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            )),
        }
    }
}
