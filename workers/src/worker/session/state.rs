//! One session's state and what its calls do to it (seed 002): the resident prefix,
//! the fence checks, `ensure_prefix`, `prefill_suffix`, `explain`. Owned by its
//! SessionActor ([`super::actor`]); nothing here is shared but [`Stale`].

use crate::worker::context::ServeContext;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use switchyard_backend::{BackendError, ModelSession};
use switchyard_messages::session::{
    hex, token_hash, ContextManifest, ContextReport, PrefixStatus, SegmentRequest, SessionModelInfo, SuffixStatus,
};
use switchyard_messages::{kv::fnv1a, ErrorCode, WireError};

/// A worker's sessions: the owner of the latest open, and each live session.
#[derive(Default)]
pub(super) struct HostState {
    pub(super) owner: Option<String>,
    pub(super) sessions: HashMap<String, Entry>,
}

/// A live session as the host sees it.
pub(super) struct Entry {
    pub(super) owner: String,
    pub(super) stale: Arc<Stale>,
    /// Its slot, closed by the host when the session's actor fails.
    pub(super) backend: Arc<dyn ModelSession>,
    /// Its actor, once started.
    pub(super) actor: Option<ractor::ActorCell>,
}

/// What a session shares with the host and its NATS forwarder.
#[derive(Default)]
pub(super) struct Stale {
    /// A newer owner took over: give the slot back.
    pub(super) flag: AtomicBool,
    /// Wakes the forwarder when `flag` is set.
    pub(super) wake: tokio::sync::Notify,
    /// The session is closed (its slot given back); it is forgotten after the next
    /// idle period.
    pub(super) closed: AtomicBool,
    /// Fault injection (supervision tests): panic while handling the next call.
    pub(super) panic_next: AtomicBool,
}

impl Stale {
    pub(super) fn load(&self, order: Ordering) -> bool {
        self.flag.load(order)
    }
}

/// What one session's actor owns.
pub(super) struct Session {
    pub(super) id: String,
    pub(super) owner: String,
    pub(super) backend: Arc<dyn ModelSession>,
    pub(super) num_ctx: u32,
    pub(super) bos: bool,
    pub(super) stale: Arc<Stale>,
    pub(super) closed: bool,
    /// The resident prefix and the manifest it was computed under.
    pub(super) prefix: Option<Prefix>,
    /// (1.13) The worker it moved to while this one drained: calls that still reach
    /// it here are passed on there.
    pub(super) moved_to: Option<String>,
}

pub(super) struct Prefix {
    pub(super) tokens: Vec<u32>,
    pub(super) manifest: ContextManifest,
    pub(super) digest: String,
    pub(super) byte_hash: String,
}

pub(super) fn err(code: ErrorCode, message: impl Into<String>) -> WireError {
    WireError::new(code, message)
}

pub(super) fn wire(e: BackendError) -> WireError {
    e.to_wire()
}

/// What this worker reports about its model (seed 002 `Describe`).
pub(super) fn describe(ctx: &ServeContext) -> SessionModelInfo {
    let mem = ctx.model.memory();
    let info = ctx.model.info();
    let free = switchyard_fabric::host::available_memory();
    let ceiling = if mem.model_max_context > 0 {
        mem.model_max_context
    } else {
        info.context_len
    };
    let fits = match mem.kv_bytes_per_token {
        0 => u32::MAX,
        b => (free.saturating_sub(mem.kv_fixed_bytes) / b).min(u64::from(u32::MAX)) as u32,
    };
    SessionModelInfo {
        model_max_context: ceiling,
        effective_context: ceiling.min(info.context_len).min(fits),
        kv_bytes_per_token: mem.kv_bytes_per_token,
        free_bytes: free,
        weights_bytes: mem.weights_bytes,
    }
}

impl Session {
    /// The session is usable by `fence`: its owner's, not superseded, not closed.
    pub(super) fn check(&self, fence: &str) -> Result<(), WireError> {
        self.check_owner(fence)?;
        if self.stale.load(Ordering::Acquire) {
            return Err(err(
                ErrorCode::StaleFence,
                format!(
                    "session {}: its owner {:?} was superseded by a newer open",
                    self.id, self.owner
                ),
            ));
        }
        if self.closed {
            return Err(err(ErrorCode::SessionClosed, format!("session {} is closed", self.id)));
        }
        Ok(())
    }

