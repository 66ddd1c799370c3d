//! What each worker's KV cache holds, as its engine announces it (protocol 1.9,
//! [`switchyard_messages::KvHolding`]), to predict a forwarded request's
//! `cached_tokens` to the token. Routing itself reads the block index
//! (`registry/prefix.rs`); this book only predicts, for the worker a request goes
//! to, and the prediction travels with the forward (`Sy-Kv-Predicted`) so the
//! worker reports it beside what it really reused.
//!
//! Written by the KV event and snapshot tasks, read by forwards: a plain map behind
//! a mutex (each access is one short lookup or update), not actor state — nothing
//! decides on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use switchyard_messages::kv::{predict_reuse, predict_reuse_by_blocks};
use switchyard_messages::{KvEvent, KvHolding, KvSnapshot};

/// Holdings per worker id (only workers that announce them).
#[derive(Debug, Default, Clone)]
pub struct HoldingsBook(Arc<Mutex<HashMap<String, HashMap<u64, KvHolding>>>>);

impl HoldingsBook {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, HashMap<u64, KvHolding>>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Applies a worker's event (`seq` 1 starts it over).
    pub fn event(&self, e: &KvEvent) {
        self.with(|book| {
            if e.seq == 1 {
                book.remove(&e.worker_id);
            }
            if !e.precise {
                return;
            }
            let held = book.entry(e.worker_id.clone()).or_default();
            for id in &e.released {
                held.remove(id);
            }
            for h in &e.holdings {
                held.insert(h.id, h.clone());
            }
        });
    }

    /// Replaces a worker's holdings with its snapshot's.
    pub fn snapshot(&self, s: &KvSnapshot) {
        self.with(|book| {
            if s.precise {
                book.insert(
                    s.worker_id.clone(),
                    s.holdings.iter().map(|h| (h.id, h.clone())).collect(),
                );
            } else {
                book.remove(&s.worker_id);
            }
        });
    }

    /// Forgets a worker (it left).
    pub fn remove(&self, worker_id: &str) {
        self.with(|book| book.remove(worker_id));
    }

    /// The tokens `worker_id` should reuse for a request with prediction key `key`
    /// run with LoRA `adapter`, precise and by whole blocks; `None` for a worker that
    /// announces no holdings.
    pub fn predict(&self, worker_id: &str, adapter: Option<&str>, key: &[u8]) -> Option<(u32, u32)> {
        self.with(|book| {
            let held = book.get(worker_id)?;
            Some((
                predict_reuse(held.values(), adapter, key),
                predict_reuse_by_blocks(held.values(), adapter, key),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holding(id: u64, key: &str) -> KvHolding {
        KvHolding {
            id,
            key: key.into(),
            bounds: (1..=key.len() as u32).collect(),
            min_reuse: 0,
            granule: 1,
            min_share: 0,
            adapter: None,
        }
    }

    fn event(seq: u64, holdings: Vec<KvHolding>, released: Vec<u64>) -> KvEvent {
        KvEvent {
            v: 1,
            worker_id: "w".into(),
            seq,
            stored: Vec::new(),
            removed: Vec::new(),
            precise: true,
            holdings,
            released,
        }
    }

    #[test]
    fn events_and_snapshots_keep_each_workers_holdings() {
        let book = HoldingsBook::default();
        assert_eq!(
            book.predict("w", None, b"abc"),
            None,
            "no holdings announced: no prediction"
        );
        book.event(&event(1, vec![holding(1, "abcdef")], vec![]));
        assert_eq!(book.predict("w", None, b"abcxyz"), Some((3, 0)));
        book.event(&event(2, vec![holding(2, "xy")], vec![1]));
        assert_eq!(book.predict("w", None, b"abcxyz"), Some((0, 0)));
        assert_eq!(book.predict("w", None, b"xyz"), Some((2, 0)));
        // A fresh start forgets everything; a snapshot replaces it.
        book.event(&KvEvent {
            precise: false,
            ..event(1, vec![], vec![])
        });
        assert_eq!(book.predict("w", None, b"xyz"), None);
        book.snapshot(&KvSnapshot {
            v: 1,
            worker_id: "w".into(),
            seq: 3,
            blocks: Vec::new(),
            precise: true,
            holdings: vec![holding(3, "abcdef")],
        });
        assert_eq!(book.predict("w", None, b"abcdef!"), Some((6, 0)));
        book.remove("w");
        assert_eq!(book.predict("w", None, b"abcdef!"), None);
    }
}
