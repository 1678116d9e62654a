//! Whether the kernel answers neighbour solicitations for a new IPv6
//! address yet.
//!
//! The netlink add returns before the kernel listens: it joins the
//! address's solicited-node multicast group, where clients send their
//! solicitations, from a workqueue after the add (even with `nodad`). On a
//! busy host that comes milliseconds later, and meanwhile nobody answers
//! for the address. A node that took it in a planned move would announce
//! it and publish it held in that gap, and the node handing it over would
//! let go at once: a client then finds nobody (seen as 38 ms of lost
//! probes in a rolling restart on a loaded host). So an IPv6 add is done
//! only once the kernel lists the group in `/proc/net/igmp6`.

use std::collections::BTreeSet;
use std::net::Ipv6Addr;
use std::time::Duration;

use crate::model::solicited_node;

/// How long an add waits for the kernel to listen. Far beyond what a busy
/// host takes; a link that never listens (IPv6 multicast off) costs this
/// once per batch of adds, and its addresses are reported added anyway.
pub(super) const LISTEN_WAIT: Duration = Duration::from_millis(500);
const POLL: Duration = Duration::from_millis(1);

/// The groups `/proc/net/igmp6` lists, by interface index, and the
/// interfaces that listen to anything at all. Lines are `index name group
/// users flags timer`, the group as 32 hex digits; others are skipped.
pub(super) fn parse_igmp6(text: &str) -> (BTreeSet<(u32, Ipv6Addr)>, BTreeSet<u32>) {
    let mut groups = BTreeSet::new();
    let mut links = BTreeSet::new();
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(index), Some(_), Some(group)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (Ok(index), Ok(group)) = (index.parse::<u32>(), u128::from_str_radix(group, 16)) else {
            continue;
        };
        groups.insert((index, Ipv6Addr::from(group)));
        links.insert(index);
    }
    (groups, links)
}

/// Waits until the kernel listens for solicitations of every address
/// (interface index, address), or [`LISTEN_WAIT`] has passed. An interface
/// that listens to no group at all (IPv6 off, or the link down) is not
/// waited for. The file is read in the calling thread's namespace, which
/// is the one the backend manages.
pub(super) async fn until_listening(added: &[(u32, Ipv6Addr)]) {
    if added.is_empty() {
        return;
    }
    let mut pending: BTreeSet<(u32, Ipv6Addr)> = added
        .iter()
        .map(|(index, ip)| (*index, solicited_node(*ip)))
        .collect();
    let deadline = tokio::time::Instant::now() + LISTEN_WAIT;
    loop {
        let Ok(text) = std::fs::read_to_string("/proc/thread-self/net/igmp6") else {
            tracing::debug!(
                "cannot read /proc/thread-self/net/igmp6; not waiting for the kernel to listen for new IPv6 addresses"
            );
            return;
        };
        let (groups, links) = parse_igmp6(&text);
        pending
            .retain(|(index, group)| links.contains(index) && !groups.contains(&(*index, *group)));
        if pending.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(groups = ?pending, wait = ?LISTEN_WAIT,
                "the kernel does not listen for solicitations of new IPv6 addresses yet; going on without it");
            return;
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn igmp6_lines_read_as_groups_by_interface() {
        let text = "\
1    lo              ff020000000000000000000000000001     1 0000000C 0
3    eth0            ff0200000000000000000001ff000101     1 00000004 0
3    eth0            ff020000000000000000000000000001     1 0000000C 0
garbage
4    eth1            not-hex                              1 0 0
";
        let (groups, links) = parse_igmp6(text);
        assert!(groups.contains(&(3, "ff02::1:ff00:101".parse().unwrap())));
        assert!(groups.contains(&(1, "ff02::1".parse().unwrap())));
        assert_eq!(groups.len(), 3);
        assert_eq!(links, BTreeSet::from([1, 3]));
    }
}
