//! Adding and renewing: one address, or a batch sent 64 to a datagram (see
//! `batch`), each checked against what the link holds so that nothing of
//! another's is touched or made primary.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

use hostlb_api::{Family, Prefix};
use rtnetlink::packet_route::address::{
    AddressAttribute, AddressFlags, AddressMessage, AddressProtocol, CacheInfo,
};

use super::ownership::{
    KernelAddress, Owned, Presence, Tags, by_ip, longer, restore, shares_subnet,
};
use super::{NetlinkBackend, listening};
use crate::addrs::error::errno;
use crate::addrs::record::Snapshot;
use crate::addrs::{Applied, Error, IFA_PROTO_HOSTLB, Result, VipAddress};

impl NetlinkBackend {
    pub(super) async fn add_to_kernel(
        &self,
        vip: &VipAddress,
    ) -> std::result::Result<(), rtnetlink::Error> {
        let mut outcomes = self.batches.replace(vec![self.address_message(vip)]).await;
        outcomes.pop().expect("one request, one outcome")
    }

    /// The request that adds `vip`, or renews it (`ip address replace`).
    fn address_message(&self, vip: &VipAddress) -> AddressMessage {
        let mut request = self
            .handle
            .address()
            .add(vip.ifindex, vip.ip, vip.prefix_len);
        let mut msg = std::mem::take(request.message_mut());
        // No prefix route: the subnet's route already exists (it is how the
        // prefix was found), and one more would outlive a moved VIP. No DAD:
        // the election already decided who holds the address, and DAD would
        // delay answering by a second.
        let mut flags = AddressFlags::Noprefixroute;
        if vip.ip.is_ipv6() {
            flags |= AddressFlags::Nodad;
        }
        msg.attributes.push(AddressAttribute::Flags(flags));
        // IPv6 VIPs are deprecated from the start (preferred 0): RFC 6724
        // then never picks them as the source of the node's own connections,
        // which would break when the VIP moves. They still accept traffic and
        // answer neighbour solicitations. An IPv4 VIP kept forever needs no
        // lifetimes at all.
        let valid = vip.lifetime.kernel_seconds();
        if valid.is_some() || vip.ip.is_ipv6() {
            let mut ci = CacheInfo::default();
            ci.ifa_valid = valid.unwrap_or(u32::MAX);
            ci.ifa_preferred = if vip.ip.is_ipv6() { 0 } else { ci.ifa_valid };
            msg.attributes.push(AddressAttribute::CacheInfo(ci));
        }
        if self.config.ifa_proto {
            // IPv4 replace resets the tag to 0 when it is omitted: always send it.
            msg.attributes
                .push(AddressAttribute::Protocol(AddressProtocol::Other(
                    IFA_PROTO_HOSTLB,
                )));
        }
        msg
    }

    /// `sysctl net.ipv4.conf.<interface>.promote_secondaries=1`, unless it is
    /// in effect already. Only for a VIP that becomes the primary of its
    /// subnet: addresses added to that subnet later become its secondaries,
    /// and if the VIP expires (the agent died) they would expire with it.
    /// Best effort: removal does not need it (see
    /// [`delete_ours`](Self::delete_ours)). Like every `/proc/sys/net` file
    /// it belongs to the network namespace of the calling thread, which is
    /// the namespace the backend manages (the agent's threads all live in
    /// the host's).
    pub(super) async fn promote_secondaries(&self, ifindex: u32, interface: &str) -> Result<()> {
        // A link that is gone took its addresses with it.
        if self.link_by_index(ifindex).await?.is_none() {
            return Ok(());
        }
        let name = self.current_name(ifindex, interface).await?;
        if promotes_secondaries(&name) {
            return Ok(());
        }
        std::fs::write(promote_secondaries_path(&name), "1\n").map_err(|source| {
            Error::PromoteSecondaries {
                interface: name.clone(),
                source,
            }
        })?;
        if self.lock().promoted.insert(name.clone()) {
            tracing::info!(interface = %name,
                "turned on net.ipv4.conf.{name}.promote_secondaries, so that a VIP that is the primary address of its subnet does not take the subnet's other addresses with it when it expires");
        }
        Ok(())
    }

