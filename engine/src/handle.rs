//! [`EngineModel`]: the handle on a loaded model — it sends jobs to the model's
//! compute thread and implements the backend contract ([`TextModel`]). Loading is
//! in `load.rs`.

use crate::text::{template, tokenizer};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;
use switchyard_backend::{BackendError, BatchFuture, CancelFlag, ClassifyFuture, GenerateStream, Prompt, TextModel};
use switchyard_messages::{GenerateConfig, GenerateMetrics, ModelInfo};

use crate::{compute, session};

/// A model loaded in switchyard's CPU engine.
pub struct EngineModel {
    pub(crate) jobs: Mutex<mpsc::Sender<compute::Job>>,
    pub(crate) info: ModelInfo,
    pub(crate) architecture: String,
    pub(crate) tokenizer: Arc<tokenizer::GgufTokenizer>,
    pub(crate) template: Arc<template::ChatTemplate>,
    pub(crate) last_metrics: Arc<Mutex<GenerateMetrics>>,
    pub(crate) slots: usize,
    pub(crate) stats: Arc<compute::BatchStats>,
    pub(crate) memory: switchyard_backend::ModelMemory,
    pub(crate) usage: Arc<Mutex<switchyard_messages::KvUsage>>,
    pub(crate) holdings: Arc<crate::holdings::Shared>,
    pub(crate) adapters: Arc<crate::adapters::Adapters>,
    /// The KV format, once the model file's digest is computed (a thread at load).
    pub(crate) kv_format: Arc<std::sync::OnceLock<switchyard_messages::KvFormat>>,
    /// Adapter keys by adapter load (their files' digests, computed once).
    pub(crate) adapter_keys: Mutex<std::collections::HashMap<u64, String>>,
    /// A pipeline's first stage: the later stages as they last answered.
    pub(crate) stages: Option<crate::pipeline::StageView>,
}

impl EngineModel {
    /// The batcher's decode-step counters.
    pub fn batch_stats(&self) -> &compute::BatchStats {
        &self.stats
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &tokenizer::GgufTokenizer {
        &self.tokenizer
    }

    /// Renders a conversation with the model's chat template, ending with the
    /// assistant's turn opener (what `chat` tokenizes).
    pub fn render_chat(&self, messages: &[switchyard_messages::Message]) -> Result<String, BackendError> {
        self.template
            .render(messages, &[], true)
            .map_err(|e| BackendError::Invalid(format!("chat template: {e}")))
    }

    /// Sends a job and returns its event stream (used by [`TextModel::generate`]).
    pub fn submit(
        &self,
        prompt: Prompt,
        config: GenerateConfig,
        cancel: CancelFlag,
        deadline_ms: Option<u64>,
    ) -> GenerateStream {
        let (tx, rx) = GenerateStream::channel();
        let adapter = match self.adapters.get(config.adapter.as_deref()) {
            Ok(a) => a,
            Err(e) => {
                let _ = tx.send(Err(e));
                drop(tx);
                return rx;
            }
        };
        let job = compute::GenerateJob {
            adapter,
            prompt,
            config,
            cancel,
            deadline_ms,
            enqueued: Instant::now(),
            events: tx.clone(),
            session_slot: None,
        };
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(compute::Job::Generate(Box::new(job)));
        if sent.is_err() {
            let _ = tx.send(Err(BackendError::Unavailable("the compute thread has stopped".into())));
        }
        drop(tx);
        rx
    }
}

impl TextModel for EngineModel {
    fn generate(&self, prompt: Prompt, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        self.submit(prompt, config, cancel, None)
    }

    fn classify(&self, prompts: Vec<Prompt>, return_logits: bool) -> ClassifyFuture {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let n = prompts.len();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(compute::Job::Classify {
                prompts,
                return_logits,
                reply,
            });
        compute::per_input(sent.is_ok(), answer, n)
    }

    fn embed(&self, inputs: Vec<Prompt>) -> switchyard_backend::EmbedFuture {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let n = inputs.len();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(compute::Job::Embed { inputs, reply });
        compute::per_input(sent.is_ok(), answer, n)
    }

    fn batch_generate(&self, prompts: Vec<Prompt>, config: GenerateConfig, cancel: CancelFlag) -> BatchFuture {
        // One stream per prompt, queued on the engine in order: they decode together
        // as far as slots allow, and each collects alone.
        let streams: Vec<GenerateStream> = prompts
            .into_iter()
            .map(|p| self.submit(p, config.clone(), cancel.clone(), None))
            .collect();
        Box::pin(async move {
            let mut results = Vec::with_capacity(streams.len());
            for stream in streams {
                results.push(switchyard_backend::collect_batch_result(stream).await);
            }
            results
        })
    }

