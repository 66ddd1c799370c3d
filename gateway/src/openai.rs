//! OpenAI's request bodies and how they become switchyard requests.
//!
//! Every field OpenAI defines is either honoured or refused with a 400 naming it —
//! never silently ignored. switchyard's own knobs (`top_k`, `min_p`,
//! `repeat_penalty`, `repeat_last_n`, `backend`, `worker`) are accepted as extra
//! fields, the way llama.cpp's server and vLLM accept theirs.

use super::errors::ApiError;
use serde::Deserialize;
use serde_json::{Map, Value};
use switchyard_client::{Client, GenerateRequest, Message};
use switchyard_messages::Priority;

/// Sampling defaults when a request does not say (llama.cpp server's, which Ollama's
/// nearly match): varied but focused text that does not loop. `temperature: 0` asks
/// for greedy decoding.
pub const DEFAULT_TEMPERATURE: f32 = 0.8;
/// See [`DEFAULT_TEMPERATURE`].
pub const DEFAULT_TOP_K: u32 = 40;
/// See [`DEFAULT_TEMPERATURE`].
pub const DEFAULT_TOP_P: f32 = 0.95;
/// See [`DEFAULT_TEMPERATURE`].
pub const DEFAULT_MIN_P: f32 = 0.05;
/// Tokens generated when a request gives neither `max_tokens` nor
/// `max_completion_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;
/// The most choices (`n`) one request asks for.
pub const MAX_CHOICES: u32 = 16;

/// Fills the sampling knobs a request left out with the chat defaults above; with
/// `temperature` 0 the others default to off (greedy). The gateway, `switchyard
/// chat` and `up --prompt` use it.
pub fn chat_defaults(
    c: &mut switchyard_messages::GenerateConfig,
    temperature: Option<f32>,
    top_k: Option<u32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
) {
    c.temperature = temperature.unwrap_or(DEFAULT_TEMPERATURE);
    let greedy = c.temperature == 0.0;
    c.top_k = top_k.unwrap_or(if greedy { 0 } else { DEFAULT_TOP_K });
    c.top_p = top_p.unwrap_or(if greedy { 0.0 } else { DEFAULT_TOP_P });
    c.min_p = min_p.unwrap_or(if greedy { 0.0 } else { DEFAULT_MIN_P });
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The sampling fields both endpoints share, and everything else the body held.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub stop: Option<Stop>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub n: Option<u32>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<u32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub user: Option<String>,
    // switchyard's extras
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<u32>,
    pub backend: Option<String>,
    pub worker: Option<String>,
    // structured output and tools
    pub response_format: Option<Value>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// switchyard's extras: a regular expression or a Lark grammar the answer must
    /// match (llguidance's dialect), like vLLM's `guided_regex` / `guided_grammar`.
    pub regex: Option<String>,
    pub grammar: Option<String>,
    /// switchyard's extra: `interactive` or `batch` when requests wait for a worker;
    /// OpenAI's `service_tier: "flex"` means `batch` too.
    pub priority: Option<String>,
    pub service_tier: Option<String>,
    /// `{"token id": bias}`, bias in −100..=100.
    pub logit_bias: Option<Map<String, Value>>,
    /// Reasoning models: variables for the chat template (`{"enable_thinking":
    /// false}`), how hard to think, thinking on or off (Qwen's and DashScope's
    /// spelling), and `reasoning_format: "none"` for the raw text, tags and all
    /// (llama.cpp's server's field; `auto` / `deepseek` split, the default).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub reasoning_effort: Option<String>,
    pub enable_thinking: Option<bool>,
    pub reasoning_format: Option<String>,
    /// Fields this gateway does not know.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(default)]
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// One message; `content` is a string or a list of text parts. An assistant turn
/// may carry the `tool_calls` it made; a `tool` turn names the call it answers.
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Value,
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(default)]
    pub model: String,
    pub prompt: Value,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<u32>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// Parses a JSON body, a parse failure being a 400 that says what was wrong.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(None, format!("invalid request body: {e}")))
}

/// Fields OpenAI defines that SDKs and frameworks send by default, at values that ask
/// nothing of the answer: accepted and ignored (`docs/gateway.md`). `metadata` only
/// tags a completion OpenAI stores; switchyard stores nothing, so any object is
/// neutral.
fn neutral(key: &str, v: &Value) -> bool {
    match key {
        "store" => v == &Value::Bool(false),
        "metadata" => v.is_object(),
        "modalities" => v.as_array().is_some_and(|m| m.iter().all(|x| x == "text")),
        _ => false,
    }
}

