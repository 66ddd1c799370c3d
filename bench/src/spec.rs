//! `switchyard bench spec`: speculative decoding by prompt lookup (or, with
//! `--draft-model`, a draft model) on tasks whose answers repeat their input (rewrite a paragraph, extract fields, edit code). The
//! CPU engine (in this process, one KV slot) with `speculative = "off"` and
//! `"lookup"`, and llama-server on the same GGUF plain and with its own n-gram
//! speculation (`--spec-type ngram-simple`), alternating runs, greedy: decode tok/s,
//! the speed-up of each side, acceptance rates, and whether our two answers are the
//! same text (they must be: speculation is lossless).

use super::median;
use clap::Args;
use futures::StreamExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_messages::{GenerateConfig, LoadConfig, Message};
use switchyard_procs::llama_server::LlamaServer;

/// `switchyard bench spec`.
#[derive(Args, Debug)]
pub struct BenchSpecArgs {
    /// GGUF models, one `--model` each (default: the demo model and Gemma 3 270M when
    /// installed).
    #[arg(long)]
    pub model: Vec<PathBuf>,
    /// The peer's llama-server binary (default: $SWITCHYARD_LLAMA_SERVER, else what
    /// scripts/build-llama-server.sh built).
    #[arg(long)]
    pub llama_server: Option<PathBuf>,
    /// Compute threads, both sides.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// Measured runs per task and side (after one warm-up).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 256)]
    pub max_tokens: u32,
    /// The most tokens one step drafts (`worker.draft_max`); llama-server's
    /// `--spec-ngram-simple-size-m` too.
    #[arg(long, default_value_t = 8)]
    pub draft_max: u32,
    /// Speculate with this draft model (a GGUF with the same vocabulary as every
    /// --model) instead of prompt lookup, on both sides (`speculative = "draft"`;
    /// llama-server `--model-draft`, `--spec-draft-n-max` = --draft-max).
    #[arg(long)]
    pub draft_model: Option<PathBuf>,
}

/// Input-grounded tasks: most of each answer is in its prompt.
const TASKS: [(&str, &str); 3] = [
    (
        "rewrite",
        "Rewrite the following paragraph, correcting its spelling mistakes and changing nothing else.\n\n\
         The old lighthouse stood at the edge of the cliff for more then two hundred years. Every night \
         its keeper climbed the narow stairs, lit the great lamp and watched the ships pass safely \
         through the rocks below. When the keeper grew old, his daugther took over the work, and she \
         kept the light burning through storms, fog and the long winter nights, untill the day the \
         harbour closed.",
    ),
    (
        "extract",
        "From the record below, list every field as `key: value`, one per line, in the same order.\n\n\
         name: Maria Gonzalez; employee id: 48213; department: Logistics; office: Building C, room 214; \
         phone: +34 912 555 018; email: maria.gonzalez@example.com; manager: Peter Holm; start date: \
         2019-04-01; contract: permanent; location: Madrid, Spain",
    ),
    (
        "code",
        "Rename the variable `total` to `running_sum` in this function and return the whole function.\n\n\
         ```python\ndef average(values):\n    total = 0\n    count = 0\n    for v in values:\n        \
         total += v\n        count += 1\n    if count == 0:\n        return 0.0\n    return total / count\n```",
    ),
];

/// One answer: decode tok/s, tokens, and (ours) drafted / accepted tokens.
struct Sample {
    tps: f64,
    generated: u64,
    drafted: u64,
    accepted: u64,
    text: String,
}

async fn ours(m: &Arc<dyn TextModel>, task: &str, max_tokens: u32) -> anyhow::Result<Sample> {
    let config = GenerateConfig {
        max_tokens,
        ..GenerateConfig::default()
    };
    let prompt = Prompt::chat(vec![Message::new("user", task.to_string())]);
    let mut events = m.generate(prompt, config, CancelFlag::new());
    let mut text = String::new();
    while let Some(ev) = events.next().await {
        match ev? {
            GenerateEvent::Token(t) => text.push_str(&t.text),
            GenerateEvent::Done { metrics: m, .. } => {
                return Ok(Sample {
                    tps: m.decode_tokens_per_sec,
                    generated: m.generated_tokens.into(),
                    drafted: m.draft_tokens.into(),
                    accepted: m.accepted_tokens.into(),
                    text,
                })
            }
        }
    }
    anyhow::bail!("the stream ended without a result")
}

async fn theirs(server: &LlamaServer, task: &str, max_tokens: u32) -> anyhow::Result<Sample> {
    let body = serde_json::json!({
        "messages": [{"role": "user", "content": task}],
        "max_tokens": max_tokens, "temperature": 0.0,
    });
    let v = server.post("/v1/chat/completions", body).await?;
    let t = &v["timings"];
    let n = |k: &str| t[k].as_u64().unwrap_or(0);
    Ok(Sample {
        tps: t["predicted_per_second"].as_f64().unwrap_or(0.0),
        generated: n("predicted_n"),
        drafted: n("draft_n"),
        accepted: n("draft_n_accepted"),
        text: v["choices"][0]["message"]["content"].as_str().unwrap_or("").to_string(),
    })
}

