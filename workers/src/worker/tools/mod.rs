//! Tool calling on every backend: what the worker does around the model for a chat
//! request that offers tools.
//!
//! - [`plan`] turns the request into what the backend runs: the conversation (with
//!   the tools for a template that has a tools section; rendered into a system turn
//!   and plain turns for one that has not, see [`generic`]) and, for `tool_choice`
//!   `required` or a named function, a [`Constraint`] that makes the model write a
//!   call that parses and whose arguments match the function's schema.
//! - [`calls::CallFilter`] watches the generated text: content streams on, the
//!   calls' text is held back and parsed into [`ToolCall`]s for the last chunk.
//!
//! Every backend gets the same treatment, because all of it happens here, around
//! [`TextModel::generate`](switchyard_backend::TextModel::generate).

pub mod calls;
pub mod generic;

use serde_json::{json, Map, Value};
use switchyard_backend::{Prompt, ToolFormat};
use switchyard_messages::{Constraint, GenerateRequest, Message, Tool, ToolChoice, WireError};

/// What the worker runs for one chat request.
pub struct Plan {
    /// The prompt for the backend.
    pub prompt: Prompt,
    /// A constraint forcing a call (`required`, a named function).
    pub constraint: Option<Constraint>,
    /// Parses calls out of the answer; `None` when the request offered no tools.
    pub filter: Option<calls::CallFilter>,
}

fn bad(message: String) -> WireError {
    WireError::new(switchyard_messages::ErrorCode::BadRequest, message)
}

/// A tool's parameters as a JSON value (`{"type": "object"}` when empty), or a
/// `bad_request` naming the tool.
pub fn parameters(i: usize, tool: &Tool) -> Result<Value, WireError> {
    if tool.parameters.trim().is_empty() {
        return Ok(json!({"type": "object"}));
    }
    let v: Value = serde_json::from_str(&tool.parameters)
        .map_err(|e| bad(format!("tools[{i}].parameters ({}) is not JSON: {e}", tool.name)))?;
    if !v.is_object() {
        return Err(bad(format!(
            "tools[{i}].parameters ({}) must be a JSON Schema object",
            tool.name
        )));
    }
    Ok(v)
}

/// The chat `req` as the backend should run it, given how its template shows tools
/// and which constraints it `enforces` (a backend that takes JSON schemas only,
/// llama.cpp, gets the forced call as a bare JSON object — or a list of them — and
/// the answer is parsed that way).
pub fn plan(
    req: &GenerateRequest,
    format: ToolFormat,
    enforces: &dyn Fn(&Constraint) -> Result<(), String>,
) -> Result<Plan, WireError> {
    let messages = req.messages.clone().unwrap_or_default();
    let kwargs = req.chat_template_kwargs.clone();
    if req.tools.is_empty() && !mentions_tools(&messages) {
        return Ok(Plan {
            prompt: Prompt::Chat {
                messages,
                tools: Vec::new(),
                kwargs,
            },
            constraint: None,
            filter: None,
        });
    }
    let mut schemas = Vec::with_capacity(req.tools.len());
    for (i, t) in req.tools.iter().enumerate() {
        let schema = parameters(i, t)?;
        switchyard_engine::constraint::check_schema(&schema)
            .map_err(|e| bad(format!("tools[{i}].parameters ({}): {e}", t.name)))?;
        schemas.push(schema);
    }
    // `none`: the model is not shown the tools (the history still is).
    let offered: Vec<Tool> = if req.tool_choice == ToolChoice::None {
        Vec::new()
    } else {
        req.tools.clone()
    };
    let prompt = match format {
        ToolFormat::Hermes | ToolFormat::Llama3 => Prompt::Chat {
            messages,
            tools: offered.clone(),
            kwargs,
        },
        _ => Prompt::Chat {
            messages: generic::render(&messages, &offered, &schemas),
            tools: Vec::new(),
            kwargs,
        },
    };
    let forced: Vec<(&Tool, &Value)> = match &req.tool_choice {
        ToolChoice::Required => req.tools.iter().zip(&schemas).collect(),
        ToolChoice::Function { name } => req
            .tools
            .iter()
            .zip(&schemas)
            .filter(|(t, _)| &t.name == name)
            .collect(),
        _ => Vec::new(),
    };
    // A named function is one call of it (as OpenAI answers); `required` may make
    // several when parallel calls are allowed.
    let parallel = req.parallel_tool_calls && req.tool_choice == ToolChoice::Required;
    let mut constraint = (!forced.is_empty()).then(|| call_grammar(&forced, format, parallel));
    let mut bare_json = false;
    if constraint.as_ref().is_some_and(|c| enforces(c).is_err()) {
        let schema = call_json_schema(&forced, format, parallel);
        // Retryable: another worker enforces what this one cannot (llama.cpp's schema
        // converter ignores some keywords a tool's parameters may use).
        enforces(&schema).map_err(|why| {
            WireError::new(
                switchyard_messages::ErrorCode::Unavailable,
                format!("this worker cannot enforce the forced tool call: {why}"),
            )
        })?;
        constraint = Some(schema);
        bare_json = true;
    }
    let names: Vec<String> = offered.iter().map(|t| t.name.clone()).collect();
    let filter = (!offered.is_empty()).then(|| {
        let f = calls::CallFilter::new(format, req.parallel_tool_calls, names);
        if bare_json {
            f.bare_json()
        } else {
            f
        }
    });
    Ok(Plan {
        prompt,
        constraint,
        filter,
    })
}

