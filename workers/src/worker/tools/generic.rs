//! The generic tool format, for chat templates without a tools section (SmolLM2's
//! ChatML, Gemma 3's, most small models'): the tools are described in a system turn
//! and calls are written Hermes-style, `<tool_call>{"name": …, "arguments": …}
//! </tool_call>`, which [`super::calls`] parses. History is rewritten into turns any
//! template takes: an assistant's calls become that markup in its content, and tool
//! answers become user turns wrapped in `<tool_response>`; consecutive turns of one
//! role are merged (templates such as Gemma's insist that roles alternate).

use serde_json::{json, Value};
use switchyard_messages::{Message, Tool};

/// The call markup of one call, as the system turn asks for it.
pub fn call_text(name: &str, arguments: &str) -> String {
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|_| json!(arguments));
    format!(
        "<tool_call>\n{}\n</tool_call>",
        json!({"name": name, "arguments": args})
    )
}

/// The system turn's text describing `tools` (parameters already parsed).
fn instructions(tools: &[Tool], schemas: &[Value]) -> String {
    let mut s =
        String::from("You can call functions to answer. The functions, with a JSON Schema of each one's arguments:\n");
    for (t, params) in tools.iter().zip(schemas) {
        s.push_str(&json!({"name": t.name, "description": t.description, "parameters": params}).to_string());
        s.push('\n');
    }
    s.push_str(
        "To call a function, answer with one block per call, holding a JSON object with the \
         function's name and arguments:\n<tool_call>\n{\"name\": \"function_name\", \"arguments\": \
         {\"argument\": \"value\"}}\n</tool_call>\nA function's answer comes back in \
         <tool_response></tool_response>. When no function is needed, answer in plain text.",
    );
    s
}

/// `messages` with `tools` described and the tool turns rewritten (see the module
/// docs). `schemas` are the tools' parameters, parsed, in order.
pub fn render(messages: &[Message], tools: &[Tool], schemas: &[Value]) -> Vec<Message> {
    let mut out: Vec<Message> = Vec::with_capacity(messages.len() + 1);
    let mut push = |role: &str, content: String| match out.last_mut() {
        Some(last) if last.role == role => {
            last.content.push_str("\n\n");
            last.content.push_str(&content);
        }
        _ => out.push(Message::new(role, content)),
    };
    if !tools.is_empty() {
        push("system", instructions(tools, schemas));
    }
    for m in messages {
        match m.role.as_str() {
            "tool" => {
                let id = m.tool_call_id.as_deref().unwrap_or_default();
                push(
                    "user",
                    format!("<tool_response id=\"{id}\">\n{}\n</tool_response>", m.content),
                );
            }
            role if !m.tool_calls.is_empty() => {
                let mut content = m.content.clone();
                for c in &m.tool_calls {
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(&call_text(&c.name, &c.arguments));
                }
                push(role, content);
            }
            role => push(role, m.content.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_messages::ToolCall;

    #[test]
    fn history_becomes_alternating_plain_turns() {
        let mut call = Message::new("assistant", "");
        call.tool_calls = vec![
            ToolCall {
                id: "call_1".into(),
                name: "get_time".into(),
                arguments: r#"{"timezone":"UTC"}"#.into(),
            },
            ToolCall {
                id: "call_2".into(),
                name: "get_time".into(),
                arguments: r#"{"timezone":"CET"}"#.into(),
            },
        ];
        let mut r1 = Message::new("tool", "12:00");
        r1.tool_call_id = Some("call_1".into());
        let mut r2 = Message::new("tool", "13:00");
        r2.tool_call_id = Some("call_2".into());
        let tools = [Tool {
            name: "get_time".into(),
            ..Tool::default()
        }];
        let out = render(
            &[
                Message::new("system", "Be brief."),
                Message::new("user", "Time?"),
                call,
                r1,
                r2,
            ],
            &tools,
            &[json!({"type": "object"})],
        );
        let roles: Vec<&str> = out.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "user"]);
        assert!(out[0].content.contains("get_time") && out[0].content.ends_with("Be brief."));
        assert!(
            out[2]
                .content
                .contains(r#"{"arguments":{"timezone":"UTC"},"name":"get_time"}"#)
                || out[2].content.contains("\"timezone\":\"UTC\"")
        );
        assert!(out[3].content.contains("12:00") && out[3].content.contains("13:00"));
    }
}
