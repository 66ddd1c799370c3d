//! [`TextModel`] over the MLX bridge: a generation is one `generate` request whose
//! token events become the stream; stop strings are held back and cut here (the same
//! filter as the CPU engine's), a cancel is forwarded to the bridge between tokens.
//! Classify, embed and the attention inspector are one request each (logits, vectors
//! and keys come as base64 float32). One request at a time (capacity 1, announced as such).

use super::exchange::MlxKv;
use super::holdings::MlxHoldings;
use super::requests::{body, config_json, floats, stream};
use super::session::MlxSession;
use super::supervisor::Supervised;
use crate::backends::worker_backend::batch_of_streams;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use switchyard_backend::{
    BackendError, BackendFuture, BatchFuture, CancelFlag, ClassifyFuture, EmbedFuture, GenerateStream, InspectFuture,
    ModelMemory, ModelSession, Prompt, TextModel,
};
use switchyard_messages::{
    AttentionSnapshot, ClassifyResult, Embedding, GenerateConfig, GenerateMetrics, ModelInfo, Token,
};

/// A model loaded in MLX behind the (supervised) bridge (a handle: clones share it).
#[derive(Clone)]
pub struct MlxModel {
    bridge: Arc<Supervised>,
    info: ModelInfo,
    last: Arc<Mutex<GenerateMetrics>>,
    /// The KV exchange, when the model's cache can travel (`kv_exchange`).
    pub(super) kv: Option<Arc<MlxKv>>,
    /// What the shared cache holds (`holdings`), when the tokenizer loads here.
    holdings: Option<Arc<MlxHoldings>>,
    /// The model's chat template, compiled here only to tell whether a prompt leaves
    /// a reasoning section open (the bridge renders the prompts itself).
    template: Option<Arc<switchyard_engine::text::template::ChatTemplate>>,
}

impl MlxModel {
    /// The model in `dir` behind a supervised bridge; `info` is what its first
    /// `load` said.
    pub fn new(bridge: Arc<Supervised>, i: &Value, dir: &std::path::Path) -> Self {
        let n = |k: &str| i[k].as_u64().unwrap_or(0) as u32;
        let eos: Vec<u32> = i["eos"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t.as_u64().map(|t| t as u32))
            .collect();
        let info = ModelInfo {
            architecture: i["architecture"].as_str().unwrap_or_default().to_string(),
            vocab_size: n("vocab_size"),
            num_layers: n("num_layers"),
            hidden_size: n("hidden_size"),
            context_len: n("context_len"),
            quant_bits: n("quant_bits"),
            quant_group: n("quant_group"),
            kernels: format!("mlx {}", i["device"].as_str().unwrap_or_default()),
            embedding_dim: n("embedding_dim"),
            embedding_only: false,
            pipeline: None,
        };
        let mut me = Self {
            bridge,
            info,
            last: Arc::default(),
            kv: MlxKv::from_info(i),
            holdings: None,
            template: {
                let (source, bos, eos) = switchyard_engine::text::template::hf_template_parts(dir);
                switchyard_engine::text::template::ChatTemplate::new(&source, &bos, &eos)
                    .ok()
                    .map(Arc::new)
            },
        };
        me.holdings = MlxHoldings::open(dir, &eos);
        if let Some(h) = &me.holdings {
            let h = Arc::downgrade(h);
            me.bridge.on_exit(move || {
                if let Some(h) = h.upgrade() {
                    h.forget();
                }
            });
        }
        me
    }

    /// Turns the KV exchange on (when the bridge's cache can travel): the weights in
    /// `dir` are hashed in the background, and KV moves once they are.
    pub fn enable_kv_exchange(&self, dir: std::path::PathBuf) {
        if let Some(kv) = &self.kv {
            kv.learn_format(dir);
        }
    }

    /// The supervisor (tests and the worker's status read its pid and restarts).
    pub fn supervisor(&self) -> &Arc<Supervised> {
        &self.bridge
    }
}

impl TextModel for MlxModel {
    /// Told from the model's template rendered here (the bridge renders the prompts
    /// with the same template); a template this cannot compile says no.
    fn opens_reasoning(&self, prompt: &Prompt) -> bool {
        self.template.as_ref().is_some_and(|t| t.leaves_reasoning_open(prompt))
    }

    fn generate(&self, prompt: Prompt, config: GenerateConfig, cancel: CancelFlag) -> GenerateStream {
        let request = body(
            "generate",
            Some(&prompt),
            json!({"config": config_json(&config), "adapter": config.adapter}),
        );
        let follow = self
            .holdings
            .as_ref()
            .map(|h| h.follow(&prompt, config.adapter.clone()));
        if let Some(f) = follow.clone().filter(|f| f.keyed()) {
            // The prompt as the bridge renders and tokenizes it, for its holding.
            let render = super::requests::body("render", Some(&prompt), json!({}));
            let bridge = self.bridge.clone();
            tokio::spawn(async move {
                let Ok((b, _)) = bridge.bridge() else { return };
                if let Ok(ev) = b.call(render).await {
                    if let (Some(text), Ok(tokens)) =
                        (ev["rendered"].as_str(), super::requests::token_ids(&ev["tokens"]))
                    {
                        f.mapped(text, tokens);
                    }
                }
            });
        }
        stream(&self.bridge, request, &config, cancel, self.last.clone(), follow)
    }

