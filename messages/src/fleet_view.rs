//! The fleet view: what workers announce in their heartbeats (models, adapters, load,
//! KV, speed) and what coordinators answer on `status` and `models`
//! (see `docs/protocol.md`, section 11).

use crate::{ModelInfo, QueueView};
use serde::{Deserialize, Serialize};

/// A model a worker serves, as announced in its heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedModel {
    /// The name requests use.
    pub name: String,
    /// Where the worker loaded it from.
    #[serde(default)]
    pub path: String,
    /// Static facts.
    #[serde(default)]
    pub info: ModelInfo,
    /// (1.10) LoRA adapters loaded on it: requests naming one ([`RequestHead::adapter`])
    /// are routed only to workers listing it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<ServedAdapter>,
    /// (1.11) The KV it exchanges with peers ([`crate::kv_transfer`]); none: its
    /// backend neither exports nor imports KV.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_format: Option<crate::KvFormat>,
}

/// A LoRA adapter a worker has loaded on one of its models (1.10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServedAdapter {
    /// The name requests use.
    pub name: String,
    /// Where the worker loaded it from (a PEFT directory or a GGUF LoRA file).
    #[serde(default)]
    pub path: String,
    /// The user's scale (each update is also multiplied by its alpha / rank).
    #[serde(default = "unit")]
    pub scale: f32,
    /// Whether one request at a time may use it and the base model then waits (a
    /// backend that applies an adapter to the whole model, not per sequence).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
}

fn unit() -> f32 {
    1.0
}

impl ServedModel {
    /// Whether `adapter` (none: the base model) can be asked of it.
    pub fn has_adapter(&self, adapter: Option<&str>) -> bool {
        adapter.is_none_or(|a| self.adapters.iter().any(|x| x.name == a))
    }
}

/// A worker's heartbeat, published on `{p}.v1.heartbeat.{wid}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Protocol version.
    pub v: u32,
    /// Unique worker id (one subject token).
    pub worker_id: String,
    /// Device the worker is pinned to: `cpu`, `cuda:0`, `rocm:1`, `metal`, `llama_cpp@URL`.
    pub device: String,
    /// Backend name: `metal`, `rocm`, `llama_cpp`, `cuda`, `cpu`.
    pub backend: String,
    /// Models served.
    pub models: Vec<ServedModel>,
    /// Requests computed concurrently.
    pub capacity: u32,
    /// Requests that may wait for a slot beyond `capacity`.
    pub queue_capacity: u32,
    /// Requests computing now.
    pub in_flight: u32,
    /// Requests waiting for a slot.
    pub queued: u32,
    /// Whether the backend can take requests (false while loading or restarting).
    pub available: bool,
    /// Whether the worker is shutting down (finishing in-flight work, taking none).
    pub draining: bool,
    /// Host name.
    #[serde(default)]
    pub host: String,
    /// Process id.
    #[serde(default)]
    pub pid: u32,
    /// When the worker started, Unix milliseconds.
    #[serde(default)]
    pub started_at_ms: u64,
    /// Heartbeat sequence number.
    #[serde(default)]
    pub seq: u64,
    /// Requests finished since start.
    #[serde(default)]
    pub completed: u64,
    /// switchyard version of the worker.
    #[serde(default)]
    pub version: String,
    /// What the worker's KV slots and block store hold.
    #[serde(default)]
    pub kv: KvUsage,
    /// Latency of its recent requests.
    #[serde(default)]
    pub recent: RecentLatency,
    /// The NATS server it is connected to: its name (or id) and address (protocol
    /// 1.4; empty from older workers).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub nats_server: String,
    /// (1.12) What it is for in disaggregated serving ([`WorkerRole`]); absent: both.
    #[serde(default, skip_serializing_if = "WorkerRole::is_both")]
    pub role: WorkerRole,
}

/// (1.12) A worker's part in disaggregated prefill/decode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerRole {
    /// Serves requests whole; prefills for others only where the operator said so.
    #[default]
    Both,
    /// Computes long prompts' KV for decode workers (`{p}.v1.worker.{wid}.prefill`);
    /// routed requests only when pinned to it.
    Prefill,
    /// Streams requests; a long prompt's KV is computed by a prefill worker and
    /// pulled here whenever one of the same KV format has room.
    Decode,
}

impl WorkerRole {
    fn is_both(&self) -> bool {
        *self == WorkerRole::Both
    }

    /// `both`, `prefill` or `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerRole::Both => "both",
            WorkerRole::Prefill => "prefill",
            WorkerRole::Decode => "decode",
        }
    }
}

impl std::str::FromStr for WorkerRole {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "both" => Ok(WorkerRole::Both),
            "prefill" => Ok(WorkerRole::Prefill),
            "decode" => Ok(WorkerRole::Decode),
            other => Err(format!("{other:?} is not a worker role: both, prefill or decode")),
        }
    }
}

/// A worker's KV state, as of its heartbeat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvUsage {
    /// KV slots (sequences computed together).
    pub slots: u32,
    /// Slots running a request now.
    pub busy: u32,
    /// Slots held by sessions.
    pub sessions: u32,
    /// Tokens resident across slots.
    pub resident_tokens: u64,
    /// Bytes of KV the resident tokens take (0 when the backend does not say).
    pub resident_bytes: u64,
    /// Blocks and bytes in the block store, and its budget.
    pub store_blocks: u64,
    pub store_bytes: u64,
    pub store_budget_bytes: u64,
    /// Prompt tokens served from KV (slots or store) / prompt tokens, over the recent
    /// requests.
    pub hit_ratio: f64,
    /// (1.11) KV moved to and from peers.
    #[serde(default)]
    pub transfer: crate::KvTransferStats,
}

