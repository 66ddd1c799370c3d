//! Structured output and tool calls, tested the way users touch them: the official
//! `openai` SDK (`chat.completions.parse` with a nested pydantic model, whole and
//! streamed; a tool loop with two tools), `langchain-openai`, `litellm` and the npm
//! `openai` package against a real gateway → coordinator → worker; 200 answers at
//! temperature 1.0 per reference model validated with `jsonschema`; the same
//! schemas through a llama.cpp worker and the MLX bridge; and the NATS side
//! (constraints and tools in the contract, bad ones refused while the fleet serves).

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;
use switchyard::gateway::{self, GatewayHandle};
use switchyard::{Client, ClientError, GenerateRequest, Message};
use switchyard_config::GatewayConfig;
use switchyard_messages::{Constraint, ErrorCode, FinishReason, Tool, ToolChoice};

async fn open_gateway(client: Client) -> GatewayHandle {
    let config = GatewayConfig {
        listen: "127.0.0.1:0".into(),
        ..GatewayConfig::default()
    };
    gateway::start(client, "sy", &config).await.expect("gateway starts")
}

/// Runs a check script (Python, or `node` for `.mjs`) with `args`; its JSON output,
/// or `None` when it asks to be skipped (exit 3: its package is missing).
async fn script(name: &str, args: Vec<String>) -> Option<serde_json::Value> {
    let path = repo().join(name);
    let node = name.ends_with(".mjs");
    let out = tokio::task::spawn_blocking(move || {
        let mut cmd = if node {
            Command::new("node")
        } else {
            Command::new(python())
        };
        cmd.arg(path).args(args).output().expect("run the check script")
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(3) {
        eprintln!("skipped {name}: {stderr}");
        return None;
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{name} failed:\n{stderr}\n{stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{name}: {e}: {stdout}"));
    assert_eq!(v["failures"].as_array().map(Vec::len), Some(0), "{name}: {v:#}");
    Some(v)
}

fn args(base: &str, model: &str, rest: &[&str]) -> Vec<String> {
    [base, "sk-any", model]
        .iter()
        .chain(rest)
        .map(|s| s.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_parses_nested_models_and_runs_a_tool_loop() {
    let f = fleet(|c| c.worker.capacity = 4).await;
    let g = open_gateway(f.client().await).await;
    let base = format!("{}/v1", g.url());
    let r = script("tests/python/structured_check.py", args(&base, DEMO_NAME, &["20"]))
        .await
        .unwrap();
    eprintln!("{}", serde_json::to_string(&r["tools_required"]).unwrap());
    assert_eq!(r["parse"]["valid"], true, "{}", r["parse"]);
    assert_eq!(r["parse_stream"]["valid"], true, "{}", r["parse_stream"]);
    assert!(r["parse_stream"]["deltas"].as_u64().unwrap() >= 2);
    assert_eq!(r["json_object"]["is_dict"], true);
    let runs = &r["json_schema_runs"];
    assert_eq!(runs["valid"], runs["n"], "{runs}");
    assert!(
        runs["distinct"].as_u64().unwrap() > 1,
        "temperature 1.0 samples: {runs}"
    );
    let tools = &r["tools_required"];
    assert_eq!(tools["finish"], "tool_calls");
    assert!(tools["n_calls"].as_u64().unwrap() >= 1);
    assert_eq!(r["tools_named"]["calls"][0]["name"], "get_time");
    assert_eq!(r["tools_no_parallel"]["n_calls"], 1);
    assert_eq!(r["tools_stream"]["finish"], "tool_calls");
    for (k, v) in r["bad"].as_object().unwrap() {
        assert_eq!(v["status"], 400, "{k}: {v}");
        assert_eq!(v["names_problem"], true, "{k}: {v}");
    }
    let message = r["bad"]["bad_tool_parameters"]["message"].as_str().unwrap();
    assert!(
        message.contains("(at /properties/"),
        "a broken tool schema names the place: {message}"
    );
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn langchain_litellm_and_npm_openai_get_structured_answers_and_calls() {
    let f = fleet(|c| c.worker.capacity = 4).await;
    let g = open_gateway(f.client().await).await;
    let base = format!("{}/v1", g.url());
    let lc = script("tests/python/langchain_check.py", args(&base, DEMO_NAME, &[]))
        .await
        .unwrap();
    for m in ["structured_json_schema", "structured_function_calling"] {
        assert_eq!(lc[m]["valid"], true, "{m}: {}", lc[m]);
    }
    assert_eq!(lc["structured_json_mode"]["is_dict"], true);
    assert!(!lc["bind_tools"]["calls"].as_array().unwrap().is_empty());
    assert_eq!(lc["context_overflow"]["raised"], "OpenAIContextOverflowError");
    assert_eq!(
        lc["embeddings"]["dims"],
        serde_json::json!([576]),
        "{}",
        lc["embeddings"]
    );
    assert_eq!(lc["embeddings"]["closest"], 1, "{}", lc["embeddings"]);
    let ll = script("tests/python/litellm_check.py", args(&base, DEMO_NAME, &[]))
        .await
        .unwrap();
    assert_eq!(ll["pydantic"]["valid"], true, "{}", ll["pydantic"]);
    assert_eq!(ll["tools_required"]["finish"], "tool_calls");
    assert_eq!(ll["context_overflow"]["raised"], "ContextWindowExceededError");
    match script("tests/js/openai_check.mjs", args(&base, DEMO_NAME, &[])).await {
        Some(js) => {
            assert_eq!(js["json_schema"]["valid"], true, "{}", js["json_schema"]);
            assert_eq!(js["tools_required"]["finish"], "tool_calls");
            assert_eq!(
                js["embeddings"]["dims"],
                serde_json::json!([576, 576]),
                "{}",
                js["embeddings"]
            );
        }
        None => eprintln!("npm openai not installed (scripts/setup.sh installs it when npm exists)"),
    }
    g.shutdown().await;
}

/// 200 answers at temperature 1.0 on `model`, through the gateway; all validate.
async fn two_hundred(model: std::path::PathBuf) {
    let name = model.file_stem().unwrap().to_string_lossy().into_owned();
    let f = fleet(|c| {
        c.worker.model = model.display().to_string();
        c.worker.capacity = 4;
    })
    .await;
    let g = open_gateway(f.client().await).await;
    let base = format!("{}/v1", g.url());
    let r = script("tests/python/validity_check.py", args(&base, &name, &["200", "4"]))
        .await
        .unwrap();
    eprintln!("{name}: {r}");
    assert_eq!(r["valid"], 200, "{r}");
    assert!(r["distinct"].as_u64().unwrap() > 100, "sampled, not repeated: {r}");
    g.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sampled_answers_validate_on_smollm2() {
    two_hundred(demo_model()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_sampled_answers_validate_on_gemma3() {
    let Some(gemma) = gemma_model() else {
        eprintln!("skipped: Gemma 3 270M is not installed (SWITCHYARD_SKIP_GEMMA)");
        return;
    };
    two_hundred(gemma).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_llama_cpp_worker_and_the_mlx_bridge_enforce_the_same_schemas() {
    let nats = nats();
    let url = nats.url();
    let mut base_cfg = fleet_config(&url);
    base_cfg.worker.model_name = "smol".into();
    let coordinator = switchyard::node::start_coordinator(&base_cfg).await.unwrap();
    let mut nodes = Vec::new();
    let mut backends = Vec::new();
    let server = match llama_server_bin() {
        Some(bin) => {
            let server = switchyard_procs::llama_server::LlamaServer::start_with(&bin, &demo_model(), 1, 2, &[])
                .await
                .unwrap();
            let mut c = base_cfg.clone();
            c.worker.id = "w-llama".into();
            c.worker.backend = "llama_cpp".into();
            c.worker.llama_url = server.url.clone();
            c.validate().unwrap();
            let loaded = switchyard::node::load(&c).await.unwrap();
            nodes.push((switchyard::node::start_worker(&c, &loaded).await.unwrap(), loaded));
            backends.push(("llama_cpp", "w-llama", 30));
            Some(server)
        }
        None => None,
    };
    let mut c = base_cfg.clone();
    c.worker.id = "w-mlx".into();
    c.worker.model = converted_demo_model().display().to_string();
    c.worker.backend = "metal".into();
    c.worker.mlx_allow_cpu = true;
    c.worker.mlx_python = python().display().to_string();
    c.validate().unwrap();
    let loaded = switchyard::node::load(&c).await.expect("the MLX bridge loads");
    nodes.push((switchyard::node::start_worker(&c, &loaded).await.unwrap(), loaded));
    backends.push(("metal", "w-mlx", 5));
    let client = client(&url, Duration::from_secs(60)).await;
    let ids: Vec<&str> = backends.iter().map(|b| b.1).collect();
    wait_for_workers(&client, &ids, Duration::from_secs(20)).await;
    let g = open_gateway(client.clone()).await;
    let base = format!("{}/v1", g.url());
    for (backend, _, runs) in &backends {
        let r = script(
            "tests/python/validity_check.py",
            args(&base, "smol", &[&runs.to_string(), "2", backend]),
        )
        .await
        .unwrap();
        eprintln!("{backend}: {r}");
        assert_eq!(r["valid"], *runs, "{backend}: {r}");
    }

    // A tool call forced through each backend parses.
    for (backend, _, _) in &backends {
        let mut req = tool_request("smol");
        req.head.backend = Some(backend.to_string());
        let done = client.chat(req).await.unwrap().collect().await.unwrap();
        assert_eq!(
            done.finish_reason,
            FinishReason::ToolCalls,
            "{backend}: {:?}",
            done.text
        );
        assert_eq!(done.tool_calls[0].name, "get_weather", "{backend}");
        let args: serde_json::Value = serde_json::from_str(&done.tool_calls[0].arguments).unwrap();
        assert!(args["city"].is_string(), "{backend}: {args}");
    }

    // What llama-server cannot enforce is refused, never run unconstrained.
    if server.is_some() {
        let mut req = GenerateRequest::chat(Client::new_request_id(), "smol", vec![Message::new("user", "Phone?")]);
        req.head.backend = Some("llama_cpp".into());
        req.config.constraint = Some(Constraint::Regex {
            pattern: "[0-9]{3}-[0-9]{4}".into(),
        });
        let e = match client.chat(req.clone()).await {
            Err(e) => e,
            Ok(s) => ends_with_error(s).await,
        };
        match e {
            ClientError::Remote { error, .. } => {
                assert_eq!(error.code, ErrorCode::Unavailable, "{error:?}");
                assert!(error.message.contains("cannot enforce config.constraint"), "{error:?}");
            }
            other => panic!("{other:?}"),
        }
        // Unpinned, the coordinator moves on to a worker that enforces it.
        req.head.request_id = Client::new_request_id();
        req.head.backend = None;
        let done = client.chat(req).await.unwrap().collect().await.unwrap();
        assert_eq!(done.worker_id, "w-mlx");
        assert_eq!(done.text.len(), 8, "{:?}", done.text);
    }
    g.shutdown().await;
    for (w, mut l) in nodes {
        w.shutdown(Duration::from_secs(5)).await;
        l.stop();
    }
    drop(coordinator);
    drop(server);
}

fn tool_request(model: &str) -> GenerateRequest {
    let mut req = GenerateRequest::chat(
        Client::new_request_id(),
        model,
        vec![Message::new("user", "What is the weather in Paris?")],
    );
    req.tools = vec![
        Tool {
            name: "get_weather".into(),
            description: "Current weather in a city".into(),
            parameters: r#"{"type":"object","properties":{"city":{"type":"string","maxLength":40},"unit":{"enum":["celsius","fahrenheit"]}},"required":["city","unit"]}"#.into(),
        },
        Tool {
            name: "get_time".into(),
            description: "Current time in a timezone".into(),
            parameters: r#"{"type":"object","properties":{"timezone":{"type":"string","maxLength":40}},"required":["timezone"]}"#.into(),
        },
    ];
    req.tool_choice = ToolChoice::Function {
        name: "get_weather".into(),
    };
    req.config.max_tokens = 120;
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_nats_constraints_and_tools_are_honoured_and_bad_ones_refused() {
    let f = fleet(|_| {}).await;
    let client = f.client().await;

    // A regex on a plain generate request.
    let mut req = greedy("My phone number is", 30);
    req.config.constraint = Some(Constraint::Regex {
        pattern: "[0-9]{3}-[0-9]{4}".into(),
    });
    let done = client.generate(req).await.unwrap().collect().await.unwrap();
    let t = done.text.as_bytes();
    assert_eq!(t.len(), 8, "{:?}", done.text);
    assert!(t[3] == b'-' && t.iter().enumerate().all(|(i, c)| i == 3 || c.is_ascii_digit()));
    assert_eq!(done.finish_reason, FinishReason::Stop);

    // A Lark grammar naming the choices.
    let mut req = greedy("Is the sky blue? Answer:", 10);
    req.config.constraint = Some(Constraint::Lark {
        grammar: r#"start: " yes" | " no""#.into(),
    });
    let done = client.generate(req).await.unwrap().collect().await.unwrap();
    assert!([" yes", " no"].contains(&done.text.as_str()), "{:?}", done.text);

    // A named function: the call is in the last chunk, not among the tokens.
    let done = client.chat(tool_request("")).await.unwrap().collect().await.unwrap();
    assert_eq!(done.finish_reason, FinishReason::ToolCalls);
    assert_eq!(done.tool_calls.len(), 1);
    assert!(done.tool_calls[0].id.starts_with("call_"));
    assert!(!done.text.contains("<tool_call>"), "{:?}", done.text);
    let args: serde_json::Value = serde_json::from_str(&done.tool_calls[0].arguments).unwrap();
    assert!(
        ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
        "{args}"
    );

    // The call and its answer in the history; `none`: plain text comes back.
    let mut follow = tool_request("");
    let mut call = Message::new("assistant", "");
    call.tool_calls = done.tool_calls.clone();
    let mut answer = Message::new("tool", "18 degrees and sunny");
    answer.tool_call_id = Some(done.tool_calls[0].id.clone());
    follow.messages.as_mut().unwrap().extend([call, answer]);
    follow.tool_choice = ToolChoice::None;
    follow.config.max_tokens = 24;
    let text = client.chat(follow).await.unwrap().collect().await.unwrap();
    assert!(text.tool_calls.is_empty());
    assert!(matches!(text.finish_reason, FinishReason::Stop | FinishReason::Length));
    assert!(!text.text.trim().is_empty());

    // Refused with bad_request, each naming the problem.
    let refused = |req: GenerateRequest, chat: bool, needle: &'static str| {
        let client = client.clone();
        async move {
            let stream = if chat {
                client.chat(req).await
            } else {
                client.generate(req).await
            };
            let e = match stream {
                Err(e) => e,
                Ok(s) => ends_with_error(s).await,
            };
            match e {
                ClientError::Remote { error, .. } => {
                    assert_eq!(error.code, ErrorCode::BadRequest, "{error:?}");
                    assert!(error.message.contains(needle), "{needle}: {error:?}");
                }
                other => panic!("{needle}: {other:?}"),
            }
        }
    };
    let mut bad = greedy("x", 8);
    bad.config.constraint = Some(Constraint::JsonSchema {
        schema: r#"{"type":"object","properties":{"a":{"type":"strng"}}}"#.into(),
    });
    refused(bad, false, "(at /properties/a)").await;
    let mut bad = greedy("x", 8);
    bad.config.constraint = Some(Constraint::Lark {
        grammar: "start: nowhere".into(),
    });
    refused(bad, false, "config.constraint (lark)").await;
    let mut bad = tool_request("");
    bad.tool_choice = ToolChoice::Function { name: "nope".into() };
    refused(bad, true, "\"nope\"").await;
    let mut bad = tool_request("");
    bad.tools[1].parameters = "{\"type\": ".into();
    refused(bad, true, "tools[1].parameters (get_time)").await;
    assert_serves(&client, "after the refusals").await;
}
