//! SentencePiece-style ("SPM") tokenization for GGUF vocabularies with
//! `tokenizer.ggml.model = "llama"` (Llama 1/2, Mistral, Gemma, …), reproducing
//! llama.cpp's `tokenizer_st_partition` and `llm_tokenizer_spm_session` so that the
//! token ids are identical.
//!
//! Encoding runs in two steps, as in llama.cpp:
//! 1. [`SpecialSplitter`] cuts the special tokens (control, user-defined and unknown
//!    tokens) written in the text out of it, one token at a time, longest text first;
//! 2. [`SpmModel`] encodes each remaining piece of text: spaces become `▁`, every
//!    UTF-8 character starts as its own symbol, and the adjacent pair whose merged
//!    text is the highest-scoring vocabulary token is merged (leftmost first on
//!    ties) until no pair forms a token. A symbol that is not a token falls back to
//!    one `<0xXX>` byte token per byte.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// What SPM vocabularies write instead of a space (U+2581, `▁`).
pub const SPACE_ESCAPE: &str = "\u{2581}";

/// A piece of the input after the special-token split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece<'a> {
    /// Plain text, still to be encoded.
    Text(&'a [u8]),
    /// A special token written in the text.
    Token(u32),
}

/// A token the splitter recognises in text.
#[derive(Debug, Clone)]
pub struct SpecialToken {
    /// Its id.
    pub id: u32,
    /// Its text, as written in the input.
    pub text: String,
    /// Whitespace to the left of it is dropped (llama.cpp `LLAMA_TOKEN_ATTR_LSTRIP`).
    pub lstrip: bool,
    /// Whitespace to the right of it is dropped (llama.cpp `LLAMA_TOKEN_ATTR_RSTRIP`).
    pub rstrip: bool,
}

/// A byte trie node: children by next byte, and the special token ending here.
#[derive(Debug, Default)]
struct TrieNode {
    children: Vec<(u8, u32)>,
    /// Index into [`SpecialSplitter::tokens`].
    end: Option<u32>,
}

/// Splits special tokens out of text exactly like llama.cpp's
/// `tokenizer_st_partition` (with `parse_special = true`): for each special token,
/// longest text first, every occurrence in every still-unsplit piece of text is cut
/// out, left to right.
#[derive(Debug)]
pub struct SpecialSplitter {
    /// The special tokens in llama.cpp's order: longest text first (ties by id).
    tokens: Vec<SpecialToken>,
    /// A trie over the tokens' texts, to find the few that occur in a text quickly.
    trie: Vec<TrieNode>,
}

/// llama.cpp's `isspace` in the C locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// `s` without its trailing C whitespace.
fn trim_end_c_space(s: &[u8]) -> &[u8] {
    let keep = s.iter().rposition(|&b| !is_c_space(b)).map_or(0, |i| i + 1);
    &s[..keep]
}

/// `s` without its leading C whitespace.
fn trim_start_c_space(s: &[u8]) -> &[u8] {
    let skip = s.iter().position(|&b| !is_c_space(b)).unwrap_or(s.len());
    &s[skip..]
}

