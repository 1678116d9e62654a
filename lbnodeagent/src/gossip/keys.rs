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
//!
//! Anyone who can read a key can join the cluster and announce VIPs, and
//! anyone who can write it can split the cluster: a key file that users
//! other than its owner may read or write is refused, with the `chmod` that
//! fixes it. Key bytes are wiped from memory when the keys are dropped (a
//! reload replaces them), and so is the text they were read from.

use std::fmt;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

use super::GossipError;

pub(crate) type HmacSha256 = Hmac<Sha256>;

/// Shorter keys are rejected: HMAC-SHA256 is only as strong as its key, and
/// 32 bytes is the hash's own output size.
pub const MIN_KEY_LEN: usize = 32;

/// One signing key plus one more accepted during a rotation; a longer list
/// would mean a rotation that never finished.
pub const MAX_KEYS: usize = 2;

/// Permission bits a key file must not have: read or write for group or
/// others.
pub(crate) const SHARED_MODE_BITS: u32 = 0o066;

/// The gossip keys, kept as raw bytes that are zeroed on drop. An HMAC state
/// is keyed afresh per datagram: for keys up to the 64-byte block size that
/// is two compression rounds, and a kept keyed state would be key material
/// that nothing wipes.
#[derive(Clone)]
pub struct GossipKeys {
    keys: Vec<Zeroizing<Vec<u8>>>,
}

impl fmt::Debug for GossipKeys {
    // Never print key material, not even in a debug log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GossipKeys")
            .field("keys", &self.keys.len())
            .finish()
    }
}

impl GossipKeys {
    /// Keys from raw bytes, signing key first.
    pub fn from_keys<K: AsRef<[u8]>>(keys: &[K]) -> Result<GossipKeys, GossipError> {
        Self::build(keys.iter().map(AsRef::as_ref), Path::new("<memory>"))
    }

    /// Reads the key file (see the module doc for the format). The mode is
    /// checked on the file opened, so a file swapped in between cannot slip
    /// through.
    pub fn load(path: &Path) -> Result<GossipKeys, GossipError> {
        let read_err = |source| GossipError::KeyFile {
            path: path.to_path_buf(),
            source,
        };
        let mut file = fs::File::open(path).map_err(read_err)?;
        let mode = file.metadata().map_err(read_err)?.permissions().mode();
        if mode & SHARED_MODE_BITS != 0 {
            return Err(GossipError::KeyFileMode {
                path: path.to_path_buf(),
                mode: mode & 0o7777,
            });
        }
        let mut text = Zeroizing::new(String::new());
        file.read_to_string(&mut text).map_err(read_err)?;
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
            let bytes = Zeroizing::new(hex::decode(line).map_err(|_| GossipError::KeyNotHex {
                path: path.to_path_buf(),
                line: index + 1,
            })?);
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
        let mut kept = Vec::new();
        for (index, key) in keys.enumerate() {
            if key.len() < MIN_KEY_LEN {
                return Err(GossipError::KeyTooShort {
                    path: path.to_path_buf(),
                    line: index + 1,
                    len: key.len(),
                });
            }
            kept.push(Zeroizing::new(key.to_vec()));
        }
        if kept.is_empty() {
            return Err(GossipError::NoKey {
                path: path.to_path_buf(),
            });
        }
        if kept.len() > MAX_KEYS {
            return Err(GossipError::TooManyKeys {
                path: path.to_path_buf(),
                count: kept.len(),
            });
        }
        Ok(GossipKeys { keys: kept })
    }

    /// Fresh MACs under every key, in file order: frames are signed under
    /// each, and accepted under any.
    pub(crate) fn macs(&self) -> impl Iterator<Item = HmacSha256> + '_ {
        self.keys.iter().map(|key| {
            // HMAC accepts keys of any length, so this cannot fail.
            HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length")
        })
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
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

    fn key_file(mode: u32) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gossip.key");
        fs::write(&path, format!("{A}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn a_key_file_only_its_owner_can_read_and_write_loads() {
        for mode in [0o600, 0o400, 0o700, 0o610, 0o601] {
            let (_dir, path) = key_file(mode);
            let keys = GossipKeys::load(&path).unwrap_or_else(|e| panic!("{mode:o}: {e}"));
            assert_eq!(keys.len(), 1);
        }
    }

    #[test]
    fn a_key_file_others_can_read_or_write_is_refused_with_the_mode_to_use() {
        for mode in [0o640, 0o604, 0o644, 0o620, 0o602, 0o660, 0o666, 0o4644] {
            let (_dir, path) = key_file(mode);
            let err = GossipKeys::load(&path).unwrap_err();
            assert!(
                matches!(err, GossipError::KeyFileMode { mode: m, .. } if m == mode),
                "{mode:o}: {err}"
            );
            let text = err.to_string();
            assert!(
                text.contains(&format!("chmod 0600 {}", path.display())),
                "{text}"
            );
            assert!(text.contains(&format!("{mode:04o}")), "{text}");
            assert_eq!(err.metric_label(), "key_file");
        }
    }

    #[test]
    fn keys_are_stored_in_memory_that_is_wiped_on_drop() {
        fn wiped_on_drop<T: zeroize::ZeroizeOnDrop>(_: &T) {}
        let keys = parse(A).unwrap();
        for key in &keys.keys {
            wiped_on_drop(key);
        }
        // Keyed per use, the MAC is the one under the raw key.
        let mut mac = keys.macs().next().unwrap();
        mac.update(b"x");
        let mut raw = HmacSha256::new_from_slice(&hex::decode(A).unwrap()).unwrap();
        raw.update(b"x");
        assert_eq!(mac.finalize().into_bytes(), raw.finalize().into_bytes());
    }

    #[test]
    fn debug_does_not_print_keys() {
        let keys = parse(A).unwrap();
        let text = format!("{keys:?}");
        assert!(!text.contains("0001"), "{text}");
    }
}
