//! Putting a model into the store: each file becomes one object-store object,
//! written chunk by chunk with several acknowledgements in flight, hashed as it
//! goes; the manifest follows. A push that fails removes what it wrote; one that
//! was killed leaves a marker that the next push or `rm` of the name cleans up.

use crate::{manifest, FileEntry, Manifest, Progress, Store};
use anyhow::{bail, Context as _};
use async_nats::jetstream::object_store::{ObjectInfo, ObjectOptions, ObjectStore};
use async_nats::HeaderMap;
use base64::Engine as _;
use futures::StreamExt;
use sha2::{Digest, Sha256};
use std::collections::VecDeque;
use std::path::PathBuf;
use tokio::io::AsyncReadExt;

/// Chunks whose acknowledgement may be outstanding at once.
const IN_FLIGHT: usize = 32;

/// What to push.
pub struct Upload {
    /// The model's name in the store.
    pub name: String,
    /// `gguf` or `hf`.
    pub format: String,
    /// What a worker serves, relative to the model directory ("" = the directory).
    pub entry: String,
    /// (path inside the model, file on disk), sorted by path.
    pub files: Vec<(String, PathBuf)>,
}

/// Marks a push in progress: `{name}/{push id}/.pushing`, holding the chunk
/// subjects' ids, so an interrupted push can be cleaned up.
const MARKER: &str = ".pushing";

impl Store {
    /// Pushes a model; replaces a model of the same name once the new one is whole.
    pub async fn push(&self, upload: Upload, progress: &mut Progress) -> anyhow::Result<Manifest> {
        self.push_inner(upload, progress).await.map_err(crate::write_hint)
    }

