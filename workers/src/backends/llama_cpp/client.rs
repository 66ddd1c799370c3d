//! The HTTP client side of the `llama_cpp` backend: connecting, `/props`, the
//! health loop, and streaming one completion.

use super::body::{completion_body, constraint_supported, metrics_from, token_logprob};
use super::holdings::SlotBook;
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use switchyard_backend::{BackendError, CancelFlag, GenerateEvent, Prompt};
use switchyard_messages::{FinishReason, GenerateConfig, GenerateMetrics, ModelInfo, Token};

/// How often the health loop asks `/health`.
const HEALTH_PERIOD: Duration = Duration::from_millis(250);

/// What `/props` says about the server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerProps {
    /// The GGUF the server loaded.
    pub model_path: String,
    /// The server's name for the model (`--alias`, else the file name).
    pub model_alias: String,
    /// Context window of one slot.
    pub n_ctx: u32,
    /// Parallel slots (`--parallel`): requests the server computes at once.
    pub total_slots: u32,
    /// The chat template the server renders with (empty when it has none).
    pub chat_template: String,
    /// The server's build (`b1234-abcdef0`), empty when it does not say.
    pub build_info: String,
}

/// A connection to one llama.cpp server.
#[derive(Clone)]
pub struct LlamaCppModel {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) url: String,
    pub(super) http: reqwest::Client,
    pub(super) info: ModelInfo,
    pub(super) props: ServerProps,
    /// The last `/health` answer (or a failed request since): see [`switchyard_backend::TextModel::healthy`].
    pub(super) healthy: AtomicBool,
    pub(super) last_metrics: Mutex<GenerateMetrics>,
    /// Slots held by sessions (`id_slot`), one flag per server slot.
    pub(super) pinned: Mutex<Vec<bool>>,
    /// What the slots hold ([`SlotBook`]), when the model file is readable here.
    pub(super) slots: Option<Arc<SlotBook>>,
    /// The LoRA adapters the server loaded and the names they are served under.
    pub(super) adapters: super::adapters::ServerAdapters,
    /// KV travelling to and from peers, for a server this worker supervises
    /// ([`super::kv_exchange`]).
    pub(super) exchange: std::sync::OnceLock<Arc<super::exchange::Exchange>>,
    /// The server's chat template, compiled here only to tell whether a prompt
    /// leaves a reasoning section open (the server renders the prompts itself).
    pub(super) template: Option<switchyard_engine::text::template::ChatTemplate>,
}

impl Shared {
    fn url(&self) -> String {
        self.url.clone()
    }

    /// Marks the server down after a failed request (the health loop marks it up
    /// again), and builds the retryable error the request ends with.
    fn lost(&self, what: &str, e: impl std::fmt::Display) -> BackendError {
        if self.healthy.swap(false, Ordering::AcqRel) {
            tracing::warn!(url = %self.url(), "llama.cpp server unreachable ({what}: {e}); marked unavailable");
        }
        BackendError::Unavailable(format!("llama.cpp server at {} {what}: {e}", self.url()))
    }
}

