//! Constrained decoding: a request's [`Constraint`] (JSON schema, any JSON object,
//! regex, Lark grammar) compiled by [llguidance] against this model's vocabulary,
//! and a [`Guide`] per generation that keeps every sampled token inside it.
//!
//! llguidance is the grammar library llama.cpp, vLLM and mistral.rs use: it builds a
//! token trie from each token's bytes (ours come from the GGUF or tokenizer.json, the
//! same bytes the streaming decoder emits; control tokens are marked so no grammar
//! produces them as text) and computes the set of tokens that keep the text a
//! prefix of the language.
//!
//! Cost: a full mask is computed only when the sampled token is rejected. The token
//! sampled from the unconstrained logits is checked first (a few microseconds); only
//! when the grammar rejects it is the mask computed, applied, and the token sampled
//! again. Accepting the first draw when it is allowed and redrawing from the masked
//! distribution otherwise gives exactly the masked distribution (what Ollama does).

use super::sampler::Sampler;
use super::text::tokenizer::GgufTokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::{Arc, OnceLock};
use switchyard_backend::BackendError;
use switchyard_messages::Constraint;

/// The model's vocabulary as llguidance sees it.
struct Vocab {
    trie: TokTrie,
    tokenizer: Arc<GgufTokenizer>,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self
                .tokenizer
                .encode_segment(text, false)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(s)),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        // Our encoder recognises control tokens written in text; llguidance then
        // does not rely on forced-token tokenization.
        false
    }
}

/// Grammars for one model: the parser factory (built on first use: a trie of the
/// whole vocabulary) and what a [`Guide`] needs to map end-of-generation ids.
pub struct Grammars {
    tokenizer: Arc<GgufTokenizer>,
    factory: OnceLock<Result<Arc<ParserFactory>, String>>,
}

impl Grammars {
    /// Grammars over `tokenizer`'s vocabulary (nothing is built until the first
    /// constrained request).
    pub fn new(tokenizer: Arc<GgufTokenizer>) -> Self {
        Self {
            tokenizer,
            factory: OnceLock::new(),
        }
    }

    fn factory(&self) -> Result<Arc<ParserFactory>, BackendError> {
        let built = self.factory.get_or_init(|| {
            let tok = &self.tokenizer;
            let eos = tok.eog_ids().first().copied().unwrap_or(0);
            let words: Vec<Vec<u8>> = (0..tok.vocab_size() as u32)
                .map(|id| {
                    let bytes = tok.token_bytes(id);
                    if tok.is_control(id) && !bytes.is_empty() {
                        // llguidance's marker for special tokens: a grammar can name
                        // them (`<|im_end|>`) but text never matches them.
                        let mut w = Vec::with_capacity(bytes.len() + 1);
                        w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                        w.extend_from_slice(bytes);
                        w
                    } else {
                        bytes.to_vec()
                    }
                })
                .collect();
            let info = TokRxInfo::new(words.len() as u32, eos);
            let trie = TokTrie::from(&info, &words);
            let env: TokEnv = Arc::new(Vocab {
                trie,
                tokenizer: tok.clone(),
            });
            let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
            factory.quiet();
            Ok(Arc::new(factory))
        });
        built
            .clone()
            .map_err(|e| BackendError::Compute(format!("building the grammar vocabulary: {e}")))
    }

    /// Compiles `constraint`; a schema or grammar llguidance cannot compile is
    /// [`BackendError::Invalid`] with its message (which names the place).
    pub fn compile(&self, constraint: &Constraint) -> Result<Guide, BackendError> {
        let grammar = top_level(constraint)?;
        let factory = self.factory()?;
        let parser = factory
            .create_parser(grammar)
            .map_err(|e| invalid(constraint, &locate_in(constraint, &e.to_string())))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(invalid(constraint, &e));
        }
        let tok = &self.tokenizer;
        Ok(Guide {
            matcher,
            eos: tok.eog_ids().first().copied().unwrap_or(0),
            eog: tok.eog_ids().to_vec(),
            vocab: tok.vocab_size(),
            masks: 0,
        })
    }
}

