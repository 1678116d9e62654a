//! What both binaries run beside their loop, written once: the admin
//! server (`/healthz`, `/readyz`, `/metrics`), the Kubernetes client and
//! its User-Agent, shutdown and reload signals, systemd notification and
//! the Event writer.
//!
//! Each piece is a thin adapter: it decides nothing about addresses, so a
//! binary's loop stays the one place that owns its state.

pub mod admin;
pub mod client;
pub mod events;
pub mod notify;
pub mod signals;

pub use crate::VERSION;
