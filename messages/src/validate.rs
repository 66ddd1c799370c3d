//! What every receiver checks before acting, and the input limits it checks against.
//!
//! One function per envelope, the same in a coordinator and a worker, so a request
//! refused on one path is refused on every path: [`validate_request`] (generate,
//! chat), [`validate_classify`], [`validate_batch`], [`validate_decode`] and
//! [`validate_segment`] (session calls), [`validate_session_call`]. Each refusal is a
//! [`WireError`] with `bad_request` (or `unsupported_version`) whose message names the
//! field or the limit, e.g. `config.max_tokens 9000 is over limits.max_tokens = 8192`.

use crate::session::{DecodeRequest, OpenSessionRequest, SegmentRequest};
use crate::{
    BatchRequest, ClassifyRequest, EmbedInput, EmbedRequest, ErrorCode, GenerateConfig, GenerateRequest, RequestHead,
    WireError, PROTOCOL_VERSION,
};
use serde::{Deserialize, Serialize};

/// Bounds on what one request may ask for (config section `[limits]`). Defaults fit
/// the default NATS `max_payload` (1 MiB) and a long-context model; every field can
/// be raised or lowered, and a request over any of them is refused with
/// `bad_request` naming the field. Prompt *tokens* are bounded by the worker's
/// context window (`worker.context_len`, a session's `num_ctx`): over it is
/// `context_overflow`, before any compute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InputLimits {
    /// Bytes of one prompt: a generate prompt, the sum of a chat's message contents,
    /// each classify or batch prompt.
    pub max_prompt_bytes: u32,
    /// Messages in one chat request.
    pub max_messages: u32,
    /// `config.stop` entries.
    pub max_stop_strings: u32,
    /// Bytes of one stop string.
    pub max_stop_bytes: u32,
    /// `config.stop_tokens` entries.
    pub max_stop_tokens: u32,
    /// `config.max_tokens`.
    pub max_tokens: u32,
    /// Prompts in one batch request.
    pub max_batch_prompts: u32,
    /// Prompts in one classify request.
    pub max_classify_prompts: u32,
    /// Prompts in one classify request with `return_logits` (each reply carries the
    /// whole vocabulary's logits: 4 bytes × vocabulary size).
    pub max_logits_prompts: u32,
    /// Bytes of a session's `ensure_prefix` or `prefill_suffix` text.
    pub max_session_text_bytes: u32,
    /// Bytes of `config.constraint`'s schema, pattern or grammar.
    pub max_constraint_bytes: u32,
    /// Tools in one chat request.
    pub max_tools: u32,
    /// Bytes of all of a chat's tools (names, descriptions, parameter schemas).
    pub max_tool_bytes: u32,
}

impl Default for InputLimits {
    fn default() -> Self {
        Self {
            max_prompt_bytes: 1 << 20,
            max_messages: 1024,
            max_stop_strings: 16,
            max_stop_bytes: 256,
            max_stop_tokens: 64,
            max_tokens: 32_768,
            max_batch_prompts: 64,
            max_classify_prompts: 64,
            max_logits_prompts: 4,
            max_session_text_bytes: 1 << 20,
            max_constraint_bytes: 256 << 10,
            max_tools: 128,
            max_tool_bytes: 256 << 10,
        }
    }
}

fn bad(message: String) -> WireError {
    WireError::new(ErrorCode::BadRequest, message)
}

/// `value` (a count or a size) against `limit`, naming both.
fn within(what: &str, value: usize, field: &str, limit: u32) -> Result<(), WireError> {
    if value > limit as usize {
        return Err(bad(format!("{what} {value} is over limits.{field} = {limit}")));
    }
    Ok(())
}

/// A version this build speaks (`unsupported_version` otherwise).
pub fn check_version(v: u32) -> Result<(), WireError> {
    if v > PROTOCOL_VERSION {
        return Err(WireError::new(
            ErrorCode::UnsupportedVersion,
            format!("protocol version {v} is newer than {PROTOCOL_VERSION}"),
        ));
    }
    Ok(())
}

/// A request id that can form `{p}.v1.cancel.{request_id}`.
pub fn check_request_id(request_id: &str) -> Result<(), WireError> {
    if !crate::subjects::is_valid_token(request_id) {
        return Err(bad(format!(
            "request_id {request_id:?} must be 1-128 characters of letters, digits, '-' or '_'"
        )));
    }
    Ok(())
}

