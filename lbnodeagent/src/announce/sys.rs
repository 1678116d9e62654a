//! The one module of the crate with `unsafe` code: a send-only `AF_PACKET`
//! socket and the `sockaddr_ll` that names the interface a frame leaves by.
//! socket2 opens the socket safely but has no constructor for link-layer
//! addresses, and Tokio's registration of a raw descriptor is unsafe since
//! it cannot check who owns the descriptor; those two steps, and two socket
//! options socket2 does not name (`SO_RCVBUFFORCE`, `ICMP6_FILTER`), are
//! all; and, for the crate's tests, entering a network namespace of their
//! own.

use std::io;
use std::mem::size_of;

use socket2::{Domain, Protocol, SockAddr, SockAddrStorage, SockFilter, Socket, Type};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::packet::Frame;

/// A raw packet socket that sends complete Ethernet frames. Protocol 0 makes
/// the kernel deliver nothing to it, so it never fills with received
/// traffic. Needs CAP_NET_RAW.
pub(super) struct PacketSocket {
    fd: AsyncFd<Socket>,
}

impl PacketSocket {
    /// Must be called inside a Tokio runtime (the socket registers with its
    /// reactor).
    pub fn open() -> io::Result<PacketSocket> {
        let socket = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(0)))?;
        socket.set_nonblocking(true)?;
        // SAFETY: the `Socket` owns its descriptor and returns the same one
        // from `as_raw_fd` until the `AsyncFd` drops it.
        let fd = unsafe { AsyncFd::register_with_interest(socket, Interest::WRITABLE) }?;
        Ok(PacketSocket { fd })
    }

    pub async fn send(&self, ifindex: u32, frame: &Frame) -> io::Result<()> {
        let to = link_layer_address(ifindex, frame)?;
        let sent = self
            .fd
            .async_io(Interest::WRITABLE, |s| s.send_to(&frame.bytes, &to))
            .await?;
        if sent != frame.bytes.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("sent {sent} of {} bytes", frame.bytes.len()),
            ));
        }
        Ok(())
    }
}

/// Receives the frames that can claim an address: every ARP frame (an
/// `AF_PACKET` socket for ETH_P_ARP, on all links) and every ICMPv6 message
/// (a raw ICMPv6 socket, for Neighbor Advertisements). Needs CAP_NET_RAW.
pub(super) struct ClaimSocket {
    arp: AsyncFd<Socket>,
    icmp6: Option<AsyncFd<Socket>>,
}

/// What one read returned, with where it came from: a claim counts only
/// from the interface its address is announced on, and an advertisement
/// only with the hop limit that proves it was sent on the link (RFC 4861
/// 7.1.2), as the kernel itself takes them.
pub(super) enum Received {
    /// An ARP frame, and the index of the interface it arrived on.
    Arp { frame: Vec<u8>, ifindex: u32 },
    /// An ICMPv6 message, the interface it arrived on, and the hop limit
    /// of its IPv6 header (`None` when the kernel did not say).
    Icmp6 {
        message: Vec<u8>,
        ifindex: u32,
        hop_limit: Option<u8>,
    },
}

