//! The global flags for NATS credentials and TLS (docs/security.md).

use clap::Args;
use std::path::PathBuf;
use switchyard::Config;

/// How every process authenticates to NATS and whether it uses TLS (docs/security.md).
/// Each is also `nats.<name>` in the config file and `SWITCHYARD_NATS_<NAME>` in the
/// environment; give secrets there rather than as flags, which `ps` shows.
#[derive(Args, Debug, Clone, Default)]
pub struct SecurityFlags {
    /// NATS user name (with a password: SWITCHYARD_NATS_PASSWORD, nats.password or --nats-password).
    #[arg(long, global = true)]
    pub nats_user: Option<String>,
    /// NATS password for --nats-user (visible to ps; prefer SWITCHYARD_NATS_PASSWORD).
    #[arg(long, global = true, hide_default_value = true)]
    pub nats_password: Option<String>,
    /// NATS token (visible to ps; prefer SWITCHYARD_NATS_TOKEN).
    #[arg(long, global = true)]
    pub nats_token: Option<String>,
    /// File holding an nkey seed (SU…) for nkey authentication.
    #[arg(long, global = true)]
    pub nats_nkey_file: Option<PathBuf>,
    /// NATS .creds file (user JWT + seed) for decentralized JWT authentication.
    #[arg(long, global = true)]
    pub nats_creds_file: Option<PathBuf>,
    /// PEM file of the CA that signed the NATS server's certificate (turns TLS on).
    #[arg(long, global = true)]
    pub nats_tls_ca: Option<PathBuf>,
    /// PEM client certificate for mutual TLS (with --nats-tls-key).
    #[arg(long, global = true)]
    pub nats_tls_cert: Option<PathBuf>,
    /// PEM private key of --nats-tls-cert.
    #[arg(long, global = true)]
    pub nats_tls_key: Option<PathBuf>,
    /// Refuse a NATS server that does not offer TLS.
    #[arg(long, global = true)]
    pub nats_tls_required: bool,
    /// Reply inbox prefix (default _INBOX); one per user lets the server keep others from reading replies.
    #[arg(long, global = true)]
    pub nats_inbox_prefix: Option<String>,
}

impl SecurityFlags {
    /// Applies the flags that were given.
    pub fn apply(&self, c: &mut Config) {
        let n = &mut c.nats;
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        for (field, value) in [
            (&mut n.user, self.nats_user.clone()),
            (&mut n.password, self.nats_password.clone()),
            (&mut n.token, self.nats_token.clone()),
            (&mut n.nkey_file, path(&self.nats_nkey_file)),
            (&mut n.creds_file, path(&self.nats_creds_file)),
            (&mut n.tls_ca_file, path(&self.nats_tls_ca)),
            (&mut n.tls_cert_file, path(&self.nats_tls_cert)),
            (&mut n.tls_key_file, path(&self.nats_tls_key)),
            (&mut n.inbox_prefix, self.nats_inbox_prefix.clone()),
        ] {
            if let Some(v) = value {
                *field = v;
            }
        }
        if self.nats_tls_required {
            n.tls_required = true;
        }
    }
}
