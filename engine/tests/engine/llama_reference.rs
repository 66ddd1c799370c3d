//! The CPU engine against the reference everyone trusts: llama.cpp's llama-server on
//! the same GGUF file (built from source by scripts/build-llama-server.sh).

use serde_json::json;
use switchyard_engine::EngineModel;
use switchyard_messages::{LoadConfig, Message};
use switchyard_testkit::*;

/// Text that exercises the tokenizer: ASCII, accents, CJK, emoji, code, whitespace
/// runs and special tokens.
const CORPUS: &[&str] = &[
    "Hello, world!",
    "naïve café résumé — Ångström, Zürich, Straße",
    "日本語のテキストと中文字符，还有한국어",
    "emoji 🚀🔥👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "spaces    and\t\ttabs\n\n\n  newlines  \r\n end",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "numbers 1234567890 3.14159 1e-9 0x1F 2024-11-21",
    "   leading spaces and trailing spaces   ",
    "it's we're they've I'm you'll he'd DON'T",
    "<|endoftext|>mixed<|im_end|>text",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_tokenizer_and_chat_template_match_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let path = demo_model();
    let model = EngineModel::load(&path, &LoadConfig::default()).unwrap();
    let server = LlamaServer::start(&bin, &path, 1, 1).await.unwrap();

    // Tokenizer: identical ids, special tokens included.
    for text in CORPUS {
        let theirs = server
            .post(
                "/tokenize",
                json!({"content": text, "add_special": true, "parse_special": true}),
            )
            .await
            .unwrap();
        let theirs: Vec<u32> = serde_json::from_value(theirs["tokens"].clone()).unwrap();
        let ours = model.tokenizer().encode(text).unwrap();
        assert_eq!(ours, theirs, "tokenization of {text:?}");
        assert_eq!(model.tokenizer().decode(&ours), *text, "decode round-trips {text:?}");
    }

    // Chat template: the same rendered prompt for a multi-turn conversation.
    let messages = vec![
        Message::new("system", "You are terse."),
        Message::new("user", "Name a colour."),
        Message::new("assistant", "Blue."),
        Message::new("user", "Another?"),
    ];
    let theirs = server
        .post("/apply-template", json!({"messages": messages_json(&messages)}))
        .await
        .unwrap();
    assert_eq!(
        model.render_chat(&messages).unwrap(),
        theirs["prompt"].as_str().unwrap()
    );
}

fn messages_json(messages: &[Message]) -> serde_json::Value {
    messages
        .iter()
        .map(|m| json!({"role": m.role, "content": m.content}))
        .collect()
}
