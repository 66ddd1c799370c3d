//! Which worker holds which prefix blocks warm, indexed both ways.
//!
//! Per worker (by registry slot): the blocks its KV events and snapshots announced,
//! the `seq` they are current to, and the prefix of the last request routed there.
//! Per block: the slots holding it. A routing decision walks the request's blocks
//! once through the second map ([`PrefixIndex::depths`]) — one hash lookup per
//! block plus one step per holder, however many workers there are — instead of
//! probing every candidate's set for every block (1,000 workers × 30 blocks of
//! scattered lookups per decision).

use std::collections::{HashMap, HashSet};
use switchyard_messages::{KvEvent, KvSnapshot};

#[derive(Debug, Default)]
struct Held {
    seq: u64,
    blocks: HashSet<u64>,
    /// The prefix of the last request routed here: warm once it has run.
    pending: Vec<u64>,
}

/// The slots holding one block: a list while few do, a bitset once many do (a popular
/// system prompt's blocks are held by most of a fleet; a bitset of 1,000 slots is 16
/// words, and intersecting it costs 16 word operations).
#[derive(Debug)]
enum Holders {
    List(Vec<u32>),
    Bits { words: Vec<u64>, count: u32 },
}

fn bit(words: &[u64], s: u32) -> bool {
    words.get(s as usize / 64).is_some_and(|w| w & (1 << (s % 64)) != 0)
}

impl Holders {
    fn len(&self) -> usize {
        match self {
            Holders::List(l) => l.len(),
            Holders::Bits { count, .. } => *count as usize,
        }
    }

    /// Adds `slot` (not already in); `slots` is the registry's slot count.
    fn add(&mut self, slot: u32, slots: usize) {
        match self {
            Holders::List(l) => {
                l.push(slot);
                if l.len() >= (slots / 32).max(64) {
                    let mut words = vec![0u64; slots.div_ceil(64)];
                    for &s in l.iter() {
                        Self::set(&mut words, s);
                    }
                    *self = Holders::Bits {
                        words,
                        count: l.len() as u32,
                    };
                }
            }
            Holders::Bits { words, count } => {
                if !bit(words, slot) {
                    Self::set(words, slot);
                    *count += 1;
                }
            }
        }
    }

    fn set(words: &mut Vec<u64>, s: u32) {
        let i = s as usize / 64;
        if words.len() <= i {
            words.resize(i + 1, 0);
        }
        words[i] |= 1 << (s % 64);
    }

    /// Removes `slot` if present.
    fn remove(&mut self, slot: u32, slots: usize) {
        match self {
            Holders::List(l) => {
                if let Some(i) = l.iter().position(|&s| s == slot) {
                    l.swap_remove(i);
                }
            }
            Holders::Bits { words, count } => {
                if bit(words, slot) {
                    words[slot as usize / 64] &= !(1 << (slot % 64));
                    *count -= 1;
                }
                if (*count as usize) < (slots / 128).max(16) {
                    let list = (0..words.len() as u32 * 64).filter(|&s| bit(words, s)).collect();
                    *self = Holders::List(list);
                }
            }
        }
    }

    /// `next` = the slots of `alive` that hold this block.
    fn intersect(&self, alive: &[u64], next: &mut [u64]) {
        match self {
            Holders::List(l) => {
                next.fill(0);
                for &s in l {
                    if bit(alive, s) {
                        next[s as usize / 64] |= 1 << (s % 64);
                    }
                }
            }
            Holders::Bits { words, .. } => {
                for (i, n) in next.iter_mut().enumerate() {
                    *n = alive[i] & words.get(i).copied().unwrap_or(0);
                }
            }
        }
    }
}

/// Warm prefix blocks of every worker slot.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    held: Vec<Held>,
    holders: HashMap<u64, Holders>,
}

impl PrefixIndex {
    fn slot(&mut self, slot: u32) -> &mut Held {
        let i = slot as usize;
        if self.held.len() <= i {
            self.held.resize_with(i + 1, Held::default);
        }
        &mut self.held[i]
    }

    fn add(holders: &mut HashMap<u64, Holders>, block: u64, slot: u32, slots: usize) {
        holders
            .entry(block)
            .or_insert_with(|| Holders::List(Vec::new()))
            .add(slot, slots);
    }

