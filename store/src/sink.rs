//! Writing a received file on a thread of its own: the task that reads from the
//! network hands over each chunk (no copy) and goes back to reading, while this
//! thread hashes and writes. Both the store's fetch and `bench pull`'s HTTP peer
//! use it, so their comparison is the transport's.

use bytes::Bytes;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::sync::mpsc;

/// Chunks queued for the writer thread before a sender waits (back-pressure).
const QUEUE: usize = 64;

enum Op {
    Data(Bytes),
    /// Flush and fsync, then answer.
    Sync(tokio::sync::oneshot::Sender<std::io::Result<()>>),
    /// Hand what is buffered to the kernel, then run the closure (no fsync, no
    /// wait for the sender).
    Then(Box<dyn FnOnce() -> std::io::Result<()> + Send>),
}

/// A file being written and hashed by its own thread.
pub struct FileSink {
    tx: Option<mpsc::SyncSender<Op>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<[u8; 32]>>>,
}

impl FileSink {
    /// Appends to `file` (positioned at its end), continuing the hash state `sha`
    /// of what it already holds.
    pub fn new(file: std::fs::File, sha: Sha256) -> Self {
        let (tx, rx) = mpsc::sync_channel::<Op>(QUEUE);
        let thread = std::thread::spawn(move || {
            let mut sha = sha;
            // Chunks of 256 KiB or more (the store's) go to the file without a copy into the
            // buffer; smaller ones (HTTP's) are gathered into writes of that size.
            let mut out = std::io::BufWriter::with_capacity(256 << 10, file);
            while let Ok(op) = rx.recv() {
                match op {
                    Op::Data(b) => {
                        sha.update(&b);
                        out.write_all(&b)?;
                    }
                    Op::Then(f) => {
                        out.flush()?;
                        if let Err(e) = f() {
                            tracing::warn!(error = %e, "after writing a received file's bytes");
                        }
                    }
                    Op::Sync(done) => {
                        let r = out.flush().and_then(|_| out.get_ref().sync_data());
                        let failed = r.is_err();
                        let _ = done.send(r);
                        if failed {
                            return Err(std::io::Error::other("sync failed"));
                        }
                    }
                }
            }
            out.flush()?;
            out.get_ref().sync_all()?;
            Ok(sha.finalize().into())
        });
        Self {
            tx: Some(tx),
            thread: Some(thread),
        }
    }

    /// Queues a chunk; waits (off the async threads) only when the queue is full.
    pub async fn write(&mut self, b: Bytes) -> std::io::Result<()> {
        let tx = self.tx.as_ref().expect("open").clone();
        let op = Op::Data(b);
        let op = match tx.try_send(op) {
            Ok(()) => return Ok(()),
            Err(mpsc::TrySendError::Full(op)) => op,
            Err(mpsc::TrySendError::Disconnected(_)) => return Err(self.failure()),
        };
        match tokio::task::spawn_blocking(move || tx.send(op)).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(self.failure()),
        }
    }

    /// Everything queued so far is on disk when this returns.
    pub async fn sync(&mut self) -> std::io::Result<()> {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.write_op(Op::Sync(done)).await?;
        wait.await.map_err(|_| self.failure())?
    }

    /// Runs `f` on the writer thread once everything queued so far has been handed
    /// to the kernel (it survives this process, not a power cut; no fsync). Does not
    /// wait: the caller goes on receiving. An error of `f` is logged.
    pub async fn then(&mut self, f: impl FnOnce() -> std::io::Result<()> + Send + 'static) -> std::io::Result<()> {
        let tx = self.tx.as_ref().expect("open").clone();
        let op = match tx.try_send(Op::Then(Box::new(f))) {
            Ok(()) => return Ok(()),
            Err(mpsc::TrySendError::Full(op)) => op,
            Err(mpsc::TrySendError::Disconnected(_)) => return Err(self.failure()),
        };
        self.write_op(op).await
    }

    async fn write_op(&mut self, op: Op) -> std::io::Result<()> {
        let tx = self.tx.as_ref().expect("open").clone();
        match tokio::task::spawn_blocking(move || tx.send(op)).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(self.failure()),
        }
    }

    /// Writes what is left, syncs, and gives the SHA-256 of the whole file.
    pub async fn finish(mut self) -> std::io::Result<[u8; 32]> {
        drop(self.tx.take());
        let thread = self.thread.take().expect("open");
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .map_err(std::io::Error::other)?
            .map_err(|_| std::io::Error::other("the writer thread panicked"))?
    }

    /// The writer's own error (e.g. ENOSPC), once it has stopped.
    fn failure(&mut self) -> std::io::Error {
        drop(self.tx.take());
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => e,
            _ => std::io::Error::other("the file writer stopped"),
        }
    }
}

impl Drop for FileSink {
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