impl ClaimSocket {
    pub fn open() -> io::Result<ClaimSocket> {
        let arp = Socket::new(
            Domain::PACKET,
            Type::RAW,
            Some(Protocol::from(i32::from(super::packet::ETH_P_ARP.to_be()))),
        )?;
        arp.set_nonblocking(true)?;
        room_for_bursts(&arp);
        // SAFETY: as in `PacketSocket::open`, the `Socket` owns the
        // descriptor for the life of the `AsyncFd`.
        let arp = unsafe { AsyncFd::register_with_interest(arp, Interest::READABLE) }?;
        // A host with IPv6 disabled has no ICMPv6: ARP alone then.
        let icmp6 = match Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)) {
            Ok(s) => {
                s.set_nonblocking(true)?;
                room_for_bursts(&s);
                advertisements_only(&s)?;
                // Each message then comes with its interface and hop limit.
                let on: libc::c_int = 1;
                set_option(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, &on)?;
                set_option(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, &on)?;
                // SAFETY: as above.
                Some(unsafe { AsyncFd::register_with_interest(s, Interest::READABLE) }?)
            }
            Err(_) => None,
        };
        Ok(ClaimSocket { arp, icmp6 })
    }

    /// Lets through the kernel only ARP frames that claim one of `watched`
    /// (their sender address is one): a LAN's other ARP (every client
    /// asking for a VIP, a prober every 10 ms) no longer wakes the agent
    /// to be dropped here. Past [`FILTERED_MAX`] addresses, every frame
    /// passes and the caller's own filter does the work.
    pub fn watch(&self, watched: &std::collections::BTreeSet<std::net::IpAddr>) -> io::Result<()> {
        let v4: Vec<u32> = watched
            .iter()
            .filter_map(|ip| match ip {
                std::net::IpAddr::V4(v4) => Some(u32::from(*v4)),
                std::net::IpAddr::V6(_) => None,
            })
            .collect();
        let arp = self.arp.get_ref();
        match arp_filter(&v4) {
            Some(program) => arp.attach_filter(&program),
            None => arp.detach_filter().or_else(|e| {
                // Nothing attached yet.
                if e.raw_os_error() == Some(libc::ENOENT) {
                    Ok(())
                } else {
                    Err(e)
                }
            }),
        }
    }

    /// The next frame or message; `None` for an ARP frame this host sent
    /// itself (a packet socket sees those too).
    pub async fn recv(&self) -> io::Result<Option<Received>> {
        let mut buf = [0u8; 1500];
        match &self.icmp6 {
            None => {
                let got = self
                    .arp
                    .async_io(Interest::READABLE, |s| recv_link(s, &mut buf))
                    .await?;
                Ok(arp_received(&buf, got))
            }
            Some(icmp6) => {
                let mut buf6 = [0u8; 1500];
                tokio::select! {
                    got = self.arp.async_io(Interest::READABLE, |s| recv_link(s, &mut buf)) => {
                        Ok(arp_received(&buf, got?))
                    }
                    got = icmp6.async_io(Interest::READABLE, |s| recv_icmp6(s, &mut buf6)) => {
                        Ok(Some(icmp6_received(&buf6, got?)))
                    }
                }
            }
        }
    }

    /// A frame the host has already received, without waiting for one:
    /// `Ok(None)` once none is left.
    pub fn try_recv(&self) -> io::Result<Option<Received>> {
        let mut buf = [0u8; 1500];
        while let Some(got) = would_block(recv_link(self.arp.get_ref(), &mut buf))? {
            if let Some(r) = arp_received(&buf, got) {
                return Ok(Some(r));
            }
        }
        if let Some(icmp6) = &self.icmp6
            && let Some(got) = would_block(recv_icmp6(icmp6.get_ref(), &mut buf))?
        {
            return Ok(Some(icmp6_received(&buf, got)));
        }
        Ok(None)
    }
}

/// `PACKET_OUTGOING` of `<linux/if_packet.h>`: a frame this host sent.
const PACKET_OUTGOING: u8 = 4;

fn arp_received(buf: &[u8], (n, ifindex, pkttype): (usize, u32, u8)) -> Option<Received> {
    (pkttype != PACKET_OUTGOING).then(|| Received::Arp {
        frame: buf[..n].to_vec(),
        ifindex,
    })
}

fn icmp6_received(buf: &[u8], (n, ifindex, hop_limit): (usize, u32, Option<u8>)) -> Received {
    Received::Icmp6 {
        message: buf[..n].to_vec(),
        ifindex,
        hop_limit,
    }
}

/// `Ok(None)` for a read that would have waited.
fn would_block<T>(r: io::Result<T>) -> io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

