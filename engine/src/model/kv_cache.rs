//! One sequence's f16 KV cache: pages shared between sequences on the layers that
//! hold every position, rings on sliding-window layers.
//!
//! **Pages.** A layer that holds every position keeps it in a page: [`PAGE`]
//! consecutive positions of every such layer and KV head, `[layer][kv_head][row]
//! [head_dim]`. A sequence holds a list of pages, reference-counted: a prefix another
//! sequence computed is shared page by page ([`KvCache::copy_prefix`]), not copied,
//! so many streams behind one system prompt hold it once. A page is written only by
//! a sequence that owns it alone: before a pass writes positions, [`KvCache::wrote`]
//! copies each page it touches that another sequence still holds (copy-on-write, at
//! the first divergent page) and drops the pages past what the pass writes. A page is
//! freed when the last sequence holding it lets it go, never before.
//!
//! **Rings.** A sliding-window layer (Gemma 3's local layers) attends only to the
//! last `window` positions, so with a ring it holds `ring = window + SWA_PASS` rows
//! per KV head, position `p` at row `p % ring`, in the sequence's own buffer (rings
//! are short and rewritten every step: nothing to share). One pass writes at most
//! [`SWA_PASS`] positions (`LlamaModel::forward_batch` splits longer steps), so the
//! rows a pass reads (its first query's window to its last position, at most
//! `window - 1 + SWA_PASS`) never overlap the rows it overwrites. The rings keep only
//! the positions from [`KvCache::ring_start`] on: a step can resume at position `q`
//! only when `q`'s window is still there ([`KvCache::resumable`]).

use super::params::LlamaParams;
use crate::kernels::quants::h2f;
use std::ops::Range;
use std::sync::Arc;

/// The most positions one forward pass writes into a cache with rings; a ring holds
/// `window + SWA_PASS` rows. The largest prefill chunk the batcher measures
/// (`ChunkBudget::MAX`), so only a prompt prefilled alone is split.
pub const SWA_PASS: usize = 512;

/// Positions per page: the block store's block (`block_store::BLOCK_TOKENS`), so the
/// blocks the store keys and the pages slots share are the same token runs.
pub const PAGE: usize = 32;

/// The rows of positions `a..b` (at most `rows` of them) in a layer where position
/// `p` sits at row `p % rows`: one range, or two when they wrap.
pub(super) fn wrap(a: usize, b: usize, rows: usize) -> [Range<usize>; 2] {
    let (s, n) = (a % rows, b - a);
    if s + n <= rows {
        [s..s + n, 0..0]
    } else {
        [s..rows, 0..s + n - rows]
    }
}

/// Keys and values of [`PAGE`] consecutive positions on every paged layer, as f16
/// bits. Allocated zeroed, so the operating system commits its memory as rows are
/// written.
#[derive(Clone)]
pub struct KvPage {
    k: Box<[u16]>,
    v: Box<[u16]>,
}

impl KvPage {
    fn new(len: usize) -> Self {
        Self {
            k: vec![0; len].into_boxed_slice(),
            v: vec![0; len].into_boxed_slice(),
        }
    }

    /// Its keys and values, `[paged layer][kv_head][row][head_dim]`: where every
    /// layer is paged, the rows `KvCache::read_rows` gives for the page's positions.
    pub fn rows(&self) -> (&[u16], &[u16]) {
        (&self.k, &self.v)
    }

    /// Bytes of keys and values the page holds.
    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * 2
    }
}

/// Where a layer keeps its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// In the pages, from this offset of each page.
    Paged(usize),
    /// In a ring of the sequence's own buffers, from this offset.
    Ring(usize),
}

/// One sequence's keys and values.
pub struct KvCache {
    /// Page `i` holds positions `i * PAGE..(i + 1) * PAGE` of the paged layers.
    pages: Vec<Arc<KvPage>>,
    /// Values (keys or values) per page: paged layers × KV heads × `PAGE` × head size.
    page_len: usize,
    /// The rings, `[ring layer][kv_head][row][head_dim]`.
    ring_k: Vec<u16>,
    ring_v: Vec<u16>,
    ctx: usize,
    /// Rows per KV head of a sliding-window layer; 0 = no rings (every layer holds
    /// every position).
    ring: usize,
    window: usize,
    layers: Vec<Place>,
    /// The first position the rings still hold (0 without rings).
    start: usize,
    /// Positions written: `0..held`.
    held: usize,
    heads: usize,
    head_dim: usize,
}

