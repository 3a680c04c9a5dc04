//! The metrics of transparent capture: connections passed through to their original
//! destination, bytes untouched, and the ones that could not be. Their own file so the
//! families of one feature sit together; registered by [`super::Metrics`] like every
//! other family.

use prometheus::{IntCounter, Registry};

use super::family::counters;

/// Which listener a redirected connection came to: the `direction` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// The pod's own outbound connection, redirected to `[listener]`.
    Outbound,
    /// A connection to the pod, redirected to `[inbound]`.
    Inbound,
}

impl Direction {
    const ALL: [Direction; 2] = [Direction::Outbound, Direction::Inbound];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Outbound => "outbound",
            Direction::Inbound => "inbound",
        }
    }
}

/// Why a connection to be passed through was closed instead: the `reason` label of
/// `tollgate_passthrough_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PassFailure {
    /// The original destination could not be connected to (refused, unreachable, no
    /// answer within the connect timeout, or no descriptor left).
    ConnectFailure,
    /// The original destination is one of tollgate's own listeners: connecting to it
    /// would loop back into tollgate.
    Loop,
}

impl PassFailure {
    const ALL: [PassFailure; 2] = [PassFailure::ConnectFailure, PassFailure::Loop];

    pub fn as_str(self) -> &'static str {
        match self {
            PassFailure::ConnectFailure => "connect-failure",
            PassFailure::Loop => "loop",
        }
    }
}

/// The handles, every series resolved at start (two directions, two reasons).
pub struct Passthrough {
    connections: [IntCounter; 2],
    failures: [[IntCounter; 2]; 2],
}

impl Passthrough {
    pub(super) fn new(r: &Registry) -> Self {
        let connections = counters(
            r,
            "tollgate_passthrough_connections_total",
            "Redirected connections passed through to their original destination, bytes \
             untouched (no upstream of the config owns it, or not the app's port).",
            &["direction"],
        );
        let failures = counters(
            r,
            "tollgate_passthrough_failures_total",
            "Connections to be passed through that were closed instead: connect-failure \
             (the destination could not be reached), loop (it is one of tollgate's own \
             listeners).",
            &["direction", "reason"],
        );
        Passthrough {
            connections: Direction::ALL.map(|d| connections.with_label_values(&[d.as_str()])),
            failures: Direction::ALL.map(|d| {
                PassFailure::ALL.map(|f| failures.with_label_values(&[d.as_str(), f.as_str()]))
            }),
        }
    }

    /// `tollgate_passthrough_connections_total{direction}`.
    pub fn connection(&self, d: Direction) -> &IntCounter {
        &self.connections[d as usize]
    }

    /// `tollgate_passthrough_failures_total{direction,reason}`.
    pub fn failure(&self, d: Direction, why: PassFailure) -> &IntCounter {
        &self.failures[d as usize][why as usize]
    }
}