/// `e` with its sources (`error sending request: client error (Connect): …`), which
/// reqwest's own message leaves out.
fn with_sources(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// Whether `e` is a connection that failed or closed before any answer came: the
/// server did not start on the request.
fn closed_before_answer(e: &reqwest::Error) -> bool {
    let text = with_sources(e).to_lowercase();
    e.is_connect()
        || [
            "connection closed before message completed",
            "connection reset",
            "broken pipe",
        ]
        .iter()
        .any(|s| text.contains(s))
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Unavailable(format!("llama.cpp server {what}: {e}"))
}

impl LlamaCppModel {
    /// Connects to the server at `url` (e.g. `http://127.0.0.1:8080`), waiting for
    /// `/health` to report ready (it answers 503 while loading) for up to `wait`.
    /// A background loop keeps asking `/health` for as long as the model lives, so
    /// [`switchyard_backend::TextModel::healthy`] follows the server going away and coming back.
    pub async fn connect(url: &str, wait: Duration) -> Result<Self, BackendError> {
        let url = url.trim_end_matches('/').to_string();
        // Idle connections are dropped before llama-server's keep-alive timeout (5 s)
        // closes them, so a request never goes out on a connection being closed.
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(3))
            .build()
            .map_err(|e| unavailable("client", e))?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match http.get(format!("{url}/health")).send().await {
                Ok(r) if r.status().is_success() => break,
                Ok(r) if tokio::time::Instant::now() >= deadline => {
                    return Err(unavailable(
                        &format!("at {url} is not ready"),
                        format!("/health answered {} after {:.0?}", r.status(), wait),
                    ))
                }
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(unavailable(&format!("at {url} is unreachable"), with_sources(&e)))
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
        let props = fetch_props(&http, &url).await?;
        // Vocabulary and width, where the server reports them (`/v1/models` meta).
        let meta = match http.get(format!("{url}/v1/models")).send().await {
            Ok(r) => r.json::<Value>().await.unwrap_or_default()["data"][0]["meta"].clone(),
            Err(_) => Value::Null,
        };
        let info = ModelInfo {
            architecture: "llama_cpp".into(),
            vocab_size: meta["n_vocab"].as_u64().unwrap_or(0) as u32,
            num_layers: 0,
            hidden_size: meta["n_embd"].as_u64().unwrap_or(0) as u32,
            quant_bits: 0,
            quant_group: 0,
            context_len: props.n_ctx,
            kernels: String::new(),
            embedding_dim: embedding_dim(&http, &url).await,
            embedding_only: false,
            pipeline: None,
        };
        let book = {
            let (path, n) = (props.model_path.clone(), props.total_slots);
            tokio::task::spawn_blocking(move || SlotBook::open(&path, n))
                .await
                .ok()
                .flatten()
        };
        let lora = match http.get(format!("{url}/lora-adapters")).send().await {
            Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap_or_default(),
            _ => Value::Null,
        };
        tracing::info!(%url, model = %props.model_path, n_ctx = props.n_ctx, slots = props.total_slots, "llama.cpp server connected");
        let template = (!props.chat_template.is_empty())
            .then(|| switchyard_engine::text::template::ChatTemplate::new(&props.chat_template, "", "").ok())
            .flatten();
        let shared = Arc::new(Shared {
            template,
            url,
            http,
            info,
            pinned: Mutex::new(vec![false; props.total_slots as usize]),
            slots: book.map(Arc::new),
            adapters: super::adapters::ServerAdapters::new(&lora),
            props,
            healthy: AtomicBool::new(true),
            last_metrics: Mutex::new(GenerateMetrics::default()),
            exchange: std::sync::OnceLock::new(),
        });
        tokio::spawn(health_loop(Arc::downgrade(&shared)));
        Ok(Self { shared })
    }

    /// The server's base URL.
    pub fn url(&self) -> String {
        self.shared.url()
    }

    /// Pins a server slot for a session: the lowest free one, as long as one slot
    /// stays unpinned for ordinary requests.
    pub(crate) fn pin_slot(&self) -> Option<u32> {
        let mut pinned = self.shared.pinned.lock().unwrap_or_else(|p| p.into_inner());
        if pinned.iter().filter(|p| !**p).count() < 2 {
            return None;
        }
        let slot = pinned.iter().position(|p| !*p)?;
        pinned[slot] = true;
        drop(pinned);
        // Its holding is the session's now, not for ordinary requests to reuse.
        if let Some(book) = &self.shared.slots {
            book.clear(slot as u32);
        }
        Some(slot as u32)
    }

    /// Gives a session's slot back.
    pub(crate) fn unpin_slot(&self, slot: u32) {
        if let Some(p) = self
            .shared
            .pinned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(slot as usize)
        {
            *p = false;
        }
    }

    /// What `/props` said when this connection was made.
    pub fn props(&self) -> &ServerProps {
        &self.shared.props
    }

    /// Marks the server down now (its supervisor saw it exit); the health loop marks
    /// it up again once `/health` answers.
    pub fn mark_down(&self, why: &str) {
        if self.shared.healthy.swap(false, Ordering::AcqRel) {
            tracing::warn!(url = %self.url(), "llama.cpp server down: {why}");
        }
        if let Some(book) = &self.shared.slots {
            book.forget();
        }
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> Result<Value, BackendError> {
        let r = self
            .shared
            .http
            .post(format!("{}{path}", self.url()))
            .json(&body)
            .send()
            .await
            .map_err(|e| self.shared.lost(path, with_sources(&e)))?;
        let status = r.status();
        let v: Value = r.json().await.map_err(|e| self.shared.lost(path, with_sources(&e)))?;
        if !status.is_success() {
            return Err(server_error(path, status, &v));
        }
        Ok(v)
    }

    /// [`Self::render`], then checks that the prompt plus `max_tokens` fits a slot's
    /// context, as the CPU engine does, so an overflow is `context_overflow` with the
    /// numbers instead of whatever llama.cpp does at the end of its window. A text of
    /// `b` bytes has at most `b + 2` tokens (BOS, EOS), so `/tokenize` is asked only when
    /// that bound does not already prove the prompt fits.
    pub(super) async fn prompt_value(&self, prompt: &Prompt, max_tokens: u32) -> Result<Value, BackendError> {
        let value = self.render(prompt).await?;
        let n_ctx = self.shared.props.n_ctx as usize;
        let max_tokens = max_tokens as usize;
        let prompt_tokens = match &value {
            Value::Array(ids) => ids.len(),
            Value::String(text) if n_ctx == 0 || text.len() + 2 + max_tokens <= n_ctx => return Ok(value),
            Value::String(_) => self.server_tokens(&value).await?.len(),
            _ => return Ok(value),
        };
        if n_ctx > 0 && prompt_tokens + max_tokens > n_ctx {
            return Err(BackendError::ContextOverflow {
                prompt_tokens,
                max_tokens,
                context_len: n_ctx,
            });
        }
        Ok(value)
    }

    /// The tokens of `value` (a `prompt` field) as the server computes them: text
    /// tokenized by its own `/tokenize` (special tokens added and parsed, as a
    /// completion's prompt is), token ids as they are.
    pub(super) async fn server_tokens(&self, value: &Value) -> Result<Vec<u32>, BackendError> {
        match value {
            Value::String(text) => {
                let body = json!({"content": text, "add_special": true, "parse_special": true});
                Ok(token_ids(&self.post("/tokenize", body).await?["tokens"]))
            }
            other => Ok(token_ids(other)),
        }
    }

    /// The prompt as llama.cpp's `prompt` field: text, token ids, or a conversation
    /// rendered by the server's template.
    pub(super) async fn render(&self, prompt: &Prompt) -> Result<Value, BackendError> {
        Ok(match prompt {
            Prompt::Text(t) if t.is_empty() => return Err(BackendError::EmptyPrompt),
            Prompt::Tokens(t) if t.is_empty() => return Err(BackendError::EmptyPrompt),
            Prompt::Text(t) => json!(t),
            Prompt::Tokens(t) => json!(t),
            Prompt::Continue { .. } => {
                return Err(BackendError::Invalid(
                    "resuming a stream is not supported by llama.cpp workers".into(),
                ))
            }
            Prompt::Chat { messages, kwargs, .. } => {
                let messages: Vec<Value> = messages
                    .iter()
                    .map(|m| json!({"role": m.role, "content": m.content}))
                    .collect();
                let mut body = json!({ "messages": messages });
                if !kwargs.is_empty() {
                    // Checked to be a JSON object by the worker's validation.
                    body["chat_template_kwargs"] = serde_json::from_str(kwargs).unwrap_or_default();
                }
                let rendered = self.post("/apply-template", body).await?;
                json!(rendered["prompt"].as_str().unwrap_or_default())
            }
        })
    }
}

/// The ids in a JSON array of token ids (none when it is not one).
fn token_ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .map(|a| a.iter().filter_map(|t| t.as_u64()).map(|t| t as u32).collect())
        .unwrap_or_default()
}

/// An error answer of the server, mapped onto our codes.
fn server_error(path: &str, status: reqwest::StatusCode, body: &Value) -> BackendError {
    let message = body["error"]["message"].as_str().unwrap_or("").to_string();
    if status == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        return unavailable(path, format!("{status} {message}"));
    }
    if message.contains("context") && message.contains("exceed") {
        return BackendError::Invalid(format!("llama.cpp: {message}"));
    }
    if status.is_client_error() {
        return BackendError::Invalid(format!("llama.cpp {path}: {status} {message}"));
    }
    BackendError::Compute(format!("llama.cpp {path}: {status} {message}"))
}