/// Whitespace JSON may hold between tokens: one space or tab, or one or two
/// newlines and up to 20 spaces or tabs of indent (llama.cpp's rule). llguidance's
/// default, any amount, lets a small model at temperature 1 write newlines until
/// `max_tokens`. The MLX bridge uses the same pattern.
pub const JSON_WHITESPACE: &str = r"[\x20\x09]|\x0A{1,2}[\x20\x09]{0,20}";

/// `schema` with llguidance's whitespace option set to [`JSON_WHITESPACE`], unless
/// it sets its own (`x-guidance`).
pub fn bounded_whitespace(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance")
            .or_insert_with(|| serde_json::json!({"whitespace_pattern": JSON_WHITESPACE}));
    }
    schema
}

/// The llguidance grammar of a constraint.
pub fn top_level(constraint: &Constraint) -> Result<TopLevelGrammar, BackendError> {
    Ok(match constraint {
        Constraint::JsonObject => {
            TopLevelGrammar::from_json_schema(bounded_whitespace(serde_json::json!({"type": "object"})))
        }
        Constraint::JsonSchema { schema } => {
            let value: serde_json::Value = serde_json::from_str(schema)
                .map_err(|e| invalid(constraint, &format!("the schema is not JSON: {e}")))?;
            TopLevelGrammar::from_json_schema(bounded_whitespace(value))
        }
        Constraint::Regex { pattern } => TopLevelGrammar::from_regex(pattern),
        Constraint::Lark { grammar } => TopLevelGrammar::from_lark(grammar.clone()),
        other => {
            return Err(BackendError::Invalid(format!(
                "config.constraint of type {} is not supported by this engine",
                other.kind()
            )))
        }
    })
}

/// A parser factory over single bytes: compiles grammars without a model, to check
/// them where no vocabulary is at hand (tool schemas in the worker, before admission).
fn checker() -> Result<&'static ParserFactory, String> {
    static CHECKER: OnceLock<Result<ParserFactory, String>> = OnceLock::new();
    CHECKER
        .get_or_init(|| {
            let mut f = ParserFactory::new_simple(&ApproximateTokEnv::single_byte_env()).map_err(|e| e.to_string())?;
            f.quiet();
            Ok(f)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether llguidance compiles `constraint`; its message, with the place in the
/// schema where it can be found, when not.
pub fn check(constraint: &Constraint) -> Result<(), BackendError> {
    let grammar = top_level(constraint)?;
    checker()
        .map_err(BackendError::Compute)?
        .create_parser(grammar)
        .map(|_| ())
        .map_err(|e| invalid(constraint, &locate_in(constraint, &e.to_string())))
}

/// Whether `schema` compiles as a JSON schema; the message (with the place) if not.
pub fn check_schema(schema: &Value) -> Result<(), String> {
    checker()?
        .create_parser(TopLevelGrammar::from_json_schema(schema.clone()))
        .map(|_| ())
        .map_err(|e| locate(schema, &e.to_string()))
}

fn locate_in(constraint: &Constraint, message: &str) -> String {
    match constraint {
        Constraint::JsonSchema { schema } => match serde_json::from_str::<Value>(schema) {
            Ok(v) => locate(&v, message),
            Err(_) => message.to_string(),
        },
        _ => message.to_string(),
    }
}

/// `message` from llguidance about `schema`, with the JSON pointer of what it names
/// (`Invalid type: X`, `Unknown format: X`, `Unimplemented keys: ["k"]`) when found.
pub fn locate(schema: &Value, message: &str) -> String {
    let quoted = |s: &str| s.split('"').nth(1).map(str::to_string);
    let tail = |prefix: &str| {
        message.find(prefix).map(|i| {
            message[i + prefix.len()..]
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        })
    };
    let target: Option<(&str, String)> = if let Some(t) = tail("Invalid type: ") {
        Some(("type", t))
    } else if let Some(f) = tail("Unknown format: ") {
        Some(("format", f))
    } else {
        tail("Unimplemented keys: ").and_then(|k| quoted(&k)).map(|k| ("", k))
    };
    let Some((key, value)) = target else {
        return message.to_string();
    };
    match find(schema, key, &value, String::new()) {
        Some(at) => format!("{message} (at {})", if at.is_empty() { "/" } else { &at }),
        None => message.to_string(),
    }
}

/// The pointer of the first object with `key: value` (or, when `key` is empty, with
/// the key `value`), depth first.
fn find(v: &Value, key: &str, value: &str, at: String) -> Option<String> {
    match v {
        Value::Object(o) => {
            let hit = if key.is_empty() {
                o.contains_key(value)
            } else {
                match o.get(key) {
                    Some(Value::String(s)) => s == value,
                    Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(value)),
                    _ => false,
                }
            };
            if hit {
                return Some(at);
            }
            o.iter().find_map(|(k, child)| {
                find(
                    child,
                    key,
                    value,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                )
            })
        }
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, child)| find(child, key, value, format!("{at}/{i}"))),
        _ => None,
    }
}