/// One `recvfrom` on a packet socket: the bytes, the index of the
/// interface the frame came by and its packet type (`sll_pkttype`).
fn recv_link(s: &Socket, buf: &mut [u8]) -> io::Result<(usize, u32, u8)> {
    use std::os::fd::AsRawFd;
    // SAFETY: all-zero is a valid `sockaddr_ll`.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: `buf` and `from` are valid for writes of the lengths given,
    // and the kernel writes at most that much.
    let n = unsafe {
        libc::recvfrom(
            s.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            (&raw mut from).cast(),
            &mut len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((n as usize, from.sll_ifindex as u32, from.sll_pkttype))
}

/// One `recvmsg` on the raw ICMPv6 socket: the message, the index of the
/// interface it arrived on (`IPV6_PKTINFO`; 0 when absent) and its hop
/// limit (`IPV6_HOPLIMIT`).
fn recv_icmp6(s: &Socket, buf: &mut [u8]) -> io::Result<(usize, u32, Option<u8>)> {
    use std::os::fd::AsRawFd;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // Room for both options, aligned as `cmsghdr` needs.
    let mut control = [0u64; 16];
    // SAFETY: all-zero is a valid `msghdr` (no name, no buffers).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &raw mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (over `buf`) and `control`, both live
    // and writable for the lengths given.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &raw mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let (mut ifindex, mut hop_limit) = (0, None);
    // SAFETY: the kernel filled `msg_controllen` bytes of `control` with
    // well-formed `cmsghdr`s; the CMSG macros walk them within that
    // length, and each option's data is read unaligned at its own size.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::IPPROTO_IPV6 {
                let data = libc::CMSG_DATA(c);
                match (*c).cmsg_type {
                    libc::IPV6_HOPLIMIT => {
                        let h = data.cast::<libc::c_int>().read_unaligned();
                        hop_limit = u8::try_from(h).ok();
                    }
                    libc::IPV6_PKTINFO => {
                        let info = data.cast::<libc::in6_pktinfo>().read_unaligned();
                        ifindex = info.ipi6_ifindex as u32;
                    }
                    _ => {}
                }
            }
            c = libc::CMSG_NXTHDR(&raw const msg, c);
        }
    }
    Ok((n as usize, ifindex, hop_limit))
}

/// What a claim socket may queue while the loop is busy. The default
/// (`net.core.rmem_default`, about 200 KiB) holds some 200 frames: one
/// node taking a thousand VIPs sends 2,000, and a pre-check's answer that
/// arrives among them would be dropped, a live owner's VIP taken. This
/// holds a few thousand. Memory is spent only on frames queued.
const CLAIM_BUFFER: usize = 4 << 20;

/// Asks for [`CLAIM_BUFFER`], past `net.core.rmem_max` where the agent may
/// (`SO_RCVBUFFORCE` needs CAP_NET_ADMIN, which a candidate has), up to it
/// otherwise. Not fatal: the default still works on a quiet LAN.
fn room_for_bursts(s: &Socket) {
    let size = CLAIM_BUFFER as libc::c_int;
    let forced = set_option(s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &size).is_ok();
    if !forced && let Err(e) = s.set_recv_buffer_size(CLAIM_BUFFER) {
        tracing::debug!(error = %e, "cannot enlarge a claim socket's buffer");
    }
}

/// Watched IPv4 addresses a kernel filter holds: two instructions each
/// within the kernel's 4,096.
pub(super) const FILTERED_MAX: usize = 2_000;

/// A classic BPF program over an Ethernet ARP frame that accepts it when
/// its sender protocol address (bytes 28..32) is one of `v4`, or `None`
/// past [`FILTERED_MAX`]. An empty list accepts nothing.
fn arp_filter(v4: &[u32]) -> Option<Vec<SockFilter>> {
    if v4.len() > FILTERED_MAX {
        return None;
    }
    const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
    const JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    let mut p = Vec::with_capacity(v4.len() * 2 + 2);
    p.push(SockFilter::new(LD_W_ABS, 0, 0, 28));
    for ip in v4 {
        // Equal: the next instruction, accept; else skip it.
        p.push(SockFilter::new(JEQ_K, 0, 1, *ip));
        p.push(SockFilter::new(RET_K, 0, 0, u32::MAX));
    }
    p.push(SockFilter::new(RET_K, 0, 0, 0));
    Some(p)
}

/// Only Neighbor Advertisements reach the raw ICMPv6 socket: solicitations
/// (every client resolving a VIP), router advertisements and echoes claim
/// nothing.
fn advertisements_only(s: &Socket) -> io::Result<()> {
    // `struct icmp6_filter`: a set bit blocks that type.
    let mut filter = [u32::MAX; 8];
    filter[136 / 32] &= !(1 << (136 % 32));
    set_option(s, libc::IPPROTO_ICMPV6, ICMP6_FILTER, &filter)
}