impl LlamaCppModel {
    /// Streams one completion into `tx` (on server slot `slot` when given); returns
    /// an error for the caller to send.
    pub(crate) async fn stream_completion(
        &self,
        prompt: Prompt,
        config: &GenerateConfig,
        cancel: &CancelFlag,
        tx: &tokio::sync::mpsc::Sender<Result<GenerateEvent, BackendError>>,
        slot: Option<u32>,
    ) -> Result<(), BackendError> {
        constraint_supported(config)?;
        // A default max_tokens needs only the prompt to fit: the server stops
        // generating where its slot's context ends.
        let room = if config.fit_max_tokens { 1 } else { config.max_tokens };
        let value = self.prompt_value(&prompt, room).await?;
        // What the slot holds afterwards, when the model's vocabulary is known here.
        let mut follow = self.shared.slots.as_ref().map(|book| {
            let pinned = self.shared.pinned.lock().unwrap_or_else(|p| p.into_inner()).clone();
            book.follow(&prompt, &value, slot, &pinned, config.adapter.as_deref())
        });
        let mut body = completion_body(value, config, true);
        if let Some(lora) = self.shared.adapters.param(config.adapter.as_deref())? {
            body["lora"] = lora;
        }
        let slot = follow.as_ref().map_or(slot, |f| f.slot());
        if let Some(slot) = slot {
            body["id_slot"] = json!(slot);
        }
        // KV pulled from a peer for this prompt goes into its slot first.
        let restored = match slot {
            Some(slot) => {
                self.restore_pulled(&body["prompt"], slot, config.adapter.as_deref())
                    .await
            }
            None => 0,
        };
        if restored == 0 && follow.as_ref().is_some_and(|f| f.fresh()) {
            body["cache_prompt"] = json!(false);
        }
        // W3C trace context to the server, so a tracing-aware proxy or server joins
        // the request's trace.
        let mut request = self.shared.http.post(format!("{}/completion", self.url()));
        for (k, v) in switchyard_fabric::trace::http_headers(&tracing::Span::current()) {
            request = request.header(k, v);
        }
        let request = request.json(&body);
        let again = request.try_clone();
        let r = match (request.send().await, again) {
            (Ok(r), _) => r,
            // A pooled connection the server closed as the request went out: nothing
            // was generated, so it goes once more on a fresh connection.
            (Err(e), Some(again)) if closed_before_answer(&e) => {
                tracing::warn!(url = %self.url(), "llama.cpp /completion: {}; sending it again", with_sources(&e));
                again
                    .send()
                    .await
                    .map_err(|e| self.shared.lost("/completion", with_sources(&e)))?
            }
            (Err(e), _) => return Err(self.shared.lost("/completion", with_sources(&e))),
        };
        let status = r.status();
        if !status.is_success() {
            let v: Value = r.json().await.unwrap_or_default();
            return Err(server_error("/completion", status, &v));
        }
        if let Some(f) = &mut follow {
            f.accepted();
        }
        let mut body = r.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        let mut generated = 0u32;
        loop {
            if cancel.is_cancelled() {
                // Dropping the response stops the server's generation.
                if let Some(f) = follow.take() {
                    f.settle(false).await;
                }
                let done = GenerateEvent::Done {
                    finish_reason: FinishReason::Cancelled,
                    metrics: GenerateMetrics::default(),
                };
                let _ = tx.send(Ok(done)).await;
                return Ok(());
            }
            let Some(chunk) = body.next().await else {
                return Err(self
                    .shared
                    .lost("went away mid-generation", "the stream ended without a final event"));
            };
            buf.extend_from_slice(&chunk.map_err(|e| self.shared.lost("went away mid-generation", with_sources(&e)))?);
            // Server-sent events: `data: {json}` lines separated by blank lines.
            while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = buf.drain(..end + 2).collect();
                let line = String::from_utf8_lossy(&event);
                let Some(data) = line.trim().strip_prefix("data:") else {
                    continue;
                };
                let v: Value = serde_json::from_str(data.trim())
                    .map_err(|e| BackendError::Compute(format!("llama.cpp sent a bad event: {e}")))?;
                if let Some(err) = v.get("error") {
                    return Err(BackendError::Compute(format!("llama.cpp: {err}")));
                }
                let text = v["content"].as_str().unwrap_or_default();
                let ids = token_ids(&v["tokens"]);
                let probs = v["completion_probabilities"].as_array();
                if let Some(f) = &mut follow {
                    f.saw(&v, &ids);
                }
                for (i, id) in ids.iter().enumerate() {
                    if config.stop_tokens.contains(id) {
                        if let Some(f) = follow.take() {
                            f.settle(false).await;
                        }
                        let done = GenerateEvent::Done {
                            finish_reason: FinishReason::Stop,
                            metrics: GenerateMetrics {
                                generated_tokens: generated,
                                ..GenerateMetrics::default()
                            },
                        };
                        let _ = tx.send(Ok(done)).await;
                        return Ok(());
                    }
                    generated += 1;
                    let token = Token {
                        id: *id,
                        text: if i == 0 { text.to_string() } else { String::new() },
                        logprob: config.logprobs.and_then(|n| {
                            let p = probs.and_then(|p| p.get(i))?;
                            token_logprob(p, n as usize)
                        }),
                        reasoning: false,
                    };
                    if tx.send(Ok(GenerateEvent::Token(token))).await.is_err() {
                        return Ok(()); // the caller went away
                    }
                }
                if v["stop"].as_bool() == Some(true) {
                    let mut metrics = metrics_from(&v["timings"]);
                    if v["stop_type"].as_str() == Some("word") {
                        metrics.stop_sequence = v["stopping_word"].as_str().map(str::to_string);
                    }
                    *self.shared.last_metrics.lock().unwrap_or_else(|p| p.into_inner()) = metrics.clone();
                    if let Some(f) = follow.take() {
                        f.settle(true).await;
                    }
                    let finish_reason = match v["stop_type"].as_str() {
                        Some("limit") => FinishReason::Length,
                        _ => FinishReason::Stop,
                    };
                    let _ = tx.send(Ok(GenerateEvent::Done { finish_reason, metrics })).await;
                    return Ok(());
                }
            }
        }
    }
}

