//! Models over the bus (docs/models.md), on a real nats-server with JetStream: push
//! once, pull and serve by name with every SHA-256 checked, resume after a killed
//! fetch, and each kind of bad input refused clearly with nothing half-written
//! left in the cache. Workers and the CLI run as real processes.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;
use switchyard_procs::nats_server::{find_nats_server, NatsServer};

/// A nats-server with JetStream in `dir`.
fn jetstream(dir: &Path) -> NatsServer {
    let bin = find_nats_server("").expect("nats-server (run scripts/setup.sh)");
    NatsServer::start_jetstream(&bin, dir).expect("start nats-server -js")
}

/// `switchyard --nats URL ARGS…` to completion, with the store's cache in `cache`.
fn cli(url: &str, cache: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["--nats", url])
        .args(args)
        .env("SWITCHYARD_STORE_CACHE_DIR", cache)
        .envs(env.iter().copied())
        .output()
        .expect("run switchyard");
    eprintln!(
        "$ switchyard {}\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Entries of `dir` other than lock files (what a failed fetch may leave).
fn leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|n| !n.ends_with(".lock"))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_pushed_once_is_fetched_verified_and_served_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let server = jetstream(&dir.path().join("js"));
    let url = server.url();
    let cache = dir.path().join("cache");
    let model = demo_model();

    let push = cli(
        &url,
        &cache,
        &["models", "push", model.to_str().unwrap(), "--name", "smol"],
        &[],
    );
    assert!(push.status.success(), "{}", text(&push));
    assert!(text(&push).contains("pushed smol (gguf, 1 file"), "{}", text(&push));
    let ls = cli(&url, &cache, &["models", "ls", "--json"], &[]);
    let list: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(list[0]["name"], "smol");
    assert_eq!(list[0]["files"][0]["sha256"], sha256(&model));
    assert_eq!(list[0]["size"], std::fs::metadata(&model).unwrap().len());

    // A worker given the name fetches it (progress on stderr) and serves it under it.
    let _coordinator = coordinator_proc(&url, "coordinator");
    let cache_s = cache.to_str().unwrap().to_string();
    let worker = switchyard_with_env(
        "worker",
        &[
            "--nats",
            &url,
            "worker",
            "--worker-id",
            "w1",
            "--heartbeat-ms",
            "200",
            "--model",
            "smol",
        ],
        &[("SWITCHYARD_STORE_CACHE_DIR", &cache_s)],
    );
    worker.wait_for("fetching smol: 100%", Duration::from_secs(60));
    worker.wait_for("fetched smol from the model store", Duration::from_secs(10));
    worker.wait_for("up on", Duration::from_secs(60));
    let fetched = cache.join("smol").join(model.file_name().unwrap());
    assert_eq!(sha256(&fetched), sha256(&model));
    let client = client(&url, Duration::from_secs(30)).await;
    wait_for_workers(&client, &["w1"], Duration::from_secs(10)).await;
    let mut req = greedy("The capital of France is", 4);
    req.head.model = "smol".into();
    let done = client.generate(req).await.unwrap().collect().await.unwrap();
    assert_eq!(done.tokens.len(), 4);

    // The same digest cached: nothing moves again.
    let again = cli(&url, &cache, &["models", "pull", "smol"], &[]);
    assert!(text(&again).contains("already cached"), "{}", text(&again));
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        fetched.display().to_string()
    );

    // Pushed again: the new version replaces the old one whole.
    let push = cli(
        &url,
        &cache,
        &["models", "push", model.to_str().unwrap(), "--name", "smol"],
        &[],
    );
    assert!(push.status.success(), "{}", text(&push));
    let fresh = dir.path().join("fresh-cache");
    let pull = cli(&url, &fresh, &["models", "pull", "smol"], &[]);
    assert!(pull.status.success(), "{}", text(&pull));

    // Removed from the store: the worker's cached copy stays; ls is empty.
    let rm = cli(&url, &cache, &["models", "rm", "smol"], &[]);
    assert!(rm.status.success(), "{}", text(&rm));
    let ls = cli(&url, &cache, &["models", "ls", "--json"], &[]);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&ls.stdout).unwrap(),
        serde_json::json!([])
    );
    assert!(fetched.is_file());
    let gone = cli(&url, &cache, &["models", "pull", "smol"], &[]);
    assert!(!gone.status.success());
    assert!(text(&gone).contains("holds no model \"smol\""), "{}", text(&gone));
}

