//! The MLX bridge script (`workers/src/backends/mlx/bridge.py`, the `metal` worker's
//! child) driven over its JSON Lines protocol with real MLX (the CPU build from PyPI)
//! on the demo model converted to F32 safetensors: greedy tokens agree with the CPU
//! engine on the same weights; a cancel lands at a token boundary; errors come back
//! as events with codes and the bridge lives on; `quit` ends it cleanly.

mod common;

use common::*;
use futures::StreamExt;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use switchyard_backend::{BackendError, CancelFlag, GenerateEvent, Prompt};
use switchyard_messages::{GenerateConfig, LoadConfig};

struct Bridge {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
}

impl Bridge {
    fn start() -> Self {
        let mut child = Command::new(python())
            .arg(repo().join("workers/src/backends/mlx/bridge.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the bridge");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut b = Bridge { child, stdin, lines };
        assert_eq!(b.next()["event"], "ready");
        b
    }
    fn send(&mut self, v: Value) {
        writeln!(self.stdin, "{v}").unwrap();
        self.stdin.flush().unwrap();
    }
    fn next(&mut self) -> Value {
        let line = self.lines.next().expect("a line from the bridge").unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }
    /// Token ids until the request's `done` (returned) or `error` (panics).
    fn tokens(&mut self, id: u64) -> (Vec<u64>, Value) {
        let mut ids = Vec::new();
        loop {
            let ev = self.next();
            assert_eq!(ev["id"], id, "{ev}");
            match ev["event"].as_str() {
                Some("token") => ids.push(ev["token"].as_u64().unwrap()),
                Some("done") => return (ids, ev),
                _ => panic!("unexpected event {ev}"),
            }
        }
    }
}

#[test]
fn the_bridge_generates_like_the_cpu_engine_cancels_and_reports_errors() {
    let dir = converted_demo_model();
    let mut b = Bridge::start();
    b.send(json!({"id": 1, "op": "load", "path": dir, "device": "cpu"}));
    let loaded = b.next();
    assert_eq!(loaded["event"], "loaded", "{loaded}");
    assert_eq!(loaded["info"]["num_layers"], 30);
    assert_eq!(loaded["info"]["vocab_size"], 49152);

    // Greedy: the same 12 tokens as switchyard's CPU engine on the same F32 weights.
    let prompt = "The capital of France is";
    b.send(json!({"id": 2, "op": "generate", "prompt": prompt, "config": {"max_tokens": 12}}));
    let (mlx, done) = b.tokens(2);
    assert_eq!(done["finish"], "length");
    assert_eq!(done["metrics"]["prompt_tokens"], 5);
    assert!(done["metrics"]["peak_memory_bytes"].as_u64().unwrap() > 0, "{done}");
    let load = LoadConfig {
        context_len: 512,
        threads: 1,
        ..LoadConfig::default()
    };
    let own = switchyard_workers::engine::ForwardPass::Own;
    let cpu = switchyard_workers::engine::load_model(&dir, &load, own).expect("HF directory loads");
    let config = GenerateConfig {
        max_tokens: 12,
        ..GenerateConfig::default()
    };
    let ours: Vec<u64> = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let mut s = cpu.generate(Prompt::Text(prompt.into()), config, CancelFlag::default());
        let mut ids = Vec::new();
        while let Some(ev) = s.next().await {
            if let GenerateEvent::Token(t) = ev.unwrap() {
                ids.push(u64::from(t.id));
            }
        }
        ids
    });
    assert_eq!(mlx, ours, "MLX vs the CPU engine, greedy");

    // A cancel lands at the next token boundary.
    b.send(json!({"id": 3, "op": "generate", "prompt": "Once upon a time", "config": {"max_tokens": 200}}));
    let first = b.next();
    assert_eq!(first["event"], "token", "{first}");
    b.send(json!({"id": 9, "op": "cancel", "target": 3}));
    let (rest, done) = b.tokens(3);
    assert_eq!(done["finish"], "cancelled", "{done}");
    assert!(rest.len() < 150, "{} tokens after the cancel", rest.len());

    // Errors are events with codes; the bridge serves on.
    b.send(json!({"id": 4, "op": "generate", "prompt": "", "config": {}}));
    assert_eq!(b.next()["code"], "bad_request");
    b.send(json!({"id": 5, "op": "generate", "prompt": "Hi", "config": {"max_tokens": 100000}}));
    let overflow = b.next();
    assert_eq!(overflow["code"], "context_overflow");
    // With its numbers, so the worker answers the contract's context_overflow.
    assert!(
        matches!(
            switchyard_workers::backends::mlx::child::error_from(&overflow),
            BackendError::ContextOverflow { max_tokens: 100000, .. }
        ),
        "{overflow}"
    );
    b.send(json!({"id": 6, "op": "fly"}));
    let e = b.next();
    assert_eq!(
        (e["event"].as_str(), e["code"].as_str()),
        (Some("error"), Some("bad_request"))
    );
    b.send(json!({"id": 7, "op": "generate", "prompt": prompt, "config": {"max_tokens": 3}}));
    assert_eq!(b.tokens(7).0, mlx[..3]);
    // logit_bias: the first greedy token banned, another pushed (as the CPU engine does).
    let bias = json!({mlx[0].to_string(): -100.0, mlx[2].to_string(): 5.0});
    b.send(json!({"id": 10, "op": "generate", "prompt": prompt, "config": {"max_tokens": 4, "logit_bias": bias}}));
    let (biased, _) = b.tokens(10);
    assert_ne!(biased[0], mlx[0]);
    b.send(json!({"id": 11, "op": "generate", "prompt": prompt, "config": {"max_tokens": 4, "logit_bias": {"999999": 1.0}}}));
    assert_eq!(b.next()["code"], "bad_request");
    // A default max_tokens is fitted to the window (512 here) instead of refused.
    b.send(json!({"id": 12, "op": "generate", "prompt": prompt, "config": {"max_tokens": 100000, "fit_max_tokens": true, "temperature": 0.0}}));
    let (_, done) = b.tokens(12);
    assert!(done["finish"].is_string(), "{done}");

    // Log-probabilities: on each token, with the most likely alternatives first
    // (greedy, so the token is the first of them), and the same tokens as without.
    b.send(json!({"id": 13, "op": "generate", "prompt": prompt, "config": {"max_tokens": 3, "logprobs": 2}}));
    for (i, want) in mlx[..3].iter().enumerate() {
        let ev = b.next();
        assert_eq!(
            (ev["event"].as_str(), ev["token"].as_u64()),
            (Some("token"), Some(*want)),
            "{ev}"
        );
        let lp = &ev["logprob"];
        let top = lp["top"].as_array().unwrap_or_else(|| panic!("step {i}: {ev}"));
        assert_eq!(top.len(), 2, "{ev}");
        assert_eq!(top[0]["id"].as_u64(), Some(*want), "{ev}");
        let (l, t0, t1) = (
            lp["logprob"].as_f64().unwrap(),
            top[0]["logprob"].as_f64().unwrap(),
            top[1]["logprob"].as_f64().unwrap(),
        );
        assert!(l <= 0.0 && (l - t0).abs() < 1e-4 && t0 >= t1, "{ev}");
        assert!(!lp["bytes"].as_array().unwrap().is_empty(), "{ev}");
    }
    assert_eq!(b.next()["event"], "done");

    // Embeddings: mean-pooled hidden states, as the CPU engine computes them from the
    // same F32 weights.
    assert_eq!(loaded["info"]["embedding_dim"], 576);
    assert_eq!(cpu.info().embedding_dim, 576);
    let texts = [
        "The capital of France is Paris.",
        "Mitochondria are the powerhouse of the cell.",
    ];
    let ours = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(cpu.embed(texts.iter().map(|t| Prompt::Text(t.to_string())).collect()));
    for (i, text) in texts.iter().enumerate() {
        b.send(json!({"id": 14 + i, "op": "embed", "prompt": text}));
        let ev = b.next();
        assert_eq!(ev["event"], "embedded", "{ev}");
        let theirs: Vec<f32> = {
            use base64::Engine;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(ev["embedding"].as_str().unwrap())
                .unwrap();
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let ours = ours[i].as_ref().unwrap();
        assert_eq!(ev["tokens"], ours.tokens, "{text}");
        let c = cosine(&ours.vector, &theirs);
        eprintln!("MLX vs the CPU engine, embedding of {text:?}: cosine {c:.7}");
        assert!(c > 0.999, "{text}: cosine {c}");
    }
    b.send(json!({"id": 16, "op": "embed", "prompt": ""}));
    assert_eq!(b.next()["event"], "error", "an empty input");

    b.send(json!({"id": 8, "op": "quit"}));
    assert_eq!(b.next()["event"], "bye");
    assert!(b.child.wait().unwrap().success());
}
