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

use super::spm::{Packed, SpmTokenizer};
use tokenizers::Tokenizer;

/// The tokenizer model behind a [`GgufTokenizer`].
pub(super) enum Encoder {
    /// `tokenizer.ggml.model = "gpt2"`.
    Bpe(Box<Tokenizer>),
    /// `tokenizer.ggml.model = "llama"`.
    Spm(SpmTokenizer),
}

/// A GGUF vocabulary: encode text to ids, decode ids to bytes.
pub struct GgufTokenizer {
    pub(super) encoder: Encoder,
    /// Exact bytes of every token (control tokens: their text).
    pub(super) token_bytes: Packed,
    pub(super) is_control: Vec<bool>,
    /// `tokenizer.ggml.bos_token_id`, when the model wants it prepended.
    pub(super) add_bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`, when the model wants it appended.
    pub(super) add_eos: Option<u32>,
    /// Ids that end generation (EOS, EOT, `<|im_end|>`, …), ascending.
    pub(super) eog: Vec<u32>,
    pub(super) pre: String,
    /// [`GgufTokenizer::splits_digits`], found out once.
    pub(super) digits: std::sync::OnceLock<bool>,
}

impl GgufTokenizer {
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

    /// Whether the vocabulary splits numbers into single digits (Qwen, SmolLM2,
    /// Gemma, Llama 2): then text never merges across a digit's end.
    pub fn splits_digits(&self) -> bool {
        *self.digits.get_or_init(|| {
            self.encode("2024")
                .is_ok_and(|ids| ids.iter().filter(|&&id| !self.is_control(id)).count() == 4)
        })
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
    use super::super::specials::*;

    use super::*;
    use candle_core::quantized::gguf_file;
    use std::collections::HashMap;

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
