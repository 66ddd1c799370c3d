//! The SentencePiece (`tokenizer.ggml.model = "llama"`) tokenizer against llama.cpp on
//! Gemma 3 270M: the same ids from llama-server's `/tokenize` (BOS, special tokens
//! written in the text, byte fallback, user-defined whitespace tokens), the same text
//! from `/detokenize`, and the same bytes for every token of the vocabulary.

use serde_json::json;
use std::time::Instant;
use switchyard_engine::text::tokenizer::GgufTokenizer;
use switchyard_testkit::*;

/// Text that exercises the tokenizer: ASCII, accents, CJK, emoji, code, whitespace
/// runs (Gemma has user-defined tokens for runs of spaces, tabs and newlines), numbers,
/// contractions, special tokens, a literal `▁`, and characters only byte fallback can
/// encode.
const CORPUS: &[&str] = &[
    "",
    "Hello, world!",
    "naïve café résumé — Ångström, Zürich, Straße",
    "日本語のテキストと中文字符，还有한국어",
    "emoji 🚀🔥👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "spaces    and\t\ttabs\n\n\n  newlines  \r\n end",
    "numbers 1234567890 3.14159 1e-9 0x1F 2024-11-21",
    "   leading spaces and trailing spaces   ",
    "it's we're they've I'm you'll he'd DON'T",
    " ",
    "\n",
    "a                                                  b",
    "\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nx",
    "\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\t\ty",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>Hello<eos>",
    "<start_of_turn><end_of_turn><unused0><unused6241><pad><unk><mask>[multimodal]",
    "<start_of_turn",
    "<<start_of_turn>>",
    "<div><span>html</span></div><table><tr><td>1</td></tr></table>",
    "end of text</s>after",
    "literal ▁ escape ▁▁ and▁joined",
    "▁",
    "rare \u{1F9FF} \u{10FFFF} \u{E000} \u{2FFFF} (U+10FFFF and U+2FFFF need byte fallback)",
    "control \u{0}\u{1}\u{7}\u{8}\u{B}\u{C}\u{1B}\u{7F} chars",
    "\u{200B}zero\u{200D}width\u{FEFF}",
    "mixed scripts: Ελληνικά, русский, עברית, العربية, हिन्दी, ไทย",
    "<0x41> is not a byte token in text",
    // Equal-score merges ("xx" is a token, "xxx" is not): the leftmost pair must win.
    "$$$\nnnn\nkkk\n看看看\n|||\n&&&\nYYY\n$$$$$",
];

/// A deterministic pseudo-random generator (no dependency needed).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Random strings built from pieces that stress the merge order, the special-token
/// split and byte fallback.
fn random_texts(count: usize) -> Vec<String> {
    const PIECES: &[&str] = &[
        "a",
        "e",
        "th",
        "the",
        " ",
        "  ",
        "   ",
        "\n",
        "\n\n",
        "\t",
        "\r",
        "ing",
        "tion",
        "un",
        "é",
        "ß",
        "日",
        "本",
        "語",
        "🚀",
        "👍🏽",
        "▁",
        "<",
        ">",
        "/",
        "<start_of_turn>",
        "<end_of_turn>",
        "<bos>",
        "<eos>",
        "<unused12>",
        "</s>",
        "<div>",
        "start_of_turn",
        "0",
        "12",
        "345",
        "'s",
        "'t",
        ".",
        ",",
        "!",
        "\u{0}",
        "\u{7}",
        "\u{10FFFF}",
        "\u{2FFFF}",
        "\u{1F9FF}",
        "\u{E001}",
        "x",
        "Q",
        "hello",
        "world",
        "é",
        "\u{301}",
    ];
    let mut rng = Lcg(0x5eed);
    (0..count)
        .map(|_| {
            let len = 1 + (rng.next() % 24) as usize;
            (0..len)
                .map(|_| PIECES[(rng.next() % PIECES.len() as u64) as usize])
                .collect()
        })
        .collect()
}

async fn tokenize(server: &LlamaServer, text: &str) -> Vec<u32> {
    let answer = server
        .post(
            "/tokenize",
            json!({"content": text, "add_special": true, "parse_special": true}),
        )
        .await
        .unwrap();
    serde_json::from_value(answer["tokens"].clone()).unwrap()
}

async fn detokenize(server: &LlamaServer, ids: &[u32]) -> String {
    let answer = server.post("/detokenize", json!({"tokens": ids})).await.unwrap();
    answer["content"].as_str().unwrap().to_string()
}

