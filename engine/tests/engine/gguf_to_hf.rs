//! `scripts/gguf-to-hf.py`: the demo GGUF as a Hugging Face directory (dequantized F32
//! safetensors, config.json, tokenizer.json from the GGUF's vocabulary and merges, the
//! GGUF's chat template) — the model MLX and the safetensors loader are tested with.
//! The directory is made once and kept in the cache (`models/…-f32-hf`).
//! - tokenizer.json, read by Hugging Face's own `tokenizers` library (what mlx-lm
//!   uses), gives exactly the GGUF vocabulary's token ids;
//! - the chat template is the GGUF's, byte for byte;
//! - the CPU engine's next token after a prompt is the same on both (the same weights:
//!   Q4_1 with 8-bit activations vs their exact F32 dequantization).

use switchyard_backend::Prompt;
use switchyard_engine::text::tokenizer::GgufTokenizer;
use switchyard_messages::LoadConfig;
use switchyard_testkit::*;

const TEXTS: &[&str] = &[
    "The capital of France is",
    "Question: What is 12 times 7?\nAnswer: 84, and 1234567 + 89 = 1234656.",
    "naïve café, 東京, Ωμέγα, emoji 🚀🔥 and tabs\tand  double  spaces\n\n\nnewlines",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "fn main() { println!(\"{}\", x.iter().map(|v| v * 2).sum::<u32>()); } // done",
    "   leading spaces and trailing   ",
    "It's we're they'll I'd don't CAPITALS MiXeD",
];

#[test]
fn the_converted_directory_tokenizes_templates_and_predicts_like_the_gguf() {
    let dir = converted_demo_model();
    let gguf = GgufTokenizer::from_path(&demo_model()).expect("GGUF tokenizer");
    let hf = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer.json loads");
    for text in TEXTS {
        let want = gguf.encode(text).expect("GGUF encodes");
        let got = hf.encode(*text, false).expect("tokenizers encodes");
        assert_eq!(got.get_ids(), &want[..], "{text:?}");
        let back = hf.decode(got.get_ids(), false).expect("tokenizers decodes");
        assert_eq!(back, *text, "decode of {text:?}");
    }

    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    let reader = {
        let mut f = std::fs::File::open(demo_model()).unwrap();
        candle_core::quantized::gguf_file::Content::read(&mut f).unwrap()
    };
    let template = reader.metadata["tokenizer.chat_template"].to_string().unwrap().clone();
    assert_eq!(cfg["chat_template"].as_str(), Some(template.as_str()));

    let load = LoadConfig {
        context_len: 512,
        threads: 1,
        ..LoadConfig::default()
    };
    let own = switchyard_engine::ForwardPass::Own;
    let q = switchyard_engine::load_model(&demo_model(), &load, own).expect("GGUF loads");
    let f = switchyard_engine::load_model(&dir, &load, own).expect("HF directory loads");
    let prompts: Vec<Prompt> = TEXTS[..4].iter().map(|t| Prompt::Text(t.to_string())).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (a, b) = rt.block_on(async {
        (
            q.classify(prompts.clone(), false).await,
            f.classify(prompts, false).await,
        )
    });
    for ((x, y), text) in a.iter().zip(&b).zip(TEXTS) {
        let (x, y) = (x.as_ref().unwrap(), y.as_ref().unwrap());
        assert_eq!(x.token.id, y.token.id, "next token after {text:?}");
    }
}
