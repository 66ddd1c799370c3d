//! Pipeline stages (1.16): one model served by several workers, each holding a
//! contiguous range of its layers. The first stage — the worker the fleet routes
//! the model's requests to — embeds tokens, runs its layers and sends every row's
//! hidden state to the next stage as a [`StageBatch`] on
//! `{p}.v1.stage.{pipeline}.{first layer}` ([`crate::Subjects::stage`]); each stage
//! runs its layers and publishes to the stage after it with the same reply subject,
//! and the last one answers the first with a [`StageReply`]: the final hidden
//! states of the positions that want logits. The first stage holds the output norm
//! and projection too, so sampling — stops, constraints, logprobs, speculation —
//! happens where it always does, and a token travels as one small round trip per
//! step however many stages there are.
//!
//! **KV.** Each stage keeps the keys and values of its own layers for the same
//! sequences (slots) as the first stage, under the same positions: a step's
//! `seq`/`pos` say where its rows go, and [`StageOp`]s replay what the first stage
//! did to its slots between steps (a prefix shared from one slot to another). A
//! stage that sees a new `epoch` (the first stage restarted, or gave up on the
//! stages after a failure) forgets everything it held.
//!
//! **Rows.** f32, little-endian, `n_embd` per row, rows in step order: exactly the
//! values a single worker's pass carries from layer to layer, so a pipeline answers
//! bit for bit as one worker holding the whole model.

use crate::kv_transfer::bin;
use crate::WireError;
use serde::{Deserialize, Serialize};

/// One pass of the layers past a stage: the rows of every step, as the stage before
/// computed them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageBatch {
    pub v: u32,
    /// The pipeline's name (`worker --pipeline`): stages of different pipelines
    /// never mix.
    pub pipeline: String,
    /// The first stage's run: a stage seeing another forgets its KV first.
    pub epoch: u64,
    /// The model's layer count and width, checked by every stage.
    pub layers: u32,
    pub n_embd: u32,
    /// What happened to the first stage's slots since the last batch, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ops: Vec<StageOp>,
    pub steps: Vec<StageStep>,
    /// The stages past the first that ran it so far (each adds its own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub passed: Vec<StageReport>,
    /// `n_embd` f32 values (little-endian) per row: every step's tokens, in order.
    #[serde(with = "bin")]
    pub rows: Vec<u8>,
}

/// One sequence's part of a [`StageBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageStep {
    /// The slot (KV sequence) of the first stage.
    pub seq: u32,
    /// The position of the first token; what the slot held from here on is
    /// overwritten.
    pub pos: u32,
    /// The tokens at `pos..` (one row each).
    pub tokens: Vec<u32>,
    /// How many of the last positions want logits (1, or more when verifying
    /// drafted tokens).
    pub outputs: u32,
}

/// What the first stage did to its slots between two steps, replayed by each stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StageOp {
    /// Slot `to` takes positions `0..len` of slot `from`.
    CopyPrefix { from: u32, to: u32, len: u32 },
}

/// The last stage's answer (or a failing stage's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageReply {
    pub v: u32,
    /// `n_embd` f32 values per row: the hidden states after the last layer (before
    /// the output norm) of each step's last `outputs` positions, in order.
    #[serde(with = "bin")]
    pub rows: Vec<u8>,
    /// Every stage past the first that ran the batch, in order.
    #[serde(default)]
    pub stages: Vec<StageReport>,
    /// Why the batch was not computed (and by which stage, in the message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<WireError>,
}

/// One stage's part of a [`StageReply`]: who ran which layers, and how long.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageReport {
    pub worker_id: String,
    /// Global indices, first and last (inclusive).
    pub first_layer: u32,
    pub last_layer: u32,
    /// Microseconds of compute for this batch.
    pub compute_us: u64,
    /// The stage's resident memory, bytes.
    #[serde(default)]
    pub rss_bytes: u64,
}

