//! The `switchyard` command line, run as a user would.

mod common;

use common::*;
use std::process::Command;
use std::time::Duration;

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn up_starts_a_node_and_answers_a_prompt() {
    demo_model();
    let p = switchyard(
        "up",
        &["up", "--prompt", "What is water made of?", "--exit-after-prompt"],
    );
    p.wait_for("ready: nats=", Duration::from_secs(60));
    p.wait_for("answer ", Duration::from_secs(120));
}

#[test]
fn up_secure_serves_over_tls_with_generated_users_and_refuses_strangers() {
    demo_model();
    let mut cmd_env: Vec<(&str, &str)> = Vec::new();
    let mut p = switchyard_with_env("up-secure", &["up", "--secure", "--threads", "1"], &cmd_env);
    let started = p.wait_for("started nats-server", Duration::from_secs(60));
    assert!(started.contains("with TLS and generated users"), "{started}");
    let url = started
        .split(" at ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    let try_line = p.wait_for("try:", Duration::from_secs(60));
    let file = try_line
        .split("--config ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "client.toml must be private ({mode:o})");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!started.contains(text.split("password = \"").nth(1).unwrap().split('"').next().unwrap()));

    // A client with the written config is served (TLS, its user, its inbox prefix).
    let (code, out, err) = run(
        &[
            "--config",
            &file,
            "generate",
            "The capital of France is",
            "--max-tokens",
            "4",
        ],
        &cmd_env,
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.trim().is_empty());
    // Without credentials, or with TLS but no user, the server refuses: exit non-zero,
    // named setting, no hang.
    let (code, _, err) = run(&["--nats", &url, "status"], &cmd_env);
    assert_ne!(code, 0);
    assert!(err.contains("nats."), "{err}");
    let ca = std::path::Path::new(&file).with_file_name("ca.pem");
    cmd_env.push(("SWITCHYARD_NATS_TLS_CA_FILE", ca.to_str().unwrap()));
    let (code, _, err) = run(&["--nats", &url, "status"], &cmd_env);
    assert_ne!(code, 0);
    assert!(err.contains("credentials") || err.contains("nats.user"), "{err}");

    // Stopping `up` removes the keys and passwords.
    assert!(p.terminate(Duration::from_secs(20)).is_some_and(|s| s.success()));
    assert!(!std::path::Path::new(&file).exists(), "{file} outlived up");
}

