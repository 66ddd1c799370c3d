//! A session on a llama.cpp server: one pinned server slot (`id_slot`) with
//! `cache_prompt`, so the server keeps the session's tokens in that slot's KV and
//! reports what it reused (`cache_n`). We track the resident tokens ourselves: what
//! the last prefill sent plus what decode generated.
//!
//! Ordinary requests carry no `id_slot`, and llama-server may still place one on a
//! session's idle slot (it picks slots by prompt similarity); the session then pays
//! a re-prefill, which its next status reports honestly (`reused_tokens` from
//! `cache_n`).

use crate::backends::llama_cpp::LlamaCppModel;
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use switchyard_backend::{
    BackendError, BackendFuture, CancelFlag, GenerateEvent, GenerateStream, ModelSession, Prompt, ResidentUpdate,
};
use switchyard_messages::GenerateConfig;

/// One session's slot on a llama.cpp server.
pub struct LlamaCppSession {
    model: LlamaCppModel,
    slot: u32,
    resident: Arc<Mutex<Vec<u32>>>,
    closed: AtomicBool,
}

impl LlamaCppSession {
    /// A session on `model`'s pinned `slot`.
    pub fn new(model: LlamaCppModel, slot: u32) -> Self {
        Self {
            model,
            slot,
            resident: Arc::default(),
            closed: AtomicBool::new(false),
        }
    }

    fn check(&self) -> Result<(), BackendError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(BackendError::Invalid("the session is closed".into()));
        }
        Ok(())
    }
}

impl ModelSession for LlamaCppSession {
    fn tokenize(&self, text: String, bos: bool) -> BackendFuture<Vec<u32>> {
        let model = self.model.clone();
        Box::pin(async move {
            let v = model
                .post(
                    "/tokenize",
                    json!({"content": text, "add_special": bos, "parse_special": true}),
                )
                .await?;
            let ids = v["tokens"]
                .as_array()
                .ok_or_else(|| BackendError::Compute("llama.cpp /tokenize returned no tokens".into()))?;
            Ok(ids.iter().filter_map(|t| t.as_u64()).map(|t| t as u32).collect())
        })
    }

    fn set_resident(&self, target: Vec<u32>, invalidate: bool) -> BackendFuture<ResidentUpdate> {
        let checked = self.check();
        let (model, slot, resident) = (self.model.clone(), self.slot, self.resident.clone());
        Box::pin(async move {
            checked?;
            if target.is_empty() {
                return Err(BackendError::EmptyPrompt);
            }
            // A prefill only: n_predict 0 evaluates the prompt into the slot's KV.
            let body = json!({
                "prompt": target, "n_predict": 0, "id_slot": slot,
                "cache_prompt": !invalidate, "temperature": 0.0,
            });
            let v = model.post("/completion", body).await?;
            if let Some(book) = &model.shared.slots {
                book.clear(slot);
            }
            let t = &v["timings"];
            let reused = t["cache_n"].as_u64().unwrap_or(0) as u32;
            let computed = t["prompt_n"].as_u64().unwrap_or(target.len() as u64) as u32;
            let mut held = resident.lock().unwrap_or_else(|p| p.into_inner());
            let dropped = (held.len() as u32).saturating_sub(reused);
            *held = target;
            Ok(ResidentUpdate {
                reused,
                computed,
                dropped,
            })
        })
    }

    fn decode(&self, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<GenerateEvent, BackendError>>(64);
        let checked = self.check();
        let (model, slot, resident) = (self.model.clone(), self.slot, self.resident.clone());
        tokio::spawn(async move {
            if let Err(e) = checked {
                let _ = tx.send(Err(e)).await;
                return;
            }
            let prompt = resident.lock().unwrap_or_else(|p| p.into_inner()).clone();
            // Generated tokens become resident as they pass through.
            let (inner_tx, inner_rx) = tokio::sync::mpsc::channel(64);
            let run = async move {
                // Owns the sender, so the relay ends when the completion does.
                model
                    .stream_completion(Prompt::Tokens(prompt), &config, &cancel, &inner_tx, Some(slot))
                    .await
            };
            let relay = async {
                // Owns the receiver: if the caller goes away, the completion's next
                // send fails and it stops.
                let mut inner_rx = inner_rx;
                while let Some(ev) = inner_rx.recv().await {
                    if let Ok(GenerateEvent::Token(t)) = &ev {
                        resident.lock().unwrap_or_else(|p| p.into_inner()).push(t.id);
                    }
                    if tx.send(ev).await.is_err() {
                        break;
                    }
                }
            };
            let (result, ()) = futures::join!(run, relay);
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        });
        GenerateStream::new(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        }))
    }

    fn resident(&self) -> BackendFuture<Vec<u32>> {
        let held = self.resident.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Box::pin(async move { Ok(held) })
    }

    fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.model.unpin_slot(self.slot);
        }
    }
}

impl Drop for LlamaCppSession {
    fn drop(&mut self) {
        self.close();
    }
}
