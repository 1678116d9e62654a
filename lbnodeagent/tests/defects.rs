//! The planted defects still apply to the code they plant into: those
//! of the core in `lbnodeagent/defects/` (docs/agent.md, "The
//! simulation") and those of the shell in `tests/defects/` (docs/agent.md,
//! the fault campaign). A patch that no longer applies plants nothing, and
//! their `run.sh`, which runs outside CI, would find out only when next
//! run. Needs `git` and the source tree as a git checkout.

use std::path::Path;
use std::process::Command;

#[test]
fn every_planted_defect_applies_to_the_code() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let top = crate_dir.parent().expect("the workspace above the crate");
    let listed = |dir: &Path| {
        let mut patches: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.expect("a directory entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "patch"))
            .collect();
        patches.sort();
        patches
    };
    let core = listed(&crate_dir.join("defects"));
    let shell = listed(&top.join("tests/defects"));
    assert!(core.len() >= 14, "core defects missing: {core:?}");
    assert!(shell.len() >= 6, "shell defects missing: {shell:?}");
    let patches: Vec<_> = core.into_iter().chain(shell).collect();
    let stale: Vec<String> = patches
        .iter()
        .filter_map(|p| {
            // Whoever owns the checkout: the patch is only checked.
            let out = Command::new("git")
                .args(["-c", "safe.directory=*"])
                .arg("-C")
                .arg(top)
                .args(["apply", "--check"])
                .arg(p)
                .output()
                .expect("this test needs git");
            (!out.status.success()).then(|| {
                format!(
                    "{}: {}",
                    p.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            })
        })
        .collect();
    assert!(
        stale.is_empty(),
        "planted defects that no longer apply; plant each again at the same rule (docs/agent.md):\n{}",
        stale.join("\n")
    );
}
