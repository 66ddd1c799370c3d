//! `switchyard models`: what the fleet serves, what its store holds (NATS JetStream's
//! object store, docs/models.md), and pushing, pulling and removing models there.

use super::connect::{client, report};
use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use switchyard::Config;
use switchyard_store::{Manifest, Progress, Store, Upload};

/// `switchyard models`.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ModelsArgs {
    #[command(subcommand)]
    pub command: Option<ModelsCommand>,
    /// Scan this directory (or file) for GGUF files and HF model directories instead of
    /// asking the fleet.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Print JSON (the fleet's models only).
    #[arg(long)]
    pub json: bool,
}

/// The model store's commands.
#[derive(Subcommand, Debug)]
pub enum ModelsCommand {
    /// Put a model into the fleet's store: a GGUF file, or a Hugging Face / MLX
    /// directory (every file in it). Each file is sent in chunks with its SHA-256;
    /// the manifest goes last, so workers never see half a model. A model of the
    /// same name is replaced once the new one is complete. Creates the bucket
    /// (store.replicas, store.max_bytes) on first use.
    Push(PushArgs),
    /// Fetch a model from the store into this machine's cache (store.cache_dir),
    /// verifying every file's SHA-256 and resuming an interrupted fetch; prints
    /// where it is. Workers given `--model NAME` do this themselves.
    Pull(NameArgs),
    /// Remove a model from the store (workers keep their cached copies).
    Rm(NameArgs),
    /// List the models in the store: name, format, size, digest, who pushed when.
    Ls(LsArgs),
}

/// `models push`.
#[derive(Args, Debug)]
pub struct PushArgs {
    /// A GGUF file or a model directory (with config.json).
    pub path: PathBuf,
    /// The name workers will be given (`--model NAME`); default: the file's stem
    /// or the directory's name. Letters, digits and `. _ - :`; no `/` or `..`.
    #[arg(long)]
    pub name: Option<String>,
    /// Copies JetStream keeps if this push creates the bucket (default
    /// store.replicas).
    #[arg(long)]
    pub replicas: Option<u32>,
}

/// A model name.
#[derive(Args, Debug)]
pub struct NameArgs {
    /// The model's name in the store.
    pub name: String,
}