/// OpenAI's `logit_bias`, `{"token id": bias}`, as the wire's pairs (sorted by id).
fn logit_bias(map: Option<&Map<String, Value>>) -> Result<Vec<(u32, f32)>, ApiError> {
    let mut out = Vec::new();
    for (k, v) in map.into_iter().flatten() {
        let id = k
            .parse::<u32>()
            .map_err(|_| refuse("logit_bias", &format!("keys are token ids; {k:?} is not one")))?;
        let bias = v.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
            refuse(
                "logit_bias",
                &format!("token {id}: the bias must be a number from -100 to 100"),
            )
        })?;
        out.push((id, bias as f32));
    }
    if out.len() > 1024 {
        return Err(refuse("logit_bias", "at most 1024 tokens"));
    }
    out.sort_by_key(|p| p.0);
    Ok(out)
}

fn refuse(param: &str, why: &str) -> ApiError {
    ApiError::bad_request(Some(param.to_string()), format!("{param}: {why}"))
}

impl Sampling {
    /// Whether the answer streams.
    pub fn streams(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// Whether a streamed answer ends with a usage chunk.
    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }

    /// `logprobs` / `top_logprobs` as the wire's `config.logprobs`. Chat: `logprobs:
    /// true` and `top_logprobs` 0–20 (only with `logprobs: true`); completions: the
    /// legacy `logprobs: N`, N alternatives (0–20; OpenAI allows 5).
    fn logprobs(&self, chat: bool) -> Result<Option<u8>, ApiError> {
        let max = switchyard_messages::MAX_TOP_LOGPROBS as u64;
        let top = match self.top_logprobs {
            Some(n) if n as u64 > max => return Err(refuse("top_logprobs", &format!("must be 0 to {max}"))),
            t => t.map(|n| n as u8),
        };
        match (&self.logprobs, chat) {
            (None | Some(Value::Null) | Some(Value::Bool(false)), _) => match top {
                Some(_) if chat => Err(refuse("top_logprobs", "only with logprobs: true")),
                Some(_) => Err(refuse("top_logprobs", "a chat field; completions take logprobs: N")),
                None => Ok(None),
            },
            (Some(Value::Bool(true)), true) => Ok(Some(top.unwrap_or(0))),
            (Some(v), false) if v.as_u64().is_some_and(|n| n <= max) && top.is_none() => {
                Ok(v.as_u64().map(|n| n as u8))
            }
            (Some(_), true) => Err(refuse("logprobs", "must be true or false")),
            (Some(_), false) => Err(refuse("logprobs", &format!("must be an integer from 0 to {max}"))),
        }
    }

