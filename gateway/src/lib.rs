//! # switchyard-gateway — the OpenAI-compatible HTTP gateway (docs/gateway.md): OpenAI's API over HTTP on
//! one side, switchyard's protocol over NATS on the other. Stateless, so any number
//! run side by side, on any machine.
//!
//! - [`openai`]: request bodies, defaults, what is refused.
//! - [`anthropic`]: Anthropic's Messages API (`/v1/messages`), for Claude Code and
//!   the Anthropic SDKs.
//! - [`ollama`]: Ollama's API (`/api/*`), for Ollama's clients.
//! - [`responses`]: OpenAI's Responses API (`/v1/responses`) and its store.
//! - [`complete`]: chat and text completions, whole or streamed (SSE).
//! - [`keys`]: API keys (hashed), per-key models and limits.
//! - [`errors`]: errors in OpenAI's shape and status.
//! - [`metrics`]: GenAI client metrics per relayed request.
//! - `page.html`: the fleet page and chat playground at `/`.

pub mod anthropic;
pub mod complete;
mod cors;
mod embed;
pub mod errors;
pub mod keys;
pub mod metrics;
pub mod ollama;
pub mod openai;
pub mod reasoning;
pub mod responses;
pub mod structured;

use anyhow::{bail, Context};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use errors::ApiError;
use keys::KeyStore;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::Arc;
use switchyard_client::Client;
use switchyard_config::GatewayConfig;
use switchyard_messages::Subjects;
use tokio::task::JoinHandle;

/// What every handler shares.
pub struct Gateway {
    client: Client,
    subjects: Subjects,
    keys: KeyStore,
    max_body: u32,
    queue_timeout_ms: u64,
    /// Origins allowed to call from a browser (`*`: any).
    cors_origins: Vec<String>,
    /// Requested model names → the served model (`model` or `model:adapter`).
    aliases: std::collections::BTreeMap<String, String>,
    /// Stored `/v1/responses` (a JetStream key-value bucket).
    responses: responses::store::Store,
}

impl Gateway {
    /// The model a request naming `model` is for: an alias's target, else `model`.
    pub(crate) fn aliased<'a>(&'a self, model: &'a str) -> &'a str {
        self.aliases.get(model).map_or(model, String::as_str)
    }

    /// Readies a generation request for the fleet as every API does: aliases and
    /// adapters resolved, the key as the tenant, its priority unless the request
    /// gave one, the gateway's queue timeout bounding the wait for a worker.
    pub(crate) async fn prepare(&self, req: &mut switchyard_client::GenerateRequest, admitted: &keys::Admitted) {
        resolve_adapter(self, &mut req.head).await;
        req.head.tenant = Some(admitted.name().to_string()).filter(|n| !n.is_empty());
        req.head.priority = req.head.priority.or(admitted.priority());
        req.head.queue_ms = Some(self.queue_timeout_ms);
    }

    /// The `model` an answer names: what the request asked for, or for "any
    /// model" (`""`) the one the fleet serves when it serves one.
    pub(crate) async fn answering_model(&self, requested: &str) -> String {
        match requested {
            "" => match self.client.models().await {
                Ok(m) if m.models.len() == 1 => m.models[0].name.clone(),
                _ => String::new(),
            },
            m => m.to_string(),
        }
    }
}

/// A running gateway.
pub struct GatewayHandle {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl GatewayHandle {
    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://addr`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops listening and lets open responses finish.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut self.task).await;
        self.task.abort();
    }
}