    async fn push_inner(&self, upload: Upload, progress: &mut Progress) -> anyhow::Result<Manifest> {
        crate::name::validate(&upload.name)?;
        let mut sizes = Vec::new();
        for (path, file) in &upload.files {
            manifest::check_path(path)?;
            sizes.push(
                std::fs::metadata(file)
                    .with_context(|| format!("reading {}", file.display()))?
                    .len(),
            );
        }
        let total: u64 = sizes.iter().sum();
        let os = self.open_or_create().await?;
        // Leftovers of an interrupted push of this name go first (the current version
        // stays until the new manifest replaces it).
        let current = crate::read_manifest(&os, &upload.name).await?;
        let keep: Vec<&str> = current
            .iter()
            .flat_map(|m| m.files.iter().map(|f| f.object.as_str()))
            .collect();
        // The version being replaced goes once the new one is in: it does not count.
        let replaced = current.as_ref().map_or(0, |m| m.size);
        self.check_room(&upload.name, total, replaced).await?;
        delete_prefix(
            &os,
            self.bucket(),
            &format!("{}/", upload.name),
            Some(&self.stream().await?),
            &keep,
        )
        .await?;

        let push_id = nuid::next().to_string();
        let chunk_ids: Vec<String> = (0..upload.files.len()).map(|_| nuid::next().to_string()).collect();
        let marker = format!("{}/{push_id}/{MARKER}", upload.name);
        os.put(marker.as_str(), &mut chunk_ids.join("\n").as_bytes())
            .await
            .context("writing the push marker")?;
        match self.push_files(&upload, &push_id, &chunk_ids, progress).await {
            Ok(files) => {
                let m = Manifest {
                    name: upload.name.clone(),
                    format: upload.format.clone(),
                    entry: upload.entry.clone(),
                    size: files.iter().map(|f| f.size).sum(),
                    digest: Manifest::digest_of(&files),
                    files,
                    pushed_by: pushed_by(),
                    pushed_at: std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_secs())
                        .unwrap_or(0),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                };
                let json = serde_json::to_vec_pretty(&m)?;
                os.put(upload.name.as_str(), &mut json.as_slice())
                    .await
                    .map_err(|e| self.publish_error(e.to_string(), &upload.name))?;
                let _ = os.delete(&marker).await;
                // The previous version's objects (the new manifest no longer names them).
                let keep: Vec<&str> = m.files.iter().map(|f| f.object.as_str()).collect();
                delete_other(&os, &format!("{}/", upload.name), &keep).await?;
                progress.finish();
                Ok(m)
            }
            Err(e) => {
                let stream = self.stream().await?;
                for id in &chunk_ids {
                    let _ = stream.purge().filter(self.chunk_subject(id)).await;
                }
                let _ = delete_other(&os, &format!("{}/{push_id}/", upload.name), &[]).await;
                Err(e)
            }
        }
    }

    async fn push_files(
        &self,
        upload: &Upload,
        push_id: &str,
        chunk_ids: &[String],
        progress: &mut Progress,
    ) -> anyhow::Result<Vec<FileEntry>> {
        let mut out = Vec::new();
        for ((path, file), id) in upload.files.iter().zip(chunk_ids) {
            let object = format!("{}/{push_id}/{path}", upload.name);
            let (size, sha256) = self
                .put_file(&object, id, file, progress)
                .await
                .with_context(|| format!("pushing {}", file.display()))?;
            out.push(FileEntry {
                path: path.clone(),
                size,
                sha256,
                object,
            });
        }
        Ok(out)
    }

    fn chunk_subject(&self, id: &str) -> String {
        format!("$O.{}.C.{id}", self.bucket())
    }

    pub(crate) async fn stream(&self) -> anyhow::Result<async_nats::jetstream::stream::Stream> {
        self.js
            .get_stream(format!("OBJ_{}", self.bucket()))
            .await
            .context("opening the model store's stream")
    }

    /// One file as one object, in the object store's own format: chunks on
    /// `$O.{bucket}.C.{id}`, then its info on `$O.{bucket}.M.{base64(name)}`.
    async fn put_file(
        &self,
        object: &str,
        id: &str,
        file: &std::path::Path,
        progress: &mut Progress,
    ) -> anyhow::Result<(u64, String)> {
        let chunk = self.config.chunk_bytes as usize;
        let subject = self.chunk_subject(id);
        let mut reader = tokio::fs::File::open(file).await?;
        let mut sha = Sha256::new();
        let (mut size, mut chunks) = (0u64, 0usize);
        let mut acks = VecDeque::new();
        loop {
            let mut buf = Vec::with_capacity(chunk);
            while buf.len() < chunk {
                let n = (&mut reader)
                    .take((chunk - buf.len()) as u64)
                    .read_to_end(&mut buf)
                    .await?;
                if n == 0 {
                    break;
                }
            }
            if buf.is_empty() {
                break;
            }
            sha.update(&buf);
            size += buf.len() as u64;
            chunks += 1;
            let n = buf.len() as u64;
            let ack = self
                .js
                .publish(subject.clone(), buf.into())
                .await
                .map_err(|e| self.publish_error(e.to_string(), object))?;
            acks.push_back(ack);
            if acks.len() >= IN_FLIGHT {
                let ack = acks.pop_front().expect("non-empty");
                ack.await.map_err(|e| self.publish_error(e.to_string(), object))?;
            }
            progress.advance(n);
        }
        for ack in acks {
            ack.await.map_err(|e| self.publish_error(e.to_string(), object))?;
        }
        let digest = sha.finalize();
        let info = ObjectInfo {
            name: object.to_string(),
            description: None,
            metadata: Default::default(),
            headers: None,
            options: Some(ObjectOptions {
                link: None,
                max_chunk_size: Some(chunk),
            }),
            bucket: self.bucket().to_string(),
            nuid: id.to_string(),
            size: size as usize,
            chunks,
            modified: Some(time::OffsetDateTime::now_utc()),
            digest: Some(format!(
                "SHA-256={}",
                base64::engine::general_purpose::URL_SAFE.encode(digest)
            )),
            deleted: false,
        };
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Rollup", "sub");
        let meta = format!(
            "$O.{}.M.{}",
            self.bucket(),
            base64::engine::general_purpose::URL_SAFE.encode(object)
        );
        self.js
            .publish_with_headers(meta, headers, serde_json::to_vec(&info)?.into())
            .await
            .map_err(|e| self.publish_error(e.to_string(), object))?
            .await
            .map_err(|e| self.publish_error(e.to_string(), object))?;
        Ok((size, manifest::hex(&digest)))
    }

    /// A publish refused by the server, said plainly.
    fn publish_error(&self, error: String, what: &str) -> anyhow::Error {
        if error.contains("maximum bytes") || error.contains("insufficient resources") {
            anyhow::anyhow!(
                "the model store is full writing {what} ({error}): remove models (`switchyard models rm`) or raise the bucket's or the server's JetStream limit"
            )
        } else if error.contains("ermission") || error.contains("timed out") {
            anyhow::anyhow!(
                "the model store did not take {what} ({error}): pushing needs a user allowed to write to it (the operator role of docs/nats-roles.conf), and JetStream must keep up"
            )
        } else {
            anyhow::anyhow!("writing {what} to the model store: {error}")
        }
    }

    /// Refuses a push that cannot fit in the bucket's limit before a byte is sent.
    async fn check_room(&self, name: &str, total: u64, replaced: u64) -> anyhow::Result<()> {
        let mut stream = self.stream().await?;
        let info = stream.info().await.context("reading the model store's limits")?;
        let limit = info.config.max_bytes;
        if limit > 0 && info.state.bytes.saturating_sub(replaced) + total > limit as u64 {
            bail!(
                "{name} is {:.1} MB but the model store (bucket {}) holds {:.1} of its {:.1} MB limit: remove models \
                 (`switchyard models rm`) or raise the limit (store.max_bytes when the bucket is created)",
                total as f64 / 1e6,
                self.bucket(),
                info.state.bytes as f64 / 1e6,
                limit as f64 / 1e6
            );
        }
        Ok(())
    }
}