/// The JSON schema of one call of any of `tools`: `{"name": <one of them>,
/// <args_key>: <its parameters>}`, every tool's `$defs` moved to the root (renamed
/// per tool, its `$ref`s rewritten), since a `$ref` resolves against the document's
/// root and the parameters are no longer the root.
fn call_schema(tools: &[(&Tool, &Value)], args_key: &str) -> Value {
    let mut defs = Map::new();
    let mut one = |i: usize, (t, params): &(&Tool, &Value)| {
        let params = hoist_defs(i, params, &mut defs);
        json!({
            "type": "object",
            "properties": {"name": {"const": t.name}, args_key: params},
            "required": ["name", args_key],
            "additionalProperties": false,
        })
    };
    let mut schema = match tools {
        [single] => one(0, single),
        many => {
            let each: Vec<Value> = many.iter().enumerate().map(|(i, t)| one(i, t)).collect();
            json!({"anyOf": each})
        }
    };
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    switchyard_engine::constraint::bounded_whitespace(schema)
}

/// Tool `i`'s `params` with its `$defs` / `definitions` moved into `defs` as
/// `t{i}_{name}`, and every `$ref` to them rewritten to match.
fn hoist_defs(i: usize, params: &Value, defs: &mut Map<String, Value>) -> Value {
    let mut params = params.clone();
    let mut own = Vec::new();
    if let Some(o) = params.as_object_mut() {
        for key in ["$defs", "definitions"] {
            if let Some(Value::Object(m)) = o.remove(key) {
                own.extend(m);
            }
        }
    }
    rewrite_refs(&mut params, i);
    for (name, mut v) in own {
        rewrite_refs(&mut v, i);
        defs.insert(format!("t{i}_{name}"), v);
    }
    params
}

