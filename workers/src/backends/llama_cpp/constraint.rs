//! Which constraints a llama.cpp server enforces. It takes a JSON schema
//! (`json_schema` on `/completion`) and converts it to its own GBNF grammar; its
//! converter (llama.cpp's `json-schema-to-grammar`) enforces types, `enum`, `const`,
//! `properties`, `required`, `additionalProperties`, `items`, `prefixItems`,
//! `minItems`/`maxItems`, `minLength`/`maxLength`, `pattern`, some `format`s,
//! `anyOf`/`oneOf`/`allOf` and `$ref`, and bounds on integers — and silently ignores
//! the rest (bounds on non-integer numbers, `multipleOf`, `uniqueItems`, …). A schema
//! that uses one of those, a regex and a Lark grammar are refused here, before
//! admission, naming what and where: the worker answers `unavailable` (retryable), so
//! a coordinator sends the request to a worker that enforces it (cpu, metal), and a
//! request pinned here gets the reason — never an answer that merely looks
//! constrained.

use serde_json::Value;
use switchyard_messages::Constraint;

/// Keywords llama.cpp's schema converter ignores.
const IGNORED: &[&str] = &[
    "multipleOf",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "contains",
    "minContains",
    "maxContains",
    "unevaluatedProperties",
    "unevaluatedItems",
];

/// The `format`s llama.cpp's converter enforces (any other is a plain string there).
const FORMATS: &[&str] = &["date", "time", "date-time"];

/// Bounds llama.cpp enforces on integers only.
const INTEGER_BOUNDS: &[&str] = &["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// `Ok` when llama-server enforces `c` exactly; else what it would not enforce.
pub fn support(c: &Constraint) -> Result<(), String> {
    match c {
        Constraint::JsonObject => Ok(()),
        Constraint::JsonSchema { schema } => match serde_json::from_str::<Value>(schema) {
            Ok(v) => match unenforced(&v, "") {
                Some(what) => Err(format!("llama.cpp's schema converter does not enforce {what}")),
                None => Ok(()),
            },
            Err(e) => Err(format!("the schema is not JSON: {e}")),
        },
        other => Err(format!(
            "llama-server enforces JSON schemas only, not a {} constraint",
            other.kind()
        )),
    }
}

/// The first keyword of `schema` (at JSON pointer `at`) llama.cpp would ignore.
fn unenforced(schema: &Value, at: &str) -> Option<String> {
    let Value::Object(o) = schema else { return None };
    let place = if at.is_empty() { "/" } else { at };
    if let Some(k) = IGNORED.iter().find(|k| o.contains_key(**k)) {
        return Some(format!("`{k}` (at {place})"));
    }
    if let Some(f) = o.get("format").and_then(Value::as_str).filter(|f| !FORMATS.contains(f)) {
        return Some(format!("`format: {f}` (at {place})"));
    }
    let integer = o.get("type").and_then(Value::as_str) == Some("integer");
    if !integer {
        if let Some(k) = INTEGER_BOUNDS.iter().find(|k| o.contains_key(**k)) {
            return Some(format!("`{k}` on a non-integer (at {place})"));
        }
    }
    let child = |v: &Value, path: String| unenforced(v, &path);
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(map)) = o.get(key) {
            for (name, v) in map {
                if let Some(w) = child(v, format!("{at}/{key}/{name}")) {
                    return Some(w);
                }
            }
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(v) = o.get(key) {
            if let Some(w) = child(v, format!("{at}/{key}")) {
                return Some(w);
            }
        }
    }
    for key in ["prefixItems", "anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(list)) = o.get(key) {
            for (i, v) in list.iter().enumerate() {
                if let Some(w) = child(v, format!("{at}/{key}/{i}")) {
                    return Some(w);
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema(s: &str) -> Constraint {
        Constraint::JsonSchema { schema: s.into() }
    }

    #[test]
    fn what_llama_cpp_ignores_is_named_with_its_place() {
        let e = support(&schema(
            r#"{"type":"object","properties":{"score":{"type":"number","minimum":0,"maximum":10}}}"#,
        ))
        .unwrap_err();
        assert!(e.contains("`minimum` on a non-integer (at /properties/score)"), "{e}");
        let e = support(&schema(
            r#"{"type":"array","items":{"type":"array","uniqueItems":true}}"#,
        ))
        .unwrap_err();
        assert!(e.contains("`uniqueItems` (at /items)"), "{e}");
        // A property *named* like a keyword is not the keyword.
        support(&schema(
            r#"{"type":"object","properties":{"not":{"type":"integer","minimum":1}},"required":["not"]}"#,
        ))
        .unwrap();
        assert!(support(&Constraint::Regex { pattern: "a".into() }).is_err());
        assert!(support(&Constraint::JsonObject).is_ok());
        let e = support(&schema(r#"{"type":"string","format":"email"}"#)).unwrap_err();
        assert!(e.contains("`format: email` (at /)"), "{e}");
        support(&schema(r#"{"type":"string","format":"date"}"#)).unwrap();
    }
}
