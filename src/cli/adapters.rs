//! `switchyard adapters`: a worker's LoRA adapters, listed, loaded and unloaded at
//! run time over its `adapters` endpoint (docs/adapters.md).

use clap::{Args, Subcommand};
use std::process::ExitCode;
use switchyard::Config;
use switchyard_messages::{AdapterOp, AdapterRequest, PROTOCOL_VERSION};

/// `switchyard adapters`.
#[derive(Args, Debug)]
pub struct AdaptersArgs {
    #[command(subcommand)]
    pub command: AdaptersCommand,
}

/// What to do with a worker's adapters.
#[derive(Subcommand, Debug)]
pub enum AdaptersCommand {
    /// The adapters a worker has loaded: name, scale, path.
    Ls(WorkerArg),
    /// Load a LoRA adapter into a worker's model (a PEFT directory or a GGUF LoRA
    /// file, on the worker's machine); one of the same name is replaced.
    Load(LoadArgs),
    /// Unload an adapter: requests running with it finish, later ones are refused,
    /// and coordinators stop routing it there at the worker's next heartbeat (sent
    /// at once).
    Unload(NameArgs),
}

/// The worker asked.
#[derive(Args, Debug)]
pub struct WorkerArg {
    /// The worker's id (`switchyard status` lists them).
    #[arg(long)]
    pub worker: String,
}

/// `switchyard adapters load`.
#[derive(Args, Debug)]
pub struct LoadArgs {
    #[command(flatten)]
    pub worker: WorkerArg,
    /// The name requests will use.
    #[arg(long)]
    pub name: String,
    /// A PEFT directory (adapter_config.json + adapter_model.safetensors) or a GGUF LoRA file.
    #[arg(long)]
    pub path: String,
    /// The update's scale (multiplied by the adapter's alpha / rank).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f32,
}

/// `switchyard adapters unload`.
#[derive(Args, Debug)]
pub struct NameArgs {
    #[command(flatten)]
    pub worker: WorkerArg,
    /// The adapter's name.
    #[arg(long)]
    pub name: String,
}

pub async fn run(config: &Config, args: AdaptersArgs) -> anyhow::Result<ExitCode> {
    let request = |op| AdapterRequest {
        v: PROTOCOL_VERSION,
        op,
        name: String::new(),
        path: String::new(),
        scale: 1.0,
    };
    let (worker, req) = match args.command {
        AdaptersCommand::Ls(w) => (w.worker, request(AdapterOp::List)),
        AdaptersCommand::Load(a) => (
            a.worker.worker,
            AdapterRequest {
                name: a.name,
                path: a.path,
                scale: a.scale,
                ..request(AdapterOp::Load)
            },
        ),
        AdaptersCommand::Unload(a) => (
            a.worker.worker,
            AdapterRequest {
                name: a.name,
                ..request(AdapterOp::Unload)
            },
        ),
    };
    let client = super::connect::client(config, None).await?;
    match client.adapters(&worker, req).await {
        Ok(reply) => {
            if reply.adapters.is_empty() {
                println!("{}: no LoRA adapters loaded", reply.worker_id);
            }
            for a in &reply.adapters {
                println!("{}\tscale {}\t{}", a.name, a.scale, a.path);
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => super::connect::report(e),
    }
}