fn rewrite_refs(v: &mut Value, i: usize) {
    match v {
        Value::Object(o) => {
            for (k, child) in o.iter_mut() {
                match child {
                    Value::String(r) if k == "$ref" => {
                        let rest = r.strip_prefix("#/$defs/").or_else(|| r.strip_prefix("#/definitions/"));
                        if let Some(rest) = rest {
                            *r = format!("#/$defs/t{i}_{rest}");
                        }
                    }
                    _ => rewrite_refs(child, i),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|c| rewrite_refs(c, i)),
        _ => {}
    }
}

/// Most calls one answer may hold when parallel calls are allowed: the grammar
/// then ends the answer, so a small model that repeats itself stops early.
pub const MAX_PARALLEL_CALLS: usize = 4;

/// A Lark grammar (llguidance's dialect) whose sentences are one call — or, when
/// `parallel`, up to [`MAX_PARALLEL_CALLS`] — of `tools`, written as the model's
/// format writes them.
pub fn call_grammar(tools: &[(&Tool, &Value)], format: ToolFormat, parallel: bool) -> Constraint {
    let (separator, call) = match format {
        ToolFormat::Llama3 => ("; ", format!("call: %json {}\n", call_schema(tools, "parameters"))),
        _ => (
            "\\n",
            format!(
                "call: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {}\n",
                call_schema(tools, "arguments")
            ),
        ),
    };
    // call ("sep" call ("sep" call)?)? …: one to the most calls.
    let mut start = String::from("call");
    if parallel {
        for _ in 1..MAX_PARALLEL_CALLS {
            start.push_str(&format!(" (\"{separator}\" call"));
        }
        start.push_str(&")?".repeat(MAX_PARALLEL_CALLS - 1));
    }
    Constraint::Lark {
        grammar: format!("start: {start}\n{call}"),
    }
}

/// The forced call as a JSON schema alone, for a backend that enforces nothing else:
/// one call object, or (parallel) a list of one to [`MAX_PARALLEL_CALLS`] of them.
pub fn call_json_schema(tools: &[(&Tool, &Value)], format: ToolFormat, parallel: bool) -> Constraint {
    let key = if format == ToolFormat::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    let mut one = call_schema(tools, key);
    let schema = if parallel {
        // The definitions belong at the root of the document, the list.
        let defs = one.as_object_mut().and_then(|o| {
            o.remove("x-guidance");
            o.remove("$defs")
        });
        let mut list = json!({"type": "array", "items": one, "minItems": 1, "maxItems": MAX_PARALLEL_CALLS});
        if let Some(defs) = defs {
            list["$defs"] = defs;
        }
        switchyard_engine::constraint::bounded_whitespace(list)
    } else {
        one
    };
    Constraint::JsonSchema {
        schema: schema.to_string(),
    }
}

/// A new call id, `call_` and 24 letters and digits.
pub fn call_id() -> String {
    format!("call_{}", nuid::next().as_str().to_ascii_lowercase())
}

/// Whether `messages` hold anything of tools (calls or tool turns).
pub fn mentions_tools(messages: &[Message]) -> bool {
    messages.iter().any(|m| !m.tool_calls.is_empty() || m.role == "tool")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, params: &str) -> Tool {
        Tool {
            name: name.into(),
            description: format!("does {name}"),
            parameters: params.into(),
        }
    }

    #[test]
    fn required_builds_a_grammar_over_every_tool() {
        let mut req = GenerateRequest::chat("r", "", vec![Message::new("user", "hi")]);
        req.tools = vec![
            tool("a", r#"{"type":"object","properties":{"x":{"type":"integer"}}}"#),
            tool("b", ""),
        ];
        req.tool_choice = ToolChoice::Required;
        let plan = plan(&req, ToolFormat::Generic, &|_| Ok(())).unwrap();
        let Some(Constraint::Lark { grammar }) = plan.constraint else {
            panic!("no grammar")
        };
        assert!(
            grammar.contains("anyOf") && grammar.contains("<tool_call>"),
            "{grammar}"
        );
        assert!(
            grammar.starts_with("start: call (\"\\n\" call (\"\\n\" call (\"\\n\" call)?)?)?\n"),
            "{grammar}"
        );
        assert!(plan.filter.is_some());
        // The generic format puts the tools into a system turn.
        let Prompt::Chat { messages, tools, .. } = plan.prompt else {
            panic!()
        };
        assert!(tools.is_empty());
        assert_eq!(messages[0].role, "system");
        assert!(messages[0].content.contains(r#""name":"a""#), "{}", messages[0].content);
    }

    #[test]
    fn a_json_only_backend_gets_the_call_as_a_schema() {
        let mut req = GenerateRequest::chat("r", "", vec![Message::new("user", "hi")]);
        req.tools = vec![tool("a", r#"{"type":"object"}"#)];
        req.tool_choice = ToolChoice::Required;
        let json_only = |c: &Constraint| match c {
            Constraint::JsonSchema { .. } => Ok(()),
            _ => Err("json only".to_string()),
        };
        let plan = plan(&req, ToolFormat::Generic, &json_only).unwrap();
        let Some(Constraint::JsonSchema { schema }) = plan.constraint else {
            panic!("no schema")
        };
        assert!(
            schema.starts_with(r#"{"type":"array","items":{"type":"object","properties":{"name":{"const":"a"}"#),
            "{schema}"
        );
        let mut filter = plan.filter.unwrap();
        let sent = filter.push(switchyard_messages::Token {
            id: 1,
            text: r#"[{"name":"a","arguments":{}}]"#.into(),
            logprob: None,
            reasoning: false,
        });
        assert!(sent.is_empty());
        assert_eq!(filter.finish().1[0].name, "a");
    }

    #[test]
    fn nested_parameters_keep_their_definitions() {
        let nested = r##"{"type":"object","properties":{"item":{"$ref":"#/$defs/Item"}},"required":["item"],
            "$defs":{"Item":{"type":"object","properties":{"n":{"type":"integer"},"sub":{"$ref":"#/$defs/Sub"}}},
                     "Sub":{"type":"object","properties":{"s":{"type":"string"}}}}}"##;
        let mut req = GenerateRequest::chat("r", "", vec![Message::new("user", "hi")]);
        req.tools = vec![tool("a", nested), tool("b", nested)];
        req.tool_choice = ToolChoice::Required;
        let plan = plan(&req, ToolFormat::Generic, &|_| Ok(())).unwrap();
        let grammar = plan.constraint.unwrap();
        switchyard_engine::constraint::check(&grammar).expect("the call grammar compiles");
        let Constraint::Lark { grammar } = grammar else {
            panic!()
        };
        assert!(
            grammar.contains("#/$defs/t1_Sub") && grammar.contains(r#""t0_Item""#),
            "{grammar}"
        );
        // The same as a bare schema (a JSON-only backend), parallel: a list.
        let json_only = |c: &Constraint| match c {
            Constraint::JsonSchema { .. } => Ok(()),
            _ => Err("json only".to_string()),
        };
        let plan = super::plan(&req, ToolFormat::Generic, &json_only).unwrap();
        switchyard_engine::constraint::check(&plan.constraint.unwrap()).expect("the list schema compiles");
    }

    #[test]
    fn broken_parameters_are_a_bad_request_naming_the_tool() {
        let mut req = GenerateRequest::chat("r", "", vec![Message::new("user", "hi")]);
        req.tools = vec![tool("ok", ""), tool("broken", "{not json")];
        let e = plan(&req, ToolFormat::Generic, &|_| Ok(())).err().unwrap();
        assert!(e.message.contains("tools[1].parameters (broken)"), "{}", e.message);
        req.tools[1].parameters = r#"{"type":"object","properties":{"x":{"type":"strng"}}}"#.into();
        let e = plan(&req, ToolFormat::Generic, &|_| Ok(())).err().unwrap();
        assert!(
            e.message.contains("tools[1].parameters (broken)") && e.message.contains("/properties/x"),
            "{}",
            e.message
        );
    }

    #[test]
    fn none_hides_the_tools_and_parses_nothing() {
        let mut req = GenerateRequest::chat("r", "", vec![Message::new("user", "hi")]);
        req.tools = vec![tool("a", "")];
        req.tool_choice = ToolChoice::None;
        let plan = plan(&req, ToolFormat::Hermes, &|_| Ok(())).unwrap();
        assert!(plan.filter.is_none() && plan.constraint.is_none());
        let Prompt::Chat { tools, .. } = plan.prompt else {
            panic!()
        };
        assert!(tools.is_empty());
    }
}