/// Deletes every object whose name starts with `prefix`; with the stream, first
/// purges the chunks that interrupted pushes' markers name.
pub(crate) async fn delete_prefix(
    os: &ObjectStore,
    bucket: &str,
    prefix: &str,
    stream: Option<&async_nats::jetstream::stream::Stream>,
    keep: &[&str],
) -> anyhow::Result<()> {
    if let Some(stream) = stream {
        for name in names_under(os, prefix).await? {
            if name.ends_with(&format!("/{MARKER}")) {
                let mut ids = Vec::new();
                if let Ok(mut o) = os.get(&name).await {
                    let mut text = String::new();
                    let _ = o.read_to_string(&mut text).await;
                    ids = text.lines().map(str::to_string).collect();
                }
                for id in ids {
                    let _ = stream.purge().filter(format!("$O.{bucket}.C.{id}")).await;
                }
            }
        }
    }
    delete_other(os, prefix, keep).await
}

/// Deletes the objects under `prefix` that are not in `keep`.
async fn delete_other(os: &ObjectStore, prefix: &str, keep: &[&str]) -> anyhow::Result<()> {
    for name in names_under(os, prefix).await? {
        if !keep.contains(&name.as_str()) {
            os.delete(&name).await.with_context(|| format!("deleting {name}"))?;
        }
    }
    Ok(())
}

async fn names_under(os: &ObjectStore, prefix: &str) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut list = os.list().await.context("listing the model store")?;
    while let Some(info) = list.next().await {
        let info = info.context("listing the model store")?;
        if info.name.starts_with(prefix) {
            out.push(info.name);
        }
    }
    Ok(out)
}

/// `user@host` of this process.
fn pushed_by() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        // SAFETY: getuid cannot fail.
        .unwrap_or_else(|_| format!("uid{}", unsafe { libc::getuid() }));
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let host = match unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } {
        0 => String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap_or(buf.len())]).to_string(),
        _ => "unknown".into(),
    };
    format!("{user}@{host}")
}