fn invalid(constraint: &Constraint, message: &str) -> BackendError {
    BackendError::Invalid(format!("config.constraint ({}): {message}", constraint.kind()))
}

/// One generation's place in its grammar.
pub struct Guide {
    matcher: Matcher,
    /// The id llguidance treats as end of text; every id in `eog` maps to it.
    eos: u32,
    eog: Vec<u32>,
    vocab: usize,
    /// Full masks computed so far (tokens whose first draw was rejected).
    pub masks: u32,
}

impl Guide {
    /// Moves the grammar past tokens generated earlier (a resumed stream).
    pub fn replay(&mut self, tokens: &[u32]) -> Result<(), BackendError> {
        for &t in tokens {
            if !self.accept(t)? {
                return Err(BackendError::Invalid(format!(
                    "config.constraint: resumed token {t} does not fit the constraint"
                )));
            }
        }
        Ok(())
    }

    /// Samples the next token under the constraint and moves the grammar past it.
    pub fn sample(&mut self, sampler: &mut Sampler, logits: Vec<f32>, history: &[u32]) -> Result<u32, BackendError> {
        let mut first = logits.clone();
        let t = sampler.sample(&mut first, history);
        if self.accept(t)? {
            return Ok(t);
        }
        self.masks += 1;
        let mask = self.matcher.compute_mask().map_err(|e| self.failed(e))?;
        let eos_ok = mask.is_allowed(self.eos);
        let mut logits = logits;
        for (id, l) in logits.iter_mut().enumerate() {
            let ok = if id < self.vocab {
                mask.is_allowed(id as u32) || (eos_ok && self.eog.contains(&(id as u32)))
            } else {
                false
            };
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
        let t = sampler.sample(&mut logits, history);
        if self.accept(t)? {
            return Ok(t);
        }
        Err(BackendError::Compute(format!(
            "constraint: token {t} was sampled outside the mask"
        )))
    }

    /// Whether the grammar is complete and allows nothing more.
    pub fn is_done(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Moves past `t` if the grammar allows it; false (and no change) if not.
    fn accept(&mut self, t: u32) -> Result<bool, BackendError> {
        let id = if self.eog.contains(&t) { self.eos } else { t };
        if id as usize >= self.vocab {
            return Ok(false);
        }
        let n = self.matcher.try_consume_tokens(&[id]).map_err(|e| self.failed(e))?;
        Ok(n == 1)
    }

    fn failed(&self, e: anyhow::Error) -> BackendError {
        BackendError::Compute(format!("constraint: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_place_in_the_schema() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "strng"}}}});
        let e = check_schema(&schema).unwrap_err();
        assert!(e.contains("strng") && e.ends_with("(at /properties/a/items)"), "{e}");
        let schema = json!({"type": "object", "properties": {"b": {"type": "array", "uniqueItems": true}}});
        let e = check_schema(&schema).unwrap_err();
        assert!(e.ends_with("(at /properties/b)"), "{e}");
        assert!(
            check_schema(&json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}})).is_ok()
        );
    }

    #[test]
    fn every_kind_is_checked() {
        assert!(check(&Constraint::Regex {
            pattern: "[0-9]{3}".into()
        })
        .is_ok());
        assert!(check(&Constraint::Regex {
            pattern: "(unclosed".into()
        })
        .is_err());
        assert!(check(&Constraint::Lark {
            grammar: "start: \"a\" | \"b\"".into()
        })
        .is_ok());
        assert!(check(&Constraint::Lark {
            grammar: "start: undefined_rule".into()
        })
        .is_err());
        let e = check(&Constraint::JsonSchema {
            schema: "{not json".into(),
        })
        .unwrap_err();
        assert!(e.to_string().contains("not JSON"), "{e}");
    }
}
