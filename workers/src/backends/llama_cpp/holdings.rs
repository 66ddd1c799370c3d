//! What a llama.cpp server's KV holds, as holdings ([`KvHolding`]), so a llama.cpp
//! worker's KV events say what its server really keeps warm, as the CPU engine's do.
//!
//! The worker picks each completion's slot (`id_slot`): the idle slot whose holding
//! the request reuses most, else the one idle longest, so what a request reuses is
//! what its slot holds (left to itself, llama-server takes a slot sharing under a
//! tenth of the prompt by least recent use and may reuse nothing of what it holds).
//! When a completion ends, its slot holds the prompt and all but the last generated
//! token. The prompt's tokens come from the model's own vocabulary (the GGUF the
//! server loaded, read here: the same ids as the server's `/tokenize`), tokenized
//! while the server computes, and are mapped onto the request's routing key by the
//! CPU engine's [`KeyMap`].
//!
//! llama-server also keeps slots' earlier contents in host memory (its prompt cache,
//! `--cache-ram`, on by default) and restores one when the slot a request takes
//! shares over a tenth of the prompt but under half of what it holds, and a saved
//! prompt shares more. Those are not holdings: the rules mix the request, its slot
//! and every saved prompt, which no per-holding prediction can say, so such a
//! request reuses more than predicted.
//!
//! Not followed: completions other clients of the same server send, and
//! classification and embedding requests (they take a slot the server picks); a
//! slot they overwrote is predicted to hold what it held before until the worker
//! uses it again.
//!
//! Without the model file here (a server on another host), and for sliding-window
//! models (Gemma 3: llama-server reuses their slots only from context checkpoints it
//! does not report), the worker keeps the guess from recent requests' prefixes.

use candle_core::quantized::gguf_file;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use switchyard_backend::Prompt;
use switchyard_engine::holdings::{holding, KeyMap, Shared};
use switchyard_engine::text::tokenizer::GgufTokenizer;
use switchyard_messages::kv::prediction_key;
use switchyard_messages::KvHolding;
use tokio::task::JoinHandle;

/// llama-server's `--slot-prompt-similarity` default in thousandths: a slot counts
/// for a prompt that shares more than a tenth of it ([`KvHolding::min_share`]).
pub const MIN_SHARE: u32 = 100;

/// The server's slots, in routing terms.
pub struct SlotBook {
    tokenizer: Arc<GgufTokenizer>,
    state: Mutex<Book>,
    pub(super) shared: Shared,
}

#[derive(Default)]
struct Book {
    slots: Vec<Slot>,
    /// Completions started, for least recent use.
    clock: u64,
}

#[derive(Clone, Default)]
struct Slot {
    holding: Option<KvHolding>,
    /// A followed completion runs on it.
    busy: bool,
    last_used: u64,
}

impl SlotBook {
    /// The book of a server with `slots` slots serving the GGUF at `model_path`;
    /// `None` (with a note in the log) when that file cannot be read here.
    pub fn open(model_path: &str, slots: u32) -> Option<Self> {
        let not_followed = |why: String| {
            tracing::info!(
                model = model_path,
                "{why}; KV events announce recent requests' prefixes"
            );
            None
        };
        let content = std::fs::File::open(model_path)
            .map_err(|e| e.to_string())
            .and_then(|f| {
                gguf_file::Content::read(&mut std::io::BufReader::with_capacity(1 << 20, f)).map_err(|e| e.to_string())
            });
        let content = match content {
            Ok(c) => c,
            Err(e) => return not_followed(format!("the server's model file is not readable here ({e})")),
        };
        // A sliding-window model's slot keeps only its window (llama-server reuses
        // such a slot from its context checkpoints, which it does not report).
        let window = content
            .metadata
            .iter()
            .find(|(k, _)| k.ends_with(".attention.sliding_window"))
            .and_then(|(_, v)| v.to_u32().ok());
        if window.is_some_and(|w| w > 0) {
            return not_followed("the model attends through a sliding window".into());
        }
        match GgufTokenizer::from_gguf(&content) {
            Ok(tokenizer) => Some(Self {
                tokenizer: Arc::new(tokenizer),
                state: Mutex::new(Book {
                    slots: vec![Slot::default(); slots as usize],
                    ..Book::default()
                }),
                shared: Shared::default(),
            }),
            Err(e) => not_followed(format!("the model's vocabulary did not load ({e})")),
        }
    }

