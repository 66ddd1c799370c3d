//! The fleet queue: requests waiting at this coordinator for a worker with room —
//! plain data, tested without a runtime.
//!
//! A request no worker can take now waits here instead of being refused, until a
//! worker frees a slot (its heartbeat says so) or the request's time runs out. Per
//! model, `interactive` requests are served before `batch` ones; within a priority,
//! tenants take turns (round robin, one request per turn), so one tenant's burst does
//! not starve another's trickle. A request that a worker refused for want of room
//! goes back to the front ([`FleetQueue::push_front`]): it keeps its place.
//!
//! Bounded: at most `max_count` requests and `max_bytes` payload bytes wait; beyond
//! that [`FleetQueue::push`] refuses at once.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchyard_messages::{Priority, QueueView};

/// A waiting request: what the queue needs to order it. The request itself stays
/// with the task that received it.
#[derive(Debug, Clone)]
pub struct Ticket {
    /// Unique per coordinator.
    pub id: u64,
    /// The request's id and reply inbox (a cancel names both).
    pub request_id: String,
    pub inbox: String,
    pub model: String,
    pub tenant: String,
    pub priority: Priority,
    /// Payload bytes.
    pub bytes: u64,
    /// When it first arrived (a requeued ticket keeps it).
    pub since: Instant,
}

/// Why [`FleetQueue::push`] refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Full {
    /// `max_count` requests wait already.
    Count(usize),
    /// Its bytes would pass `max_bytes`.
    Bytes(u64),
}

/// One priority of one model: tenants in turn order, each with its requests.
#[derive(Debug, Default)]
struct Ring {
    tenants: VecDeque<(String, VecDeque<Ticket>)>,
}

impl Ring {
    fn tenant(&mut self, tenant: &str) -> Option<&mut VecDeque<Ticket>> {
        self.tenants.iter_mut().find(|(t, _)| t == tenant).map(|(_, q)| q)
    }

    fn push(&mut self, t: Ticket) {
        match self.tenant(&t.tenant) {
            Some(q) => q.push_back(t),
            None => self.tenants.push_back((t.tenant.clone(), VecDeque::from([t]))),
        }
    }

    /// Back at the front of its tenant's requests, and that tenant's turn next.
    fn push_front(&mut self, t: Ticket) {
        match self.tenants.iter().position(|(name, _)| *name == t.tenant) {
            Some(i) => {
                let mut entry = self.tenants.remove(i).expect("position is in range");
                entry.1.push_front(t);
                self.tenants.push_front(entry);
            }
            None => self.tenants.push_front((t.tenant.clone(), VecDeque::from([t]))),
        }
    }

    fn head(&self) -> Option<&Ticket> {
        self.tenants.front().and_then(|(_, q)| q.front())
    }

    /// Takes the head; its tenant's turn ends (to the back of the ring).
    fn pop(&mut self) -> Option<Ticket> {
        let (tenant, mut q) = self.tenants.pop_front()?;
        let t = q.pop_front();
        if !q.is_empty() {
            self.tenants.push_back((tenant, q));
        }
        t
    }

    fn remove(&mut self, id: u64) -> Option<Ticket> {
        let (ti, qi) = self
            .tenants
            .iter()
            .enumerate()
            .find_map(|(ti, (_, q))| q.iter().position(|t| t.id == id).map(|qi| (ti, qi)))?;
        let t = self.tenants[ti].1.remove(qi);
        if self.tenants[ti].1.is_empty() {
            self.tenants.remove(ti);
        }
        t
    }

    fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }
}

/// The waiting requests of one model, by priority.
#[derive(Debug, Default)]
struct ModelQueue {
    rings: [Ring; 2],
    /// When recent requests left for a worker: the drain rate behind `Retry-After`.
    granted: VecDeque<Instant>,
}

fn rank(p: Priority) -> usize {
    match p {
        Priority::Interactive => 0,
        Priority::Batch => 1,
    }
}

/// Grants remembered per model for the drain rate.
const RATE_WINDOW: usize = 32;

/// Waiting count per (model, priority, tenant): what the queue-depth gauge reads.
pub type Depths = Arc<Mutex<HashMap<(String, Priority, String), u64>>>;

/// Requests waiting for a worker with room.
#[derive(Debug)]
pub struct FleetQueue {
    models: BTreeMap<String, ModelQueue>,
    count: usize,
    bytes: u64,
    max_count: usize,
    max_bytes: u64,
    depths: Depths,
}

impl FleetQueue {
    /// A queue holding at most `max_count` requests and `max_bytes` payload bytes.
    pub fn new(max_count: usize, max_bytes: u64) -> Self {
        Self {
            models: BTreeMap::new(),
            count: 0,
            bytes: 0,
            max_count,
            max_bytes,
            depths: Depths::default(),
        }
    }

    /// The waiting counts, shared (for a gauge).
    pub fn depths(&self) -> Depths {
        self.depths.clone()
    }

