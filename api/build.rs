//! Names the commit a binary was built from, so that `--version`, the log
//! and the NodeAgent record say exactly which build runs: `HOSTLB_COMMIT`
//! from the environment when set (a build from a source tarball), else
//! git's HEAD, else `unknown`. Every binary shows the same, through
//! `hostlb_api::VERSION`.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=HOSTLB_COMMIT");
    let commit = std::env::var("HOSTLB_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(from_git)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=HOSTLB_COMMIT={commit}");
}

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn from_git() -> Option<String> {
    let head = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Built again when HEAD moves (a commit, a checkout). Not on the index:
    // git itself rewrites it on reads, which would rebuild on every run.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let dir = PathBuf::from(dir);
        // Only paths that exist: cargo takes a missing one as changed. A
        // directory counts as changed when anything under it is.
        for f in ["HEAD", "packed-refs", "refs/heads"].map(|f| dir.join(f)) {
            if f.exists() {
                println!("cargo:rerun-if-changed={}", f.display());
            }
        }
    }
    Some(head)
}
