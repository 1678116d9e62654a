//! Addresses a Service asks for by name, and keeping what it holds when it changes.

use std::collections::BTreeSet;
use std::net::IpAddr;

use hostlb_api::address::to_u128;

use super::ipset::is_buggy;
use super::pools::PoolState;
use super::*;

impl Allocator {
    /// New addresses as the Service asks for them: the addresses it names,
    /// else from the pool it names, else from the pools that admit it.
    pub(super) fn allocate_requested(
        &self,
        svc: &ServiceRequest,
        requested: &[IpAddr],
    ) -> Result<(usize, Vec<IpAddr>, Vec<String>), AllocError> {
        if !requested.is_empty() {
            return self.assign_requested(svc, requested);
        }
        let (pool, ips) = if let Some(name) = &svc.requested_pool {
            let Some(&i) = self.by_name.get(name) else {
                return Err(AllocError::UnknownPool(name.clone()));
            };
            let p = &self.pools[i];
            if let PoolState::Invalid(why) | PoolState::Overlaps(why) = &p.state {
                return Err(AllocError::PoolUnusable {
                    pool: name.clone(),
                    why: why.clone(),
                });
            }
            if !self.admits(p, svc) {
                return Err(AllocError::NotAdmitted(name.clone()));
            }
            (i, self.allocate_in(svc, i)?)
        } else {
            self.allocate_auto(svc)?
        };
        Ok((pool, ips, Vec::new()))
    }

    /// How the Service's request (addresses, pool) stands against what it
    /// can keep.
    pub(super) fn request_change(
        &self,
        svc: &ServiceRequest,
        keep: &Keep,
        pool: &str,
        request: &Result<Vec<IpAddr>, AllocError>,
    ) -> Change {
        let requested = match request {
            Ok(r) => r,
            Err(e) => return Change::Invalid(e.clone()),
        };
        if let Some(name) = &svc.requested_pool
            && !self.by_name.contains_key(name)
        {
            return Change::Invalid(AllocError::UnknownPool(name.clone()));
        }
        let same_ips = requested.is_empty()
            || requested.iter().collect::<BTreeSet<_>>() == keep.ips.iter().collect();
        let same_pool = svc.requested_pool.as_deref().is_none_or(|r| r == pool);
        if same_ips && same_pool {
            Change::None
        } else {
            Change::Valid(requested.clone())
        }
    }

    /// Requested addresses, checked against the Service's families.
    pub(super) fn check_requested(&self, svc: &ServiceRequest) -> Result<Vec<IpAddr>, AllocError> {
        if let Some(e) = &svc.request_error {
            return Err(AllocError::BadRequest(e.clone()));
        }
        let ips = svc.requested.clone();
        let wanted = svc.wanted();
        for ip in &ips {
            let f = family_of(*ip);
            if !wanted.contains(&f) {
                return Err(AllocError::WrongFamily {
                    ip: *ip,
                    wanted: format!("{} {:?}", svc.primary(), svc.policy),
                    got: f,
                });
            }
        }
        if svc.policy == FamilyPolicy::RequireDualStack && ips.len() == 1 {
            return Err(AllocError::BadRequest(
                "ipFamilyPolicy RequireDualStack needs one requested address per family".into(),
            ));
        }
        Ok(ips)
    }