    fn count_in(&mut self, t: &Ticket, delta: i64) {
        self.count = (self.count as i64 + delta) as usize;
        self.bytes = (self.bytes as i64 + delta * t.bytes as i64) as u64;
        let mut d = self.depths.lock().unwrap_or_else(|e| e.into_inner());
        let key = (t.model.clone(), t.priority, t.tenant.clone());
        let n = d.entry(key.clone()).or_default();
        // Kept at 0, so the gauge reports the queue emptied.
        *n = (*n as i64 + delta).max(0) as u64;
    }

    /// Queues `t` behind the requests of its model, priority and tenant, or refuses
    /// it when the queue is full.
    pub fn push(&mut self, t: Ticket) -> Result<(), Full> {
        if self.count >= self.max_count {
            return Err(Full::Count(self.count));
        }
        if self.bytes + t.bytes > self.max_bytes {
            return Err(Full::Bytes(self.bytes));
        }
        self.count_in(&t, 1);
        let p = rank(t.priority);
        self.models.entry(t.model.clone()).or_default().rings[p].push(t);
        Ok(())
    }

    /// Puts back a request that was taken but found no room: first in line again
    /// (it may exceed the bounds by this one: it was counted before).
    pub fn push_front(&mut self, t: Ticket) {
        self.count_in(&t, 1);
        let p = rank(t.priority);
        self.models.entry(t.model.clone()).or_default().rings[p].push_front(t);
    }

    /// Models with requests waiting.
    pub fn models(&self) -> Vec<String> {
        self.models.keys().cloned().collect()
    }

    /// The request of `model` to serve next: the highest priority, the tenant whose
    /// turn it is, its oldest request.
    pub fn head(&self, model: &str) -> Option<&Ticket> {
        self.models.get(model)?.rings.iter().find_map(Ring::head)
    }

    /// Takes [`Self::head`] of `model`.
    pub fn pop(&mut self, model: &str) -> Option<Ticket> {
        let m = self.models.get_mut(model)?;
        let t = m.rings.iter_mut().find(|r| !r.is_empty())?.pop()?;
        self.count_in(&t, -1);
        Some(t)
    }

    /// A request of `model` left for a worker at `now` (queued or not): the drain rate.
    pub fn granted(&mut self, model: &str, now: Instant) {
        let g = &mut self.models.entry(model.to_string()).or_default().granted;
        g.push_back(now);
        if g.len() > RATE_WINDOW {
            g.pop_front();
        }
    }

    /// Removes a waiting request (its time ran out, or it was cancelled).
    pub fn remove(&mut self, id: u64) -> Option<Ticket> {
        let t = self
            .models
            .values_mut()
            .find_map(|m| m.rings.iter_mut().find_map(|r| r.remove(id)))?;
        self.count_in(&t, -1);
        Some(t)
    }

    /// The waiting request answered on `inbox` for `request_id`.
    pub fn find(&self, request_id: &str, inbox: &str) -> Option<u64> {
        self.models
            .values()
            .find_map(|m| {
                m.rings.iter().find_map(|r| {
                    r.tenants
                        .iter()
                        .find_map(|(_, q)| q.iter().find(|t| t.request_id == request_id && t.inbox == inbox))
                })
            })
            .map(|t| t.id)
    }

