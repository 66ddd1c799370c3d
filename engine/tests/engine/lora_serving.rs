//! LoRA adapters through the engine's serving path (`EngineModel`): requests name an
//! adapter in their config, one continuous batch holds base and adapter requests,
//! KV is reused only within an adapter, and adapters load and unload at run time.

use futures::StreamExt;
use switchyard_backend::{BackendError, CancelFlag, GenerateEvent, Prompt, TextModel};
use switchyard_engine::EngineModel;
use switchyard_messages::{GenerateConfig, LoadConfig};
use switchyard_testkit::*;

/// Greedy tokens and `cached_tokens` of one generation with `adapter`.
async fn run(model: &EngineModel, prompt: &str, adapter: Option<&str>) -> Result<(Vec<u32>, u32), BackendError> {
    let cfg = GenerateConfig {
        max_tokens: 16,
        adapter: adapter.map(str::to_string),
        ..GenerateConfig::default()
    };
    let mut events = model.generate(Prompt::Text(prompt.into()), cfg, CancelFlag::new());
    let (mut ids, mut cached) = (Vec::new(), 0);
    while let Some(ev) = events.next().await {
        match ev? {
            GenerateEvent::Token(t) => ids.push(t.id),
            GenerateEvent::Done { metrics, .. } => cached = metrics.cached_tokens,
        }
    }
    Ok((ids, cached))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_different_adapters_share_a_batch_and_never_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two) = (make_lora(dir.path(), 1), make_lora(dir.path(), 2));
    let config = LoadConfig {
        parallel_slots: 4,
        ..LoadConfig::default()
    };
    let model = EngineModel::load(&demo_model(), &config).unwrap();
    model
        .load_adapter("one".into(), one.display().to_string(), 1.0)
        .await
        .unwrap();
    let two_gguf = two.join("adapter.gguf").display().to_string();
    let served = model.load_adapter("two".into(), two_gguf.clone(), 1.0).await.unwrap();
    assert_eq!((served.name.as_str(), served.path.as_str()), ("two", two_gguf.as_str()));
    let names: Vec<String> = model.adapters().into_iter().map(|a| a.name).collect();
    assert_eq!(names, ["one", "two"]);

    // Alone, one after another: a prompt each adapter shares with the base model.
    let prompt = "The capital of France is Paris. The capital of Italy is";
    let (base, base_cached) = run(&model, prompt, None).await.unwrap();
    let (a1, a1_cached) = run(&model, prompt, Some("one")).await.unwrap();
    let (a2, a2_cached) = run(&model, prompt, Some("two")).await.unwrap();
    assert_eq!(base_cached, 0);
    assert_eq!(
        (a1_cached, a2_cached),
        (0, 0),
        "the base model's (and the other adapter's) KV is not an adapter's"
    );
    assert_ne!(a1, base, "adapter one changes the output");
    assert_ne!(a2, base, "adapter two changes the output");
    assert_ne!(a1, a2);
    // The same adapter again reuses its own prefix.
    let (again, cached) = run(&model, prompt, Some("one")).await.unwrap();
    assert_eq!(again, a1);
    assert!(cached > 0, "a repeat with the same adapter reuses its KV");

    // Together: one batch of base, one, two and base again gives each what it got alone.
    let stats = model.batch_stats();
    let steps_before = stats.steps.load(std::sync::atomic::Ordering::Relaxed);
    let rows_before = stats.rows.load(std::sync::atomic::Ordering::Relaxed);
    let other = "Once upon a time, in a small village,";
    let (other_base, _) = run(&model, other, None).await.unwrap();
    let together = tokio::join!(
        run(&model, prompt, None),
        run(&model, prompt, Some("one")),
        run(&model, prompt, Some("two")),
        run(&model, other, None),
    );
    let got = [
        together.0.unwrap().0,
        together.1.unwrap().0,
        together.2.unwrap().0,
        together.3.unwrap().0,
    ];
    assert_eq!(got, [base.clone(), a1.clone(), a2.clone(), other_base]);
    let steps = stats.steps.load(std::sync::atomic::Ordering::Relaxed) - steps_before;
    let rows = stats.rows.load(std::sync::atomic::Ordering::Relaxed) - rows_before;
    assert!(
        rows > steps,
        "the requests decoded in shared steps ({rows} rows in {steps} steps)"
    );

    // The holdings say which adapter computed what.
    let held = model.kv_holdings().unwrap();
    assert!(held.iter().any(|h| h.adapter.as_deref() == Some("one")));
    assert!(held.iter().any(|h| h.adapter.is_none()));

    // Unloaded: refused, by name; the rest keep serving.
    model.unload_adapter("one".into()).await.unwrap();
    let e = run(&model, prompt, Some("one")).await.unwrap_err();
    assert!(e.to_string().contains("\"one\""), "{e}");
    assert_eq!(run(&model, prompt, Some("two")).await.unwrap().0, a2);
    assert!(model.unload_adapter("one".into()).await.is_err());

    // Bad adapters: errors naming the adapter and what is wrong; nothing else changes.
    let missing = model
        .load_adapter("gone".into(), dir.path().join("nope").display().to_string(), 1.0)
        .await
        .unwrap_err();
    assert!(
        missing.to_string().contains("\"gone\"") && missing.to_string().contains("no such file"),
        "{missing}"
    );
    let bad_name = model.load_adapter("a:b".into(), two_gguf, 1.0).await.unwrap_err();
    assert!(bad_name.to_string().contains("a:b"), "{bad_name}");
    let names: Vec<String> = model.adapters().into_iter().map(|a| a.name).collect();
    assert_eq!(names, ["two"]);
    assert_eq!(run(&model, prompt, None).await.unwrap().0, base);
}