    fn classify(&self, prompts: Vec<Prompt>, return_logits: bool) -> ClassifyFuture {
        let bridge = self.bridge.clone();
        Box::pin(async move {
            let mut out = Vec::with_capacity(prompts.len());
            for p in prompts {
                let one = async {
                    let (b, _) = bridge.bridge()?;
                    let ev = b
                        .call(body("classify", Some(&p), json!({"logits": return_logits})))
                        .await?;
                    let token = Token {
                        id: ev["token"].as_u64().unwrap_or(0) as u32,
                        text: ev["text"].as_str().unwrap_or_default().to_string(),
                        logprob: None,
                        reasoning: false,
                    };
                    let logits = if return_logits {
                        floats(&ev["logits"])?
                    } else {
                        Vec::new()
                    };
                    Ok(ClassifyResult { token, logits })
                };
                out.push(one.await);
            }
            out
        })
    }

    fn embed(&self, inputs: Vec<Prompt>) -> EmbedFuture {
        let bridge = self.bridge.clone();
        Box::pin(async move {
            let mut out = Vec::with_capacity(inputs.len());
            for p in inputs {
                let one = async {
                    let (b, _) = bridge.bridge()?;
                    let ev = b.call(body("embed", Some(&p), json!({}))).await?;
                    Ok(Embedding {
                        vector: floats(&ev["embedding"])?,
                        tokens: ev["tokens"].as_u64().unwrap_or(0) as u32,
                    })
                };
                out.push(one.await);
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

    fn inspect_attention(&self, prompt: Prompt) -> InspectFuture {
        let bridge = self.bridge.clone();
        let architecture = self.info.architecture.clone();
        Box::pin(async move {
            let (b, _) = bridge.bridge()?;
            let ev = b.call(body("inspect", Some(&prompt), json!({}))).await?;
            let n = |k: &str| ev[k].as_u64().unwrap_or(0) as u32;
            let (heads, seq, dim) = (n("num_heads"), n("seq_len"), n("head_dim"));
            let per_head = (seq * dim) as usize;
            let mut keys = Vec::new();
            for layer in ev["keys"].as_array().into_iter().flatten() {
                let all = floats(layer)?;
                if all.len() != per_head * heads as usize {
                    return Err(BackendError::Compute(
                        "the MLX bridge sent keys of the wrong size".into(),
                    ));
                }
                keys.push(all.chunks(per_head).map(<[f32]>::to_vec).collect());
            }
            Ok(AttentionSnapshot {
                num_layers: n("num_layers"),
                num_heads: heads,
                seq_len: seq,
                head_dim: dim,
                keys,
                architecture,
            })
        })
    }

    fn healthy(&self) -> bool {
        self.bridge.alive()
    }

    fn open_session(&self) -> BackendFuture<Arc<dyn ModelSession>> {
        let bridge = self.bridge.clone();
        let last = self.last.clone();
        Box::pin(async move {
            let s = MlxSession::open(bridge, last).await?;
            Ok(Arc::new(s) as Arc<dyn ModelSession>)
        })
    }

    fn memory(&self) -> ModelMemory {
        ModelMemory {
            model_max_context: self.info.context_len,
            ..ModelMemory::default()
        }
    }

    fn parallel_slots(&self) -> u32 {
        1
    }

    fn adapters(&self) -> Vec<switchyard_messages::ServedAdapter> {
        let adapters = self.bridge.adapters.lock().unwrap_or_else(|p| p.into_inner());
        adapters.iter().map(|(a, _)| a.clone()).collect()
    }

    /// One PEFT adapter at a time per request: the bridge runs requests one by one
    /// and switches the adapter between them.
    fn load_adapter(
        &self,
        name: String,
        path: String,
        scale: f32,
    ) -> BackendFuture<switchyard_messages::ServedAdapter> {
        let bridge = self.bridge.clone();
        Box::pin(async move {
            switchyard_messages::check_adapter_name(&name).map_err(|e| BackendError::Invalid(e.message))?;
            let request = json!({"op": "load_adapter", "name": name, "path": path, "scale": scale});
            let (b, _) = bridge.bridge()?;
            b.call(request.clone()).await?;
            let served = switchyard_messages::ServedAdapter {
                name: name.clone(),
                path,
                scale,
                exclusive: false,
            };
            let mut adapters = bridge.adapters.lock().unwrap_or_else(|p| p.into_inner());
            adapters.retain(|(a, _)| a.name != name);
            adapters.push((served.clone(), request));
            adapters.sort_by(|x, y| x.0.name.cmp(&y.0.name));
            Ok(served)
        })
    }

    fn unload_adapter(&self, name: String) -> BackendFuture<()> {
        let bridge = self.bridge.clone();
        Box::pin(async move {
            let held = {
                let adapters = bridge.adapters.lock().unwrap_or_else(|p| p.into_inner());
                adapters.iter().any(|(a, _)| a.name == name)
            };
            if !held {
                return Err(BackendError::Invalid(format!("no LoRA adapter {name:?} is loaded")));
            }
            let (b, _) = bridge.bridge()?;
            b.call(json!({"op": "unload_adapter", "name": name})).await?;
            let mut adapters = bridge.adapters.lock().unwrap_or_else(|p| p.into_inner());
            adapters.retain(|(a, _)| a.name != name);
            Ok(())
        })
    }

    fn model_type(&self) -> &str {
        "mlx"
    }

    fn kv_holdings(&self) -> Option<Vec<switchyard_messages::KvHolding>> {
        self.holdings.as_ref().map(|h| h.shared.get())
    }

    fn watch_kv(&self, on_change: switchyard_backend::KvWatcher) {
        if let Some(h) = &self.holdings {
            h.shared.watch(on_change);
        }
    }

    fn kv_transfer(&self) -> Option<&dyn switchyard_backend::KvTransfer> {
        self.kv.as_ref().map(|_| self as &dyn switchyard_backend::KvTransfer)
    }

    fn info(&self) -> ModelInfo {
        self.info.clone()
    }

    fn metrics(&self) -> GenerateMetrics {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