/// Checks `text` against llama-server: ids, and the decoded text without the BOS.
async fn check(server: &LlamaServer, tok: &GgufTokenizer, text: &str) {
    let theirs = tokenize(server, text).await;
    let ours = tok.encode(text).unwrap();
    assert_eq!(ours, theirs, "tokenization of {text:?}");
    assert_eq!(ours.first(), Some(&2), "BOS first for {text:?}");
    let body = &ours[1..];
    let decoded = tok.decode(body);
    assert_eq!(decoded, detokenize(server, body).await, "detokenization of {text:?}");
    // Byte fallback and whitespace tokens make decoding lossless, except that a
    // literal `▁` reads back as a space (in llama.cpp too).
    if !text.contains('▁') {
        assert_eq!(decoded, text, "decode round-trips {text:?}");
    } else {
        assert_eq!(decoded, text.replace('▁', " "), "decode of {text:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_tokenizer_matches_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let Some(path) = gemma_model() else { return };

    let started = Instant::now();
    let tok = GgufTokenizer::from_path(&path).expect("Gemma tokenizer loads");
    eprintln!(
        "Gemma tokenizer: loaded in {:?} (GGUF metadata read included)",
        started.elapsed()
    );
    assert_eq!(tok.vocab_size(), 262_144);
    assert_eq!(tok.pre(), "default");
    // llama-server logs these as its EOG tokens: <eos>, <end_of_turn>, and `</s>`
    // (user-defined in Gemma 3, but on llama.cpp's list of end-of-generation texts).
    assert_eq!(tok.eog_ids(), &[1, 106, 212]);
    assert!(tok.is_control(105) && tok.is_control(106) && tok.is_control(2));
    assert!(!tok.is_control(236746), "a normal token");

    let server = LlamaServer::start(&bin, &path, 1, 1).await.unwrap();

    for text in CORPUS {
        check(&server, &tok, text).await;
    }
    for text in random_texts(300) {
        check(&server, &tok, &text).await;
    }

    // A long prompt: identical ids, encoded in milliseconds.
    let long: String = CORPUS.iter().cycle().take(200).copied().collect::<Vec<_>>().join(" ");
    let started = Instant::now();
    let ours = tok.encode(&long).unwrap();
    let took = started.elapsed();
    eprintln!(
        "Gemma tokenizer: {} chars -> {} tokens in {took:?}",
        long.chars().count(),
        ours.len()
    );
    assert_eq!(ours, tokenize(&server, &long).await, "tokenization of the long text");
}

/// The chat prompt for a multi-turn conversation renders as llama-server renders it.
/// This GGUF carries no `tokenizer.chat_template`, so both fall back to ChatML.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_chat_template_matches_llama_server() {
    let Some(bin) = llama_server_bin() else { return };
    let Some(path) = gemma_model() else { return };
    let model = switchyard_engine::EngineModel::load(&path, &switchyard_messages::LoadConfig::default()).unwrap();
    let server = LlamaServer::start(&bin, &path, 1, 1).await.unwrap();
    let turns = [
        ("system", "You are terse."),
        ("user", "Name a colour."),
        ("assistant", "Blue."),
        ("user", "Another?"),
    ];
    let messages: Vec<switchyard_messages::Message> = turns
        .iter()
        .map(|&(r, c)| switchyard_messages::Message::new(r, c))
        .collect();
    let body: Vec<serde_json::Value> = turns.iter().map(|(r, c)| json!({"role": r, "content": c})).collect();
    let theirs = server.post("/apply-template", json!({"messages": body})).await.unwrap();
    assert_eq!(
        model.render_chat(&messages).unwrap(),
        theirs["prompt"].as_str().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemma3_token_bytes_match_llama_server_for_the_whole_vocabulary() {
    let Some(bin) = llama_server_bin() else { return };
    let Some(path) = gemma_model() else { return };
    let tok = GgufTokenizer::from_path(&path).expect("Gemma tokenizer loads");
    let server = LlamaServer::start(&bin, &path, 1, 1).await.unwrap();

    // Every token whose bytes are valid UTF-8, detokenized in batches with a separator
    // token (`<unused0>`) between them, must print exactly its `token_bytes`.
    const SEP: u32 = 6;
    let sep = std::str::from_utf8(tok.token_bytes(SEP)).unwrap().to_string();
    assert_eq!(sep, "<unused0>");
    let ids: Vec<u32> = (0..tok.vocab_size() as u32)
        .filter(|&id| id != SEP && std::str::from_utf8(tok.token_bytes(id)).is_ok())
        .collect();
    assert!(ids.len() > 262_000, "only {} tokens are valid UTF-8", ids.len());
    for chunk in ids.chunks(8192) {
        let request: Vec<u32> = chunk.iter().flat_map(|&id| [id, SEP]).collect();
        let theirs = detokenize(&server, &request).await;
        let pieces: Vec<&str> = theirs.split(sep.as_str()).collect();
        assert_eq!(pieces.len(), chunk.len() + 1, "a token printed the separator");
        for (&id, piece) in chunk.iter().zip(&pieces) {
            assert_eq!(tok.token_bytes(id), piece.as_bytes(), "bytes of token {id}");
        }
    }

    // The byte tokens print one raw byte each (llama-server reports pieces that are not
    // UTF-8 as arrays of byte values).
    let text = "\u{10FFFF}\u{0}\r\u{2FFFF}é";
    let answer = server
        .post(
            "/tokenize",
            json!({"content": text, "add_special": false, "with_pieces": true}),
        )
        .await
        .unwrap();
    let mut bytes = Vec::new();
    for entry in answer["tokens"].as_array().unwrap() {
        let id = entry["id"].as_u64().unwrap() as u32;
        let piece: Vec<u8> = match &entry["piece"] {
            serde_json::Value::String(s) => s.as_bytes().to_vec(),
            serde_json::Value::Array(a) => a.iter().map(|b| b.as_u64().unwrap() as u8).collect(),
            other => panic!("unexpected piece {other}"),
        };
        assert_eq!(tok.token_bytes(id), piece.as_slice(), "bytes of token {id}");
        bytes.extend(piece);
    }
    assert_eq!(bytes, text.as_bytes());
}

/// The end-of-generation bookkeeping is shared with the BPE path: llama-server (run
/// with `-v`) lists `<|endoftext|>`, `<|im_end|>` and `<reponame>` (its FIM-repo token,
/// found by text) as SmolLM2's EOG tokens.
#[test]
fn smollm2_end_of_generation_ids_match_llama_cpp() {
    let tok = GgufTokenizer::from_path(&demo_model()).expect("SmolLM2 tokenizer loads");
    assert_eq!(tok.eog_ids(), &[0, 2, 4]);
    assert_eq!(
        tok.encode("<|im_start|>user\nHi<|im_end|>").unwrap(),
        vec![1, 4093, 198, 26843, 2]
    );
}