/// A Hugging Face–style directory with one large random file, so a fetch takes long
/// enough to be killed part-way.
fn big_dir(root: &Path, mb: usize) -> PathBuf {
    let dir = root.join("big");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), r#"{"model_type": "llama"}"#).unwrap();
    let mut state = 0x9e3779b97f4a7c15u64;
    let mut bytes = vec![0u8; mb << 20];
    for chunk in bytes.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_fetch_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let server = jetstream(&dir.path().join("js"));
    let url = server.url();
    let cache = dir.path().join("cache");
    let model = big_dir(dir.path(), 400);
    let push = cli(&url, &cache, &["models", "push", model.to_str().unwrap()], &[]);
    assert!(push.status.success(), "{}", text(&push));

    // Kill the first fetch once it is past a resume point (every 16 MiB).
    let cache_s = cache.to_str().unwrap().to_string();
    let mut first = switchyard_with_env(
        "pull-1",
        &["--nats", &url, "models", "pull", "big"],
        &[("SWITCHYARD_STORE_CACHE_DIR", &cache_s)],
    );
    first.wait_for("fetching big: 20%", Duration::from_secs(60));
    first.kill9();
    assert!(!cache.join("big").exists(), "a killed fetch is not in the cache");
    let partial = cache.join(".partial/big/model.safetensors");
    assert!(partial.is_file(), "the partial file stays for the next try");

    let second = cli(&url, &cache, &["models", "pull", "big"], &[]);
    assert!(second.status.success(), "{}", text(&second));
    assert!(
        text(&second).contains("resuming model.safetensors at"),
        "{}",
        text(&second)
    );
    let moved: f64 = text(&second)
        .split("fetched big (")
        .nth(1)
        .and_then(|s| s.split(" MB").next())
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(
        moved < 400.0 * 1.048_576,
        "the second fetch moved only the rest ({moved} MB)"
    );
    let got = cache.join("big/model.safetensors");
    assert_eq!(sha256(&got), sha256(&model.join("model.safetensors")));
    assert!(!cache.join(".partial/big").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_clearly_and_leaves_nothing_half_written() {
    let dir = tempfile::tempdir().unwrap();
    let server = jetstream(&dir.path().join("js"));
    let url = server.url();
    let cache = dir.path().join("cache");
    let model = demo_model();
    let m = model.to_str().unwrap();

    for bad in ["../evil", "a/b", ".hidden"] {
        let out = cli(&url, &cache, &["models", "push", m, "--name", bad], &[]);
        assert!(!out.status.success());
        assert!(text(&out).contains("model name"), "{bad}: {}", text(&out));
        let out = cli(&url, &cache, &["models", "pull", bad], &[]);
        assert!(
            !out.status.success() && text(&out).contains("model name"),
            "{}",
            text(&out)
        );
    }

    // A truncated GGUF is refused before a byte is sent.
    let cut = dir.path().join("cut.gguf");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = cli(&url, &cache, &["models", "push", cut.to_str().unwrap()], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("is truncated: tensor"), "{}", text(&out));

    // Larger than the store's limit: refused before anything is written.
    let limited = [
        ("SWITCHYARD_STORE_BUCKET", "small"),
        ("SWITCHYARD_STORE_MAX_BYTES", "50000000"),
    ];
    let out = cli(&url, &cache, &["models", "push", m, "--name", "smol"], &limited);
    assert!(!out.status.success());
    assert!(text(&out).contains("50.0 MB limit"), "{}", text(&out));
    let ls = cli(&url, &cache, &["models", "ls", "--json"], &limited);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&ls.stdout).unwrap(),
        serde_json::json!([])
    );

    // A file changed under its manifest: the fetch fails on the digest, drops what it
    // received and leaves no model in the cache.
    let push = cli(&url, &cache, &["models", "push", m, "--name", "smol"], &[]);
    assert!(push.status.success(), "{}", text(&push));
    let ls = cli(&url, &cache, &["models", "ls", "--json"], &[]);
    let list: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let object = list[0]["files"][0]["object"].as_str().unwrap().to_string();
    let nats = async_nats::connect(&url).await.unwrap();
    let store = async_nats::jetstream::new(nats)
        .get_object_store("switchyard-models")
        .await
        .unwrap();
    let mut damaged = bytes.clone();
    damaged[1000] ^= 0xff;
    store.put(object.as_str(), &mut damaged.as_slice()).await.unwrap();
    let out = cli(&url, &cache, &["models", "pull", "smol"], &[]);
    assert!(!out.status.success());
    assert!(text(&out).contains("does not match the manifest"), "{}", text(&out));
    assert!(!cache.join("smol").exists());
    assert_eq!(leftovers(&cache.join(".partial")), Vec::<String>::new());

    // Not enough room on the worker's disk: a 32 MB file system for a 98 MB model.
    let small = dir.path().join("small-disk");
    std::fs::create_dir_all(&small).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"])
        .arg(&small)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        skip(
            Skip::Fixable,
            "the full-disk case: cannot mount a tmpfs here (not root)",
        );
        return;
    }
    let push = cli(&url, &cache, &["models", "push", m, "--name", "smol"], &[]);
    assert!(push.status.success(), "{}", text(&push));
    let out = cli(&url, &small, &["models", "pull", "smol"], &[]);
    let _ = Command::new("umount").arg(&small).status();
    assert!(!out.status.success());
    assert!(text(&out).contains("not enough disk space for smol"), "{}", text(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_pushes_a_worker_only_reads() {
    let dir = tempfile::tempdir().unwrap();
    let template = std::fs::read_to_string(repo().join("docs/nats-roles.conf")).unwrap();
    std::fs::write(
        dir.path().join("secrets.conf"),
        "COORDINATOR_PASS: \"c-1\"\nWORKER_PASS: \"w-2\"\nOPERATOR_PASS: \"o-3\"\nALICE_PASS: \"a-4\"\nBOB_PASS: \"b-5\"\n",
    )
    .unwrap();
    let config = format!(
        "{template}\njetstream {{ store_dir: \"{}\" }}\n",
        dir.path().join("js").display()
    );
    let bin = find_nats_server("").unwrap();
    let server = NatsServer::start_with_config(&bin, &config, dir.path()).unwrap();
    let url = server.url();
    let cache = dir.path().join("cache");
    let as_user = |user: &'static str, pw: &'static str| {
        [
            ("SWITCHYARD_NATS_USER", user),
            ("SWITCHYARD_NATS_PASSWORD", pw),
            (
                "SWITCHYARD_NATS_INBOX_PREFIX",
                if user == "worker" {
                    "_INBOX.worker"
                } else {
                    "_INBOX.operator"
                },
            ),
        ]
    };
    let model = demo_model();
    let m = model.to_str().unwrap();

    let out = cli(
        &url,
        &cache,
        &["models", "push", m, "--name", "smol"],
        &as_user("operator", "o-3"),
    );
    assert!(out.status.success(), "{}", text(&out));
    let out = cli(&url, &cache, &["models", "pull", "smol"], &as_user("worker", "w-2"));
    assert!(out.status.success(), "the worker role reads the store: {}", text(&out));
    assert_eq!(
        sha256(&cache.join("smol").join(model.file_name().unwrap())),
        sha256(&model)
    );

    // The worker may neither overwrite nor remove a model.
    let out = cli(
        &url,
        &cache,
        &["models", "push", m, "--name", "smol"],
        &as_user("worker", "w-2"),
    );
    assert!(!out.status.success());
    assert!(text(&out).contains("Permissions Violation"), "{}", text(&out));
    let out = cli(&url, &cache, &["models", "rm", "smol"], &as_user("worker", "w-2"));
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("operator role"), "{}", text(&out));
    let out = cli(&url, &cache, &["models", "ls", "--json"], &as_user("operator", "o-3"));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list[0]["files"][0]["sha256"], sha256(&model), "the model is untouched");
    let fresh = dir.path().join("fresh-cache");
    let out = cli(&url, &fresh, &["models", "pull", "smol"], &as_user("worker", "w-2"));
    assert!(
        out.status.success(),
        "still whole after the refused writes: {}",
        text(&out)
    );
}
