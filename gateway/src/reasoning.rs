//! Reasoning models on every API: what a request says about thinking becomes the
//! chat template's variables, and the answer's reasoning (tokens the worker marked,
//! `split_reasoning`) comes back apart from its text — `reasoning_content` in chat
//! completions, a `reasoning` item in Responses, `thinking` blocks in Messages,
//! `thinking` in Ollama's API.

use super::errors::ApiError;
use serde_json::{Map, Value};
use switchyard_messages::Token;

/// OpenAI's `reasoning_effort` values (`none`: no reasoning).
const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

/// What a request asks of a reasoning model, in the terms of each API.
#[derive(Debug, Default, Clone)]
pub struct Thinking<'a> {
    /// Variables for the template as the request gave them (`chat_template_kwargs`).
    pub kwargs: Option<&'a Map<String, Value>>,
    /// Thinking on or off (Anthropic's `thinking.type`, Ollama's `think`,
    /// `enable_thinking`): the templates' `enable_thinking`.
    pub enabled: Option<bool>,
    /// How hard to think (`reasoning_effort`, Responses' `reasoning.effort`,
    /// Ollama's `think: "high"`): the templates' `reasoning_effort`; `none` is
    /// thinking off.
    pub effort: Option<&'a str>,
    /// The field the effort came in, for the error naming it.
    pub effort_field: &'a str,
}

impl Thinking<'_> {
    /// The template variables (a JSON object's text; empty for none): the request's
    /// own, then `enable_thinking` and `reasoning_effort` where it did not set them.
    pub fn template_kwargs(&self) -> Result<String, ApiError> {
        let mut map = self.kwargs.cloned().unwrap_or_default();
        let mut enabled = self.enabled;
        if let Some(effort) = self.effort {
            if !EFFORTS.contains(&effort) {
                return Err(ApiError::bad_request(
                    Some(self.effort_field.to_string()),
                    format!("{}: must be one of {}", self.effort_field, EFFORTS.join(", ")),
                ));
            }
            map.entry("reasoning_effort").or_insert_with(|| Value::from(effort));
            if effort == "none" {
                enabled = enabled.or(Some(false));
            }
        }
        if let Some(on) = enabled {
            map.entry("enable_thinking").or_insert(Value::Bool(on));
        }
        Ok(if map.is_empty() {
            String::new()
        } else {
            Value::Object(map).to_string()
        })
    }
}

/// The reasoning and the answer's text of `tokens`.
pub fn split(tokens: &[Token]) -> (String, String) {
    let (mut reasoning, mut text) = (String::new(), String::new());
    for t in tokens {
        if t.reasoning {
            reasoning.push_str(&t.text);
        } else {
            text.push_str(&t.text);
        }
    }
    (reasoning, text)
}

/// `tokens` as runs of reasoning (`true`) and answer text, in order, empty texts
/// left out: what a streamed chunk adds to each.
pub fn runs(tokens: &[Token]) -> Vec<(bool, String)> {
    let mut out: Vec<(bool, String)> = Vec::new();
    for t in tokens.iter().filter(|t| !t.text.is_empty()) {
        match out.last_mut() {
            Some((r, text)) if *r == t.reasoning => text.push_str(&t.text),
            _ => out.push((t.reasoning, t.text.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tok(text: &str, reasoning: bool) -> Token {
        Token {
            reasoning,
            ..Token::new(0, text)
        }
    }

    #[test]
    fn efforts_and_switches_become_template_variables() {
        let t = Thinking {
            effort: Some("none"),
            effort_field: "reasoning_effort",
            ..Default::default()
        };
        let v: Value = serde_json::from_str(&t.template_kwargs().unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"reasoning_effort": "none", "enable_thinking": false})
        );
        // The request's own variables win.
        let own: Map<String, Value> = serde_json::from_str(r#"{"enable_thinking": true}"#).unwrap();
        let t = Thinking {
            kwargs: Some(&own),
            enabled: Some(false),
            ..Default::default()
        };
        assert_eq!(t.template_kwargs().unwrap(), r#"{"enable_thinking":true}"#);
        assert_eq!(Thinking::default().template_kwargs().unwrap(), "");
        let bad = Thinking {
            effort: Some("max"),
            effort_field: "reasoning.effort",
            ..Default::default()
        };
        assert_eq!(
            bad.template_kwargs().unwrap_err().param.as_deref(),
            Some("reasoning.effort")
        );
    }

    #[test]
    fn tokens_split_and_run_in_order() {
        let t = [
            tok("a", true),
            tok("", true),
            tok("b", true),
            tok("c", false),
            tok("d", false),
        ];
        assert_eq!(split(&t), ("ab".into(), "cd".into()));
        assert_eq!(runs(&t), vec![(true, "ab".into()), (false, "cd".into())]);
    }
}
