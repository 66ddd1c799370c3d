//! # switchyard-config — one typed configuration for every component
//!
//! ## Layout
//! - [`Config`] and its sections ([`NatsConfig`], [`CoordinatorConfig`],
//!   [`WorkerConfig`], [`ClientConfig`], [`GatewayConfig`], [`StoreConfig`]) with their documented defaults.
//! - [`Config::load`]: defaults → TOML file → `SWITCHYARD_{SECTION}_{FIELD}` env vars;
//!   the CLI then applies its flags and calls [`Config::validate`].
//! - [`cache_dir`]: where switchyard's cache lives on this machine.
//!
//! Every error names the field, and the file or variable it came from.

mod env;
mod gateway;
mod routing;
mod store;
mod worker;

pub use gateway::{ApiKey, GatewayConfig};
pub use routing::RoutingPolicy;
pub use store::StoreConfig;
pub use worker::{AdapterConfig, WorkerConfig, CUDA_ENGINES};

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading config file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (unknown key, wrong type).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, naming the field.
        message: String,
    },
    /// An environment variable has a value of the wrong type.
    #[error("environment variable {var}: {message}")]
    Env {
        /// The variable.
        var: String,
        /// What is wrong.
        message: String,
    },
    /// A value is out of range.
    #[error("invalid {field} = {value}: {reason}")]
    Invalid {
        /// Dotted field name, e.g. `worker.capacity`.
        field: &'static str,
        /// The offending value.
        value: String,
        /// The rule it breaks.
        reason: &'static str,
    },
}

/// The backends a worker can run.
pub const WORKER_BACKENDS: &[&str] = &["auto", "cpu", "llama_cpp", "rocm", "cuda", "metal"];

/// The whole configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Connection to NATS.
    pub nats: NatsConfig,
    /// Coordinator behaviour.
    pub coordinator: CoordinatorConfig,
    /// Worker behaviour.
    pub worker: WorkerConfig,
    /// Client behaviour (CLI and library).
    pub client: ClientConfig,
    /// OpenTelemetry export (the standard `OTEL_*` variables take precedence).
    pub telemetry: TelemetryConfig,
    /// What one request may ask for (enforced by coordinators and workers).
    pub limits: switchyard_messages::InputLimits,
    /// The OpenAI-compatible HTTP gateway.
    pub gateway: GatewayConfig,
    /// Models on the bus (JetStream object store) and their local cache.
    pub store: StoreConfig,
}

/// OpenTelemetry export settings from the config file, used where the matching
/// `OTEL_*` variable is not set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OTLP/gRPC collector, e.g. `http://otel-collector:4317` (`OTEL_EXPORTER_OTLP_ENDPOINT`);
    /// empty = no export.
    pub otlp_endpoint: String,
    /// `service.name` (`OTEL_SERVICE_NAME`); empty = per command.
    pub service_name: String,
    /// Metric export period in milliseconds (`OTEL_METRIC_EXPORT_INTERVAL`); 0 = 60000.
    pub metric_interval_ms: u64,
    /// `host:port` where the process serves its metrics for Prometheus to scrape
    /// (`GET /metrics`, text format), e.g. `127.0.0.1:9464`; port 0 picks a free one.
    /// Works beside OTLP export. Empty = off.
    pub prometheus_listen: String,
}

impl TelemetryConfig {
    /// The `OTEL_*` variables these settings stand for, for those not set in `env`.
    pub fn as_env(&self, env: impl Fn(&str) -> bool) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let mut add = |key: &'static str, value: String| {
            if !value.is_empty() && !env(key) {
                out.push((key, value));
            }
        };
        add("OTEL_EXPORTER_OTLP_ENDPOINT", self.otlp_endpoint.clone());
        add("OTEL_SERVICE_NAME", self.service_name.clone());
        if self.metric_interval_ms > 0 {
            add("OTEL_METRIC_EXPORT_INTERVAL", self.metric_interval_ms.to_string());
        }
        // Not an OTEL_* variable: carries the file's setting to the telemetry set-up.
        add("SWITCHYARD_TELEMETRY_PROMETHEUS_LISTEN", self.prometheus_listen.clone());
        out
    }
}

