//! Calls out of the generated text. [`CallFilter`] sits between the backend's
//! tokens and the chunks: text streams on until a call begins (`<tool_call>`,
//! `<|python_tag|>`, or — in Llama 3's format — a JSON object opening the answer);
//! from there on the text is held, and at the end parsed into [`ToolCall`]s. Text
//! that turns out not to be a call is sent after all, so nothing is lost.

use serde_json::Value;
use switchyard_backend::ToolFormat;
use switchyard_messages::{Token, ToolCall};

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";

/// Holds back a call's text and parses it at the end.
pub struct CallFilter {
    format: ToolFormat,
    parallel: bool,
    /// Calls come as bare JSON opening the answer (Llama 3's format, or a backend
    /// whose constraint forced a JSON call).
    bare_json: bool,
    /// The functions offered: a "call" of anything else is text.
    names: Vec<String>,
    /// Text not yet sent that might begin a marker (and the id of its last token).
    pending: String,
    pending_id: u32,
    /// Whether anything but whitespace was sent (a Llama 3 JSON call must open the
    /// answer).
    sent_text: bool,
    /// From the marker on: the calls' text.
    captured: Option<String>,
    captured_id: u32,
}

impl CallFilter {
    /// A filter for a model writing calls of the functions `names` in `format`;
    /// `parallel` keeps up to [`super::MAX_PARALLEL_CALLS`] calls of an answer (else
    /// only the first).
    pub fn new(format: ToolFormat, parallel: bool, names: Vec<String>) -> Self {
        Self {
            format,
            parallel,
            bare_json: format == ToolFormat::Llama3,
            names,
            pending: String::new(),
            pending_id: 0,
            sent_text: false,
            captured: None,
            captured_id: 0,
        }
    }

    /// Also takes a JSON object or list opening the answer as calls.
    pub fn bare_json(mut self) -> Self {
        self.bare_json = true;
        self
    }

    fn markers(&self) -> &'static [&'static str] {
        match self.format {
            ToolFormat::Llama3 => &[PYTHON_TAG, HERMES_OPEN],
            _ => &[HERMES_OPEN],
        }
    }

    /// Takes one generated token; returns what may be sent now.
    pub fn push(&mut self, token: Token) -> Vec<Token> {
        if let Some(c) = &mut self.captured {
            c.push_str(&token.text);
            self.captured_id = token.id;
            return Vec::new();
        }
        self.pending.push_str(&token.text);
        self.pending_id = token.id;
        // Llama 3 writes a call as a bare JSON object at the start of the answer.
        if self.bare_json && !self.sent_text && self.pending.trim_start().starts_with(['{', '[']) {
            self.captured = Some(std::mem::take(&mut self.pending));
            self.captured_id = token.id;
            return Vec::new();
        }
        let found = self.markers().iter().filter_map(|m| self.pending.find(m)).min();
        if let Some(at) = found {
            let before: String = self.pending[..at].to_string();
            self.captured = Some(self.pending[at..].to_string());
            self.captured_id = token.id;
            self.pending.clear();
            return self.emit(before, token.id);
        }
        // Keep the longest suffix that could still begin a marker.
        let keep = self.held_suffix();
        let cut = self.pending.len() - keep;
        let send: String = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        if send.is_empty() && !token.text.is_empty() && keep > 0 {
            return Vec::new();
        }
        self.emit(send, token.id)
    }

    fn emit(&mut self, text: String, id: u32) -> Vec<Token> {
        if text.is_empty() {
            return Vec::new();
        }
        if !text.trim().is_empty() {
            self.sent_text = true;
        }
        vec![Token {
            id,
            text,
            logprob: None,
            reasoning: false,
        }]
    }

    /// Bytes at the end of `pending` that are a proper prefix of a marker (or, in
    /// Llama 3's format, leading whitespace before anything was sent).
    fn held_suffix(&self) -> usize {
        let p = &self.pending;
        if self.bare_json && !self.sent_text && p.trim().is_empty() {
            return p.len();
        }
        let mut best = 0;
        for m in self.markers() {
            for k in (1..m.len()).rev() {
                if k <= p.len() && p.is_char_boundary(p.len() - k) && m.starts_with(&p[p.len() - k..]) {
                    best = best.max(k);
                    break;
                }
            }
        }
        best
    }

    /// The end of the answer: the text still to send, and the calls (empty when the
    /// held text did not parse as calls; it is then sent as text).
    pub fn finish(&mut self) -> (Vec<Token>, Vec<ToolCall>) {
        let mut tail = Vec::new();
        if let Some(captured) = self.captured.take() {
            let mut calls = parse(&captured, self.format);
            // Only calls of offered functions; in bare JSON (which any JSON answer
            // looks like) only objects that carry arguments.
            let bare = !captured.contains(HERMES_OPEN);
            calls.retain(|c| self.names.contains(&c.name) && !(bare && c.arguments.is_empty()));
            for c in calls.iter_mut().filter(|c| c.arguments.is_empty()) {
                c.arguments = "{}".into();
            }
            if !calls.is_empty() {
                let pending = std::mem::take(&mut self.pending);
                // A small model repeats itself: the same call twice is one call.
                let mut seen = Vec::new();
                calls.retain(|c| {
                    let key = (c.name.clone(), c.arguments.clone());
                    let new = !seen.contains(&key);
                    seen.push(key);
                    new
                });
                calls.truncate(if self.parallel { super::MAX_PARALLEL_CALLS } else { 1 });
                return (self.emit(pending, self.pending_id), calls);
            }
            tail.push(Token {
                id: self.captured_id,
                text: captured,
                logprob: None,
                reasoning: false,
            });
        }
        let pending = std::mem::take(&mut self.pending);
        let mut out = self.emit(pending, self.pending_id);
        out.extend(tail);
        (out, Vec::new())
    }
}