/// `setsockopt` for an option socket2 does not name, whose value is the
/// plain-data `value` (an `int`, a C struct of integers).
fn set_option<T: Copy>(
    s: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid descriptor, and a pointer to `value` with its exact
    // length, which the kernel only reads.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `ICMP6_FILTER` of `<netinet/icmp6.h>` (linux/icmpv6.h), which the libc
/// crate does not name.
const ICMP6_FILTER: libc::c_int = 1;

/// `sockaddr_ll` for `frame` leaving by interface `ifindex`.
fn link_layer_address(ifindex: u32, frame: &Frame) -> io::Result<SockAddr> {
    let ifindex = i32::try_from(ifindex)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index too large"))?;
    let mut storage = SockAddrStorage::zeroed();
    // SAFETY: `sockaddr_ll` is a `sockaddr_*` type of this platform and fits
    // in `sockaddr_storage` (view_as asserts the size); the storage is zeroed,
    // so every field not set below is a valid zero.
    let ll = unsafe { storage.view_as::<libc::sockaddr_ll>() };
    ll.sll_family = libc::AF_PACKET as libc::sa_family_t;
    ll.sll_protocol = frame.ethertype.to_be();
    ll.sll_ifindex = ifindex;
    ll.sll_halen = 6;
    ll.sll_addr[..6].copy_from_slice(&frame.destination.0);
    let len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: the first `len` bytes of `storage` hold the initialised
    // `sockaddr_ll` written above.
    Ok(unsafe { SockAddr::new(storage, len) })
}

#[cfg(test)]
/// Runs `f`'s future on a thread of its own, in a Tokio runtime, in a
/// new network namespace with `lo` up and a veth pair `v0`-`v1`. Needs
/// root; fails without it.
pub(crate) fn in_new_netns<F, Fut>(f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()>,
{
    std::thread::spawn(move || {
        // SAFETY: unshare affects this thread only, which ends after f.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare(CLONE_NEWNET): run as root");
        let ip = |args: &str| {
            let ok = std::process::Command::new("ip")
                .args(args.split(' '))
                .status()
                .expect("ip (iproute2)")
                .success();
            assert!(ok, "ip {args}");
        };
        ip("link set lo up");
        ip("link add v0 type veth peer name v1");
        ip("link set v0 up");
        ip("link set v1 up");
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f());
    })
    .join()
    .unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::announce::packet::{ArpOp, gratuitous_arp};

    #[test]
    fn link_layer_address_names_family_interface_and_destination() {
        let frame = gratuitous_arp(
            ArpOp::Request,
            crate::addrs::MacAddr([2, 0, 0, 0, 0, 1]),
            "10.0.0.1".parse().unwrap(),
        );
        let a = link_layer_address(7, &frame).unwrap();
        assert_eq!(a.family(), libc::AF_PACKET as libc::sa_family_t);
        assert_eq!(a.len() as usize, size_of::<libc::sockaddr_ll>());
        // sockaddr_ll: family u16, protocol u16 (network order), ifindex i32,
        // hatype u16, pkttype u8, halen u8, addr [u8; 8]
        let storage = a.as_storage();
        let bytes: &[u8] = storage_bytes(&storage);
        assert_eq!(&bytes[2..4], &[0x08, 0x06]);
        assert_eq!(&bytes[4..8], &7i32.to_ne_bytes());
        assert_eq!(bytes[11], 6);
        assert_eq!(&bytes[12..18], &[0xff; 6]);
    }

    /// A claim socket queues a burst of announcements while the loop is
    /// busy. Needs root (a packet socket, and `SO_RCVBUFFORCE` past
    /// `net.core.rmem_max`); fails without it.
    #[tokio::test(flavor = "current_thread")]
    async fn claim_sockets_hold_a_burst() {
        let s = ClaimSocket::open().expect("a packet socket: run as root");
        // The kernel reports twice what was asked (its bookkeeping).
        let arp = s.arp.get_ref().recv_buffer_size().unwrap();
        assert!(arp >= CLAIM_BUFFER, "ARP socket buffer {arp}");
        if let Some(icmp6) = &s.icmp6 {
            let nd = icmp6.get_ref().recv_buffer_size().unwrap();
            assert!(nd >= CLAIM_BUFFER, "ICMPv6 socket buffer {nd}");
        }
    }

    fn drain(s: &ClaimSocket) -> Vec<Received> {
        let mut out = Vec::new();
        while let Some(r) = s.try_recv().unwrap() {
            out.push(r);
        }
        out
    }

    /// Once told what it watches, the ARP socket receives only frames whose
    /// sender address is watched: a LAN's other ARP stays in the kernel.
    /// Needs root.
    #[test]
    fn the_kernel_drops_arp_that_claims_nothing_watched() {
        in_new_netns(|| async {
            let claims = ClaimSocket::open().unwrap();
            let out = PacketSocket::open().unwrap();
            let v0 = ifindex("v0");
            let mac = crate::addrs::MacAddr([2, 0, 0, 0, 0, 1]);
            let x: std::net::Ipv4Addr = "10.7.0.1".parse().unwrap();
            let y: std::net::Ipv4Addr = "10.7.0.2".parse().unwrap();
            let send = |ip| {
                let frame = gratuitous_arp(ArpOp::Request, mac, ip);
                let out = &out;
                async move { out.send(v0, &frame).await.unwrap() }
            };
            let senders = |got: Vec<Received>| -> Vec<[u8; 4]> {
                got.into_iter()
                    .filter_map(|r| match r {
                        Received::Arp { frame, .. } => Some(frame[28..32].try_into().unwrap()),
                        Received::Icmp6 { .. } => None,
                    })
                    .collect()
            };
            // Before any watch, everything passes. A veth sends nothing
            // until the kernel has given it a queue (its link watch may
            // take a second on a busy host), so the first frame is sent
            // again until it arrives.
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                send(y).await;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                if senders(drain(&claims)).contains(&y.octets()) {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no frame ever arrived"
                );
            }
            claims.watch(&[std::net::IpAddr::V4(x)].into()).unwrap();
            // y goes first: once x has arrived, y has been through the
            // filter too, as the wire keeps their order.
            send(y).await;
            send(x).await;
            let mut got = Vec::new();
            while !got.contains(&x.octets()) {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "x never arrived: {got:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                got.extend(senders(drain(&claims)));
            }
            assert!(!got.contains(&y.octets()), "{got:?}");
            // Nothing watched: nothing passes.
            claims.watch(&Default::default()).unwrap();
            send(x).await;
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            assert_eq!(senders(drain(&claims)), Vec::<[u8; 4]>::new());
        });
    }

    /// Of ICMPv6, only Neighbor Advertisements reach the claim socket: an
    /// echo and its reply do not. Needs root.
    #[test]
    fn only_advertisements_reach_the_icmpv6_socket() {
        in_new_netns(|| async {
            let claims = ClaimSocket::open().unwrap();
            assert!(claims.icmp6.is_some(), "IPv6 in the test namespace");
            let tx = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6)).unwrap();
            let to = SockAddr::from("[::1]:0".parse::<std::net::SocketAddr>().unwrap());
            // Echo request (128); the kernel answers with 129. Then an
            // advertisement (136) for ::1. The kernel fills checksums.
            tx.send_to(&[128, 0, 0, 0, 0, 1, 0, 1], &to).unwrap();
            let mut na = vec![136, 0, 0, 0, 0x20, 0, 0, 0];
            na.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
            tx.send_to(&na, &to).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let types: Vec<u8> = drain(&claims)
                .into_iter()
                .filter_map(|r| match r {
                    Received::Icmp6 { message, .. } => Some(message[0]),
                    Received::Arp { .. } => None,
                })
                .collect();
            assert_eq!(types, [136]);
        });
    }

    /// The filter for every count it takes, and none past it.
    #[test]
    fn the_arp_filter_fits_the_kernel() {
        assert_eq!(arp_filter(&[]).unwrap().len(), 2);
        let max: Vec<u32> = (0..FILTERED_MAX as u32).collect();
        assert!(arp_filter(&max).unwrap().len() <= 4_096);
        let over: Vec<u32> = (0..=FILTERED_MAX as u32).collect();
        assert!(arp_filter(&over).is_none());
    }

    fn ifindex(name: &str) -> u32 {
        let name = std::ffi::CString::new(name).unwrap();
        // SAFETY: a valid NUL-terminated name.
        let i = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(i, 0, "no interface {name:?}");
        i
    }

    /// The raw bytes of a socket address.
    fn storage_bytes(storage: &SockAddrStorage) -> &[u8] {
        // SAFETY: SockAddrStorage is plain old data of the given size.
        unsafe {
            std::slice::from_raw_parts(
                (storage as *const SockAddrStorage).cast::<u8>(),
                size_of::<SockAddrStorage>(),
            )
        }
    }
}
