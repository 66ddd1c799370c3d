//! `switchyard gateway` and the gateway `up` starts.

use clap::Args;
use std::path::PathBuf;
use switchyard::gateway::{self, GatewayHandle};
use switchyard::{Client, Config};

/// `switchyard gateway`: the HTTP gateway of a fleet — OpenAI's, Anthropic's and Ollama's APIs (docs/gateway.md).
#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// Address to listen on (gateway.listen). Beyond loopback it needs API keys, or
    /// --allow-no-keys.
    #[arg(long)]
    pub listen: Option<String>,
    /// TOML file of API keys, `[[keys]]` tables with name, sha256, models,
    /// requests_per_min, tokens_per_min, max_streams (gateway.keys_file).
    #[arg(long)]
    pub keys_file: Option<PathBuf>,
    /// Serve without API keys beyond loopback: anyone who reaches it can use the
    /// fleet (gateway.allow_no_keys).
    #[arg(long)]
    pub allow_no_keys: bool,
    /// Print the SHA-256 of KEY (what gateway.keys stores) and exit.
    #[arg(long, value_name = "KEY")]
    pub hash_key: Option<String>,
    /// The longest a request waits in the fleet queue for a worker with room, ms;
    /// then 429 with Retry-After (gateway.queue_timeout_ms, default 60000).
    #[arg(long)]
    pub queue_timeout_ms: Option<u64>,
    /// A web origin (https://app.example.com, or * for any) whose pages may call the
    /// gateway from a browser (CORS); repeat for several (gateway.cors_origins;
    /// default none).
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    pub cors_origins: Vec<String>,
    /// A model name clients send, answered by a served model: NAME=MODEL (or
    /// NAME=MODEL:ADAPTER for a LoRA adapter on it), e.g. gpt-4o-mini=smol; repeat for
    /// several (gateway.aliases, added to the file's).
    #[arg(long = "alias", value_name = "NAME=MODEL", value_parser = parse_alias)]
    pub aliases: Vec<(String, String)>,
}

fn parse_alias(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((a, m)) if !a.trim().is_empty() && !m.trim().is_empty() => Ok((a.trim().into(), m.trim().into())),
        _ => Err(format!("{s:?}: an alias is NAME=MODEL, e.g. gpt-4o-mini=smol")),
    }
}

impl GatewayArgs {
    /// Applies the flags that were given.
    pub fn apply(&self, c: &mut Config) {
        if let Some(l) = &self.listen {
            c.gateway.listen = l.clone();
        }
        if let Some(f) = &self.keys_file {
            c.gateway.keys_file = f.display().to_string();
        }
        if self.allow_no_keys {
            c.gateway.allow_no_keys = true;
        }
        if let Some(v) = self.queue_timeout_ms {
            c.gateway.queue_timeout_ms = v;
        }
        if !self.cors_origins.is_empty() {
            c.gateway.cors_origins = self.cors_origins.clone();
        }
        c.gateway.aliases.extend(self.aliases.iter().cloned());
    }
}

/// `up`'s gateway flags.
#[derive(Args, Debug, Clone, Default)]
pub struct UpGatewayFlags {
    /// Where up's gateway listens (gateway.listen; default 127.0.0.1:8080, or a free
    /// port when that one is taken).
    #[arg(long)]
    pub gateway_listen: Option<String>,
    /// Do not start a gateway (gateway.enabled = false).
    #[arg(long)]
    pub no_gateway: bool,
}

impl UpGatewayFlags {
    /// Applies the flags that were given.
    pub fn apply(&self, c: &mut Config) {
        if let Some(l) = &self.gateway_listen {
            c.gateway.listen = l.clone();
        }
        if self.no_gateway {
            c.gateway.enabled = false;
        }
    }
}

/// Starts `up`'s gateway: on `gateway.listen`, or — when that is the default and
/// taken — on a free loopback port.
pub async fn start_for_up(client: Client, config: &Config) -> anyhow::Result<GatewayHandle> {
    let default = switchyard_config::GatewayConfig::default().listen;
    match gateway::start(client.clone(), &config.nats.prefix, &config.gateway).await {
        Ok(g) => Ok(g),
        Err(e) if config.gateway.listen == default && format!("{e:#}").contains("in use") => {
            eprintln!("gateway: {default} is taken; listening on a free port instead");
            let mut g = config.gateway.clone();
            g.listen = "127.0.0.1:0".into();
            gateway::start(client, &config.nats.prefix, &g).await
        }
        Err(e) => Err(e),
    }
}