#[test]
fn bad_configuration_names_the_field_and_source() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sy.toml");
    std::fs::write(&file, "[worker]\ncapacity = \"lots\"\n").unwrap();
    let (code, _, err) = run(&["--config", file.to_str().unwrap(), "status"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("capacity") && err.contains("sy.toml"), "{err}");

    let (code, _, err) = run(&["status"], &[("SWITCHYARD_COORDINATOR_MAX_ATTEMPTS", "x")]);
    assert_ne!(code, 0);
    assert!(err.contains("SWITCHYARD_COORDINATOR_MAX_ATTEMPTS"), "{err}");

    let (code, _, err) = run(&["up", "--heartbeat-ms", "10"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("worker.heartbeat_ms"), "{err}");

    let (code, _, err) = run(&["up", "--backend", "llama_cpp"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("worker.llama_url"), "{err}");

    let (code, _, err) = run(&["worker"], &[]);
    assert_ne!(code, 0);
    assert!(err.contains("--nats"), "a worker needs a NATS URL: {err}");
}

#[test]
fn every_flag_is_documented_in_help() {
    for cmd in [
        "up",
        "coordinator",
        "worker",
        "gateway",
        "generate",
        "chat",
        "status",
        "models",
        "bench fabric",
        "bench llama",
        "bench llama-cpp",
        "bench prefix",
        "bench kv-routing",
        "bench batch",
        "bench gateway",
        "bench chaos",
        "bench mlx",
    ] {
        let mut args: Vec<&str> = cmd.split(' ').collect();
        args.push("--help");
        let (code, out, _) = run(&args, &[]);
        assert_eq!(code, 0);
        // Long help puts each flag's description on the lines below it; a flag
        // followed directly by another flag (or nothing) has no description.
        let lines: Vec<&str> = out.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim_start();
            if !(t.starts_with("--") || (t.starts_with('-') && t.get(2..4) == Some(", "))) {
                continue;
            }
            let next = lines.get(i + 1).map(|l| l.trim_start()).unwrap_or("");
            let same_line = t.split("  ").filter(|part| !part.trim().is_empty()).count() >= 2;
            let described = same_line || (!next.is_empty() && !next.starts_with('-'));
            assert!(described, "{cmd}: undocumented flag {t:?}");
        }
    }
}

#[test]
fn models_dir_discovers_the_demo_gguf() {
    let model = demo_model();
    let dir = model.parent().unwrap().to_str().unwrap().to_string();
    let (code, out, err) = run(&["models", "--dir", &dir, "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    let found: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entry = found
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"].as_str().unwrap().ends_with(".gguf"))
        .unwrap();
    assert_eq!(entry["model_type"], "llama");
    assert_eq!(entry["quant_bits"], 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generate_status_and_models_commands_talk_to_a_fleet() {
    let fleet = fleet(|_| {}).await;
    let url = fleet.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        let g = run(
            &[
                "--nats",
                &url,
                "generate",
                "The capital of France is",
                "--max-tokens",
                "6",
                "--json",
            ],
            &[],
        );
        let s = run(&["--nats", &url, "status"], &[]);
        let m = run(&["--nats", &url, "models"], &[]);
        let e = run(&["--nats", &url, "generate", "hi", "--model", "nope"], &[]);
        (g, s, m, e)
    })
    .await
    .unwrap();
    let (g, s, m, e) = out;
    assert_eq!(g.0, 0, "{}", g.2);
    let v: serde_json::Value = serde_json::from_str(g.1.trim()).unwrap();
    assert!(v["text"].as_str().unwrap().contains("Paris"));
    assert_eq!(v["finish_reason"], "length");
    assert!(
        s.1.contains("w1") && s.1.contains("cpu") && s.1.contains(DEMO_NAME),
        "{}",
        s.1
    );
    assert!(m.1.contains(DEMO_NAME), "{}", m.1);
    assert_eq!(e.0, 2);
    assert!(e.2.contains("unknown_model"), "{}", e.2);

    // The fleet view carries KV state and recent latency; --watch refreshes.
    let url = fleet.url.clone();
    let (json, watched) = tokio::task::spawn_blocking(move || {
        let json = run(&["--nats", &url, "status", "--json"], &[]);
        let mut watch = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["--nats", &url, "status", "--json", "--watch", "200"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let _ = watch.kill();
        let out = watch.wait_with_output().unwrap();
        (json, String::from_utf8_lossy(&out.stdout).into_owned())
    })
    .await
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(&json.1).unwrap();
    let w = &v["workers"][0]["status"];
    assert_eq!(w["kv"]["slots"], 4, "{w}");
    assert!(w["kv"]["resident_tokens"].as_u64().unwrap() > 0, "{w}");
    assert!(w["kv"]["store_budget_bytes"].as_u64().unwrap() > 0, "{w}");
    assert!(w["recent"]["requests"].as_u64().unwrap() >= 1, "{w}");
    assert!(w["recent"]["ttft_ms"].as_f64().unwrap() > 0.0, "{w}");
    assert!(w["recent"]["tpot_ms"].as_f64().unwrap() > 0.0, "{w}");
    let frames: Vec<&str> = watched.lines().collect();
    assert!(frames.len() >= 3, "{watched}");
    for f in frames {
        let v: serde_json::Value = serde_json::from_str(f).unwrap();
        assert_eq!(v["workers"][0]["status"]["worker_id"], "w1");
    }
}

#[test]
fn a_misconfigured_otlp_exporter_is_an_error_at_start() {
    let (code, _, err) = run(&["status"], &[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")]);
    assert_eq!(code, 1);
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && err.contains("invalid"),
        "{err}"
    );
    let (code, _, err) = run(
        &["status"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ],
    );
    assert_eq!(code, 1);
    assert!(err.contains("gRPC only"), "{err}");
    // The config file's [telemetry] section counts too.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sy.toml");
    std::fs::write(&file, "[telemetry]\notlp_endpoint = \"not a url\"\n").unwrap();
    let (code, _, err) = run(&["--config", file.to_str().unwrap(), "status"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("invalid endpoint"), "{err}");
}

/// Waits up to `limit` for `p` to exit: its status, or `None` (it hung).
fn exit_of(p: &mut Proc, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if let Ok(Some(status)) = p.child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn signal(p: &Proc, sig: i32) {
    // SAFETY: plain kill(2) on our own child's pid.
    unsafe {
        libc::kill(p.child.id() as i32, sig);
    }
}

/// A service manager stops services with SIGTERM, often just when the network or the
/// NATS server is down: each process still stops, cleanly and within its bound.
#[test]
fn every_process_stops_on_sigterm_when_its_nats_server_is_gone() {
    let nats = nats();
    let url = nats.url();
    let mut coordinator = coordinator_proc(&url, "coordinator");
    let mut worker = worker_proc(&url, "w-stop");
    let mut gateway = switchyard("gateway", &["--nats", &url, "gateway", "--listen", "127.0.0.1:0"]);
    gateway.wait_for("gateway listening", Duration::from_secs(20));
    drop(nats);
    std::thread::sleep(Duration::from_secs(1));
    for p in [&mut coordinator, &mut worker, &mut gateway] {
        signal(p, libc::SIGTERM);
    }
    // Hang detectors, not timings: each bound is far above what a stop takes.
    for p in [&mut coordinator, &mut worker, &mut gateway] {
        let status = exit_of(p, Duration::from_secs(60));
        let name = p.name.clone();
        assert!(
            status.is_some(),
            "{name} still running 60 s after SIGTERM with its NATS server gone"
        );
        assert!(status.unwrap().success(), "{name}: {status:?}");
    }
}

/// Two `up` nodes, one that answered a prompt and one started without, stopped as
/// `timeout` or a terminal stops them: SIGTERM to each whole process group, so their
/// own nats-servers get it too and go first.
#[test]
fn two_up_nodes_stop_when_their_process_groups_are_signalled() {
    use std::os::unix::process::CommandExt;
    demo_model();
    let mut nodes: Vec<Proc> = (0..2)
        .map(|i| {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
            cmd.arg("up");
            if i == 0 {
                cmd.args(["--prompt", "What is water made of?"]);
            }
            cmd.env("RUST_LOG", "switchyard=info,warn").process_group(0);
            spawn_logged(&format!("up-{i}"), cmd)
        })
        .collect();
    nodes[0].wait_for("answer ", Duration::from_secs(120));
    nodes[1].wait_for("ready: nats=", Duration::from_secs(120));
    for p in &nodes {
        // SAFETY: killpg(2) on the group our own child leads.
        unsafe {
            libc::killpg(p.child.id() as i32, libc::SIGTERM);
        }
    }
    for p in &mut nodes {
        let status = exit_of(p, Duration::from_secs(90));
        let name = p.name.clone();
        assert!(status.is_some(), "{name} still running 90 s after SIGTERM to its group");
        assert!(status.unwrap().success(), "{name}: {status:?}");
    }
}

/// A second signal during a drain stops the process at once: a worker waiting for a
/// long stream to finish exits with status 130 on the second SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_ends_a_drain_at_once() {
    let nats = nats();
    let url = nats.url();
    let _coordinator = coordinator_proc(&url, "coordinator");
    let mut worker = worker_proc(&url, "w-long");
    let client = client(&url, Duration::from_secs(60)).await;
    wait_for_workers(&client, &["w-long"], Duration::from_secs(20)).await;
    // A stream that runs for a long while: thousands of tokens, end of text barred.
    let mut req = greedy("Once upon a time", 4000);
    req.config.logit_bias = (0..3).map(|id| (id, -100.0)).collect();
    let mut stream = client.generate(req).await.unwrap();
    assert!(matches!(stream.next().await, Some(Ok(_))), "the stream started");
    signal(&worker, libc::SIGTERM);
    worker.wait_for("draining worker", Duration::from_secs(20));
    signal(&worker, libc::SIGTERM);
    let status = tokio::task::block_in_place(|| exit_of(&mut worker, Duration::from_secs(30)));
    assert!(status.is_some(), "the worker kept draining after a second SIGTERM");
    assert_eq!(status.unwrap().code(), Some(130), "{status:?}");
}

/// A gateway stopped while it streams an answer: it stops taking requests, gives the
/// open stream a few seconds and exits cleanly within its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_with_an_open_stream_stops_on_sigterm() {
    let nats = nats();
    let url = nats.url();
    let _coordinator = coordinator_proc(&url, "coordinator");
    let _worker = worker_proc(&url, "w-gw");
    let client = client(&url, Duration::from_secs(20)).await;
    wait_for_workers(&client, &["w-gw"], Duration::from_secs(20)).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut gateway = switchyard("gateway", &["--nats", &url, "gateway", "--listen", &listen]);
    gateway.wait_for("gateway listening", Duration::from_secs(20));
    // A long streamed answer: thousands of tokens, end of text barred.
    let mut answer = reqwest::Client::new()
        .post(format!("http://{listen}/v1/chat/completions"))
        .json(&serde_json::json!({
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 4000,
            "stream": true,
            "logit_bias": {"0": -100, "1": -100, "2": -100},
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert!(answer.chunk().await.unwrap().is_some(), "the stream began");
    signal(&gateway, libc::SIGTERM);
    let status = tokio::task::block_in_place(|| exit_of(&mut gateway, Duration::from_secs(60)));
    assert!(
        status.is_some(),
        "the gateway still runs 60 s after SIGTERM with a stream open"
    );
    assert!(status.unwrap().success(), "{status:?}");
}
