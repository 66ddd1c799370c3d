//! Structured output and tools (protocol 1.3): the [`Constraint`] a generation must
//! satisfy, enforced token by token by the backend, and the [`Tool`]s a chat may call,
//! with the [`ToolCall`]s a worker parses out of the model's answer.
//!
//! JSON documents (a schema, a tool's parameters, a call's arguments) travel as JSON
//! *text* inside MessagePack strings, so a client in any language passes its JSON
//! library's output through unchanged.

use serde::{Deserialize, Serialize};

/// What a generation's text must be, enforced at every token (the sampler only
/// ever picks tokens that keep the text a prefix of something the constraint
/// accepts; end-of-generation is allowed only where the text is complete).
///
/// MessagePack: a map with `type` and that type's field, e.g.
/// `{"type": "json_schema", "schema": "{\"type\": \"object\"}"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Constraint {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid against a JSON Schema (draft 2020-12 keywords; what the grammar
    /// library cannot enforce is refused with `bad_request` naming it).
    JsonSchema {
        /// The schema, as JSON text.
        schema: String,
    },
    /// Text that matches a regular expression as a whole.
    Regex {
        /// The expression (Rust `regex` syntax, no look-around or back-references).
        pattern: String,
    },
    /// Text derived from a context-free grammar in llguidance's Lark dialect
    /// (`start:` is the root rule; `%json {…}` embeds a JSON schema).
    Lark {
        /// The grammar text.
        grammar: String,
    },
}

impl Constraint {
    /// The wire spelling of the kind (`json_object`, `json_schema`, `regex`, `lark`).
    pub fn kind(&self) -> &'static str {
        match self {
            Constraint::JsonObject => "json_object",
            Constraint::JsonSchema { .. } => "json_schema",
            Constraint::Regex { .. } => "regex",
            Constraint::Lark { .. } => "lark",
        }
    }

    /// Bytes of the constraint's text (checked against `limits.max_constraint_bytes`).
    pub fn text_len(&self) -> usize {
        match self {
            Constraint::JsonObject => 0,
            Constraint::JsonSchema { schema } => schema.len(),
            Constraint::Regex { pattern } => pattern.len(),
            Constraint::Lark { grammar } => grammar.len(),
        }
    }
}

/// A function the model may call (OpenAI's `tools[].function`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Tool {
    /// The function's name: 1–64 characters of letters, digits, `_` and `-`.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// A JSON Schema of its arguments, as JSON text; `""` = any JSON object.
    pub parameters: String,
}

/// Whether and how the model calls tools.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ToolChoice {
    /// The model decides: plain text, or calls.
    #[default]
    Auto,
    /// No calls: the tools are not shown to the model.
    None,
    /// At least one call (enforced by a constraint).
    Required,
    /// Exactly this function (enforced by a constraint).
    Function {
        /// The function's name; must be one of the request's tools.
        name: String,
    },
}

/// A call the model made (in an assistant message of the history, or parsed out of
/// an answer into the last [`crate::StreamChunk`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ToolCall {
    /// The call's id (`call_…`), which the tool's answer names in `tool_call_id`.
    pub id: String,
    /// The function called.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraint_is_a_tagged_map() {
        let c = Constraint::JsonSchema {
            schema: "{\"type\":\"object\"}".into(),
        };
        let bytes = rmp_serde::to_vec_named(&c).unwrap();
        let back: Constraint = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(back, c);
        let bare: Constraint =
            rmp_serde::from_slice(&rmp_serde::to_vec_named(&Constraint::JsonObject).unwrap()).unwrap();
        assert_eq!(bare, Constraint::JsonObject);
    }

    #[test]
    fn tool_choice_defaults_to_auto() {
        let named = ToolChoice::Function { name: "f".into() };
        let back: ToolChoice = rmp_serde::from_slice(&rmp_serde::to_vec_named(&named).unwrap()).unwrap();
        assert_eq!(back, named);
        assert_eq!(ToolChoice::default(), ToolChoice::Auto);
    }
}
