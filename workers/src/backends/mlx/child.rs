//! The bridge child: a Python process running `bridge.py`, spoken to in JSON Lines
//! (docs/protocol.md §14). One task reads its stdout and routes each event to the
//! request with its `id`; writes go through one lock. When the child exits, every
//! request still waiting ends with a retryable `unavailable`, and [`Bridge::exited`]
//! resolves (the supervisor then starts a new one).

use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchyard_backend::BackendError;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// The bridge script, shipped inside the binary and written to the cache at start.
pub const BRIDGE_PY: &str = include_str!("bridge.py");

type Pending = Arc<Mutex<HashMap<u64, UnboundedSender<Value>>>>;

/// How to start a bridge.
#[derive(Debug, Clone)]
pub struct BridgeOptions {
    /// A Python with mlx-lm.
    pub python: PathBuf,
    /// Where the script is written.
    pub cache: PathBuf,
    /// The Hugging Face directory MLX loads.
    pub model: PathBuf,
    /// `cpu`, `gpu` or `""` (MLX's default).
    pub device: String,
    /// Session caches the bridge keeps at most.
    pub max_sessions: u32,
    /// How long starting and loading may take.
    pub startup_timeout: Duration,
}

/// A running bridge with a loaded model.
pub struct Bridge {
    stdin: tokio::sync::Mutex<tokio::process::ChildStdin>,
    pending: Pending,
    next_id: AtomicU64,
    alive: Arc<AtomicBool>,
    exited: tokio::sync::watch::Receiver<bool>,
    child: Mutex<Option<tokio::process::Child>>,
    /// What `load` answered.
    pub info: Value,
    /// The child's pid.
    pub pid: u32,
}

/// A request's events, ending with `done` or `error` (or the bridge's exit).
pub struct Events {
    pub id: u64,
    rx: UnboundedReceiver<Value>,
}

impl Events {
    /// The next event; `None` after the last.
    pub async fn next(&mut self) -> Option<Value> {
        self.rx.recv().await
    }
}

fn gone(why: &str) -> BackendError {
    BackendError::Unavailable(format!("the MLX bridge {why}"))
}

/// An `error` event as the contract's error: `context_overflow` with its numbers
/// (`prompt_tokens`, `max_tokens`, `context_len`) as the contract's own, so clients
/// see the same code from every backend.
pub fn error_from(ev: &Value) -> BackendError {
    let message = ev["message"].as_str().unwrap_or("MLX failed").to_string();
    let n = |k: &str| ev[k].as_u64().map(|v| v as usize);
    match ev["code"].as_str() {
        Some("bad_request") => BackendError::Invalid(message),
        Some("context_overflow") => match (n("prompt_tokens"), n("max_tokens"), n("context_len")) {
            (Some(prompt_tokens), Some(max_tokens), Some(context_len)) => BackendError::ContextOverflow {
                prompt_tokens,
                max_tokens,
                context_len,
            },
            _ => BackendError::Invalid(format!("context overflow: {message}")),
        },
        Some("unavailable") => BackendError::Unavailable(message),
        Some("overloaded") => BackendError::Overloaded(message),
        _ => BackendError::Compute(message),
    }
}

