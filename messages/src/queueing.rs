//! Fleet queueing (protocol 1.4): a request's priority, and what waits at a
//! coordinator as `status` reports it.

use serde::{Deserialize, Serialize};

/// A request's priority when it waits for a worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Priority {
    /// Someone is waiting for the answer: served first.
    #[default]
    Interactive,
    /// Offline work: served when no interactive request waits.
    Batch,
}

impl Priority {
    /// Every priority, served in this order.
    pub const ALL: [Priority; 2] = [Priority::Interactive, Priority::Batch];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }

    /// From its wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

/// Requests of one model, priority and tenant waiting at a coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueView {
    /// Model name.
    pub model: String,
    /// Their priority.
    pub priority: Priority,
    /// Their tenant (`""` = the default one).
    pub tenant: String,
    /// How many wait.
    pub waiting: u32,
    /// Their payload bytes.
    pub bytes: u64,
    /// How long the oldest has waited, milliseconds.
    pub oldest_ms: u64,
}