    fn drop_holder(holders: &mut HashMap<u64, Holders>, block: u64, slot: u32, slots: usize) {
        if let Some(h) = holders.get_mut(&block) {
            h.remove(slot, slots);
            if h.len() == 0 {
                holders.remove(&block);
            }
        }
    }

    /// Forgets everything about `slot` (its worker left; the slot may be reused).
    pub fn clear(&mut self, slot: u32) {
        let slots = self.held.len();
        let Some(h) = self.held.get_mut(slot as usize) else {
            return;
        };
        let held = std::mem::take(h);
        for b in held.blocks {
            Self::drop_holder(&mut self.holders, b, slot, slots);
        }
    }

    /// Applies a KV event; true when events were lost (a gap in `seq`), in which case
    /// nothing is applied. `seq` 1 starts over.
    pub fn event(&mut self, slot: u32, e: &KvEvent) -> bool {
        let seq = self.slot(slot).seq;
        if e.seq == 1 {
            self.clear(slot);
        } else if e.seq <= seq {
            return false; // a duplicate or a late one
        } else if e.seq != seq + 1 {
            return true;
        }
        let slots = self.held.len();
        let Self { held, holders } = self;
        let h = &mut held[slot as usize];
        for &b in &e.removed {
            if h.blocks.remove(&b) {
                Self::drop_holder(holders, b, slot, slots);
            }
        }
        for &b in &e.stored {
            if h.blocks.insert(b) {
                Self::add(holders, b, slot, slots);
            }
        }
        h.seq = e.seq;
        false
    }

    /// Replaces the slot's blocks with a snapshot, unless it is older than what the
    /// slot has applied.
    pub fn snapshot(&mut self, slot: u32, s: &KvSnapshot) {
        if s.seq < self.slot(slot).seq {
            return;
        }
        let slots = self.held.len();
        let Self { held, holders } = self;
        let h = &mut held[slot as usize];
        let new: HashSet<u64> = s.blocks.iter().copied().collect();
        for &b in h.blocks.difference(&new) {
            Self::drop_holder(holders, b, slot, slots);
        }
        for &b in new.difference(&h.blocks) {
            Self::add(holders, b, slot, slots);
        }
        h.blocks = new;
        h.seq = s.seq;
    }

    /// A request with prefix `blocks` was routed to `slot`.
    pub fn routed(&mut self, slot: u32, blocks: &[u64]) {
        let h = self.slot(slot);
        h.pending.clear();
        h.pending.extend_from_slice(blocks);
    }

    /// Blocks the slot holds.
    pub fn held(&self, slot: u32) -> usize {
        self.held.get(slot as usize).map_or(0, |h| h.blocks.len())
    }

    /// How many leading blocks of `blocks` the slot holds or was last routed.
    pub fn overlap(&self, slot: u32, blocks: &[u64]) -> usize {
        self.held.get(slot as usize).map_or(0, |h| {
            let held = switchyard_messages::kv::leading_overlap(blocks, |b| h.blocks.contains(&b));
            held.max(self.pending_overlap(slot, blocks))
        })
    }

    /// How many leading blocks of `blocks` the last request routed to the slot shared.
    pub fn pending_overlap(&self, slot: u32, blocks: &[u64]) -> usize {
        self.held
            .get(slot as usize)
            .map_or(0, |h| blocks.iter().zip(&h.pending).take_while(|(a, b)| a == b).count())
    }

