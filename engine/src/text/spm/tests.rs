//! SentencePiece tokenization checked against llama.cpp's.

use super::*;

/// A tiny vocabulary: `(text, score)`; ids are the positions.
fn model(vocab: &[(&str, f32)]) -> SpmModel {
    let texts = vocab.iter().map(|(t, _)| t.as_bytes());
    let scores = vocab.iter().map(|(_, s)| *s).collect();
    SpmModel::new(texts, scores, Some(0))
}

fn encode(m: &SpmModel, text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    m.encode(text.as_bytes(), &mut out);
    out
}

fn byte_vocab() -> Vec<(String, f32)> {
    (0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0)).collect()
}

#[test]
fn merges_the_highest_scoring_pair_first() {
    // "abc": "ab" (-1) beats "bc" (-2), then "ab"+"c" has no token.
    let m = model(&[
        ("<unk>", 0.0),
        ("a", -5.0),
        ("b", -5.0),
        ("c", -5.0),
        ("ab", -1.0),
        ("bc", -2.0),
    ]);
    assert_eq!(encode(&m, "abc"), vec![4, 3]);
    // With "bc" better, the right pair wins.
    let m = model(&[
        ("<unk>", 0.0),
        ("a", -5.0),
        ("b", -5.0),
        ("c", -5.0),
        ("ab", -3.0),
        ("bc", -2.0),
    ]);
    assert_eq!(encode(&m, "abc"), vec![1, 5]);
}

#[test]
fn ties_merge_the_leftmost_pair() {
    // "aaa": both "aa" pairs score the same; the left one merges first.
    let m = model(&[("<unk>", 0.0), ("a", -5.0), ("aa", -1.0)]);
    assert_eq!(encode(&m, "aaa"), vec![2, 1]);
    assert_eq!(encode(&m, "aaaa"), vec![2, 2]);
}

#[test]
fn merges_chain_through_intermediate_tokens_only() {
    // "abcd" is a token, but with only "ab" to build on no merge reaches it.
    let vocab = [
        ("<unk>", 0.0),
        ("a", 0.0),
        ("b", 0.0),
        ("c", 0.0),
        ("d", 0.0),
        ("abcd", 10.0),
        ("ab", -1.0),
    ];
    assert_eq!(encode(&model(&vocab), "abcd"), vec![6, 3, 4]);
    // With "cd" as well, "ab" merges first (tie, leftmost), then "cd", then
    // "ab"+"cd" forms "abcd"; the stale "abc" candidate (-2) is skipped.
    let vocab = [
        ("<unk>", 0.0),
        ("a", 0.0),
        ("b", 0.0),
        ("c", 0.0),
        ("d", 0.0),
        ("abcd", 10.0),
        ("ab", -1.0),
        ("cd", -1.0),
        ("abc", -2.0),
    ];
    assert_eq!(encode(&model(&vocab), "abcd"), vec![5]);
    // Which pair takes "c" depends on the scores: "abc" (-2) vs "cd" (-3 or -1.5).
    let vocab = |cd: f32| {
        let v = [
            ("<unk>", 0.0),
            ("a", 0.0),
            ("b", 0.0),
            ("c", 0.0),
            ("d", 0.0),
            ("ab", -1.0),
            ("cd", cd),
            ("abc", -2.0),
        ];
        model(&v)
    };
    assert_eq!(encode(&vocab(-3.0), "abcd"), vec![7, 4]);
    assert_eq!(encode(&vocab(-1.5), "abcd"), vec![5, 6]);
}

#[test]
fn unknown_characters_fall_back_to_bytes() {
    let mut v = byte_vocab();
    v.push(("▁".into(), -1.0));
    v.push(("h".into(), -1.0));
    let vocab: Vec<(&str, f32)> = v.iter().map(|(t, s)| (t.as_str(), *s)).collect();
    let m = model(&vocab);
    // "é" is not a token: its two UTF-8 bytes come out as <0xC3> <0xA9>.
    assert_eq!(encode(&m, "hé"), vec![257, 0xC3, 0xA9]);
    assert_eq!(encode(&m, "▁"), vec![256]);
}

