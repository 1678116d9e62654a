//! Shutdown and reload signals, through signal-hook: SIGTERM and SIGINT
//! stop, SIGHUP (when asked for) reloads. A signal that arrives while the
//! loop is busy waits in the stream; none is lost.

use futures::StreamExt;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGHUP: read the configuration again.
    Reload,
    /// SIGTERM or SIGINT: leave cleanly.
    Stop,
}

/// The signals a binary handles, from the moment this is made.
pub struct Signals {
    inner: signal_hook_tokio::Signals,
}

impl Signals {
    /// Stop signals, and SIGHUP too when `reload`: a binary that does not
    /// reload keeps SIGHUP's default.
    pub fn new(reload: bool) -> std::io::Result<Self> {
        let inner = if reload {
            signal_hook_tokio::Signals::new([SIGTERM, SIGINT, SIGHUP])?
        } else {
            signal_hook_tokio::Signals::new([SIGTERM, SIGINT])?
        };
        Ok(Signals { inner })
    }

    /// The next signal; `None` never comes while the process lives.
    pub async fn next(&mut self) -> Option<Signal> {
        let s = self.inner.next().await?;
        Some(if s == SIGHUP {
            Signal::Reload
        } else {
            Signal::Stop
        })
    }

    /// Waits for a stop signal (reloads are not asked for here).
    pub async fn stopped(mut self) {
        while let Some(s) = self.next().await {
            if s == Signal::Stop {
                return;
            }
        }
        std::future::pending::<()>().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real SIGHUP then SIGTERM to this process come out in order as a
    /// reload then a stop, and the process lives on.
    #[tokio::test]
    async fn signals_arrive_as_reload_then_stop() {
        let mut s = Signals::new(true).unwrap();
        let pid = nix::unistd::Pid::this();
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
        let first = tokio::time::timeout(std::time::Duration::from_secs(5), s.next()).await;
        assert_eq!(first.unwrap(), Some(Signal::Reload));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), s.next()).await;
        assert_eq!(second.unwrap(), Some(Signal::Stop));
    }
}
