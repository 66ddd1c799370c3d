//! Loading a vocabulary: a GGUF file's `tokenizer.ggml.*` metadata or a Hugging
//! Face `tokenizer.json`, into a [`GgufTokenizer`] — which tokens are special, which
//! end generation, each token's bytes, and the BPE or SentencePiece model behind it.
//! Follows llama.cpp's `llama_vocab::load`, including the tokens it recognises by
//! their text.

use super::spm::{self, Packed, SpecialSplitter, SpecialToken, SpmModel, SpmTokenizer};
use candle_core::quantized::gguf_file;
use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use super::specials::*;
use super::tokenizer::{Encoder, GgufTokenizer};

impl GgufTokenizer {
    /// Reads the GGUF metadata of the file at `path` and builds its tokenizer.
    pub fn from_path(path: &Path) -> Result<Self, TokenizerError> {
        let read_err = |reason: String| TokenizerError::Read {
            path: path.display().to_string(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| read_err(e.to_string()))?;
        let content = gguf_file::Content::read(&mut std::io::BufReader::with_capacity(1 << 20, &file))
            .map_err(|e| read_err(e.to_string()))?;
        Self::from_gguf(&content)
    }

    /// Builds the tokenizer from the GGUF metadata.
    pub fn from_gguf(ct: &gguf_file::Content) -> Result<Self, TokenizerError> {
        let model = md(ct, "tokenizer.ggml.model")?
            .to_string()
            .map_err(|e| TokenizerError::Metadata {
                key: "tokenizer.ggml.model",
                reason: e.to_string(),
            })?;
        let kind = match model.as_str() {
            "gpt2" => Kind::Bpe,
            "llama" => Kind::Spm,
            _ => return Err(TokenizerError::UnsupportedModel(model.clone())),
        };
        let tokens: Vec<Cow<str>> = md_strings(ct, "tokenizer.ggml.tokens")?
            .into_iter()
            .enumerate()
            // Empty texts are renamed as llama.cpp names them, so they stay distinct.
            .map(|(i, t)| {
                if t.is_empty() {
                    Cow::Owned(format!("[EMPTY_{i}]"))
                } else {
                    Cow::Borrowed(t)
                }
            })
            .collect();
        let n = tokens.len();
        let types = md_per_token(ct, "tokenizer.ggml.token_type", n, 1, |v| v.to_i32().ok())?;
        let mut attrs: Vec<u32> = types.iter().map(|&t| attr::from_type(t)).collect();
        let pre = md_str(ct, "tokenizer.ggml.pre").unwrap_or("default").to_string();
        let specials = find_specials(ct, kind, &tokens, &mut attrs);

        let is_control: Vec<bool> = attrs.iter().map(|a| a & attr::CONTROL != 0).collect();
        let token_bytes = token_pieces(kind, &tokens, &attrs);
        let add_bos = match (kind, md_bool(ct, "tokenizer.ggml.add_bos_token")) {
            (_, Some(add)) => add,
            (Kind::Spm, None) => true,
            (Kind::Bpe, None) => false,
        };
        let add_eos = md_bool(ct, "tokenizer.ggml.add_eos_token").unwrap_or(false);

        let encoder = match kind {
            Kind::Bpe => Encoder::Bpe(Box::new(build_bpe(ct, &tokens, &attrs, &pre)?)),
            Kind::Spm => {
                let add_space_prefix = md_bool(ct, "tokenizer.ggml.add_space_prefix").unwrap_or(true);
                let scores = md_per_token(ct, "tokenizer.ggml.scores", n, 0.0, |v| {
                    v.to_f32().ok().or_else(|| v.to_i32().ok().map(|i| i as f32))
                })?;
                let special_tokens = tokens
                    .iter()
                    .zip(&attrs)
                    .enumerate()
                    .filter(|(_, (_, &a))| a & attr::SPECIAL != 0)
                    .map(|(id, (text, &a))| SpecialToken {
                        id: id as u32,
                        text: text.to_string(),
                        lstrip: a & attr::LSTRIP != 0,
                        rstrip: a & attr::RSTRIP != 0,
                    })
                    .collect();
                let model = SpmModel::new(tokens.iter().map(|t| t.as_bytes()), scores, specials.unk);
                Encoder::Spm(SpmTokenizer::new(
                    model,
                    SpecialSplitter::new(special_tokens),
                    add_space_prefix,
                ))
            }
        };
        Ok(Self {
            encoder,
            token_bytes,
            is_control,
            add_bos: specials.bos.filter(|_| add_bos),
            add_eos: specials.eos.filter(|_| add_eos),
            eog: specials.eog,
            pre,
            digits: Default::default(),
        })
    }

    /// Builds the tokenizer of a Hugging Face model directory from its
    /// `tokenizer.json` (any model the `tokenizers` crate reads). BOS/EOS are added
    /// exactly when the file's post-processor adds them; end-of-generation ids are
    /// `extra_eog` (config.json's `eos_token_id`) plus the special tokens llama.cpp
    /// recognises by their text (`<|im_end|>`, `<|eot_id|>`, …).
    pub fn from_hf_dir(dir: &Path, extra_eog: &[u32]) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let read_err = |reason: String| TokenizerError::Read {
            path: path.display().to_string(),
            reason,
        };
        let json = std::fs::read_to_string(&path).map_err(|e| read_err(e.to_string()))?;
        let inner: Tokenizer = json.parse().map_err(|e: tokenizers::Error| read_err(e.to_string()))?;
        let raw: serde_json::Value = serde_json::from_str(&json).map_err(|e| read_err(e.to_string()))?;
        // Byte-level vocabularies spell bytes with GPT-2's table; the others (SentencePiece
        // exports) use `▁` for spaces and `<0xXX>` byte tokens.
        let byte_level = raw["decoder"].to_string().contains("ByteLevel");
        let kind = if byte_level { Kind::Bpe } else { Kind::Spm };
        let n = inner.get_vocab_size(true);
        let added: HashMap<u32, bool> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| (id, t.special))
            .collect();
        let tokens: Vec<Cow<str>> = (0..n as u32)
            .map(|id| Cow::Owned(inner.id_to_token(id).unwrap_or_default()))
            .collect();
        let attrs: Vec<u32> = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| match added.get(&(id as u32)) {
                Some(true) => attr::CONTROL,
                Some(false) => attr::USER_DEFINED,
                None if !byte_level && t.len() == 6 && t.starts_with("<0x") && t.ends_with('>') => attr::BYTE,
                None => attr::NORMAL,
            })
            .collect();
        let is_control: Vec<bool> = attrs.iter().map(|a| a & attr::CONTROL != 0).collect();
        let token_bytes = token_pieces(kind, &tokens, &attrs);

        // What the post-processor adds around a text.
        let probe = |special: bool| inner.encode_fast("a", special).map(|e| e.get_ids().to_vec());
        let (with, without) = match (probe(true), probe(false)) {
            (Ok(w), Ok(wo)) => (w, wo),
            (Err(e), _) | (_, Err(e)) => return Err(TokenizerError::Build(e.to_string())),
        };
        let (add_bos, add_eos) = match with.windows(without.len().max(1)).position(|w| w == without.as_slice()) {
            Some(at) => (
                with[..at].first().copied(),
                with.get(at + without.len()..).and_then(|t| t.first().copied()),
            ),
            None => (None, None),
        };
        let mut eog: Vec<u32> = extra_eog.iter().copied().filter(|&id| (id as usize) < n).collect();
        for (id, t) in tokens.iter().enumerate() {
            if is_control[id] && EOG_TEXTS.contains(&t.as_ref()) {
                eog.push(id as u32);
            }
        }
        eog.sort_unstable();
        eog.dedup();
        Ok(Self {
            encoder: Encoder::Bpe(Box::new(inner)),
            token_bytes,
            is_control,
            add_bos,
            add_eos,
            eog,
            pre: "tokenizer.json".into(),
            digits: Default::default(),
        })
    }
}

