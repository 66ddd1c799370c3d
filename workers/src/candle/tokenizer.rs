//! A tokenizer built from a GGUF file's own metadata (`tokenizer.ggml.*`), giving the
//! same token ids as llama.cpp.
//!
//! Two tokenizer models are supported:
//! - `gpt2` (byte-level BPE: SmolLM2, Llama 3, Qwen, …) uses the `tokenizers` crate's
//!   BPE with the pre-tokenizer llama.cpp picks for `tokenizer.ggml.pre`. (candle's
//!   built-in GGUF tokenizer adds a prefix space, which mis-tokenizes byte-level BPE
//!   models such as SmolLM2.)
//! - `llama` (SentencePiece-style: Gemma, Llama 2, Mistral, …) uses [`super::spm`], a
//!   port of llama.cpp's SPM tokenizer.
//!
//! Which tokens are special (control / user-defined) and which end generation follows
//! llama.cpp's `llama_vocab::load`, including the tokens it recognises by their text.
//! Decoding is done here: each token maps to its exact bytes, and [`StreamDecoder`]
//! emits text only at UTF-8 character boundaries, so a streamed token never carries
//! half a character.

use super::spm::{self, Packed, SpecialSplitter, SpecialToken, SpmModel, SpmTokenizer};
use candle_core::quantized::gguf_file;
use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

/// llama.cpp token attributes (`llama_token_attr`), derived from the GGUF token types
/// (`llama_token_type`) and then adjusted by token text.
mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
    /// Tokens matched in text before tokenizing (llama.cpp's special-token cache).
    pub const SPECIAL: u32 = CONTROL | USER_DEFINED | UNKNOWN;

    /// The attribute of a GGUF token type.
    pub fn from_type(token_type: i32) -> u32 {
        match token_type {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => 0,
        }
    }
}

