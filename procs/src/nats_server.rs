//! Running a local `nats-server` on a free loopback port (used by `switchyard up`
//! and by the tests). The child is killed when the guard drops, and by the kernel
//! if this process dies first.

use anyhow::{bail, Context};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use switchyard_fabric::process::{free_port, kill_with_parent};

/// A running `nats-server` child process.
pub struct NatsServer {
    child: Child,
    port: u16,
    /// JetStream's directory when it is a private one, removed at stop.
    temp_store: Option<PathBuf>,
    /// The lock that keeps two of our servers off one JetStream directory.
    _store_lock: Option<std::fs::File>,
}

/// The cache directory: `$SWITCHYARD_CACHE`, else `~/.cache/switchyard`.
pub use switchyard_config::cache_dir;

/// Finds `nats-server`: `configured` if non-empty, `$SWITCHYARD_NATS_SERVER`, the
/// cache's `bin/`, then `PATH`.
pub fn find_nats_server(configured: &str) -> anyhow::Result<PathBuf> {
    if !configured.is_empty() {
        let p = PathBuf::from(configured);
        if !p.is_file() {
            bail!("nats.server_bin = {configured:?} does not exist");
        }
        return Ok(p);
    }
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("SWITCHYARD_NATS_SERVER") {
        candidates.push(PathBuf::from(p));
    }
    candidates.push(cache_dir().join("bin/nats-server"));
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nats-server")));
    }
    candidates
        .into_iter()
        .find(|p| p.is_file())
        .context("nats-server not found (looked at $SWITCHYARD_NATS_SERVER, ~/.cache/switchyard/bin, PATH); run scripts/setup.sh")
}

impl NatsServer {
    /// Starts `bin` on a free loopback port and waits until it accepts connections.
    pub fn start(bin: &Path) -> anyhow::Result<Self> {
        let port = free_port().context("finding a free port")?;
        Self::spawn(bin, &["-a", "127.0.0.1", "-p", &port.to_string()], port)
    }

    /// Starts `bin` on a free loopback port with JetStream (the model store) keeping
    /// its data in `dir` — or, when another of our servers holds `dir` (two
    /// `switchyard up` at once; nats-server itself does not lock it), in a private
    /// directory under it that is removed at stop.
    pub fn start_jetstream(bin: &Path, dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating JetStream directory {}", dir.display()))?;
        let (lock, store, temp) = match lock_dir(dir)? {
            Some(lock) => (lock, dir.to_path_buf(), None),
            None => {
                let private = dir.join(format!("private-{}", std::process::id()));
                std::fs::create_dir_all(&private)?;
                let lock = lock_dir(&private)?.context("locking a private JetStream directory")?;
                (lock, private.clone(), Some(private))
            }
        };
        let port = free_port().context("finding a free port")?;
        let store_arg = store.display().to_string();
        let mut server = Self::spawn(
            bin,
            &["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd", &store_arg],
            port,
        )?;
        server.temp_store = temp;
        server._store_lock = Some(lock);
        Ok(server)
    }

    /// JetStream's data directory when it is private to this server (see
    /// [`Self::start_jetstream`]).
    pub fn private_store(&self) -> Option<&Path> {
        self.temp_store.as_deref()
    }

    /// Starts `bin` on loopback `port` (e.g. to bring a stopped server back where
    /// clients expect it).
    pub fn start_on(bin: &Path, port: u16) -> anyhow::Result<Self> {
        Self::spawn(bin, &["-a", "127.0.0.1", "-p", &port.to_string()], port)
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Starts `bin -c DIR/nats.conf` on a free loopback port, the file holding
    /// `listen` and then `config` (authorization, accounts, TLS … as nats-server's
    /// configuration format has them). Waits until it listens.
    pub fn start_with_config(bin: &Path, config: &str, dir: &Path) -> anyhow::Result<Self> {
        let port = free_port().context("finding a free port")?;
        let file = dir.join("nats.conf");
        std::fs::write(&file, format!("listen: 127.0.0.1:{port}\n{config}\n"))
            .with_context(|| format!("writing {}", file.display()))?;
        Self::spawn(bin, &["-c", &file.display().to_string()], port)
    }

    fn spawn(bin: &Path, args: &[&str], port: u16) -> anyhow::Result<Self> {
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        kill_with_parent(&mut cmd);
        let child = cmd.spawn().with_context(|| format!("starting {}", bin.display()))?;
        let mut server = Self {
            child,
            port,
            temp_store: None,
            _store_lock: None,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                // Keep draining its log so a chatty server never blocks on the pipe.
                if let Some(err) = server.child.stderr.take() {
                    std::thread::spawn(move || std::io::copy(&mut { err }, &mut std::io::sink()));
                }
                return Ok(server);
            }
            if let Some(status) = server.child.try_wait()? {
                let mut log = String::new();
                if let Some(mut err) = server.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut err, &mut log);
                }
                bail!("nats-server exited at start-up with {status}: {}", log.trim());
            }
            if Instant::now() > deadline {
                bail!("nats-server did not listen on port {port} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nats://127.0.0.1:{port}`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(dir) = &self.temp_store {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// An exclusive lock on `dir/.switchyard.lock`, or `None` when another process
/// holds it.
fn lock_dir(dir: &Path) -> anyhow::Result<Option<std::fs::File>> {
    let path = dir.join(".switchyard.lock");
    switchyard_fabric::process::lock_file(&path, false).with_context(|| format!("locking {}", path.display()))
}
