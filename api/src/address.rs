//! Address ranges and prefixes as pool entries and on-link routes are written.
//!
//! Both families are held as `u128` offsets so that range arithmetic is the
//! same code for IPv4 and IPv6 and a `/64` is as cheap as a `/30`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnetwork::IpNetwork;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    pub fn bits(self) -> u8 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The name Kubernetes uses in `spec.ipFamilies`.
    pub fn k8s_name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.k8s_name())
    }
}

/// The address as an integer within its family.
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The inverse of [`to_u128`]; `n` must fit the family.
pub fn from_u128(family: Family, n: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(n as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// A pool entry that cannot be used, quoting the entry as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {entry:?}: {reason}")]
pub struct AddressError {
    pub entry: String,
    pub reason: String,
}

impl AddressError {
    fn new(entry: &str, reason: impl Into<String>) -> Self {
        AddressError {
            entry: entry.to_string(),
            reason: reason.into(),
        }
    }
}

fn parse_ip(entry: &str, text: &str) -> Result<IpAddr, AddressError> {
    let ip: IpAddr = text.parse().map_err(|_| {
        AddressError::new(
            entry,
            format!(
                "{text:?} is not an IP address (write a CIDR such as 10.0.0.0/24, a range such as 10.0.0.10-10.0.0.20, or a single address)"
            ),
        )
    })?;
    if let IpAddr::V6(v6) = ip
        && v6.to_ipv4_mapped().is_some()
    {
        return Err(AddressError::new(
            entry,
            format!("{text} is an IPv4-mapped IPv6 address; write the IPv4 address instead"),
        ));
    }
    Ok(ip)
}

/// An on-link or CIDR prefix such as `10.0.0.0/24`. The address keeps any host
/// bits it was written with, so `10.0.0.7/24` names both a host and its subnet.
/// The arithmetic is `ipnetwork`'s; parsing is ours, so an error names the
/// pool entry and says what is wrong with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix(IpNetwork);

impl Prefix {
    pub fn new(addr: IpAddr, len: u8) -> Option<Prefix> {
        IpNetwork::new(addr, len).ok().map(Prefix)
    }

    pub fn addr(&self) -> IpAddr {
        self.0.ip()
    }

    pub fn prefix_len(&self) -> u8 {
        self.0.prefix()
    }

    pub fn family(&self) -> Family {
        Family::of(self.addr())
    }

    /// The prefix with host bits cleared.
    pub fn network(&self) -> Prefix {
        Prefix::new(self.0.network(), self.prefix_len()).expect("same length, same family")
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.contains(ip)
    }

    /// Every address the prefix covers, as a range.
    pub fn range(&self) -> AddressRange {
        AddressRange {
            family: self.family(),
            first: to_u128(self.0.network()),
            last: to_u128(self.0.broadcast()),
        }
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.prefix_len())
    }
}

impl FromStr for Prefix {
    type Err = AddressError;
    fn from_str(entry: &str) -> Result<Prefix, AddressError> {
        let text = entry.trim();
        let Some((ip, len)) = text.split_once('/') else {
            return Err(AddressError::new(entry, "missing /prefix-length"));
        };
        let addr = parse_ip(entry, ip.trim())?;
        let len: u8 = len.trim().parse().map_err(|_| {
            AddressError::new(entry, format!("prefix length {len:?} is not a number"))
        })?;
        let max = Family::of(addr).bits();
        Prefix::new(addr, len).ok_or_else(|| {
            AddressError::new(
                entry,
                format!(
                    "prefix length {len} is out of range for {} (0-{max})",
                    Family::of(addr)
                ),
            )
        })
    }
}

/// An inclusive run of addresses of one family: what one `addresses` entry of
/// an `IPAddressPool` denotes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AddressRange {
    family: Family,
    first: u128,
    last: u128,
}

impl AddressRange {
    /// A range from `first` to `last` inclusive; `None` when the families
    /// differ or `first > last`.
    pub fn new(first: IpAddr, last: IpAddr) -> Option<AddressRange> {
        let family = Family::of(first);
        (family == Family::of(last) && to_u128(first) <= to_u128(last)).then(|| AddressRange {
            family,
            first: to_u128(first),
            last: to_u128(last),
        })
    }

