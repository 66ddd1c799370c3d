//! OpenAI's structured-output and tool fields, read into switchyard's contract:
//! `response_format` (and the `regex` / `grammar` extras) into a
//! [`Constraint`]; `tools`, `tool_choice` and `parallel_tool_calls` into the chat
//! request; assistant `tool_calls` of the history into [`ToolCall`]s. Whatever
//! cannot be honoured is a 400 naming the field.

use super::errors::ApiError;
use serde_json::{json, Value};
use switchyard_client::GenerateRequest;
use switchyard_messages::{Constraint, Tool, ToolCall, ToolChoice};

fn refuse(param: &str, why: &str) -> ApiError {
    ApiError::bad_request(Some(param.to_string()), format!("{param}: {why}"))
}

/// The constraint `response_format` (or an extra) asks for; `None` for text.
pub fn constraint(
    response_format: Option<&Value>,
    regex: Option<&str>,
    grammar: Option<&str>,
) -> Result<Option<Constraint>, ApiError> {
    let mut found = Vec::new();
    if let Some(rf) = response_format.filter(|v| !v.is_null()) {
        let kind = rf.get("type").and_then(Value::as_str);
        match kind {
            Some("text") => {}
            Some("json_object") => found.push(Constraint::JsonObject),
            Some("json_schema") => {
                let Some(spec) = rf.get("json_schema").filter(|v| v.is_object()) else {
                    return Err(refuse("response_format.json_schema", "must be an object with a schema"));
                };
                // `strict` false is honoured too: the schema is always enforced.
                let schema = match spec.get("schema") {
                    Some(s) if s.is_object() || s.is_boolean() => s.to_string(),
                    Some(_) => {
                        return Err(refuse(
                            "response_format.json_schema.schema",
                            "must be a JSON Schema object",
                        ))
                    }
                    None => json!({"type": "object"}).to_string(),
                };
                found.push(Constraint::JsonSchema { schema });
            }
            other => {
                return Err(refuse(
                    "response_format.type",
                    &format!("{other:?} is not one of text, json_object, json_schema"),
                ))
            }
        }
    }
    if let Some(pattern) = regex {
        found.push(Constraint::Regex {
            pattern: pattern.to_string(),
        });
    }
    if let Some(grammar) = grammar {
        found.push(Constraint::Lark {
            grammar: grammar.to_string(),
        });
    }
    if found.len() > 1 {
        return Err(refuse(
            "response_format",
            "give one of response_format (json), regex or grammar",
        ));
    }
    Ok(found.pop())
}

/// A function tool from `t` (the object at `field`): its `name` (checked),
/// `description`, and the JSON Schema under `schema_key` (`parameters`, or
/// Anthropic's `input_schema`; absent is any object unless `schema_required`).
pub fn function_tool(field: &str, t: &Value, schema_key: &str, schema_required: bool) -> Result<Tool, ApiError> {
    let Some(name) = t.get("name").and_then(Value::as_str) else {
        return Err(refuse(&format!("{field}.name"), "is missing"));
    };
    if !switchyard_messages::is_valid_tool_name(name) {
        return Err(refuse(
            &format!("{field}.name"),
            &format!("{name:?} must be 1-64 letters, digits, '_' or '-'"),
        ));
    }
    let parameters = match t.get(schema_key) {
        None | Some(Value::Null) if !schema_required => String::new(),
        Some(p) if p.is_object() => p.to_string(),
        _ => return Err(refuse(&format!("{field}.{schema_key}"), "must be a JSON Schema object")),
    };
    Ok(Tool {
        name: name.to_string(),
        description: t
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        parameters,
    })
}

/// Refuses a `tool_choice` that forces a call when there are no tools.
pub fn check_forced(req: &GenerateRequest) -> Result<(), ApiError> {
    if req.tools.is_empty() && matches!(req.tool_choice, ToolChoice::Required | ToolChoice::Function { .. }) {
        return Err(refuse("tool_choice", "needs tools"));
    }
    Ok(())
}

