//! `switchyard bench lora`: what unmerged LoRA adapters cost the CPU engine's decode.
//! A batch of streams decodes greedily in one forward pass per token: all on the bare
//! base model, all on one adapter, and spread over four adapters (the rows of each
//! adapter get its own low-rank update); alternating runs, the same prompts and
//! threads. The adapters are the test adapters `scripts/make-lora.py` writes for the
//! model (rank 8 on every projection).

use clap::Args;
use std::path::{Path, PathBuf};
use std::time::Instant;
use switchyard_workers::engine::model::llama::{LlamaModel, Step};
use switchyard_workers::engine::model::lora::LoraAdapter;

/// `switchyard bench lora`.
#[derive(Args, Debug)]
pub struct BenchLoraArgs {
    /// The GGUF model, a Llama-family one make-lora.py can write adapters for
    /// (default: the demo model).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Streams decoded together.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens each stream decodes per run.
    #[arg(long, default_value_t = 48)]
    pub steps: usize,
    /// Measured runs of each configuration (alternating, after one warm-up each).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Compute threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// LoRA rank of the test adapters.
    #[arg(long, default_value_t = 8)]
    pub rank: usize,
}

/// Writes the test adapter with `seed` into `dir` (PEFT + GGUF); returns the GGUF.
fn make_adapter(python: &Path, model: &Path, dir: &Path, seed: usize, rank: usize) -> anyhow::Result<PathBuf> {
    let out = dir.join(format!("lora-{seed}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-lora.py");
    let run = std::process::Command::new(python)
        .arg(script)
        .arg(model)
        .arg(&out)
        .args(["--seed", &seed.to_string(), "--rank", &rank.to_string()])
        .output()?;
    anyhow::ensure!(
        run.status.success(),
        "make-lora.py: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    Ok(out.join("adapter.gguf"))
}

/// Decodes `steps` tokens for every stream, each row with `loras[row]`; tok/s.
fn decode(model: &LlamaModel, prompts: &[Vec<u32>], loras: &[Option<&LoraAdapter>], steps: usize) -> f64 {
    let mut caches: Vec<_> = prompts.iter().map(|_| model.new_cache()).collect();
    let next = |caches: &mut Vec<_>, feed: &[Vec<u32>], pos: &[usize]| -> Vec<u32> {
        let mut batch: Vec<Step<'_>> = caches
            .iter_mut()
            .zip(feed)
            .zip(pos)
            .zip(loras)
            .map(|(((cache, tokens), &pos), &lora)| Step {
                cache,
                tokens,
                pos,
                outputs: 1,
                lora,
            })
            .collect();
        model
            .forward_batch(&mut batch)
            .iter()
            .map(|l| (0..l.len()).max_by(|&a, &b| l[a].total_cmp(&l[b])).unwrap_or(0) as u32)
            .collect()
    };
    let mut pos = vec![0; prompts.len()];
    let mut feed: Vec<Vec<u32>> = next(&mut caches, prompts, &pos).into_iter().map(|t| vec![t]).collect();
    pos = prompts.iter().map(Vec::len).collect();
    let started = Instant::now();
    for _ in 0..steps {
        let out = next(&mut caches, &feed, &pos);
        pos.iter_mut().for_each(|p| *p += 1);
        feed = out.into_iter().map(|t| vec![t]).collect();
    }
    (steps * prompts.len()) as f64 / started.elapsed().as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Runs the benchmark and prints tok/s and ratios against the base model.
pub fn run(args: &BenchLoraArgs, model_path: &Path) -> anyhow::Result<()> {
    let python = switchyard_procs::nats_server::cache_dir().join("venv/bin/python");
    let dir = tempfile::tempdir()?;
    eprintln!(
        "writing 4 rank-{} test adapters for {} …",
        args.rank,
        model_path.display()
    );
    let mut file = std::fs::File::open(model_path)?;
    let content = candle_core::quantized::gguf_file::Content::read(&mut file)?;
    let model = LlamaModel::load(&content, &mut file, args.steps + 128)?;
    let adapters = (1..=4)
        .map(|seed| {
            let path = make_adapter(&python, model_path, dir.path(), seed, args.rank)?;
            LoraAdapter::load(&format!("a{seed}"), &path, &model.params, 1.0).map_err(anyhow::Error::msg)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Distinct prompts of 32 tokens (no tokenizer needed: ids from the vocabulary).
    let prompts: Vec<Vec<u32>> = (0..args.batch)
        .map(|s| (0..32).map(|i| ((s * 131 + i * 17) % 5000 + 200) as u32).collect())
        .collect();
    let configs: [(&str, Vec<Option<&LoraAdapter>>); 3] = [
        ("base model", vec![None; args.batch]),
        ("one adapter", vec![Some(&adapters[0]); args.batch]),
        (
            "four adapters",
            (0..args.batch).map(|i| Some(&adapters[i % 4])).collect(),
        ),
    ];
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads).build()?;
    let mut rates = vec![Vec::new(); configs.len()];
    pool.install(|| {
        for run in 0..=args.runs {
            for (c, (_, loras)) in configs.iter().enumerate() {
                let rate = decode(&model, &prompts, loras, args.steps);
                if run > 0 {
                    rates[c].push(rate);
                }
            }
        }
    });
    let base = median(rates[0].clone());
    println!(
        "lora decode: {} streams × {} tokens, {} threads, rank {}, median of {} runs ({})",
        args.batch,
        args.steps,
        args.threads,
        args.rank,
        args.runs,
        switchyard_workers::engine::kernels::isa::active()
    );
    println!("{:<16} {:>10} {:>8}", "", "tok/s", "ratio");
    for ((name, _), r) in configs.iter().zip(rates) {
        let m = median(r);
        println!("{name:<16} {m:>10.1} {:>7.3}×", m / base);
    }
    Ok(())
}
