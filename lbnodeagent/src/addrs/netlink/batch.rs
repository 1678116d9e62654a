//! Many address requests to one datagram.
//!
//! The kernel reads every netlink message in a datagram, in order, and
//! answers each one that fails; it acknowledges one that succeeded only if
//! asked to. So a batch goes [`PER_DATAGRAM`] requests to a `sendto`, only
//! the last of them asking for an acknowledgement: that one answer says
//! every request before it was handled, and the errors that came before it
//! say which failed. A holder of 1,000 VIPs renews each of them every
//! third of their lifetime; one request and one answer apiece made 2,000
//! system calls and as many wake-ups of the connection's task for every
//! renewal, and this makes 32.
//!
//! Rtnetlink handles a request in the sender's own `sendto`, so the answers
//! are queued by the time it returns. Reading waits for them anyway,
//! rather than relying on that.

use std::io;

use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::packet_route::address::AddressMessage;
use rtnetlink::sys::{AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket, protocols};

/// Requests in one datagram. Each failed one is answered by a datagram of
/// its own holding an error (about 1 kB of the receive buffer's 208 kB
/// default with its overhead), so a datagram of requests that all fail
/// still fits the answers in the buffer.
pub(super) const PER_DATAGRAM: usize = 64;

/// A netlink socket for batches, with the sequence numbers it has used.
/// One batch at a time uses it: an answer's sequence number says which
/// request it is for, and answers left over from a batch that was cancelled
/// are skipped by theirs.
pub(super) struct Batches {
    socket: tokio::sync::Mutex<(TokioSocket, u32)>,
}

impl Batches {
    /// Opens the socket. Like every netlink socket it belongs to the network
    /// namespace of the calling thread.
    pub(super) fn new() -> io::Result<Batches> {
        let mut socket = TokioSocket::new(protocols::NETLINK_ROUTE)?;
        socket.socket_mut().bind_auto()?;
        socket.socket_ref().connect(&SocketAddr::new(0, 0))?;
        // Errors without a copy of the request they answer.
        socket.socket_ref().set_cap_ack(true)?;
        Ok(Batches {
            socket: tokio::sync::Mutex::new((socket, 0)),
        })
    }

    /// Adds each of `messages` (`RTM_NEWADDR` with `NLM_F_REPLACE`, as
    /// `ip address replace`) and says how each went, in order.
    pub(super) async fn replace(
        &self,
        messages: Vec<AddressMessage>,
    ) -> Vec<Result<(), rtnetlink::Error>> {
        let mut outcomes = Vec::with_capacity(messages.len());
        let mut guard = self.socket.lock().await;
        let (socket, seq) = &mut *guard;
        let mut messages = messages.into_iter().peekable();
        while messages.peek().is_some() {
            let chunk: Vec<AddressMessage> = messages.by_ref().take(PER_DATAGRAM).collect();
            let first = seq.wrapping_add(1);
            *seq = seq.wrapping_add(u32::try_from(chunk.len()).expect("a chunk is small"));
            outcomes.extend(send_chunk(socket, first, chunk).await);
        }
        outcomes
    }
}

/// Sends one datagram of requests numbered from `first` and reads their
/// answers up to the last one's acknowledgement.
async fn send_chunk(
    socket: &TokioSocket,
    first: u32,
    chunk: Vec<AddressMessage>,
) -> Vec<Result<(), rtnetlink::Error>> {
    let n = chunk.len();
    let last = first.wrapping_add(u32::try_from(n - 1).expect("a chunk is small"));
    let mut datagram = Vec::new();
    for (i, message) in chunk.into_iter().enumerate() {
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::NewAddress(message));
        request.header.flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_REPLACE;
        let seq = first.wrapping_add(u32::try_from(i).expect("a chunk is small"));
        if seq == last {
            request.header.flags |= NLM_F_ACK;
        }
        request.header.sequence_number = seq;
        request.finalize();
        let at = datagram.len();
        datagram.resize(at + request.buffer_len(), 0);
        request.serialize(&mut datagram[at..]);
    }
    let mut outcomes: Vec<Option<Result<(), rtnetlink::Error>>> = (0..n).map(|_| None).collect();
    if let Err(e) = socket.send(&datagram).await {
        tracing::debug!(error = %e, "cannot send a batch of address requests");
        return failed(outcomes);
    }
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        buf.clear();
        if let Err(e) = socket.recv(&mut buf).await {
            // An overrun lost answers, maybe errors among them: nothing
            // not yet answered can be told done.
            tracing::debug!(error = %e, "cannot read the answers to a batch of address requests");
            return failed(outcomes);
        }
        let mut offset = 0;
        while offset < buf.len() {
            let Ok(message) = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buf[offset..])
            else {
                break;
            };
            let length = usize::try_from(message.header.length).unwrap_or(0);
            let seq = message.header.sequence_number;
            let index = usize::try_from(seq.wrapping_sub(first)).unwrap_or(usize::MAX);
            if let (NetlinkPayload::Error(e), true) = (message.payload, index < n) {
                // An error, or the acknowledgement of the last request.
                outcomes[index] = Some(match e.code {
                    Some(_) => Err(rtnetlink::Error::NetlinkError(e)),
                    None => Ok(()),
                });
                if seq == last {
                    // Answered in order: no error is still to come.
                    return outcomes.into_iter().map(|o| o.unwrap_or(Ok(()))).collect();
                }
            }
            if length == 0 {
                break;
            }
            offset += length.next_multiple_of(4);
        }
    }
}

