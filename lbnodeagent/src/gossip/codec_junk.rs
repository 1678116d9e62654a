//! Junk at the codec's loopback socket: counted, and logged at most once a
//! minute.
//!
//! Any local process can send datagrams to the codec (chitchat's own
//! `UdpSocket` on `127.0.0.1`, see `transport`), and chitchat logs a warning
//! for every one it cannot decode, from inside its receive loop, where the
//! transport never sees them. So while the transport polls the codec, the
//! codec's events go through [`CodecJunk`]: that warning is counted instead
//! (in `dropped_loopback`, and in a tally the transport reports at most once
//! a minute), and every other event passes to the subscriber that was in
//! place when the socket was opened.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Level, Metadata, Subscriber};

use super::counters::AuthCounters;

/// Where chitchat's codec logs from, and what it says about a datagram it
/// cannot decode.
const CODEC_TARGET: &str = "chitchat::transport::udp";
const UNDECODABLE: &str = "invalid-chitchat-payload";

/// The subscriber in place while the codec is polled.
pub(super) struct CodecJunk {
    inner: Dispatch,
    counters: Arc<AuthCounters>,
    /// Undecodable datagrams not yet reported in a log line.
    unreported: Arc<AtomicU64>,
}

impl CodecJunk {
    /// Wraps the current default subscriber. Returns the dispatcher to poll
    /// the codec under and the tally of datagrams not yet reported.
    pub(super) fn dispatch(counters: Arc<AuthCounters>) -> (Dispatch, Arc<AtomicU64>) {
        let unreported = Arc::new(AtomicU64::new(0));
        let inner = tracing::dispatcher::get_default(Dispatch::clone);
        let junk = CodecJunk {
            inner,
            counters,
            unreported: Arc::clone(&unreported),
        };
        (Dispatch::new(junk), unreported)
    }
}

fn is_codec_warning(metadata: &Metadata<'_>) -> bool {
    metadata.target() == CODEC_TARGET && *metadata.level() == Level::WARN
}

/// Whether an event's message is `expected`.
struct MessageIs {
    expected: &'static str,
    found: bool,
}

impl Visit for MessageIs {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.found = value == self.expected;
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.found = format!("{value:?}") == self.expected;
        }
    }
}

impl Subscriber for CodecJunk {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        // Other callsites keep the interest the other subscribers give them.
        if is_codec_warning(metadata) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::WARN)
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        is_codec_warning(metadata) || self.inner.enabled(metadata)
    }

    fn new_span(&self, span: &Attributes<'_>) -> Id {
        self.inner.new_span(span)
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        self.inner.record(span, values);
    }

    fn record_follows_from(&self, span: &Id, follows: &Id) {
        self.inner.record_follows_from(span, follows);
    }

    fn event(&self, event: &Event<'_>) {
        if is_codec_warning(event.metadata()) {
            let mut undecodable = MessageIs {
                expected: UNDECODABLE,
                found: false,
            };
            event.record(&mut undecodable);
            if undecodable.found {
                AuthCounters::add(&self.counters.dropped_loopback, 1);
                self.unreported.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        if self.inner.enabled(event.metadata()) {
            self.inner.event(event);
        }
    }

    fn enter(&self, span: &Id) {
        self.inner.enter(span);
    }

    fn exit(&self, span: &Id) {
        self.inner.exit(span);
    }

    fn clone_span(&self, id: &Id) -> Id {
        self.inner.clone_span(id)
    }

    fn try_close(&self, id: Id) -> bool {
        self.inner.try_close(id)
    }
}
