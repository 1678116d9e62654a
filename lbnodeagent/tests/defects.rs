//! The planted defects of `lbnodeagent/defects/` (docs/agent.md, "The
//! simulation") still apply to the core: a patch that no longer applies
//! plants nothing, and `defects/run.sh`, which runs outside CI, would
//! find out only when next run. Needs `git` and the source tree as a git
//! checkout.

use std::path::Path;
use std::process::Command;

#[test]
fn every_planted_defect_applies_to_the_core() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let top = crate_dir.parent().expect("the workspace above the crate");
    let mut patches: Vec<_> = std::fs::read_dir(crate_dir.join("defects"))
        .expect("lbnodeagent/defects")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    patches.sort();
    assert!(patches.len() >= 14, "defects missing: {patches:?}");
    let stale: Vec<String> = patches
        .iter()
        .filter_map(|p| {
            let out = Command::new("git")
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
