//! `FabricProbe`: a **fake** model that does no compute. It exists only so
//! `switchyard bench fabric` can measure the fabric's own cost per token (NATS,
//! coordinator, worker service, client) without model time drowning it out, and so
//! tests can see what the fabric does with tokens that are all ready at once. It lives
//! here, not among the backends: it is never registered, never served by `up` or
//! `worker`.

use futures::stream;
use switchyard_backend::{
    BackendError, BatchFuture, CancelFlag, ClassifyFuture, GenerateEvent, GenerateStream, Prompt, TextModel,
};
use switchyard_messages::{BatchResult, FinishReason, GenerateConfig, GenerateMetrics, ModelInfo, Token};

/// Emits `max_tokens` tokens (`id` 0..n, text "x") as fast as the consumer reads them.
#[derive(Debug, Default)]
pub struct FabricProbe;

impl TextModel for FabricProbe {
    fn generate(&self, _prompt: Prompt, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        let n = config.max_tokens;
        let tokens = (0..n).map(|i| {
            Ok(GenerateEvent::Token(Token {
                id: i,
                text: "x".into(),
                logprob: None,
                reasoning: false,
            }))
        });
        let done = std::iter::once(Ok(GenerateEvent::Done {
            finish_reason: if cancel.is_cancelled() {
                FinishReason::Cancelled
            } else {
                FinishReason::Length
            },
            metrics: GenerateMetrics {
                generated_tokens: n,
                ..GenerateMetrics::default()
            },
        }));
        GenerateStream::new(stream::iter(tokens.chain(done).collect::<Vec<_>>()))
    }

    fn classify(&self, prompts: Vec<Prompt>, _return_logits: bool) -> ClassifyFuture {
        let n = prompts.len();
        Box::pin(async move {
            (0..n)
                .map(|_| Err(BackendError::Unavailable("fabric-probe computes nothing".into())))
                .collect()
        })
    }

    fn batch_generate(&self, prompts: Vec<Prompt>, _config: GenerateConfig, _cancel: CancelFlag) -> BatchFuture {
        let n = prompts.len();
        Box::pin(async move {
            (0..n)
                .map(|_| BatchResult {
                    finish_reason: Some(switchyard_messages::FinishReason::Error),
                    tokens: Vec::new(),
                    error: Some(BackendError::Unavailable("fabric-probe computes nothing".into()).to_wire()),
                })
                .collect()
        })
    }

    fn model_type(&self) -> &str {
        "fabric-probe"
    }

    fn info(&self) -> ModelInfo {
        ModelInfo {
            architecture: "fabric-probe".into(),
            context_len: u32::MAX,
            ..ModelInfo::default()
        }
    }

    fn metrics(&self) -> GenerateMetrics {
        GenerateMetrics::default()
    }
}

/// Starts a worker serving [`FabricProbe`] as `fabric-probe`, with `config`'s worker
/// settings (its id among them).
pub async fn start_worker(config: &switchyard_config::Config) -> anyhow::Result<switchyard_workers::WorkerHandle> {
    let loaded = switchyard_node::Loaded {
        model: std::sync::Arc::new(FabricProbe),
        path: "fabric-probe".into(),
        name: "fabric-probe".into(),
        backend: switchyard_messages::BackendKind::Cpu,
        device: switchyard_messages::Device::Cpu,
        capacity: 1,
        supervisor: None,
    };
    switchyard_node::start_worker(config, &loaded).await
}
