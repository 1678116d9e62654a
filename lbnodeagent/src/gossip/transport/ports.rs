//! Loopback ports and destinations: which local socket a datagram goes out on, and where it goes, kept bounded.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use tracing::warn;

use super::{LOCAL_PROBE_TTL, MAX_LOCAL_PROBES};
use crate::gossip::frame::canonical;

/// A port unused for this long is closed when over [`MAX_PORTS`].
pub(super) const PORT_IDLE: Duration = Duration::from_secs(2);

/// A loopback socket dedicated to one peer, connected to the codec. A plain
/// non-blocking std socket: injecting is one `send` syscall that either
/// queues the datagram or fails at once, with no readiness state that a
/// fresh tokio socket would not have yet.
pub(super) struct Port {
    pub(super) socket: std::net::UdpSocket,
    pub(super) local: SocketAddr,
    pub(super) last_used: tokio::time::Instant,
}

impl Port {
    pub(super) fn open(codec: SocketAddr) -> io::Result<Port> {
        let socket = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        socket.connect(codec)?;
        socket.set_nonblocking(true)?;
        let local = socket.local_addr()?;
        Ok(Port {
            socket,
            local,
            last_used: tokio::time::Instant::now(),
        })
    }

    /// The codec's bytes for this peer. Loopback delivery normally completes
    /// before the codec's `send_to` returns, so the first read finds them;
    /// otherwise poll briefly (yield, then 1 ms sleeps) up to `timeout`.
    pub(super) async fn recv(
        &self,
        buf: &mut [u8],
        timeout: Duration,
    ) -> io::Result<Option<usize>> {
        let deadline = tokio::time::Instant::now() + timeout;
        for attempt in 0u32.. {
            match self.socket.recv(buf) {
                Ok(len) => return Ok(Some(len)),
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => {}
                Err(error) => return Err(error),
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            if attempt < 8 {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        Ok(None)
    }

    /// A datagram already queued, if any; never waits.
    pub(super) fn try_recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.socket.recv(buf).ok()
    }
}

/// Which destinations name this socket (see the module doc).
pub(super) struct Destinations {
    pub(super) local: SocketAddr,
    pub(super) configured: Vec<SocketAddr>,
    /// With a wildcard listen address: whether the host may bind foreign
    /// addresses, which makes [`Destinations::is_local`] meaningless.
    pub(super) nonlocal_bind: bool,
    pub(super) probed: HashMap<IpAddr, (bool, tokio::time::Instant)>,
}

impl Destinations {
    pub(super) fn new(local: SocketAddr, configured: Vec<SocketAddr>) -> Destinations {
        let local = canonical(local);
        // Documentation addresses (RFC 5737, RFC 3849): never assigned to a
        // host, so binding one succeeds only where any address would.
        let nonlocal_bind = local.ip().is_unspecified()
            && [
                IpAddr::from(Ipv4Addr::new(192, 0, 2, 1)),
                IpAddr::from(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
            ]
            .into_iter()
            .any(bindable);
        if nonlocal_bind && configured.is_empty() {
            warn!(listen = %local, "this host allows binding foreign addresses (ip_nonlocal_bind), so gossip cannot tell which addresses are its own; it accepts only frames sent to the listen address; set gossip.advertise");
        }
        Destinations {
            local,
            configured,
            nonlocal_bind,
            probed: HashMap::new(),
        }
    }

    pub(super) fn accepts(&mut self, to: SocketAddr) -> bool {
        let to = canonical(to);
        if self.configured.contains(&to) {
            return true;
        }
        if to.port() != self.local.port() {
            return false;
        }
        match self.local.ip() {
            ip if !ip.is_unspecified() => to.ip() == ip,
            // An IPv4 wildcard only receives IPv4.
            IpAddr::V4(_) if to.is_ipv6() => false,
            _ => !self.nonlocal_bind && self.is_local(to.ip()),
        }
    }

    /// Whether `ip` is an address of this host, by the kernel's word.
    pub(super) fn is_local(&mut self, ip: IpAddr) -> bool {
        if ip.is_unspecified() || ip.is_multicast() {
            return false;
        }
        let now = tokio::time::Instant::now();
        if let Some((local, at)) = self.probed.get(&ip)
            && now.duration_since(*at) < LOCAL_PROBE_TTL
        {
            return *local;
        }
        if self.probed.len() >= MAX_LOCAL_PROBES {
            self.probed
                .retain(|_, (_, at)| now.duration_since(*at) < LOCAL_PROBE_TTL);
            if self.probed.len() >= MAX_LOCAL_PROBES {
                self.probed.clear();
            }
        }
        let local = bindable(ip);
        self.probed.insert(ip, (local, now));
        local
    }
}

/// A UDP socket on `addr`. An IPv6 wildcard receives IPv4 too, whatever
/// the host's `net.ipv6.bindv6only` says: the shipped `[::]` serves IPv4,
/// IPv6 and dual-stack fleets alike.
pub fn bind_udp(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if addr.is_ipv6() && addr.ip().is_unspecified() {
        socket.set_only_v6(false)?;
    }
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

/// Where a datagram for `to` goes from an IPv6 (`v6`) or IPv4 socket: an
/// IPv6 socket reaches an IPv4 peer at its mapped address.
pub(super) fn on_wire(v6: bool, to: SocketAddr) -> SocketAddr {
    match to {
        SocketAddr::V4(v4) if v6 => {
            SocketAddr::new(IpAddr::V6(v4.ip().to_ipv6_mapped()), v4.port())
        }
        _ => to,
    }
}

/// Whether a UDP socket can be bound to `ip`: the kernel allows it for its
/// own addresses only (unless nonlocal binding is on).
pub(super) fn bindable(ip: IpAddr) -> bool {
    std::net::UdpSocket::bind((ip, 0)).is_ok()
}