/// The first occurrence of `needle` (non-empty) in `hay`.
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let last_start = hay.len().checked_sub(needle.len())?;
    let mut from = 0;
    while from <= last_start {
        let at = from + hay[from..=last_start].iter().position(|&b| b == first)?;
        if hay[at + 1..].starts_with(rest) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

impl SpecialSplitter {
    /// A splitter for `tokens` (any order; tokens with an empty text are ignored).
    pub fn new(mut tokens: Vec<SpecialToken>) -> Self {
        tokens.retain(|t| !t.text.is_empty());
        tokens.sort_by(|a, b| b.text.len().cmp(&a.text.len()).then(a.id.cmp(&b.id)));
        let mut trie = vec![TrieNode::default()];
        for (index, token) in tokens.iter().enumerate() {
            let mut node = 0usize;
            for &b in token.text.as_bytes() {
                node = match trie[node].children.iter().find(|(c, _)| *c == b) {
                    Some(&(_, child)) => child as usize,
                    None => {
                        let child = trie.len();
                        trie.push(TrieNode::default());
                        trie[node].children.push((b, child as u32));
                        child
                    }
                };
            }
            // Duplicate texts: the first (llama.cpp's order) wins; the rest can never match.
            trie[node].end.get_or_insert(index as u32);
        }
        Self { tokens, trie }
    }

    /// Indices (into `self.tokens`, so in processing order) of the special tokens
    /// that occur somewhere in `text`.
    fn occurring(&self, text: &[u8]) -> Vec<u32> {
        let mut found = Vec::new();
        for start in 0..text.len() {
            let mut node = 0usize;
            for &b in &text[start..] {
                match self.trie[node].children.iter().find(|(c, _)| *c == b) {
                    Some(&(_, child)) => node = child as usize,
                    None => break,
                }
                if let Some(index) = self.trie[node].end {
                    found.push(index);
                }
            }
        }
        found.sort_unstable();
        found.dedup();
        found
    }

    /// Splits `text` into plain text and special tokens.
    pub fn split<'a>(&self, text: &'a str) -> Vec<Piece<'a>> {
        let bytes = text.as_bytes();
        if bytes.is_empty() {
            return Vec::new();
        }
        // Only tokens that occur in the whole text can occur in one of its pieces.
        let mut pieces = vec![Piece::Text(bytes)];
        for index in self.occurring(bytes) {
            let Some(token) = self.tokens.get(index as usize) else {
                continue;
            };
            let needle = token.text.as_bytes();
            let mut next = Vec::with_capacity(pieces.len() + 2);
            for piece in pieces {
                let Piece::Text(mut rest) = piece else {
                    next.push(piece);
                    continue;
                };
                while let Some(at) = find(rest, needle) {
                    let mut left = &rest[..at];
                    if token.lstrip {
                        left = trim_end_c_space(left);
                    }
                    if !left.is_empty() {
                        next.push(Piece::Text(left));
                    }
                    next.push(Piece::Token(token.id));
                    rest = &rest[at + needle.len()..];
                    if token.rstrip {
                        rest = trim_start_c_space(rest);
                    }
                }
                if !rest.is_empty() {
                    next.push(Piece::Text(rest));
                }
            }
            pieces = next;
        }
        pieces
    }
}

/// Byte strings indexed by id, back to back in one buffer (no allocation per string).
#[derive(Debug, Default)]
pub(crate) struct Packed {
    bytes: Vec<u8>,
    /// Where string `id` ends (it starts where `id - 1`'s ends).
    ends: Vec<usize>,
}

impl Packed {
    /// Appends the next string.
    pub(crate) fn push(&mut self, s: &[u8]) {
        self.bytes.extend_from_slice(s);
        self.ends.push(self.bytes.len());
    }

    /// String `id` (empty for an unknown id).
    pub(crate) fn get(&self, id: u32) -> &[u8] {
        let id = id as usize;
        let start = if id == 0 {
            0
        } else {
            self.ends.get(id - 1).copied().unwrap_or(0)
        };
        let end = self.ends.get(id).copied().unwrap_or(start);
        &self.bytes[start..end]
    }

    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

/// Token texts → ids without a heap allocation per token: all texts in one buffer,
/// and an open-addressing hash table (linear probing) of ids.
#[derive(Debug, Default)]
struct TokenTable {
    /// Every token's text.
    texts: Packed,
    /// `(id, high hash bits)` per slot; `EMPTY` where free. Length: a power of two.
    slots: Vec<(u32, u32)>,
}

impl TokenTable {
    const EMPTY: u32 = u32::MAX;

