//! A session on the CPU engine: one pinned KV slot, driven through the compute
//! thread's job channel (so its prefills and decodes interleave with other requests'
//! decode steps, and its decode joins the continuous batch).

use super::compute::{ComputeState, Job, SessionOp};
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
            prompt: Prompt::Tokens(Vec::new()),
            config,
            cancel,
            deadline_ms: None,
            enqueued: Instant::now(),
            events: tx.clone(),
            session_slot: Some(self.slot),
        };
        if let Err(e) = self.send(Job::Generate(job)) {
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
