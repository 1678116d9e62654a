//! Log output of both binaries, set up the same way: `RUST_LOG` filters,
//! lines go to stderr (stdout is for what a command prints), and colour
//! escapes are written only to a terminal. journald and log shippers store
//! bytes as they come, so an escape written to a pipe or a file stays in
//! every stored line; `NO_COLOR` (<https://no-color.org>) turns colour off
//! on a terminal too.

use std::ffi::OsStr;
use std::io::IsTerminal;

/// Whether to colour: only on a terminal, and not when `NO_COLOR` is set to
/// anything but the empty string.
pub fn colour(terminal: bool, no_color: Option<&OsStr>) -> bool {
    terminal && no_color.is_none_or(OsStr::is_empty)
}

/// Install the process-wide subscriber: the `RUST_LOG` filter, else
/// `default_filter`. Call it first thing in `main`; a second call changes
/// nothing.
pub fn init(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}

/// For the one-shot commands (`status`, `plan`, ...): a closed standard
/// output (`lbnodeagent status --json | head`) ends the process quietly, as
/// for any Unix tool, instead of a panic in `println!`. Rust ignores
/// SIGPIPE so that a write returns an error; the daemons keep that (a
/// peer closing a socket must not kill them), the commands restore the
/// default.
#[allow(unsafe_code)]
pub fn quiet_on_closed_pipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: called at start-up before any thread is spawned; the default
    // disposition runs no handler code in this process.
    unsafe {
        let _ = signal(Signal::SIGPIPE, SigHandler::SigDfl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(!colour(false, None), "a pipe or a file gets no escapes");
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR does not count (no-color.org)"
        );
        assert!(!colour(false, Some(OsStr::new(""))));
    }
}