/// Starts a gateway for the fleet `client` reaches, listening on `config.listen`.
/// Beyond loopback it refuses to start without API keys unless `allow_no_keys`.
pub async fn start(client: Client, prefix: &str, config: &GatewayConfig) -> anyhow::Result<GatewayHandle> {
    let keys = KeyStore::load(config)?;
    let addr: SocketAddr = config
        .listen
        .parse()
        .with_context(|| format!("gateway.listen {:?} is not host:port", config.listen))?;
    if !addr.ip().is_loopback() && !keys.enabled() && !config.allow_no_keys {
        bail!(
            "gateway.listen {addr} is beyond loopback and no API keys are configured (gateway.keys / \
             gateway.keys_file); anyone who reaches it could use the fleet. Add keys, or set \
             gateway.allow_no_keys = true (--allow-no-keys) to serve without them"
        );
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("gateway.listen: cannot listen on {addr}"))?;
    let addr = listener.local_addr()?;
    let state = Arc::new(Gateway {
        subjects: Subjects::new(prefix),
        keys,
        max_body: config.max_body_bytes,
        queue_timeout_ms: config.queue_timeout_ms,
        cors_origins: config.cors_origins.clone(),
        aliases: config.aliases.clone(),
        responses: responses::store::Store::new(client.nats().clone(), config),
        client,
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(complete::chat))
        .route("/v1/completions", post(complete::completion))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/v1/responses/{id}", get(responses::get).delete(responses::delete))
        .route("/v1/responses/{id}/input_items", get(responses::input_items))
        .route("/api/chat", post(ollama::chat))
        .route("/api/generate", post(ollama::generate))
        .route("/api/embed", post(ollama::embed))
        .route("/api/embeddings", post(ollama::embeddings))
        .route("/api/tags", get(ollama::tags))
        .route("/api/show", post(ollama::show))
        .route("/api/ps", get(ollama::ps))
        .route("/api/version", get(ollama::version))
        .route("/api/pull", post(ollama::not_here))
        .route("/api/push", post(ollama::not_here))
        .route("/api/create", post(ollama::not_here))
        .route("/api/copy", post(ollama::not_here))
        .route("/api/delete", axum::routing::delete(ollama::not_here))
        .route("/api/blobs/{digest}", post(ollama::not_here).head(ollama::not_here))
        .route("/v1/embeddings", post(embed::embeddings))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/fleet", get(fleet))
        .route("/health", get(health))
        .route("/", get(page))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(config.max_body_bytes as usize))
        .layer(axum::middleware::from_fn_with_state(state.clone(), cors::cors))
        .with_state(state);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.await;
        });
        if let Err(e) = serve.await {
            tracing::error!("gateway stopped: {e}");
        }
    });
    Ok(GatewayHandle {
        addr,
        stop: Some(stop),
        task,
    })
}

/// The first event of a stream about to be answered as events (SSE or NDJSON): an
/// error before it, or no event at all, is answered as an HTTP error instead.
pub(crate) async fn first_event(
    s: &mut switchyard_client::ResponseStream,
) -> Result<switchyard_client::StreamEvent, ApiError> {
    match s.next().await {
        Some(Ok(ev)) => Ok(ev),
        Some(Err(e)) => Err(e.into()),
        None => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "api_error",
            "worker_lost",
            "the stream ended at once",
        )),
    }
}

/// Continues the caller's W3C trace (`traceparent`, `tracestate`) in `span`.
fn continue_trace(span: &tracing::Span, headers: &HeaderMap) {
    let mut map = async_nats::HeaderMap::new();
    for name in ["traceparent", "tracestate"] {
        if let Some(v) = headers.get(name).and_then(|v| v.to_str().ok()) {
            map.insert(name, v);
        }
    }
    switchyard_fabric::trace::continue_from(span, Some(&map));
}

/// `GET /v1/models`: the fleet's models.
async fn models(State(g): State<Arc<Gateway>>, headers: HeaderMap) -> Result<Response, ApiError> {
    g.admit_listing(&headers)?;
    let reply = g.client.models().await?;
    Ok(axum::Json(json!({"object": "list", "data": g.listed(&reply)})).into_response())
}

impl Gateway {
    /// Admits a request that lists models: any valid key, also one restricted to
    /// some models (it may see them).
    pub(crate) fn admit_listing(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        self.keys.admit(headers, "").map(|_| ()).or_else(|e| match e.status {
            StatusCode::FORBIDDEN => Ok(()),
            _ => Err(e),
        })
    }

    /// `/v1/models`' entries: each served model and its adapters, then each alias
    /// whose target is among them (as its target's entry, under the alias's id, with
    /// `alias_of`). An alias hides a served model of its name (requests for that name
    /// go to the alias's target).
    fn listed(&self, reply: &switchyard_messages::ModelsReply) -> Vec<serde_json::Value> {
        let mut data: Vec<_> = reply.models.iter().flat_map(model_and_adapters).collect();
        let aliases: Vec<_> = self
            .aliases
            .iter()
            .filter_map(|(alias, target)| {
                let mut v = data.iter().find(|m| m["id"] == target.as_str())?.clone();
                v["id"] = json!(alias);
                v["alias_of"] = json!(target);
                Some(v)
            })
            .collect();
        data.retain(|m| !m["id"].as_str().is_some_and(|id| self.aliases.contains_key(id)));
        data.extend(aliases);
        data
    }
}

