//! A tokenizer built from a GGUF file's own metadata (`tokenizer.ggml.*`), giving the
//! same token ids as llama.cpp.
//!
//! Encoding uses the `tokenizers` crate's BPE with the pre-tokenizer llama.cpp picks
//! for `tokenizer.ggml.pre`. (candle's built-in GGUF tokenizer adds a prefix space,
//! which mis-tokenizes byte-level BPE models such as SmolLM2.) Decoding is done here:
//! each token maps to its exact bytes, and [`StreamDecoder`] emits text only at UTF-8
//! character boundaries, so a streamed token never carries half a character.

use candle_core::quantized::gguf_file;
use std::collections::HashMap;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// GGUF token types (llama.cpp `llama_token_type`).
const TOKEN_TYPE_CONTROL: i32 = 3;
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Why a tokenizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A metadata key is missing or of the wrong type.
    #[error("GGUF metadata {key}: {reason}")]
    Metadata {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A tokenizer model this build does not implement.
    #[error("tokenizer.ggml.model = {0:?} is not supported (supported: gpt2)")]
    UnsupportedModel(String),
    /// The `tokenizers` crate refused the vocabulary.
    #[error("building the BPE tokenizer: {0}")]
    Build(String),
}

/// The GPT-2 / Llama-3 style split regex (llama.cpp `LLAMA_VOCAB_PRE_TYPE_GPT2`).
const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`.
const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`.
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A GGUF vocabulary: encode text to ids, decode ids to bytes.
pub struct GgufTokenizer {
    inner: Tokenizer,
    /// Exact bytes of every token (control tokens: their text).
    token_bytes: Vec<Vec<u8>>,
    is_control: Vec<bool>,
    /// `tokenizer.ggml.bos_token_id`, when the model wants it prepended.
    add_bos: Option<u32>,
    /// Ids that end generation (EOS, EOT, `<|im_end|>`, …).
    eog: Vec<u32>,
    pre: String,
}

fn md<'a>(ct: &'a gguf_file::Content, key: &'static str) -> Result<&'a gguf_file::Value, TokenizerError> {
    ct.metadata.get(key).ok_or(TokenizerError::Metadata {
        key,
        reason: "missing".into(),
    })
}

fn md_strings(ct: &gguf_file::Content, key: &'static str) -> Result<Vec<String>, TokenizerError> {
    let bad = |reason: String| TokenizerError::Metadata { key, reason };
    md(ct, key)?
        .to_vec()
        .map_err(|e| bad(e.to_string()))?
        .iter()
        .map(|v| v.to_string().cloned().map_err(|e| bad(e.to_string())))
        .collect()
}

fn md_u32(ct: &gguf_file::Content, key: &'static str) -> Option<u32> {
    ct.metadata.get(key).and_then(|v| v.to_u32().ok())
}

fn md_bool(ct: &gguf_file::Content, key: &'static str) -> Option<bool> {
    ct.metadata.get(key).and_then(|v| v.to_bool().ok())
}

/// GPT-2's reversible byte ↔ printable-char table: the char each byte is shown as.
fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        let printable = (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        table[b as usize] = if printable {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("valid scalar")
        };
    }
    table
}

