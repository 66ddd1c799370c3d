//! Keeps a bridge running: when the child exits (a crash, kill -9, an MLX abort), the
//! requests it was serving end with a retryable `unavailable` (the child's reader
//! does that), the model reports itself unhealthy — so the worker's heartbeat says
//! `unavailable` and coordinators route elsewhere — and a new child is started after
//! the shared restart backoff ([`crate::backends::backoff`]), until one loads.
//!
//! The task holds the supervisor only weakly: dropping the model stops the task and,
//! with it, the child.

use super::child::{Bridge, BridgeOptions};
use crate::backends::backoff::Backoff;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;
use switchyard_backend::BackendError;

/// The current bridge, restarted when it exits.
pub struct Supervised {
    /// The LoRA adapters loaded, as their `load_adapter` requests: sent again to a
    /// restarted child before it serves.
    pub(super) adapters: Mutex<Vec<(switchyard_messages::ServedAdapter, serde_json::Value)>>,
    current: RwLock<Option<Arc<Bridge>>>,
    /// Bumped at every new child: a session opened on an older one is gone.
    epoch: AtomicU64,
    restarts: AtomicU32,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Told when the child exits (what its caches held is gone).
    on_exit: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl Supervised {
    /// Starts the first child (its failure is the caller's error) and the task that
    /// restarts it.
    pub async fn start(opts: BridgeOptions, worker_id: String) -> Result<(Arc<Self>, serde_json::Value), BackendError> {
        let bridge = Arc::new(Bridge::start(&opts).await?);
        let info = bridge.info.clone();
        let me = Arc::new(Self {
            adapters: Mutex::default(),
            current: RwLock::new(Some(bridge)),
            epoch: AtomicU64::new(1),
            restarts: AtomicU32::new(0),
            task: Mutex::new(None),
            on_exit: Mutex::default(),
        });
        let task = tokio::spawn(supervise(Arc::downgrade(&me), opts, worker_id));
        *me.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
        Ok((me, info))
    }

    /// The running bridge and its epoch, or `unavailable` while it restarts.
    pub fn bridge(&self) -> Result<(Arc<Bridge>, u64), BackendError> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        match current.as_ref() {
            Some(b) if b.alive() => Ok((b.clone(), self.epoch.load(Ordering::Acquire))),
            _ => Err(BackendError::Unavailable(
                "the MLX bridge is restarting after its child exited".into(),
            )),
        }
    }

    /// Whether a bridge runs now.
    pub fn alive(&self) -> bool {
        self.bridge().is_ok()
    }

    /// The running child's pid.
    pub fn pid(&self) -> Option<u32> {
        self.bridge().ok().map(|(b, _)| b.pid)
    }

    /// Calls `f` whenever the child exits.
    pub fn on_exit(&self, f: impl Fn() + Send + Sync + 'static) {
        self.on_exit.lock().unwrap_or_else(|p| p.into_inner()).push(Box::new(f));
    }

    /// Times the child exited and was restarted (or is being restarted).
    pub fn restarts(&self) -> u32 {
        self.restarts.load(Ordering::Acquire)
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
    }
}

async fn supervise(me: Weak<Supervised>, opts: BridgeOptions, worker_id: String) {
    let mut backoff = Backoff::default();
    let mut started = Instant::now();
    loop {
        let Some(bridge) = me.upgrade().and_then(|s| s.bridge().ok()).map(|(b, _)| b) else {
            return;
        };
        bridge.exited().await;
        drop(bridge);
        let Some(sup) = me.upgrade() else { return };
        *sup.current.write().unwrap_or_else(|p| p.into_inner()) = None;
        sup.restarts.fetch_add(1, Ordering::AcqRel);
        for f in sup.on_exit.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            f();
        }
        drop(sup);
        crate::worker::telemetry::record_restart(&worker_id, "mlx-bridge");
        let mut wait = backoff.after_exit(started.elapsed());
        loop {
            tracing::warn!(worker = %worker_id, "the MLX bridge exited; restarting it in {wait:.1?}");
            tokio::time::sleep(wait).await;
            match Bridge::start(&opts).await {
                Ok(b) => {
                    let Some(sup) = me.upgrade() else { return };
                    let replay: Vec<serde_json::Value> = {
                        let adapters = sup.adapters.lock().unwrap_or_else(|p| p.into_inner());
                        adapters.iter().map(|(_, r)| r.clone()).collect()
                    };
                    for r in replay {
                        if let Err(e) = b.call(r.clone()).await {
                            tracing::error!(worker = %worker_id, "the restarted MLX bridge did not load {}: {e}", r["name"]);
                        }
                    }
                    tracing::info!(worker = %worker_id, pid = b.pid, "the MLX bridge is back");
                    *sup.current.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(b));
                    sup.epoch.fetch_add(1, Ordering::AcqRel);
                    started = Instant::now();
                    break;
                }
                Err(e) => {
                    tracing::warn!(worker = %worker_id, "the MLX bridge did not start again: {e}");
                    if me.strong_count() == 0 {
                        return;
                    }
                    wait = backoff.after_failed_start();
                }
            }
        }
    }
}