/// The width of the server's embeddings, asked once at connect (one token's
/// embedding); 0 when it does not embed (started without `--embeddings`).
async fn embedding_dim(http: &reqwest::Client, url: &str) -> u32 {
    let probe = http
        .post(format!("{url}/v1/embeddings"))
        .json(&json!({"input": "a"}))
        .timeout(Duration::from_secs(30))
        .send()
        .await;
    match probe {
        Ok(r) if r.status().is_success() => r.json::<Value>().await.unwrap_or_default()["data"][0]["embedding"]
            .as_array()
            .map_or(0, |v| v.len() as u32),
        _ => 0,
    }
}

async fn fetch_props(http: &reqwest::Client, url: &str) -> Result<ServerProps, BackendError> {
    let props: Value = http
        .get(format!("{url}/props"))
        .send()
        .await
        .map_err(|e| unavailable("/props", e))?
        .json()
        .await
        .map_err(|e| unavailable("/props", e))?;
    let n_ctx = props["default_generation_settings"]["n_ctx"]
        .as_u64()
        .or_else(|| props["n_ctx"].as_u64())
        .unwrap_or(0);
    Ok(ServerProps {
        model_path: props["model_path"].as_str().unwrap_or_default().to_string(),
        model_alias: props["model_alias"].as_str().unwrap_or_default().to_string(),
        n_ctx: n_ctx as u32,
        total_slots: props["total_slots"].as_u64().unwrap_or(1).max(1) as u32,
        chat_template: props["chat_template"].as_str().unwrap_or_default().to_string(),
        build_info: props["build_info"].as_str().unwrap_or_default().to_string(),
    })
}

