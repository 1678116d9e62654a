//! Why this node lets a VIP go, as the core decides it: a value the core
//! matches on, made into words only for the log and the Service's Event
//! ([`LetGo`]'s `Display`), never read back from them.

use std::fmt;

use crate::election::{NodeName, Note, Reason};

/// Why a held VIP goes (a kernel removal's cause).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum LetGo {
    /// An address kept from a previous run whose link has no carrier.
    AdoptedNoCarrier,
    /// An address kept from a previous run that a member took over while
    /// this node was starting.
    AdoptedTakenOver,
    /// Another starting node kept it from its previous run too and comes
    /// first by the hash order (see `Core::starting_holder_first`).
    StartingHolderFirst(NodeName),
    /// The interface it is held on lost carrier.
    NoCarrier(String),
    /// The election no longer gives it to this node.
    NotWon(NotWon),
    /// The winner shows it held (or, leaving, a live peer does).
    HeldBy(NodeName),
    /// The winner answered for it on the wire during the hand-over.
    AnsweredBy(NodeName),
    /// A live peer with a newer view of the cluster holds it.
    NewerHolder(NodeName),
    /// Kept for views that differ, and a holder of this node's view that
    /// ranks first keeps it too.
    KeptByFirst(NodeName),
    /// The winner did not show it held within the hand-over's time.
    HandoverTimedOut(NodeName),
    /// Contested: a live holder with a newer view.
    ContestNewer(NodeName),
    /// Contested: a live holder of the same view that outranks this node.
    ContestOutranked(NodeName),
    /// A second owner on the wire that outranks this node.
    OutrankedOnWire,
    /// The old place of a VIP that moved to this interface.
    MovedTo(String),
    /// Let go while leaving, for a reason of its own.
    Leaving(Box<LetGo>),
}

impl LetGo {
    /// Says that the node is leaving, once.
    pub(super) fn while_leaving(self) -> LetGo {
        match self {
            LetGo::NotWon(NotWon::ShuttingDown) | LetGo::Leaving(_) => self,
            other => LetGo::Leaving(Box::new(other)),
        }
    }
}

impl fmt::Display for LetGo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LetGo::AdoptedNoCarrier => f.write_str("its link has no carrier"),
            LetGo::AdoptedTakenOver => f.write_str("another node holds it now"),
            LetGo::StartingHolderFirst(n) => write!(
                f,
                "{n} kept it from its previous run too, and ranks first by the hash order"
            ),
            LetGo::NoCarrier(interface) => write!(f, "{interface} has no carrier"),
            LetGo::NotWon(n) => n.fmt(f),
            LetGo::HeldBy(n) => write!(f, "{n} holds it now"),
            LetGo::AnsweredBy(n) => write!(f, "{n} answers for it on the wire"),
            LetGo::NewerHolder(n) => {
                write!(f, "{n} holds it now, with a newer view of the cluster")
            }
            LetGo::KeptByFirst(n) => write!(f, "{n} keeps it too and ranks first"),
            LetGo::HandoverTimedOut(n) => {
                write!(f, "{n} wins it and did not show it held in time")
            }
            LetGo::ContestNewer(n) => {
                write!(f, "{n} holds it too, with a newer view of the cluster")
            }
            LetGo::ContestOutranked(n) => write!(f, "{n} holds it too and outranks this node"),
            LetGo::OutrankedOnWire => {
                f.write_str("another node that outranks this one answers for it")
            }
            LetGo::MovedTo(interface) => write!(f, "moved to {interface}"),
            LetGo::Leaving(why) => write!(f, "shutting down; {why}"),
        }
    }
}

/// Why the election no longer gives a VIP to this node: the first rule it
/// fails, or who wins (see `Core::release_reason`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum NotWon {
    ShuttingDown,
    /// No Service has the address any more.
    Unknown,
    /// A rule of the election excludes this node.
    Excluded(Reason),
    /// The Service has no usable endpoint here, and the election says why
    /// in a note.
    Noted(Note),
    /// Another node wins it.
    Winner(String),
    /// Nobody wins it.
    Nobody,
}

impl fmt::Display for NotWon {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotWon::ShuttingDown => f.write_str("shutting down"),
            NotWon::Unknown => f.write_str("no Service has the address any more"),
            NotWon::Excluded(r) => f.write_str(r.explain()),
            NotWon::Noted(n) => n.fmt(f),
            NotWon::Winner(w) => write!(f, "{w} wins it"),
            NotWon::Nobody => f.write_str("this node no longer wins it"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reason already given while leaving is not said to be twice.
    #[test]
    fn leaving_is_said_once() {
        let why = LetGo::HeldBy("b".into()).while_leaving();
        assert_eq!(why.to_string(), "shutting down; b holds it now");
        assert_eq!(why.clone().while_leaving(), why);
        let down = LetGo::NotWon(NotWon::ShuttingDown);
        assert_eq!(down.clone().while_leaving(), down);
        assert_eq!(down.to_string(), "shutting down");
    }
}
