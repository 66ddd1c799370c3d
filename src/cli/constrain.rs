//! The constraint flags of `generate` and `chat` (`--schema`, `--json-object`,
//! `--regex`, `--grammar`) as the request's `config.constraint`.

use clap::Args;

/// The constraint flags (at most one).
#[derive(Args, Debug, Clone)]
pub struct ConstraintFlags {
    /// The answer must be JSON valid against this JSON Schema (the schema's text, or
    /// @FILE), enforced at every token.
    #[arg(long, value_name = "SCHEMA|@FILE", conflicts_with_all = ["json_object", "regex", "grammar"])]
    pub schema: Option<String>,
    /// The answer must be a JSON object, enforced at every token.
    #[arg(long, conflicts_with_all = ["regex", "grammar"])]
    pub json_object: bool,
    /// The answer must match this regular expression as a whole.
    #[arg(long, conflicts_with = "grammar")]
    pub regex: Option<String>,
    /// The answer must be a sentence of this Lark grammar (llguidance's dialect, root
    /// rule `start`; the text, or @FILE).
    #[arg(long, value_name = "LARK|@FILE")]
    pub grammar: Option<String>,
}

impl ConstraintFlags {
    /// The constraint the flags ask for (`@FILE` arguments read).
    pub fn constraint(&self) -> anyhow::Result<Option<switchyard_messages::Constraint>> {
        use anyhow::Context;
        use switchyard_messages::Constraint;
        let text = |v: &str| -> anyhow::Result<String> {
            match v.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}")),
                None => Ok(v.to_string()),
            }
        };
        Ok(if let Some(s) = &self.schema {
            Some(Constraint::JsonSchema { schema: text(s)? })
        } else if self.json_object {
            Some(Constraint::JsonObject)
        } else if let Some(r) = &self.regex {
            Some(Constraint::Regex { pattern: r.clone() })
        } else if let Some(g) = &self.grammar {
            Some(Constraint::Lark { grammar: text(g)? })
        } else {
            None
        })
    }
}
