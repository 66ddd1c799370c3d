//! What an MLX bridge's shared prompt cache holds, as holdings ([`KvHolding`]), so an
//! MLX worker's KV events say what it really keeps warm — which KV-aware routing and
//! the KV exchange's prefix pulls (a coordinator names a peer holding more of a
//! prompt) need.
//!
//! The bridge runs one generation at a time on one shared cache (sessions have caches
//! of their own and map to no key), so the holdings are at most one: the last
//! generation's prompt and reply. Each generation of text or chat asks the bridge to
//! render and tokenize its prompt (`render`, answered between two tokens of a running
//! one), maps the tokens onto the request's prediction key with the CPU engine's
//! [`KeyMap`] over the directory's `tokenizer.json`, counts the prompt whole while it
//! computes and, before its stream ends, what the cache keeps (`cache_tokens`).
//! A generation of token ids, a failed one, or a restarted bridge leaves nothing held.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use switchyard_backend::Prompt;
use switchyard_engine::holdings::{holding, KeyMap, Shared};
use switchyard_engine::text::tokenizer::GgufTokenizer;
use switchyard_messages::KvHolding;

/// The holdings of one bridge's shared cache.
pub(super) struct MlxHoldings {
    tokenizer: Arc<GgufTokenizer>,
    pub(super) shared: Shared,
    /// Generations started: only the latest one's holding is published.
    clock: AtomicU64,
}

impl MlxHoldings {
    /// From the model directory's `tokenizer.json` (`eos`: the bridge's end ids);
    /// `None`, with a note, when it does not load here.
    pub(super) fn open(dir: &Path, eos: &[u32]) -> Option<Arc<Self>> {
        match GgufTokenizer::from_hf_dir(dir, eos) {
            Ok(t) => Some(Arc::new(Self {
                tokenizer: Arc::new(t),
                shared: Shared::default(),
                clock: AtomicU64::new(0),
            })),
            Err(e) => {
                tracing::info!("MLX holdings not followed ({e}); KV events announce recent requests' prefixes");
                None
            }
        }
    }

    /// Starts following a generation of `prompt` with `adapter`: the cache holds
    /// nothing known until its prompt is mapped ([`Follow::mapped`]).
    pub(super) fn follow(self: &Arc<Self>, prompt: &Prompt, adapter: Option<String>) -> Arc<Follow> {
        let ticket = self.clock.fetch_add(1, Ordering::AcqRel) + 1;
        self.shared.set(Vec::new());
        Arc::new(Follow {
            book: self.clone(),
            ticket,
            keyed: matches!(prompt, Prompt::Text(_) | Prompt::Chat { .. }),
            prompt: prompt.clone(),
            adapter,
            state: Mutex::default(),
        })
    }

    /// The bridge restarted: its cache is gone.
    pub(super) fn forget(&self) {
        self.clock.fetch_add(1, Ordering::AcqRel);
        self.shared.set(Vec::new());
    }
}

/// One generation, followed.
pub(super) struct Follow {
    book: Arc<MlxHoldings>,
    ticket: u64,
    keyed: bool,
    prompt: Prompt,
    adapter: Option<String>,
    state: Mutex<FollowState>,
}

#[derive(Default)]
struct FollowState {
    /// The prompt's key map and tokens, once rendered.
    map: Option<(KeyMap, Vec<u32>)>,
    /// The tokens generated so far.
    generated: Vec<u32>,
    /// `Some(n)`: ended, the cache keeping its first `n` tokens (prompt, then reply).
    ended: Option<usize>,
}

impl Follow {
    /// Whether this generation's prompt maps to a key (text and chat do).
    pub(super) fn keyed(&self) -> bool {
        self.keyed
    }

    /// The bridge rendered the prompt as `rendered`, tokenized as `tokens`.
    pub(super) fn mapped(&self, rendered: &str, tokens: Vec<u32>) {
        let map = KeyMap::new(&self.book.tokenizer, &self.prompt, rendered, &tokens);
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.map = map.map(|m| (m, tokens));
        self.publish(&s);
    }

    pub(super) fn token(&self, id: u32) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).generated.push(id);
    }

    /// The generation ended with the cache keeping `cache_tokens` tokens (`None`: it
    /// failed, and what the cache holds is not known).
    pub(super) fn ended(&self, cache_tokens: Option<usize>) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.ended = Some(cache_tokens.unwrap_or(0));
        self.publish(&s);
    }

    fn publish(&self, s: &FollowState) {
        if self.book.clock.load(Ordering::Acquire) != self.ticket {
            return; // a later generation owns the cache now
        }
        let Some((map, tokens)) = &s.map else {
            return;
        };
        let history: Vec<u32> = tokens.iter().chain(&s.generated).copied().collect();
        let (held, prefilling) = match s.ended {
            None => (&tokens[..], true),
            Some(n) => (&history[..n.min(history.len())], false),
        };
        let h: Option<KvHolding> =
            holding(map, held, prefilling, Some(&history), &self.book.tokenizer, |_| 0).map(|h| KvHolding {
                adapter: self.adapter.clone(),
                ..h
            });
        self.book.shared.set(h.into_iter().collect());
    }
}