/// Runs the comparison and prints a table per model.
pub async fn run(args: &BenchSpecArgs, server_bin: &Path) -> anyhow::Result<()> {
    let models = match args.model.is_empty() {
        true => super::structured::default_models(),
        false => args.model.clone(),
    };
    for model in &models {
        measure(model, server_bin, args).await?;
    }
    println!(
        "(decode tok/s, medians of {} alternating greedy runs per task after a warm-up; x = with / without \
         speculation; acceptance = accepted / drafted tokens; vs llama = ours / llama.cpp's, both speculating)",
        args.runs
    );
    Ok(())
}

async fn measure(model: &Path, server_bin: &Path, args: &BenchSpecArgs) -> anyhow::Result<()> {
    let draft = args.draft_model.as_ref().map(|p| p.display().to_string());
    let load = |speculative: &str| LoadConfig {
        threads: args.threads as u32,
        parallel_slots: 1,
        context_len: switchyard_procs::llama_server::CONTEXT,
        speculative: speculative.into(),
        draft_model: if speculative == "draft" {
            draft.clone().unwrap_or_default()
        } else {
            String::new()
        },
        draft_max: args.draft_max,
        ..LoadConfig::default()
    };
    let mode = if draft.is_some() { "draft" } else { "lookup" };
    eprintln!(
        "loading {} in switchyard's cpu engine, speculative off and {mode} …",
        model.display()
    );
    let plain = super::engine_model(model, &load("off"))?;
    let lookup = super::engine_model(model, &load(mode))?;
    let m = args.draft_max.to_string();
    let spec_args: Vec<&str> = match &draft {
        // The same n-gram and draft length as ours.
        None => vec![
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "3",
            "--spec-ngram-simple-size-m",
            &m,
        ],
        // (A plain draft GGUF needs its type named: llama.cpp infers only MTP heads.)
        Some(d) => vec![
            "--spec-type",
            "draft-simple",
            "--model-draft",
            d,
            "--spec-draft-n-max",
            &m,
        ],
    };
    let (ours_label, theirs_label) = if draft.is_some() {
        ("draft", "draft")
    } else {
        ("lookup", "ngram")
    };
    let their_plain = LlamaServer::start_with(server_bin, model, args.threads, 1, &[]).await?;
    let their_spec = LlamaServer::start_with(server_bin, model, args.threads, 1, &spec_args).await?;
    let settle = || tokio::time::sleep(std::time::Duration::from_millis(300));
    let name = model
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    println!(
        "{name}: {:<8} {:>9} {:>9} {:>6} {:>8} {:>9} {:>9} {:>6} {:>8} {:>9} {:>7}",
        "task", "ours off", ours_label, "x", "accept", "llama off", theirs_label, "x", "accept", "vs llama", "tokens"
    );
    for (task, prompt) in TASKS {
        let max = args.max_tokens;
        // Warm-up, and the check that lookup changes no token.
        let (a, b) = (ours(&plain, prompt, max).await?, ours(&lookup, prompt, max).await?);
        anyhow::ensure!(
            a.text == b.text,
            "{task}: speculation changed the answer:\n--- off ---\n{}\n--- {mode} ---\n{}",
            a.text,
            b.text
        );
        theirs(&their_plain, prompt, max).await?;
        theirs(&their_spec, prompt, max).await?;
        let mut s: [Vec<Sample>; 4] = Default::default();
        for run in 0..args.runs {
            // Alternating which side goes first.
            for k in 0..4 {
                let k = if run % 2 == 0 { k } else { 3 - k };
                settle().await;
                s[k].push(match k {
                    0 => ours(&plain, prompt, max).await?,
                    1 => ours(&lookup, prompt, max).await?,
                    2 => theirs(&their_plain, prompt, max).await?,
                    _ => theirs(&their_spec, prompt, max).await?,
                });
            }
        }
        let tps = |v: &[Sample]| median(&v.iter().map(|x| x.tps).collect::<Vec<_>>());
        let accept = |v: &[Sample]| {
            let (d, a) = v.iter().fold((0, 0), |(d, a), x| (d + x.drafted, a + x.accepted));
            if d == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", a as f64 / d as f64)
            }
        };
        let t: Vec<f64> = s.iter().map(|v| tps(v)).collect();
        println!(
            "{:width$}  {task:<8} {:>9.1} {:>9.1} {:>5.2}x {:>8} {:>9.1} {:>9.1} {:>5.2}x {:>8} {:>8.2}x {:>3}/{:<3}",
            "",
            t[0],
            t[1],
            t[1] / t[0].max(1e-9),
            accept(&s[1]),
            t[2],
            t[3],
            t[3] / t[2].max(1e-9),
            accept(&s[3]),
            t[1] / t[3].max(1e-9),
            s[1][0].generated,
            s[3][0].generated,
            width = name.len() - 1,
        );
    }
    Ok(())
}