/// Connection to NATS, with the credentials and TLS settings every process uses
/// (docs/security.md). Secrets (`password`, `token`) never appear in `Debug`.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// NATS server URL, or a cluster's members separated by commas; empty =
    /// `switchyard up` starts a local server.
    pub url: String,
    /// Subject prefix (`{prefix}.v1.…`), for several tenants on one NATS account.
    pub prefix: String,
    /// Path to the `nats-server` binary `switchyard up` starts; empty = search
    /// `~/.cache/switchyard/bin` then `PATH`.
    pub server_bin: String,
    /// User name for user/password authentication.
    pub user: String,
    /// Password for `user` (prefer `SWITCHYARD_NATS_PASSWORD` or the file to a flag).
    pub password: String,
    /// Token authentication.
    pub token: String,
    /// A file holding an nkey seed (`SU…`), for nkey authentication.
    pub nkey_file: String,
    /// A `.creds` file (user JWT and nkey seed), for decentralized JWT authentication.
    pub creds_file: String,
    /// PEM file of the CA(s) that signed the server's certificate (enables TLS).
    pub tls_ca_file: String,
    /// PEM client certificate for mutual TLS (with `tls_key_file`).
    pub tls_cert_file: String,
    /// PEM private key of `tls_cert_file`.
    pub tls_key_file: String,
    /// Refuse to talk to a server that does not offer TLS.
    pub tls_required: bool,
    /// Inbox prefix for replies (default `_INBOX`); give each user its own
    /// (e.g. `_INBOX_alice`) so the server can keep others from reading them.
    pub inbox_prefix: String,
}

impl Default for NatsConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            prefix: "sy".into(),
            server_bin: String::new(),
            user: String::new(),
            password: String::new(),
            token: String::new(),
            nkey_file: String::new(),
            creds_file: String::new(),
            tls_ca_file: String::new(),
            tls_cert_file: String::new(),
            tls_key_file: String::new(),
            tls_required: false,
            inbox_prefix: String::new(),
        }
    }
}

/// `"<redacted>"` for a set secret, `""` for an empty one.
fn redact(secret: &str) -> &'static str {
    if secret.is_empty() {
        ""
    } else {
        "<redacted>"
    }
}

impl std::fmt::Debug for NatsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsConfig")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("server_bin", &self.server_bin)
            .field("security", &self.security())
            .finish()
    }
}

impl NatsConfig {
    /// What a connection needs besides the URL.
    pub fn security(&self) -> NatsSecurity {
        NatsSecurity {
            user: self.user.clone(),
            password: self.password.clone(),
            token: self.token.clone(),
            nkey_file: self.nkey_file.clone(),
            creds_file: self.creds_file.clone(),
            tls_ca_file: self.tls_ca_file.clone(),
            tls_cert_file: self.tls_cert_file.clone(),
            tls_key_file: self.tls_key_file.clone(),
            tls_required: self.tls_required,
            inbox_prefix: self.inbox_prefix.clone(),
        }
    }
}

/// Credentials and TLS for one NATS connection (the `nats.*` settings of the same
/// names). `Debug` never shows the password or token.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct NatsSecurity {
    /// `nats.user`.
    pub user: String,
    /// `nats.password`.
    pub password: String,
    /// `nats.token`.
    pub token: String,
    /// `nats.nkey_file`.
    pub nkey_file: String,
    /// `nats.creds_file`.
    pub creds_file: String,
    /// `nats.tls_ca_file`.
    pub tls_ca_file: String,
    /// `nats.tls_cert_file`.
    pub tls_cert_file: String,
    /// `nats.tls_key_file`.
    pub tls_key_file: String,
    /// `nats.tls_required`.
    pub tls_required: bool,
    /// `nats.inbox_prefix`.
    pub inbox_prefix: String,
}

impl std::fmt::Debug for NatsSecurity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSecurity")
            .field("user", &self.user)
            .field("password", &redact(&self.password))
            .field("token", &redact(&self.token))
            .field("nkey_file", &self.nkey_file)
            .field("creds_file", &self.creds_file)
            .field("tls_ca_file", &self.tls_ca_file)
            .field("tls_cert_file", &self.tls_cert_file)
            .field("tls_key_file", &self.tls_key_file)
            .field("tls_required", &self.tls_required)
            .field("inbox_prefix", &self.inbox_prefix)
            .finish()
    }
}

