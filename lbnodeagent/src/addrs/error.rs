//! The address backend's errors, each saying what the operator can do.

use std::io;
use std::net::IpAddr;
use std::path::PathBuf;

use hostlb_api::Family;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open a netlink socket: {0}; the agent needs CAP_NET_ADMIN")]
    Socket(#[source] io::Error),

    #[error(
        "{what}: permission denied; run the agent with CAP_NET_ADMIN (the shipped unit grants it)"
    )]
    PermissionDenied { what: String },

    #[error("{what} failed: {source}")]
    Netlink {
        what: String,
        #[source]
        source: rtnetlink::Error,
    },

    #[error(
        "no {family} default route in the main routing table; add one, or set announce.interface in the config"
    )]
    NoDefaultRoute { family: Family },

    #[error(
        "interface {name:?} does not exist; fix announce.interface or the L2Advertisement's interfaces"
    )]
    NoSuchInterface { name: String },

    #[error("interface index {index} does not exist any more; it was deleted, resync")]
    InterfaceGone { index: u32 },

    #[error(
        "cannot set up the virtual interface {name:?}: {reason}; create it by hand (`ip link add {name} type dummy`, or where the kernel has no dummy driver `ip link add {name} type bridge && ip link set {name} up`), or set announce.virtual_interface = \"\" to turn virtual mode off"
    )]
    VirtualInterface { name: String, reason: String },

    #[error(
        "IPv6 is disabled on {interface}; enable it (sysctl net.ipv6.conf.{interface}.disable_ipv6=0) or give this cluster no IPv6 pools"
    )]
    Ipv6Disabled { interface: String },

    #[error(
        "cannot turn on net.ipv4.conf.{interface}.promote_secondaries: {source}; a VIP that is the primary address of its subnet takes the addresses added to that subnet after it with it if it expires while the agent is down; set net.ipv4.conf.all.promote_secondaries=1 (systemd's sysctl defaults do)"
    )]
    PromoteSecondaries {
        interface: String,
        #[source]
        source: io::Error,
    },

    #[error("{ip}/{prefix_len} is not a valid address: the prefix length is out of range")]
    InvalidPrefix { ip: IpAddr, prefix_len: u8 },

    #[error(
        "cannot write the address record {path}: {source}; the run directory must be writable by the agent (systemd RuntimeDirectory=lbnodeagent)"
    )]
    RecordWrite {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "cannot read the address record {path}: {source}; fix its permissions, or delete it to start afresh (addresses it listed are then left in place)"
    )]
    RecordRead {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error(
        "the address record {path} is not valid: {source}; delete it to start afresh (addresses it listed are then left in place)"
    )]
    RecordCorrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// A netlink failure in context; EPERM becomes the message that names
    /// the missing capability.
    pub(crate) fn netlink(what: impl Into<String>, source: rtnetlink::Error) -> Error {
        let what = what.into();
        match errno(&source) {
            Some(libc::EPERM) => Error::PermissionDenied { what },
            _ => Error::Netlink { what, source },
        }
    }

    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Socket(_) => "socket",
            Error::PermissionDenied { .. } => "permission_denied",
            Error::Netlink { .. } => "netlink",
            Error::NoDefaultRoute { .. } => "no_default_route",
            Error::NoSuchInterface { .. } => "no_such_interface",
            Error::InterfaceGone { .. } => "interface_gone",
            Error::VirtualInterface { .. } => "virtual_interface",
            Error::Ipv6Disabled { .. } => "ipv6_disabled",
            Error::PromoteSecondaries { .. } => "promote_secondaries",
            Error::InvalidPrefix { .. } => "invalid_prefix",
            Error::RecordWrite { .. } | Error::RecordRead { .. } | Error::RecordCorrupt { .. } => {
                "record"
            }
        }
    }
}

/// The positive errno of a kernel refusal, `None` for other failures.
pub(crate) fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}