/// Why a tokenizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The GGUF file could not be read.
    #[error("reading {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// A metadata key is missing or of the wrong type.
    #[error("GGUF metadata {key}: {reason}")]
    Metadata {
        /// The key.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A tokenizer model this build does not implement.
    #[error("tokenizer.ggml.model = {0:?} is not supported (supported: gpt2 (byte-level BPE), llama (SentencePiece))")]
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

/// Token texts llama.cpp takes as end-of-turn (`special_eot_id`) when the metadata
/// names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
/// … as end-of-message (`special_eom_id`).
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
/// … as fill-in-the-middle prefix.
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
/// … as fill-in-the-middle suffix.
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
/// … as fill-in-the-middle middle.
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
/// … as fill-in-the-middle padding.
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
/// … as fill-in-the-middle repository name.
const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
/// … as fill-in-the-middle file separator.
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Token texts llama.cpp always treats as end-of-generation (and as control tokens).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// The tokenizer model behind a [`GgufTokenizer`].
enum Encoder {
    /// `tokenizer.ggml.model = "gpt2"`.
    Bpe(Box<Tokenizer>),
    /// `tokenizer.ggml.model = "llama"`.
    Spm(SpmTokenizer),
}

/// A GGUF vocabulary: encode text to ids, decode ids to bytes.
pub struct GgufTokenizer {
    encoder: Encoder,
    /// Exact bytes of every token (control tokens: their text).
    token_bytes: Packed,
    is_control: Vec<bool>,
    /// `tokenizer.ggml.bos_token_id`, when the model wants it prepended.
    add_bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`, when the model wants it appended.
    add_eos: Option<u32>,
    /// Ids that end generation (EOS, EOT, `<|im_end|>`, …), ascending.
    eog: Vec<u32>,
    pre: String,
}

fn md<'a>(ct: &'a gguf_file::Content, key: &'static str) -> Result<&'a gguf_file::Value, TokenizerError> {
    ct.metadata.get(key).ok_or(TokenizerError::Metadata {
        key,
        reason: "missing".into(),
    })
}

/// A string array, borrowed from the metadata.
fn md_strings<'a>(ct: &'a gguf_file::Content, key: &'static str) -> Result<Vec<&'a str>, TokenizerError> {
    let bad = |reason: String| TokenizerError::Metadata { key, reason };
    md(ct, key)?
        .to_vec()
        .map_err(|e| bad(e.to_string()))?
        .iter()
        .map(|v| v.to_string().map(String::as_str).map_err(|e| bad(e.to_string())))
        .collect()
}

/// A token id (GGUF writes them as u32; other integer types are accepted too).
fn md_u32(ct: &gguf_file::Content, key: &str) -> Option<u32> {
    let v = ct.metadata.get(key)?;
    v.to_u32()
        .ok()
        .or_else(|| v.to_i32().ok().and_then(|i| u32::try_from(i).ok()))
        .or_else(|| v.to_u64().ok().and_then(|i| u32::try_from(i).ok()))
}

fn md_bool(ct: &gguf_file::Content, key: &'static str) -> Option<bool> {
    ct.metadata.get(key).and_then(|v| v.to_bool().ok())
}

fn md_str<'a>(ct: &'a gguf_file::Content, key: &'static str) -> Option<&'a str> {
    ct.metadata
        .get(key)
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
}

/// A per-token numeric array (`token_type`, `scores`), one value per token; absent or
/// malformed entries take `default`.
fn md_per_token<T: Copy>(
    ct: &gguf_file::Content,
    key: &'static str,
    n: usize,
    default: T,
    convert: impl Fn(&gguf_file::Value) -> Option<T>,
) -> Result<Vec<T>, TokenizerError> {
    let Some(v) = ct.metadata.get(key) else {
        return Ok(vec![default; n]);
    };
    let values = v.to_vec().map_err(|e| TokenizerError::Metadata {
        key,
        reason: e.to_string(),
    })?;
    let mut out: Vec<T> = values.iter().take(n).map(|v| convert(v).unwrap_or(default)).collect();
    out.resize(n, default);
    Ok(out)
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

/// The byte a `<0xXX>` token stands for (llama.cpp `token_to_byte`: `strtol` on the
/// two characters after `<0x`, so a malformed token gives the digits it does have).
fn byte_token_value(text: &str) -> u8 {
    let digits = text.as_bytes().get(3..).unwrap_or(&[]);
    let mut value = 0u8;
    for &d in digits.iter().take(2) {
        match char::from(d).to_digit(16) {
            Some(v) => value = value * 16 + v as u8,
            None => break,
        }
    }
    value
}

/// The tokenizer model kinds this module implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bpe,
    Spm,
}

/// Special ids from the metadata and the token texts, as llama.cpp's
/// `llama_vocab::load` finds them.
struct Specials {
    bos: Option<u32>,
    eos: Option<u32>,
    unk: Option<u32>,
    /// End-of-generation ids, ascending.
    eog: Vec<u32>,
}

/// Finds the special ids and end-of-generation tokens, and updates `attrs` the way
/// llama.cpp does: tokens recognised by their text (EOT, EOM, FIM, EOG texts) become
/// control tokens, a few are demoted, and Phi-3 style models strip whitespace to the
/// right of special tokens.
///
/// llama.cpp walks a hash map, so when a vocabulary holds several candidate texts for
/// one EOT/EOM/FIM slot it takes an unspecified one; this takes the lowest id.
fn find_specials(ct: &gguf_file::Content, kind: Kind, tokens: &[Cow<str>], attrs: &mut [u32]) -> Specials {
    let n = tokens.len();
    // Every text recognised below starts like this; most tokens are skipped at once.
    let candidate = |t: &str| t.starts_with(['<', '[', '_']) || t.starts_with("\u{2581}<");
    let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
    // A metadata id overrides `default` when it is in range.
    let id = |key: &str, default: Option<u32>| in_range(md_u32(ct, key)).or(in_range(default));
    let (bos_default, eos_default, unk_default) = match kind {
        Kind::Spm => (Some(1), Some(2), Some(0)),
        Kind::Bpe => (Some(11), Some(11), None),
    };
    let bos = id("tokenizer.ggml.bos_token_id", bos_default);
    let eos = id("tokenizer.ggml.eos_token_id", eos_default);
    let unk = id("tokenizer.ggml.unknown_token_id", unk_default);
    let fim_pre = id("tokenizer.ggml.fim_pre_token_id", None);
    let fim_suf = id("tokenizer.ggml.fim_suf_token_id", None);
    let fim_mid = id("tokenizer.ggml.fim_mid_token_id", None);
    // Slots filled by token text when the metadata leaves them empty.
    let mut slots: [(Option<u32>, &[&str]); 8] = [
        (id("tokenizer.ggml.eot_token_id", None), EOT_TEXTS),
        (id("tokenizer.ggml.eom_token_id", None), EOM_TEXTS),
        (id("tokenizer.ggml.prefix_token_id", fim_pre), FIM_PRE_TEXTS),
        (id("tokenizer.ggml.suffix_token_id", fim_suf), FIM_SUF_TEXTS),
        (id("tokenizer.ggml.middle_token_id", fim_mid), FIM_MID_TEXTS),
        (id("tokenizer.ggml.fim_pad_token_id", None), FIM_PAD_TEXTS),
        (id("tokenizer.ggml.fim_rep_token_id", None), FIM_REP_TEXTS),
        (id("tokenizer.ggml.fim_sep_token_id", None), FIM_SEP_TEXTS),
    ];
    for (i, text) in tokens.iter().enumerate().filter(|(_, t)| candidate(t)) {
        for (slot, texts) in slots.iter_mut() {
            if slot.is_none() && texts.contains(&text.as_ref()) {
                *slot = Some(i as u32);
                attrs[i] |= attr::CONTROL;
            }
        }
    }
    let [(eot, _), (eom, _), _, _, _, (fim_pad, _), (fim_rep, _), (fim_sep, _)] = slots;

    let mut eog: BTreeSet<u32> = [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
    for (i, text) in tokens.iter().enumerate().filter(|(_, t)| candidate(t)) {
        if EOG_TEXTS.contains(&text.as_ref()) {
            eog.insert(i as u32);
            attrs[i] |= attr::CONTROL;
        }
    }
    // gpt-oss: these are always rendered.
    for (i, text) in tokens.iter().enumerate().filter(|(_, t)| candidate(t)) {
        if matches!(
            text.as_ref(),
            "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
        ) {
            attrs[i] = attr::USER_DEFINED;
        }
    }
    eog.extend([eos, eot, eom].into_iter().flatten());
    let eog_with = |eog: &BTreeSet<u32>, texts: &[&str]| {
        eog.iter()
            .copied()
            .find(|&i| texts.contains(&tokens[i as usize].as_ref()))
    };
    // o200k_harmony / solar-open: `<|end|>` ends a message, not the generation.
    let (has_return, has_call, has_flush) = (
        eog_with(&eog, &["<|return|>"]).is_some(),
        eog_with(&eog, &["<|call|>", "<|calls|>"]).is_some(),
        eog_with(&eog, &["<|flush|>"]).is_some(),
    );
    if let Some(end) = eog_with(&eog, &["<|end|>"]) {
        if has_call && (has_return || has_flush) {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
    }
    // Gemma 4 / PLaMo: `</s>` is an ordinary token there.
    if eog_with(&eog, &["<|tool_response>", "<|plamo:eos|>"]).is_some() {
        if let Some(s) = eog_with(&eog, &["</s>"]) {
            eog.remove(&s);
            attrs[s as usize] = attr::NORMAL;
        }
    }

    // Per-model strip flags (they do not change how a token prints).
    let name = md_str(ct, "general.name").unwrap_or("").to_lowercase();
    let pre = md_str(ct, "tokenizer.ggml.pre").unwrap_or("");
    let arch = md_str(ct, "general.architecture").unwrap_or("");
    let find = |text: &str| tokens.iter().position(|t| t == text);
    if ["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"]
        .iter()
        .any(|p| pre.contains(p))
        || ["nomic-bert-moe", "jina-bert-v3"].iter().any(|a| arch.contains(a))
    {
        if let Some(i) = find("<mask>") {
            attrs[i] |= attr::LSTRIP;
        }
    } else if name.contains("phi-3") || name.contains("phi3") {
        for a in attrs.iter_mut().filter(|a| **a & attr::SPECIAL != 0) {
            *a |= attr::RSTRIP;
        }
        if let Some(i) = find("</s>") {
            attrs[i] |= attr::RSTRIP;
        }
        for text in ["<unk>", "<s>", "<|endoftext|>"] {
            if let Some(i) = find(text) {
                attrs[i] &= !attr::RSTRIP;
            }
        }
    } else if name.contains("modern-bert") {
        if let Some(i) = find("[MASK]") {
            attrs[i] |= attr::LSTRIP;
        }
    }

    Specials {
        bos,
        eos,
        unk,
        eog: eog.into_iter().collect(),
    }
}

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
        })
    }

    /// Token ids for `text`, with BOS prepended (and EOS appended) when the model asks
    /// for it. Control and user-defined tokens written in the text (e.g.
    /// `<|im_start|>`, `<start_of_turn>`) are recognised, as llama.cpp does for prompts.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let mut ids = Vec::with_capacity(text.len() / 3 + 2);
        ids.extend(self.add_bos);
        match &self.encoder {
            Encoder::Bpe(inner) => {
                let enc = inner.encode_fast(text, false).map_err(|e| e.to_string())?;
                ids.extend_from_slice(enc.get_ids());
            }
            Encoder::Spm(spm) => spm.encode(text, &mut ids),
        }
        ids.extend(self.add_eos);
        Ok(ids)
    }

    /// Token ids for one segment of a session's context: the model's BOS first when
    /// `bos` (and the model wants one), never EOS.
    pub fn encode_segment(&self, text: &str, bos: bool) -> Result<Vec<u32>, String> {
        let mut ids = self.encode(text)?;
        if self.add_eos.is_some() && ids.last().copied() == self.add_eos {
            ids.pop();
        }
        if !bos && self.add_bos.is_some() && ids.first().copied() == self.add_bos {
            ids.remove(0);
        }
        Ok(ids)
    }

    /// The exact bytes of token `id` (empty for an unknown id).
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_bytes.get(id)
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

    use gguf_file::Value;

    /// GGUF metadata for a vocabulary of `(text, score, token type)`.
    fn content(model: &str, vocab: &[(&str, f32, i32)], extra: Vec<(&str, Value)>) -> gguf_file::Content {
        let mut metadata: HashMap<String, Value> = [
            ("tokenizer.ggml.model", Value::String(model.into())),
            (
                "tokenizer.ggml.tokens",
                Value::Array(vocab.iter().map(|(t, _, _)| Value::String(t.to_string())).collect()),
            ),
            (
                "tokenizer.ggml.scores",
                Value::Array(vocab.iter().map(|(_, s, _)| Value::F32(*s)).collect()),
            ),
            (
                "tokenizer.ggml.token_type",
                Value::Array(vocab.iter().map(|(_, _, t)| Value::I32(*t)).collect()),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        metadata.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
        gguf_file::Content {
            magic: gguf_file::VersionedMagic::GgufV3,
            metadata,
            tensor_infos: HashMap::new(),
            tensor_data_offset: 0,
        }
    }

    /// A small Gemma-like SPM vocabulary: specials, 256 byte tokens, a few pieces (ids
    /// of interest below).
    fn spm_vocab() -> Vec<(String, f32, i32)> {
        let mut v: Vec<(String, f32, i32)> = [
            ("<pad>", 0.0, 3),
            ("<eos>", 0.0, 3),
            ("<bos>", 0.0, 3),
            ("<unk>", 0.0, 2),
            ("<end_of_turn>", 0.0, 3),
            ("</s>", 0.0, 4),
            ("\n", 0.0, 4),
        ]
        .iter()
        .map(|&(t, s, k)| (t.to_string(), s, k))
        .collect();
        v.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
        for (t, s) in [
            ("▁", -1.0),
            ("h", -2.0),
            ("i", -2.0),
            ("hi", -3.0),
            ("▁hi", -0.5),
            ("▁h", -4.0),
        ] {
            v.push((t.to_string(), s, 1));
        }
        v
    }

    const BYTE0: u32 = 7;
    const SPACE: u32 = 263;
    const HI: u32 = 266;
    const SPACE_HI: u32 = 267;

    fn spm(extra: Vec<(&str, Value)>) -> GgufTokenizer {
        let v = spm_vocab();
        let vocab: Vec<(&str, f32, i32)> = v.iter().map(|(t, s, k)| (t.as_str(), *s, *k)).collect();
        let extra = [
            vec![
                ("tokenizer.ggml.bos_token_id", Value::U32(2)),
                ("tokenizer.ggml.eos_token_id", Value::U32(1)),
                ("tokenizer.ggml.unknown_token_id", Value::U32(3)),
            ],
            extra,
        ]
        .concat();
        GgufTokenizer::from_gguf(&content("llama", &vocab, extra)).unwrap()
    }

    #[test]
    fn spm_encodes_like_llama_cpp() {
        let t = spm(Vec::new());
        assert_eq!(t.vocab_size(), 269);
        // BOS by default; a space prefix at the start and after special tokens.
        assert_eq!(t.encode("hi").unwrap(), vec![2, SPACE_HI]);
        assert_eq!(t.encode("").unwrap(), vec![2]);
        assert_eq!(
            t.encode("hi<end_of_turn>\nhi hi").unwrap(),
            vec![2, SPACE_HI, 4, 6, SPACE_HI, SPACE_HI]
        );
        // Characters without a token fall back to their UTF-8 bytes.
        assert_eq!(t.encode("é").unwrap(), vec![2, SPACE, BYTE0 + 0xC3, BYTE0 + 0xA9]);
        // Without the space prefix, "hi" is its own token.
        let t = spm(vec![
            ("tokenizer.ggml.add_space_prefix", Value::Bool(false)),
            ("tokenizer.ggml.add_eos_token", Value::Bool(true)),
        ]);
        assert_eq!(t.encode("hi").unwrap(), vec![2, HI, 1]);
        let t = spm(vec![("tokenizer.ggml.add_bos_token", Value::Bool(false))]);
        assert_eq!(t.encode("hi").unwrap(), vec![SPACE_HI]);
    }

    #[test]
    fn spm_specials_and_pieces_follow_llama_cpp() {
        let t = spm(Vec::new());
        // EOS, plus `<end_of_turn>` and `</s>` by their text.
        assert_eq!(t.eog_ids(), &[1, 4, 5]);
        // `</s>` is user-defined in the file but becomes a control token, as in llama.cpp.
        assert!(t.is_control(2) && t.is_control(4) && t.is_control(5));
        assert!(!t.is_control(6) && !t.is_control(SPACE_HI) && !t.is_control(99_999));
        assert_eq!(t.token_bytes(SPACE_HI), b" hi");
        assert_eq!(t.token_bytes(BYTE0 + 0xC3), &[0xC3]);
        assert_eq!(t.token_bytes(2), b"<bos>");
        assert_eq!(t.token_bytes(3), b"<unk>");
        assert_eq!(t.token_bytes(6), b"\n");
        assert_eq!(t.token_bytes(99_999), b"");
        let ids = t.encode("hi é<end_of_turn>").unwrap();
        assert_eq!(t.decode(&ids[1..]), " hi é<end_of_turn>");
    }

    #[test]
    fn unsupported_models_are_named() {
        let err = GgufTokenizer::from_gguf(&content("t5", &[("a", 0.0, 1)], Vec::new()))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("\"t5\"") && err.contains("gpt2") && err.contains("llama"),
            "{err}"
        );
    }

    #[test]
    fn byte_token_values_parse_like_strtol() {
        assert_eq!(byte_token_value("<0x0A>"), 0x0A);
        assert_eq!(byte_token_value("<0xff>"), 0xFF);
        assert_eq!(byte_token_value("<0xA>"), 0x0A);
        assert_eq!(byte_token_value("<0x"), 0);
        assert_eq!(byte_token_value(""), 0);
    }
}
