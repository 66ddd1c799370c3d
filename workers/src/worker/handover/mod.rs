//! Live hand-over of a draining worker's streams (protocol 1.12).
//!
//! When a worker drains (SIGTERM) its running streams need not wait for their last
//! token here, nor be computed again elsewhere: each one stops at a token boundary,
//! what it generated reaches the client, and the worker relays the rest of the
//! request — its tokens so far as `resume_tokens`, the sampler's position, the
//! client's inbox and the next chunk's `seq` — to a coordinator, which places it on
//! another worker like any request. That worker pulls the KV of the prompt and the
//! tokens so far from this one (`Sy-Kv-Peer`, [`super::kv_transfer`]) and streams on
//! to the same inbox: the client reads one stream, numbered without a gap, the same
//! tokens as an undisturbed run (greedy and seeded), with `handovers` in its final
//! metrics. This worker stays up until the taker has pulled (bounded), so its KV is
//! still there to read.
//!
//! When no worker takes the stream (none has room, none other serves the model, no
//! coordinator answers in time) it goes on here as before and finishes within the
//! drain's grace. Streams of requests that offered tools are not handed over (their
//! call text is held back here), nor are those of backends that cannot export KV or
//! resume a stream.

pub mod relay;

pub use relay::{relay, signal, taken};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use switchyard_backend::{GenerateEvent, Prompt};
use switchyard_fabric::ChunkSink;
use switchyard_messages::{GenerateRequest, Token};
use tokio::sync::watch;

/// The taker's first pull comes right after it admits the stream; one that has not
/// come by then never will (it decided to compute, or it failed).
const FIRST_PULL_WITHIN: Duration = Duration::from_secs(3);
/// A pull whose chunks have stopped this long is over (the puller's own limit per
/// chunk is 1 s).
const PULL_QUIET: Duration = Duration::from_millis(1500);
/// The longest a handed-over stream keeps its KV waiting for pulls.
const PULL_CAP: Duration = Duration::from_secs(60);

/// What a worker knows of hand-overs: whether it is handing its streams over now,
/// and the streams handed over whose KV a taker may still be pulling.
pub struct Handover {
    enabled: bool,
    begun: watch::Sender<bool>,
    /// Request id → when a pull for it was last served (`None`: not yet).
    pulls: Mutex<HashMap<String, Option<Instant>>>,
}

impl Handover {
    /// Hand-overs on (`worker.handover`) or off.
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            begun: watch::channel(false).0,
            pulls: Mutex::default(),
        }
    }

    /// Whether streams and sessions move on drain (`worker.handover`).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The worker drains: running streams hand themselves over now.
    pub fn begin(&self) {
        if self.enabled {
            self.begun.send_replace(true);
        }
    }

    /// A peer pulled KV for `request_id` (the source's side).
    pub fn served(&self, request_id: &str) {
        let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(last) = pulls.get_mut(request_id) {
            *last = Some(Instant::now());
        }
    }

    /// A peer is about to pull KV for `request_id` (a stream handed over, a prompt
    /// prefilled for a decode worker): [`Self::await_pulls`] waits for it.
    pub(crate) fn expect(&self, request_id: &str) {
        let mut pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
        pulls.insert(request_id.to_string(), None);
    }

    pub(crate) fn forget(&self, request_id: &str) -> Option<Option<Instant>> {
        self.pulls.lock().unwrap_or_else(|p| p.into_inner()).remove(request_id)
    }

    fn last_pull(&self, request_id: &str) -> Option<Instant> {
        let pulls = self.pulls.lock().unwrap_or_else(|p| p.into_inner());
        pulls.get(request_id).copied().flatten()
    }

    /// Waits until the taker of `request_id` has pulled its KV (its pulls went
    /// quiet), or it did not pull at all.
    pub(crate) async fn await_pulls(&self, request_id: &str) {
        let since = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let over = match self.last_pull(request_id) {
                None => since.elapsed() >= FIRST_PULL_WITHIN,
                Some(last) => last.elapsed() >= PULL_QUIET,
            };
            if over || since.elapsed() >= PULL_CAP {
                self.forget(request_id);
                return;
            }
        }
    }
}

/// Resolves once the worker hands its streams over (never without `signal`).
pub async fn begun(signal: &mut Option<watch::Receiver<bool>>) {
    if let Some(rx) = signal {
        if rx.wait_for(|b| *b).await.is_ok() {
            return;
        }
    }
    std::future::pending().await
}

/// How a stream's pump ended.
pub enum Pumped {
    /// Its last chunk went out (done, failed or cancelled).
    Ended,
    /// It stopped to be handed over: every token it generated (these) reached the
    /// client; nothing final was sent.
    HandOver(Vec<u32>),
}

/// Stops a generation to hand it over: cancels it, sends the client every token it
/// produced meanwhile (`out` then the rest, through `filters`: text they hold stays
/// there, and a continuation elsewhere holds it again from the tokens) and returns
/// them all (`emitted` first). A generation that ended anyway meanwhile ends as it
/// would have.
pub async fn stop(
    sink: &ChunkSink,
    events: &mut switchyard_backend::GenerateStream,
    cancel: &switchyard_backend::CancelFlag,
    mut held: Vec<Token>,
    mut emitted: Vec<u32>,
    filters: &mut crate::worker::reasoning::Filters,
) -> Pumped {
    use futures::StreamExt;
    cancel.cancel();
    loop {
        match events.next().await {
            Some(Ok(GenerateEvent::Token(t))) => {
                emitted.push(t.id);
                held.extend(filters.push(t));
            }
            Some(Ok(GenerateEvent::Done { finish_reason, metrics }))
                if finish_reason != switchyard_messages::FinishReason::Cancelled =>
            {
                held.extend(filters.finish().0);
                sink.finish(held, finish_reason, metrics, Vec::new()).await;
                return Pumped::Ended;
            }
            Some(Err(e)) => {
                if !held.is_empty() {
                    sink.tokens(held).await;
                }
                sink.error(e.to_wire()).await;
                return Pumped::Ended;
            }
            Some(Ok(GenerateEvent::Done { .. })) | None => break,
        }
    }
    if !held.is_empty() && !sink.tokens(held).await {
        // The client cannot be reached: there is no stream left to hand over.
        return Pumped::Ended;
    }
    Pumped::HandOver(emitted)
}

/// A stream's request with `emitted` more tokens generated: what continues it.
pub fn continued(req: &GenerateRequest, emitted: &[u32]) -> Option<GenerateRequest> {
    let n = emitted.len() as u32;
    let mut next = req.clone();
    next.config.max_tokens = req.config.max_tokens.checked_sub(n).filter(|&m| m > 0)?;
    if next.config.temperature > 0.0 {
        next.config.rng_position += u64::from(n);
    }
    next.resume_tokens.extend_from_slice(emitted);
    Some(next)
}

/// The prompt a continuation computes: `prompt` (a resumed one's own prompt) then
/// every token generated so far.
pub fn continued_prompt(prompt: &Prompt, next: &GenerateRequest) -> Prompt {
    let base = match prompt {
        Prompt::Continue { prompt, .. } => prompt.clone(),
        other => Box::new(other.clone()),
    };
    Prompt::Continue {
        prompt: base,
        generated: next.resume_tokens.clone(),
    }
}
