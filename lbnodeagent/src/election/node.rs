//! A node's name as members, sessions and elections carry it.
//!
//! Every view of the cluster names every node several times over (as a
//! member, in what others say is behind, as a VIP's winner and runners-up),
//! and views come many times a second. A `String` there is an allocation
//! and a copy at every clone and a byte comparison at every lookup. A name
//! is shared instead: a clone is a count, and two clones of one name are
//! equal without reading their bytes. Names from different sources (two
//! gossip frames, a Service's endpoints) still compare by their bytes, so
//! the order and the equality are exactly those of the `str`. Those bytes
//! are compared in place, a word at a time: names are a few bytes long,
//! and the call to the C library's `memcmp` that a `str` comparison makes
//! cost more than the comparison itself (an eighth of the simulation's
//! time went there).

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// A Kubernetes Node's name, shared (see the module's doc).
#[derive(Clone)]
pub struct NodeName(Arc<str>);

impl NodeName {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for NodeName {
    fn default() -> Self {
        NodeName(Arc::from(""))
    }
}

impl Deref for NodeName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for NodeName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for NodeName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// `a == b`: in place when optimised (see the module's doc). Unoptimised,
/// as the tests' agents run, the loop costs more than the call it saves,
/// so `str`'s own comparison is used there.
#[inline]
fn same_bytes(a: &str, b: &str) -> bool {
    if cfg!(debug_assertions) {
        a == b
    } else {
        words_equal(a, b)
    }
}

/// `a.cmp(b)`, as [`same_bytes`].
#[inline]
fn order_bytes(a: &str, b: &str) -> Ordering {
    if cfg!(debug_assertions) {
        a.cmp(b)
    } else {
        words_order(a, b)
    }
}

/// `a == b`, in place, a word at a time.
#[inline]
fn words_equal(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i + 8 <= a.len() {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += 8;
    }
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// `a.cmp(b)`, in place: the same lexicographic order of bytes, a word
/// at a time (a big-endian word orders as its bytes do).
#[inline]
fn words_order(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let (x, y) = (word(a, i), word(b, i));
        if x != y {
            return x.cmp(&y);
        }
        i += 8;
    }
    while i < n {
        if a[i] != b[i] {
            return a[i].cmp(&b[i]);
        }
        i += 1;
    }
    a.len().cmp(&b.len())
}

#[inline]
fn word(bytes: &[u8], at: usize) -> u64 {
    let mut w = [0; 8];
    w.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(w)
}

impl PartialEq for NodeName {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || same_bytes(&self.0, &other.0)
    }
}

impl Eq for NodeName {}

impl PartialEq<str> for NodeName {
    fn eq(&self, other: &str) -> bool {
        same_bytes(&self.0, other)
    }
}

impl PartialEq<&str> for NodeName {
    fn eq(&self, other: &&str) -> bool {
        same_bytes(&self.0, other)
    }
}

impl PartialEq<String> for NodeName {
    fn eq(&self, other: &String) -> bool {
        same_bytes(&self.0, other)
    }
}

impl PartialEq<NodeName> for str {
    fn eq(&self, other: &NodeName) -> bool {
        same_bytes(self, &other.0)
    }
}

impl PartialEq<NodeName> for &str {
    fn eq(&self, other: &NodeName) -> bool {
        same_bytes(self, &other.0)
    }
}

impl PartialEq<NodeName> for String {
    fn eq(&self, other: &NodeName) -> bool {
        same_bytes(self, &other.0)
    }
}

impl Ord for NodeName {
    fn cmp(&self, other: &Self) -> Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            Ordering::Equal
        } else {
            order_bytes(&self.0, &other.0)
        }
    }
}

impl PartialOrd for NodeName {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// As the `str`'s, so that maps keyed by names can be asked with a `&str`.
impl Hash for NodeName {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

impl fmt::Debug for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl From<&str> for NodeName {
    fn from(name: &str) -> Self {
        NodeName(Arc::from(name))
    }
}

impl From<&String> for NodeName {
    fn from(name: &String) -> Self {
        NodeName(Arc::from(name.as_str()))
    }
}

impl From<String> for NodeName {
    fn from(name: String) -> Self {
        NodeName(Arc::from(name))
    }
}

impl From<NodeName> for String {
    fn from(name: NodeName) -> Self {
        name.0.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashSet};

    #[test]
    fn order_and_equality_are_the_names() {
        let a1 = NodeName::from("node-a");
        let a2 = NodeName::from(String::from("node-a"));
        let b = NodeName::from("node-b");
        assert_eq!(a1, a2, "equal by bytes, not only when shared");
        assert_eq!(a1.cmp(&a2), Ordering::Equal);
        assert_eq!(a1.cmp(&a1.clone()), Ordering::Equal);
        assert!(a1 < b && b > a2);
        assert_ne!(a1, b);
        assert_eq!(a1, "node-a");
        assert_eq!("node-b", b);
    }

    /// The in-place comparison is `str`'s, across the word boundary and
    /// for prefixes, bytes above 0x7f and names of any length.
    #[test]
    fn in_place_comparison_is_strs() {
        let names = [
            "",
            "a",
            "ab",
            "b",
            "c",
            "n00",
            "n01",
            "n10",
            "worker-0001",
            "worker-0001.rack01",
            "worker-0001.rack02",
            "worker-0002.rack01",
            "worker-000",
            "abcdefgh",
            "abcdefgi",
            "abcdefgh\u{e9}",
            "abcdefghi",
            "abcdefg",
            "Zz",
            "\u{e9}t\u{e9}",
            "\u{e9}",
        ];
        for a in names {
            for b in names {
                let (x, y) = (NodeName::from(a), NodeName::from(b));
                assert_eq!(x.cmp(&y), a.cmp(b), "{a:?} against {b:?}");
                assert_eq!(x == y, a == b, "{a:?} against {b:?}");
                assert_eq!(x == b, a == b, "{a:?} against {b:?}");
                assert_eq!(words_equal(a, b), a == b);
                assert_eq!(words_order(a, b), a.cmp(b));
            }
        }
    }

    #[test]
    fn maps_are_asked_by_str() {
        let set: BTreeSet<NodeName> = ["x", "y"].into_iter().map(NodeName::from).collect();
        assert!(set.contains("x") && !set.contains("z"));
        let hashed: HashSet<NodeName> = ["x", "y"].into_iter().map(NodeName::from).collect();
        assert!(hashed.contains("y") && !hashed.contains("z"));
    }
}
