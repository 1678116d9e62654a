//! Removing: only what is ours, in batches, and a removal the agent made
//! itself is not reported back as someone else's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use hostlb_api::Family;
use rtnetlink::Handle;

use super::add::promotes_secondaries;
use super::links::read_link_addresses;
use super::ownership::{ExpectedDelete, KernelAddress, State, by_ip};
use super::{IN_FLIGHT, NetlinkBackend};
use crate::addrs::error::errno;
use crate::addrs::{AddressBackend, Applied, Error, Result, VipAddress};

impl NetlinkBackend {
    /// Deletes one of our addresses from the kernel; the caller forgets it
    /// once this returns `Ok`.
    ///
    /// An IPv4 address that is the primary of its subnet takes that subnet's
    /// secondaries with it unless `promote_secondaries` is on. Removal never
    /// writes that sysctl (a hardened unit cannot: `ProtectKernelTunables`):
    /// if it is off, the addresses the kernel dropped with ours are put back
    /// at once, exactly as they were (as `ip addr restore` does), so they are
    /// gone for one netlink round trip, not lost. The deletion and the
    /// restore run as one task, so a cancelled `remove` cannot stop between
    /// them.
    pub(super) async fn delete_ours(
        &self,
        a: &KernelAddress,
        interface: &str,
        on_link: &[KernelAddress],
    ) -> Result<()> {
        let behind: Vec<KernelAddress> = if a.secondary {
            Vec::new()
        } else {
            on_link
                .iter()
                .filter(|o| a.shares_subnet_with(o))
                .cloned()
                .collect()
        };
        if behind.is_empty()
            || promotes_secondaries(&self.current_name(a.ifindex, interface).await?)
        {
            return delete_one(&self.handle, &self.state, a).await;
        }
        let handle = self.handle.clone();
        let strict = self.strict.clone();
        let state = Arc::clone(&self.state);
        let a = a.clone();
        let task = tokio::spawn(async move {
            // Their deletions are the backend's doing, not someone else's.
            let expected: Vec<ExpectedDelete> = behind
                .iter()
                .map(|b| ExpectedDelete::new(&state, b.key()))
                .collect();
            delete_one(&handle, &state, &a).await?;
            let now = read_link_addresses(&strict, Family::V4, a.ifindex).await?;
            for (b, expected) in behind.iter().zip(expected) {
                if now
                    .iter()
                    .any(|n| n.ip == b.ip && n.prefix_len == b.prefix_len)
                {
                    continue;
                }
                expected.happened();
                let mut request = handle.address().add(b.ifindex, b.ip, b.prefix_len);
                *request.message_mut() = b.message.clone();
                match request.execute().await {
                    Ok(()) => {
                        tracing::info!(ip = %b.ip, prefix_len = b.prefix_len, removed = %a.ip,
                        "put back an address the kernel deleted with the removed VIP (promote_secondaries is off)")
                    }
                    Err(e) => {
                        tracing::error!(ip = %b.ip, prefix_len = b.prefix_len, removed = %a.ip, error = %e,
                        "cannot put back an address the kernel deleted with the removed VIP; add it again, and set net.ipv4.conf.all.promote_secondaries=1")
                    }
                }
            }
            Ok(())
        });
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // The runtime is shutting down, and the caller with it.
            Err(_) => Ok(()),
        }
    }

    /// `remove_many`: one read of each link's addresses and one record write;
    /// the deletions in flight together. An address that is the primary of
    /// its subnet, with others behind it, takes the single path, which reads
    /// the link again and puts back what the kernel takes with it.
    pub(super) async fn remove_batch(&self, vips: &[VipAddress]) -> Vec<Result<Applied>> {
        let mut results: Vec<Option<Result<Applied>>> = vips.iter().map(|_| None).collect();
        let mut groups: BTreeMap<(u32, bool), Vec<usize>> = BTreeMap::new();
        for (i, vip) in vips.iter().enumerate() {
            groups
                .entry((vip.ifindex, vip.ip.is_ipv6()))
                .or_default()
                .push(i);
        }
        let reads = self.addresses_of_groups(&groups).await;
        let mut single = Vec::new();
        // (index, our addresses at its IP, someone else's is there too)
        let mut delete: Vec<(usize, Vec<KernelAddress>, bool)> = Vec::new();
        {
            let state = self.lock();
            for ((_, indexes), read) in groups.iter().zip(reads) {
                let Ok(on_link) = read else {
                    single.extend(indexes);
                    continue;
                };
                let at = by_ip(&on_link);
                for &i in indexes {
                    let vip = &vips[i];
                    let (ours, foreign): (Vec<&KernelAddress>, Vec<&KernelAddress>) = at
                        .get(&vip.ip)
                        .into_iter()
                        .flatten()
                        .copied()
                        .partition(|a| self.is_ours(&state, &vip.interface, a));
                    let behind = ours
                        .iter()
                        .any(|a| !a.secondary && on_link.iter().any(|o| a.shares_subnet_with(o)));
                    if behind {
                        single.push(i);
                    } else {
                        delete.push((i, ours.into_iter().cloned().collect(), !foreign.is_empty()));
                    }
                }
            }
        }
        let requests: Vec<_> = delete
            .iter()
            .map(|(_, ours, _)| delete_all(&self.handle, &self.state, ours))
            .collect();
        let outcomes: Vec<Result<()>> = futures::stream::iter(requests)
            .buffered(IN_FLIGHT)
            .collect()
            .await;
        let snapshot = {
            let mut state = self.lock();
            let mut changed = false;
            for ((i, ours, foreign), outcome) in delete.into_iter().zip(outcomes) {
                let vip = &vips[i];
                results[i] = Some(match outcome {
                    Ok(()) => {
                        // Forgotten only now that the kernel confirmed.
                        changed |= state.forget(&vip.interface, (vip.ifindex, vip.ip), None);
                        for a in &ours {
                            tracing::debug!(ip = %a.ip, prefix_len = a.prefix_len,
                                interface = %vip.interface, "removed address");
                        }
                        if ours.is_empty() && foreign {
                            tracing::warn!(ip = %vip.ip, interface = %vip.interface,
                                "address present but not added by hostlb; leaving it alone");
                            Ok(Applied::NotOurs)
                        } else {
                            Ok(Applied::Done)
                        }
                    }
                    Err(e) => Err(e),
                });
            }
            changed.then(|| state.snapshot())
        };
        if let Some(snapshot) = snapshot {
            // The addresses are gone from the kernel: the record catches up
            // without holding the next batch (a release heard meanwhile)
            // behind a disk's sync, which on a busy disk took 100 ms. Writes
            // stay in order, a later snapshot superseding this one; until
            // it is written, or if it cannot be, the record still lists
            // addresses that are gone, which the next write corrects and a
            // cleanup finds gone.
            let record = self.record.clone();
            tokio::spawn(async move {
                if let Err(e) = record.save(snapshot).await {
                    tracing::warn!(error = %e, "cannot write the address record");
                }
            });
        }
        for i in single {
            results[i] = Some(self.remove(&vips[i]).await);
        }
        results
            .into_iter()
            .map(|r| r.expect("every address has a result"))
            .collect()
    }
}

/// Deletes `a`, expecting its notification (see [`ExpectedDelete`]).
pub(super) async fn delete_one(
    handle: &Handle,
    state: &Mutex<State>,
    a: &KernelAddress,
) -> Result<()> {
    let expected = ExpectedDelete::new(state, a.key());
    match handle.address().del(a.message.clone()).execute().await {
        Ok(()) => {
            expected.happened();
            Ok(())
        }
        // Gone already, or its link is: what we wanted.
        Err(e) if matches!(errno(&e), Some(libc::EADDRNOTAVAIL | libc::ENODEV)) => Ok(()),
        Err(e) => Err(Error::netlink(
            format!("removing {}/{} from link {}", a.ip, a.prefix_len, a.ifindex),
            e,
        )),
    }
}

/// Deletes each of `ours`, in turn.
pub(super) async fn delete_all(
    handle: &Handle,
    state: &Mutex<State>,
    ours: &[KernelAddress],
) -> Result<()> {
    for a in ours {
        delete_one(handle, state, a).await?;
    }
    Ok(())
}
