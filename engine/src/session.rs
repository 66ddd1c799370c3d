//! A session on the CPU engine: one pinned KV slot, driven through the compute
//! thread's job channel (so its prefills and decodes interleave with other requests'
//! decode steps, and its decode joins the continuous batch).

use super::compute::{common_prefix, ComputeState, Job, SessionOp};
use super::model::forward::SeqStep;
use super::text::tokenizer::GgufTokenizer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use switchyard_backend::{
    BackendError, BackendFuture, CancelFlag, GenerateStream, ModelSession, Prompt, ResidentUpdate,
};
use switchyard_messages::GenerateConfig;

/// The engine's side of one session.
pub struct CpuSession {
    pub(super) jobs: Mutex<mpsc::Sender<Job>>,
    pub(super) slot: usize,
    pub(super) tokenizer: Arc<GgufTokenizer>,
    pub(super) closed: AtomicBool,
}

fn stopped() -> BackendError {
    BackendError::Unavailable("the compute thread has stopped".into())
}

impl CpuSession {
    fn send(&self, job: Job) -> Result<(), BackendError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(BackendError::Invalid("the session is closed".into()));
        }
        self.jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(job)
            .map_err(|_| stopped())
    }

    /// Sends an op built around a reply channel and awaits the answer.
    fn ask<T: Send + 'static>(
        &self,
        op: impl FnOnce(tokio::sync::oneshot::Sender<T>) -> SessionOp,
    ) -> BackendFuture<T> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self.send(Job::Session(op(reply)));
        Box::pin(async move {
            sent?;
            answer.await.map_err(|_| stopped())
        })
    }
}

impl ModelSession for CpuSession {
    fn tokenize(&self, text: String, bos: bool) -> BackendFuture<Vec<u32>> {
        let result = self.tokenizer.encode_segment(&text, bos).map_err(BackendError::Invalid);
        Box::pin(async move { result })
    }

    fn set_resident(&self, target: Vec<u32>, invalidate: bool) -> BackendFuture<ResidentUpdate> {
        let slot = self.slot;
        let answer = self.ask(move |reply| SessionOp::Set {
            slot,
            target,
            invalidate,
            reply,
        });
        Box::pin(async move { answer.await? })
    }

    fn decode(&self, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        let (tx, rx) = GenerateStream::channel();
        let job = super::compute::GenerateJob {
            adapter: None,
            prompt: Prompt::Tokens(Vec::new()),
            config,
            cancel,
            deadline_ms: None,
            enqueued: Instant::now(),
            events: tx.clone(),
            session_slot: Some(self.slot),
        };
        if let Err(e) = self.send(Job::Generate(Box::new(job))) {
            let _ = tx.send(Err(e));
        }
        drop(tx);
        rx
    }

    fn resident(&self) -> BackendFuture<Vec<u32>> {
        let slot = self.slot;
        self.ask(move |reply| SessionOp::Resident { slot, reply })
    }

    fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self
                .jobs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .send(Job::Session(SessionOp::Close { slot: self.slot }));
        }
    }
}

impl Drop for CpuSession {
    fn drop(&mut self) {
        self.close();
    }
}

impl ComputeState {
    /// Pins a free slot for a session, the least recently used, emptied; `None` when
    /// that would leave no unpinned slot for ordinary requests.
    pub fn pin(&mut self) -> Option<usize> {
        let unpinned = self.slots.iter().filter(|s| !s.pinned).count();
        if unpinned < 2 {
            return None;
        }
        let slot = (0..self.slots.len())
            .filter(|&i| !self.slots[i].busy && !self.slots[i].pinned)
            .min_by_key(|&i| self.slots[i].last_used)?;
        // A session starts empty: what earlier requests left in the slot is theirs
        // (its blocks may still sit in the store, keyed by hash, not by owner).
        self.use_adapter(slot, None);
        self.slots[slot].pinned = true;
        self.slots[slot].resident.clear();
        self.slots[slot].map = None;
        Some(slot)
    }

    /// Makes pinned `slot`'s resident tokens equal `target`, keeping the longest
    /// resident prefix unless `invalidate`, and computing the rest.
    pub fn set_resident(
        &mut self,
        slot: usize,
        target: &[u32],
        invalidate: bool,
    ) -> Result<ResidentUpdate, BackendError> {
        let s = self
            .slots
            .get(slot)
            .filter(|s| s.pinned)
            .ok_or_else(|| BackendError::Invalid(format!("slot {slot} is not a session's")))?;
        if s.busy {
            return Err(BackendError::Invalid("the session is decoding".into()));
        }
        if target.len() > self.context_len {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: target.len(),
                max_tokens: 0,
                context_len: self.context_len,
            });
        }
        let had = s.resident.len();
        let kept = if invalidate || !self.model.reuses_prefix() {
            0
        } else {
            let shared = common_prefix(&s.resident, target);
            if shared < target.len() {
                self.model.resumable(slot, shared)
            } else {
                // Nothing to compute, but the session's decode runs the last token
                // again: the model must be able to resume there.
                let last = shared.saturating_sub(1);
                match self.model.resumable(slot, last) {
                    q if q == last => shared,
                    q => q,
                }
            }
        };
        // Stored blocks may extend what the slot kept (not across a new manifest).
        let keep = if invalidate {
            0
        } else {
            self.restore(slot, target, kept)
        };
        if keep < target.len() {
            self.forward(&[SeqStep::new(slot, &target[keep..], keep)])?;
        } else {
            self.slots[slot].resident.truncate(keep);
        }
        Ok(ResidentUpdate {
            reused: keep as u32,
            computed: (target.len() - keep) as u32,
            dropped: (had - kept) as u32,
        })
    }

    /// Answers a session's call on its pinned slot (between decode steps).
    pub fn session_op(&mut self, op: SessionOp) {
        match op {
            SessionOp::Open { reply } => {
                let _ = reply.send(self.pin());
            }
            SessionOp::Set {
                slot,
                target,
                invalidate,
                reply,
            } => {
                let _ = reply.send(self.set_resident(slot, &target, invalidate));
            }
            SessionOp::Resident { slot, reply } => {
                let tokens = self.slots.get(slot).map(|s| s.resident.clone());
                let _ = reply.send(tokens.unwrap_or_default());
            }
            SessionOp::Close { slot } => {
                if let Some(s) = self.slots.get_mut(slot) {
                    s.pinned = false;
                }
            }
        }
    }
}
