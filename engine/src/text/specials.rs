//! What a GGUF vocabulary's metadata says about its tokens: llama.cpp's token
//! attributes, the special tokens it recognises by their text (end of turn, fill in
//! the middle, …), and typed readers for `tokenizer.ggml.*` keys.

use candle_core::quantized::gguf_file;
use std::borrow::Cow;
use std::collections::BTreeSet;

/// llama.cpp token attributes (`llama_token_attr`), derived from the GGUF token types
/// (`llama_token_type`) and then adjusted by token text.
pub(super) mod attr {
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
pub(super) const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// llama.cpp `LLAMA_VOCAB_PRE_TYPE_LLAMA3`.
pub(super) const LLAMA3_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp `LLAMA_VOCAB_PRE_TYPE_QWEN2`.
pub(super) const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token texts llama.cpp takes as end-of-turn (`special_eot_id`) when the metadata
/// names none.
pub(super) const EOT_TEXTS: &[&str] = &[
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
pub(super) const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
/// … as fill-in-the-middle prefix.
pub(super) const FIM_PRE_TEXTS: &[&str] = &[
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
pub(super) const FIM_SUF_TEXTS: &[&str] = &[
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
pub(super) const FIM_MID_TEXTS: &[&str] = &[
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
pub(super) const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
/// … as fill-in-the-middle repository name.
pub(super) const FIM_REP_TEXTS: &[&str] = &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"];
/// … as fill-in-the-middle file separator.
pub(super) const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
/// Token texts llama.cpp always treats as end-of-generation (and as control tokens).
pub(super) const EOG_TEXTS: &[&str] = &[
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

pub(super) fn md<'a>(ct: &'a gguf_file::Content, key: &'static str) -> Result<&'a gguf_file::Value, TokenizerError> {
    ct.metadata.get(key).ok_or(TokenizerError::Metadata {
        key,
        reason: "missing".into(),
    })
}

/// A string array, borrowed from the metadata.
pub(super) fn md_strings<'a>(ct: &'a gguf_file::Content, key: &'static str) -> Result<Vec<&'a str>, TokenizerError> {
    let bad = |reason: String| TokenizerError::Metadata { key, reason };
    md(ct, key)?
        .to_vec()
        .map_err(|e| bad(e.to_string()))?
        .iter()
        .map(|v| v.to_string().map(String::as_str).map_err(|e| bad(e.to_string())))
        .collect()
}

/// A token id (GGUF writes them as u32; other integer types are accepted too).
pub(super) fn md_u32(ct: &gguf_file::Content, key: &str) -> Option<u32> {
    let v = ct.metadata.get(key)?;
    v.to_u32()
        .ok()
        .or_else(|| v.to_i32().ok().and_then(|i| u32::try_from(i).ok()))
        .or_else(|| v.to_u64().ok().and_then(|i| u32::try_from(i).ok()))
}

pub(super) fn md_bool(ct: &gguf_file::Content, key: &'static str) -> Option<bool> {
    ct.metadata.get(key).and_then(|v| v.to_bool().ok())
}

pub(super) fn md_str<'a>(ct: &'a gguf_file::Content, key: &'static str) -> Option<&'a str> {
    ct.metadata
        .get(key)
        .and_then(|v| v.to_string().ok())
        .map(String::as_str)
}

/// A per-token numeric array (`token_type`, `scores`), one value per token; absent or
/// malformed entries take `default`.
pub(super) fn md_per_token<T: Copy>(
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
pub(super) fn byte_to_char() -> [char; 256] {
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
pub(super) fn byte_token_value(text: &str) -> u8 {
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
pub(super) enum Kind {
    Bpe,
    Spm,
}

/// Special ids from the metadata and the token texts, as llama.cpp's
/// `llama_vocab::load` finds them.
pub(super) struct Specials {
    pub(super) bos: Option<u32>,
    pub(super) eos: Option<u32>,
    pub(super) unk: Option<u32>,
    /// End-of-generation ids, ascending.
    pub(super) eog: Vec<u32>,
}

/// Finds the special ids and end-of-generation tokens, and updates `attrs` the way
/// llama.cpp does: tokens recognised by their text (EOT, EOM, FIM, EOG texts) become
/// control tokens, a few are demoted, and Phi-3 style models strip whitespace to the
/// right of special tokens.
///
/// llama.cpp walks a hash map, so when a vocabulary holds several candidate texts for
/// one EOT/EOM/FIM slot it takes an unspecified one; this takes the lowest id.
pub(super) fn find_specials(ct: &gguf_file::Content, kind: Kind, tokens: &[Cow<str>], attrs: &mut [u32]) -> Specials {
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
