//! Fetching a model into this machine's cache.
//!
//! `{cache}/{name}/` is complete and verified or absent: files land in
//! `{cache}/.partial/{name}/` and the directory is renamed into place after every
//! SHA-256 matched, with the manifest inside (`.switchyard-manifest.json`). Each file
//! keeps a resume point (`.partial/{name}/.resume/{path}.json`: the object's id, the
//! bytes on disk, the next stream sequence) written after the bytes are written, so a
//! fetch killed mid-way, or cut by a NATS failover, carries on where it stopped. One
//! fetch per model per machine at a time (`.partial/{name}.lock`).

use crate::{manifest, FileEntry, Manifest, Progress, Store};
use anyhow::{bail, Context as _};
use async_nats::jetstream::consumer::push::OrderedConfig;
use async_nats::jetstream::consumer::DeliverPolicy;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The manifest's name inside a cached model's directory.
pub const MANIFEST_FILE: &str = ".switchyard-manifest.json";
/// Bytes between resume points.
const CHECKPOINT: u64 = 16 << 20;
/// How long without a chunk before the fetch looks at whether the object is still
/// there; three in a row end it (the partial file stays for the next try).
const STALL: Duration = Duration::from_secs(20);
/// Tries per file when the connection or the consumer is lost part-way.
const ATTEMPTS: u32 = 5;

/// Whether another try can mend `e` (not a digest, a full disk or a model that
/// changed).
fn retriable(e: &anyhow::Error) -> bool {
    let text = format!("{e:#}");
    let io_full = e
        .chain()
        .any(|c| c.downcast_ref::<std::io::Error>().and_then(|io| io.raw_os_error()) == Some(libc::ENOSPC));
    !io_full
        && !["SHA-256", "replaced or removed", "more of", "has lost", "manifest says"]
            .iter()
            .any(|s| text.contains(s))
}

/// A model ready on disk.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// What a worker serves: the GGUF file or the model directory.
    pub path: PathBuf,
    /// The model's manifest.
    pub manifest: Manifest,
    /// Bytes moved over NATS by this call (0 when the cache already had it).
    pub fetched_bytes: u64,
}

/// Where a file's fetch stands, saved beside the partial file.
#[derive(Debug, Serialize, Deserialize)]
struct ResumePoint {
    nuid: String,
    bytes: u64,
    next_seq: u64,
}

/// The cached copy of `name` under `cache`, if one is complete.
pub fn cached(cache: &Path, name: &str) -> Option<Fetched> {
    let dir = cache.join(name);
    let text = std::fs::read(dir.join(MANIFEST_FILE)).ok()?;
    let manifest: Manifest = serde_json::from_slice(&text).ok()?;
    manifest.check().ok()?;
    let whole = manifest.files.iter().all(|f| {
        std::fs::metadata(dir.join(&f.path))
            .map(|m| m.len() == f.size)
            .unwrap_or(false)
    });
    whole.then(|| Fetched {
        path: dir.join(&manifest.entry),
        manifest,
        fetched_bytes: 0,
    })
}