    /// For every slot at once: how many leading blocks of `blocks` it holds, written
    /// to `depth[slot]` (which must start at 0; slots past its end are ignored). Walks
    /// the blocks once, keeping the set of slots that held every block so far: one
    /// lookup per block, then a word per 64 slots (or a step per holder, for a block
    /// few hold); a slot's depth is written once, when it drops out.
    pub fn depths(&self, blocks: &[u64], depth: &mut [u32]) {
        // The lookups first, up to the first block nobody holds: they do not depend on
        // one another, so their cache misses overlap instead of queueing behind each
        // step's intersection (on a 1,000-worker index the misses are most of the cost).
        let found: Vec<&Holders> = blocks.iter().map_while(|b| self.holders.get(b)).collect();
        let n = depth.len();
        let words = n.div_ceil(64);
        let mut alive = vec![!0u64; words];
        if !n.is_multiple_of(64) {
            alive[words - 1] = (1 << (n % 64)) - 1;
        }
        let mut next = vec![0u64; words];
        for i in 0..blocks.len() {
            match found.get(i) {
                Some(h) => h.intersect(&alive, &mut next),
                None => next.fill(0),
            }
            if i > 0 {
                for (w, (a, x)) in alive.iter().zip(&next).enumerate() {
                    let mut gone = a & !x;
                    while gone != 0 {
                        depth[w * 64 + gone.trailing_zeros() as usize] = i as u32;
                        gone &= gone - 1;
                    }
                }
            }
            std::mem::swap(&mut alive, &mut next);
            if alive.iter().all(|&w| w == 0) {
                return;
            }
        }
        for (w, &a) in alive.iter().enumerate() {
            let mut left = a;
            while left != 0 {
                depth[w * 64 + left.trailing_zeros() as usize] = blocks.len() as u32;
                left &= left - 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_messages::PROTOCOL_VERSION;

    fn ev(seq: u64, stored: &[u64], removed: &[u64]) -> KvEvent {
        KvEvent {
            v: PROTOCOL_VERSION,
            worker_id: "w".into(),
            seq,
            stored: stored.to_vec(),
            removed: removed.to_vec(),
            ..Default::default()
        }
    }

    #[test]
    fn both_directions_agree() {
        let mut p = PrefixIndex::default();
        p.event(0, &ev(1, &[1, 2, 3], &[]));
        p.event(2, &ev(1, &[1, 2], &[]));
        p.event(1, &ev(1, &[1, 9], &[]));
        let mut d = vec![0; 3];
        p.depths(&[1, 2, 3, 4], &mut d);
        assert_eq!(d, vec![3, 1, 2]);
        for slot in 0..3 {
            assert_eq!(p.overlap(slot, &[1, 2, 3, 4]), d[slot as usize] as usize);
        }
        // A snapshot replaces, a clear forgets, both in the block → holders map too.
        p.snapshot(
            0,
            &KvSnapshot {
                v: PROTOCOL_VERSION,
                worker_id: "w".into(),
                seq: 3,
                blocks: vec![1, 7],
                ..Default::default()
            },
        );
        p.clear(2);
        let mut d = vec![0; 3];
        p.depths(&[1, 2, 3], &mut d);
        assert_eq!(d, vec![1, 1, 0]);
        assert!(!p.holders.contains_key(&2));
        assert!(matches!(&p.holders[&7], Holders::List(l) if l == &[0]));
        assert_eq!(p.held(2), 0);
    }

    #[test]
    fn popular_blocks_switch_to_bitsets_and_back() {
        let mut p = PrefixIndex::default();
        // 200 slots: block 1 held by all, block 2 by the even ones, block 3 by slot 4.
        for s in 0..200u32 {
            let mut stored = vec![1];
            if s % 2 == 0 {
                stored.push(2);
            }
            if s == 4 {
                stored.push(3);
            }
            p.event(s, &ev(1, &stored, &[]));
        }
        assert!(matches!(p.holders[&1], Holders::Bits { count: 200, .. }));
        let mut d = vec![0; 200];
        p.depths(&[1, 2, 3, 9], &mut d);
        for (s, &depth) in d.iter().enumerate() {
            let want = if s == 4 {
                3
            } else if s % 2 == 0 {
                2
            } else {
                1
            };
            assert_eq!(depth, want, "slot {s}");
            assert_eq!(p.overlap(s as u32, &[1, 2, 3, 9]), want as usize);
        }
        for s in 0..190u32 {
            p.event(s, &ev(2, &[], &[1]));
        }
        assert!(matches!(&p.holders[&1], Holders::List(l) if l.len() == 10));
        let mut d = vec![0; 200];
        p.depths(&[1, 2], &mut d);
        assert_eq!(d.iter().filter(|&&x| x > 0).count(), 10);
        assert_eq!(d[190], 2);
        assert_eq!(d[191], 1);
    }
}