/// `tools`, `tool_choice` and `parallel_tool_calls` into `req`.
pub fn tools(
    req: &mut GenerateRequest,
    tools: Option<&[Value]>,
    choice: Option<&Value>,
    parallel: Option<bool>,
) -> Result<(), ApiError> {
    for (i, t) in tools.unwrap_or_default().iter().enumerate() {
        let field = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(refuse(
                &format!("{field}.type"),
                "only \"function\" tools are supported",
            ));
        }
        let Some(f) = t.get("function").filter(|f| f.is_object()) else {
            return Err(refuse(&format!("{field}.function"), "is missing"));
        };
        req.tools
            .push(function_tool(&format!("{field}.function"), f, "parameters", false)?);
    }
    req.tool_choice = match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(refuse(
                    "tool_choice",
                    &format!("{other:?} is not auto, none, required or a function"),
                ))
            }
        },
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                if !req.tools.iter().any(|t| t.name == name) {
                    return Err(refuse(
                        "tool_choice",
                        &format!("names function {name:?}, which is not among the request's tools"),
                    ));
                }
                ToolChoice::Function { name: name.to_string() }
            }
            _ => {
                return Err(refuse(
                    "tool_choice",
                    "must be auto, none, required or {\"type\": \"function\", \"function\": {\"name\": …}}",
                ))
            }
        },
    };
    check_forced(req)?;
    if req.config.constraint.is_some() && matches!(req.tool_choice, ToolChoice::Required | ToolChoice::Function { .. })
    {
        return Err(refuse(
            "response_format",
            "cannot be combined with tool_choice required or a named function",
        ));
    }
    req.parallel_tool_calls = parallel.unwrap_or(true);
    Ok(())
}

/// An assistant turn's `tool_calls` (message `i` of the history).
pub fn history_calls(i: usize, calls: &[Value]) -> Result<Vec<ToolCall>, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            let field = format!("messages[{i}].tool_calls[{j}]");
            let name = c.pointer("/function/name").and_then(Value::as_str);
            let Some(name) = name else {
                return Err(refuse(&format!("{field}.function.name"), "is missing"));
            };
            let arguments = match c.pointer("/function/arguments") {
                Some(Value::String(s)) => s.clone(),
                None | Some(Value::Null) => "{}".to_string(),
                Some(other) => other.to_string(),
            };
            Ok(ToolCall {
                id: c.get("id").and_then(Value::as_str).unwrap_or_default().to_string(),
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}

/// Calls in OpenAI's answer shape.
pub fn calls_json(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_formats() {
        assert_eq!(constraint(Some(&json!({"type": "text"})), None, None).unwrap(), None);
        assert_eq!(
            constraint(Some(&json!({"type": "json_object"})), None, None).unwrap(),
            Some(Constraint::JsonObject)
        );
        let c = constraint(
            Some(
                &json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true,
                         "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}}),
            ),
            None,
            None,
        )
        .unwrap();
        assert!(matches!(c, Some(Constraint::JsonSchema { schema }) if schema.contains("integer")));
        assert!(constraint(Some(&json!({"type": "yaml"})), None, None).is_err());
        assert!(constraint(Some(&json!({"type": "json_object"})), Some("a+"), None).is_err());
    }

    #[test]
    fn tool_choice_names_a_known_function() {
        let mut req = GenerateRequest::chat("r", "", vec![]);
        let t = [json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})];
        let named = json!({"type": "function", "function": {"name": "g"}});
        let e = tools(&mut req, Some(&t), Some(&named), None).unwrap_err();
        assert!(e.message.contains("\"g\""), "{}", e.message);
        let mut req = GenerateRequest::chat("r", "", vec![]);
        tools(&mut req, Some(&t), Some(&json!("required")), Some(false)).unwrap();
        assert_eq!(req.tool_choice, ToolChoice::Required);
        assert!(!req.parallel_tool_calls);
    }
}
