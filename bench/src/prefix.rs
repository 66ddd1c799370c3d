//! `switchyard bench prefix`: time to first token with a warm prefix against a cold
//! one, through NATS + coordinator + worker. Each run uses a new ~1,500-token document
//! (its first line is unique, so nothing of it is resident) and asks two short
//! questions about it: the first request pays the whole prefill (cold), the second
//! reuses the document's keys and values and computes only its question (warm).

use super::{median, LocalNode, BENCH_PROMPT};
use std::time::{Duration, Instant};
use switchyard_client::{Client, StreamEvent};
use switchyard_config::Config;
use switchyard_messages::{GenerateMetrics, GenerateRequest};

/// The shared document of run `i`: a unique title, then ~1,500 tokens of text.
pub fn document(i: usize, paragraphs: usize) -> String {
    let mut doc = format!("Report number {i} of the city archive.\n\n");
    for p in 0..paragraphs {
        doc.push_str(&format!("Part {}. {BENCH_PROMPT}\n\n", p + 1));
    }
    doc
}

/// Sends `prompt` and returns (time to first token, metrics).
async fn ttft(
    client: &Client,
    name: &str,
    prompt: String,
    max_tokens: u32,
) -> anyhow::Result<(Duration, GenerateMetrics)> {
    let mut req = GenerateRequest::generate(Client::new_request_id(), name, prompt);
    req.config.max_tokens = max_tokens;
    let start = Instant::now();
    let mut stream = client.generate(req).await?;
    let mut first = None;
    while let Some(ev) = stream.next().await {
        match ev? {
            StreamEvent::Tokens(t) if !t.is_empty() => {
                first.get_or_insert_with(|| start.elapsed());
            }
            StreamEvent::Tokens(_) => {}
            StreamEvent::Done { metrics, .. } => return Ok((first.unwrap_or_else(|| start.elapsed()), metrics)),
        }
    }
    anyhow::bail!("the stream ended without a final event")
}

/// Runs the comparison and prints medians and the ratio.
pub async fn prefix(config: Config, runs: usize, paragraphs: usize) -> anyhow::Result<()> {
    let local = LocalNode::start(config).await?;
    let (name, client) = (local.loaded.name.clone(), local.client.clone());
    let questions = [
        "\nQuestion: What did the farmers grow?\nAnswer:",
        "\nQuestion: What transformed the city in the nineteenth century?\nAnswer:",
    ];
    eprintln!("warming up …");
    ttft(
        &client,
        &name,
        format!("{}{}", document(0, paragraphs), questions[0]),
        4,
    )
    .await?;
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    let (mut prompt_tokens, mut reused) = (0, 0);
    for i in 1..=runs {
        eprintln!("run {i}/{runs}");
        let doc = document(i, paragraphs);
        let (c, cm) = ttft(&client, &name, format!("{doc}{}", questions[0]), 4).await?;
        let (w, wm) = ttft(&client, &name, format!("{doc}{}", questions[1]), 4).await?;
        if cm.cached_tokens > 20 {
            eprintln!("note: the cold request reused {} tokens", cm.cached_tokens);
        }
        cold.push(c.as_secs_f64() * 1e3);
        warm.push(w.as_secs_f64() * 1e3);
        prompt_tokens = wm.prompt_tokens;
        reused = wm.cached_tokens;
    }
    let (c, w) = (median(&cold), median(&warm));
    println!(
        "prefix reuse: {name}, {prompt_tokens}-token prompt of which {reused} reused when warm, {runs} runs (medians, via NATS)"
    );
    println!("{:<30} {:>10} {:>10} {:>10}", "", "cold", "warm", "cold/warm");
    println!("{:<30} {c:>10.1} {w:>10.1} {:>10.1}", "time to first token ms", c / w);
    local.stop().await;
    Ok(())
}
