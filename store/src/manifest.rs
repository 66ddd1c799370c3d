//! The manifest: the object named after the model, listing its files with their
//! sizes and SHA-256 digests. It is written after every file is in the store, so
//! a model is either complete or not there.

use anyhow::{bail, Context as _};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// A manifest larger than this is not one of ours.
pub const MAX_BYTES: usize = 1 << 20;

/// A model in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The name workers are given (`--model NAME`).
    pub name: String,
    /// `gguf` (one file) or `hf` (a Hugging Face / MLX directory).
    pub format: String,
    /// What a worker serves, relative to the model's directory: the GGUF file's name,
    /// or empty for the directory itself.
    pub entry: String,
    /// The files, sorted by path.
    pub files: Vec<FileEntry>,
    /// Total bytes.
    pub size: u64,
    /// The model's digest: SHA-256 over `{sha256}  {path}\n` for each file in order
    /// (what `sha256sum` prints), hex.
    pub digest: String,
    /// `user@host` of the push.
    pub pushed_by: String,
    /// When, Unix seconds.
    pub pushed_at: u64,
    /// The switchyard version that pushed it.
    pub version: String,
}

/// One file of a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path inside the model (`/`-separated), e.g. `model.safetensors`.
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// SHA-256 of the bytes, hex.
    pub sha256: String,
    /// The object holding it: `{name}/{push id}/{path}`.
    pub object: String,
}

impl Manifest {
    /// The model digest of these files (see [`Manifest::digest`]).
    pub fn digest_of(files: &[FileEntry]) -> String {
        let mut h = Sha256::new();
        for f in files {
            h.update(format!("{}  {}\n", f.sha256, f.path));
        }
        hex(&h.finalize())
    }

    /// Checks what a manifest read from the store promises before any of it is
    /// trusted: paths that stay inside the model directory, a digest that matches.
    pub fn check(&self) -> anyhow::Result<()> {
        crate::name::validate(&self.name)?;
        for f in &self.files {
            check_path(&f.path).with_context(|| format!("manifest of {}", self.name))?;
            if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("manifest of {}: {} has no SHA-256", self.name, f.path);
            }
        }
        if !self.entry.is_empty() && !self.files.iter().any(|f| f.path == self.entry) {
            bail!(
                "manifest of {}: entry {} is not one of its files",
                self.name,
                self.entry
            );
        }
        if Self::digest_of(&self.files) != self.digest {
            bail!("manifest of {}: the digest does not match its file list", self.name);
        }
        Ok(())
    }

    /// `sha256:` and the first 12 hex digits, for tables.
    pub fn short_digest(&self) -> String {
        format!("sha256:{}", &self.digest[..12.min(self.digest.len())])
    }
}

/// A relative path that stays inside its directory: no absolute paths, no `..`,
/// no empty or hidden components.
pub fn check_path(path: &str) -> anyhow::Result<()> {
    if path.is_empty() || path.starts_with('/') || path.contains('\\') {
        bail!("file path {path:?} is not a relative '/'-separated path");
    }
    for part in path.split('/') {
        if part.is_empty() || part.starts_with('.') {
            bail!("file path {path:?} has an empty, '.' or '..' component");
        }
    }
    Ok(())
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The files of a local model: a file alone, or every regular file under a
/// directory (hidden ones skipped), as (`/`-separated relative path, full path).
pub fn local_files(root: &Path) -> anyhow::Result<Vec<(String, PathBuf)>> {
    let meta = std::fs::metadata(root).with_context(|| format!("reading {}", root.display()))?;
    if meta.is_file() {
        let name = root
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        check_path(&name)?;
        return Ok(vec![(name, root.to_path_buf())]);
    }
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let kind = std::fs::metadata(&path)?;
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                let rel = path
                    .strip_prefix(root)
                    .expect("under root")
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().to_string())
                    .collect::<Vec<_>>()
                    .join("/");
                check_path(&rel)?;
                out.push((rel, path));
            }
        }
    }
    out.sort();
    if out.is_empty() {
        bail!("{} holds no files", root.display());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_that_climbs_out_or_lies_is_refused() {
        let file = |path: &str| FileEntry {
            path: path.into(),
            size: 1,
            sha256: "a".repeat(64),
            object: format!("m/x/{path}"),
        };
        let mut m = Manifest {
            name: "m".into(),
            format: "hf".into(),
            entry: String::new(),
            files: vec![file("config.json")],
            size: 1,
            digest: String::new(),
            pushed_by: String::new(),
            pushed_at: 0,
            version: String::new(),
        };
        m.digest = Manifest::digest_of(&m.files);
        m.check().unwrap();
        m.files.push(file("../evil"));
        assert!(m.check().is_err());
        m.files.pop();
        m.digest = "0".repeat(64);
        assert!(m.check().is_err());
    }

    #[test]
    fn a_directory_lists_its_files_without_hidden_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/w.bin"), "x").unwrap();
        std::fs::write(dir.path().join(".DS_Store"), "x").unwrap();
        let files: Vec<String> = local_files(dir.path()).unwrap().into_iter().map(|(p, _)| p).collect();
        assert_eq!(files, ["config.json", "sub/w.bin"]);
    }
}