/// One layer of one sequence, as attention reads it.
#[derive(Clone, Copy)]
pub(super) struct LayerView<'a> {
    cache: &'a KvCache,
    place: Place,
}

impl<'a> LayerView<'a> {
    /// Calls `f` with the keys and values of positions `a..b` (held) of KV head `h`,
    /// as runs of whole rows in position order: one per page touched, or the one or
    /// two runs of a ring.
    pub(super) fn runs(&self, h: usize, a: usize, b: usize, mut f: impl FnMut(&'a [u16], &'a [u16])) {
        let c = self.cache;
        let hd = c.head_dim;
        match self.place {
            Place::Paged(off) => {
                let head = off + h * PAGE * hd;
                let mut p = a;
                while p < b {
                    let (page, r0) = (p / PAGE, p % PAGE);
                    let r1 = (b - page * PAGE).min(PAGE);
                    let pg = &c.pages[page];
                    let span = head + r0 * hd..head + r1 * hd;
                    f(&pg.k[span.clone()], &pg.v[span]);
                    p = page * PAGE + r1;
                }
            }
            Place::Ring(off) => {
                let head = off + h * c.ring * hd;
                for r in wrap(a, b, c.ring) {
                    if !r.is_empty() {
                        let span = head + r.start * hd..head + r.end * hd;
                        f(&c.ring_k[span.clone()], &c.ring_v[span]);
                    }
                }
            }
        }
    }
}

impl KvCache {
    /// A cache holding all `ctx` positions on every layer (llama.cpp's `--swa-full`).
    pub fn new(p: &LlamaParams, ctx: usize) -> Self {
        Self::build(p, ctx, 0)
    }

    /// A cache for `ctx` positions whose sliding-window layers keep a ring of
    /// `window + pass` rows (when that is shorter than `ctx`); a forward pass then
    /// writes at most `pass` positions.
    pub fn windowed(p: &LlamaParams, ctx: usize, pass: usize) -> Self {
        let ring = p.swa_window + pass.max(1);
        Self::build(p, ctx, if p.swa_window > 0 && ring < ctx { ring } else { 0 })
    }

    fn build(p: &LlamaParams, ctx: usize, ring: usize) -> Self {
        let (head, hd) = (p.n_head_kv, p.head_dim);
        let (mut paged, mut at) = (0, 0);
        let layers = (0..p.n_layer)
            .map(|il| {
                if ring > 0 && p.is_swa(il) {
                    at += head * ring * hd;
                    Place::Ring(at - head * ring * hd)
                } else {
                    paged += 1;
                    Place::Paged((paged - 1) * head * PAGE * hd)
                }
            })
            .collect();
        Self {
            pages: Vec::new(),
            page_len: paged * head * PAGE * hd,
            ring_k: vec![0; at],
            ring_v: vec![0; at],
            ctx,
            ring,
            window: p.swa_window,
            layers,
            start: 0,
            held: 0,
            heads: head,
            head_dim: hd,
        }
    }

    /// Positions the cache holds.
    pub fn context_len(&self) -> usize {
        self.ctx
    }

    /// Rows per KV head of a sliding-window layer's ring (`None`: no rings).
    pub fn ring(&self) -> Option<usize> {
        (self.ring > 0).then_some(self.ring)
    }

    /// The most positions one forward pass may write.
    pub fn max_pass(&self) -> usize {
        if self.ring > 0 {
            self.ring - self.window
        } else {
            usize::MAX
        }
    }

    /// The first position the rings still hold; every layer holds the positions from
    /// here to the last one written.
    pub fn ring_start(&self) -> usize {
        self.start
    }

    /// `want` when a step can resume at position `want` (every key its first query
    /// attends to is still held), else 0: rings lose positions, and a step that
    /// starts within the lost window must start over.
    pub fn resumable(&self, want: usize) -> usize {
        if self.start == 0 || want + 1 >= self.start + self.window {
            want
        } else {
            0
        }
    }

    /// Bytes the pages of `caches` take, each page once however many hold it.
    pub fn distinct_page_bytes(caches: &[KvCache]) -> usize {
        let pages: std::collections::HashSet<*const KvPage> =
            caches.iter().flat_map(|c| c.pages.iter().map(Arc::as_ptr)).collect();
        caches.first().map_or(0, |c| pages.len() * c.page_bytes())
    }

    /// Positions written: `0..held`.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The pages the sequence holds (page `i`: positions `i * PAGE..`); another
    /// sequence may hold the same ones.
    pub fn pages(&self) -> &[Arc<KvPage>] {
        &self.pages
    }