    fn inspect_attention(&self, prompt: Prompt) -> switchyard_backend::InspectFuture {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(compute::Job::Inspect {
                prompt,
                architecture: self.architecture.clone(),
                reply,
            });
        Box::pin(async move {
            let stopped = || BackendError::Unavailable("the compute thread has stopped".into());
            if sent.is_err() {
                return Err(stopped());
            }
            answer.await.unwrap_or_else(|_| Err(stopped()))
        })
    }

    fn resumes(&self) -> bool {
        true
    }

    fn tool_format(&self) -> switchyard_backend::ToolFormat {
        self.template.tool_format()
    }

    fn detokenize(&self, ids: &[u32]) -> Option<String> {
        Some(self.tokenizer.decode(ids))
    }

    fn opens_reasoning(&self, prompt: &Prompt) -> bool {
        self.template.leaves_reasoning_open(prompt)
    }

    fn kv_transfer(&self) -> Option<&dyn switchyard_backend::KvTransfer> {
        Some(self)
    }

    fn model_type(&self) -> &str {
        &self.architecture
    }

    fn info(&self) -> ModelInfo {
        let mut info = self.info.clone();
        if let (Some(p), Some(stages)) = (info.pipeline.as_mut(), &self.stages) {
            let seen = stages.lock().unwrap_or_else(|p| p.into_inner()).clone();
            (p.stages, p.broken) = (seen.stages, seen.broken);
        }
        info
    }

    /// A pipeline's first stage is unhealthy while a later stage is missing or
    /// silent (its link's watch says so): the worker refuses new requests and its
    /// heartbeat tells the fleet, until every stage answers again.
    fn healthy(&self) -> bool {
        self.stages
            .as_ref()
            .is_none_or(|s| s.lock().unwrap_or_else(|p| p.into_inner()).broken.is_none())
    }

    fn metrics(&self) -> GenerateMetrics {
        self.last_metrics.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn parallel_slots(&self) -> u32 {
        self.slots as u32
    }

    fn open_session(&self) -> switchyard_backend::BackendFuture<Arc<dyn switchyard_backend::ModelSession>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let sent = jobs.send(compute::Job::Session(compute::SessionOp::Open { reply }));
        let tokenizer = self.tokenizer.clone();
        let slots = self.slots;
        Box::pin(async move {
            let stopped = || BackendError::Unavailable("the compute thread has stopped".into());
            sent.map_err(|_| stopped())?;
            let slot = answer.await.map_err(|_| stopped())?.ok_or_else(|| {
                BackendError::Overloaded(format!(
                    "every KV slot but one is held by a session ({slots} slots; one stays for requests)"
                ))
            })?;
            Ok(Arc::new(session::CpuSession {
                jobs: std::sync::Mutex::new(jobs),
                slot,
                tokenizer,
                closed: std::sync::atomic::AtomicBool::new(false),
            }) as Arc<dyn switchyard_backend::ModelSession>)
        })
    }

    fn memory(&self) -> switchyard_backend::ModelMemory {
        self.memory
    }

    fn kv_holdings(&self) -> Option<Vec<switchyard_messages::KvHolding>> {
        Some(self.holdings.get())
    }

    fn watch_kv(&self, on_change: switchyard_backend::KvWatcher) {
        self.holdings.watch(on_change);
    }

    fn kv_usage(&self) -> switchyard_messages::KvUsage {
        *self.usage.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn adapters(&self) -> Vec<switchyard_messages::ServedAdapter> {
        self.adapters.list()
    }

    fn load_adapter(
        &self,
        name: String,
        path: String,
        scale: f32,
    ) -> switchyard_backend::BackendFuture<switchyard_messages::ServedAdapter> {
        let adapters = self.adapters.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || adapters.load(&name, &path, scale))
                .await
                .unwrap_or_else(|e| Err(BackendError::Compute(format!("loading the adapter failed: {e}"))))
        })
    }

    fn unload_adapter(&self, name: String) -> switchyard_backend::BackendFuture<()> {
        let unloaded = self.adapters.unload(&name);
        Box::pin(async move { unloaded })
    }
}
