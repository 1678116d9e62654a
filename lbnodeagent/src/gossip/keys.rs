//! The shared gossip keys: loaded once from `key_file`, then used by the
//! authenticated transport to sign and verify every datagram.
//!
//! File format: text, one hex-encoded key per line (at least 32 bytes, so 64
//! hex digits; `openssl rand -hex 32` makes one). Blank lines and lines
//! starting with `#` are ignored. At most two keys: the current one first,
//! then the one being retired during a rotation. Frames carry a tag under
//! each configured key (the first key's first) and are accepted when any tag
//! verifies under any of ours (see `frame`). A rotation is two rolling
//! restarts, `[A]` → `[B, A]` → `[B]`: adjacent steps understand each other,
//! so the cluster never splits; only `[A]` and `[B]` do not.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::GossipError;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// Shorter keys are rejected: HMAC-SHA256 is only as strong as its key, and
/// 32 bytes is the hash's own output size.
pub const MIN_KEY_LEN: usize = 32;

/// One signing key plus one more accepted during a rotation; a longer list
/// would mean a rotation that never finished.
pub const MAX_KEYS: usize = 2;

/// The gossip keys, kept as ready HMAC states: cloning a keyed state skips
/// re-hashing the key for every datagram.
#[derive(Clone)]
pub struct GossipKeys {
    keyed: Vec<HmacSha256>,
}

impl fmt::Debug for GossipKeys {
    // Never print key material, not even in a debug log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GossipKeys")
            .field("keys", &self.keyed.len())
            .finish()
    }
}

impl GossipKeys {
    /// Keys from raw bytes, signing key first.
    pub fn from_keys<K: AsRef<[u8]>>(keys: &[K]) -> Result<GossipKeys, GossipError> {
        Self::build(keys.iter().map(AsRef::as_ref), Path::new("<memory>"))
    }

    /// Reads the key file (see the module doc for the format).
    pub fn load(path: &Path) -> Result<GossipKeys, GossipError> {
        let text = fs::read_to_string(path).map_err(|source| GossipError::KeyFile {
            path: path.to_path_buf(),
            source,
        })?;
        warn_if_world_readable(path);
        Self::parse(&text, path)
    }

    /// Parses key file text; `path` only names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<GossipKeys, GossipError> {
        let mut keys = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bytes = hex::decode(line).map_err(|_| GossipError::KeyNotHex {
                path: path.to_path_buf(),
                line: index + 1,
            })?;
            keys.push((index + 1, bytes));
        }
        if keys.len() > MAX_KEYS {
            return Err(GossipError::TooManyKeys {
                path: path.to_path_buf(),
                count: keys.len(),
            });
        }
        for (line, key) in &keys {
            if key.len() < MIN_KEY_LEN {
                return Err(GossipError::KeyTooShort {
                    path: path.to_path_buf(),
                    line: *line,
                    len: key.len(),
                });
            }
        }
        Self::build(keys.iter().map(|(_, k)| k.as_slice()), path)
    }

    fn build<'a>(
        keys: impl Iterator<Item = &'a [u8]>,
        path: &Path,
    ) -> Result<GossipKeys, GossipError> {
        let mut keyed = Vec::new();
        for (index, key) in keys.enumerate() {
            if key.len() < MIN_KEY_LEN {
                return Err(GossipError::KeyTooShort {
                    path: path.to_path_buf(),
                    line: index + 1,
                    len: key.len(),
                });
            }
            // HMAC accepts keys of any length, so this cannot fail.
            let mac = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
            keyed.push(mac);
        }
        if keyed.is_empty() {
            return Err(GossipError::NoKey {
                path: path.to_path_buf(),
            });
        }
        if keyed.len() > MAX_KEYS {
            return Err(GossipError::TooManyKeys {
                path: path.to_path_buf(),
                count: keyed.len(),
            });
        }
        Ok(GossipKeys { keyed })
    }

    /// Fresh MACs under every key, in file order: frames are signed under
    /// each, and accepted under any.
    pub(crate) fn macs(&self) -> impl Iterator<Item = HmacSha256> + '_ {
        self.keyed.iter().cloned()
    }

    pub fn len(&self) -> usize {
        self.keyed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keyed.is_empty()
    }
}

/// Anyone who can read the key can join the cluster and inject membership, so
/// a key file readable by every local user deserves a loud warning (not an
/// error: packaging decides the mode, and a refusal to start would turn a
/// permission slip into an outage).
fn warn_if_world_readable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = fs::metadata(path)
        && meta.permissions().mode() & 0o004 != 0
    {
        tracing::warn!(path = %path.display(), "gossip key file is readable by every user; chmod 600 it");
    }
}

/// Where the key file is expected when the config does not say.
pub fn default_key_file() -> PathBuf {
    PathBuf::from("/etc/lbnodeagent/gossip.key")
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
    const B: &str = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

    fn parse(text: &str) -> Result<GossipKeys, GossipError> {
        GossipKeys::parse(text, Path::new("/k"))
    }

    #[test]
    fn one_or_two_hex_keys_with_comments() {
        assert_eq!(parse(&format!("{A}\n")).unwrap().len(), 1);
        let two = parse(&format!("# new key signs\n{B}\n\n  {A}  \n")).unwrap();
        assert_eq!(two.len(), 2);
    }

    #[test]
    fn short_key_is_rejected_with_its_line() {
        let err = parse(&format!("{A}\n00112233\n")).unwrap_err();
        assert!(
            matches!(
                err,
                GossipError::KeyTooShort {
                    line: 2,
                    len: 4,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("at least 32 bytes"), "{err}");
    }

    #[test]
    fn bad_files_are_rejected() {
        assert!(matches!(parse(""), Err(GossipError::NoKey { .. })));
        assert!(matches!(parse("# only\n"), Err(GossipError::NoKey { .. })));
        assert!(matches!(
            parse("zz\n"),
            Err(GossipError::KeyNotHex { line: 1, .. })
        ));
        assert!(matches!(
            parse(&format!("{A}\n{B}\n{A}\n")),
            Err(GossipError::TooManyKeys { count: 3, .. })
        ));
        assert!(matches!(
            GossipKeys::from_keys(&[[7u8; 31]]),
            Err(GossipError::KeyTooShort { len: 31, .. })
        ));
    }

    #[test]
    fn missing_file_names_the_path() {
        let err = GossipKeys::load(Path::new("/nonexistent/gossip.key")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/gossip.key"), "{err}");
    }

    #[test]
    fn debug_does_not_print_keys() {
        let keys = parse(A).unwrap();
        let text = format!("{keys:?}");
        assert!(!text.contains("0001"), "{text}");
    }
}