/// The head's own rules: a version this build speaks, a well-formed request id.
fn check_head(head: &RequestHead) -> Result<(), WireError> {
    check_version(head.v)?;
    check_request_id(&head.request_id)?;
    if let Some(t) = &head.tenant {
        if t.len() > MAX_TENANT_BYTES || t.chars().any(char::is_control) {
            return Err(bad(format!(
                "tenant {t:?} must be at most {MAX_TENANT_BYTES} bytes without control characters"
            )));
        }
    }
    if let Some(a) = &head.adapter {
        check_adapter_name(a)?;
    }
    Ok(())
}

/// An adapter's name: what a request may name and a worker may load (1.10): 1-128
/// characters, none of them a control character, `:` or whitespace (the gateway reads
/// `base:adapter` model names).
pub fn check_adapter_name(name: &str) -> Result<(), WireError> {
    let bad_char = |c: char| c.is_control() || c.is_whitespace() || c == ':';
    if name.is_empty() || name.len() > MAX_TENANT_BYTES || name.chars().any(bad_char) {
        return Err(bad(format!(
            "adapter {name:?} must be 1-{MAX_TENANT_BYTES} bytes without ':', spaces or control characters"
        )));
    }
    Ok(())
}

/// LoRA adapters change generation (generate, chat, batch); a prefill-only request
/// naming one is refused rather than answered by the base model.
fn no_adapter(head: &RequestHead, what: &str) -> Result<(), WireError> {
    match &head.adapter {
        Some(a) => Err(bad(format!(
            "{what} requests run on the base model: adapter {a:?} applies to generate, chat and batch"
        ))),
        None => Ok(()),
    }
}

/// The longest `tenant` a request may name.
pub const MAX_TENANT_BYTES: usize = 128;

/// Generation settings: finite, in range, within the limits.
pub fn validate_config(c: &GenerateConfig, limits: &InputLimits) -> Result<(), WireError> {
    if c.max_tokens == 0 {
        return Err(bad("config.max_tokens must be at least 1".into()));
    }
    within(
        "config.max_tokens",
        c.max_tokens as usize,
        "max_tokens",
        limits.max_tokens,
    )?;
    if !(c.temperature.is_finite() && c.temperature >= 0.0) {
        return Err(bad(format!(
            "config.temperature {} must be finite and >= 0",
            c.temperature
        )));
    }
    if let Some(n) = c.logprobs.filter(|&n| n > crate::MAX_TOP_LOGPROBS) {
        return Err(bad(format!(
            "config.logprobs {n}: at most {} alternatives per token",
            crate::MAX_TOP_LOGPROBS
        )));
    }
    if !(c.top_p.is_finite() && (0.0..=1.0).contains(&c.top_p)) {
        return Err(bad(format!("config.top_p {} must be within [0, 1]", c.top_p)));
    }
    if !(c.min_p.is_finite() && (0.0..=1.0).contains(&c.min_p)) {
        return Err(bad(format!("config.min_p {} must be within [0, 1]", c.min_p)));
    }
    for (name, v) in [
        ("presence_penalty", c.presence_penalty),
        ("frequency_penalty", c.frequency_penalty),
    ] {
        if !(v.is_finite() && (-2.0..=2.0).contains(&v)) {
            return Err(bad(format!("config.{name} {v} must be within [-2, 2]")));
        }
    }
    if !(c.repeat_penalty.is_finite() && c.repeat_penalty >= 0.0) {
        return Err(bad(format!(
            "config.repeat_penalty {} must be finite and >= 0",
            c.repeat_penalty
        )));
    }
    within(
        "config.rng_position",
        usize::try_from(c.rng_position).unwrap_or(usize::MAX),
        "max_tokens",
        limits.max_tokens,
    )?;
    within(
        "config.stop has",
        c.stop.len(),
        "max_stop_strings",
        limits.max_stop_strings,
    )?;
    for s in &c.stop {
        if s.is_empty() {
            return Err(bad("config.stop has an empty string".into()));
        }
        within(
            "a config.stop string of bytes",
            s.len(),
            "max_stop_bytes",
            limits.max_stop_bytes,
        )?;
    }
    within(
        "config.stop_tokens has",
        c.stop_tokens.len(),
        "max_stop_tokens",
        limits.max_stop_tokens,
    )?;
    if let Some(constraint) = &c.constraint {
        within(
            &format!("config.constraint ({}) bytes", constraint.kind()),
            constraint.text_len(),
            "max_constraint_bytes",
            limits.max_constraint_bytes,
        )?;
        if constraint.text_len() == 0 && *constraint != crate::Constraint::JsonObject {
            return Err(bad(format!("config.constraint ({}) is empty", constraint.kind())));
        }
    }
    Ok(())
}