impl GgufTokenizer {
    /// Builds the tokenizer from the GGUF metadata.
    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self, TokenizerError> {
        let model = md(ct, "tokenizer.ggml.model")?
            .to_string()
            .map_err(|e| TokenizerError::Metadata {
                key: "tokenizer.ggml.model",
                reason: e.to_string(),
            })?
            .clone();
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model));
        }
        let tokens = md_strings(ct, "tokenizer.ggml.tokens")?;
        let merges = md_strings(ct, "tokenizer.ggml.merges")?;
        let types: Vec<i32> = match ct.metadata.get("tokenizer.ggml.token_type") {
            Some(v) => v
                .to_vec()
                .map_err(|e| TokenizerError::Metadata {
                    key: "tokenizer.ggml.token_type",
                    reason: e.to_string(),
                })?
                .iter()
                .map(|t| t.to_i32().unwrap_or(1))
                .collect(),
            None => vec![1; tokens.len()],
        };
        let pre = ct
            .metadata
            .get("tokenizer.ggml.pre")
            .and_then(|v| v.to_string().ok())
            .cloned()
            .unwrap_or_else(|| "default".into());

        let vocab: tokenizers::models::bpe::Vocab =
            tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let merges: Vec<(String, String)> = merges
            .iter()
            .filter_map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .ignore_merges(pre == "llama-bpe" || pre == "llama3")
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        let mut inner = Tokenizer::new(bpe);
        inner.with_pre_tokenizer(Some(pre_tokenizer(&pre)?));
        inner.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));

        let is_control: Vec<bool> = (0..tokens.len())
            .map(|i| matches!(types.get(i), Some(&TOKEN_TYPE_CONTROL)))
            .collect();
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
            .map(|(s, &t)| AddedToken::from(s.clone(), t == TOKEN_TYPE_CONTROL))
            .collect();
        inner.add_special_tokens(&added);

        let chars = byte_to_char();
        let char_to_byte: HashMap<char, u8> = chars.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        let token_bytes = tokens
            .iter()
            .zip(&is_control)
            .map(|(t, &control)| {
                if control {
                    t.as_bytes().to_vec()
                } else {
                    // Unmapped chars (rare, user-defined tokens) keep their UTF-8.
                    let mut out = Vec::with_capacity(t.len());
                    for c in t.chars() {
                        match char_to_byte.get(&c) {
                            Some(&b) => out.push(b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    out
                }
            })
            .collect();

        let bos = md_u32(ct, "tokenizer.ggml.bos_token_id");
        let add_bos = if md_bool(ct, "tokenizer.ggml.add_bos_token").unwrap_or(false) {
            bos
        } else {
            None
        };
        let mut eog: Vec<u32> = [
            "tokenizer.ggml.eos_token_id",
            "tokenizer.ggml.eot_token_id",
            "tokenizer.ggml.eom_token_id",
        ]
        .iter()
        .filter_map(|k| md_u32(ct, k))
        .collect();
        // llama.cpp also treats these control tokens as end-of-generation by their text.
        for (i, t) in tokens.iter().enumerate() {
            let known = matches!(
                t.as_str(),
                "<|eot_id|>"
                    | "<|im_end|>"
                    | "<|end|>"
                    | "<end_of_turn>"
                    | "<|endoftext|>"
                    | "<|eom_id|>"
                    | "<EOT>"
                    | "<|end_of_text|>"
            );
            if known && is_control[i] && !eog.contains(&(i as u32)) {
                eog.push(i as u32);
            }
        }
        Ok(Self {
            inner,
            token_bytes,
            is_control,
            add_bos,
            eog,
            pre,
        })
    }

    /// Token ids for `text`, with BOS prepended when the model asks for it. Control
    /// tokens written in the text (e.g. `<|im_start|>`) are recognised, as llama.cpp
    /// does for prompts.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let enc = self.inner.encode_fast(text, false).map_err(|e| e.to_string())?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        ids.extend(self.add_bos);
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The exact bytes of token `id` (empty for an unknown id).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes.get(id as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Whether `id` is a control token (its text is markup, not content).
    pub fn is_control(&self, id: u32) -> bool {
        self.is_control.get(id as usize).copied().unwrap_or(false)
    }

    /// Decodes ids to text (invalid UTF-8 replaced).
    pub fn decode(&self, ids: &[u32]) -> String {
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| self.token_bytes(id).iter().copied())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Ids that end generation.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The GGUF's pre-tokenizer name.
    pub fn pre(&self) -> &str {
        &self.pre
    }
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, TokenizerError> {
    let split = |pattern: &str| -> Result<PreTokenizerWrapper, TokenizerError> {
        let s = Split::new(
            SplitPattern::Regex(pattern.into()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Build(e.to_string()))?;
        Ok(Sequence::new(vec![s.into(), ByteLevel::new(false, false, false).into()]).into())
    };
    match pre {
        // SmolLM and the StarCoder family: single digits, then GPT-2's regex.
        "smollm" | "starcoder" | "refact" | "codeshell" => Ok(Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, false, true).into(),
        ])
        .into()),
        "llama-bpe" | "llama3" | "dbrx" | "smaug-bpe" => split(LLAMA3_PATTERN),
        "qwen2" | "deepseek-r1-qwen" => split(QWEN2_PATTERN),
        _ => split(GPT2_PATTERN),
    }
}

/// Turns a stream of token ids into text pieces that always end on a UTF-8
/// character boundary.
#[derive(Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// Adds a token's bytes and returns the text completed so far ("" if the token
    /// ends inside a character).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // An invalid sequence (not just an incomplete one): replace it.
            Err(_) => {
                let text = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                return text;
            }
        };
        let rest = self.pending.split_off(valid);
        String::from_utf8(std::mem::replace(&mut self.pending, rest)).unwrap_or_default()
    }

    /// Whatever is left at the end (an unfinished character, replaced).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_decoder_holds_partial_characters() {
        let mut d = StreamDecoder::default();
        let rocket = "🚀".as_bytes();
        assert_eq!(d.push(&rocket[..2]), "");
        assert_eq!(d.push(&rocket[2..]), "🚀");
        assert_eq!(d.push(b"ab"), "ab");
        assert_eq!(d.push(&[0xC3]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }

    #[test]
    fn byte_table_is_a_bijection() {
        let t = byte_to_char();
        let set: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(set.len(), 256);
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
    }
}