    /// Whether the Service can keep `held` (its request aside, see
    /// [`Allocator::request_change`]): the pool, the addresses to hold
    /// (families adjusted to its policy, none added when it names its
    /// addresses in `requested`) and the younger Services to evict. Without
    /// `judge`, only whether the
    /// addresses can be held at all, not whether the Service's namespace
    /// still wants them.
    pub(super) fn check_keep(
        &self,
        svc: &ServiceRequest,
        held: &[IpAddr],
        requested: &[IpAddr],
        allow_new: bool,
        judge: bool,
    ) -> Result<Keep, AllocError> {
        let wanted = svc.wanted();
        // Keep the wanted families only, one address each.
        let mut ips: Vec<IpAddr> = Vec::new();
        for f in &wanted {
            if let Some(ip) = held.iter().find(|ip| family_of(**ip) == *f) {
                ips.push(*ip);
            }
        }
        if ips.is_empty()
            || (svc.policy == FamilyPolicy::SingleStack && family_of(ips[0]) != svc.primary())
        {
            return Err(AllocError::BadRequest(
                "held addresses do not match the Service's families".into(),
            ));
        }
        let pool = self
            .pool_of(&ips, svc.current_pool.as_deref())
            .ok_or(AllocError::NotInPool(ips[0]))?;
        let p = &self.pools[pool];
        if judge && !self.admits(p, svc) {
            return Err(AllocError::NotAdmitted(p.name.clone()));
        }
        let mut losers = Vec::new();
        for ip in &ips {
            if p.avoid_buggy_ips && is_buggy(family_of(*ip), to_u128(*ip)) {
                return Err(AllocError::Buggy {
                    ip: *ip,
                    pool: p.name.clone(),
                });
            }
            let member = self
                .holders
                .get(ip)
                .is_some_and(|h| h.services.contains_key(&svc.key));
            if !member {
                // Claimed from the status alone (after a restart): nobody
                // can know who changed, so the older Service wins.
                losers.extend(self.contest(svc, *ip)?);
            } else if let Err((holder, why)) = self.shareable(svc, *ip) {
                // It shares the address and its edit no longer fits the
                // others: it is the one refused, whatever the ages.
                return Err(AllocError::ChangeRefused {
                    ip: *ip,
                    holder,
                    why,
                });
            }
        }
        // Families the policy wants and the pool can still give, unless the
        // Service named its addresses.
        for f in &wanted {
            if !judge || !requested.is_empty() || ips.iter().any(|ip| family_of(*ip) == *f) {
                continue;
            }
            let added = if allow_new && p.usable() && p.has_family(*f) {
                self.pick(svc, p, *f)
            } else {
                None
            };
            match added {
                Some(ip) => ips.push(ip),
                None if svc.policy == FamilyPolicy::RequireDualStack => {
                    return Err(AllocError::NoFamily {
                        pool: p.name.clone(),
                        family: *f,
                        policy: svc.policy,
                    });
                }
                None => {}
            }
        }
        ips.sort_by_key(|ip| family_of(*ip) != svc.primary());
        losers.sort();
        losers.dedup();
        Ok(Keep { pool, ips, losers })
    }

    pub(super) fn assign_requested(
        &self,
        svc: &ServiceRequest,
        requested: &[IpAddr],
    ) -> Result<(usize, Vec<IpAddr>, Vec<String>), AllocError> {
        let mut pool: Option<usize> = None;
        for ip in requested {
            let i = self
                .pool_of(&[*ip], svc.requested_pool.as_deref())
                .ok_or(AllocError::NotInPool(*ip))?;
            match pool {
                Some(j) if j != i => {
                    return Err(AllocError::DifferentPools(requested[0], *ip));
                }
                _ => pool = Some(i),
            }
        }
        let i = pool.expect("at least one requested address");
        let p = &self.pools[i];
        if let Some(r) = &svc.requested_pool
            && *r != p.name
        {
            return Err(AllocError::NotInRequestedPool {
                ip: requested[0],
                pool: p.name.clone(),
                requested: r.clone(),
            });
        }
        if let PoolState::Invalid(why) | PoolState::Overlaps(why) = &p.state {
            return Err(AllocError::PoolUnusable {
                pool: p.name.clone(),
                why: why.clone(),
            });
        }
        if !self.admits(p, svc) {
            return Err(AllocError::NotAdmitted(p.name.clone()));
        }
        for ip in requested {
            if p.avoid_buggy_ips && is_buggy(family_of(*ip), to_u128(*ip)) {
                return Err(AllocError::Buggy {
                    ip: *ip,
                    pool: p.name.clone(),
                });
            }
            // A request only gets a free or shareable address: asking for an
            // address never takes it from the Service holding it, whatever
            // their ages (that contest is for addresses already in status).
            if let Err((holder, why)) = self.shareable(svc, *ip) {
                return Err(AllocError::InUse {
                    ip: *ip,
                    holder,
                    why,
                });
            }
        }
        let mut ips = requested.to_vec();
        ips.sort_by_key(|ip| family_of(*ip) != svc.primary());
        Ok((i, ips, Vec::new()))
    }
}