impl Store {
    /// Makes `name` ready in the cache (`store.cache_dir`): nothing moves when the
    /// cached copy has the store's digest; otherwise it is fetched (resuming what a
    /// previous try left), every file's SHA-256 checked, and put in place.
    pub async fn fetch(&self, name: &str, quiet: bool) -> anyhow::Result<Fetched> {
        crate::name::validate(name)?;
        let cache = self.config.cache_path();
        let Some(m) = self.manifest(name).await? else {
            bail!("the model store holds no model {name:?} (`switchyard models ls` lists what it holds)");
        };
        m.check()?;
        if let Some(c) = cached(&cache, name).filter(|c| c.manifest.digest == m.digest) {
            return Ok(c);
        }
        let partial_root = cache.join(".partial");
        std::fs::create_dir_all(&partial_root).with_context(|| format!("creating {}", partial_root.display()))?;
        let _lock = lock(partial_root.join(format!("{name}.lock"))).await?;
        // Another process may have finished it while this one waited for the lock.
        if let Some(c) = cached(&cache, name).filter(|c| c.manifest.digest == m.digest) {
            return Ok(c);
        }
        let partial = partial_root.join(name);
        let mut progress = Progress::new(format!("fetching {name}"), m.size);
        if quiet {
            progress = progress.quiet();
        }
        let have: u64 = m.files.iter().map(|f| on_disk(&partial, f)).sum();
        let free = free_bytes(&partial_root).unwrap_or(u64::MAX);
        if m.size - have.min(m.size) > free {
            bail!(
                "not enough disk space for {name} in {}: {:.1} MB more needed, {:.1} MB free",
                cache.display(),
                (m.size - have) as f64 / 1e6,
                free as f64 / 1e6
            );
        }
        for f in &m.files {
            let before = progress.done();
            let mut attempt = 1;
            let result = loop {
                match self.fetch_file(&partial, f, &mut progress).await {
                    // A NATS failover or a lost consumer: carry on from the resume point.
                    Err(e) if attempt < ATTEMPTS && retriable(&e) => {
                        eprintln!("fetching {name}: {e:#}; trying again ({}/{ATTEMPTS})", attempt + 1);
                        attempt += 1;
                        progress.reset_to(before);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    r => break r,
                }
            };
            if let Err(e) = result {
                let full = e
                    .chain()
                    .any(|c| c.downcast_ref::<std::io::Error>().and_then(|io| io.raw_os_error()) == Some(libc::ENOSPC));
                if full || e.to_string().contains("SHA-256") {
                    // Nothing half-written stays behind after an error that a retry cannot mend.
                    let _ = std::fs::remove_dir_all(&partial);
                }
                if full {
                    bail!("disk full in {} while fetching {name}: {e:#}", cache.display());
                }
                return Err(e.context(format!("fetching {name}")));
            }
        }
        progress.finish();
        let _ = std::fs::remove_dir_all(partial.join(".resume"));
        std::fs::write(partial.join(MANIFEST_FILE), serde_json::to_vec_pretty(&m)?)?;
        let dir = cache.join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).with_context(|| format!("replacing {}", dir.display()))?;
        }
        std::fs::rename(&partial, &dir).with_context(|| format!("moving the fetched model to {}", dir.display()))?;
        Ok(Fetched {
            path: dir.join(&m.entry),
            fetched_bytes: progress.done() - have,
            manifest: m,
        })
    }

    async fn fetch_file(&self, dir: &Path, f: &FileEntry, progress: &mut Progress) -> anyhow::Result<()> {
        let os = self.open().await?;
        let info = match os.info(&f.object).await {
            Ok(i) => i,
            Err(e) if e.kind() == async_nats::jetstream::object_store::InfoErrorKind::NotFound => {
                bail!("the store has lost {} (push the model again)", f.path)
            }
            Err(e) => return Err(anyhow::Error::new(e).context(format!("looking up {} in the store", f.path))),
        };
        if info.size as u64 != f.size {
            bail!(
                "the store's {} is {} bytes, the manifest says {}: the model was changed under its manifest (push it again)",
                f.path,
                info.size,
                f.size
            );
        }
        let path = dir.join(&f.path);
        let resume_file = dir.join(".resume").join(format!("{}.json", f.path));
        for p in [&path, &resume_file] {
            std::fs::create_dir_all(p.parent().expect("has a parent"))?;
        }
        let point = std::fs::read(&resume_file)
            .ok()
            .and_then(|b| serde_json::from_slice::<ResumePoint>(&b).ok())
            .filter(|p| p.nuid == info.nuid && p.bytes <= file_len(&path));
        let (mut bytes, next_seq) = point.as_ref().map_or((0, 0), |p| (p.bytes, p.next_seq));
        // What is already there (resumed) is hashed again; that is cheaper than trusting it.
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        file.set_len(bytes)?;
        std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0))?;
        let sha = hash_prefix(&path, bytes).await?;
        let resumed_at = bytes;
        progress.skip(bytes);
        if bytes > 0 && bytes < f.size {
            tracing::info!(file = %f.path, bytes, "resuming a partial fetch");
            eprintln!("resuming {} at {:.1} MB", f.path, bytes as f64 / 1e6);
        }
        let mut out = crate::sink::FileSink::new(file, sha);
        if bytes < f.size {
            let stream = self.stream().await?;
            let mut messages = stream
                .create_consumer(OrderedConfig {
                    deliver_subject: self.client.new_inbox(),
                    filter_subject: format!("$O.{}.C.{}", self.bucket(), info.nuid),
                    deliver_policy: match next_seq {
                        0 => DeliverPolicy::All,
                        s => DeliverPolicy::ByStartSequence { start_sequence: s },
                    },
                    ..Default::default()
                })
                .await
                .context("starting to read the model from the store")?
                .messages()
                .await
                .context("starting to read the model from the store")?;
            let (mut stalls, mut since_checkpoint, mut last_seq) = (0, 0u64, 0u64);
            while bytes < f.size {
                let message = match tokio::time::timeout(STALL, messages.next()).await {
                    Ok(Some(Ok(m))) => m,
                    Ok(Some(Err(e))) => {
                        // Keep what arrived for the next try.
                        if last_seq > 0 && out.sync().await.is_ok() {
                            let point = ResumePoint {
                                nuid: info.nuid.clone(),
                                bytes,
                                next_seq: last_seq + 1,
                            };
                            let _ = save(&resume_file, &point);
                        }
                        return Err(anyhow::Error::new(e).context("reading the model from the store"));
                    }
                    Ok(None) => bail!("the store's stream of {} ended early", f.path),
                    Err(_) => {
                        stalls += 1;
                        match os.info(&f.object).await {
                            Ok(i) if i.nuid == info.nuid && !i.deleted => {}
                            _ => bail!("{} was replaced or removed in the store while it was fetched", f.path),
                        }
                        if stalls == 3 {
                            bail!("no data from the store for {} s", (STALL * 3).as_secs());
                        }
                        continue;
                    }
                };
                stalls = 0;
                let seq = message.info().map(|i| i.stream_sequence).unwrap_or(0);
                last_seq = seq;
                let n = message.payload.len() as u64;
                if bytes + n > f.size {
                    bail!("the store sent more of {} than its {} bytes", f.path, f.size);
                }
                out.write(message.payload.clone()).await?;
                bytes += n;
                since_checkpoint += n;
                progress.advance(n);
                if since_checkpoint >= CHECKPOINT && bytes < f.size {
                    since_checkpoint = 0;
                    // Saved by the writer once the bytes before it are in the kernel's
                    // hands: a killed process resumes there. After a power cut the
                    // bytes may not be, and the file's SHA-256 check catches that.
                    let (resume_file, point) = (
                        resume_file.clone(),
                        ResumePoint {
                            nuid: info.nuid.clone(),
                            bytes,
                            next_seq: seq + 1,
                        },
                    );
                    out.then(move || save(&resume_file, &point).map_err(std::io::Error::other))
                        .await?;
                }
            }
        }
        let got = manifest::hex(&out.finish().await?);
        let _ = std::fs::remove_file(&resume_file);
        if got != f.sha256 {
            let _ = std::fs::remove_file(&path);
            if resumed_at > 0 {
                // The kept bytes were not all on disk (a power cut after a resume
                // point): the next try starts the file over.
                bail!(
                    "the copy of {} resumed at {resumed_at} bytes did not verify; fetching it whole again",
                    f.path
                );
            }
            bail!(
                "SHA-256 of {} does not match the manifest: expected {}, received {got} (the file was dropped; the store's copy is damaged or was replaced — push the model again)",
                f.path,
                f.sha256
            );
        }
        Ok(())
    }
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// Bytes of `f` a previous try left with a resume point.
fn on_disk(partial: &Path, f: &FileEntry) -> u64 {
    std::fs::read(partial.join(".resume").join(format!("{}.json", f.path)))
        .ok()
        .and_then(|b| serde_json::from_slice::<ResumePoint>(&b).ok())
        .map_or(0, |p| p.bytes.min(f.size))
}

/// SHA-256 state after the first `n` bytes of `path`.
async fn hash_prefix(path: &Path, n: u64) -> anyhow::Result<Sha256> {
    let path = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut sha = Sha256::new();
        let mut file = std::fs::File::open(&path)?.take(n);
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = file.read(&mut buf)?;
            if k == 0 {
                break;
            }
            sha.update(&buf[..k]);
        }
        Ok(sha)
    })
    .await?
}

/// Writes a resume point so that a crash leaves the old one or the new one.
fn save(path: &Path, point: &ResumePoint) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec(point)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Bytes free for this user on the file system holding `dir`.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated and s is a valid statvfs to fill.
    match unsafe { libc::statvfs(c.as_ptr(), &mut s) } {
        0 => Some(s.f_bavail as u64 * s.f_frsize as u64),
        _ => None,
    }
}

/// An exclusive lock on `path` (created if missing), held until dropped; waits
/// for another process's fetch of the same model.
async fn lock(path: PathBuf) -> anyhow::Result<std::fs::File> {
    tokio::task::spawn_blocking(move || {
        switchyard_fabric::process::lock_file(&path, true)
            .with_context(|| format!("locking {}", path.display()))?
            .context("no lock")
    })
    .await?
}
