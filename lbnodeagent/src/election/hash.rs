//! The tie-break key of SPEC §5.7, shared with MetalLB's L2 election so
//! that clusters without preferences keep the order they had.

use sha2::{Digest, Sha256};

/// `sha256(node + "#" + ip)`, with `ip` in canonical text form.
pub fn rank_key(node: &str, ip_text: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(node.as_bytes());
    h.update(b"#");
    h.update(ip_text.as_bytes());
    h.finalize().into()
}

/// A node's place in a VIP's tie-break order, first smallest: the key,
/// then the name (two names never share a key in practice, but the order
/// must be total).
pub fn order_key<'a>(node: &'a str, ip_text: &str) -> ([u8; 32], &'a str) {
    (rank_key(node, ip_text), node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_sha256_of_the_concatenation() {
        // sha256("node-a#10.0.0.1"), computed with `printf node-a#10.0.0.1 | sha256sum`.
        assert_eq!(
            hex::encode(rank_key("node-a", "10.0.0.1")),
            "dd41591fe8f31f9f38e297fe9892a8eff47892ea017c4167619a62f366fb8149"
        );
    }
}
