//! A `Transport` wrapper that counts bytes and messages per socket.
//! chitchat's `ChannelTransport::statistics()` only gives totals for the
//! whole in-memory network; bandwidth per node needs this.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport};

/// Traffic of one socket, in chitchat's own byte counts (the encoded
/// envelope: no frame, UDP or IP overhead).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub bytes_sent: u64,
    pub messages_sent: u64,
    pub bytes_received: u64,
    pub messages_received: u64,
    /// The largest message this socket sent.
    pub largest_sent: u64,
    /// Sends the inner transport refused (with chitchat's `ChannelTransport`
    /// given an MTU: a message too large for one datagram).
    pub send_failures: u64,
}

#[derive(Clone)]
pub struct CountingTransport<T> {
    inner: T,
    stats: Arc<Mutex<HashMap<SocketAddr, Traffic>>>,
}

impl<T: Transport> CountingTransport<T> {
    pub fn new(inner: T) -> Self {
        CountingTransport {
            inner,
            stats: Arc::default(),
        }
    }

    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// Traffic per socket address, since it was opened (or the last reset).
    pub fn traffic(&self) -> HashMap<SocketAddr, Traffic> {
        self.stats.lock().expect("stats lock").clone()
    }

    pub fn reset(&self) {
        for traffic in self.stats.lock().expect("stats lock").values_mut() {
            *traffic = Traffic::default();
        }
    }
}

#[async_trait]
impl<T: Transport> Transport for CountingTransport<T> {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let inner = self.inner.open(listen_addr).await?;
        let addr = inner.local_addr()?;
        self.stats
            .lock()
            .expect("stats lock")
            .insert(addr, Traffic::default());
        Ok(Box::new(CountingSocket {
            inner,
            addr,
            stats: self.stats.clone(),
        }))
    }
}

struct CountingSocket {
    inner: Box<dyn Socket>,
    addr: SocketAddr,
    stats: Arc<Mutex<HashMap<SocketAddr, Traffic>>>,
}

impl CountingSocket {
    fn record(&self, f: impl FnOnce(&mut Traffic)) {
        f(self
            .stats
            .lock()
            .expect("stats lock")
            .entry(self.addr)
            .or_default());
    }
}

#[async_trait]
impl Socket for CountingSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        Ok(self.addr)
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let outcome = match self.inner.send(to, envelope).await {
            Ok(outcome) => outcome,
            Err(error) => {
                self.record(|t| t.send_failures += 1);
                return Err(error);
            }
        };
        self.record(|t| {
            t.bytes_sent += outcome.num_bytes_sent as u64;
            t.messages_sent += 1;
            t.largest_sent = t.largest_sent.max(outcome.num_bytes_sent as u64);
        });
        Ok(outcome)
    }

    // Cancel-safe because the inner `recv` is and nothing awaits after it.
    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        let outcome = self.inner.recv().await?;
        self.record(|t| {
            t.bytes_received += outcome.num_bytes_received as u64;
            t.messages_received += 1;
        });
        Ok(outcome)
    }
}