/// `models ls`.
#[derive(Args, Debug)]
pub struct LsArgs {
    /// Print the manifests as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `switchyard models …`.
pub async fn models(config: &Config, args: ModelsArgs) -> anyhow::Result<ExitCode> {
    let mut config = config.clone();
    match args.command {
        Some(ModelsCommand::Push(a)) => {
            if let Some(r) = a.replicas {
                config.store.replicas = r;
                config.validate()?;
            }
            push(&config, a).await
        }
        Some(ModelsCommand::Pull(a)) => {
            let store = store(&config).await?;
            let fetched = store.fetch(&a.name, false).await?;
            match fetched.fetched_bytes {
                0 => eprintln!("{} is already cached ({})", a.name, fetched.manifest.short_digest()),
                n => eprintln!("fetched {} ({:.1} MB, every SHA-256 checked)", a.name, n as f64 / 1e6),
            }
            println!("{}", fetched.path.display());
            Ok(ExitCode::SUCCESS)
        }
        Some(ModelsCommand::Rm(a)) => {
            let m = store(&config).await?.remove(&a.name).await?;
            println!(
                "removed {} ({:.1} MB, {})",
                m.name,
                m.size as f64 / 1e6,
                m.short_digest()
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(ModelsCommand::Ls(a)) => {
            let list = store(&config).await?.list().await?;
            match a.json {
                true => println!("{}", serde_json::to_string_pretty(&list)?),
                false => print_store(&list),
            }
            Ok(ExitCode::SUCCESS)
        }
        None => served(&config, args.dir, args.json).await,
    }
}

/// A store on a connection of its own.
async fn store(config: &Config) -> anyhow::Result<Store> {
    let url = match config.nats.url.is_empty() {
        true => "nats://127.0.0.1:4222".to_string(),
        false => config.nats.url.clone(),
    };
    let nats = switchyard_fabric::nats::connect(
        &url,
        &config.nats.security(),
        "switchyard-models",
        Duration::from_secs(10),
    )
    .await?;
    Ok(Store::new(nats, &config.store))
}

async fn push(config: &Config, args: PushArgs) -> anyhow::Result<ExitCode> {
    let path = &args.path;
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    let (format, entry) = if meta.is_file() {
        if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
            bail!(
                "{} is not a .gguf file (push a GGUF file or a model directory)",
                path.display()
            );
        }
        switchyard_workers::discover::check_gguf(path)?;
        let file = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        ("gguf", file)
    } else if path.join("config.json").is_file() {
        ("hf", String::new())
    } else {
        bail!(
            "{} is a directory without config.json (push a GGUF file or a Hugging Face / MLX model directory)",
            path.display()
        );
    };
    let name = match args.name {
        Some(n) => n,
        None => {
            let mut w = config.worker.clone();
            w.model_name.clear();
            switchyard_workers::local::model_name(&w, path)
        }
    };
    switchyard_store::name::validate(&name)?;
    let files = switchyard_store::manifest::local_files(path)?;
    let total: u64 = files
        .iter()
        .filter_map(|(_, p)| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let store = store(config).await?;
    let mut progress = Progress::new(format!("pushing {name}"), total);
    let upload = Upload {
        name: name.clone(),
        format: format.into(),
        entry,
        files,
    };
    let m = store.push(upload, &mut progress).await?;
    println!(
        "pushed {} ({}, {} file{}, {:.1} MB, {}) to bucket {} at {:.0} MB/s",
        m.name,
        m.format,
        m.files.len(),
        if m.files.len() == 1 { "" } else { "s" },
        m.size as f64 / 1e6,
        m.short_digest(),
        store.bucket(),
        progress.rate() / 1e6
    );
    Ok(ExitCode::SUCCESS)
}

fn print_store(list: &[Manifest]) {
    println!(
        "{:<32} {:<6} {:>10} {:<20} {:<24} PUSHED",
        "NAME", "FORMAT", "MB", "DIGEST", "BY"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for m in list {
        println!(
            "{:<32} {:<6} {:>10.1} {:<20} {:<24} {}",
            m.name,
            m.format,
            m.size as f64 / 1e6,
            m.short_digest(),
            m.pushed_by,
            ago(now.saturating_sub(m.pushed_at))
        );
    }
}

/// `42 s ago`, `5 min ago`, `3 h ago`, `2 d ago`.
fn ago(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s ago"),
        s if s < 7200 => format!("{} min ago", s / 60),
        s if s < 172_800 => format!("{} h ago", s / 3600),
        s => format!("{} d ago", s / 86_400),
    }
}

/// `models` without a subcommand: the fleet's models (and the store's, as text).
async fn served(config: &Config, dir: Option<PathBuf>, json: bool) -> anyhow::Result<ExitCode> {
    if let Some(dir) = dir {
        let found =
            switchyard_workers::discover::discover(&dir).with_context(|| format!("scanning {}", dir.display()))?;
        if json {
            println!("{}", serde_json::to_string_pretty(&found)?);
        } else {
            println!(
                "{:<12} {:<12} {:>5} {:>6} {:>10}  PATH",
                "FORMAT", "TYPE", "BITS", "GROUP", "MB"
            );
            for m in &found {
                println!(
                    "{:<12} {:<12} {:>5} {:>6} {:>10.1}  {}",
                    m.format,
                    m.model_type,
                    m.quant_bits,
                    m.quant_group,
                    m.size_bytes as f64 / 1e6,
                    m.path.display()
                );
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let client = client(config, None).await?;
    let reply = match client.models().await {
        Ok(r) => r,
        Err(e) => return report(e),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
        return Ok(ExitCode::SUCCESS);
    }
    for m in &reply.models {
        println!(
            "{}  ({}, {} layers, ctx {})  backends: {}  workers: {}",
            m.name,
            m.info.architecture,
            m.info.num_layers,
            m.info.context_len,
            m.backends.join(","),
            m.workers.join(",")
        );
        for a in &m.adapters {
            println!("  LoRA adapter {}:{}  workers: {}", m.name, a.name, a.workers.join(","));
        }
        if let Some(p) = &m.info.pipeline {
            println!("  {}", p.describe(m.workers.first().map_or("?", String::as_str)));
        }
    }
    let listing = async { store(config).await?.list().await };
    if let Ok(Ok(list)) = tokio::time::timeout(Duration::from_secs(3), listing).await {
        if !list.is_empty() {
            println!("\nin the store (switchyard models ls):");
            print_store(&list);
        }
    }
    Ok(ExitCode::SUCCESS)
}