    fn new<'a>(tokens: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut table = Self::default();
        for t in tokens {
            table.texts.push(t);
        }
        let capacity = (table.texts.len() * 2).next_power_of_two().max(16);
        table.slots = vec![(Self::EMPTY, 0); capacity];
        for id in 0..table.texts.len() {
            let text = table.get(id as u32);
            let (mut slot, tag) = table.home(text);
            loop {
                let (other, other_tag) = table.slots[slot];
                if other == Self::EMPTY {
                    break;
                }
                if other_tag == tag && table.get(other) == text {
                    // A duplicate text: the later id wins, as in llama.cpp's
                    // `token_to_id[word] = i`.
                    break;
                }
                slot = (slot + 1) & (table.slots.len() - 1);
            }
            table.slots[slot] = (id as u32, tag);
        }
        table
    }

    /// The text of token `id` (empty for an unknown id).
    fn get(&self, id: u32) -> &[u8] {
        self.texts.get(id)
    }

    /// FNV-1a, then a Fibonacci mix: the first slot to probe, and a tag to compare.
    fn home(&self, text: &[u8]) -> (usize, u32) {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in text {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        let h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        ((h >> 32) as usize & (self.slots.len() - 1), h as u32)
    }

    /// The id whose text is exactly `text`.
    fn find(&self, text: &[u8]) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let (mut slot, tag) = self.home(text);
        loop {
            let (id, id_tag) = self.slots[slot];
            if id == Self::EMPTY {
                return None;
            }
            if id_tag == tag && self.get(id) == text {
                return Some(id);
            }
            slot = (slot + 1) & (self.slots.len() - 1);
        }
    }
}

/// The SPM vocabulary: token texts → ids, scores, byte-fallback tokens.
#[derive(Debug)]
pub struct SpmModel {
    tokens: TokenTable,
    /// Score of each token id; merges prefer higher scores.
    scores: Vec<f32>,
    /// The token for each byte (`<0xXX>`, else the byte itself as a token).
    byte_tokens: Vec<Option<u32>>,
    /// Used for a byte that has no token at all (llama.cpp would abort).
    unk: Option<u32>,
}

/// A symbol of the text being merged: a byte range, linked to its live neighbours.
#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    /// Length in bytes; 0 once merged into its left neighbour.
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of two adjacent symbols.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// Bytes of the merged text; a stale candidate no longer adds up to it.
    size: usize,
}

impl Ord for Bigram {
    /// Higher score first, then the leftmost (llama.cpp `llm_bigram_spm::comparator`,
    /// which also treats incomparable scores as equal).
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}

/// Length of the UTF-8 sequence a byte starts (llama.cpp `unicode_len_utf8`; a stray
/// continuation byte counts as one).
fn utf8_len(first: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[usize::from(first >> 4)]
}

