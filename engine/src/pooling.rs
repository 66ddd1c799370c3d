//! How an input's token rows become its one embedding: mean, the first row ([CLS]) or
//! the last, then L2-normalised — llama.cpp's `--pooling mean|cls|last` with its
//! default `--embd-normalize 2`, and sentence-transformers' Pooling + Normalize.

/// A pooling mode (GGUF `{arch}.pooling_type`, `worker.pooling`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The average of every row (llama.cpp's MEAN).
    Mean,
    /// The first row (BERT's [CLS] token).
    Cls,
    /// The last row (decoder embedding models such as Qwen3-Embedding).
    Last,
}

impl Pooling {
    /// From GGUF's `pooling_type` (1 mean, 2 cls, 3 last); `None` for the others
    /// (0 none, 4 rank), which give no sentence vector.
    pub fn from_gguf(code: u32) -> Option<Self> {
        match code {
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            _ => None,
        }
    }

    /// From `worker.pooling`: `""` is `None` (the model's own, else mean).
    pub fn parse(name: &str) -> Result<Option<Self>, String> {
        match name {
            "" => Ok(None),
            "mean" => Ok(Some(Pooling::Mean)),
            "cls" => Ok(Some(Pooling::Cls)),
            "last" => Ok(Some(Pooling::Last)),
            other => Err(format!("pooling {other:?}: \"mean\", \"cls\" or \"last\"")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }

    /// One input's rows (`rows.len()` a multiple of `d`, at least one row) pooled and
    /// L2-normalised (a zero vector stays zero).
    pub fn pool(self, rows: &[f32], d: usize) -> Vec<f32> {
        let mut v = vec![0.0f64; d];
        match self {
            Pooling::Mean => {
                for row in rows.chunks_exact(d) {
                    v.iter_mut().zip(row).for_each(|(m, x)| *m += *x as f64);
                }
            }
            Pooling::Cls => v.iter_mut().zip(&rows[..d]).for_each(|(m, x)| *m = *x as f64),
            Pooling::Last => v
                .iter_mut()
                .zip(&rows[rows.len() - d..])
                .for_each(|(m, x)| *m = *x as f64),
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        v.iter().map(|x| (x * scale) as f32).collect()
    }
}

/// The pooling a sentence-transformers directory's modules name: `None` without a
/// modules.json or a Pooling module in it.
pub fn sentence_transformers(dir: &std::path::Path) -> Result<Option<Pooling>, String> {
    let read = |p: &std::path::Path| -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
    };
    let Some(modules) = read(&dir.join("modules.json")) else {
        return Ok(None);
    };
    let Some(module) = modules
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["type"].as_str().is_some_and(|t| t.ends_with("Pooling")))
    else {
        return Ok(None);
    };
    let cfg = read(
        &dir.join(module["path"].as_str().unwrap_or_default())
            .join("config.json"),
    )
    .unwrap_or_default();
    let on = |k: &str| cfg[k].as_bool().unwrap_or(false);
    if cfg.is_null() || on("pooling_mode_mean_tokens") {
        Ok(Some(Pooling::Mean))
    } else if on("pooling_mode_cls_token") {
        Ok(Some(Pooling::Cls))
    } else if on("pooling_mode_lasttoken") {
        Ok(Some(Pooling::Last))
    } else {
        Err(format!(
            "pooling {cfg}: only mean, cls and last-token pooling are supported"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_as_named_and_normalises() {
        let rows = [3.0, 0.0, 0.0, 4.0, 0.0, 0.0];
        assert_eq!(Pooling::Cls.pool(&rows, 2), vec![1.0, 0.0]);
        assert_eq!(Pooling::Last.pool(&rows, 2), vec![0.0, 0.0], "a zero row stays zero");
        assert_eq!(Pooling::Mean.pool(&rows, 2), vec![0.6, 0.8]);
        assert_eq!(Pooling::parse("").unwrap(), None);
        assert_eq!(Pooling::parse("last").unwrap(), Some(Pooling::Last));
        assert!(Pooling::parse("max").unwrap_err().contains("\"max\""));
        assert_eq!(Pooling::from_gguf(2), Some(Pooling::Cls));
        assert_eq!(Pooling::from_gguf(0), None);
    }
}
