//! The agent's log lines as a pipe, journald or a file receive them.

use std::path::Path;
use std::process::Command;

/// With stderr on a pipe (not a terminal), the agent logs from its first
/// line without colour escapes.
#[test]
fn logs_to_a_pipe_carry_no_colour_escapes() {
    let out = Command::new(env!("CARGO_BIN_EXE_lbnodeagent"))
        .args(["simulate", "-f", "simulate/edge-failover.yaml"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"))
        .env("RUST_LOG", "debug")
        .env_remove("NO_COLOR")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.lines()
            .next()
            .is_some_and(|l| l.contains("lbnodeagent starting")),
        "{err}"
    );
    assert!(!out.stderr.contains(&0x1b), "escapes in {err:?}");
    assert!(!out.stdout.contains(&0x1b), "escapes in the table");
}

/// A reader that went away (`lbnodeagent simulate ... | head -0`) ends a
/// command quietly: no panic, no "Broken pipe" message.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_lbnodeagent"))
        .args(["simulate", "-f", "simulate/edge-failover.yaml"])
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests"))
        .stdout(writer)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
    assert_eq!(
        out.status.signal(),
        Some(13),
        "ended by SIGPIPE, as `head` expects: {out:?}"
    );
}
