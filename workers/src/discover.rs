//! Finding models on disk (seed 000 `Discover`): GGUF files, and HuggingFace model
//! directories (`config.json` + `*.safetensors`), under a base directory.

use serde::Serialize;
use std::path::{Path, PathBuf};

/// A model found on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiscoveredModel {
    /// Absolute path: the `.gguf` file or the model directory.
    pub path: PathBuf,
    /// `"gguf"` or `"safetensors"`.
    pub format: &'static str,
    /// `general.architecture` (GGUF) or `model_type` (config.json); empty if unreadable.
    pub model_type: String,
    /// Quantisation bits (0 = unquantised or unknown).
    pub quant_bits: u32,
    /// Quantisation group size (0 = unquantised or unknown).
    pub quant_group: u32,
    /// Weight files (1 for a GGUF file).
    pub num_files: usize,
    /// Total size in bytes.
    pub size_bytes: u64,
}

/// Scans `base` and its immediate subdirectories. `base` itself is included when it is
/// a model file or directory. Unreadable metadata is tolerated (empty `model_type`).
pub fn discover(base: &Path) -> std::io::Result<Vec<DiscoveredModel>> {
    let base = std::fs::canonicalize(base)?;
    let mut found = Vec::new();
    if base.is_file() {
        found.extend(gguf_model(&base));
        return Ok(found);
    }
    found.extend(hf_dir(&base));
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&base)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        if p.is_file() {
            found.extend(gguf_model(&p));
        } else if p.is_dir() {
            found.extend(hf_dir(&p));
            // GGUF files one level down (e.g. models/smollm2/model.gguf).
            if let Ok(inner) = std::fs::read_dir(&p) {
                let mut files: Vec<PathBuf> = inner.filter_map(|e| e.ok().map(|e| e.path())).collect();
                files.sort();
                found.extend(files.iter().filter(|f| f.is_file()).filter_map(|f| gguf_model(f)));
            }
        }
    }
    Ok(found)
}

/// Checks that `path` is a whole GGUF file: its header parses and every tensor's
/// data lies inside the file (a truncated download or copy fails here, naming the
/// first tensor that is cut off).
pub fn check_gguf(path: &Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    let content = candle_core::quantized::gguf_file::Content::read(&mut f)
        .map_err(|e| anyhow::anyhow!("{} is not a readable GGUF file: {e}", path.display()))?;
    for (name, t) in &content.tensor_infos {
        let bytes = t.shape.elem_count() / t.ggml_dtype.block_size() * t.ggml_dtype.type_size();
        let end = content.tensor_data_offset + t.offset + bytes as u64;
        if end > len {
            anyhow::bail!(
                "{} is truncated: tensor {name} ends at byte {end} but the file has {len} bytes",
                path.display()
            );
        }
    }
    Ok(())
}

fn gguf_model(path: &Path) -> Option<DiscoveredModel> {
    if path.extension().and_then(|e| e.to_str()) != Some("gguf") {
        return None;
    }
    let size_bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    let mut model = DiscoveredModel {
        path: path.to_path_buf(),
        format: "gguf",
        model_type: String::new(),
        quant_bits: 0,
        quant_group: 0,
        num_files: 1,
        size_bytes,
    };
    if let Ok(mut f) = std::fs::File::open(path) {
        if let Ok(content) = candle_core::quantized::gguf_file::Content::read(&mut f) {
            model.model_type = content
                .metadata
                .get("general.architecture")
                .and_then(|v| v.to_string().ok())
                .cloned()
                .unwrap_or_default();
            (model.quant_bits, model.quant_group) = switchyard_engine::kernels::tensor::dominant_quant(&content);
        }
    }
    Some(model)
}

fn hf_dir(dir: &Path) -> Option<DiscoveredModel> {
    let config = dir.join("config.json");
    if !config.is_file() {
        return None;
    }
    let weights: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("safetensors"))
        .collect();
    if weights.is_empty() {
        return None;
    }
    let json: serde_json::Value = std::fs::read_to_string(&config)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(serde_json::Value::Null);
    let quant = &json["quantization_config"];
    let quant = if quant.is_null() { &json["quantization"] } else { quant };
    Some(DiscoveredModel {
        path: dir.to_path_buf(),
        format: "safetensors",
        model_type: json["model_type"].as_str().unwrap_or_default().to_string(),
        quant_bits: quant["bits"].as_u64().unwrap_or(0) as u32,
        quant_group: quant["group_size"].as_u64().unwrap_or(0) as u32,
        num_files: weights.len(),
        size_bytes: weights
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_hf_dirs_and_tolerates_bad_json() {
        let tmp = std::env::temp_dir().join(format!("sy-discover-{}", std::process::id()));
        let good = tmp.join("good");
        let bad = tmp.join("bad");
        let empty = tmp.join("empty");
        for d in [&good, &bad, &empty] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(
            good.join("config.json"),
            r#"{"model_type":"qwen2","quantization":{"bits":4,"group_size":64}}"#,
        )
        .unwrap();
        std::fs::write(good.join("model.safetensors"), b"x").unwrap();
        std::fs::write(bad.join("config.json"), b"{not json").unwrap();
        std::fs::write(bad.join("a.safetensors"), b"x").unwrap();
        std::fs::write(empty.join("config.json"), b"{}").unwrap();
        std::fs::write(tmp.join("notes.txt"), b"x").unwrap();
        let found = discover(&tmp).unwrap();
        std::fs::remove_dir_all(&tmp).unwrap();
        assert_eq!(found.len(), 2, "{found:?}");
        assert_eq!(found[0].model_type, "", "bad json tolerated");
        assert_eq!(found[1].model_type, "qwen2");
        assert_eq!((found[1].quant_bits, found[1].quant_group), (4, 64));
    }
}
