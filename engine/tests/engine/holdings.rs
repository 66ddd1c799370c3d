//! What the engine says its KV slots hold ([`TextModel::kv_holdings`], in routing-key
//! terms) predicts each next request's `cached_tokens` exactly: raw prompts sharing a
//! document, numbered questions, a prompt continuing an answer, chats continuing a reply, and on Gemma 3
//! prompts whose head left the sliding-window ring.

use futures::StreamExt;
use switchyard_backend::{CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_engine::EngineModel;
use switchyard_messages::kv::{predict_reuse, prediction_key};
use switchyard_messages::{GenerateConfig, LoadConfig, Message};
use switchyard_testkit::*;

/// The prediction from what `model` holds now, the `cached_tokens` it then reports,
/// and the generated text.
async fn predicted_and_reused(model: &EngineModel, prompt: Prompt, max_tokens: u32) -> (u32, u32, String) {
    let key = match &prompt {
        Prompt::Text(t) => prediction_key(Some(t), None),
        Prompt::Chat { messages, .. } => prediction_key(None, Some(messages)),
        _ => unreachable!(),
    };
    let held = model.kv_holdings().expect("the engine announces its holdings");
    let predicted = predict_reuse(&held, None, &key);
    let cfg = GenerateConfig {
        max_tokens,
        ..GenerateConfig::default()
    };
    let mut events = model.generate(prompt, cfg, CancelFlag::new());
    let (mut text, mut cached) = (String::new(), u32::MAX);
    while let Some(ev) = events.next().await {
        match ev.unwrap() {
            GenerateEvent::Token(t) => text.push_str(&t.text),
            GenerateEvent::Done { metrics, .. } => cached = metrics.cached_tokens,
        }
    }
    (predicted, cached, text)
}

fn document(entries: usize) -> String {
    (0..entries)
        .map(|i| {
            format!(
                "Entry {i}: the committee met to review the harbour accounts and the state of the {} bridge. ",
                ["north", "south", "east", "west"][i % 4]
            )
        })
        .collect()
}

fn load(path: &std::path::Path, slots: u32) -> EngineModel {
    let config = LoadConfig {
        parallel_slots: slots,
        context_len: 4096,
        ..LoadConfig::default()
    };
    EngineModel::load(path, &config).unwrap()
}

/// Runs `prompts` one after another, each checked against its prediction; `{answer}`
/// in a prompt is replaced by the previous prompt and its answer.
async fn check(model: &EngineModel, prompts: Vec<Prompt>) {
    let mut before: Option<(Prompt, String)> = None;
    let mut reused_any = false;
    for (i, mut prompt) in prompts.into_iter().enumerate() {
        if let (Prompt::Text(t), Some((Prompt::Text(p), a))) = (&mut prompt, &before) {
            *t = t.replace("{answer}", &format!("{p}{a}"));
        }
        if let (Prompt::Chat { messages, .. }, Some((Prompt::Chat { messages: m, .. }, a))) = (&mut prompt, &before) {
            if messages.last().is_some_and(|l| l.content == "{answer}") {
                *messages = m.clone();
                messages.push(Message::new("assistant", a));
                messages.push(Message::new("user", "And then?"));
            }
        }
        let (predicted, reused, text) = predicted_and_reused(model, prompt.clone(), 6).await;
        assert_eq!(predicted, reused, "request {i}: predicted vs cached_tokens");
        reused_any |= reused > 0;
        before = Some((prompt, text));
    }
    assert!(
        reused_any,
        "some request reused a prefix (else the check proves little)"
    );
}

fn text(s: impl Into<String>) -> Prompt {
    Prompt::Text(s.into())
}

fn chat(turns: &[(&str, &str)]) -> Prompt {
    Prompt::chat(turns.iter().map(|(r, c)| Message::new(*r, *c)).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holdings_predict_cached_tokens_on_the_demo_model() {
    let model = load(&demo_model(), 2);
    let doc = document(6);
    check(
        &model,
        vec![
            text(format!("{doc}Question 1: what did they decide?\nAnswer:")),
            text(format!("{doc}Question 2: why?\nAnswer:")),
            text(format!("{doc}Question 2: why?\nAnswer:")),
            text("{answer} And after that,"),
            text(format!("{doc}Questions")),
            text(format!("Preface. {doc}")),
            text(format!("{doc}Question 1: what did they decide?\nAnswer:")),
            text(format!("{doc}Question 1.0: what did they decide?\nAnswer:")),
            text(format!("{doc}Question 10.2: what did they decide?\nAnswer:")),
            text(format!("{doc}Question 10.25: why?\nAnswer:")),
        ],
    )
    .await;
    let system = ("system", "You answer in one short sentence about the harbour records.");
    check(
        &model,
        vec![
            chat(&[system, ("user", &format!("{doc}What did they decide?"))]),
            chat(&[system, ("user", "{answer}")]),
            chat(&[system, ("user", &format!("{doc}What did they decide?"))]),
            chat(&[system, ("user", &format!("{doc}Who was there?"))]),
            chat(&[("system", "Something else entirely."), ("user", "Hello")]),
        ],
    )
    .await;
}

/// Gemma 3's local layers keep a 512-token ring: a prompt sharing only the head of a
/// long sequence reuses nothing, and the prediction says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holdings_predict_what_the_sliding_window_ring_lost() {
    let Some(path) = gemma_model() else { return };
    let model = load(&path, 2);
    let long = document(40);
    let short = document(2);
    check(
        &model,
        vec![
            text(format!("{long}Question: what did they decide?\nAnswer:")),
            text(format!("{long}Question: who was there?\nAnswer:")),
            text(format!("{}Question: and the bridge?\nAnswer:", &long[..200])),
            text(format!("{short}Question: what did they decide?\nAnswer:")),
            text(format!("{short}Question: who?\nAnswer:")),
            text("{answer} Then"),
            chat(&[("user", &format!("{long}What did they decide?"))]),
            chat(&[("user", "{answer}")]),
        ],
    )
    .await;
}
