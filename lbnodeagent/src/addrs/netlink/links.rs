//! Links, routes and addresses as the kernel lists them.

use std::collections::{BTreeMap, HashMap};

use futures::TryStreamExt;
use hostlb_api::Family;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::AddressMessage;
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::{Handle, RouteMessageBuilder};

use super::NetlinkBackend;
use super::ownership::KernelAddress;
use crate::addrs::error::errno;
use crate::addrs::routes::{self, Route};
use crate::addrs::{Error, Interface, MacAddr, OwnedAddress, Result};

impl NetlinkBackend {
    pub(super) async fn links(&self) -> Result<Vec<LinkMessage>> {
        retrying(|| self.handle.link().get().execute().try_collect())
            .await
            .map_err(|e| Error::netlink("listing links", e))
    }

    pub(super) async fn link_by_index(&self, index: u32) -> Result<Option<LinkMessage>> {
        match self
            .handle
            .link()
            .get()
            .match_index(index)
            .execute()
            .try_next()
            .await
        {
            Ok(link) => Ok(link),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(format!("reading link {index}"), e)),
        }
    }

    pub(super) async fn link_by_name(&self, name: &str) -> Result<Option<LinkMessage>> {
        match self
            .handle
            .link()
            .get()
            .match_name(name)
            .execute()
            .try_next()
            .await
        {
            Ok(link) => Ok(link),
            Err(e) if errno(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(Error::netlink(format!("reading link {name:?}"), e)),
        }
    }

    pub(super) async fn routes(&self) -> Result<Vec<Route>> {
        let mut out = Vec::new();
        for request in [
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let msgs: Vec<_> = retrying(|| {
                self.handle
                    .route()
                    .get(request.clone())
                    .execute()
                    .try_collect()
            })
            .await
            .map_err(|e| Error::netlink("listing routes", e))?;
            out.extend(msgs.iter().flat_map(Route::parse));
        }
        Ok(out)
    }

    /// Addresses of one family and link, or all of them.
    pub(super) async fn addresses(
        &self,
        family: Option<Family>,
        ifindex: Option<u32>,
    ) -> Result<Vec<KernelAddress>> {
        let msgs: Vec<AddressMessage> = retrying(|| {
            let mut request = self.handle.address().get();
            if let Some(ifindex) = ifindex {
                request = request.set_link_index_filter(ifindex);
            }
            if let Some(family) = family {
                request.message_mut().header.family = address_family(family);
            }
            request.execute().try_collect()
        })
        .await
        .map_err(|e| Error::netlink("listing addresses", e))?;
        Ok(msgs.iter().filter_map(KernelAddress::parse).collect())
    }

    /// The addresses of every (link, family) a batch touches, read once
    /// each and all at once, in the order of `groups`.
    pub(super) async fn addresses_of_groups(
        &self,
        groups: &BTreeMap<(u32, bool), Vec<usize>>,
    ) -> Vec<Result<Vec<KernelAddress>>> {
        futures::future::join_all(
            groups
                .keys()
                .map(|&(ifindex, v6)| self.addresses(Some(family_of(v6)), Some(ifindex))),
        )
        .await
    }

    pub(super) async fn describe(&self, link: &LinkMessage) -> Result<Interface> {
        let routes = self.routes().await?;
        Ok(describe_link(link, &routes))
    }

    /// The name the kernel uses now for link `ifindex`, in case it was
    /// renamed.
    pub(super) async fn current_name(&self, ifindex: u32, interface: &str) -> Result<String> {
        Ok(self
            .link_by_index(ifindex)
            .await?
            .and_then(|l| link_name(&l))
            .unwrap_or_else(|| interface.to_string()))
    }

    pub(super) async fn names(&self) -> Result<HashMap<u32, String>> {
        Ok(self
            .links()
            .await?
            .iter()
            .filter_map(|l| Some((l.header.index, link_name(l)?)))
            .collect())
    }

    /// Our addresses in the kernel now.
    pub(super) async fn ours_in_kernel(&self) -> Result<Vec<OwnedAddress>> {
        let names = self.names().await?;
        let all = self.addresses(None, None).await?;
        let state = self.lock();
        let mut out: Vec<OwnedAddress> = all
            .into_iter()
            .filter_map(|a| {
                let interface = names.get(&a.ifindex)?;
                self.is_ours(&state, interface, &a).then_some(OwnedAddress {
                    interface: interface.clone(),
                    ifindex: a.ifindex,
                    ip: a.ip,
                    prefix_len: a.prefix_len,
                })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// The addresses of one family on one link, filtered by the kernel.
    pub(super) async fn link_addresses(
        &self,
        family: Family,
        ifindex: u32,
    ) -> Result<Vec<KernelAddress>> {
        read_link_addresses(&self.strict, family, ifindex).await
    }
}

pub(super) fn family_of(v6: bool) -> Family {
    if v6 { Family::V6 } else { Family::V4 }
}

/// The addresses of one family on one link, filtered by the kernel where
/// `strict` has `NETLINK_GET_STRICT_CHK` (and here in any case).
pub(super) async fn read_link_addresses(
    strict: &Handle,
    family: Family,
    ifindex: u32,
) -> Result<Vec<KernelAddress>> {
    let msgs: Vec<AddressMessage> = retrying(|| {
        let mut request = strict.address().get().set_link_index_filter(ifindex);
        let header = &mut request.message_mut().header;
        header.family = address_family(family);
        header.index = ifindex;
        request.execute().try_collect()
    })
    .await
    .map_err(|e| Error::netlink(format!("listing addresses of link {ifindex}"), e))?;
    Ok(msgs.iter().filter_map(KernelAddress::parse).collect())
}

/// Tries a dump this many times while the kernel answers EBUSY.
const DUMP_TRIES: u32 = 6;
/// The wait before the first retry, doubled before each next one (62 ms
/// in all).
const DUMP_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(2);

/// Runs a dump again while the kernel answers EBUSY: a netlink socket runs
/// one dump at a time, and a request that comes while another is still
/// being read out gets that answer. With a thousand addresses on a loaded
/// host it came dozens of times a minute; each failed read cost a renewal
/// (until the next one, a third of the lifetime later) or an add, or sent
/// a removal batch down the one-by-one path.
pub(super) async fn retrying<T, F, Fut>(mut dump: F) -> std::result::Result<T, rtnetlink::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = std::result::Result<T, rtnetlink::Error>>,
{
    let mut delay = DUMP_RETRY_FIRST;
    for _ in 1..DUMP_TRIES {
        match dump().await {
            Err(e) if errno(&e) == Some(libc::EBUSY) => {
                tracing::debug!(retry_in = ?delay, "the kernel is busy with another dump of this socket; asking again");
                tokio::time::sleep(delay).await;
                delay *= 2;
            }
            done => return done,
        }
    }
    dump().await
}

pub(super) fn address_family(family: Family) -> AddressFamily {
    match family {
        Family::V4 => AddressFamily::Inet,
        Family::V6 => AddressFamily::Inet6,
    }
}

pub(super) fn link_name(link: &LinkMessage) -> Option<String> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(n) => Some(n.clone()),
        _ => None,
    })
}

