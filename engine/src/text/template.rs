//! Chat prompts rendered from the GGUF's own `tokenizer.chat_template` (Jinja) with
//! minijinja and its Python-compatibility methods (`.strip()`, `.items()`, …), the
//! way llama.cpp's server renders them.

use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde_json::json;
use switchyard_backend::ToolFormat;
use switchyard_messages::{Message, Tool};

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    tool_format: ToolFormat,
}

impl ChatTemplate {
    /// Compiles `source`; `bos` / `eos` are the texts of the model's BOS/EOS tokens.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, Error> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<String, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.to_string())?;
        Ok(Self {
            env,
            bos: bos.to_string(),
            eos: eos.to_string(),
            tool_format: tool_format(source),
        })
    }

    /// How this template shows tools.
    pub fn tool_format(&self) -> ToolFormat {
        self.tool_format
    }

    /// Renders `messages` (and `tools`, for a template with a tools section), ending
    /// with the assistant's turn opener when `add_generation_prompt` is set. Tools
    /// and calls take OpenAI's shapes (`{"type": "function", "function": {…}}`), the
    /// arguments as objects, as Hugging Face's `apply_chat_template` passes them.
    pub fn render(&self, messages: &[Message], tools: &[Tool], add_generation_prompt: bool) -> Result<String, Error> {
        self.render_with(messages, tools, "", add_generation_prompt)
    }

    /// [`ChatTemplate::render`] with extra variables: `kwargs`, a JSON object's
    /// text (`{"enable_thinking": false}`), empty for none; the template's own
    /// variables win over them.
    pub fn render_with(
        &self,
        messages: &[Message],
        tools: &[Tool],
        kwargs: &str,
        add_generation_prompt: bool,
    ) -> Result<String, Error> {
        let tmpl = self.env.get_template("chat")?;
        let messages: Vec<Value> = messages.iter().map(message_value).collect();
        let tools: Option<Vec<Value>> = (!tools.is_empty()).then(|| tools.iter().map(tool_value).collect());
        let extra = if kwargs.trim().is_empty() {
            Value::from(())
        } else {
            let v: serde_json::Value = serde_json::from_str(kwargs)
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("chat_template_kwargs: {e}")))?;
            if !v.is_object() {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "chat_template_kwargs must be a JSON object",
                ));
            }
            Value::from_serialize(&v)
        };
        tmpl.render(context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
            ..extra
        })
    }

    /// Whether `prompt`, rendered as a chat, leaves a reasoning section open (see
    /// [`ChatTemplate::opens_reasoning`]); a prompt that is not a chat, or does not
    /// render, does not.
    pub fn leaves_reasoning_open(&self, prompt: &switchyard_backend::Prompt) -> bool {
        let switchyard_backend::Prompt::Chat {
            messages,
            tools,
            kwargs,
        } = prompt
        else {
            return false;
        };
        self.render_with(messages, tools, kwargs, true)
            .is_ok_and(|text| Self::opens_reasoning(&text))
    }

    /// Whether the assistant's opener that `render_with` ends with leaves a
    /// reasoning section open: `<think>` after the last `</think>` (DeepSeek-R1's
    /// and QwQ's templates end the opener with it; Qwen3's closes an empty one when
    /// thinking is off).
    pub fn opens_reasoning(rendered: &str) -> bool {
        match rendered.rfind(THINK_OPEN) {
            Some(at) => !rendered[at..].contains(THINK_CLOSE) && rendered[at + THINK_OPEN.len()..].trim().is_empty(),
            None => false,
        }
    }
}

/// JSON text as a value (an unparsable text stays a string).
fn json_value(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
}

fn message_value(m: &Message) -> Value {
    let mut v = json!({"role": m.role, "content": m.content});
    if !m.tool_calls.is_empty() {
        v["tool_calls"] = m
            .tool_calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": json_value(&c.arguments)}})
            })
            .collect();
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    Value::from_serialize(&v)
}

fn tool_value(t: &Tool) -> Value {
    let parameters = if t.parameters.is_empty() {
        json!({"type": "object"})
    } else {
        json_value(&t.parameters)
    };
    Value::from_serialize(json!({"type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": parameters}}))
}

/// What a template's source says about tools: Hermes-style `<tool_call>` tags
/// (Qwen 2.5/3, Hermes), Llama 3.x's JSON calls, or no tools section.
pub fn tool_format(source: &str) -> ToolFormat {
    if !source.contains("tools") {
        ToolFormat::Generic
    } else if source.contains("<tool_call>") {
        ToolFormat::Hermes
    } else if source.contains("<|python_tag|>") || source.contains("ipython") {
        ToolFormat::Llama3
    } else {
        ToolFormat::Generic
    }
}