#[test]
fn splitter_prefers_longer_tokens_and_splits_every_occurrence() {
    let s = SpecialSplitter::new(vec![
        SpecialToken {
            id: 7,
            text: "\n".into(),
            lstrip: false,
            rstrip: false,
        },
        SpecialToken {
            id: 8,
            text: "\n\n".into(),
            lstrip: false,
            rstrip: false,
        },
        SpecialToken {
            id: 9,
            text: "<t>".into(),
            lstrip: false,
            rstrip: false,
        },
    ]);
    let text = "a\n\n\nb<t>c<t>";
    assert_eq!(
        s.split(text),
        vec![
            Piece::Text(b"a"),
            Piece::Token(8),
            Piece::Token(7),
            Piece::Text(b"b"),
            Piece::Token(9),
            Piece::Text(b"c"),
            Piece::Token(9),
        ]
    );
    assert_eq!(s.split(""), vec![]);
    assert_eq!(s.split("plain"), vec![Piece::Text(b"plain")]);
}

#[test]
fn splitter_honours_strip_flags() {
    let s = SpecialSplitter::new(vec![SpecialToken {
        id: 1,
        text: "<m>".into(),
        lstrip: true,
        rstrip: true,
    }]);
    assert_eq!(
        s.split("a \t<m>\n b"),
        vec![Piece::Text(b"a"), Piece::Token(1), Piece::Text(b"b")]
    );
    assert_eq!(s.split(" <m> "), vec![Piece::Token(1)]);
}

#[test]
fn tokenizer_escapes_spaces_and_prefixes_after_specials() {
    let vocab = [("<unk>", 0.0), ("▁", -1.0), ("a", -1.0), ("▁a", -0.5), ("<s>", 0.0)];
    let splitter = SpecialSplitter::new(vec![SpecialToken {
        id: 4,
        text: "<s>".into(),
        lstrip: false,
        rstrip: false,
    }]);
    let t = SpmTokenizer::new(model(&vocab), splitter, true);
    let mut out = Vec::new();
    t.encode("a<s>a a", &mut out);
    assert_eq!(out, vec![3, 4, 3, 3]);
    let t = SpmTokenizer::new(model(&vocab), SpecialSplitter::new(Vec::new()), false);
    let mut out = Vec::new();
    t.encode("a a", &mut out);
    assert_eq!(out, vec![2, 3]);
}

#[test]
fn token_table_finds_every_text_and_nothing_else() {
    let texts: Vec<String> = (0..5000)
        .map(|i| format!("t{i}"))
        .chain(["".into(), "t7".into()])
        .collect();
    let m = SpmModel::new(texts.iter().map(|t| t.as_bytes()), Vec::new(), None);
    assert_eq!(m.len(), 5002);
    assert_eq!(m.token_id(b"t0"), Some(0));
    assert_eq!(m.token_id(b"t4999"), Some(4999));
    assert_eq!(m.token_id(b""), Some(5000));
    // A duplicate text resolves to the later id, like llama.cpp.
    assert_eq!(m.token_id(b"t7"), Some(5001));
    assert_eq!(m.token_id(b"t5000"), None);
    assert_eq!(m.token_text(4999), b"t4999");
    assert_eq!(m.token_text(99_999), b"");
    let empty = SpmModel::new(std::iter::empty(), Vec::new(), None);
    assert!(empty.is_empty());
    assert_eq!(empty.token_id(b"a"), None);
}

#[test]
fn find_handles_edges() {
    assert_eq!(find(b"abcabc", b"ca"), Some(2));
    assert_eq!(find(b"ab", b"abc"), None);
    assert_eq!(find(b"aab", b"ab"), Some(1));
    assert_eq!(find(b"", b"a"), None);
    assert_eq!(find(b"a", b""), None);
}