    /// Refuses what cannot be honoured, then fills `req.config` and the pins.
    pub fn apply(&self, req: &mut GenerateRequest) -> Result<(), ApiError> {
        if let Some((k, _)) = self.rest.iter().find(|(k, v)| !v.is_null() && !neutral(k, v)) {
            return Err(refuse(
                k,
                "not supported by this gateway (docs/gateway.md lists the fields it takes)",
            ));
        }
        for (name, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if v.is_some_and(|v| !(v.is_finite() && (-2.0..=2.0).contains(&v))) {
                return Err(refuse(name, "must be between -2.0 and 2.0"));
            }
        }
        if self.n.is_some_and(|n| !(1..=MAX_CHOICES).contains(&n)) {
            return Err(refuse("n", &format!("must be 1 to {MAX_CHOICES}")));
        }
        let chat = req.messages.is_some();
        let logprobs = self.logprobs(chat)?;
        if !chat {
            for (name, given) in [
                ("chat_template_kwargs", self.chat_template_kwargs.is_some()),
                ("reasoning_effort", self.reasoning_effort.is_some()),
                ("enable_thinking", self.enable_thinking.is_some()),
                ("reasoning_format", self.reasoning_format.is_some()),
            ] {
                if given {
                    return Err(refuse(name, "a chat field (a completion's prompt is not templated)"));
                }
            }
        } else {
            req.chat_template_kwargs = super::reasoning::Thinking {
                kwargs: self.chat_template_kwargs.as_ref(),
                enabled: self.enable_thinking,
                effort: self.reasoning_effort.as_deref(),
                effort_field: "reasoning_effort",
            }
            .template_kwargs()?;
            req.split_reasoning = match self.reasoning_format.as_deref() {
                None | Some("auto" | "deepseek" | "deepseek-legacy") => true,
                Some("none") => false,
                Some(_) => return Err(refuse("reasoning_format", "must be auto, deepseek or none")),
            };
        }
        if self.stream_options.is_some() && !self.streams() {
            return Err(refuse("stream_options", "only with stream: true"));
        }
        let c = &mut req.config;
        // Without a limit from the request, generate up to the window (as OpenAI,
        // vLLM and llama.cpp do), at most DEFAULT_MAX_TOKENS: the worker fits it to
        // what the window leaves after the prompt instead of refusing.
        let asked = self.max_completion_tokens.or(self.max_tokens);
        c.max_tokens = asked.unwrap_or(DEFAULT_MAX_TOKENS);
        c.fit_max_tokens = asked.is_none();
        chat_defaults(c, self.temperature, self.top_k, self.top_p, self.min_p);
        if let Some(p) = self.repeat_penalty {
            c.repeat_penalty = p;
        }
        c.presence_penalty = self.presence_penalty.unwrap_or(0.0);
        c.frequency_penalty = self.frequency_penalty.unwrap_or(0.0);
        if let Some(n) = self.repeat_last_n {
            c.repeat_last_n = n;
        }
        c.logit_bias = logit_bias(self.logit_bias.as_ref())?;
        c.logprobs = logprobs;
        // OpenAI's seed is a signed integer; its bits are the sampler's seed.
        c.seed = self.seed.map(|s| s as u64);
        c.stop = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        req.head.backend = self.backend.clone().filter(|b| !b.is_empty());
        req.head.worker = self.worker.clone().filter(|w| !w.is_empty());
        req.head.priority = match (self.priority.as_deref(), self.service_tier.as_deref()) {
            (Some(p), _) => {
                Some(Priority::parse(p).ok_or_else(|| refuse("priority", "must be \"interactive\" or \"batch\""))?)
            }
            (None, Some("flex")) => Some(Priority::Batch),
            (None, Some("auto" | "default" | "priority" | "scale")) => Some(Priority::Interactive),
            (None, Some(_)) => {
                return Err(refuse(
                    "service_tier",
                    "must be auto, default, flex (served as batch), scale or priority",
                ))
            }
            (None, None) => None,
        };
        c.constraint = super::structured::constraint(
            self.response_format.as_ref(),
            self.regex.as_deref(),
            self.grammar.as_deref(),
        )?;
        super::structured::tools(
            req,
            self.tools.as_deref(),
            self.tool_choice.as_ref(),
            self.parallel_tool_calls,
        )?;
        Ok(())
    }
}

/// A message's text: a string, or the concatenated `text` parts of a list.
fn content_text(i: usize, content: &Value) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(refuse(
                            &format!("messages[{i}].content"),
                            &format!("content part of type {kind:?} is not supported (text only)"),
                        ))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(refuse(
            &format!("messages[{i}].content"),
            "must be a string or a list of text parts",
        )),
    }
}

impl ChatRequest {
    /// The switchyard chat request.
    pub fn to_request(&self) -> Result<GenerateRequest, ApiError> {
        if self.messages.is_empty() {
            return Err(refuse("messages", "must not be empty"));
        }
        let mut messages = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                other => {
                    return Err(refuse(
                        &format!("messages[{i}].role"),
                        &format!("{other:?} is not supported (system, developer, user, assistant, tool)"),
                    ))
                }
            };
            let mut message = Message::new(role, content_text(i, &m.content)?);
            if let Some(calls) = &m.tool_calls {
                message.tool_calls = super::structured::history_calls(i, calls)?;
            }
            if role == "tool" {
                match &m.tool_call_id {
                    Some(id) if !id.is_empty() => message.tool_call_id = Some(id.clone()),
                    _ => {
                        return Err(refuse(
                            &format!("messages[{i}].tool_call_id"),
                            "a tool message must name the call it answers",
                        ))
                    }
                }
            }
            messages.push(message);
        }
        let mut req = GenerateRequest::chat(Client::new_request_id(), self.model.clone(), messages);
        self.sampling.apply(&mut req)?;
        Ok(req)
    }
}

impl CompletionRequest {
    /// The switchyard generate request.
    pub fn to_request(&self) -> Result<GenerateRequest, ApiError> {
        let prompt = match &self.prompt {
            Value::String(s) => s.clone(),
            Value::Array(a) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
            Value::Array(_) => {
                return Err(refuse(
                    "prompt",
                    "exactly one prompt string per request (a list of one is accepted)",
                ))
            }
            _ => return Err(refuse("prompt", "must be a string")),
        };
        if self.echo == Some(true) {
            return Err(refuse("echo", "not supported"));
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(refuse("suffix", "not supported (no fill-in-the-middle)"));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(refuse("best_of", "only 1 is supported"));
        }
        let mut req = GenerateRequest::generate(Client::new_request_id(), self.model.clone(), prompt);
        if self.sampling.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(refuse("tools", "tools are for /v1/chat/completions"));
        }
        self.sampling.apply(&mut req)?;
        Ok(req)
    }
}
