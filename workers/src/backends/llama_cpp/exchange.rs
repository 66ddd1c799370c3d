//! What one supervised server's KV exchange keeps ([`Exchange`]): its slot directory,
//! the format once learned, KV pulled for a generation still to come, and slots read
//! for a peer's pull. The exchange itself is in `kv_exchange.rs`.

use super::slot_state::{Layout, SlotState};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use switchyard_messages::KvFormat;

/// Tokens per block of llama.cpp KV on the wire.
pub const BLOCK_TOKENS: usize = 16;

/// Pulled KV waiting for its generation, at most: a pull whose generation never came
/// (the client went away) is dropped after [`PENDING_FOR`].
pub(super) const MAX_PENDING: usize = 4;
pub(super) const PENDING_FOR: Duration = Duration::from_secs(60);
/// The most bytes pulled KV may hold while it waits.
pub(super) const MAX_PENDING_BYTES: usize = 1 << 30;

/// Slots read for peers, kept for the pull's next chunks.
const MAX_SAVED: usize = 2;
const SAVED_FOR: Duration = Duration::from_secs(30);

/// The exchange of one supervised server.
pub struct Exchange {
    /// The server's `--slot-save-path`.
    pub(super) dir: PathBuf,
    /// Made for this server (removed with it), not named by the operator.
    pub(super) own_dir: bool,
    pub(super) format: OnceLock<(KvFormat, Layout)>,
    pub(super) pending: Mutex<Vec<Pending>>,
    pub(super) saved: Mutex<Vec<(Instant, Arc<SlotState>)>>,
    /// One sweep of saves at a time: the pull's other chunks then find its result.
    pub(super) sweep: tokio::sync::Mutex<()>,
    pub(super) files: AtomicU64,
}

/// Blocks pulled for a prefix, contiguous from its first.
pub(super) struct Pending {
    pub(super) tokens: Vec<u32>,
    pub(super) data: Vec<u8>,
    pub(super) blocks: usize,
    pub(super) at: Instant,
}

impl Exchange {
    pub fn new(dir: PathBuf, own_dir: bool) -> Self {
        Self {
            dir,
            own_dir,
            format: OnceLock::new(),
            pending: Mutex::new(Vec::new()),
            saved: Mutex::new(Vec::new()),
            sweep: tokio::sync::Mutex::new(()),
            files: AtomicU64::new(0),
        }
    }

    pub(super) fn file_name(&self, what: &str) -> String {
        format!(
            "sy-{what}-{}-{}.bin",
            std::process::id(),
            self.files.fetch_add(1, Ordering::Relaxed)
        )
    }

    pub(super) fn has_pending(&self) -> bool {
        !self.pending.lock().unwrap_or_else(|p| p.into_inner()).is_empty()
    }

    /// Takes the longest pulled prefix that begins `tokens`.
    pub(super) fn take_pending(&self, tokens: &[u32]) -> Option<Pending> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|p| p.at.elapsed() < PENDING_FOR);
        let best = pending
            .iter()
            .enumerate()
            .filter(|(_, p)| p.blocks > 0 && tokens.starts_with(&p.tokens[..p.blocks * BLOCK_TOKENS]))
            .max_by_key(|(_, p)| p.blocks)
            .map(|(i, _)| i)?;
        Some(pending.swap_remove(best))
    }

    pub(super) fn saved_covering(&self, tokens: &[u32], need: usize) -> Option<Arc<SlotState>> {
        let mut saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        saved.retain(|(at, _)| at.elapsed() < SAVED_FOR);
        saved
            .iter()
            .map(|(_, s)| s)
            .filter(|s| s.shared_prefix(tokens) >= need)
            .max_by_key(|s| s.shared_prefix(tokens))
            .cloned()
    }

    pub(super) fn keep_saved(&self, state: Arc<SlotState>) {
        let mut saved = self.saved.lock().unwrap_or_else(|p| p.into_inner());
        if saved.len() >= MAX_SAVED {
            saved.remove(0);
        }
        saved.push((Instant::now(), state));
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        if self.own_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}