    /// The fast path of `add`: an address this run holds, renewed with the
    /// same prefix length by one read of its link and one replace. `None`
    /// when the full path is needed: no subscription is watching for
    /// deletions, the address was reported deleted or is not known to be
    /// there, its prefix length changes, the tag check is still due, or the
    /// kernel's address at that IP is not (or no longer) ours.
    pub(super) async fn renew(&self, vip: &VipAddress) -> Option<Result<Applied>> {
        let key = (vip.ifindex, vip.ip);
        if !self.renewable(&self.lock(), vip) {
            return None;
        }
        // A replace would make whatever holds the IP ours: read first. A
        // deletion still queued on the event socket is then seen here.
        let current = self
            .link_addresses(Family::of(vip.ip), vip.ifindex)
            .await
            .ok()?;
        {
            let mut state = self.lock();
            let mut at_ip = current.iter().filter(|a| a.ip == vip.ip);
            let still_ours = match (at_ip.next(), at_ip.next()) {
                (Some(a), None) => {
                    a.prefix_len == vip.prefix_len && self.is_ours(&state, &vip.interface, a)
                }
                _ => false,
            };
            if !still_ours || !self.renewable(&state, vip) {
                return None;
            }
            // Until the kernel confirms, it counts down either lifetime.
            let o = state.owned.get_mut(&key)?;
            o.lifetime = longer(o.lifetime, vip.lifetime);
        }
        let result = self.add_to_kernel(vip).await;
        let mut state = self.lock();
        let o = state.owned.get_mut(&key);
        Some(match result {
            Ok(()) => {
                if let Some(o) = o {
                    o.lifetime = vip.lifetime;
                }
                Ok(Applied::Done)
            }
            Err(e) => {
                if let Some(o) = o.filter(|o| o.presence == Presence::Held) {
                    o.presence = Presence::Unverified;
                }
                Err(add_error(vip, e))
            }
        })
    }

