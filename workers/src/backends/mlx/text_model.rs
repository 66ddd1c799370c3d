//! [`TextModel`] over the MLX bridge: a generation is one `generate` request whose
//! token events become the stream; stop strings are held back and cut here (the same
//! filter as the CPU engine's), a cancel is forwarded to the bridge between tokens.
//! One generation at a time (capacity 1, announced as such).

use super::child::{Bridge, Events};
use crate::backends::worker_backend::batch_of_streams;
use crate::engine::stops::{StopCheck, StopFilter};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use switchyard_messages::{
    BackendError, BatchFuture, CancelFlag, ClassifyFuture, ClassifyResult, FinishReason, GenerateConfig, GenerateEvent,
    GenerateMetrics, GenerateStream, Message, ModelInfo, Prompt, TextModel, Token,
};

/// A model loaded in MLX behind the bridge.
pub struct MlxModel {
    bridge: Arc<Bridge>,
    info: ModelInfo,
    last: Arc<Mutex<GenerateMetrics>>,
}

fn error_from(ev: &Value) -> BackendError {
    let message = ev["message"].as_str().unwrap_or("MLX failed").to_string();
    match ev["code"].as_str() {
        Some("bad_request") => BackendError::Invalid(message),
        Some("context_overflow") => BackendError::Invalid(format!("context overflow: {message}")),
        Some("unavailable") => BackendError::Unavailable(message),
        _ => BackendError::Compute(message),
    }
}

fn metrics_from(m: &Value) -> GenerateMetrics {
    let u = |k: &str| m[k].as_u64().unwrap_or(0);
    let rate = |n: u64, us: u64| if us == 0 { 0.0 } else { n as f64 * 1e6 / us as f64 };
    GenerateMetrics {
        prompt_tokens: u("prompt_tokens") as u32,
        generated_tokens: u("generated_tokens") as u32,
        prefill_us: u("prefill_us"),
        decode_us: u("decode_us"),
        total_us: u("total_us"),
        prefill_tokens_per_sec: rate(u("prompt_tokens"), u("prefill_us")),
        decode_tokens_per_sec: rate(u("generated_tokens"), u("decode_us")),
        peak_memory_bytes: u("peak_memory_bytes"),
        active_memory_bytes: u("active_memory_bytes"),
        ..GenerateMetrics::default()
    }
}

impl MlxModel {
    /// The model behind a started bridge.
    pub fn new(bridge: Bridge) -> Self {
        let i = &bridge.info;
        let n = |k: &str| i[k].as_u64().unwrap_or(0) as u32;
        let info = ModelInfo {
            architecture: i["architecture"].as_str().unwrap_or_default().to_string(),
            vocab_size: n("vocab_size"),
            num_layers: n("num_layers"),
            hidden_size: n("hidden_size"),
            context_len: n("context_len"),
            quant_bits: n("quant_bits"),
            quant_group: n("quant_group"),
            kernels: format!("mlx {}", i["device"].as_str().unwrap_or_default()),
        };
        Self {
            bridge: Arc::new(bridge),
            info,
            last: Arc::default(),
        }
    }

    /// The `generate` request body for a prompt.
    fn body(prompt: &Prompt, config: &GenerateConfig) -> Value {
        let cfg = json!({
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "top_k": config.top_k,
            "top_p": config.top_p,
            "min_p": config.min_p,
            "repeat_penalty": config.repeat_penalty,
            "seed": config.seed,
            "stop_tokens": config.stop_tokens,
        });
        match prompt {
            Prompt::Text(t) => json!({"op": "generate", "prompt": t, "config": cfg}),
            Prompt::Chat(m) => {
                let m: Vec<Value> = m
                    .iter()
                    .map(|Message { role, content }| json!({"role": role, "content": content}))
                    .collect();
                json!({"op": "generate", "messages": m, "config": cfg})
            }
            Prompt::Tokens(t) => json!({"op": "generate", "tokens": t, "config": cfg}),
        }
    }
}

