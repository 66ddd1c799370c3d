//! KV between workers over NATS, worker to worker (never through a coordinator):
//! [`serve`] answers peers' pulls on `{p}.v1.kv.{wid}.pull` from what the model
//! holds, and [`pull`] (called before a generation the coordinator says a peer holds
//! more of, `Sy-Kv-Peer`) fetches the prefix's blocks into the model's block store
//! when [`policy`] predicts that beats computing them. The wire is
//! `switchyard_messages::kv_transfer`; chunking, the window and digests are
//! `switchyard_fabric::transfer`'s. Any failure leaves the prompt to be computed.

pub mod policy;
mod prefill;
mod pull;
mod serve;

pub use prefill::serve as serve_prefill;
pub use pull::{pull, pull_for};
pub use serve::serve;

use policy::Link;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use switchyard_messages::KvTransferStats;

/// What a worker keeps of its transfers: counters for heartbeats and metrics, and
/// each peer's measured link.
#[derive(Debug, Default)]
pub struct TransferState {
    pulls: AtomicU64,
    pulled_tokens: AtomicU64,
    pulled_bytes: AtomicU64,
    pull_fallbacks: AtomicU64,
    recomputed: AtomicU64,
    served_chunks: AtomicU64,
    served_bytes: AtomicU64,
    pub(crate) handed_over: AtomicU64,
    pub(crate) taken_over: AtomicU64,
    pub(crate) handover_fallbacks: AtomicU64,
    prefills_served: AtomicU64,
    remote_prefills: AtomicU64,
    remote_prefill_fallbacks: AtomicU64,
    pub(crate) sessions_moved: AtomicU64,
    pub(crate) sessions_adopted: AtomicU64,
    links: Mutex<HashMap<String, Link>>,
}

impl TransferState {
    /// The counters, as heartbeats carry them.
    pub fn stats(&self) -> KvTransferStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        KvTransferStats {
            pulls: get(&self.pulls),
            pulled_tokens: get(&self.pulled_tokens),
            pulled_bytes: get(&self.pulled_bytes),
            pull_fallbacks: get(&self.pull_fallbacks),
            recomputed: get(&self.recomputed),
            served_chunks: get(&self.served_chunks),
            served_bytes: get(&self.served_bytes),
            handed_over: get(&self.handed_over),
            taken_over: get(&self.taken_over),
            handover_fallbacks: get(&self.handover_fallbacks),
            prefills_served: get(&self.prefills_served),
            remote_prefills: get(&self.remote_prefills),
            remote_prefill_fallbacks: get(&self.remote_prefill_fallbacks),
            sessions_moved: get(&self.sessions_moved),
            sessions_adopted: get(&self.sessions_adopted),
        }
    }

    /// The link to `peer` as measured (or assumed).
    pub fn link(&self, peer: &str) -> Link {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        links.get(peer).copied().unwrap_or(Link::ASSUMED)
    }

    fn observe(&self, peer: &str, bytes_per_sec: f64, rtt: std::time::Duration) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a fleet has few peers, but a worker must not grow without end.
        if links.len() >= 1024 && !links.contains_key(peer) {
            links.clear();
        }
        let now = links
            .get(peer)
            .copied()
            .unwrap_or(Link::ASSUMED)
            .observe(bytes_per_sec, rtt);
        links.insert(peer.to_string(), now);
    }

    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}