    /// Requests waiting, and their bytes.
    pub fn len(&self) -> (usize, u64) {
        (self.count, self.bytes)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Requests of `model` served per second lately (`None` before two).
    pub fn drain_rate(&self, model: &str, now: Instant) -> Option<f64> {
        let g = &self.models.get(model)?.granted;
        let first = *g.front()?;
        let span = now.duration_since(first).as_secs_f64();
        (g.len() >= 2 && span > 0.0).then(|| (g.len() - 1) as f64 / span)
    }

    /// A suggested wait before sending a request for `model` again: the time the
    /// requests waiting for it take to drain at the measured rate (1 s when unknown),
    /// within [100 ms, 60 s].
    pub fn retry_after(&self, model: &str, now: Instant) -> Duration {
        let waiting = self.models.get(model).map_or(0, |m| {
            m.rings
                .iter()
                .flat_map(|r| r.tenants.iter())
                .map(|(_, q)| q.len())
                .sum::<usize>()
        });
        let ms = match self.drain_rate(model, now) {
            Some(rate) => (waiting.max(1) as f64 / rate * 1000.0) as u64,
            None => 1_000,
        };
        Duration::from_millis(ms.clamp(100, 60_000))
    }

    /// What waits, by model, priority and tenant (for `status`).
    pub fn views(&self, now: Instant) -> Vec<QueueView> {
        let mut out = Vec::new();
        for (model, m) in &self.models {
            for (p, ring) in Priority::ALL.into_iter().zip(&m.rings) {
                for (tenant, q) in &ring.tenants {
                    out.push(QueueView {
                        model: model.clone(),
                        priority: p,
                        tenant: tenant.clone(),
                        waiting: q.len() as u32,
                        bytes: q.iter().map(|t| t.bytes).sum(),
                        oldest_ms: q
                            .iter()
                            .map(|t| now.duration_since(t.since).as_millis() as u64)
                            .max()
                            .unwrap_or(0),
                    });
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(id: u64, tenant: &str, priority: Priority) -> Ticket {
        Ticket {
            id,
            request_id: format!("r{id}"),
            inbox: format!("_INBOX.{id}"),
            model: "m".into(),
            tenant: tenant.into(),
            priority,
            bytes: 10,
            since: Instant::now(),
        }
    }

    fn drain(q: &mut FleetQueue) -> Vec<u64> {
        std::iter::from_fn(|| q.pop("m").map(|t| t.id)).collect()
    }

    #[test]
    fn tenants_take_turns_whatever_their_backlog() {
        let mut q = FleetQueue::new(100, 10_000);
        for id in 0..6 {
            q.push(ticket(id, "a", Priority::Interactive)).unwrap();
        }
        q.push(ticket(10, "b", Priority::Interactive)).unwrap();
        q.push(ticket(11, "b", Priority::Interactive)).unwrap();
        assert_eq!(drain(&mut q), vec![0, 10, 1, 11, 2, 3, 4, 5]);
        assert!(q.is_empty());
        assert_eq!(q.len(), (0, 0));
    }

    #[test]
    fn interactive_goes_before_batch_that_waited_longer() {
        let mut q = FleetQueue::new(100, 10_000);
        for id in 0..3 {
            q.push(ticket(id, "a", Priority::Batch)).unwrap();
        }
        q.push(ticket(7, "b", Priority::Interactive)).unwrap();
        assert_eq!(q.head("m").map(|t| t.id), Some(7));
        assert_eq!(drain(&mut q), vec![7, 0, 1, 2]);
    }

    #[test]
    fn a_requeued_request_keeps_its_place() {
        let mut q = FleetQueue::new(100, 10_000);
        for (id, tenant) in [(0, "a"), (1, "b"), (2, "a")] {
            q.push(ticket(id, tenant, Priority::Interactive)).unwrap();
        }
        let first = q.pop("m").unwrap();
        q.push_front(first);
        assert_eq!(drain(&mut q), vec![0, 1, 2]);
    }

    #[test]
    fn bounded_by_count_and_bytes() {
        let mut q = FleetQueue::new(2, 25);
        q.push(ticket(0, "a", Priority::Interactive)).unwrap();
        q.push(ticket(1, "a", Priority::Interactive)).unwrap();
        assert_eq!(q.push(ticket(2, "a", Priority::Interactive)), Err(Full::Count(2)));
        let mut q = FleetQueue::new(10, 25);
        q.push(ticket(0, "a", Priority::Interactive)).unwrap();
        q.push(ticket(1, "a", Priority::Interactive)).unwrap();
        assert_eq!(q.push(ticket(2, "b", Priority::Interactive)), Err(Full::Bytes(20)));
    }

    #[test]
    fn removed_and_cancelled_requests_leave_no_trace() {
        let mut q = FleetQueue::new(100, 10_000);
        for id in 0..4 {
            q.push(ticket(id, if id % 2 == 0 { "a" } else { "b" }, Priority::Interactive))
                .unwrap();
        }
        assert_eq!(q.find("r3", "_INBOX.3"), Some(3));
        assert_eq!(
            q.find("r3", "_INBOX.other"),
            None,
            "a cancel names the requester's inbox"
        );
        assert_eq!(q.remove(3).map(|t| t.id), Some(3));
        assert_eq!(q.remove(1).map(|t| t.id), Some(1));
        assert!(q.remove(1).is_none());
        assert_eq!(q.len(), (2, 20));
        assert_eq!(q.views(Instant::now()).len(), 1, "tenant b's ring entry is gone");
        let depths = q.depths();
        let d = depths.lock().unwrap();
        assert_eq!(
            d.get(&("m".to_string(), Priority::Interactive, "b".to_string())),
            Some(&0)
        );
        assert_eq!(
            d.get(&("m".to_string(), Priority::Interactive, "a".to_string())),
            Some(&2)
        );
        drop(d);
        assert_eq!(drain(&mut q), vec![0, 2]);
    }

    #[test]
    fn retry_after_follows_the_drain_rate() {
        let mut q = FleetQueue::new(100, 10_000);
        let t0 = Instant::now();
        for id in 0..11 {
            q.push(ticket(id, "a", Priority::Interactive)).unwrap();
        }
        assert_eq!(q.retry_after("m", t0), Duration::from_secs(1), "unknown rate");
        // One request every 100 ms: 10 per second.
        for i in 0..5 {
            q.pop("m").unwrap();
            q.granted("m", t0 + Duration::from_millis(100 * i));
        }
        let rate = q.drain_rate("m", t0 + Duration::from_millis(400)).unwrap();
        assert!((rate - 10.0).abs() < 1e-6, "{rate}");
        // Six wait: 0.6 s.
        assert_eq!(
            q.retry_after("m", t0 + Duration::from_millis(400)),
            Duration::from_millis(600)
        );
    }
}