/// The bytes each token prints as (llama.cpp `token_to_piece` with `special = true`):
/// special tokens their text, byte tokens their byte, normal tokens their text decoded
/// (SPM: `▁` → space; BPE: the GPT-2 byte table), anything else nothing.
fn token_pieces(kind: Kind, tokens: &[Cow<str>], attrs: &[u32]) -> Packed {
    let chars = byte_to_char();
    let char_to_byte: HashMap<char, u8> = chars.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
    let mut pieces = Packed::default();
    let mut out = Vec::new();
    for (t, &a) in tokens.iter().zip(attrs) {
        out.clear();
        if a & attr::SPECIAL != 0 {
            out.extend_from_slice(t.as_bytes());
        } else if a & attr::NORMAL != 0 {
            match kind {
                Kind::Spm => {
                    let mut rest = t.as_bytes();
                    while let Some((&b, tail)) = rest.split_first() {
                        match rest.strip_prefix(spm::SPACE_ESCAPE.as_bytes()) {
                            Some(after) => {
                                out.push(b' ');
                                rest = after;
                            }
                            None => {
                                out.push(b);
                                rest = tail;
                            }
                        }
                    }
                }
                Kind::Bpe => {
                    // Unmapped chars (rare) keep their UTF-8.
                    for c in t.chars() {
                        match char_to_byte.get(&c) {
                            Some(&b) => out.push(b),
                            None => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                }
            }
        } else if a & attr::BYTE != 0 {
            out.push(byte_token_value(t));
        }
        pieces.push(&out);
    }
    pieces
}

/// The `tokenizers` BPE for a `gpt2` vocabulary.
fn build_bpe(
    ct: &gguf_file::Content,
    tokens: &[Cow<str>],
    attrs: &[u32],
    pre: &str,
) -> Result<Tokenizer, TokenizerError> {
    let merges = md_strings(ct, "tokenizer.ggml.merges")?;
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
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
    inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    inner.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(attrs)
        .filter(|(_, &a)| a & attr::SPECIAL != 0)
        .map(|(s, &a)| AddedToken::from(s.to_string(), a & attr::CONTROL != 0))
        .collect();
    inner.add_special_tokens(&added);
    Ok(inner)
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
