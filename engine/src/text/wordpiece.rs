//! WordPiece tokenizers for BERT-style encoders, built with the `tokenizers` crate:
//! from a Hugging Face tokenizer.json, or from a GGUF vocabulary of llama.cpp's
//! `bert` kind.
//!
//! llama.cpp's converter stores a WordPiece vocabulary in "phantom space" form: a
//! word-initial piece `ab` as `▁ab`, a continuation `##ab` as `ab`, special tokens
//! unchanged. [`from_gguf`] undoes that and builds the tokenizer BERT's own
//! tokenizer.json describes: BERT's normalizer (clean text, CJK characters split,
//! lower-casing with accents stripped when the GGUF says lower-case), BERT's
//! pre-tokenizer (whitespace and punctuation), greedy longest-match WordPiece, and
//! `[CLS] … [SEP]` around each input.

use candle_core::quantized::gguf_file;
use serde_json::{json, Map, Value};
use std::path::Path;
use tokenizers::Tokenizer;

/// GGUF token type of control (special) tokens.
const CONTROL: i32 = 3;

/// The tokenizer of a Hugging Face BERT directory (`tokenizer.json`), without the
/// fixed padding and truncation such files often carry (all-MiniLM-L6-v2's pads
/// every input to 128 tokens): an input is embedded at its own length, and one over
/// the window is refused, not cut.
pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer, String> {
    let path = dir.join("tokenizer.json");
    let mut tok = Tokenizer::from_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    tok.with_padding(None);
    tok.with_truncation(None).map_err(|e| e.to_string())?;
    Ok(tok)
}

/// The tokenizer of a GGUF file whose `tokenizer.ggml.model` is `bert`.
pub fn from_gguf(ct: &gguf_file::Content) -> Result<Tokenizer, String> {
    let md = |k: &str| ct.metadata.get(k);
    let model = md("tokenizer.ggml.model").and_then(|v| v.to_string().ok());
    if model.map(String::as_str) != Some("bert") {
        return Err(format!(
            "tokenizer.ggml.model is {model:?}: a BERT encoder needs a WordPiece (\"bert\") vocabulary"
        ));
    }
    let tokens: Vec<String> = md("tokenizer.ggml.tokens")
        .and_then(|v| v.to_vec().ok())
        .ok_or("GGUF metadata has no tokenizer.ggml.tokens")?
        .iter()
        .map(|t| t.to_string().cloned().unwrap_or_default())
        .collect();
    let types: Vec<i32> = md("tokenizer.ggml.token_type")
        .and_then(|v| v.to_vec().ok())
        .map(|v| v.iter().map(|t| t.to_i32().unwrap_or(1)).collect())
        .unwrap_or_default();
    let id = |k: &str, default: u32| md(k).and_then(|v| v.to_u32().ok()).unwrap_or(default);
    // llama.cpp's defaults for a WPM vocabulary (llama-vocab.cpp).
    let (cls, sep, unk) = (
        id("tokenizer.ggml.bos_token_id", 101),
        id(
            "tokenizer.ggml.seperator_token_id",
            id("tokenizer.ggml.eos_token_id", 102),
        ),
        id("tokenizer.ggml.unknown_token_id", 100),
    );
    let lowercase = md("tokenizer.ggml.normalizer.lowercase")
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(true);
    let text = |i: u32| {
        tokens
            .get(i as usize)
            .cloned()
            .ok_or(format!("special token id {i} is outside the vocabulary"))
    };
    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let piece = if types.get(i) == Some(&CONTROL) {
            added.push(json!({"id": i, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true}));
            t.clone()
        } else if let Some(word) = t.strip_prefix('\u{2581}') {
            word.to_string()
        } else {
            format!("##{t}")
        };
        // The first id of a piece wins, as in llama.cpp's token map.
        vocab.entry(piece).or_insert(Value::from(i));
    }
    let spec = json!({
        "version": "1.0",
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
            "strip_accents": null, "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": [text(sep)?, sep], "cls": [text(cls)?, cls]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": text(unk)?, "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100, "vocab": vocab},
    });
    spec.to_string()
        .parse::<Tokenizer>()
        .map_err(|e| format!("building the WordPiece tokenizer: {e}"))
}
