//! What each worker's KV cache holds, as its engine announces it (protocol 1.9,
//! [`switchyard_messages::KvHolding`]), to predict a forwarded request's
//! `cached_tokens` to the token. Routing itself reads the block index
//! (`registry/prefix.rs`); this book only predicts, for the worker a request goes
//! to, and the prediction travels with the forward (`Sy-Kv-Predicted`) so the
//! worker reports it beside what it really reused.
//!
//! It also names, for a forward, the peer that holds more of the request's prefix
//! than the worker it goes to (`Sy-Kv-Peer`, protocol 1.11): only a peer whose KV
//! format ([`switchyard_messages::KvFormat::key`], from heartbeats) is the worker's,
//! so KV is only ever offered between workers computing it alike.
//!
//! Written by the KV event, snapshot and heartbeat tasks, read by forwards: plain
//! maps behind a mutex (each access is one short lookup or update), not actor state
//! — nothing decides on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_messages::kv::{predict_reuse, predict_reuse_by_blocks};
use switchyard_messages::{KvEvent, KvHolding, KvSnapshot};

/// Holdings per worker id (only workers that announce them), and the KV format key
/// of each worker whose heartbeat announces one.
#[derive(Debug, Default, Clone)]
pub struct HoldingsBook(Arc<Mutex<Book>>);

#[derive(Debug, Default)]
struct Book {
    held: HashMap<String, HashMap<u64, KvHolding>>,
    /// Each worker's KV format key and when its last heartbeat came.
    formats: HashMap<String, (String, Instant)>,
    /// (1.12) Each worker of a KV format as disaggregated prefill sees it.
    seats: HashMap<String, crate::disagg::Seat>,
    /// A worker silent this long is no peer (it left, or died with its KV).
    expiry: Duration,
}

