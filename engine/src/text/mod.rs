//! Text in and out of the CPU engine.
//!
//! ## Layout
//! - [`tokenizer`]: a GGUF vocabulary (or `tokenizer.json`) as a tokenizer, and the
//!   streaming decoder that turns token ids into text without splitting characters.
//! - [`vocab`]: loading a vocabulary (GGUF metadata or `tokenizer.json`): specials,
//!   end-of-generation ids, token bytes, the BPE or SentencePiece model.
//! - `specials`: what GGUF metadata says about tokens (attributes, special tokens
//!   known by their text, typed metadata readers).
//! - [`spm`]: SentencePiece (Gemma's vocabulary) scored merges.
//! - [`template`]: the model's chat template via minijinja.

mod specials;
pub mod spm;
pub mod template;
pub mod tokenizer;
pub mod vocab;
pub mod wordpiece;
