//! A session (seed 002) on the MLX bridge: its own prompt cache in the child
//! (`session_open`), made equal to a target by keeping the longest resident prefix
//! and computing the rest (`set_resident`), generated from (`decode`). The bridge
//! tracks what the cache holds; `resident` asks it. A session belongs to one child:
//! after a restart its cache is gone and every call says so.

use super::child::Bridge;
use super::requests::{body, config_json, stream};
use super::supervisor::Supervised;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use switchyard_backend::{BackendError, BackendFuture, CancelFlag, GenerateStream, ModelSession, ResidentUpdate};
use switchyard_messages::{GenerateConfig, GenerateMetrics};

/// One session's cache in the bridge.
pub struct MlxSession {
    bridge: Arc<Supervised>,
    epoch: u64,
    id: String,
    closed: AtomicBool,
    last: Arc<Mutex<GenerateMetrics>>,
}

impl MlxSession {
    /// Opens a session cache in the running child.
    pub async fn open(bridge: Arc<Supervised>, last: Arc<Mutex<GenerateMetrics>>) -> Result<Self, BackendError> {
        let (b, epoch) = bridge.bridge()?;
        let ev = b.call(json!({"op": "session_open"})).await?;
        let id = ev["session"].as_str().unwrap_or_default().to_string();
        Ok(Self {
            bridge,
            epoch,
            id,
            closed: AtomicBool::new(false),
            last,
        })
    }

    /// The child this session lives in, if it is still the running one.
    fn child(&self) -> Result<Arc<Bridge>, BackendError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(BackendError::Invalid("the session is closed".into()));
        }
        let (b, epoch) = self.bridge.bridge()?;
        if epoch != self.epoch {
            return Err(BackendError::Unavailable(
                "the MLX bridge restarted since this session was opened; its cache is gone".into(),
            ));
        }
        Ok(b)
    }

    fn call(&self, op: &str, extra: serde_json::Value) -> BackendFuture<serde_json::Value> {
        let child = self.child();
        let mut request = body(op, None, extra);
        request["session"] = json!(self.id);
        Box::pin(async move { child?.call(request).await })
    }
}

fn token_ids(v: &serde_json::Value) -> Vec<u32> {
    v["tokens"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_u64())
        .map(|t| t as u32)
        .collect()
}

impl ModelSession for MlxSession {
    fn tokenize(&self, text: String, bos: bool) -> BackendFuture<Vec<u32>> {
        let answer = self.call("tokenize", json!({"text": text, "bos": bos}));
        Box::pin(async move { Ok(token_ids(&answer.await?)) })
    }

    fn set_resident(&self, target: Vec<u32>, invalidate: bool) -> BackendFuture<ResidentUpdate> {
        if target.is_empty() {
            return Box::pin(async { Err(BackendError::EmptyPrompt) });
        }
        let answer = self.call("set_resident", json!({"tokens": target, "invalidate": invalidate}));
        Box::pin(async move {
            let v = answer.await?;
            let n = |k: &str| v[k].as_u64().unwrap_or(0) as u32;
            Ok(ResidentUpdate {
                reused: n("reused"),
                computed: n("computed"),
                dropped: n("dropped"),
            })
        })
    }

    fn decode(&self, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        if let Err(e) = self.child() {
            return GenerateStream::new(futures::stream::once(async move { Err(e) }));
        }
        let request = body(
            "decode",
            None,
            json!({"session": self.id, "config": config_json(&config)}),
        );
        stream(&self.bridge, request, &config, cancel, self.last.clone(), None)
    }

    fn resident(&self) -> BackendFuture<Vec<u32>> {
        let answer = self.call("resident", json!({}));
        Box::pin(async move { Ok(token_ids(&answer.await?)) })
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok((b, epoch)) = self.bridge.bridge() {
            if epoch == self.epoch {
                let request = json!({"op": "session_close", "session": self.id});
                tokio::spawn(async move {
                    let _ = b.call(request).await;
                });
            }
        }
    }
}

impl Drop for MlxSession {
    fn drop(&mut self) {
        if tokio::runtime::Handle::try_current().is_ok() {
            self.close();
        }
    }
}