/// Forwards one request's events into `tx`, cutting stop strings and forwarding a
/// cancel.
async fn pump(
    bridge: Arc<Bridge>,
    mut events: Events,
    stops: Vec<String>,
    cancel: CancelFlag,
    last: Arc<Mutex<GenerateMetrics>>,
    tx: tokio::sync::mpsc::Sender<Result<GenerateEvent, BackendError>>,
) {
    let mut filter = StopFilter::new(&stops);
    let mut cancel_sent = false;
    let mut stopped = false;
    while let Some(ev) = events.next().await {
        if cancel.is_cancelled() && !cancel_sent {
            bridge.cancel(events.id).await;
            cancel_sent = true;
        }
        match ev["event"].as_str() {
            Some("token") if !stopped => {
                let token = Token {
                    id: ev["token"].as_u64().unwrap_or(0) as u32,
                    text: ev["text"].as_str().unwrap_or_default().to_string(),
                };
                let (emit, stop) = match filter.push(token) {
                    StopCheck::Continue(t) => (t, false),
                    StopCheck::Stopped(t) => (t, true),
                };
                for t in emit {
                    if tx.send(Ok(GenerateEvent::Token(t))).await.is_err() && !cancel_sent {
                        bridge.cancel(events.id).await; // the caller went away
                        cancel_sent = true;
                    }
                }
                if stop {
                    stopped = true;
                    bridge.cancel(events.id).await;
                    cancel_sent = true;
                }
            }
            Some("token") => {}
            Some("done") => {
                if !stopped {
                    for t in filter.flush() {
                        let _ = tx.send(Ok(GenerateEvent::Token(t))).await;
                    }
                }
                let finish = match (stopped, ev["finish"].as_str()) {
                    (true, _) | (_, Some("stop")) => FinishReason::Stop,
                    (_, Some("cancelled")) => FinishReason::Cancelled,
                    _ => FinishReason::Length,
                };
                let metrics = metrics_from(&ev["metrics"]);
                *last.lock().unwrap_or_else(|p| p.into_inner()) = metrics.clone();
                let _ = tx
                    .send(Ok(GenerateEvent::Done {
                        finish_reason: finish,
                        metrics,
                    }))
                    .await;
                return;
            }
            _ => {
                let _ = tx.send(Err(error_from(&ev))).await;
                return;
            }
        }
    }
}

impl TextModel for MlxModel {
    fn generate(&self, prompt: Prompt, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let bridge = self.bridge.clone();
        let last = self.last.clone();
        tokio::spawn(async move {
            match bridge.request(Self::body(&prompt, &config)).await {
                Ok(events) => pump(bridge, events, config.stop.clone(), cancel, last, tx).await,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                }
            }
        });
        Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|ev| (ev, rx))
        }))
    }

    fn classify(&self, prompts: Vec<Prompt>, return_logits: bool) -> ClassifyFuture {
        let streams: Vec<GenerateStream> = prompts
            .into_iter()
            .map(|p| {
                let config = GenerateConfig {
                    max_tokens: 1,
                    ..GenerateConfig::default()
                };
                self.generate(p, config, CancelFlag::default())
            })
            .collect();
        Box::pin(async move {
            let mut out = Vec::new();
            for mut s in streams {
                if return_logits {
                    out.push(Err(BackendError::Invalid(
                        "the MLX bridge does not return full logits yet; classify without return_logits".into(),
                    )));
                    continue;
                }
                let mut token = None;
                let mut err = None;
                while let Some(ev) = futures::StreamExt::next(&mut s).await {
                    match ev {
                        Ok(GenerateEvent::Token(t)) => token = Some(t),
                        Ok(GenerateEvent::Done { .. }) => {}
                        Err(e) => err = Some(e),
                    }
                }
                out.push(match (token, err) {
                    (_, Some(e)) => Err(e),
                    (Some(token), None) => Ok(ClassifyResult {
                        token,
                        logits: Vec::new(),
                    }),
                    (None, None) => Err(BackendError::Compute("MLX produced no token".into())),
                });
            }
            out
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

    fn healthy(&self) -> bool {
        self.bridge.alive()
    }

    fn parallel_slots(&self) -> u32 {
        1
    }

    fn model_type(&self) -> &str {
        "mlx"
    }

    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn metrics(&self) -> GenerateMetrics {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