impl HoldingsBook {
    /// A book whose peers are workers heard from within `expiry` (the coordinator's
    /// worker expiry).
    pub fn new(expiry: Duration) -> Self {
        Self(Arc::new(Mutex::new(Book {
            expiry,
            ..Book::default()
        })))
    }

    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, HashMap<u64, KvHolding>>) -> T) -> T {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()).held)
    }

    /// Notes each heartbeat's KV format (its first model's; none: it exchanges none).
    pub fn formats(&self, beats: &[switchyard_messages::Heartbeat]) {
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for b in beats {
            let key = b
                .status
                .models
                .first()
                .and_then(|m| m.kv_format.as_ref())
                .map(|f| f.key());
            let s = &b.status;
            let seat = crate::disagg::Seat {
                role: s.role,
                open: s.available && !s.draining,
                load: s.in_flight + s.queued,
                capacity: s.capacity,
                prefill_tps: if b.speed.measured() { b.speed.prefill_tps } else { 0.0 },
                token_bytes: s
                    .models
                    .first()
                    .and_then(|m| m.kv_format.as_ref())
                    .map_or(0, |f| f.token_bytes()),
            };
            book.seats.insert(s.worker_id.clone(), seat);
            match key {
                Some(k) => book.formats.insert(s.worker_id.clone(), (k, Instant::now())),
                None => book.formats.remove(&s.worker_id),
            };
        }
    }

    /// (1.12) The `prefill` worker of `target`'s KV format to compute a prompt of
    /// about `tokens` tokens that `target` does not hold, when disaggregation applies
    /// ([`crate::disagg::choose`]).
    pub fn prefiller(&self, target: &str, tokens: usize, min_tokens: usize) -> Option<String> {
        let book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (format, _) = book.formats.get(target)?;
        let seat = book.seats.get(target)?;
        let peers = book.seats.iter().filter_map(|(w, s)| {
            let (f, seen) = book.formats.get(w)?;
            (w != target && f == format && seen.elapsed() < book.expiry).then_some((w.as_str(), *s))
        });
        crate::disagg::choose(seat, tokens, min_tokens, peers).map(str::to_string)
    }

    /// The worker other than `worker_id`, of the same KV format, predicted to hold
    /// the most tokens of a request with prediction key `key` (run with `adapter`),
    /// when that is more than `worker_id` is predicted to hold: `(peer, tokens)`.
    pub fn best_peer(&self, worker_id: &str, adapter: Option<&str>, key: &[u8]) -> Option<(String, u32)> {
        let book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (format, _) = book.formats.get(worker_id)?;
        let alike = |w: &str| {
            book.formats
                .get(w)
                .is_some_and(|(f, seen)| f == format && seen.elapsed() < book.expiry)
        };
        let own = book
            .held
            .get(worker_id)
            .map_or(0, |h| predict_reuse(h.values(), adapter, key));
        book.held
            .iter()
            .filter(|(w, _)| w.as_str() != worker_id && alike(w))
            .map(|(w, h)| (predict_reuse(h.values(), adapter, key), w))
            .filter(|(n, _)| *n > own)
            .max()
            .map(|(n, w)| (w.clone(), n))
    }

    /// Whether `a` and `b` announce the same KV format, both heard from within the
    /// expiry: KV computed on one is valid on the other.
    pub fn same_format(&self, a: &str, b: &str) -> bool {
        let book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let live = |w: &str| book.formats.get(w).filter(|(_, seen)| seen.elapsed() < book.expiry);
        matches!((live(a), live(b)), (Some((fa, _)), Some((fb, _))) if fa == fb)
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
        let mut book = self.0.lock().unwrap_or_else(|p| p.into_inner());
        book.held.remove(worker_id);
        book.formats.remove(worker_id);
        book.seats.remove(worker_id);
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

    fn beat(worker: &str, format: Option<&str>) -> switchyard_messages::Heartbeat {
        let mut status = status(worker);
        status.models[0].kv_format = format.map(|sha| switchyard_messages::KvFormat {
            engine: "switchyard-cpu/1".into(),
            model_sha256: sha.into(),
            dtype: "f16".into(),
            layers: 2,
            kv_heads: 1,
            head_dim: 4,
            block_tokens: 32,
            params: String::new(),
        });
        switchyard_messages::Heartbeat {
            status,
            speed: Default::default(),
        }
    }

    /// A minimal heartbeat status for `worker`.
    fn status(worker: &str) -> switchyard_messages::WorkerStatus {
        switchyard_messages::WorkerStatus {
            v: 1,
            worker_id: worker.into(),
            device: "cpu".into(),
            backend: "cpu".into(),
            models: vec![switchyard_messages::ServedModel {
                name: "m".into(),
                path: String::new(),
                info: Default::default(),
                adapters: Vec::new(),
                kv_format: None,
            }],
            capacity: 1,
            queue_capacity: 0,
            in_flight: 0,
            queued: 0,
            available: true,
            draining: false,
            host: String::new(),
            pid: 0,
            started_at_ms: 0,
            seq: 1,
            completed: 0,
            version: String::new(),
            kv: Default::default(),
            recent: Default::default(),
            nats_server: String::new(),
            role: Default::default(),
        }
    }

    #[test]
    fn the_best_peer_holds_more_and_computes_alike() {
        let book = HoldingsBook::new(Duration::from_secs(60));
        let with = |w: &str, key: &str| KvEvent {
            worker_id: w.into(),
            ..event(1, vec![holding(1, key)], vec![])
        };
        book.event(&with("a", "abcdefgh"));
        book.event(&with("b", "abc"));
        book.event(&with("c", "abcdefghij"));
        // No formats known yet: no peer is offered.
        assert_eq!(book.best_peer("b", None, b"abcdefghijkl"), None);
        book.formats(&[beat("a", Some("x")), beat("b", Some("x")), beat("c", Some("y"))]);
        assert_eq!(
            book.best_peer("b", None, b"abcdefghijkl"),
            Some(("a".into(), 8)),
            "c holds more, but computes other KV"
        );
        assert_eq!(
            book.best_peer("a", None, b"abcdefghijkl"),
            None,
            "nobody alike holds more"
        );
        assert_eq!(
            book.best_peer("b", Some("lora"), b"abcdefghijkl"),
            None,
            "another adapter's KV"
        );
        book.formats(&[beat("a", None)]);
        assert_eq!(
            book.best_peer("b", None, b"abcdefghijkl"),
            None,
            "a stopped announcing a format"
        );
        // A peer not heard from within the expiry is gone.
        let quick = HoldingsBook::new(Duration::ZERO);
        quick.event(&with("a", "abcdefgh"));
        quick.formats(&[beat("a", Some("x")), beat("b", Some("x"))]);
        assert_eq!(quick.best_peer("b", None, b"abcdefghijkl"), None);
    }
}