impl SpmModel {
    /// Builds the model from token texts (index = id) and their scores (missing
    /// scores count as 0). `unk` is the unknown token, if any.
    pub fn new<'a>(tokens: impl IntoIterator<Item = &'a [u8]>, mut scores: Vec<f32>, unk: Option<u32>) -> Self {
        let tokens = TokenTable::new(tokens);
        scores.resize(tokens.texts.len().max(scores.len()), 0.0);
        let byte_tokens = (0..=255u8)
            .map(|b| {
                tokens
                    .find(format!("<0x{b:02X}>").as_bytes())
                    .or_else(|| tokens.find(&[b]))
            })
            .collect();
        Self {
            tokens,
            scores,
            byte_tokens,
            unk,
        }
    }

    /// The id of the token whose text is exactly `text`.
    pub fn token_id(&self, text: &[u8]) -> Option<u32> {
        self.tokens.find(text)
    }

    /// The text of token `id` (empty for an unknown id).
    pub fn token_text(&self, id: u32) -> &[u8] {
        self.tokens.get(id)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.texts.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.texts.is_empty()
    }

    /// Appends the ids of `text` (spaces already escaped to `▁`) to `out`.
    pub fn encode(&self, text: &[u8], out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        // One symbol per UTF-8 character.
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        let mut offset = 0;
        while offset < text.len() {
            let len = utf8_len(text[offset]).min(text.len() - offset);
            let index = symbols.len();
            symbols.push(Symbol {
                start: offset,
                len,
                prev: index.checked_sub(1),
                next: (offset + len < text.len()).then_some(index + 1),
            });
            offset += len;
        }

        let mut queue = BinaryHeap::with_capacity(symbols.len());
        for right in 1..symbols.len() {
            self.push_bigram(text, &symbols, right - 1, right, &mut queue);
        }
        while let Some(bigram) = queue.pop() {
            let (left, right) = (symbols[bigram.left], symbols[bigram.right]);
            // One side was merged away, or grew since this candidate was made.
            if left.len == 0 || right.len == 0 || left.len + right.len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += right.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = right.next;
            if let Some(next) = right.next {
                symbols[next].prev = Some(bigram.left);
            }
            if let Some(prev) = left.prev {
                self.push_bigram(text, &symbols, prev, bigram.left, &mut queue);
            }
            if let Some(next) = right.next {
                self.push_bigram(text, &symbols, bigram.left, next, &mut queue);
            }
        }

        // Every merged symbol is a token (merges only ever form tokens), so only
        // single characters can miss: llama.cpp's `resegment` then falls back to bytes.
        let mut index = Some(0);
        while let Some(i) = index {
            let symbol = symbols[i];
            let piece = &text[symbol.start..symbol.start + symbol.len];
            match self.token_id(piece) {
                Some(id) => out.push(id),
                None => out.extend(
                    piece
                        .iter()
                        .filter_map(|&b| self.byte_tokens[usize::from(b)].or(self.unk)),
                ),
            }
            index = symbol.next;
        }
    }

    /// Queues the merge of symbols `left` and `right` if their text is a token.
    fn push_bigram(&self, text: &[u8], symbols: &[Symbol], left: usize, right: usize, queue: &mut BinaryHeap<Bigram>) {
        let start = symbols[left].start;
        let size = symbols[left].len + symbols[right].len;
        let Some(id) = self.token_id(&text[start..start + size]) else {
            return;
        };
        queue.push(Bigram {
            left,
            right,
            score: self.scores.get(id as usize).copied().unwrap_or(0.0),
            size,
        });
    }
}

/// A complete SPM tokenizer: special-token split, then [`SpmModel`] on each text piece.
#[derive(Debug)]
pub struct SpmTokenizer {
    model: SpmModel,
    splitter: SpecialSplitter,
    /// Prefix a space to text that starts the input or follows a special token
    /// (`tokenizer.ggml.add_space_prefix`, default true).
    add_space_prefix: bool,
}

impl SpmTokenizer {
    /// Combines a model and a splitter.
    pub fn new(model: SpmModel, splitter: SpecialSplitter, add_space_prefix: bool) -> Self {
        Self {
            model,
            splitter,
            add_space_prefix,
        }
    }

    /// Appends the ids of `text` to `out` (no BOS/EOS; special tokens written in the
    /// text are recognised).
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut is_prev_special = true;
        let mut escaped = Vec::new();
        for piece in self.splitter.split(text) {
            match piece {
                Piece::Text(raw) => {
                    escaped.clear();
                    if self.add_space_prefix && is_prev_special {
                        escaped.extend_from_slice(SPACE_ESCAPE.as_bytes());
                    }
                    for &b in raw {
                        if b == b' ' {
                            escaped.extend_from_slice(SPACE_ESCAPE.as_bytes());
                        } else {
                            escaped.push(b);
                        }
                    }
                    self.model.encode(&escaped, out);
                    is_prev_special = false;
                }
                Piece::Token(id) => {
                    out.push(id);
                    is_prev_special = true;
                }
            }
        }
    }

    /// The vocabulary.
    pub fn model(&self) -> &SpmModel {
        &self.model
    }
}

#[cfg(test)]
mod tests;
