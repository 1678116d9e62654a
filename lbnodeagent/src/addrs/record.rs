//! The record file: which addresses the agent added, kept under the run
//! directory (`/run/lbnodeagent/addresses.json`) so that a restarted agent
//! finds them on kernels that drop `IFA_PROTO` (before 5.18: RHEL 8 and 9).
//!
//! The file is rewritten whole on every change, through a temporary file and
//! a rename, so a crash leaves either the old or the new list, never half of
//! one. `/run` is a tmpfs: the record dies with the addresses at reboot.
//! The write and its `fsync` run on a blocking thread ([`RecordWriter`]),
//! never on the async runtime, one at a time and in the order the backend
//! took its snapshots.
//!
//! A file that does not parse, or that another version of the agent wrote,
//! never stops the agent: it is renamed to `addresses.json.bad-<unix
//! seconds>` for the operator to look at, and the backend goes on with what
//! the kernel shows (see `netlink` for how it then recognises its
//! addresses).

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Error, Result};

pub(crate) const FILE_NAME: &str = "addresses.json";

/// One address, by interface name: indexes are reassigned when a link is
/// recreated, names are what an operator reads.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Entry {
    pub interface: String,
    pub address: IpAddr,
    pub prefix_len: u8,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    /// Bumped on an incompatible change, so an old agent refuses a new file
    /// instead of misreading it.
    version: u32,
    addresses: BTreeSet<Entry>,
}

const VERSION: u32 = 1;

pub(super) struct Record {
    path: PathBuf,
}

/// What [`Record::load_or_set_aside`] found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Loaded {
    Found(BTreeSet<Entry>),
    /// The file was unusable and now has this name.
    SetAside(PathBuf),
}

impl Record {
    pub fn new(run_dir: &Path) -> Record {
        Record {
            path: run_dir.join(FILE_NAME),
        }
    }