/// Every request not yet answered failed, as far as the caller can know.
fn failed(
    outcomes: Vec<Option<Result<(), rtnetlink::Error>>>,
) -> Vec<Result<(), rtnetlink::Error>> {
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or(Err(rtnetlink::Error::RequestFailed)))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use rtnetlink::packet_route::address::AddressAttribute;

    use super::*;
    use crate::announce::in_new_netns;

    /// `ip/32` on link `ifindex`.
    fn host_address(ifindex: u32, ip: Ipv4Addr) -> AddressMessage {
        let mut m = AddressMessage::default();
        m.header.family = rtnetlink::packet_route::AddressFamily::Inet;
        m.header.prefix_len = 32;
        m.header.index = ifindex;
        m.attributes.push(AddressAttribute::Local(IpAddr::V4(ip)));
        m.attributes.push(AddressAttribute::Address(IpAddr::V4(ip)));
        m
    }

    /// The IPv4 addresses on `lo`, as `ip` sees them.
    fn on_lo() -> Vec<String> {
        let out = std::process::Command::new("ip")
            .args(["-4", "-o", "addr", "show", "dev", "lo"])
            .output()
            .expect("ip (iproute2)");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
            .collect()
    }

    /// Three datagrams' worth of requests, every seventh for a link that
    /// does not exist: each outcome is its own request's, the refused ones
    /// say why, and the kernel holds exactly the others. A second batch on
    /// the same socket (a renewal) starts where the first one's numbers
    /// ended and succeeds throughout.
    #[test]
    fn each_request_of_a_batch_gets_its_own_outcome() {
        in_new_netns(|| async {
            let batches = Batches::new().unwrap();
            let n = 2 * PER_DATAGRAM + 20;
            let gone = 424_242;
            let requests = |round: u8| -> Vec<AddressMessage> {
                (0..n)
                    .map(|i| {
                        let ip = Ipv4Addr::new(10, 9, (i / 200) as u8, (i % 200) as u8 + 1);
                        let ifindex = if round == 0 && i % 7 == 3 { gone } else { 1 };
                        host_address(ifindex, ip)
                    })
                    .collect()
            };
            let outcomes = batches.replace(requests(0)).await;
            assert_eq!(outcomes.len(), n);
            for (i, outcome) in outcomes.iter().enumerate() {
                if i % 7 == 3 {
                    let e = outcome.as_ref().expect_err("no such link");
                    assert_eq!(
                        crate::addrs::error::errno(e),
                        Some(libc::ENODEV),
                        "{i}: {e}"
                    );
                } else {
                    assert!(outcome.is_ok(), "{i}: {outcome:?}");
                }
            }
            let held = on_lo();
            // 127.0.0.1, and all but the refused ones.
            assert_eq!(held.len(), 1 + n - (n + 3) / 7, "{held:?}");
            assert!(held.contains(&"10.9.0.1/32".to_string()), "{held:?}");
            assert!(!held.contains(&"10.9.0.4/32".to_string()), "{held:?}");

            let outcomes = batches.replace(requests(1)).await;
            assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
            assert_eq!(on_lo().len(), 1 + n);
        });
    }
}
