//! (1.10) Operating a worker's LoRA adapters at run time: an [`AdapterRequest`] on the
//! worker's `adapters` endpoint (`{p}.v1.worker.{wid}.adapters`), answered by an
//! [`AdapterReply`]. Only the operator's NATS role may publish there
//! (docs/nats-roles.conf); clients and coordinators may not.

use crate::{ServedAdapter, WireError};
use serde::{Deserialize, Serialize};

/// What to do with a worker's adapters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AdapterOp {
    /// Say which are loaded.
    #[default]
    List,
    /// Load `path` as `name` at `scale` (replacing one of that name).
    Load,
    /// Unload `name`: running requests finish with it, later ones are refused.
    Unload,
}

/// A request on a worker's `adapters` endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterRequest {
    /// Protocol version.
    pub v: u32,
    /// What to do.
    #[serde(default)]
    pub op: AdapterOp,
    /// The adapter's name (load, unload).
    #[serde(default)]
    pub name: String,
    /// A PEFT directory or a GGUF LoRA file, on the worker's machine (load).
    #[serde(default)]
    pub path: String,
    /// The update's scale (load; default 1).
    #[serde(default = "unit")]
    pub scale: f32,
}

fn unit() -> f32 {
    1.0
}

/// A worker's answer: its adapters after the operation, or why it failed (then
/// nothing changed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdapterReply {
    /// Protocol version.
    pub v: u32,
    /// The worker answering.
    pub worker_id: String,
    /// The adapters loaded now.
    #[serde(default)]
    pub adapters: Vec<ServedAdapter>,
    /// Why the operation failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
}
