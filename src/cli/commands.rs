//! What each subcommand does.

use super::connect::{client, report};
use super::{load_config, ChatArgs, Cli, Command, GenerateArgs, SamplingFlags, UpArgs};
use anyhow::bail;
use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use switchyard::{node, Client, ClientError, Config, GenerateRequest, Message, StreamEvent};
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// How long a worker's running streams get to finish (or be handed over) on a stop.
const WORKER_DRAIN: Duration = Duration::from_secs(30);
/// What a stop may take beyond the drain before the process exits regardless (a
/// worker's: telling the coordinators, waiting for its actors, flushing; a
/// coordinator's whole stop takes at most 8 s).
const STOP_MARGIN: Duration = Duration::from_secs(20);

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut config = load_config(&cli)?;
    match cli.command {
        Command::Up(args) => {
            args.worker.apply(&mut config);
            args.coordinator.apply(&mut config);
            args.gateway.apply(&mut config);
            config.validate()?;
            up(config, args).await
        }
        Command::Gateway(args) => {
            if let Some(key) = &args.hash_key {
                println!("{}", switchyard::gateway::keys::hash_key(key));
                return Ok(ExitCode::SUCCESS);
            }
            args.apply(&mut config);
            config.validate()?;
            require_nats(&config)?;
            let stop = node::shutdown_signal(Duration::from_secs(10));
            let g =
                switchyard::gateway::start(client(&config, None).await?, &config.nats.prefix, &config.gateway).await?;
            println!("gateway listening on {} (OpenAI API at {}/v1)", g.url(), g.url());
            std::io::stdout().flush().ok();
            stop.await;
            g.shutdown().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Coordinator(args) => {
            args.coordinator.apply(&mut config);
            config.validate()?;
            require_nats(&config)?;
            let stop = node::shutdown_signal(Duration::from_secs(10));
            let coordinator = node::start_coordinator(&config).await?;
            eprintln!("coordinator up on {} (prefix {})", config.nats.url, config.nats.prefix);
            tokio::select! {
                _ = stop => {}
                why = coordinator.failed() => return Ok(failed(&why)),
            }
            coordinator.shutdown().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Worker(args) => {
            args.worker.apply(&mut config);
            config.validate()?;
            require_nats(&config)?;
            let mut stop = std::pin::pin!(node::shutdown_signal(WORKER_DRAIN + STOP_MARGIN));
            if node::is_later_stage(&config) {
                return serve_stage(&mut config, stop).await;
            }
            // A stop while the model is fetched or loaded ends it there.
            let loading = async {
                node::resolve_model(&mut config).await?;
                node::load(&config).await
            };
            let mut loaded = tokio::select! {
                loaded = loading => loaded?,
                _ = &mut stop => {
                    eprintln!("stopped while loading the model");
                    return Ok(ExitCode::SUCCESS);
                }
            };
            let worker = match node::start_worker(&config, &loaded).await {
                Ok(w) => w,
                Err(e) => {
                    loaded.stop();
                    return Err(e);
                }
            };
            eprintln!(
                "worker {} up on {}: serving {} on {} (capacity {})",
                worker.id(),
                config.nats.url,
                loaded.name,
                loaded.device,
                loaded.capacity
            );
            tokio::select! {
                _ = stop => {}
                why = worker.failed() => {
                    loaded.stop();
                    return Ok(failed(&why));
                }
            }
            eprintln!("draining worker {} …", worker.id());
            worker.shutdown(WORKER_DRAIN).await;
            loaded.stop();
            Ok(ExitCode::SUCCESS)
        }
        Command::Generate(args) => {
            config.validate()?;
            generate(&config, args).await
        }
        Command::Chat(args) => {
            config.validate()?;
            chat(&config, args).await
        }
        Command::Status(args) => {
            config.validate()?;
            super::status::status(&config, args).await
        }
        Command::Models(args) => {
            config.validate()?;
            super::store::models(&config, args).await
        }
        Command::Adapters(args) => {
            config.validate()?;
            super::adapters::run(&config, args).await
        }
        Command::Bench(cmd) => switchyard_bench::run(cmd, config).await,
    }
}

fn require_nats(config: &Config) -> anyhow::Result<()> {
    if config.nats.url.is_empty() {
        bail!("no NATS server given: pass --nats URL, set nats.url in the config file, or SWITCHYARD_NATS_URL");
    }
    Ok(())
}

async fn up(mut config: Config, args: UpArgs) -> anyhow::Result<ExitCode> {
    // The gateway (5 s at most), the worker (10 s drain), the coordinator (8 s).
    let mut stop = std::pin::pin!(node::shutdown_signal(Duration::from_secs(25) + STOP_MARGIN));
    let started = Instant::now();
    if args.secure && !config.nats.url.is_empty() {
        bail!("--secure starts a local nats-server with its own credentials; it cannot be used with --nats / nats.url");
    }
    let secure = match args.secure {
        true => {
            let dir = switchyard_config::cache_dir().join(format!("secure-{}", std::process::id()));
            Some(super::secure_up::prepare(&dir, &config.nats.prefix)?)
        }
        false => None,
    };
    let _server = if config.nats.url.is_empty() {
        let bin = find_nats_server(&config.nats.server_bin)?;
        let server = match &secure {
            Some(s) => NatsServer::start_with_config(&bin, &s.server_config, &s.dir)?,
            None => NatsServer::start_jetstream(&bin, &config.store.jetstream_path())?,
        };
        config.nats.url = server.url();
        let tls = if secure.is_some() {
            " with TLS and generated users"
        } else {
            ""
        };
        eprintln!("started nats-server (pid {}) at {}{tls}", server.pid(), server.url());
        Some(server)
    } else {
        None
    };
    let url = config.nats.url.clone();
    let (coordinator_config, worker_config, client_config) = match &secure {
        Some(s) => (
            s.coordinator(&config, &url),
            s.worker(&config, &url),
            s.client(&config, &url),
        ),
        None => (config.clone(), config.clone(), config.clone()),
    };
    let coordinator = node::start_coordinator(&coordinator_config).await?;
    let mut worker_config = worker_config;
    node::resolve_model(&mut worker_config).await?;
    let mut loaded = node::load(&worker_config).await?;
    let name = loaded.name.clone();
    let worker = node::start_worker(&worker_config, &loaded).await?;
    // Report ready once the coordinator has seen the worker.
    let deadline = Instant::now() + Duration::from_secs(10);
    while coordinator.status().await?.workers.is_empty() {
        if Instant::now() > deadline {
            bail!("the coordinator did not see the worker within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gateway = match config.gateway.enabled {
        true => Some(super::gateway::start_for_up(client(&client_config, None).await?, &client_config).await?),
        false => None,
    };
    let api = gateway
        .as_ref()
        .map(|g| format!(" gateway={}/v1", g.url()))
        .unwrap_or_default();
    println!(
        "ready: nats={} model={name} worker={}{api} in {:.2} s",
        config.nats.url,
        worker.id(),
        started.elapsed().as_secs_f64()
    );
    match &secure {
        Some(s) => {
            let file = s.write_client_config(&url, &config.nats.prefix)?;
            println!(
                "try:   switchyard --config {} chat \"What is water made of?\"",
                file.display()
            );
        }
        None => println!(
            "try:   switchyard --nats {} chat \"What is water made of?\"",
            config.nats.url
        ),
    }
    std::io::stdout().flush().ok();

    let mut stopped = false;
    if let Some(prompt) = &args.prompt {
        let client = client(&client_config, None).await?;
        let mut req = GenerateRequest::chat(
            Client::new_request_id(),
            name.clone(),
            vec![Message::new("user", prompt.clone())],
        );
        switchyard::gateway::openai::chat_defaults(&mut req.config, None, None, None, None);
        let mut stream = client.chat(req).await?;
        let mut text = String::new();
        let mut first_token = None;
        let metrics = loop {
            let event = tokio::select! {
                event = stream.next() => event,
                // Stopped while answering: no answer to print, the node shuts down.
                _ = &mut stop => break None,
            };
            match event {
                Some(Ok(StreamEvent::Tokens(t))) => {
                    first_token.get_or_insert_with(|| started.elapsed());
                    text.extend(t.iter().map(|t| t.text.as_str()));
                }
                Some(Ok(StreamEvent::Done { metrics, .. })) => break Some(metrics),
                Some(Err(e)) => return Err(e.into()),
                None => bail!("the answer stream ended without a final chunk"),
            }
        };
        match metrics {
            Some(metrics) => {
                println!("> {prompt}\n{}", text.trim());
                println!(
                    "first token {:.2} s and answer {:.2} s after start ({} tokens, {:.1} tok/s decode)",
                    first_token.unwrap_or_default().as_secs_f64(),
                    started.elapsed().as_secs_f64(),
                    metrics.generated_tokens,
                    metrics.decode_tokens_per_sec
                );
                std::io::stdout().flush().ok();
            }
            None => stopped = true,
        }
    }
    if !args.exit_after_prompt && !stopped {
        let why = tokio::select! {
            _ = &mut stop => None,
            why = worker.failed() => Some(why),
            why = coordinator.failed() => Some(why),
        };
        if let Some(why) = why {
            if let Some(g) = gateway {
                g.shutdown().await;
            }
            loaded.stop();
            return Ok(failed(&why));
        }
    }
    eprintln!("shutting down …");
    if let Some(g) = gateway {
        g.shutdown().await;
    }
    worker.shutdown(Duration::from_secs(10)).await;
    loaded.stop();
    coordinator.shutdown().await;
    drop(secure);
    Ok(ExitCode::SUCCESS)
}

/// `worker` for a pipeline stage past the first: loads its layers and computes them
/// for the first stage until stopped.
async fn serve_stage(
    config: &mut Config,
    mut stop: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> anyhow::Result<ExitCode> {
    let mut stage = tokio::select! {
        stage = async {
            node::resolve_model(config).await?;
            node::serve_stage(config).await
        } => stage?,
        _ = &mut stop => {
            eprintln!("stopped while loading the model");
            return Ok(ExitCode::SUCCESS);
        }
    };
    eprintln!(
        "stage {} up on {}: layers {}-{} of pipeline {} on {}",
        stage.worker_id,
        config.nats.url,
        stage.layers.start,
        stage.layers.end - 1,
        config.worker.pipeline,
        stage.subject
    );
    tokio::select! {
        _ = stop => {}
        why = stage.failed() => return Ok(failed(&why)),
    }
    eprintln!("stopping stage {} …", stage.worker_id);
    stage.stop();
    Ok(ExitCode::SUCCESS)
}

/// A root actor (worker or coordinator) ended unasked: its NATS connection is
/// already drained; the process exits non-zero so its service manager starts it
/// again, rather than staying up and serving nothing.
fn failed(why: &str) -> ExitCode {
    eprintln!("error: {why}; exiting so a service manager can restart this process");
    ExitCode::from(70)
}

fn request(
    s: &SamplingFlags,
    prompt: Option<String>,
    messages: Option<Vec<Message>>,
) -> anyhow::Result<GenerateRequest> {
    let mut req = GenerateRequest::generate(Client::new_request_id(), s.model.clone(), "");
    req.prompt = prompt;
    req.messages = messages;
    let chat = req.messages.is_some();
    let c = &mut req.config;
    c.max_tokens = s.max_tokens;
    if chat {
        // Chat samples by default (llama.cpp server's defaults); generate is greedy.
        switchyard::gateway::openai::chat_defaults(c, s.temperature, s.top_k, s.top_p, s.min_p);
    } else {
        c.temperature = s.temperature.unwrap_or(0.0);
        c.top_k = s.top_k.unwrap_or(0);
        c.top_p = s.top_p.unwrap_or(0.0);
        c.min_p = s.min_p.unwrap_or(0.0);
    }
    c.repeat_penalty = s.repeat_penalty;
    c.seed = s.seed;
    c.stop = s.stop.clone();
    req.head.backend = s.backend.clone();
    req.head.worker = s.worker.clone();
    req.head.adapter = s.adapter.clone();
    req.config.constraint = s.constraint.constraint()?;
    Ok(req)
}

/// Streams a response to stdout (or collects it for --json); returns the text.
async fn stream_out(mut stream: switchyard::ResponseStream, json: bool) -> Result<String, ClientError> {
    let mut text = String::new();
    let mut tokens = Vec::new();
    let mut out = std::io::stdout();
    while let Some(ev) = stream.next().await {
        match ev? {
            StreamEvent::Tokens(t) => {
                for tok in &t {
                    text.push_str(&tok.text);
                    if !json {
                        let _ = out.write_all(tok.text.as_bytes());
                    }
                }
                let _ = out.flush();
                tokens.extend(t);
            }
            StreamEvent::Done {
                finish_reason, metrics, ..
            } => {
                if json {
                    let v = serde_json::json!({
                        "text": text,
                        "token_ids": tokens.iter().map(|t| t.id).collect::<Vec<_>>(),
                        "finish_reason": finish_reason,
                        "worker_id": stream.worker_id(),
                        "metrics": metrics,
                    });
                    println!("{v}");
                } else {
                    println!();
                }
                return Ok(text);
            }
        }
    }
    Err(ClientError::Protocol("stream ended without a final chunk".into()))
}

async fn generate(config: &Config, args: GenerateArgs) -> anyhow::Result<ExitCode> {
    let client = client(config, args.sampling.stall_timeout_ms).await?;
    let req = request(&args.sampling, Some(args.prompt), None)?;
    let stream = client.generate(req).await?;
    match stream_out(stream, args.sampling.json).await {
        Ok(_) => Ok(ExitCode::SUCCESS),
        Err(e) => report(e),
    }
}

async fn chat(config: &Config, args: ChatArgs) -> anyhow::Result<ExitCode> {
    let client = client(config, args.sampling.stall_timeout_ms).await?;
    let mut history: Vec<Message> = args.system.iter().map(|s| Message::new("system", s.clone())).collect();
    if let Some(message) = args.message {
        history.push(Message::new("user", message));
        let stream = client.chat(request(&args.sampling, None, Some(history))?).await?;
        return match stream_out(stream, args.sampling.json).await {
            Ok(_) => Ok(ExitCode::SUCCESS),
            Err(e) => report(e),
        };
    }
    eprintln!("interactive chat; an empty line or Ctrl-D ends it");
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(ExitCode::SUCCESS);
        }
        history.push(Message::new("user", line.trim_end().to_string()));
        let stream = client
            .chat(request(&args.sampling, None, Some(history.clone()))?)
            .await?;
        match stream_out(stream, false).await {
            Ok(answer) => history.push(Message::new("assistant", answer)),
            Err(e) => {
                history.pop();
                report(e)?;
            }
        }
    }
}
