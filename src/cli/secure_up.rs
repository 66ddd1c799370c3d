//! `up --secure`: the local nats-server with generated credentials and TLS.
//!
//! A fresh CA and a server certificate for 127.0.0.1/localhost, random passwords for
//! three users in the roles of docs/nats-roles.conf (coordinator, worker, client,
//! each with its inbox prefix), TLS required. Everything is written to a directory
//! readable only by the owner, with a `client.toml` that other switchyard commands
//! take with `--config`. Nothing secret is printed.

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use std::io::Read;
use std::path::{Path, PathBuf};
use switchyard::Config;

/// The role template, as shipped in docs/.
const ROLES: &str = include_str!("../../docs/nats-roles.conf");

/// What `up --secure` made.
pub struct SecureLocal {
    /// Where the files are.
    pub dir: PathBuf,
    /// nats-server's configuration (without the `listen` line).
    pub server_config: String,
    coordinator_password: String,
    worker_password: String,
    client_password: String,
}

/// A random password: 24 bytes from the OS, hex.
fn password() -> anyhow::Result<String> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .context("reading /dev/urandom for a password")?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Writes `text` to `dir/name`, readable by the owner only.
fn private(dir: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    std::io::Write::write_all(&mut f, text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Makes the CA, the server certificate, the passwords and the server configuration
/// in `dir` for subject prefix `prefix`.
pub fn prepare(dir: &Path, prefix: &str) -> anyhow::Result<SecureLocal> {
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "switchyard up --secure CA");
    let ca_key = KeyPair::generate()?;
    let ca = ca_params.self_signed(&ca_key)?;
    let mut server_params = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
    server_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_key = KeyPair::generate()?;
    let server = server_params.signed_by(&server_key, &ca, &ca_key)?;
    private(dir, "ca.pem", &ca.pem())?;
    let cert = private(dir, "server.pem", &server.pem())?;
    let key = private(dir, "server-key.pem", &server_key.serialize_pem())?;

    let (coordinator_password, worker_password, client_password) = (password()?, password()?, password()?);
    private(
        dir,
        "secrets.conf",
        &format!(
            "COORDINATOR_PASS: \"{coordinator_password}\"\nWORKER_PASS: \"{worker_password}\"\n\
             CLIENT_PASS: \"{client_password}\"\n"
        ),
    )?;
    // The template's roles, for this prefix, with up's own three users instead of
    // the template's example clients.
    let roles = ROLES
        .split("\nauthorization {")
        .next()
        .context("docs/nats-roles.conf has no authorization block")?
        .replace("\"sy.", &format!("\"{prefix}."));
    let server_config = format!(
        "{roles}\nauthorization {{\n  users: [\n    \
         {{ user: \"coordinator\", password: $COORDINATOR_PASS, permissions: $COORDINATOR }}\n    \
         {{ user: \"worker\", password: $WORKER_PASS, permissions: $WORKER }}\n    \
         {{ user: \"client\", password: $CLIENT_PASS,\n      \
         permissions: {{ publish: {{ allow: $CLIENT_PUBLISH }}, subscribe: {{ allow: [\"_INBOX.client.>\"] }} }} }}\n  \
         ]\n}}\n\ntls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n\njetstream {{\n  store_dir: \"{}\"\n}}\n",
        cert.display(),
        key.display(),
        dir.join("jetstream").display()
    );
    Ok(SecureLocal {
        dir: dir.to_path_buf(),
        server_config,
        coordinator_password,
        worker_password,
        client_password,
    })
}

/// The keys and passwords go when `up` does.
impl Drop for SecureLocal {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl SecureLocal {
    fn ca(&self) -> String {
        self.dir.join("ca.pem").display().to_string()
    }

    /// `config` connecting as `user` with `password` over TLS to `url`.
    fn as_user(&self, config: &Config, url: &str, user: &str, password: &str) -> Config {
        let mut c = config.clone();
        c.nats.url = url.to_string();
        c.nats.user = user.to_string();
        c.nats.password = password.to_string();
        c.nats.token.clear();
        c.nats.inbox_prefix = format!("_INBOX.{user}");
        c.nats.tls_ca_file = self.ca();
        c.nats.tls_required = true;
        c
    }

    /// The coordinator's configuration.
    pub fn coordinator(&self, config: &Config, url: &str) -> Config {
        self.as_user(config, url, "coordinator", &self.coordinator_password)
    }

    /// The worker's configuration.
    pub fn worker(&self, config: &Config, url: &str) -> Config {
        self.as_user(config, url, "worker", &self.worker_password)
    }

    /// The client's configuration (what `up --prompt` uses).
    pub fn client(&self, config: &Config, url: &str) -> Config {
        self.as_user(config, url, "client", &self.client_password)
    }

    /// Writes `client.toml` (owner-only) for other commands' `--config`.
    pub fn write_client_config(&self, url: &str, prefix: &str) -> anyhow::Result<PathBuf> {
        private(
            &self.dir,
            "client.toml",
            &format!(
                "# switchyard up --secure: connect as its client user (TLS, own inbox prefix).\n\
                 [nats]\nurl = \"{url}\"\nprefix = \"{prefix}\"\nuser = \"client\"\npassword = \"{}\"\n\
                 inbox_prefix = \"_INBOX.client\"\ntls_ca_file = \"{}\"\ntls_required = true\n",
                self.client_password,
                self.ca()
            ),
        )
    }
}