    pub fn single(ip: IpAddr) -> AddressRange {
        AddressRange {
            family: Family::of(ip),
            first: to_u128(ip),
            last: to_u128(ip),
        }
    }

    /// Parse one pool entry: a CIDR (`10.0.0.0/24`; host bits are cleared, as
    /// MetalLB does), a range (`10.0.0.10-10.0.0.20`, spaces allowed around
    /// the dash) or a single address.
    pub fn parse(entry: &str) -> Result<AddressRange, AddressError> {
        let text = entry.trim();
        if text.is_empty() {
            return Err(AddressError::new(entry, "empty entry"));
        }
        if text.contains('/') {
            return Ok(text
                .parse::<Prefix>()
                .map_err(|mut e| {
                    e.entry = entry.to_string();
                    e
                })?
                .range());
        }
        if let Some((a, b)) = text.split_once('-') {
            let first = parse_ip(entry, a.trim())?;
            let last = parse_ip(entry, b.trim())?;
            if Family::of(first) != Family::of(last) {
                return Err(AddressError::new(entry, "range mixes IPv4 and IPv6"));
            }
            return AddressRange::new(first, last).ok_or_else(|| {
                AddressError::new(
                    entry,
                    format!("range start {first} is after its end {last}"),
                )
            });
        }
        Ok(AddressRange::single(parse_ip(entry, text)?))
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn first(&self) -> IpAddr {
        from_u128(self.family, self.first)
    }

    pub fn last(&self) -> IpAddr {
        from_u128(self.family, self.last)
    }

    /// `(first, last)` as integers within the family.
    pub fn bounds(&self) -> (u128, u128) {
        (self.first, self.last)
    }

    /// Number of addresses; `::/0` saturates at `u128::MAX`.
    pub fn size(&self) -> u128 {
        (self.last - self.first).saturating_add(1)
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family && (self.first..=self.last).contains(&to_u128(ip))
    }

    pub fn overlaps(&self, other: &AddressRange) -> bool {
        self.family == other.family && self.first <= other.last && other.first <= self.last
    }
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first())
        } else {
            write!(f, "{}-{}", self.first(), self.last())
        }
    }
}

impl FromStr for AddressRange {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, AddressError> {
        AddressRange::parse(s)
    }
}