pub(super) fn link_carrier(link: &LinkMessage) -> bool {
    let f = link.header.flags;
    f.contains(LinkFlags::Up) && f.contains(LinkFlags::LowerUp)
}

pub(super) fn describe_link(link: &LinkMessage, routes: &[Route]) -> Interface {
    let index = link.header.index;
    // Loopback and NOARP links answer no ARP, whatever address they report
    // (`lo` reports 00:00:00:00:00:00): no MAC of theirs answers for a VIP,
    // so none is published, checked for ARP exposure, or put in a record.
    let f = link.header.flags;
    let arp = !f.contains(LinkFlags::Loopback) && !f.contains(LinkFlags::Noarp);
    Interface {
        name: link_name(link).unwrap_or_default(),
        index,
        mac: link
            .attributes
            .iter()
            .find_map(|a| match a {
                LinkAttribute::Address(bytes) => MacAddr::from_slice(bytes),
                _ => None,
            })
            .filter(|m| arp && m.0 != [0; 6]),
        carrier: link_carrier(link),
        prefixes: routes::on_link_prefixes(routes, index),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::num::NonZeroI32;

    use rtnetlink::packet_core::ErrorMessage;

    use super::*;

    fn failing(errno: i32) -> rtnetlink::Error {
        let mut m = ErrorMessage::default();
        m.code = NonZeroI32::new(-errno);
        rtnetlink::Error::NetlinkError(m)
    }

    /// A dump the kernel turned away as busy is asked again; any other
    /// answer, good or bad, is the answer, and the tries are bounded.
    #[tokio::test(start_paused = true)]
    async fn a_busy_dump_is_asked_again_a_few_times() {
        let tries = Cell::new(0);
        let busy_twice = retrying(|| {
            tries.set(tries.get() + 1);
            let n = tries.get();
            async move {
                if n <= 2 {
                    Err(failing(libc::EBUSY))
                } else {
                    Ok(n)
                }
            }
        })
        .await;
        assert_eq!(busy_twice.unwrap(), 3);

        tries.set(0);
        let other = retrying(|| {
            tries.set(tries.get() + 1);
            async { Err::<(), _>(failing(libc::EPERM)) }
        })
        .await;
        assert_eq!(errno(&other.unwrap_err()), Some(libc::EPERM));
        assert_eq!(tries.get(), 1, "only a busy answer is asked again");

        tries.set(0);
        let started = tokio::time::Instant::now();
        let always = retrying(|| {
            tries.set(tries.get() + 1);
            async { Err::<(), _>(failing(libc::EBUSY)) }
        })
        .await;
        assert_eq!(errno(&always.unwrap_err()), Some(libc::EBUSY));
        assert_eq!(tries.get(), DUMP_TRIES);
        assert_eq!(started.elapsed(), std::time::Duration::from_millis(62));
    }
}