impl Bridge {
    /// Writes the bridge script under the cache, starts it, and loads the model,
    /// waiting up to the startup timeout.
    pub async fn start(opts: &BridgeOptions) -> Result<Self, BackendError> {
        let (python, cache, model) = (&opts.python, &opts.cache, &opts.model);
        let timeout = opts.startup_timeout;
        let script = cache.join("mlx-bridge.py");
        std::fs::create_dir_all(cache)
            .and_then(|_| std::fs::write(&script, BRIDGE_PY))
            .map_err(|e| BackendError::Load {
                path: script.display().to_string(),
                reason: format!("writing the bridge script: {e}"),
            })?;
        let mut cmd = std::process::Command::new(python);
        cmd.arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        switchyard_fabric::process::kill_with_parent(&mut cmd);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| BackendError::Load {
            path: python.display().to_string(),
            reason: format!(
                "starting the MLX bridge with {}: {e} (worker.mlx_python)",
                python.display()
            ),
        })?;
        let pid = child.id().unwrap_or(0);
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let pending: Pending = Arc::default();
        let alive = Arc::new(AtomicBool::new(true));
        let (ready_tx, mut ready_rx) = unbounded_channel::<Value>();
        let (p, a) = (pending.clone(), alive.clone());
        let (exited_tx, exited) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(ev) = serde_json::from_str::<Value>(&line) else {
                    tracing::warn!("mlx bridge wrote a line that is not JSON: {line}");
                    continue;
                };
                let Some(id) = ev["id"].as_u64() else {
                    let _ = ready_tx.send(ev);
                    continue;
                };
                let last = ev["event"] != "token";
                let mut map = p.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(tx) = map.get(&id) {
                    let _ = tx.send(ev);
                }
                if last {
                    map.remove(&id);
                }
            }
            a.store(false, Ordering::Release);
            // Every waiting request hears that the bridge is gone.
            for (_, tx) in p.lock().unwrap_or_else(|e| e.into_inner()).drain() {
                let _ = tx.send(json!({"event": "error", "code": "unavailable", "message": "the MLX bridge exited"}));
            }
            let _ = exited_tx.send(true);
        });
        let mut bridge = Bridge {
            stdin: tokio::sync::Mutex::new(stdin),
            pending,
            next_id: AtomicU64::new(1),
            alive,
            exited,
            child: Mutex::new(Some(child)),
            info: Value::Null,
            pid,
        };
        let ready = tokio::time::timeout(timeout, ready_rx.recv()).await;
        if !matches!(ready, Ok(Some(ref v)) if v["event"] == "ready") {
            return Err(BackendError::Load {
                path: python.display().to_string(),
                reason:
                    "the MLX bridge did not start (is mlx-lm installed for this Python? scripts/setup.sh installs it)"
                        .into(),
            });
        }
        let mut ev = bridge
            .request(json!({"op": "load", "path": model, "device": opts.device, "max_sessions": opts.max_sessions}))
            .await?;
        let loaded = tokio::time::timeout(timeout, ev.next()).await.ok().flatten();
        match loaded {
            Some(v) if v["event"] == "loaded" => {
                bridge.info = v["info"].clone();
                Ok(bridge)
            }
            Some(v) => Err(BackendError::Load {
                path: model.display().to_string(),
                reason: format!("MLX: {}", v["message"].as_str().unwrap_or("load failed")),
            }),
            None => Err(BackendError::Load {
                path: model.display().to_string(),
                reason: format!("MLX did not load the model within {timeout:?}"),
            }),
        }
    }

    /// Resolves once the child has exited (at once if it has).
    pub async fn exited(&self) {
        let mut rx = self.exited.clone();
        let _ = rx.wait_for(|gone| *gone).await;
    }

    /// Sends a request that has one answer and waits for it; an `error` event (or
    /// the bridge's exit) becomes the error.
    pub async fn call(&self, body: Value) -> Result<Value, BackendError> {
        let mut events = self.request(body).await?;
        match events.next().await {
            Some(ev) if ev["event"] == "error" => Err(error_from(&ev)),
            Some(ev) => Ok(ev),
            None => Err(gone("ended the request without an answer")),
        }
    }

    /// Whether the child still runs.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Sends a request (its `id` is added) and returns its events.
    pub async fn request(&self, mut body: Value) -> Result<Events, BackendError> {
        if !self.alive() {
            return Err(gone("is not running"));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        body["id"] = json!(id);
        let (tx, rx) = unbounded_channel();
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        let line = format!("{body}\n");
        let mut stdin = self.stdin.lock().await;
        if let Err(e) = stdin.write_all(line.as_bytes()).await.and(stdin.flush().await) {
            self.pending.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            return Err(gone(&format!("cannot be written to: {e}")));
        }
        Ok(Events { id, rx })
    }

    /// Asks the bridge to stop request `id` at its next token.
    pub async fn cancel(&self, id: u64) {
        let line = format!("{}\n", json!({"op": "cancel", "target": id}));
        let mut stdin = self.stdin.lock().await;
        let _ = stdin.write_all(line.as_bytes()).await;
        let _ = stdin.flush().await;
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = c.start_kill();
        }
    }
}