/// The calls in `text`, written in any of the formats: `<tool_call>{…}</tool_call>`
/// blocks, `<|python_tag|>` followed by JSON, a bare JSON object or list of them,
/// and OpenAI-like `{"tool_calls": [...]}` wrappers. Each call is an object with
/// `name` and `arguments` (or `parameters`), the arguments an object or JSON text.
pub fn parse(text: &str, format: ToolFormat) -> Vec<ToolCall> {
    let _ = format;
    let mut calls = Vec::new();
    if text.contains(HERMES_OPEN) {
        for block in text.split(HERMES_OPEN).skip(1) {
            let body = block.split(HERMES_CLOSE).next().unwrap_or_default();
            collect(body, &mut calls);
        }
        return calls;
    }
    let body = text.trim_start().strip_prefix(PYTHON_TAG).unwrap_or(text);
    collect(body, &mut calls);
    calls
}

/// Every call in `body`: one or more JSON values, separated by `;` (Llama 3's
/// parallel calls) or whitespace.
fn collect(body: &str, calls: &mut Vec<ToolCall>) {
    let mut rest = body.trim();
    while !rest.is_empty() {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        match values.next() {
            Some(Ok(v)) => from_value(&v, calls),
            _ => break,
        }
        rest = rest[values.byte_offset()..].trim_start_matches([';', ' ', '\n', '\t', '\r']);
    }
}

fn from_value(v: &Value, calls: &mut Vec<ToolCall>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| from_value(i, calls)),
        Value::Object(o) => {
            if let Some(inner) = o.get("tool_calls").or_else(|| o.get("tool_call")) {
                return from_value(inner, calls);
            }
            if let Some(f) = o.get("function").filter(|f| f.is_object()) {
                return from_value(f, calls);
            }
            let Some(name) = o.get("name").and_then(Value::as_str) else {
                return;
            };
            let args = o.get("arguments").or_else(|| o.get("parameters"));
            let arguments = match args {
                // No arguments key: marked empty (bare JSON without it is no call).
                None => String::new(),
                Some(Value::Null) => "{}".to_string(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            calls.push(ToolCall {
                id: super::call_id(),
                name: name.to_string(),
                arguments,
            });
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(format: ToolFormat, pieces: &[&str]) -> (String, Vec<ToolCall>) {
        let names = ["get_time", "b", "f", "g", "h"].map(String::from).to_vec();
        let mut f = CallFilter::new(format, true, names);
        let mut text = String::new();
        for (i, p) in pieces.iter().enumerate() {
            for t in f.push(Token {
                id: i as u32,
                text: p.to_string(),
                logprob: None,
                reasoning: false,
            }) {
                text.push_str(&t.text);
            }
        }
        let (tail, calls) = f.finish();
        for t in tail {
            text.push_str(&t.text);
        }
        (text, calls)
    }

    #[test]
    fn hermes_calls_are_held_and_parsed_across_tokens() {
        let (text, calls) = run(
            ToolFormat::Generic,
            &[
                "Let me check.",
                "\n<tool",
                "_call>\n{\"name\": \"get_time\", ",
                "\"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>\n<tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>",
            ],
        );
        assert_eq!(text, "Let me check.\n");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_time");
        assert_eq!(calls[0].arguments, r#"{"tz":"UTC"}"#);
        assert_eq!(calls[1].name, "b");
        assert_ne!(calls[0].id, calls[1].id);
    }

    #[test]
    fn text_that_only_looks_like_a_marker_is_sent() {
        let (text, calls) = run(ToolFormat::Generic, &["a <to", "y> b"]);
        assert_eq!(text, "a <toy> b");
        assert!(calls.is_empty());
        let (text, calls) = run(ToolFormat::Generic, &["x <tool_call> not json"]);
        assert_eq!(text, "x <tool_call> not json");
        assert!(calls.is_empty());
    }

    #[test]
    fn llama3_bare_json_and_python_tag() {
        let (text, calls) = run(
            ToolFormat::Llama3,
            &[
                " ",
                "{\"name\": \"f\", \"parameters\": {\"a\": 1}}",
                "; {\"name\": \"g\", \"parameters\": {}}",
            ],
        );
        assert_eq!(text, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("f", r#"{"a":1}"#)
        );
        let (_, calls) = run(
            ToolFormat::Llama3,
            &["<|python_tag|>", "{\"name\": \"h\", \"parameters\": {}}"],
        );
        assert_eq!(calls[0].name, "h");
        // Text first: a later brace is text.
        let (text, calls) = run(ToolFormat::Llama3, &["Sure: ", "{\"a\": 1}"]);
        assert_eq!(text, "Sure: {\"a\": 1}");
        assert!(calls.is_empty());
        // A JSON answer with a "name" is not a call: no such function, no arguments.
        let (text, calls) = run(ToolFormat::Llama3, &["{\"name\": \"Bob\", \"age\": 30}"]);
        assert_eq!(text, "{\"name\": \"Bob\", \"age\": 30}");
        assert!(calls.is_empty());
        let (_, calls) = run(ToolFormat::Llama3, &["{\"name\": \"f\"}"]);
        assert!(calls.is_empty(), "bare JSON without arguments is text");
    }
}