impl NatsSecurity {
    /// The ways to authenticate that are set, by setting name.
    pub fn auth_methods(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if !self.user.is_empty() || !self.password.is_empty() {
            m.push("nats.user/nats.password");
        }
        if !self.token.is_empty() {
            m.push("nats.token");
        }
        if !self.nkey_file.is_empty() {
            m.push("nats.nkey_file");
        }
        if !self.creds_file.is_empty() {
            m.push("nats.creds_file");
        }
        m
    }

    /// Whether the connection uses TLS.
    pub fn tls(&self) -> bool {
        self.tls_required || !self.tls_ca_file.is_empty() || !self.tls_cert_file.is_empty()
    }
}

/// Coordinator behaviour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// A worker whose last heartbeat is older than this is dropped, milliseconds.
    pub worker_expiry_ms: u64,
    /// How long to wait for a worker's admission answer before trying another, ms.
    pub admission_timeout_ms: u64,
    /// Workers tried per request before giving up.
    pub max_attempts: u32,
    /// Prefer the worker holding the request's prefix warm (KV-aware routing); off =
    /// route by backend and load only.
    pub kv_routing: bool,
    /// `ttft`: least predicted time to first token (from workers' measured speeds,
    /// queues and warm blocks); `blocks`: backend, then warm blocks less queue.
    pub routing: RoutingPolicy,
    /// The longest a request waits here for a worker with room when it names no
    /// `queue_ms` or `deadline_ms` of its own, milliseconds; then `overloaded`.
    pub queue_timeout_ms: u64,
    /// Requests that may wait here at once; more are refused with `overloaded`.
    pub max_queued: u32,
    /// Payload bytes that may wait here at once; more are refused with `overloaded`.
    pub max_queued_bytes: u64,
    /// Requests sent to a worker beyond its capacity (into its own queue) so a slot
    /// that frees starts the next at once; the rest wait here, in priority and
    /// tenant order.
    pub dispatch_ahead: u32,
    /// Disaggregated prefill: prompts of at least this many tokens (estimated, 4
    /// bytes a token) going to a `decode` worker — or to a `both` worker where a
    /// `prefill` worker is predicted faster, link included — are prefilled on a
    /// `prefill` worker and their KV pulled (docs/kv-transfer.md).
    pub disagg_min_tokens: u32,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        Self {
            worker_expiry_ms: 3_000,
            admission_timeout_ms: 2_000,
            max_attempts: 3,
            kv_routing: true,
            routing: RoutingPolicy::Ttft,
            disagg_min_tokens: 512,
            queue_timeout_ms: 60_000,
            max_queued: 4_096,
            max_queued_bytes: 64 << 20,
            dispatch_ahead: 1,
        }
    }
}

/// Client behaviour.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ClientConfig {
    /// A stream with no chunk for this long ends with `worker_lost`, milliseconds.
    pub stall_timeout_ms: u64,
    /// Timeout for request/reply calls (status, models), milliseconds.
    pub request_timeout_ms: u64,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            stall_timeout_ms: 10_000,
            request_timeout_ms: 5_000,
        }
    }
}