    /// The full path of `add`: reads the link's addresses to decide
    /// ownership, replaces an old prefix length, adds.
    pub(super) async fn add_checked(&self, vip: &VipAddress) -> Result<Applied> {
        let key = (vip.ifindex, vip.ip);
        let on_link = self
            .addresses(Some(Family::of(vip.ip)), Some(vip.ifindex))
            .await?;
        let fresh = !on_link.iter().any(|a| a.ip == vip.ip);
        let stale: std::result::Result<Vec<&KernelAddress>, Option<Snapshot>> = {
            let mut state = self.lock();
            let (ours, foreign): (Vec<&KernelAddress>, Vec<&KernelAddress>) = on_link
                .iter()
                .filter(|a| a.ip == vip.ip)
                .partition(|a| self.is_ours(&state, &vip.interface, a));
            if foreign.is_empty() {
                Ok(ours
                    .into_iter()
                    .filter(|a| a.prefix_len != vip.prefix_len)
                    .collect())
            } else {
                // Nothing of ours holds this IP any more (someone re-added
                // it after ours went): stop counting it as ours.
                Err((ours.is_empty() && state.forget(&vip.interface, key, None))
                    .then(|| state.snapshot()))
            }
        };
        let stale = match stale {
            Ok(stale) => stale,
            Err(forgotten) => {
                tracing::warn!(ip = %vip.ip, interface = %vip.interface,
                    "address already present and not added by hostlb; leaving it alone");
                if let Some(snapshot) = forgotten {
                    self.save(snapshot).await?;
                }
                return Ok(Applied::NotOurs);
            }
        };
        // Our own address with an old prefix length (the on-link route
        // changed): IPv4 would keep both, so remove the old one first. It is
        // forgotten only once the kernel confirmed, so a failure or a
        // cancellation leaves it owned.
        for a in &stale {
            self.delete_ours(a, &vip.interface, &on_link).await?;
            let forgotten = {
                let mut state = self.lock();
                state
                    .forget(&vip.interface, key, Some(a.prefix_len))
                    .then(|| state.snapshot())
            };
            if let Some(snapshot) = forgotten {
                self.save(snapshot).await?;
            }
        }
        let (before, snapshot) = {
            let mut state = self.lock();
            let before = state.own(vip);
            (before, state.snapshot())
        };
        // Recorded before the kernel has it: a crash in between leaves a
        // record of a missing address (harmless), never an unrecorded one.
        if let Err(e) = self.save(snapshot).await {
            restore(&mut self.lock().owned, key, before);
            return Err(e);
        }
        if becomes_primary(vip, &on_link) {
            // Whatever is added to this subnet later becomes its secondary,
            // and would go with it when it is deleted or expires.
            if let Err(e) = self.promote_secondaries(vip.ifindex, &vip.interface).await {
                tracing::warn!(ip = %vip.ip, error = %e,
                    "the VIP is the primary address of its subnet; addresses added to that subnet later go with it when it expires");
            }
        }
        if let Err(e) = self.add_to_kernel(vip).await {
            let forgotten = {
                let mut state = self.lock();
                match before {
                    None => {
                        state.owned.remove(&key);
                        Some(state.snapshot())
                    }
                    Some(_) => {
                        if let Some(o) = state.owned.get_mut(&key) {
                            o.presence = Presence::Unverified;
                        }
                        None
                    }
                }
            };
            if let Some(snapshot) = forgotten {
                // The add's error is the one to report.
                let _ = self.save(snapshot).await;
            }
            return Err(add_error(vip, e));
        }
        {
            let mut state = self.lock();
            if let Some(o) = state.owned.get_mut(&key) {
                o.lifetime = vip.lifetime;
                // Unless a deletion was reported meanwhile.
                if o.presence == Presence::Unverified {
                    o.presence = Presence::Held;
                }
            }
        }
        if let (true, IpAddr::V6(ip)) = (fresh, vip.ip) {
            listening::until_listening(&[(vip.ifindex, ip)]).await;
        }
        if before.is_none() {
            tracing::info!(ip = %vip.ip, prefix_len = vip.prefix_len, interface = %vip.interface,
                "added address");
        }
        if self.lock().probe_pending {
            self.probe_tags(vip).await;
        }
        Ok(Applied::Done)
    }

