//! systemd's notify protocol (`Type=notify`): ready, status lines, the
//! watchdog, stopping. Without `NOTIFY_SOCKET` (a pod, a shell) each call
//! does nothing.

pub use sd_notify::NotifyState;

/// Tells systemd `state`; a failure is a debug line, never an error: the
/// service runs the same whether or not systemd hears it.
pub fn notify(state: &[NotifyState]) {
    if std::env::var_os("NOTIFY_SOCKET").is_some()
        && let Err(e) = sd_notify::notify(state)
    {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// Whether systemd expects watchdog pings (`WatchdogSec=`).
pub fn watchdog_enabled() -> bool {
    sd_notify::watchdog_enabled().is_some()
}