    pub(super) fn check_owner(&self, fence: &str) -> Result<(), WireError> {
        if fence.is_empty() {
            return Err(err(
                ErrorCode::NotOwner,
                format!(
                    "session {}: the call carries no fence; its owner's is required",
                    self.id
                ),
            ));
        }
        if fence != self.owner {
            return Err(err(
                ErrorCode::NotOwner,
                format!("session {} belongs to {:?}, not {fence:?}", self.id, self.owner),
            ));
        }
        Ok(())
    }

    pub(super) fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            self.stale.closed.store(true, Ordering::Release);
            self.backend.close();
        }
    }

    pub(super) fn overflow(&self, tokens: usize) -> Result<(), WireError> {
        if tokens > self.num_ctx as usize {
            return Err(BackendError::ContextOverflow {
                prompt_tokens: tokens,
                max_tokens: 0,
                context_len: self.num_ctx as usize,
            }
            .to_wire());
        }
        Ok(())
    }

    pub(super) async fn ensure_prefix(&mut self, req: SegmentRequest) -> Result<PrefixStatus, WireError> {
        let digest = req.manifest.digest();
        let bos = self.bos && !req.manifest.disable_bos;
        let tokens = self.backend.tokenize(req.text.clone(), bos).await.map_err(wire)?;
        self.overflow(tokens.len())?;
        // Reuse only under the same manifest: byte-identical text under another
        // profile, template, tokenizer or runtime starts over.
        let invalidate = self.prefix.as_ref().is_none_or(|p| p.digest != digest);
        let update = self
            .backend
            .set_resident(tokens.clone(), invalidate)
            .await
            .map_err(wire)?;
        let byte_hash = hex(fnv1a(req.text.as_bytes()));
        let status = PrefixStatus {
            reused_tokens: update.reused,
            prefilled_tokens: update.computed,
            dropped_tokens: update.dropped,
            prefix_tokens: tokens.len() as u32,
            resident_tokens: tokens.len() as u32,
            available_tokens: self.num_ctx - tokens.len() as u32,
            stable_byte_hash: byte_hash.clone(),
            stable_token_hash: token_hash(&tokens),
            manifest_digest: digest.clone(),
        };
        self.prefix = Some(Prefix {
            tokens,
            manifest: req.manifest,
            digest,
            byte_hash,
        });
        Ok(status)
    }

    pub(super) async fn prefill_suffix(&mut self, req: SegmentRequest) -> Result<SuffixStatus, WireError> {
        let prefix = self
            .prefix
            .as_ref()
            .ok_or_else(|| err(ErrorCode::BadRequest, "nothing resident: call ensure_prefix first"))?;
        let digest = req.manifest.digest();
        if digest != prefix.digest {
            return Err(err(
                ErrorCode::BadRequest,
                format!(
                    "the suffix's manifest ({digest}) is not the resident prefix's ({}); call ensure_prefix with it first",
                    prefix.digest
                ),
            ));
        }
        let suffix = self.backend.tokenize(req.text.clone(), false).await.map_err(wire)?;
        let mut target = prefix.tokens.clone();
        let prefix_len = target.len() as u32;
        target.extend_from_slice(&suffix);
        self.overflow(target.len())?;
        let update = self.backend.set_resident(target.clone(), false).await.map_err(wire)?;
        Ok(SuffixStatus {
            suffix_tokens: suffix.len() as u32,
            reused_tokens: update.reused.saturating_sub(prefix_len),
            prefilled_tokens: update.computed,
            dropped_tokens: update.dropped,
            resident_tokens: target.len() as u32,
            available_tokens: self.num_ctx - target.len() as u32,
            volatile_byte_hash: hex(fnv1a(req.text.as_bytes())),
        })
    }

    pub(super) async fn report(&self) -> ContextReport {
        let resident = if self.closed {
            0
        } else {
            self.backend.resident().await.map(|r| r.len() as u32).unwrap_or(0)
        };
        let (prefix_tokens, byte_hash, tok_hash, digest, manifest) = match &self.prefix {
            Some(p) => (
                p.tokens.len() as u32,
                p.byte_hash.clone(),
                token_hash(&p.tokens),
                p.digest.clone(),
                p.manifest.clone(),
            ),
            None => Default::default(),
        };
        ContextReport {
            resident_tokens: resident,
            prefix_tokens,
            num_ctx: self.num_ctx,
            available_tokens: self.num_ctx.saturating_sub(resident),
            stable_byte_hash: byte_hash,
            stable_token_hash: tok_hash,
            manifest_digest: digest,
            manifest,
            closed: self.closed,
        }
    }
}