/// A pipelined model as its first stage announces it ([`crate::ModelInfo::pipeline`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelineInfo {
    pub name: String,
    /// The model's layer count.
    pub layers: u32,
    /// The first stage's layers: `0..=last_layer`.
    pub last_layer: u32,
    /// The stages after it as their last answer named them (empty until one came).
    #[serde(default)]
    pub stages: Vec<StageReport>,
    /// Why the pipeline cannot serve now (a stage missing or not answering), while
    /// it cannot (protocol 1.17).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken: Option<String>,
}

impl PipelineInfo {
    /// One line for people: `pipeline two: layers 0-13 on w1 → 14-29 on w2 (3.1 ms,
    /// 80 MB)`, the first stage being `first`; later stages with their last batch's
    /// compute time and resident memory.
    pub fn describe(&self, first: &str) -> String {
        let mut s = format!("pipeline {}: layers 0-{} on {first}", self.name, self.last_layer);
        let mut next = self.last_layer + 1;
        for st in &self.stages {
            s.push_str(&format!(
                " → {}-{} on {} ({:.1} ms, {:.0} MB)",
                st.first_layer,
                st.last_layer,
                st.worker_id,
                st.compute_us as f64 / 1e3,
                st.rss_bytes as f64 / 1e6
            ));
            next = st.last_layer + 1;
        }
        if next < self.layers {
            s.push_str(&format!(" → {next}-{} (not heard from yet)", self.layers - 1));
        }
        if let Some(why) = &self.broken {
            s.push_str(&format!("; not serving: {why}"));
        }
        s
    }
}

/// f32 rows as [`StageBatch::rows`] carries them.
pub fn rows_to_bytes(rows: &[f32]) -> Vec<u8> {
    rows.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// [`StageBatch::rows`] back to f32 values; `None` when the length is not whole values.
pub fn rows_from_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    bytes.len().is_multiple_of(4).then(|| {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip_with_their_rows_bit_for_bit() {
        let rows = [1.5f32, -0.0, f32::MIN_POSITIVE, 3.25e-12];
        let b = StageBatch {
            v: 1,
            pipeline: "p".into(),
            epoch: 7,
            layers: 30,
            n_embd: 2,
            ops: vec![StageOp::CopyPrefix { from: 0, to: 1, len: 5 }],
            steps: vec![StageStep {
                seq: 1,
                pos: 5,
                tokens: vec![9, 10],
                outputs: 1,
            }],
            passed: Vec::new(),
            rows: rows_to_bytes(&rows),
        };
        let back: StageBatch = crate::decode(&crate::encode(&b)).unwrap();
        assert_eq!(back, b);
        let got = rows_from_bytes(&back.rows).unwrap();
        assert!(got.iter().zip(rows).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert_eq!(rows_from_bytes(&[0, 1, 2]), None);
    }

    #[test]
    fn a_pipeline_describes_its_stages_and_those_not_heard_from() {
        let report = |w: &str, a, b| StageReport {
            worker_id: w.into(),
            first_layer: a,
            last_layer: b,
            compute_us: 3100,
            rss_bytes: 80_000_000,
        };
        let mut p = PipelineInfo {
            name: "two".into(),
            layers: 30,
            last_layer: 13,
            stages: vec![],
            broken: None,
        };
        assert_eq!(
            p.describe("w1"),
            "pipeline two: layers 0-13 on w1 → 14-29 (not heard from yet)"
        );
        p.stages = vec![report("w2", 14, 21), report("w3", 22, 29)];
        assert_eq!(
            p.describe("w1"),
            "pipeline two: layers 0-13 on w1 → 14-21 on w2 (3.1 ms, 80 MB) → 22-29 on w3 (3.1 ms, 80 MB)"
        );
        p.broken = Some("no stage serves layers 22-29".into());
        assert!(p
            .describe("w1")
            .ends_with("(3.1 ms, 80 MB); not serving: no stage serves layers 22-29"));
    }
}
