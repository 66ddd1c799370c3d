//! Unit tests of `kv_cache.rs`: rings, pages, sharing, copy-on-write.

use super::*;
use crate::model::params::FfnAct;

/// Six layers (five sliding-window, one global) of one KV head of 2 values;
/// window 4.
fn params() -> LlamaParams {
    LlamaParams {
        n_layer: 6,
        n_embd: 8,
        n_head: 2,
        n_head_kv: 1,
        head_dim: 2,
        n_ff: 8,
        rms_eps: 1e-6,
        rope_base: 10_000.0,
        rope_dims: 2,
        n_vocab: 0,
        arch: "gemma3".into(),
        rope_neox: true,
        embd_scale: None,
        attn_scale: 1.0,
        ffn_act: FfnAct::Gelu,
        swa_window: 4,
        swa_pattern: 6,
        rope_base_swa: 10_000.0,
    }
}

/// What `read_rows` gives for positions `start..start + n` when every value of
/// position `q` is `q` (keys) or `q + 100` (values).
fn rows(start: usize, n: usize, p: &LlamaParams) -> (Vec<u16>, Vec<u16>) {
    let k: Vec<u16> = (0..p.n_layer)
        .flat_map(|_| (start..start + n).flat_map(|q| [q as u16; 2]))
        .collect();
    let v = k.iter().map(|x| x + 100).collect();
    (k, v)
}

#[test]
fn wrap_splits_a_run_at_the_end_of_the_ring() {
    assert_eq!(wrap(3, 7, 10), [3..7, 0..0]);
    assert_eq!(wrap(13, 20, 10), [3..10, 0..0]);
    assert_eq!(wrap(8, 13, 10), [8..10, 0..3]);
    assert_eq!(wrap(20, 30, 10), [0..10, 0..0]);
}

#[test]
fn rings_keep_the_last_positions_and_resume_only_within_them() {
    let p = params();
    // Rings of 4 + 2 rows on layers 0..5; layer 5 holds all 32 positions, in pages.
    let mut c = KvCache::windowed(&p, 32, 2);
    assert_eq!((c.ring(), c.max_pass()), (Some(6), 2));
    assert_eq!((c.layers[4], c.layers[5]), (Place::Ring(4 * 6 * 2), Place::Paged(0)));
    assert_eq!(c.page_bytes(), PAGE * 2 * 2 * 2);
    assert_eq!(
        (c.bytes_per_token(&p), c.bytes(3, &p), c.bytes(20, &p)),
        (8, 8 * 3 + 40 * 3, 8 * 20 + 40 * 6)
    );
    for s in (0..10).step_by(2) {
        let (k, v) = rows(s, 2, &p);
        assert!(c.write_rows(s, 2, &k, &v, &p));
    }
    // Positions 0..10 written: the rings hold 4..10.
    assert_eq!(c.ring_start(), 4);
    assert_eq!(c.read_rows(4, 6, &p), Some(rows(4, 6, &p)), "wraps at row 6");
    assert_eq!(c.read_rows(3, 2, &p), None);
    assert_eq!(c.keys(4, &p), None);
    // A step at q attends to q - 3..q: resumable from 7 on.
    assert_eq!(
        (c.resumable(10), c.resumable(7), c.resumable(6), c.resumable(0)),
        (10, 7, 0, 0)
    );
    // Rows that neither continue the rings nor start over are refused.
    let (k, v) = rows(2, 2, &p);
    assert!(!c.write_rows(2, 2, &k, &v, &p));
    assert!(!c.write_rows(8, 2, &k[1..], &v, &p), "wrong length");
    assert_eq!(c.read_rows(4, 6, &p), Some(rows(4, 6, &p)), "unchanged");

    // A prefix copy takes the rings' last positions and the global layer's all.
    let mut d = KvCache::windowed(&p, 32, 2);
    d.copy_prefix(&c, 9, true);
    assert_eq!(d.ring_start(), 4);
    assert_eq!(d.read_rows(4, 5, &p), Some(rows(4, 5, &p)));
    let mut global = Vec::new();
    d.view(5).runs(0, 0, 9, |k, _| global.extend_from_slice(k));
    assert_eq!(global, rows(0, 9, &p).0[..18]);

    // Writing at 0 starts over: everything is readable again.
    let (k, v) = rows(0, 2, &p);
    assert!(c.write_rows(0, 2, &k, &v, &p));
    assert_eq!((c.ring_start(), c.resumable(1)), (0, 1));
    assert_eq!(c.read_rows(0, 2, &p), Some(rows(0, 2, &p)));
    assert_eq!(c.keys(2, &p).unwrap()[0][0], [0, 0, 1, 1].map(h2f));
    assert_eq!(d.read_rows(4, 5, &p), Some(rows(4, 5, &p)), "d's pages are its own now");
}

