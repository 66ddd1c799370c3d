//! # switchyard-store — models that travel over the bus
//!
//! A model is pushed once into NATS JetStream's object store (bucket
//! `store.bucket`, stream `OBJ_{bucket}`) and every worker that is told to serve it
//! by name fetches it into its cache, checks every file's SHA-256 and serves it.
//! The bytes are plain object-store objects (`nats object get` reads them too).
//!
//! ## Layout
//! - [`name`]: what a model name may be (no `/`, no `..`).
//! - [`manifest`]: [`Manifest`], the JSON object named after the model, written
//!   last: a model without one is invisible, so an interrupted push never shows.
//! - [`Store`] (here): opening the bucket, listing, removing.
//! - `push`: files → chunks (pipelined acks), one object per file under
//!   `{name}/{push id}/{path}`, then the manifest, then the previous version's objects
//!   go.
//! - `fetch`: the cache (`{cache}/{name}/`, complete and verified, or absent), the
//!   partial area (`{cache}/.partial/{name}/`) a crashed or failed-over fetch resumes
//!   from, the per-model lock, the disk-space check.
//! - [`sink`]: writing and hashing a received file on a thread of its own.
//! - `progress`: a bar on a terminal, periodic lines otherwise.

pub mod manifest;
pub mod name;

pub mod fetch;
mod progress;
mod push;
pub mod sink;

pub use fetch::Fetched;
pub use manifest::{FileEntry, Manifest};
pub use progress::Progress;
pub use push::Upload;

use anyhow::{bail, Context as _};
use async_nats::jetstream::{self, object_store::ObjectStore};
use futures::StreamExt;
use switchyard_config::StoreConfig;
use tokio::io::AsyncReadExt;

/// The fleet's model store: one object-store bucket on a NATS connection.
pub struct Store {
    js: jetstream::Context,
    client: async_nats::Client,
    config: StoreConfig,
}

impl Store {
    /// The store of `config.bucket` on this connection (nothing is asked of the
    /// server yet).
    pub fn new(client: async_nats::Client, config: &StoreConfig) -> Self {
        Self {
            js: jetstream::new(client.clone()),
            client,
            config: config.clone(),
        }
    }

    /// The bucket's name.
    pub fn bucket(&self) -> &str {
        &self.config.bucket
    }

    /// The bucket, or a message that says why not (no JetStream, no bucket yet).
    async fn open(&self) -> anyhow::Result<ObjectStore> {
        match self.js.get_object_store(&self.config.bucket).await {
            Ok(os) => Ok(os),
            Err(e) => Err(self.explain(e.to_string()).await),
        }
    }

    /// The bucket, created (with `store.replicas` and `store.max_bytes`) if missing.
    async fn open_or_create(&self) -> anyhow::Result<ObjectStore> {
        if let Ok(os) = self.js.get_object_store(&self.config.bucket).await {
            return Ok(os);
        }
        let config = jetstream::object_store::Config {
            bucket: self.config.bucket.clone(),
            description: Some("switchyard models (switchyard models push)".into()),
            max_bytes: match self.config.max_bytes {
                0 => -1,
                n => n as i64,
            },
            num_replicas: self.config.replicas as usize,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        };
        match self.js.create_object_store(config).await {
            Ok(os) => Ok(os),
            Err(e) => {
                let text = format!("{e:#}");
                let source = std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default();
                if source.contains("insufficient resources") || source.contains("replicas") {
                    bail!(
                        "creating bucket {} with {} replicas: {source} (store.replicas must not exceed the JetStream servers in the cluster)",
                        self.config.bucket,
                        self.config.replicas
                    );
                }
                Err(self.explain(format!("{text}: {source}")).await)
            }
        }
    }

