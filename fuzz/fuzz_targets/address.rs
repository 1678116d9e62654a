//! Pool address entries and on-link prefixes, as written in IPAddressPools
//! and `--on-link`.
#![no_main]

use std::net::IpAddr;
use std::str::FromStr;

use hostlb_api::address::parse_entries;
use hostlb_api::{AddressRange, Prefix};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(range) = AddressRange::parse(text) {
        let (first, last) = range.bounds();
        assert!(first <= last);
        assert!(range.size() >= 1);
        assert!(range.contains(range.first()) && range.contains(range.last()));
        assert!(range.overlaps(&range));
        // What is shown reads back as the same range, except where an end is
        // an IPv4-mapped IPv6 address (`::/80` ends at ::ffff:255.255.255.255):
        // the parser refuses those in any spelling, on purpose.
        let mapped = |ip: IpAddr| matches!(ip, IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some());
        if !mapped(range.first()) && !mapped(range.last()) {
            let shown = range.to_string();
            assert_eq!(
                AddressRange::parse(&shown),
                Ok(range),
                "{text:?} shown as {shown:?}"
            );
        }
    }
    if let Ok(prefix) = Prefix::from_str(text) {
        assert!(prefix.contains(prefix.addr()));
        let network = prefix.network();
        assert_eq!(network.network(), network);
        assert!(prefix.range().contains(prefix.addr()));
        assert_eq!(prefix.range(), network.range());
        let shown = prefix.to_string();
        assert_eq!(
            Prefix::from_str(&shown),
            Ok(prefix),
            "{text:?} shown as {shown:?}"
        );
    }
    // A pool's list: each line an entry.
    let entries: Vec<&str> = text.lines().collect();
    let (ranges, errors) = parse_entries(&entries);
    assert_eq!(ranges.len() + errors.len(), entries.len());
});