#[test]
fn a_cache_without_window_or_shorter_than_a_ring_keeps_every_position() {
    let p = params();
    for c in [KvCache::new(&p, 32), KvCache::windowed(&p, 6, 2)] {
        assert_eq!((c.ring(), c.max_pass()), (None, usize::MAX));
        assert_eq!(c.bytes(5, &p), 5 * c.bytes_per_token(&p));
    }
    let global = LlamaParams { swa_window: 0, ..p };
    assert_eq!(KvCache::windowed(&global, 32, 2).ring(), None);
}

/// Writes positions `a..b` of `c` as `rows` would, one pass.
fn fill(c: &mut KvCache, a: usize, b: usize, p: &LlamaParams, salt: u16) {
    let (k, v) = rows(a, b - a, p);
    let (k, v): (Vec<u16>, Vec<u16>) = (
        k.iter().map(|x| x + salt).collect(),
        v.iter().map(|x| x + salt).collect(),
    );
    assert!(c.write_rows(a, b - a, &k, &v, p));
}

#[test]
fn pages_are_shared_copied_on_write_and_freed_by_their_last_holder() {
    let p = LlamaParams {
        swa_window: 0,
        ..params()
    };
    let mut a = KvCache::new(&p, 4 * PAGE);
    fill(&mut a, 0, 2 * PAGE + 5, &p, 0);
    assert_eq!(a.pages().len(), 3);
    // b shares a's first 2 pages and 5 rows of the third.
    let mut b = KvCache::new(&p, 4 * PAGE);
    b.copy_prefix(&a, 2 * PAGE + 5, true);
    assert!(a.pages().iter().zip(b.pages()).all(|(x, y)| Arc::ptr_eq(x, y)));
    assert_eq!(Arc::strong_count(&a.pages()[0]), 2);
    // b diverges at 2 * PAGE + 5: its third page is copied first; a's is untouched.
    fill(&mut b, 2 * PAGE + 5, 2 * PAGE + 9, &p, 1000);
    assert!(Arc::ptr_eq(&a.pages()[1], &b.pages()[1]));
    assert!(!Arc::ptr_eq(&a.pages()[2], &b.pages()[2]));
    assert_eq!(b.read_rows(0, 2 * PAGE + 5, &p), a.read_rows(0, 2 * PAGE + 5, &p));
    let (bk, _) = b.read_rows(2 * PAGE + 5, 4, &p).unwrap();
    assert_eq!(bk[..2], [2 * PAGE as u16 + 1005; 2]);
    // a starts over: b alone holds the old pages now, unchanged.
    let before = b.read_rows(0, 2 * PAGE + 9, &p);
    let first = Arc::downgrade(&b.pages()[0]);
    fill(&mut a, 0, 3, &p, 7);
    assert_eq!(a.pages().len(), 1);
    assert_eq!(b.read_rows(0, 2 * PAGE + 9, &p), before);
    assert_eq!(first.strong_count(), 1);
    // b's last holder goes: its pages are freed.
    drop(b);
    assert!(first.upgrade().is_none());
    // A page adopted (as from the block store) is shared until written.
    let mut d = KvCache::new(&p, 4 * PAGE);
    assert!(!d.adopt(1, a.pages()[0].clone()), "a gap before it");
    assert!(d.adopt(0, a.pages()[0].clone()));
    assert!(Arc::ptr_eq(&a.pages()[0], &d.pages()[0]));
    assert_eq!(d.read_rows(0, 3, &p), a.read_rows(0, 3, &p));
    fill(&mut d, 1, 2, &p, 500);
    assert_eq!(
        a.read_rows(1, 1, &p),
        Some(rows(1, 1, &p)).map(|(k, v)| (k.iter().map(|x| x + 7).collect(), v.iter().map(|x| x + 7).collect()))
    );
    let ring = KvCache::windowed(&params(), 4 * PAGE, 2);
    assert!(!{ ring }.adopt(0, a.pages()[0].clone()), "a page holds no ring layers");
    // A copy (no sharing) holds pages of its own with the same rows.
    let mut c = KvCache::new(&p, 4 * PAGE);
    c.copy_prefix(&a, 3, false);
    assert!(!Arc::ptr_eq(&a.pages()[0], &c.pages()[0]));
    assert_eq!(c.read_rows(0, 3, &p), a.read_rows(0, 3, &p));
}
