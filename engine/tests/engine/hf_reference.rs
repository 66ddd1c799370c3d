//! Hugging Face model directories (config.json + tokenizer.json + model.safetensors)
//! against the same weights as a GGUF file, which qwen_reference.rs and
//! greedy_reference.rs hold against llama.cpp. scripts/make-random-hf-model.py
//! writes both from one random-weight model, permuting Llama's Q and K for the GGUF
//! as llama.cpp's converter does.

use std::process::Command;
use switchyard_backend::{Prompt, TextModel};
use switchyard_engine::EngineModel;
use switchyard_messages::LoadConfig;
use switchyard_testkit::*;

const TEXTS: &[&str] = &[
    "Hello, world! naïve café 日本語 🚀",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "numbers 1234567890 and   spaces\n\n\ttabs",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn safetensors_directories_match_their_gguf_twins() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, dtype) in [("llama", "bf16"), ("qwen2", "f16"), ("qwen3", "f32")] {
        let hf_dir = dir.path().join(format!("{arch}-{dtype}"));
        let gguf = dir.path().join(format!("{arch}-{dtype}.gguf"));
        let out = Command::new(python())
            .arg(repo().join("scripts/make-random-hf-model.py"))
            .arg(demo_model())
            .arg(&hf_dir)
            .arg(&gguf)
            .args([arch, dtype])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let name = format!("{arch}/{dtype}");
        let hf = EngineModel::load(&hf_dir, &LoadConfig::default()).unwrap();
        let reference = EngineModel::load(&gguf, &LoadConfig::default()).unwrap();

        let (a, b) = (hf.info(), reference.info());
        assert_eq!(
            (a.architecture.as_str(), a.vocab_size, a.num_layers, a.hidden_size),
            (b.architecture.as_str(), b.vocab_size, b.num_layers, b.hidden_size),
            "{name}: model info"
        );
        assert_eq!(a.context_len, 512, "{name}: context from max_position_embeddings");

        // tokenizer.json and the GGUF vocabulary give the same ids and text.
        for text in TEXTS {
            let ids = hf.tokenizer().encode(text).unwrap();
            assert_eq!(
                ids,
                reference.tokenizer().encode(text).unwrap(),
                "{name}: ids of {text:?}"
            );
            assert_eq!(hf.tokenizer().decode(&ids), *text, "{name}: decode of {text:?}");
        }
        assert!(hf.tokenizer().eog_ids().contains(&2), "{name}: eos from config.json");
        let chat = vec![switchyard_messages::Message::new("user", "Hi")];
        assert_eq!(hf.render_chat(&chat).unwrap(), reference.render_chat(&chat).unwrap());

        // The same next-token logits at every prefix of a prompt.
        let ids = hf.tokenizer().encode(TEXTS[0]).unwrap();
        for i in 1..=ids.len() {
            let prefix = Prompt::Tokens(ids[..i].to_vec());
            let ours = hf.classify(vec![prefix.clone()], true).await.remove(0).unwrap();
            let theirs = reference.classify(vec![prefix], true).await.remove(0).unwrap();
            assert_eq!(ours.token.id, theirs.token.id, "{name}: argmax after {i} tokens");
            let worst = ours
                .logits
                .iter()
                .zip(&theirs.logits)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < 2e-3, "{name}: logits differ by {worst} after {i} tokens");
        }
    }
}

#[test]
fn a_directory_with_an_unsupported_model_type_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"model_type": "mamba", "hidden_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "intermediate_size": 128}"#,
    )
    .unwrap();
    let err = EngineModel::load(dir.path(), &LoadConfig::default())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("\"mamba\"") && err.contains("qwen3"), "{err}");
}