/// A tool's name as OpenAI allows it: 1-64 letters, digits, `_` or `-`.
pub fn is_valid_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A chat's tools, tool choice and the tool turns of its history.
fn check_tools(req: &GenerateRequest, chat: bool, limits: &InputLimits) -> Result<(), WireError> {
    use crate::ToolChoice;
    if !chat && !req.tools.is_empty() {
        return Err(bad("tools are only for chat requests".into()));
    }
    within("tools has", req.tools.len(), "max_tools", limits.max_tools)?;
    let bytes: usize = req
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.len())
        .sum();
    within("the tools' bytes", bytes, "max_tool_bytes", limits.max_tool_bytes)?;
    for (i, t) in req.tools.iter().enumerate() {
        if !is_valid_tool_name(&t.name) {
            return Err(bad(format!(
                "tools[{i}].name {:?} must be 1-64 letters, digits, '_' or '-'",
                t.name
            )));
        }
        if req.tools[..i].iter().any(|o| o.name == t.name) {
            return Err(bad(format!("tools[{i}].name {:?} is given twice", t.name)));
        }
    }
    match &req.tool_choice {
        ToolChoice::Required if req.tools.is_empty() => {
            Err(bad("tool_choice \"required\" needs at least one tool".into()))
        }
        ToolChoice::Function { name } if !req.tools.iter().any(|t| &t.name == name) => Err(bad(format!(
            "tool_choice names function {name:?}, which is not among the request's tools"
        ))),
        ToolChoice::Required | ToolChoice::Function { .. } if req.config.constraint.is_some() => Err(bad(
            "config.constraint cannot be combined with tool_choice required or a named function".into(),
        )),
        _ => Ok(()),
    }
}

/// A generate (`chat == false`) or chat request.
pub fn validate_request(req: &GenerateRequest, chat: bool, limits: &InputLimits) -> Result<(), WireError> {
    check_head(&req.head)?;
    if chat {
        let messages = match &req.messages {
            None => return Err(bad("chat request has no messages field".into())),
            Some(m) if m.is_empty() => return Err(bad("chat request has an empty messages list".into())),
            Some(m) => m,
        };
        within("messages has", messages.len(), "max_messages", limits.max_messages)?;
        let bytes: usize = messages
            .iter()
            .map(|m| {
                let calls: usize = m
                    .tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.name.len() + c.arguments.len())
                    .sum();
                m.content.len() + calls + m.tool_call_id.as_ref().map_or(0, String::len)
            })
            .sum();
        within(
            "the messages' content bytes",
            bytes,
            "max_prompt_bytes",
            limits.max_prompt_bytes,
        )?;
    } else {
        match &req.prompt {
            None => return Err(bad("generate request has no prompt field".into())),
            Some(p) if p.is_empty() => return Err(bad("prompt is empty".into())),
            Some(p) => within("prompt bytes", p.len(), "max_prompt_bytes", limits.max_prompt_bytes)?,
        }
    }
    within(
        "resume_tokens has",
        req.resume_tokens.len(),
        "max_tokens",
        limits.max_tokens,
    )?;
    check_tools(req, chat, limits)?;
    check_template_kwargs(req, chat, limits)?;
    validate_config(&req.config, limits)
}

/// The names a chat template's own variables take: kwargs cannot replace them.
const TEMPLATE_VARIABLES: [&str; 5] = ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];

/// `chat_template_kwargs`: a JSON object, on a chat, within the prompt's byte limit,
/// naming none of the template's own variables.
fn check_template_kwargs(req: &GenerateRequest, chat: bool, limits: &InputLimits) -> Result<(), WireError> {
    if req.chat_template_kwargs.is_empty() {
        return Ok(());
    }
    if !chat {
        return Err(bad("chat_template_kwargs are only for chat requests".into()));
    }
    within(
        "chat_template_kwargs bytes",
        req.chat_template_kwargs.len(),
        "max_prompt_bytes",
        limits.max_prompt_bytes,
    )?;
    let v: serde_json::Value = serde_json::from_str(&req.chat_template_kwargs)
        .map_err(|e| bad(format!("chat_template_kwargs is not JSON: {e}")))?;
    let Some(map) = v.as_object() else {
        return Err(bad("chat_template_kwargs must be a JSON object".into()));
    };
    if let Some(name) = TEMPLATE_VARIABLES.iter().find(|n| map.contains_key(**n)) {
        return Err(bad(format!(
            "chat_template_kwargs cannot set {name:?}: the request's own fields fill it"
        )));
    }
    Ok(())
}