/// The chat template of a Hugging Face model directory — `chat_template.jinja`, else
/// `tokenizer_config.json`'s `chat_template`, else ChatML — and the texts of its BOS
/// and EOS tokens: (source, bos, eos).
pub fn hf_template_parts(dir: &std::path::Path) -> (String, String, String) {
    let tc: serde_json::Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let token_text = |key: &str| match &tc[key] {
        serde_json::Value::String(s) => s.clone(),
        v => v["content"].as_str().unwrap_or_default().to_string(),
    };
    let source = std::fs::read_to_string(dir.join("chat_template.jinja"))
        .ok()
        .or_else(|| tc["chat_template"].as_str().map(str::to_string))
        .unwrap_or_else(|| CHATML.to_string());
    (source, token_text("bos_token"), token_text("eos_token"))
}

/// The tags of a reasoning section.
pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// ChatML, used when a GGUF carries no template.
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_python_methods() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<{{ m.role }}>{{ m.content.strip() }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}{{ eos_token }}",
            "<s>",
            "</s>",
        )
        .unwrap();
        let out = t.render(&[Message::new("user", "  hi ")], &[], true).unwrap();
        assert_eq!(out, "<user>hi<assistant></s>");
    }

    /// The tools parts of Qwen 2.5's template (Hermes-style), abridged.
    const HERMES: &str = r#"{%- if tools %}<|im_start|>system
# Tools
<tools>{%- for tool in tools %}
{{ tool | tojson }}{%- endfor %}
</tools>
For each function call, return <tool_call></tool_call><|im_end|>
{%- endif %}{%- for message in messages %}{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
<tool_call>
{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}
</tool_call>{%- endfor %}<|im_end|>{%- elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>{%- else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant
{%- endif %}"#;

    #[test]
    fn a_hermes_template_renders_tools_and_calls() {
        let t = ChatTemplate::new(HERMES, "", "<|im_end|>").unwrap();
        assert_eq!(t.tool_format(), ToolFormat::Hermes);
        let mut call = Message::new("assistant", "");
        call.tool_calls = vec![switchyard_messages::ToolCall {
            id: "call_1".into(),
            name: "get_time".into(),
            arguments: r#"{"tz":"UTC"}"#.into(),
        }];
        let mut answer = Message::new("tool", "12:00");
        answer.tool_call_id = Some("call_1".into());
        let tools = [Tool {
            name: "get_time".into(),
            description: "The time".into(),
            parameters: r#"{"type":"object","properties":{"tz":{"type":"string"}}}"#.into(),
        }];
        let out = t
            .render(&[Message::new("user", "Time?"), call, answer], &tools, true)
            .unwrap();
        assert!(
            out.contains(r#""name":"get_time""#) && out.contains(r#""tz":{"type":"string"}"#),
            "{out}"
        );
        assert!(
            out.contains(r#"{"name": "get_time", "arguments": {"tz":"UTC"}}"#),
            "{out}"
        );
        assert!(out.contains("<tool_response>\n12:00"), "{out}");
        assert_eq!(tool_format(CHATML), ToolFormat::Generic);
        assert_eq!(
            tool_format("{% if tools %}Environment: ipython{% endif %}<|python_tag|>"),
            ToolFormat::Llama3
        );
    }

    /// Qwen3's own template (the GGUFs' `tokenizer.chat_template`), from the file
    /// the test models are made with.
    fn qwen3() -> ChatTemplate {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/qwen3-chat-template.jinja"
        );
        ChatTemplate::new(&std::fs::read_to_string(path).unwrap(), "", "<|im_end|>").unwrap()
    }

    #[test]
    fn template_kwargs_reach_the_template_and_say_whether_reasoning_is_open() {
        let t = qwen3();
        assert_eq!(t.tool_format(), ToolFormat::Hermes);
        let hi = [Message::new("user", "Hi")];
        let on = t.render_with(&hi, &[], "", true).unwrap();
        assert!(on.ends_with("<|im_start|>assistant\n"), "{on:?}");
        let off = t.render_with(&hi, &[], r#"{"enable_thinking": false}"#, true).unwrap();
        assert!(
            off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
            "{off:?}"
        );
        // Neither leaves a section open: the model opens one itself, or none.
        assert!(!ChatTemplate::opens_reasoning(&on) && !ChatTemplate::opens_reasoning(&off));
        // DeepSeek-R1's opener leaves one open; an earlier turn's closed one does not count.
        assert!(ChatTemplate::opens_reasoning(
            "<think>a</think>b<｜Assistant｜><think>\n"
        ));
        assert!(!ChatTemplate::opens_reasoning("<think>\nx"));
        // An earlier answer's reasoning is not shown to the model again.
        let turns = [
            Message::new("user", "Hi"),
            Message::new("assistant", "<think>\nhmm\n</think>\n\nHello"),
            Message::new("user", "Again"),
        ];
        let out = t.render_with(&turns, &[], "", true).unwrap();
        assert!(
            out.contains("<|im_start|>assistant\nHello<|im_end|>") && !out.contains("hmm"),
            "{out:?}"
        );
        assert!(t.render_with(&hi, &[], "[1]", true).is_err());
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], &[], false).unwrap_err();
        assert!(err.to_string().contains("no system role"));
    }
}