    /// Starts following one completion of `prompt`, sent to the server as `value`
    /// (rendered text; token ids map to no key and only clear the slot they land
    /// on), on `slot` when the caller pinned one, else on the slot [`SlotBook`]
    /// picks among those `pinned` does not hold ([`Completion::slot`]; none when all
    /// are busy: the server then queues it).
    ///
    /// A slot's holding counts only for a request with the same LoRA `adapter`:
    /// llama-server clears a slot whose adapters change.
    pub fn follow(
        self: &Arc<Self>,
        prompt: &Prompt,
        value: &Value,
        slot: Option<u32>,
        pinned: &[bool],
        adapter: Option<&str>,
    ) -> Completion {
        let rendered = value.as_str().map(str::to_string);
        let tokens = rendered.clone().map(|text| {
            let tokenizer = self.tokenizer.clone();
            tokio::task::spawn_blocking(move || tokenizer.encode(&text))
        });
        let key = match prompt {
            Prompt::Text(t) => t.as_bytes().to_vec(),
            Prompt::Chat { messages, .. } => prediction_key(None, Some(messages)),
            _ => Vec::new(),
        };
        let mut book = self.state.lock().unwrap_or_else(|p| p.into_inner());
        book.clock += 1;
        let started = book.clock;
        let chosen = slot.map(|s| s as usize).or_else(|| {
            let idle = |(i, s): &(usize, &Slot)| !s.busy && !pinned.get(*i).copied().unwrap_or(false);
            let reuse = |s: &Slot| reuse(s, adapter, &key);
            let idle = book.slots.iter().enumerate().filter(idle);
            let best = idle.clone().map(|(i, s)| (reuse(s), i)).filter(|(n, _)| *n > 0).max();
            best.map(|(_, i)| i)
                .or_else(|| idle.min_by_key(|(_, s)| s.last_used).map(|(i, _)| i))
        });
        // A slot the worker picked that gives the request nothing computes it
        // afresh: llama-server would still reuse the few tokens it shares, which no
        // prediction counts. A slot the caller pinned (a session's) keeps its cache.
        let mut fresh = false;
        let mut before = None;
        if let Some(s) = chosen.and_then(|i| book.slots.get_mut(i)) {
            fresh = slot.is_none() && reuse(s, adapter, &key) == 0;
            // A busy slot's holding is no one else's to reuse until it settles.
            before = s.holding.take();
            s.busy = true;
            s.last_used = started;
        }
        let all = book.holdings();
        drop(book);
        if before.is_some() {
            self.shared.set(all);
        }
        Completion {
            book: self.clone(),
            prompt: matches!(prompt, Prompt::Text(_) | Prompt::Chat { .. }).then(|| prompt.clone()),
            rendered,
            tokens,
            slot: chosen,
            adapter: adapter.map(str::to_string),
            started,
            before,
            accepted: false,
            fresh,
            generated: Vec::new(),
            settled: false,
        }
    }

    /// Slot `slot` now holds `now`, unless a completion started after `started`
    /// (or a session's prefill) took it since; the holdings are published.
    fn settle(&self, slot: usize, started: u64, now: Option<KvHolding>) {
        let mut book = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if slot >= book.slots.len() {
            book.slots.resize(slot + 1, Slot::default());
        }
        if book.slots[slot].last_used > started {
            return;
        }
        book.slots[slot].busy = false;
        book.slots[slot].holding = now;
        let all = book.holdings();
        drop(book);
        self.shared.set(all);
    }

    /// Slot `slot` was overwritten with what no key maps (a session's tokens); a
    /// completion that ran on it before settles into nothing.
    pub fn clear(&self, slot: u32) {
        let mut book = self.state.lock().unwrap_or_else(|p| p.into_inner());
        book.clock += 1;
        let (slot, clock) = (slot as usize, book.clock);
        if slot >= book.slots.len() {
            book.slots.resize(slot + 1, Slot::default());
        }
        book.slots[slot] = Slot {
            last_used: clock,
            ..Slot::default()
        };
        let all = book.holdings();
        drop(book);
        self.shared.set(all);
    }

    /// The slots no completion followed here runs on, most recently used first.
    pub fn idle_slots_recent_first(&self) -> Vec<u32> {
        let book = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut idle: Vec<(u64, u32)> = book
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.busy)
            .map(|(i, s)| (s.last_used, i as u32))
            .collect();
        idle.sort_by(|a, b| b.cmp(a));
        idle.into_iter().map(|(_, i)| i).collect()
    }

    /// The server restarted (or went away): its slots hold nothing any more.
    pub fn forget(&self) {
        let mut book = self.state.lock().unwrap_or_else(|p| p.into_inner());
        book.clock += 1;
        let clock = book.clock;
        for s in &mut book.slots {
            *s = Slot {
                last_used: clock,
                ..Slot::default()
            };
        }
        drop(book);
        self.shared.set(Vec::new());
    }
}