    /// The entries of a previous run: `Found` with none if there is no file,
    /// `SetAside` if the file was unusable and was renamed out of the way.
    pub fn load_or_set_aside(&self) -> Result<Loaded> {
        match self.load() {
            Ok(entries) => Ok(Loaded::Found(entries)),
            Err(Error::RecordCorrupt { source, .. }) => {
                let secs = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs());
                let aside = self.path.with_extension(format!("json.bad-{secs}"));
                match fs::rename(&self.path, &aside) {
                    Ok(()) => {
                        tracing::warn!(path = %self.path.display(), moved_to = %aside.display(), error = %source,
                        "the address record is not valid; set it aside and going on with what the kernel shows")
                    }
                    // The next write replaces it anyway.
                    Err(e) => {
                        tracing::warn!(path = %self.path.display(), error = %source, rename_error = %e,
                        "the address record is not valid and cannot be renamed; going on with what the kernel shows")
                    }
                }
                Ok(Loaded::SetAside(aside))
            }
            Err(e) => Err(e),
        }
    }

    /// The entries of a previous run; none if there is no file.
    fn load(&self) -> Result<BTreeSet<Entry>> {
        let text = match fs::read(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
            Err(source) => {
                return Err(Error::RecordRead {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let file: File = serde_json::from_slice(&text).map_err(|source| Error::RecordCorrupt {
            path: self.path.clone(),
            source,
        })?;
        if file.version != VERSION {
            return Err(Error::RecordCorrupt {
                path: self.path.clone(),
                source: serde::de::Error::custom(format!(
                    "version {} is not {VERSION}, the version this agent writes",
                    file.version
                )),
            });
        }
        Ok(file.addresses)
    }

    /// Replaces the file with `entries`. Blocking: call it through a
    /// [`RecordWriter`] from async code.
    pub fn store(&self, entries: &BTreeSet<Entry>) -> Result<()> {
        let write_err = |source| Error::RecordWrite {
            path: self.path.clone(),
            source,
        };
        if let Some(dir) = self.path.parent() {
            fs::create_dir_all(dir).map_err(write_err)?;
        }
        let file = File {
            version: VERSION,
            addresses: entries.clone(),
        };
        let mut text = serde_json::to_vec_pretty(&file).expect("the record serializes");
        text.push(b'\n');
        let tmp = self.path.with_extension("json.tmp");
        let mut f = fs::File::create(&tmp).map_err(write_err)?;
        f.write_all(&text).map_err(write_err)?;
        f.sync_all().map_err(write_err)?;
        drop(f);
        fs::rename(&tmp, &self.path).map_err(write_err)
    }
}

/// The entries at one point in the backend's state; `seq` orders snapshots.
pub(super) struct Snapshot {
    pub seq: u64,
    pub entries: BTreeSet<Entry>,
}

/// Writes snapshots of the record off the async runtime. Writes never
/// overlap (the lock is held by the blocking write itself, so a caller that
/// stops waiting cannot let the next write start early), and a snapshot
/// older than one already written is skipped: the newer one holds the state
/// that followed it.
#[derive(Clone)]
pub(super) struct RecordWriter {
    record: Arc<Record>,
    /// `seq` of the last snapshot written.
    written: Arc<tokio::sync::Mutex<u64>>,
}

impl RecordWriter {
    pub fn new(record: Record) -> RecordWriter {
        RecordWriter {
            record: Arc::new(record),
            written: Arc::default(),
        }
    }

    /// Returns once `snapshot`, or a later one, is on disk.
    pub async fn save(&self, snapshot: Snapshot) -> Result<()> {
        let mut written = Arc::clone(&self.written).lock_owned().await;
        if snapshot.seq <= *written {
            return Ok(());
        }
        let record = Arc::clone(&self.record);
        let write = tokio::task::spawn_blocking(move || {
            record.store(&snapshot.entries)?;
            *written = snapshot.seq;
            Ok(())
        });
        match write.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Only when the runtime shuts down, and its caller with it.
            Err(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(interface: &str, address: &str, prefix_len: u8) -> Entry {
        Entry {
            interface: interface.to_string(),
            address: address.parse().unwrap(),
            prefix_len,
        }
    }

    #[test]
    fn missing_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Record::new(dir.path()).load().unwrap().is_empty());
    }

    #[test]
    fn store_then_load_round_trips_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let run_dir = dir.path().join("run/lbnodeagent");
        let record = Record::new(&run_dir);
        let entries: BTreeSet<Entry> = [
            entry("eth0", "10.0.0.5", 24),
            entry("kube-lb0", "fd00::5", 128),
        ]
        .into();
        record.store(&entries).unwrap();
        assert_eq!(record.load().unwrap(), entries);
        let names: Vec<String> = fs::read_dir(&run_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec![FILE_NAME.to_string()]);

        record.store(&BTreeSet::new()).unwrap();
        assert!(record.load().unwrap().is_empty());
    }

    #[test]
    fn corrupt_or_foreign_version_is_an_error_that_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let record = Record::new(dir.path());
        fs::write(&record.path, "{not json").unwrap();
        let err = record.load().unwrap_err();
        assert!(matches!(err, Error::RecordCorrupt { .. }), "{err}");
        assert!(err.to_string().contains("delete it"), "{err}");

        fs::write(&record.path, r#"{"version": 7, "addresses": []}"#).unwrap();
        let err = record.load().unwrap_err();
        assert!(err.to_string().contains("version 7"), "{err}");
    }

    #[test]
    fn an_unusable_file_is_set_aside_and_the_next_write_starts_afresh() {
        for text in ["{not json", r#"{"version": 7, "addresses": []}"#, ""] {
            let dir = tempfile::tempdir().unwrap();
            let record = Record::new(dir.path());
            fs::write(&record.path, text).unwrap();
            let Loaded::SetAside(aside) = record.load_or_set_aside().unwrap() else {
                panic!("{text:?} was accepted");
            };
            let name = aside.file_name().unwrap().to_str().unwrap();
            assert!(name.starts_with("addresses.json.bad-"), "{name}");
            assert_eq!(fs::read_to_string(&aside).unwrap(), text, "kept as it was");
            assert!(!record.path.exists());
            assert_eq!(
                record.load_or_set_aside().unwrap(),
                Loaded::Found(BTreeSet::new())
            );
            let entries: BTreeSet<Entry> = [entry("eth0", "10.0.0.5", 24)].into();
            record.store(&entries).unwrap();
            assert_eq!(record.load_or_set_aside().unwrap(), Loaded::Found(entries));
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn snapshots_are_written_off_the_runtime_and_never_older_over_newer() {
        let dir = tempfile::tempdir().unwrap();
        let record = Record::new(dir.path());
        let path = record.path.clone();
        let writer = RecordWriter::new(record);
        let snapshot = |seq, address: &str| Snapshot {
            seq,
            entries: [entry("eth0", address, 24)].into(),
        };
        // On a current-thread runtime a write on the runtime would leave
        // nothing for this task to do in between; off it, the ticker runs.
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let ticker = tokio::spawn({
            let ticks = std::sync::Arc::clone(&ticks);
            async move {
                loop {
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        });
        let (first, second) = tokio::join!(
            writer.save(snapshot(2, "10.0.0.2")),
            writer.save(snapshot(1, "10.0.0.1"))
        );
        first.unwrap();
        second.unwrap();
        ticker.abort();
        assert!(ticks.load(std::sync::atomic::Ordering::Relaxed) > 0);
        let on_disk = Record::new(path.parent().unwrap()).load().unwrap();
        assert_eq!(
            on_disk,
            snapshot(2, "10.0.0.2").entries,
            "the newer one stays"
        );
        writer.save(snapshot(3, "10.0.0.3")).await.unwrap();
        assert_eq!(
            Record::new(path.parent().unwrap()).load().unwrap(),
            snapshot(3, "10.0.0.3").entries
        );
    }

    #[test]
    fn file_format_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        let record = Record::new(dir.path());
        record
            .store(&[entry("eth0", "10.0.0.5", 24)].into())
            .unwrap();
        let text = fs::read_to_string(&record.path).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value,
            serde_json::json!({
                "version": 1,
                "addresses": [{"interface": "eth0", "address": "10.0.0.5", "prefix_len": 24}]
            })
        );
    }
}