/// Prompts of a classify or batch request: at least one, each within the byte limit.
fn check_prompts(prompts: &[String], field: &str, limit: u32, limits: &InputLimits) -> Result<(), WireError> {
    if prompts.is_empty() {
        return Err(bad("prompts is empty".into()));
    }
    within("prompts has", prompts.len(), field, limit)?;
    for p in prompts {
        within("a prompt's bytes", p.len(), "max_prompt_bytes", limits.max_prompt_bytes)?;
    }
    Ok(())
}

/// A classify request.
pub fn validate_classify(req: &ClassifyRequest, limits: &InputLimits) -> Result<(), WireError> {
    check_head(&req.head)?;
    no_adapter(&req.head, "classify")?;
    check_prompts(
        &req.prompts,
        "max_classify_prompts",
        limits.max_classify_prompts,
        limits,
    )?;
    if req.return_logits {
        within(
            "prompts with return_logits has",
            req.prompts.len(),
            "max_logits_prompts",
            limits.max_logits_prompts,
        )?;
    }
    Ok(())
}

/// An embeddings request: 1 to [`crate::MAX_EMBED_INPUTS`] inputs, none empty, each
/// within the prompt size limit.
pub fn validate_embed(req: &EmbedRequest, limits: &InputLimits) -> Result<(), WireError> {
    check_head(&req.head)?;
    no_adapter(&req.head, "embed")?;
    if req.inputs.is_empty() {
        return Err(bad("inputs is empty".into()));
    }
    if req.inputs.len() > crate::MAX_EMBED_INPUTS {
        return Err(bad(format!(
            "inputs has {} entries; at most {}",
            req.inputs.len(),
            crate::MAX_EMBED_INPUTS
        )));
    }
    for (i, input) in req.inputs.iter().enumerate() {
        let (empty, bytes) = match input {
            EmbedInput::Text(t) => (t.is_empty(), t.len()),
            EmbedInput::Tokens(t) => (t.is_empty(), t.len() * 4),
        };
        if empty {
            return Err(bad(format!("inputs[{i}] is empty")));
        }
        within(
            &format!("inputs[{i}]'s bytes"),
            bytes,
            "max_prompt_bytes",
            limits.max_prompt_bytes,
        )?;
    }
    Ok(())
}

/// A batch request: its prompts and the one config they share.
pub fn validate_batch(req: &BatchRequest, limits: &InputLimits) -> Result<(), WireError> {
    check_head(&req.head)?;
    check_prompts(&req.prompts, "max_batch_prompts", limits.max_batch_prompts, limits)?;
    validate_config(&req.config, limits)
}

/// A session `open` (through a coordinator, and again on the worker).
pub fn validate_open(req: &OpenSessionRequest) -> Result<(), WireError> {
    check_version(req.v)?;
    if req.fence.is_empty() {
        return Err(bad("fence (the owner instance id) is required".into()));
    }
    Ok(())
}

/// `explain`, `describe`, `close`: a version this build speaks. (The owner check is
/// the session's: the fence must equal the owner's, never empty.)
pub fn validate_session_call(v: u32) -> Result<(), WireError> {
    check_version(v)
}

/// `ensure_prefix` / `prefill_suffix`.
pub fn validate_segment(req: &SegmentRequest, limits: &InputLimits) -> Result<(), WireError> {
    check_version(req.v)?;
    within(
        "text bytes",
        req.text.len(),
        "max_session_text_bytes",
        limits.max_session_text_bytes,
    )
}

/// A session `decode`: a cancellable request id and the same config rules as generate.
pub fn validate_decode(req: &DecodeRequest, limits: &InputLimits) -> Result<(), WireError> {
    check_version(req.v)?;
    check_request_id(&req.request_id)?;
    validate_config(&req.config, limits)
}

/// Fails with `deadline_exceeded` when `req.deadline_ms` is at or before `now_ms`.
pub fn check_deadline(req: &GenerateRequest, now_ms: u64) -> Result<(), WireError> {
    match req.head.deadline_ms {
        Some(d) if now_ms >= d => Err(WireError::new(
            ErrorCode::DeadlineExceeded,
            format!("the request's deadline passed {} ms ago", now_ms - d),
        )),
        _ => Ok(()),
    }
}