/// Tokens a request with prediction key `key` run with `adapter` reuses from what
/// `slot` holds.
fn reuse(slot: &Slot, adapter: Option<&str>, key: &[u8]) -> u32 {
    let same = |h: &&KvHolding| h.adapter.as_deref() == adapter;
    slot.holding.as_ref().filter(same).map_or(0, |h| h.reuse(key))
}

impl Book {
    fn holdings(&self) -> Vec<KvHolding> {
        self.slots.iter().filter_map(|s| s.holding.clone()).collect()
    }
}

/// One completion being followed: the slot it runs on and what it generated.
pub struct Completion {
    book: Arc<SlotBook>,
    /// The prompt, when it has a key (text or chat).
    prompt: Option<Prompt>,
    rendered: Option<String>,
    tokens: Option<JoinHandle<Result<Vec<u32>, String>>>,
    slot: Option<usize>,
    /// The LoRA adapter it runs with.
    adapter: Option<String>,
    /// The book's clock when it started: a later completion on its slot wins.
    started: u64,
    /// What its slot held before, again its holding if the server never took it.
    before: Option<KvHolding>,
    /// The server answered the request (it may have changed the slot).
    accepted: bool,
    /// Sent with `cache_prompt: false` (its slot shares nothing that counts).
    fresh: bool,
    generated: Vec<u32>,
    settled: bool,
}

impl Completion {
    /// The slot it runs on, when known before it starts.
    pub fn slot(&self) -> Option<u32> {
        self.slot.map(|s| s as u32)
    }

    /// Whether to send it with `cache_prompt: false`: its slot shares too little
    /// with it to count ([`MIN_SHARE`]).
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// The server took the request: from here on it may change the slot.
    pub fn accepted(&mut self) {
        self.accepted = true;
    }

    /// Notes a streamed event (its slot) and the token ids it carried.
    pub fn saw(&mut self, event: &Value, ids: &[u32]) {
        if let Some(slot) = event["id_slot"].as_u64() {
            self.slot = Some(slot as usize);
        }
        self.generated.extend_from_slice(ids);
    }

    /// The completion ended (`finished`: the server said so; else it was stopped or
    /// failed): its slot's holding is published before the caller hears.
    pub async fn settle(mut self, finished: bool) {
        let Some(slot) = self.slot else {
            self.settled = true;
            return;
        };
        if !self.accepted {
            // Never reached the server: the slot holds what it held.
            self.settled = true;
            let before = self.before.take();
            self.book.settle(slot, self.started, before);
            return;
        }
        let tokens = match self.tokens.take() {
            Some(t) => t.await.ok().and_then(Result::ok),
            None => None,
        };
        let (prompt, rendered) = (self.prompt.take(), self.rendered.take());
        // Ended before a token came: what the slot holds is not known.
        let unknown = !finished && self.generated.is_empty();
        let map = match (&prompt, &rendered, &tokens) {
            _ if unknown => None,
            (Some(p), Some(r), Some(t)) => KeyMap::new(&self.book.tokenizer, p, r, t),
            _ => None,
        };
        let now = map.as_ref().zip(tokens).and_then(|(map, prompt_tokens)| {
            let mut history = prompt_tokens;
            history.extend_from_slice(&self.generated);
            // The last token sampled was not run: the slot holds the rest.
            let held = history.len().saturating_sub(usize::from(!self.generated.is_empty()));
            let mut h = holding(
                map,
                &history[..held],
                false,
                Some(&history),
                &self.book.tokenizer,
                |_| 0,
            )?;
            h.min_share = MIN_SHARE;
            Some(h.with_adapter(self.adapter.as_deref()))
        });
        // Settled only here: a settle dropped while it waited for the tokens leaves
        // the slot to Drop, which frees it.
        self.settled = true;
        self.book.settle(slot, self.started, now);
    }
}

impl Drop for Completion {
    /// A completion that ended without [`Completion::settle`] (an error, a dropped
    /// stream) settles in the background with what it saw; outside a runtime its
    /// slot is freed holding nothing known.
    fn drop(&mut self) {
        let Some(slot) = self.slot.filter(|_| !self.settled) else {
            return;
        };
        self.settled = true;
        let rest = Completion {
            book: self.book.clone(),
            prompt: self.prompt.take(),
            rendered: self.rendered.take(),
            tokens: self.tokens.take(),
            slot: self.slot,
            adapter: self.adapter.take(),
            started: self.started,
            before: self.before.take(),
            accepted: self.accepted,
            fresh: self.fresh,
            generated: std::mem::take(&mut self.generated),
            settled: false,
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(rest.settle(false));
            }
            Err(_) => {
                let mut rest = rest;
                rest.settled = true;
                let now = if rest.accepted { None } else { rest.before.take() };
                rest.book.settle(slot, rest.started, now);
            }
        }
    }
}