/// Parse every entry of a pool, keeping the good ones in the order written
/// and every error, so one typo does not hide the rest of the pool.
pub fn parse_entries<S: AsRef<str>>(entries: &[S]) -> (Vec<AddressRange>, Vec<AddressError>) {
    let mut ranges = Vec::with_capacity(entries.len());
    let mut errors = Vec::new();
    for e in entries {
        match AddressRange::parse(e.as_ref()) {
            Ok(r) => ranges.push(r),
            Err(err) => errors.push(err),
        }
    }
    (ranges, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn good_entries() {
        let cases: &[(&str, &str, &str, u128)] = &[
            ("10.0.0.0/24", "10.0.0.0", "10.0.0.255", 256),
            ("10.0.0.7/24", "10.0.0.0", "10.0.0.255", 256),
            ("10.0.0.10-10.0.0.20", "10.0.0.10", "10.0.0.20", 11),
            (" 10.0.0.10 - 10.0.0.20 ", "10.0.0.10", "10.0.0.20", 11),
            ("10.0.0.5", "10.0.0.5", "10.0.0.5", 1),
            ("10.0.0.5/32", "10.0.0.5", "10.0.0.5", 1),
            ("0.0.0.0/0", "0.0.0.0", "255.255.255.255", 1 << 32),
            ("fd00::/64", "fd00::", "fd00::ffff:ffff:ffff:ffff", 1 << 64),
            ("fd00::1-fd00::10", "fd00::1", "fd00::10", 16),
            ("fd00::1", "fd00::1", "fd00::1", 1),
            ("2001:db8::/127", "2001:db8::", "2001:db8::1", 2),
            (
                "::/0",
                "::",
                "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                u128::MAX,
            ),
        ];
        for (entry, first, last, size) in cases {
            let r = AddressRange::parse(entry).unwrap_or_else(|e| panic!("{entry}: {e}"));
            assert_eq!(r.first(), ip(first), "{entry}");
            assert_eq!(r.last(), ip(last), "{entry}");
            assert_eq!(r.size(), *size, "{entry}");
        }
    }

    #[test]
    fn bad_entries_quote_the_entry() {
        let cases: &[(&str, &str)] = &[
            ("", "invalid address \"\": empty entry"),
            (
                "10.0.0.300",
                "invalid address \"10.0.0.300\": \"10.0.0.300\" is not an IP address",
            ),
            (
                "10.0.0.0/33",
                "invalid address \"10.0.0.0/33\": prefix length 33 is out of range for IPv4 (0-32)",
            ),
            (
                "fd00::/129",
                "invalid address \"fd00::/129\": prefix length 129 is out of range for IPv6 (0-128)",
            ),
            (
                "10.0.0.0/x",
                "invalid address \"10.0.0.0/x\": prefix length \"x\" is not a number",
            ),
            (
                "10.0.0.9-10.0.0.1",
                "invalid address \"10.0.0.9-10.0.0.1\": range start 10.0.0.9 is after its end 10.0.0.1",
            ),
            (
                "10.0.0.1-fd00::1",
                "invalid address \"10.0.0.1-fd00::1\": range mixes IPv4 and IPv6",
            ),
            (
                "10.0.0.1-",
                "invalid address \"10.0.0.1-\": \"\" is not an IP address",
            ),
            (
                "hello",
                "invalid address \"hello\": \"hello\" is not an IP address",
            ),
            (
                "::ffff:10.0.0.1",
                "invalid address \"::ffff:10.0.0.1\": ::ffff:10.0.0.1 is an IPv4-mapped IPv6 address",
            ),
            (
                "fe80::1%eth0",
                "invalid address \"fe80::1%eth0\": \"fe80::1%eth0\" is not an IP address",
            ),
        ];
        for (entry, want) in cases {
            let err = AddressRange::parse(entry).unwrap_err().to_string();
            assert!(
                err.starts_with(want),
                "{entry}: got {err:?}, want prefix {want:?}"
            );
        }
    }

    #[test]
    fn parse_entries_keeps_order_and_all_errors() {
        let (ranges, errors) = parse_entries(&["10.0.1.0/30", "bogus", "10.0.0.1", "10.0.0.0/99"]);
        assert_eq!(ranges.len(), 2);
        assert_eq!(ranges[0].first(), ip("10.0.1.0"));
        assert_eq!(ranges[1].first(), ip("10.0.0.1"));
        assert_eq!(errors.len(), 2);
        assert_eq!(errors[0].entry, "bogus");
        assert_eq!(errors[1].entry, "10.0.0.0/99");
    }

    #[test]
    fn contains_and_overlaps() {
        let a = AddressRange::parse("10.0.0.0/24").unwrap();
        assert!(a.contains(ip("10.0.0.0")) && a.contains(ip("10.0.0.255")));
        assert!(!a.contains(ip("10.0.1.0")));
        assert!(!a.contains(ip("::a00:0")), "families never mix");
        let b = AddressRange::parse("10.0.0.255-10.0.1.3").unwrap();
        let c = AddressRange::parse("10.0.1.0/24").unwrap();
        assert!(a.overlaps(&b) && b.overlaps(&c) && !a.overlaps(&c));
        let v6 = AddressRange::parse("::/0").unwrap();
        assert!(!v6.overlaps(&a));
    }

    #[test]
    fn prefixes() {
        let p: Prefix = "fd00:1::1234/64".parse().unwrap();
        assert!(p.contains(ip("fd00:1::ffff")));
        assert!(!p.contains(ip("fd00:2::1")));
        assert_eq!(p.network().to_string(), "fd00:1::/64");
        assert_eq!(p.to_string(), "fd00:1::1234/64");
        let all: Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("192.168.1.1")) && !all.contains(ip("fd00::1")));
        let host: Prefix = "10.1.2.3/32".parse().unwrap();
        assert!(host.contains(ip("10.1.2.3")) && !host.contains(ip("10.1.2.4")));
        assert!("10.0.0.1".parse::<Prefix>().is_err());
    }
}
