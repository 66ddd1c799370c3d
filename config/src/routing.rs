//! `coordinator.routing`: how a coordinator orders the workers a request could go to
//! (docs/architecture.md, "Routing").

use serde::{Deserialize, Serialize};

/// How a coordinator orders the candidate workers of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum RoutingPolicy {
    /// The least predicted time to first token: the wait for a slot (requests ahead ×
    /// the worker's measured slot time ÷ its slots) plus its uncached prompt tokens ÷
    /// its measured prefill speed. Workers that have not reported speeds yet are
    /// predicted with the median speed of those that have; with no measurement at all
    /// this is [`RoutingPolicy::Blocks`].
    #[default]
    Ttft,
    /// The block score: backend preference, then warm prefix blocks less 4 per request
    /// the worker would wait behind, then load.
    Blocks,
}

impl RoutingPolicy {
    /// The spelling in config files and flags.
    pub fn as_str(self) -> &'static str {
        match self {
            RoutingPolicy::Ttft => "ttft",
            RoutingPolicy::Blocks => "blocks",
        }
    }
}

impl std::fmt::Display for RoutingPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RoutingPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ttft" => Ok(RoutingPolicy::Ttft),
            "blocks" => Ok(RoutingPolicy::Blocks),
            _ => Err(format!("coordinator.routing = {s:?}: must be \"ttft\" or \"blocks\"")),
        }
    }
}

impl TryFrom<String> for RoutingPolicy {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<RoutingPolicy> for String {
    fn from(p: RoutingPolicy) -> String {
        p.as_str().to_string()
    }
}