/// Keeps [`Shared::healthy`] equal to "`/health` answers 200", for as long as the
/// model lives; logs each change. When the server comes back it must still serve the
/// same model, else the worker stays unavailable (and says why).
async fn health_loop(shared: Weak<Shared>) {
    let mut tick = tokio::time::interval(HEALTH_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(s) = shared.upgrade() else { return };
        let url = s.url();
        let up = matches!(
            s.http.get(format!("{url}/health")).timeout(Duration::from_secs(2)).send().await,
            Ok(r) if r.status().is_success()
        );
        let was = s.healthy.load(Ordering::Acquire);
        if up && !was {
            match fetch_props(&s.http, &url).await {
                Ok(p) if p.model_path == s.props.model_path => {
                    // It may have restarted: what its slots held is not known.
                    if let Some(book) = &s.slots {
                        book.forget();
                    }
                    s.healthy.store(true, Ordering::Release);
                    tracing::info!(%url, "llama.cpp server is back; available again");
                }
                Ok(p) => tracing::warn!(
                    %url,
                    "llama.cpp server came back serving {} instead of {}; staying unavailable",
                    p.model_path,
                    s.props.model_path
                ),
                Err(e) => tracing::debug!(%url, "llama.cpp server answers /health but not /props: {e}"),
            }
        } else if !up && was {
            s.healthy.store(false, Ordering::Release);
            tracing::warn!(%url, "llama.cpp server stopped answering /health; marked unavailable");
        }
    }
}