    /// `add_many`: one read of each link's addresses, one record write for
    /// what is new, and the requests in flight together (a failed host's
    /// thousand VIPs are one batch, and so is every renewal). Ownership is
    /// decided from that read exactly as [`add_checked`](Self::add_checked)
    /// does; an address of ours with another prefix length (its on-link
    /// route changed) takes that single path, which replaces it.
    pub(super) async fn add_batch(&self, vips: &[VipAddress]) -> Vec<Result<Applied>> {
        let mut results: Vec<Option<Result<Applied>>> = vips.iter().map(|_| None).collect();
        let mut groups: BTreeMap<(u32, bool), Vec<usize>> = BTreeMap::new();
        for (i, vip) in vips.iter().enumerate() {
            if Prefix::new(vip.ip, vip.prefix_len).is_none() {
                results[i] = Some(Err(Error::InvalidPrefix {
                    ip: vip.ip,
                    prefix_len: vip.prefix_len,
                }));
                continue;
            }
            groups
                .entry((vip.ifindex, vip.ip.is_ipv6()))
                .or_default()
                .push(i);
        }
        let reads = self.addresses_of_groups(&groups).await;
        let mut single = Vec::new();
        // (index, the entry before, becomes the primary of its subnet)
        let mut send: Vec<(usize, Option<Owned>, bool)> = Vec::new();
        // IPv6 addresses the kernel did not have: waited for until it
        // listens for their solicitations (see `listening`).
        let mut fresh6: Vec<(usize, u32, Ipv6Addr)> = Vec::new();
        let snapshot = {
            let mut state = self.lock();
            let entries_before = state.entries();
            for ((_, indexes), read) in groups.iter().zip(reads) {
                let Ok(on_link) = read else {
                    // The single path reads again and reports its own error.
                    single.extend(indexes);
                    continue;
                };
                let at = by_ip(&on_link);
                for &i in indexes {
                    let vip = &vips[i];
                    let key = (vip.ifindex, vip.ip);
                    let (ours, foreign): (Vec<&KernelAddress>, Vec<&KernelAddress>) = at
                        .get(&vip.ip)
                        .into_iter()
                        .flatten()
                        .copied()
                        .partition(|a| self.is_ours(&state, &vip.interface, a));
                    if !foreign.is_empty() {
                        if ours.is_empty() {
                            state.forget(&vip.interface, key, None);
                        }
                        tracing::warn!(ip = %vip.ip, interface = %vip.interface,
                            "address already present and not added by hostlb; leaving it alone");
                        results[i] = Some(Ok(Applied::NotOurs));
                        continue;
                    }
                    if ours.iter().any(|a| a.prefix_len != vip.prefix_len) {
                        single.push(i);
                        continue;
                    }
                    let before = state.own(vip);
                    let primary = ours.is_empty() && becomes_primary(vip, &on_link);
                    if let (true, IpAddr::V6(ip)) = (ours.is_empty(), vip.ip) {
                        fresh6.push((i, vip.ifindex, ip));
                    }
                    send.push((i, before, primary));
                }
            }
            (state.entries() != entries_before).then(|| state.snapshot())
        };
        // Recorded before the kernel has them, as in `add_checked`.
        if let Some(snapshot) = snapshot
            && let Err(e) = self.save(snapshot).await
        {
            let mut state = self.lock();
            for (i, before, _) in send.drain(..) {
                let vip = &vips[i];
                restore(&mut state.owned, (vip.ifindex, vip.ip), before);
                results[i] = Some(Err(Error::RecordWrite {
                    path: self.config.run_dir.join(crate::addrs::record::FILE_NAME),
                    source: std::io::Error::other(e.to_string()),
                }));
            }
        }
        let mut promoted = BTreeSet::new();
        for (i, _, primary) in &send {
            let vip = &vips[*i];
            if *primary
                && promoted.insert(vip.ifindex)
                && let Err(e) = self.promote_secondaries(vip.ifindex, &vip.interface).await
            {
                tracing::warn!(ip = %vip.ip, error = %e,
                    "the VIP is the primary address of its subnet; addresses added to that subnet later go with it when it expires");
            }
        }
        let requests = send
            .iter()
            .map(|(i, _, _)| self.address_message(&vips[*i]))
            .collect();
        let outcomes = self.batches.replace(requests).await;
        let mut first_new = None;
        let snapshot = {
            let mut state = self.lock();
            let mut changed = false;
            for ((i, before, _), outcome) in send.into_iter().zip(outcomes) {
                let vip = &vips[i];
                let key = (vip.ifindex, vip.ip);
                match outcome {
                    Ok(()) => {
                        if let Some(o) = state.owned.get_mut(&key) {
                            o.lifetime = vip.lifetime;
                            // Unless a deletion was reported meanwhile.
                            if o.presence == Presence::Unverified {
                                o.presence = Presence::Held;
                            }
                        }
                        if before.is_none() {
                            tracing::debug!(ip = %vip.ip, prefix_len = vip.prefix_len,
                                interface = %vip.interface, "added address");
                            first_new.get_or_insert(i);
                        }
                        results[i] = Some(Ok(Applied::Done));
                    }
                    Err(e) => {
                        match before {
                            None => {
                                state.owned.remove(&key);
                                changed = true;
                            }
                            Some(_) => {
                                if let Some(o) = state.owned.get_mut(&key) {
                                    o.presence = Presence::Unverified;
                                }
                            }
                        }
                        results[i] = Some(Err(add_error(vip, e)));
                    }
                }
            }
            changed.then(|| state.snapshot())
        };
        if let Some(snapshot) = snapshot {
            // The adds' errors are the ones to report.
            let _ = self.save(snapshot).await;
        }
        let added: Vec<(u32, Ipv6Addr)> = fresh6
            .into_iter()
            .filter(|(i, _, _)| matches!(results[*i], Some(Ok(Applied::Done))))
            .map(|(_, ifindex, ip)| (ifindex, ip))
            .collect();
        listening::until_listening(&added).await;
        if let Some(i) = first_new
            && self.lock().probe_pending
        {
            self.probe_tags(&vips[i]).await;
        }
        for i in single {
            results[i] = Some(self.add_checked(&vips[i]).await);
        }
        results
            .into_iter()
            .map(|r| r.expect("every address has a result"))
            .collect()
    }

