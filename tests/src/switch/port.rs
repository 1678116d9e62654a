//! The switch's sockets: one `AF_PACKET` socket per port, bound to it,
//! for every protocol, and the waits on them. The only `unsafe` of the
//! switch: socket2 has no constructor for link-layer addresses, and the
//! options below (`PACKET_IGNORE_OUTGOING`, `SO_RCVBUFFORCE`, a real-time
//! scheduling class for the switch's thread) have no safe wrapper.

use std::ffi::CString;
use std::io::{self, Read};
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::Duration;

use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use socket2::{Domain, Protocol, SockAddr, SockAddrStorage, Socket, Type};

/// `ETH_P_ALL`: every protocol.
const ETH_P_ALL: u16 = 0x0003;
/// `<linux/if_packet.h>`: a packet socket that does not see the frames it
/// (or anything on its host) sends. Since Linux 4.20.
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// Room for bursts (a gossip catch-up, a flood of probes) while the
/// switch's thread waits for a core.
const BUFFER: libc::c_int = 4 << 20;

pub(super) struct Port {
    socket: Socket,
}

impl Port {
    /// A socket on `ifname` of the calling thread's namespace.
    pub fn open(ifname: &str) -> io::Result<Port> {
        let name = CString::new(ifname).map_err(io::Error::other)?;
        // SAFETY: `name` is a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if ifindex == 0 {
            return Err(io::Error::last_os_error());
        }
        let socket = Socket::new(
            Domain::PACKET,
            Type::RAW,
            Some(Protocol::from(i32::from(ETH_P_ALL.to_be()))),
        )?;
        set_int(
            &socket,
            263, /* SOL_PACKET */
            PACKET_IGNORE_OUTGOING,
            1,
        )?;
        set_int(&socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, BUFFER)?;
        set_int(&socket, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, BUFFER)?;
        socket.bind(&link_address(ifindex)?)?;
        socket.set_nonblocking(true)?;
        Ok(Port { socket })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.socket.as_fd()
    }

    /// The next frame queued on the port, if any.
    pub fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        (&self.socket).read(buf).ok()
    }

    /// Sends a frame out of the port; false if the kernel refused it.
    pub fn send(&self, frame: &[u8]) -> bool {
        self.socket.send(frame).is_ok_and(|n| n == frame.len())
    }
}

/// Waits up to `timeout` for frames on any of `fds`; the indexes of those
/// with some.
pub(super) fn wait(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<Vec<usize>> {
    let mut polled: Vec<PollFd> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    // Round up: a wait cut short of a due frame's time would spin.
    let ms = timeout.as_micros().div_ceil(1000).min(u128::from(u16::MAX)) as u16;
    poll(&mut polled, PollTimeout::from(ms)).map_err(io::Error::from)?;
    Ok(polled
        .iter()
        .enumerate()
        .filter(|(_, p)| p.revents().is_some_and(|r| !r.is_empty()))
        .map(|(i, _)| i)
        .collect())
}

/// Puts the calling thread in the `SCHED_FIFO` class, as a switch's own
/// hardware would be: on a machine whose cores the agents, the API server
/// and the probers share, the switch must not add the scheduler's delays
/// to every frame. Says so if it cannot (not root) and goes on.
pub(super) fn realtime() {
    let param = libc::sched_param { sched_priority: 10 };
    // SAFETY: `param` is a valid `sched_param`; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if r != 0 {
        eprintln!(
            "switch: no real-time priority ({}); frames wait for a core like any thread",
            io::Error::last_os_error()
        );
    }
}

fn set_int(
    socket: &Socket,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: `value` is a valid `c_int` for the length given.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            level,
            name,
            (&raw const value).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn link_address(ifindex: u32) -> io::Result<SockAddr> {
    let ifindex = i32::try_from(ifindex)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "interface index too large"))?;
    let mut storage = SockAddrStorage::zeroed();
    // SAFETY: `sockaddr_ll` fits in `sockaddr_storage` (view_as asserts the
    // size); the storage is zeroed, so every field not set is a valid zero.
    let ll = unsafe { storage.view_as::<libc::sockaddr_ll>() };
    ll.sll_family = libc::AF_PACKET as libc::sa_family_t;
    ll.sll_protocol = ETH_P_ALL.to_be();
    ll.sll_ifindex = ifindex;
    let len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: the first `len` bytes of `storage` hold the `sockaddr_ll`.
    Ok(unsafe { SockAddr::new(storage, len) })
}
