//! The CPU engine's kernel variants, end to end: a whole forward pass (prefill tiles of
//! 8 and 4 rows, single rows, then decode steps) on the real models gives the same
//! logits, bit for bit, under every variant this CPU supports, each forced with
//! `SWITCHYARD_CPU_ISA` in a child process; an unknown or unsupported variant is
//! refused by name. The children are this binary's `child_*` tests, ignored in a
//! normal run (alone they check nothing) and run by the parents with `--ignored`.

use candle_core::quantized::gguf_file;
use std::path::Path;
use std::process::Command;
use switchyard_engine::kernels::isa::{self, Isa};
use switchyard_engine::model::llama::LlamaModel;
use switchyard_messages::LoadConfig;
use switchyard_testkit::*;

/// Runs one (ignored) child test of this binary with `SWITCHYARD_CPU_ISA=isa`,
/// returning whether it passed and its output.
fn child(test: &str, isa: &str) -> (bool, String) {
    // Test names are module paths without the crate's: `cpu_isa::child_…`.
    let module = module_path!().split_once("::").map_or("", |(_, m)| m);
    let test = format!("{module}::{test}");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", &test, "--ignored", "--nocapture", "--test-threads", "1"])
        .env("SWITCHYARD_CPU_ISA", isa)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn every_kernel_variant_computes_the_same_logits() {
    let available = Isa::available();
    eprintln!("kernel variants on this CPU: {available:?}");
    let mut seen: Vec<(Isa, Vec<String>)> = Vec::new();
    for isa in available {
        let (ok, text) = child("child_prints_logit_hashes", isa.name());
        assert!(ok, "{isa}: child failed:\n{text}");
        let lines: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with("LOGITS "))
            .map(str::to_string)
            .collect();
        assert!(
            text.contains(&format!("KERNELS {}", isa.name())),
            "{isa}: the child did not run the forced variant:\n{text}"
        );
        assert!(!lines.is_empty(), "{isa}: no logits from the child:\n{text}");
        eprintln!("{isa}: {lines:?}");
        if let Some((first, want)) = seen.first() {
            assert_eq!(&lines, want, "{isa} computes other logits than {first}");
        }
        seen.push((isa, lines));
    }
}

/// In a child: hashes of the logits of a 45-token prompt and 3 decode steps.
#[test]
#[ignore = "a child of every_kernel_variant_computes_the_same_logits"]
fn child_prints_logit_hashes() {
    println!("KERNELS {}", isa::init().unwrap());
    let mut models = vec![demo_model()];
    models.extend(gemma_model());
    for path in models {
        println!(
            "LOGITS {} {:016x}",
            path.file_name().unwrap().to_string_lossy(),
            logit_hash(&path)
        );
    }
}

fn logit_hash(path: &Path) -> u64 {
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let model = LlamaModel::load(&content, &mut file, 256).unwrap();
    let mut cache = model.new_cache();
    // 45 = 5 × 8 + 4 + 1: every tile width and a single row.
    let prompt: Vec<u32> = (1..=45u32).map(|i| (i * 7919) % 20000 + 100).collect();
    let mut h = 0xcbf29ce484222325u64;
    let mut mix = |logits: &[f32]| {
        for v in logits {
            h = (h ^ v.to_bits() as u64).wrapping_mul(0x100000001b3);
        }
    };
    let mut logits = model.forward(&mut cache, &prompt, 0);
    mix(&logits);
    for step in 0..3 {
        let next = logits
            .iter()
            .enumerate()
            .fold(0, |best, (i, v)| if *v > logits[best] { i } else { best }) as u32;
        logits = model.forward(&mut cache, &[next], prompt.len() + step);
        mix(&logits);
    }
    h
}

#[test]
fn unknown_and_unsupported_variants_are_refused_by_name() {
    let (ok, text) = child("child_loads_the_demo_model", "sse9");
    assert!(!ok, "an unknown variant was accepted:\n{text}");
    assert!(
        text.contains("SWITCHYARD_CPU_ISA=\"sse9\" is not a kernel variant"),
        "{text}"
    );
    if let Some(missing) = Isa::ALL.into_iter().find(|i| !i.supported()) {
        let (ok, text) = child("child_loads_the_demo_model", missing.name());
        assert!(!ok, "{missing} was accepted on a CPU without it:\n{text}");
        assert!(text.contains("needs CPU features this host lacks"), "{text}");
    } else {
        eprintln!("this CPU runs every variant, so none can be refused as unsupported");
    }
}

/// In a child: loads the demo model on the cpu backend; fails with the load error.
#[test]
#[ignore = "a child of unknown_and_unsupported_variants_are_refused_by_name"]
fn child_loads_the_demo_model() {
    let r = switchyard_engine::load_model(
        &demo_model(),
        &LoadConfig::default(),
        switchyard_engine::ForwardPass::Own,
    );
    if let Err(e) = r {
        panic!("load failed: {e}");
    }
}
