//! Watching a process's root actor (a worker's or a coordinator's): ractor runs no
//! `post_stop` after a panic, so a failed root would leave its NATS subscriptions
//! behind and its serving tasks answering `internal` to its share of the traffic.
//! [`RootWatch`] notices the end its owner did not ask for, drains the NATS
//! connection (the server drops every subscription: requests go to the rest of the
//! fleet, or get "no responders" at once) and says why, so the process can exit
//! non-zero and its service manager start it again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How a root actor ended, watched from its start.
#[derive(Clone)]
pub struct RootWatch {
    stopping: Arc<AtomicBool>,
    failed: watch::Receiver<Option<String>>,
}

impl RootWatch {
    /// Watches the actor whose task is `join` (from `Actor::spawn`); `what` names it in
    /// the log and the failure ("worker w1"). `client` is the connection it serves on.
    pub fn start(join: tokio::task::JoinHandle<()>, client: async_nats::Client, what: String) -> Self {
        let stopping = Arc::new(AtomicBool::new(false));
        let (tx, failed) = watch::channel(None);
        let asked = stopping.clone();
        tokio::spawn(async move {
            let ended = join.await;
            if asked.load(Ordering::Acquire) {
                return;
            }
            let why = match ended {
                Err(e) if e.is_panic() => format!("{what}'s actor panicked outside its handlers"),
                _ => format!("{what}'s actor stopped without being asked to (a handler failed)"),
            };
            tracing::error!("{why}; draining its NATS connection so requests go elsewhere");
            // Until the connection has closed, so no request lands here after `failed`;
            // bounded: with the NATS server gone the drain would wait for it.
            if !crate::nats::drain_closed(&client, Duration::from_secs(10)).await {
                tracing::warn!("{what}: the NATS connection did not close within 10 s of the drain");
            }
            let _ = tx.send(Some(why));
        });
        Self { stopping, failed }
    }

    /// Marks the end that follows as asked for (call before stopping the actor).
    pub fn stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Resolves, with the reason, once the actor has ended without being asked to and
    /// its connection is drained; never, while it runs or after an asked-for stop.
    pub async fn failed(&self) -> String {
        let mut rx = self.failed.clone();
        let why = match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone(),
            Err(_) => None,
        };
        match why {
            Some(why) => why,
            None => std::future::pending().await,
        }
    }
}