    /// Turns an object-store error into what to do about it.
    async fn explain(&self, error: String) -> anyhow::Error {
        match self.js.query_account().await {
            Err(e) if e.to_string().contains("timed out") => anyhow::anyhow!(
                "no answer from JetStream ({e}): it is not enabled on this NATS server (start nats-server with -js; \
                 `switchyard up` does), or this user may not use the model store (workers need nats.inbox_prefix = \
                 \"_INBOX.worker\" and the worker role of docs/nats-roles.conf)"
            ),
            Err(e) => anyhow::anyhow!(
                "JetStream is not available on this NATS server ({e}): start nats-server with -js \
                 (`switchyard up` does), or enable jetstream in its configuration (deploy/)"
            ),
            Ok(_) if error.contains("not found") => anyhow::anyhow!(
                "the store holds no models yet (no bucket {}); put one there with `switchyard models push PATH`",
                self.config.bucket
            ),
            Ok(_) => anyhow::anyhow!("opening the model store (bucket {}): {error}", self.config.bucket),
        }
    }

    /// Every model the store holds, by name.
    pub async fn list(&self) -> anyhow::Result<Vec<Manifest>> {
        let os = match self.open().await {
            Ok(os) => os,
            Err(e) if e.to_string().contains("holds no models yet") => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut names = Vec::new();
        let mut list = os.list().await.context("listing the model store")?;
        while let Some(info) = list.next().await {
            let info = info.context("listing the model store")?;
            if !info.name.contains('/') {
                names.push(info.name);
            }
        }
        let mut out = Vec::new();
        for name in names {
            if let Some(m) = read_manifest(&os, &name).await? {
                out.push(m);
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The manifest of `name`, if the store holds it.
    pub async fn manifest(&self, name: &str) -> anyhow::Result<Option<Manifest>> {
        name::validate(name)?;
        let os = match self.open().await {
            Ok(os) => os,
            Err(e) if e.to_string().contains("holds no models yet") => return Ok(None),
            Err(e) => return Err(e),
        };
        read_manifest(&os, name).await
    }

    /// Removes `name` (its manifest first, so it disappears at once, then its files).
    pub async fn remove(&self, name: &str) -> anyhow::Result<Manifest> {
        name::validate(name)?;
        let os = self.open().await?;
        let Some(manifest) = read_manifest(&os, name).await? else {
            bail!("the store holds no model {name:?}");
        };
        os.delete(name)
            .await
            .map_err(|e| write_hint(anyhow::Error::new(e).context(format!("removing {name}"))))?;
        push::delete_prefix(
            &os,
            self.bucket(),
            &format!("{name}/"),
            Some(&self.stream().await?),
            &[],
        )
        .await?;
        Ok(manifest)
    }
}

/// A write the server did not answer is most often one this user may not make:
/// says so beside the error.
pub(crate) fn write_hint(e: anyhow::Error) -> anyhow::Error {
    match format!("{e:#}").contains("timed out") {
        true => e.context(
            "the model store did not answer a write: a user that may write to it is needed (the operator role of \
             docs/nats-roles.conf; see the server's \"Permissions Violation\" above), and JetStream must keep up",
        ),
        false => e,
    }
}

/// Reads a manifest object; `None` if there is none by that name.
pub(crate) async fn read_manifest(os: &ObjectStore, name: &str) -> anyhow::Result<Option<Manifest>> {
    let mut object = match os.get(name).await {
        Ok(o) => o,
        Err(e) if e.kind() == jetstream::object_store::GetErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("reading the manifest of {name}"))),
    };
    if object.info.size > manifest::MAX_BYTES {
        bail!(
            "the manifest of {name} is {} bytes; not a switchyard manifest",
            object.info.size
        );
    }
    let mut bytes = Vec::new();
    object
        .read_to_end(&mut bytes)
        .await
        .with_context(|| format!("reading the manifest of {name}"))?;
    let m: Manifest = serde_json::from_slice(&bytes)
        .with_context(|| format!("the manifest of {name} is not a switchyard manifest"))?;
    Ok(Some(m))
}