/// Medians over a worker's most recent requests (up to 64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecentLatency {
    /// Requests the medians cover.
    pub requests: u32,
    /// Time to first token (queue + prefill), milliseconds.
    pub ttft_ms: f64,
    /// Time per output token after the first, milliseconds.
    pub tpot_ms: f64,
    /// Tokens speculative decoding proposed over these requests, and those the
    /// model kept (protocol 1.5; zero where nothing was drafted).
    pub draft_tokens: u64,
    pub accepted_tokens: u64,
}

/// What a worker measured of its own speed over its recent requests: the heartbeat
/// field `speed` (protocol 1.2), beside [`WorkerStatus`]'s fields. Coordinators
/// routing by predicted time to first token read it; all zeros (an older worker, or
/// one with no finished request yet) means "not measured".
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerSpeed {
    /// Requests the medians cover.
    pub requests: u32,
    /// Prompt tokens computed per second of prefill, cached tokens not counted (median).
    pub prefill_tps: f64,
    /// Milliseconds a request holds a slot, from its prefill's start to its last token
    /// (median).
    pub service_ms: f64,
}

impl WorkerSpeed {
    /// Whether there is a measurement to predict from.
    pub fn measured(&self) -> bool {
        self.requests > 0 && self.prefill_tps > 0.0 && self.prefill_tps.is_finite() && self.service_ms.is_finite()
    }
}

/// A heartbeat as published on `{p}.v1.heartbeat.{wid}`: the [`WorkerStatus`] fields
/// and, beside them in the same map, `speed` (protocol 1.2). A heartbeat without
/// `speed` decodes with zeros; a [`WorkerStatus`] decoder ignores it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// Every field of the status.
    #[serde(flatten)]
    pub status: WorkerStatus,
    /// The worker's measured speed.
    #[serde(default)]
    pub speed: WorkerSpeed,
}

impl From<WorkerStatus> for Heartbeat {
    fn from(status: WorkerStatus) -> Self {
        Self {
            status,
            speed: WorkerSpeed::default(),
        }
    }
}

/// One worker as a coordinator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerView {
    /// Its last heartbeat.
    pub status: WorkerStatus,
    /// Milliseconds since that heartbeat arrived.
    pub age_ms: u64,
}

/// Reply on `{p}.v1.status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// Protocol version.
    pub v: u32,
    /// The coordinator that answered.
    pub coordinator_id: String,
    /// Live workers.
    pub workers: Vec<WorkerView>,
    /// Requests waiting at this coordinator for a worker with room, by model,
    /// priority and tenant (protocol 1.4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queues: Vec<QueueView>,
}

/// A model and where it is served, in a [`ModelsReply`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// Model name.
    pub name: String,
    /// Workers serving it.
    pub workers: Vec<String>,
    /// Backends serving it.
    pub backends: Vec<String>,
    /// Facts from one of the workers.
    pub info: ModelInfo,
    /// (1.10) LoRA adapters of this base model some worker has loaded, sorted, with
    /// the workers holding each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adapters: Vec<AdapterEntry>,
}

/// A LoRA adapter and where it is loaded, in a [`ModelEntry`] (1.10).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterEntry {
    /// The adapter's name ([`RequestHead::adapter`]).
    pub name: String,
    /// Workers holding it.
    pub workers: Vec<String>,
}

/// Reply on `{p}.v1.models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelsReply {
    /// Protocol version.
    pub v: u32,
    /// Models served by live workers.
    pub models: Vec<ModelEntry>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode, encode};

    #[test]
    fn heartbeat_speed_travels_beside_the_status_and_old_peers_still_decode() {
        let status = WorkerStatus {
            v: crate::PROTOCOL_VERSION,
            worker_id: "w-1".into(),
            device: "cpu".into(),
            backend: "cpu".into(),
            models: Vec::new(),
            capacity: 4,
            queue_capacity: 8,
            in_flight: 1,
            queued: 0,
            available: true,
            draining: false,
            host: "h".into(),
            pid: 1,
            started_at_ms: 5,
            seq: 9,
            completed: 3,
            version: "t".into(),
            kv: KvUsage::default(),
            recent: RecentLatency::default(),
            nats_server: String::new(),
            role: Default::default(),
        };
        let beat = Heartbeat {
            status: status.clone(),
            speed: WorkerSpeed {
                requests: 3,
                prefill_tps: 812.5,
                service_ms: 420.0,
            },
        };
        let new = encode(&beat);
        assert_eq!(decode::<Heartbeat>(&new).unwrap(), beat);
        assert_eq!(
            decode::<WorkerStatus>(&new).unwrap(),
            status,
            "an old coordinator ignores speed"
        );
        let old: Heartbeat = decode(&encode(&status)).unwrap();
        assert_eq!(old, Heartbeat::from(status), "an old worker's heartbeat: speed zeros");
        assert!(!old.speed.measured() && beat.speed.measured());
    }
}
