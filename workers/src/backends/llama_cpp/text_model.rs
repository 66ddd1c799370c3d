//! [`TextModel`] for [`LlamaCppModel`]: the contract mapped onto the server's API.

use super::client::LlamaCppModel;
use super::session::LlamaCppSession;
use crate::backends::worker_backend::batch_of_streams;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use switchyard_backend::{
    BackendError, BatchFuture, CancelFlag, ClassifyFuture, GenerateEvent, GenerateStream, Prompt, TextModel,
};
use switchyard_messages::{ClassifyResult, GenerateConfig, GenerateMetrics, ModelInfo, Token};

impl TextModel for LlamaCppModel {
    fn enforces(&self, constraint: &switchyard_messages::Constraint) -> Result<(), String> {
        super::constraint::support(constraint)
    }

    /// Told from the server's template rendered here (as the server renders it, but
    /// for the tail only); a template this cannot compile says no.
    fn opens_reasoning(&self, prompt: &Prompt) -> bool {
        self.shared
            .template
            .as_ref()
            .is_some_and(|t| t.leaves_reasoning_open(prompt))
    }

    fn generate(&self, prompt: Prompt, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        let this = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<GenerateEvent, BackendError>>(64);
        // The caller's span (the worker's generation) follows into the HTTP call.
        let span = tracing::Span::current();
        let run = async move {
            let result = this.stream_completion(prompt, &config, &cancel, &tx, None).await;
            if let Err(e) = result {
                let _ = tx.send(Err(e)).await;
            }
        };
        tokio::spawn(tracing::Instrument::instrument(run, span));
        GenerateStream::new(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        }))
    }

    /// The server's own embeddings (`/v1/embeddings`; it must run with `--embeddings`,
    /// and pools as its `--pooling` says), one request per input so each fails alone.
    fn embed(&self, inputs: Vec<Prompt>) -> switchyard_backend::EmbedFuture {
        let this = self.clone();
        Box::pin(async move {
            let jobs = inputs.into_iter().map(|p| {
                let this = this.clone();
                async move {
                    let input = this.prompt_value(&p, 0).await?;
                    let v = this.post("/v1/embeddings", json!({"input": input})).await?;
                    let vector: Vec<f32> = serde_json::from_value(v["data"][0]["embedding"].clone())
                        .map_err(|e| BackendError::Compute(format!("llama.cpp sent no embedding: {e}")))?;
                    Ok(switchyard_messages::Embedding {
                        vector,
                        tokens: v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as u32,
                    })
                }
            });
            futures::future::join_all(jobs).await
        })
    }

    fn classify(&self, prompts: Vec<Prompt>, return_logits: bool) -> ClassifyFuture {
        let this = self.clone();
        Box::pin(async move {
            let jobs = prompts.into_iter().map(|p| {
                let this = this.clone();
                async move {
                    if return_logits {
                        return Err(BackendError::Invalid(
                            "llama.cpp servers do not return full logits; classify without return_logits".into(),
                        ));
                    }
                    let prompt = this.prompt_value(&p, 1).await?;
                    let body = json!({"prompt": prompt, "n_predict": 1, "temperature": 0.0,
                                      "return_tokens": true, "n_probs": 1, "cache_prompt": true});
                    let v = this.post("/completion", body).await?;
                    let id = v["tokens"][0]
                        .as_u64()
                        .ok_or_else(|| BackendError::Compute("llama.cpp returned no token".into()))?;
                    Ok(ClassifyResult {
                        token: Token {
                            id: id as u32,
                            text: v["content"].as_str().unwrap_or_default().to_string(),
                            logprob: None,
                            reasoning: false,
                        },
                        logits: Vec::new(),
                    })
                }
            });
            futures::future::join_all(jobs).await
        })
    }

    fn batch_generate(&self, prompts: Vec<Prompt>, config: GenerateConfig, cancel: CancelFlag) -> BatchFuture {
        batch_of_streams(
            prompts
                .into_iter()
                .map(|p| self.generate(p, config.clone(), cancel.clone()))
                .collect(),
        )
    }

    fn open_session(&self) -> switchyard_backend::BackendFuture<Arc<dyn switchyard_backend::ModelSession>> {
        let this = self.clone();
        Box::pin(async move {
            let slots = this.props().total_slots;
            let slot = this.pin_slot().ok_or_else(|| {
                BackendError::Overloaded(format!(
                    "every llama.cpp slot but one is held by a session ({slots} slots; one stays for requests)"
                ))
            })?;
            Ok(Arc::new(LlamaCppSession::new(this, slot)) as Arc<dyn switchyard_backend::ModelSession>)
        })
    }

    fn memory(&self) -> switchyard_backend::ModelMemory {
        switchyard_backend::ModelMemory {
            model_max_context: self.shared.props.n_ctx,
            ..Default::default()
        }
    }

    fn parallel_slots(&self) -> u32 {
        self.shared.props.total_slots
    }

    fn kv_usage(&self) -> switchyard_messages::KvUsage {
        let pinned = self.shared.pinned.lock().unwrap_or_else(|p| p.into_inner());
        switchyard_messages::KvUsage {
            slots: self.shared.props.total_slots,
            sessions: pinned.iter().filter(|p| **p).count() as u32,
            ..Default::default()
        }
    }

    fn kv_holdings(&self) -> Option<Vec<switchyard_messages::KvHolding>> {
        self.shared.slots.as_ref().map(|book| book.shared.get())
    }

    fn watch_kv(&self, on_change: switchyard_backend::KvWatcher) {
        if let Some(book) = &self.shared.slots {
            book.shared.watch(on_change);
        }
    }

    fn adapters(&self) -> Vec<switchyard_messages::ServedAdapter> {
        self.shared.adapters.list()
    }

    fn load_adapter(
        &self,
        name: String,
        path: String,
        scale: f32,
    ) -> switchyard_backend::BackendFuture<switchyard_messages::ServedAdapter> {
        let loaded = self.shared.adapters.load(&name, &path, scale, &self.url());
        Box::pin(async move { loaded })
    }

    fn unload_adapter(&self, name: String) -> switchyard_backend::BackendFuture<()> {
        let unloaded = self.shared.adapters.unload(&name);
        Box::pin(async move { unloaded })
    }

    fn kv_transfer(&self) -> Option<&dyn switchyard_backend::KvTransfer> {
        self.shared
            .exchange
            .get()
            .map(|_| self as &dyn switchyard_backend::KvTransfer)
    }

    fn model_type(&self) -> &str {
        "llama_cpp"
    }

    fn healthy(&self) -> bool {
        self.shared.healthy.load(Ordering::Acquire)
    }

    fn info(&self) -> ModelInfo {
        self.shared.info.clone()
    }

    fn metrics(&self) -> GenerateMetrics {
        self.shared
            .last_metrics
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