impl Config {
    /// Defaults, overlaid by `file` (if given) and then by `SWITCHYARD_*` variables
    /// from `vars` (pass `std::env::vars()`). Call [`Config::validate`] after flags.
    pub fn load(file: Option<&Path>, vars: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        let mut table = toml::Table::try_from(Config::default()).map_err(|e| ConfigError::Parse {
            path: PathBuf::from("<defaults>"),
            message: e.to_string(),
        })?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            // Parse into the typed struct first so unknown keys and wrong types are
            // reported against the file, with the field's name.
            // toml's Display shows the offending line, so the field is named.
            let from_file: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.to_string().trim_end().to_string(),
            })?;
            let mut file_table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: path.to_path_buf(),
                message: e.message().to_string(),
            })?;
            drop(from_file);
            env::rename_old_fields(&mut file_table);
            env::merge(&mut table, file_table);
        }
        env::apply(&mut table, vars)?;
        table.try_into().map_err(|e: toml::de::Error| ConfigError::Parse {
            path: PathBuf::from("<merged>"),
            message: e.message().to_string(),
        })
    }

    /// Checks every value's range; the error names the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field, value: String, reason| Err(ConfigError::Invalid { field, value, reason });
        let token_ok = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if self.nats.prefix.is_empty() || !token_ok(&self.nats.prefix) {
            return invalid(
                "nats.prefix",
                self.nats.prefix.clone(),
                "must be non-empty letters, digits, '-' or '_'",
            );
        }
        self.gateway.validate()?;
        self.store.validate()?;
        let listen = &self.telemetry.prometheus_listen;
        if !listen.is_empty()
            && !listen
                .rsplit_once(':')
                .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        {
            return invalid(
                "telemetry.prometheus_listen",
                listen.clone(),
                "must be host:port, e.g. 127.0.0.1:9464 (empty = off)",
            );
        }
        let sec = self.nats.security();
        let methods = sec.auth_methods();
        if methods.len() > 1 {
            return invalid(
                "nats",
                methods.join(" + "),
                "set one way to authenticate: user/password, token, nkey_file or creds_file",
            );
        }
        if sec.user.is_empty() != sec.password.is_empty() {
            return invalid(
                "nats.user",
                sec.user.clone(),
                "user and password go together (set both; SWITCHYARD_NATS_PASSWORD keeps the password off the command line)",
            );
        }
        if sec.tls_cert_file.is_empty() != sec.tls_key_file.is_empty() {
            return invalid(
                "nats.tls_cert_file",
                sec.tls_cert_file.clone(),
                "a client certificate needs its key (nats.tls_key_file), and a key its certificate",
            );
        }
        for (field, path) in [
            ("nats.nkey_file", &sec.nkey_file),
            ("nats.creds_file", &sec.creds_file),
            ("nats.tls_ca_file", &sec.tls_ca_file),
            ("nats.tls_cert_file", &sec.tls_cert_file),
            ("nats.tls_key_file", &sec.tls_key_file),
        ] {
            if !path.is_empty() && !Path::new(path).is_file() {
                return invalid(field, path.clone(), "no such file");
            }
        }
        let subject_ok = |s: &str| s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !subject_ok(&sec.inbox_prefix) || sec.inbox_prefix.starts_with('.') || sec.inbox_prefix.ends_with('.') {
            return invalid(
                "nats.inbox_prefix",
                sec.inbox_prefix.clone(),
                "must be a subject: letters, digits, '-', '_' and inner '.'",
            );
        }
        self.worker.validate()?;
        if self.coordinator.worker_expiry_ms <= self.worker.heartbeat_ms {
            return invalid(
                "coordinator.worker_expiry_ms",
                self.coordinator.worker_expiry_ms.to_string(),
                "must exceed worker.heartbeat_ms",
            );
        }
        if self.coordinator.max_queued == 0 || self.coordinator.max_queued_bytes == 0 {
            return invalid(
                "coordinator.max_queued",
                self.coordinator.max_queued.to_string(),
                "max_queued and max_queued_bytes must be at least 1",
            );
        }
        if self.coordinator.max_attempts == 0 {
            return invalid("coordinator.max_attempts", "0".into(), "must be at least 1");
        }
        if self.client.stall_timeout_ms <= self.worker.keepalive_ms {
            return invalid(
                "client.stall_timeout_ms",
                self.client.stall_timeout_ms.to_string(),
                "must exceed worker.keepalive_ms",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;

/// switchyard's cache directory on this machine: `$SWITCHYARD_CACHE`, else
/// `~/.cache/switchyard` (nats-server, models, llama-server builds, the venv).
pub fn cache_dir() -> std::path::PathBuf {
    match std::env::var_os("SWITCHYARD_CACHE") {
        Some(p) => std::path::PathBuf::from(p),
        None => std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".cache/switchyard"),
    }
}

/// File name of the demo model that `scripts/setup.sh` installs.
pub const DEMO_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The demo model's path: `$SWITCHYARD_DEMO_MODEL`, else the cache's `models/`.
pub fn demo_model_path() -> std::path::PathBuf {
    std::env::var_os("SWITCHYARD_DEMO_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| cache_dir().join("models").join(DEMO_MODEL_FILE))
}