    /// Bytes of one page (0 when every layer keeps a ring).
    pub fn page_bytes(&self) -> usize {
        self.page_len * 4
    }

    /// Bytes of the rings written so far.
    pub fn ring_bytes_held(&self) -> usize {
        self.ring_bytes(self.held)
    }

    /// Bytes of the rings the sequence has written, when it holds `tokens`
    /// positions (a ring stops growing at its length).
    pub fn ring_bytes(&self, tokens: usize) -> usize {
        if self.ring == 0 {
            return 0;
        }
        self.ring_k.len() / self.ring * tokens.min(self.ring) * 4
    }

    /// Layer `il`, for attention.
    pub(super) fn view(&self, il: usize) -> LayerView<'_> {
        LayerView {
            cache: self,
            place: self.layers[il],
        }
    }

    /// Where the row of position `pos`, layer `il`, KV head `h` starts: in the page
    /// `pos / PAGE`, or in the rings.
    fn at(&self, il: usize, h: usize, pos: usize) -> (Option<usize>, usize) {
        let hd = self.head_dim;
        match self.layers[il] {
            Place::Paged(off) => (Some(pos / PAGE), off + (h * PAGE + pos % PAGE) * hd),
            Place::Ring(off) => (None, off + (h * self.ring + pos % self.ring) * hd),
        }
    }

    /// The key and value rows of position `pos`, layer `il`, KV head `h`, to write.
    /// The page holding it must be the sequence's own: [`Self::wrote`] made it so.
    pub(super) fn row_mut(&mut self, il: usize, h: usize, pos: usize) -> (&mut [u16], &mut [u16]) {
        let hd = self.head_dim;
        match self.at(il, h, pos) {
            (Some(page), o) => {
                let page = Arc::get_mut(&mut self.pages[page]).expect("a page is written only by its sole holder");
                (&mut page.k[o..o + hd], &mut page.v[o..o + hd])
            }
            (None, o) => (&mut self.ring_k[o..o + hd], &mut self.ring_v[o..o + hd]),
        }
    }

    /// Positions `pos..pos + n` are about to be written: a write at 0 starts the
    /// sequence over; the rings lose what the new rows overwrite; the pages past the
    /// written ones go (another sequence may still hold them), the pages written are
    /// new, or copied first where another sequence holds them too.
    pub(super) fn wrote(&mut self, pos: usize, n: usize) {
        self.held = pos + n;
        if self.ring > 0 {
            if pos == 0 {
                self.start = 0;
            }
            self.start = self.start.max((pos + n).saturating_sub(self.ring));
        }
        if self.page_len == 0 || n == 0 {
            return;
        }
        let end = (pos + n).div_ceil(PAGE);
        self.pages.truncate(end);
        while self.pages.len() < end {
            self.pages.push(Arc::new(KvPage::new(self.page_len)));
        }
        for page in &mut self.pages[pos / PAGE..end] {
            Arc::make_mut(page);
        }
    }

    /// Bytes each position takes on the layers that hold every position.
    pub fn bytes_per_token(&self, p: &LlamaParams) -> usize {
        let full = self.layers.iter().filter(|l| matches!(l, Place::Paged(_))).count();
        2 * 2 * full * p.n_head_kv * p.head_dim
    }

    /// Bytes `tokens` positions take held by this sequence alone: the full layers'
    /// rows and the rings' rows written (a ring stops growing at its length).
    pub fn bytes(&self, tokens: usize, p: &LlamaParams) -> usize {
        tokens * self.bytes_per_token(p) + self.ring_bytes(tokens)
    }

    /// Takes positions `0..len` of `from` (same model, same size): a prefix another
    /// sequence already computed costs neither a prefill nor, on the paged layers,
    /// memory — its pages are shared (or copied, when `share` is false). The rings
    /// get a copy of what `from`'s hold of the last `ring` positions; `len` should be
    /// [`Self::resumable`] in `from`.
    pub fn copy_prefix(&mut self, from: &KvCache, len: usize, share: bool) {
        let pages = &from.pages[..len.div_ceil(PAGE).min(from.pages.len())];
        self.pages = if share {
            pages.to_vec()
        } else {
            pages.iter().map(|p| Arc::new(KvPage::clone(p))).collect()
        };
        let lo = if self.ring > 0 {
            from.start.max(len.saturating_sub(self.ring)).min(len)
        } else {
            0
        };
        for il in 0..self.layers.len() {
            if let Place::Ring(_) = self.layers[il] {
                for h in 0..self.heads {
                    for q in lo..len {
                        let (_, o) = from.at(il, h, q);
                        let (k, v) = self.row_mut(il, h, q);
                        k.copy_from_slice(&from.ring_k[o..o + k.len()]);
                        v.copy_from_slice(&from.ring_v[o..o + v.len()]);
                    }
                }
            }
        }
        self.start = lo;
        self.held = len;
    }

    /// Makes `page` (another sequence's of the same model, or the block store's) this
    /// sequence's page `b`, shared, dropping its pages from `b` on; false (nothing
    /// changed) when the cache keeps rings (a page holds only the other layers), the
    /// page is another model's size, or the sequence lacks positions before it.
    pub fn adopt(&mut self, b: usize, page: Arc<KvPage>) -> bool {
        if self.ring > 0 || page.k.len() != self.page_len || b > self.pages.len() || (b + 1) * PAGE > self.ctx {
            return false;
        }
        self.pages.truncate(b);
        self.pages.push(page);
        self.held = (b + 1) * PAGE;
        true
    }

    /// Whether positions `start..start + n` are all held.
    fn holds(&self, start: usize, n: usize) -> bool {
        start + n <= self.ctx
            && (self.page_len == 0 || start + n <= self.pages.len() * PAGE)
            && (self.ring == 0 || (start >= self.start && n <= self.ring))
    }

    /// Keys and values of positions `start..start + n`, every layer and KV head, as
    /// two `[layer][kv_head][n][head_dim]` arrays of f16 bits; `None` when the
    /// sequence no longer holds them (the rings lost them, or they were never
    /// written).
    pub fn read_rows(&self, start: usize, n: usize, p: &LlamaParams) -> Option<(Vec<u16>, Vec<u16>)> {
        if !self.holds(start, n) {
            return None;
        }
        let len = p.n_layer * p.n_head_kv * n * p.head_dim;
        let (mut k, mut v) = (Vec::with_capacity(len), Vec::with_capacity(len));
        for il in 0..p.n_layer {
            for h in 0..p.n_head_kv {
                self.view(il).runs(h, start, start + n, |kr, vr| {
                    k.extend_from_slice(kr);
                    v.extend_from_slice(vr);
                });
            }
        }
        Some((k, v))
    }

    /// Writes what [`Self::read_rows`] returned back at positions `start..start + n`;
    /// false (nothing written) when they do not fit: beyond the context, past a gap,
    /// or, with rings, neither continuing what they hold nor starting over at 0.
    pub fn write_rows(&mut self, start: usize, n: usize, k: &[u16], v: &[u16], p: &LlamaParams) -> bool {
        let hd = p.head_dim;
        if start + n > self.ctx
            || k.len() != p.n_layer * p.n_head_kv * n * hd
            || v.len() != k.len()
            || (self.page_len > 0 && start > self.pages.len() * PAGE)
            || (self.ring > 0 && ((start > 0 && start < self.start) || n > self.ring))
        {
            return false;
        }
        self.wrote(start, n);
        let rows = k.chunks_exact(hd).zip(v.chunks_exact(hd));
        let at = (0..p.n_layer)
            .flat_map(|il| (0..p.n_head_kv).flat_map(move |h| (start..start + n).map(move |q| (il, h, q))));
        for ((il, h, q), (kr, vr)) in at.zip(rows) {
            let (kd, vd) = self.row_mut(il, h, q);
            kd.copy_from_slice(kr);
            vd.copy_from_slice(vr);
        }
        true
    }

    /// Post-RoPE keys of positions `0..len`, as `[layer][kv_head]` → `len * head_dim`
    /// floats (seed 000's AttentionSnapshot); `None` when the sequence no longer holds
    /// them all.
    pub fn keys(&self, len: usize, p: &LlamaParams) -> Option<Vec<Vec<Vec<f32>>>> {
        if !self.holds(0, len) {
            return None;
        }
        Some(
            (0..p.n_layer)
                .map(|l| {
                    (0..p.n_head_kv)
                        .map(|h| {
                            let mut out = Vec::with_capacity(len * p.head_dim);
                            self.view(l)
                                .runs(h, 0, len, |k, _| out.extend(k.iter().map(|&b| h2f(b))));
                            out
                        })
                        .collect()
                })
                .collect(),
        )
    }
}

#[cfg(test)]
#[path = "kv_cache_tests.rs"]
mod tests;
