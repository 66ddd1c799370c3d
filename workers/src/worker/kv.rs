//! What a worker holds warm, for KV-aware routing (see `switchyard_messages::kv`).
//!
//! Each finished request leaves its prompt's prefix resident in one of the worker's
//! slots (the CPU engine has one resident sequence; a llama.cpp server one per slot).
//! [`KvTracker`] keeps the most recent `slots` requests' block lists and turns each
//! change into a sequence-numbered [`KvEvent`].

use std::collections::{HashMap, VecDeque};
use switchyard_messages::{KvEvent, KvSnapshot, PROTOCOL_VERSION};

/// The warm prefixes of one worker.
#[derive(Debug)]
pub struct KvTracker {
    worker_id: String,
    slots: usize,
    seq: u64,
    recent: VecDeque<Vec<u64>>,
    held: HashMap<u64, u32>,
}

impl KvTracker {
    /// A tracker for a worker with `slots` resident sequences (at least 1).
    pub fn new(worker_id: &str, slots: usize) -> Self {
        Self {
            worker_id: worker_id.to_string(),
            slots: slots.max(1),
            seq: 0,
            recent: VecDeque::new(),
            held: HashMap::new(),
        }
    }

    /// A request over `blocks` finished: they are warm now, and the least recent
    /// request beyond `slots` is not. The event, or `None` when nothing changed.
    pub fn record(&mut self, blocks: Vec<u64>) -> Option<KvEvent> {
        let mut stored = Vec::new();
        let mut removed = Vec::new();
        for b in &blocks {
            let n = self.held.entry(*b).or_insert(0);
            *n += 1;
            if *n == 1 {
                stored.push(*b);
            }
        }
        self.recent.push_back(blocks);
        while self.recent.len() > self.slots {
            for b in self.recent.pop_front().unwrap_or_default() {
                if let Some(n) = self.held.get_mut(&b) {
                    *n -= 1;
                    if *n == 0 {
                        self.held.remove(&b);
                        removed.push(b);
                    }
                }
            }
        }
        // A block both stored and removed in one step was never announced.
        stored.retain(|b| self.held.contains_key(b));
        removed.retain(|b| !stored.contains(b));
        if stored.is_empty() && removed.is_empty() {
            return None;
        }
        self.seq += 1;
        Some(KvEvent {
            v: PROTOCOL_VERSION,
            worker_id: self.worker_id.clone(),
            seq: self.seq,
            stored,
            removed,
        })
    }

    /// Everything held, as of the last event.
    pub fn snapshot(&self) -> KvSnapshot {
        KvSnapshot {
            v: PROTOCOL_VERSION,
            worker_id: self.worker_id.clone(),
            seq: self.seq,
            blocks: self.held.keys().copied().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_slot_falls_out_and_shared_blocks_stay() {
        let mut t = KvTracker::new("w", 2);
        let e = t.record(vec![1, 2, 3]).unwrap();
        assert_eq!((e.seq, e.stored, e.removed), (1, vec![1, 2, 3], vec![]));
        let e = t.record(vec![1, 2, 4]).unwrap();
        assert_eq!((e.seq, e.stored, e.removed), (2, vec![4], vec![]));
        // Third request: [1, 2, 3] falls out, but 1 and 2 are still held by [1, 2, 4].
        let e = t.record(vec![1, 5]).unwrap();
        assert_eq!((e.seq, e.stored, e.removed), (3, vec![5], vec![3]));
        assert!(t.record(vec![1, 5]).map(|e| e.removed) == Some(vec![2, 4]));
        let mut snap = t.snapshot().blocks;
        snap.sort();
        assert_eq!((t.snapshot().seq, snap), (4, vec![1, 5]));
        // Nothing changes: no event, no sequence number used.
        assert!(t.record(vec![1, 5]).is_none());
        assert_eq!(t.snapshot().seq, 4);
    }
}