    /// Reads the first address added back, once, to check [`Tags`] against
    /// what the kernel did with its tag: proof either way overrides the
    /// release number (a backport, or a kernel that lies about its version).
    /// A failed read leaves the check to the next add.
    pub(super) async fn probe_tags(&self, vip: &VipAddress) {
        let Ok(back) = self
            .addresses(Some(Family::of(vip.ip)), Some(vip.ifindex))
            .await
        else {
            return;
        };
        let Some(a) = back
            .iter()
            .find(|a| a.ip == vip.ip && a.prefix_len == vip.prefix_len)
        else {
            return;
        };
        let kept = a.proto == Some(IFA_PROTO_HOSTLB);
        let mut state = self.lock();
        if !std::mem::take(&mut state.probe_pending) {
            return;
        }
        match (state.tags, kept) {
            (Tags::Dropped, true) => {
                tracing::info!(
                    "the kernel keeps address tags although its release predates them; ownership follows the tag"
                );
                state.tags = Tags::Kept;
            }
            (Tags::Kept, false) => {
                tracing::warn!(ip = %vip.ip,
                    "the kernel dropped the tag of an address just added although its release keeps tags; ownership follows the record");
                state.tags = Tags::Dropped;
            }
            _ => {}
        }
    }
}

/// Whether `vip` becomes the primary IPv4 address of its subnet: no other
/// address on the link shares it. A /32 never has secondaries.
pub(super) fn becomes_primary(vip: &VipAddress, on_link: &[KernelAddress]) -> bool {
    vip.ip.is_ipv4()
        && vip.prefix_len < 32
        && !on_link
            .iter()
            .any(|o| shares_subnet(vip.ifindex, vip.ip, vip.prefix_len, o))
}

pub(super) fn promote_secondaries_path(interface: &str) -> PathBuf {
    Path::new("/proc/sys/net/ipv4/conf")
        .join(interface)
        .join("promote_secondaries")
}

/// Whether the kernel promotes a secondary when the primary of its subnet on
/// `interface` goes: the interface's setting or `all` (the kernel ORs them).
/// Unreadable counts as off, which only costs a restore.
pub(super) fn promotes_secondaries(interface: &str) -> bool {
    ["all", interface].iter().any(|conf| {
        std::fs::read_to_string(promote_secondaries_path(conf)).is_ok_and(|v| v.trim() == "1")
    })
}

/// The error of a refused add, saying what to do.
pub(super) fn add_error(vip: &VipAddress, e: rtnetlink::Error) -> Error {
    match errno(&e) {
        Some(libc::ENODEV) => Error::InterfaceGone { index: vip.ifindex },
        Some(libc::EACCES) if vip.ip.is_ipv6() => Error::Ipv6Disabled {
            interface: vip.interface.clone(),
        },
        _ => Error::netlink(
            format!("adding {}/{} to {}", vip.ip, vip.prefix_len, vip.interface),
            e,
        ),
    }
}