/// `GET /v1/models/{id}`: one model, as in the list; `model_not_found` (404) when
/// no worker serves it.
async fn model(
    State(g): State<Arc<Gateway>>,
    axum::extract::Path(id): axum::extract::Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    g.admit_listing(&headers)?;
    let reply = g.client.models().await?;
    let m = g
        .listed(&reply)
        .into_iter()
        .find(|m| m["id"] == id.as_str())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
                format!("the model {id:?} does not exist (no worker serves it)"),
            )
        })?;
    Ok(axum::Json(m).into_response())
}

/// A model's entry and, after it, one per LoRA adapter loaded on it: id
/// `model:adapter` (what requests send as `model`), `parent` the base model (as
/// vLLM lists served adapters), the workers holding it.
fn model_and_adapters(m: &switchyard_messages::ModelEntry) -> Vec<serde_json::Value> {
    let base = model_json(m);
    let mut all = Vec::with_capacity(1 + m.adapters.len());
    for a in &m.adapters {
        let mut v = base.clone();
        v["id"] = json!(format!("{}:{}", m.name, a.name));
        v["parent"] = json!(m.name);
        v["root"] = json!(m.name);
        v["workers"] = json!(a.workers.len());
        all.push(v);
    }
    all.insert(0, base);
    all
}

/// The model a request names, as the fleet serves it: an alias (`gateway.aliases`)
/// becomes its target (a served model of the alias's name is out of reach through
/// this gateway); then a `model` of
/// the form `base:adapter` that no worker serves under that whole name becomes model
/// `base` with LoRA adapter `adapter` (vLLM-style served adapter names).
pub(crate) async fn resolve_adapter(g: &Gateway, head: &mut switchyard_messages::RequestHead) {
    if let Some(target) = g.aliases.get(&head.model) {
        head.model = target.clone();
    }
    if head.adapter.is_some() {
        return;
    }
    let Some((base, adapter)) = head.model.rsplit_once(':') else {
        return;
    };
    if base.is_empty() || adapter.is_empty() {
        return;
    }
    let whole = match g.client.models().await {
        Ok(m) => m.models.iter().any(|m| m.name == head.model),
        Err(_) => false,
    };
    if !whole {
        let (base, adapter) = (base.to_string(), adapter.to_string());
        head.model = base;
        head.adapter = Some(adapter);
    }
}

fn model_json(m: &switchyard_messages::ModelEntry) -> serde_json::Value {
    let mut v = json!({"id": m.name, "object": "model", "created": 0, "owned_by": "switchyard",
                       "backends": m.backends, "workers": m.workers.len(), "context_length": m.info.context_len});
    if m.info.embedding_dim > 0 {
        // Served by `POST /v1/embeddings`, vectors of this width.
        v["embedding_dimension"] = json!(m.info.embedding_dim);
    }
    if m.info.embedding_only {
        // An embedding model: chat and completions are refused for it.
        v["embedding_only"] = json!(true);
    }
    v
}

/// `GET /v1/fleet`: what `switchyard status` shows, as JSON (the page reads it).
async fn fleet(State(g): State<Arc<Gateway>>) -> Result<Response, ApiError> {
    Ok(axum::Json(g.client.status().await?).into_response())
}

/// `GET /health`: 200 when a coordinator answers and sees a worker.
async fn health(State(g): State<Arc<Gateway>>) -> Response {
    match g.client.status().await {
        Ok(s) if !s.workers.is_empty() => {
            axum::Json(json!({"status": "ok", "workers": s.workers.len()})).into_response()
        }
        Ok(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "no workers"})),
        )
            .into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "no coordinator", "error": e.to_string()})),
        )
            .into_response(),
    }
}

/// `GET /`: the fleet page and chat playground, one static file in the binary.
async fn page() -> Html<&'static str> {
    Html(include_str!("page.html"))
}

/// A known path with another method: 405 in OpenAI's error shape.
async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}

async fn not_found() -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "not_found",
        "no such endpoint",
    )
}
