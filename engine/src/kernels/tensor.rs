//! Weight matrices kept in their GGUF block format, and the matrix multiply that
//! quantizes activations the way ggml does for each weight type.

use super::kquants::*;
use super::quants::*;
use super::simd::Kernels;
use candle_core::quantized::{gguf_file, GgmlDType};
use rayon::prelude::*;

/// The most weight rows one matmul task takes.
const MAX_CHUNK: usize = 256;

/// Weight storage by GGUF type.
pub enum QData {
    F32(Vec<f32>),
    F16(Vec<u16>),
    /// Q4_0: each whole group of eight rows packed block by block ([`BlockQ4_0x8`],
    /// group after group), then the rows after the last whole group in file order
    /// ([`packed`]).
    Q4_0x8(Vec<BlockQ4_0x8>, Vec<BlockQ4_0>),
    /// Q4_K likewise ([`BlockQ4Kx8`]).
    Q4Kx8(Vec<BlockQ4Kx8>, Vec<BlockQ4K>),
    /// Q5_K likewise ([`BlockQ5Kx8`]).
    Q5Kx8(Vec<BlockQ5Kx8>, Vec<BlockQ5K>),
    /// Q6_K likewise ([`BlockQ6Kx8`]).
    Q6Kx8(Vec<BlockQ6Kx8>, Vec<BlockQ6K>),
    /// Q4_1 likewise ([`BlockQ4_1x8`]).
    Q4_1x8(Vec<BlockQ4_1x8>, Vec<BlockQ4_1>),
    /// Q5_1 likewise ([`BlockQ5_1x8`]).
    Q5_1x8(Vec<BlockQ5_1x8>, Vec<BlockQ5_1>),
    /// Q5_0 likewise ([`BlockQ5_0x8`]).
    Q5_0x8(Vec<BlockQ5_0x8>, Vec<BlockQ5_0>),
    /// Q8_0 likewise ([`BlockQ8_0x8`]).
    Q8_0x8(Vec<BlockQ8_0x8>, Vec<BlockQ8_0>),
}

/// A `rows × cols` weight matrix (row-major; each row is `cols` values).
pub struct QMatrix {
    pub rows: usize,
    pub cols: usize,
    pub data: QData,
}

/// Activations prepared for one weight type. The 8-bit forms also carry their block
/// scales (and Q8_1's sums) as f32: converting them once per matmul instead of once
/// per weight row halves the work of a decode step's dot products. Q8_0 also carries
/// each block's [`q4_0_offset`] for the Q4_0 kernels.
pub enum QAct {
    F32(Vec<f32>),
    Q8_0(Vec<BlockQ8_0>, Vec<f32>, Vec<i32>),
    Q8_1(Vec<BlockQ8_1>, Vec<f32>, Vec<f32>),
    /// Q8_K blocks and their [`q4_k_min_pairs`] (for Q4_K and Q5_K weights).
    Q8K(Vec<BlockQ8K>, Vec<[i32; 4]>),
}

/// Why a tensor could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TensorError {
    #[error("tensor {0} is missing")]
    Missing(String),
    #[error("tensor {name} has type {dtype}, which the cpu engine does not support (supported: F32, F16, BF16 in safetensors, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)")]
    Unsupported { name: String, dtype: String },
    #[error("tensor {name} has rows of {cols} values, not a multiple of its {dtype:?} block size")]
    BadShape {
        name: String,
        dtype: GgmlDType,
        cols: usize,
    },
    #[error("reading tensor {name}: {source}")]
    Io {
        name: String,
        #[source]
        source: std::io::Error,
    },
}

/// Reads `len` bytes from `reader` straight into a vector of blocks (no second copy).
fn read_blocks<T: Copy, R: std::io::Read>(reader: &mut R, len: usize) -> std::io::Result<Vec<T>> {
    let n = len / std::mem::size_of::<T>();
    let mut out = Vec::<T>::with_capacity(n);
    // SAFETY: T is a #[repr(C)] plain-old-data block (integers and byte arrays) for
    // which every bit pattern, including all zeros, is valid. The storage is zeroed
    // before it is exposed as bytes, and the length is set only once it is initialised.
    unsafe {
        std::ptr::write_bytes(out.as_mut_ptr() as *mut u8, 0, n * std::mem::size_of::<T>());
        out.set_len(n);
        let bytes = std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, n * std::mem::size_of::<T>());
        reader.read_exact(bytes)?;
    }
    Ok(out)
}

/// Reads a tensor's raw bytes and keeps them in their block format (the packed ones
/// regrouped by eight rows).
pub fn load<R: std::io::Read + std::io::Seek>(
    ct: &gguf_file::Content,
    reader: &mut R,
    name: &str,
) -> Result<QMatrix, TensorError> {
    let info = ct
        .tensor_infos
        .get(name)
        .ok_or_else(|| TensorError::Missing(name.to_string()))?;
    let dims = info.shape.dims();
    // GGUF stores the fastest-moving dimension first; candle reverses it, so the last
    // candle dim is the row length.
    let cols = *dims.last().unwrap_or(&1);
    let rows = info.shape.elem_count() / cols.max(1);
    let elems = rows * cols;
    // (values per block, bytes per block)
    let (block, block_bytes) = match info.ggml_dtype {
        GgmlDType::F32 => (1, 4),
        GgmlDType::F16 => (1, 2),
        GgmlDType::Q4_0 => (QK, 18),
        GgmlDType::Q4_1 => (QK, 20),
        GgmlDType::Q5_0 => (QK, 22),
        GgmlDType::Q5_1 => (QK, 24),
        GgmlDType::Q8_0 => (QK, 34),
        GgmlDType::Q4K => (QK_K, std::mem::size_of::<BlockQ4K>()),
        GgmlDType::Q5K => (QK_K, std::mem::size_of::<BlockQ5K>()),
        GgmlDType::Q6K => (QK_K, std::mem::size_of::<BlockQ6K>()),
        dtype => {
            return Err(TensorError::Unsupported {
                name: name.to_string(),
                dtype: format!("{dtype:?}"),
            })
        }
    };
    if cols % block != 0 {
        return Err(TensorError::BadShape {
            name: name.to_string(),
            dtype: info.ggml_dtype,
            cols,
        });
    }
    let bytes_len = elems / block * block_bytes;
    let io = |source| TensorError::Io {
        name: name.to_string(),
        source,
    };
    reader
        .seek(std::io::SeekFrom::Start(ct.tensor_data_offset + info.offset))
        .map_err(io)?;
    let data = match info.ggml_dtype {
        GgmlDType::F32 => QData::F32(read_blocks(reader, bytes_len).map_err(io)?),
        GgmlDType::F16 => QData::F16(read_blocks(reader, bytes_len).map_err(io)?),
        GgmlDType::Q4_0 => {
            let (g, t) = packed::read(reader, rows, cols / QK).map_err(io)?;
            QData::Q4_0x8(g, t)
        }
        GgmlDType::Q4K => {
            let (g, t) = packed::read(reader, rows, cols / QK_K).map_err(io)?;
            QData::Q4Kx8(g, t)
        }
        GgmlDType::Q5K => {
            let (g, t) = packed::read(reader, rows, cols / QK_K).map_err(io)?;
            QData::Q5Kx8(g, t)
        }
        GgmlDType::Q4_1 => {
            let (g, t) = packed::read(reader, rows, cols / QK).map_err(io)?;
            QData::Q4_1x8(g, t)
        }
        GgmlDType::Q5_0 => {
            let (g, t) = packed::read(reader, rows, cols / QK).map_err(io)?;
            QData::Q5_0x8(g, t)
        }
        GgmlDType::Q5_1 => {
            let (g, t) = packed::read(reader, rows, cols / QK).map_err(io)?;
            QData::Q5_1x8(g, t)
        }
        GgmlDType::Q6K => {
            let (g, t) = packed::read(reader, rows, cols / QK_K).map_err(io)?;
            QData::Q6Kx8(g, t)
        }
        _ => {
            let (g, t) = packed::read(reader, rows, cols / QK).map_err(io)?;
            QData::Q8_0x8(g, t)
        }
    };
    Ok(QMatrix { rows, cols, data })
}

/// Bits and group size of the most common weight type among 2-D tensors.
pub fn dominant_quant(content: &gguf_file::Content) -> (u32, u32) {
    let mut counts: std::collections::HashMap<String, (usize, GgmlDType)> = Default::default();
    for info in content.tensor_infos.values() {
        if info.shape.rank() == 2 {
            let e = counts
                .entry(format!("{:?}", info.ggml_dtype))
                .or_insert((0, info.ggml_dtype));
            e.0 += 1;
        }
    }
    let Some((_, dtype)) = counts.into_values().max_by_key(|(n, _)| *n) else {
        return (0, 0);
    };
    match dtype {
        GgmlDType::Q4_0 | GgmlDType::Q4_1 => (4, 32),
        GgmlDType::Q5_0 | GgmlDType::Q5_1 => (5, 32),
        GgmlDType::Q8_0 | GgmlDType::Q8_1 => (8, 32),
        GgmlDType::Q2K => (2, 256),
        GgmlDType::Q3K => (3, 256),
        GgmlDType::Q4K => (4, 256),
        GgmlDType::Q5K => (5, 256),
        GgmlDType::Q6K => (6, 256),
        GgmlDType::Q8K => (8, 256),
        _ => (0, 0),
    }
}

/// Quantizes `n` rows of `cols` values into `out` (blocks of `block` values), the rows
/// spread over the rayon pool when there are several (a prefill): each block depends
/// only on its own 32 or 256 values, so the split changes nothing.
fn per_row<B: Send>(x: &[f32], cols: usize, n: usize, out: &mut [B], block: usize, quantize: fn(&[f32], &mut [B])) {
    if n < 4 {
        quantize(x, out);
        return;
    }
    out.par_chunks_mut(cols / block)
        .zip(x.par_chunks(cols))
        .for_each(|(o, row)| quantize(row, o));
}

mod packed;

/// Rows per parallel task: a few chunks per thread, enough to balance, few enough to
/// keep dispatch cheap.
pub(super) fn chunk_rows(rows: usize) -> usize {
    (rows / (rayon::current_num_threads() * 4)).clamp(16, MAX_CHUNK)
}

/// A raw pointer that may be shared across the rayon workers writing disjoint cells.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(*mut f32);
// SAFETY: every parallel task writes a disjoint set of indices.
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Cell `i`. (A method, so closures capture the whole `Sync` wrapper.)
    ///
    /// # Safety
    /// `i` is in bounds of the output.
    pub(super) unsafe fn cell(self, i: usize) -> *mut f32 {
        self.0.add(i)
    }
}

impl QMatrix {
    /// The whole matrix as f32 values (small tensors: norms).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        for r in 0..self.rows {
            self.row_f32(r, &mut out[r * self.cols..(r + 1) * self.cols]);
        }
        out
    }

    /// Row `r` as f32 values (embedding lookups).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        let c = self.cols;
        let nb = c / QK;
        let nk = c / QK_K;
        match &self.data {
            QData::F32(v) => out.copy_from_slice(&v[r * c..(r + 1) * c]),
            QData::F16(v) => {
                for (o, h) in out.iter_mut().zip(&v[r * c..(r + 1) * c]) {
                    *o = h2f(*h);
                }
            }
            QData::Q4_0x8(groups, tail) => dequantize_q4_0(&packed::row(groups, tail, nb, r), out),
            QData::Q4Kx8(groups, tail) => dequantize_q4_k(&packed::row(groups, tail, nk, r), out),
            QData::Q5Kx8(groups, tail) => dequantize_q5_k(&packed::row(groups, tail, nk, r), out),
            QData::Q4_1x8(groups, tail) => dequantize_min(&packed::row(groups, tail, nb, r), out),
            QData::Q5_1x8(groups, tail) => dequantize_min(&packed::row(groups, tail, nb, r), out),
            QData::Q5_0x8(groups, tail) => dequantize_q5_0(&packed::row(groups, tail, nb, r), out),
            QData::Q8_0x8(groups, tail) => dequantize_q8_0(&packed::row(groups, tail, nb, r), out),
            QData::Q6Kx8(groups, tail) => dequantize_q6_k(&packed::row(groups, tail, nk, r), out),
        }
    }

    /// Prepares `n` input rows of `cols` values for this matrix's kernel.
    pub fn prepare(&self, x: &[f32], n: usize) -> QAct {
        self.prepare_with(Kernels::active(), x, n)
    }

    /// [`Self::prepare`] with a given kernel variant.
    pub fn prepare_with(&self, k: &Kernels, x: &[f32], n: usize) -> QAct {
        let x = &x[..n * self.cols];
        match &self.data {
            QData::F32(_) | QData::F16(_) => QAct::F32(x.to_vec()),
            QData::Q4_1x8(..) | QData::Q5_1x8(..) => {
                let mut b = vec![
                    BlockQ8_1 {
                        d: 0,
                        s: 0,
                        qs: [0; 32]
                    };
                    x.len() / QK
                ];
                per_row(x, self.cols, n, &mut b, QK, k.quantize_q8_1);
                let d = b.iter().map(|b| h2f(b.d)).collect();
                let s = b.iter().map(|b| h2f(b.s)).collect();
                QAct::Q8_1(b, d, s)
            }
            QData::Q4_0x8(..) | QData::Q5_0x8(..) | QData::Q8_0x8(..) => {
                let mut b = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; x.len() / QK];
                per_row(x, self.cols, n, &mut b, QK, k.quantize_q8_0);
                let d = b.iter().map(|b| h2f(b.d)).collect();
                let o = b.iter().map(q4_0_offset).collect();
                QAct::Q8_0(b, d, o)
            }
            QData::Q4Kx8(..) | QData::Q5Kx8(..) | QData::Q6Kx8(..) => {
                let mut b = vec![BlockQ8K::ZERO; x.len() / QK_K];
                per_row(x, self.cols, n, &mut b, QK_K, k.quantize_q8_k);
                let m = b.iter().map(q4_k_min_pairs).collect();
                QAct::Q8K(b, m)
            }
        }
    }

    /// Whether two matrices take the same prepared input (so it is computed once).
    pub fn same_input_kind(&self, other: &QMatrix) -> bool {
        let kind = |m: &QMatrix| match m.data {
            QData::F32(_) | QData::F16(_) => 0,
            QData::Q4_1x8(..) | QData::Q5_1x8(..) => 1,
            QData::Q4_0x8(..) | QData::Q5_0x8(..) | QData::Q8_0x8(..) => 2,
            QData::Q4Kx8(..) | QData::Q5Kx8(..) | QData::Q6Kx8(..) => 3,
        };
        kind(self) == kind(other) && self.cols == other.cols
    }

    /// Row `r` of a float matrix against prepared input `t`.
    fn dot(&self, k: &Kernels, r: usize, act: &QAct, t: usize) -> f32 {
        let c = self.cols;
        match (&self.data, act) {
            (QData::F32(wq), QAct::F32(x)) => (k.dot_f32)(&wq[r * c..(r + 1) * c], &x[t * c..(t + 1) * c]),
            (QData::F16(wq), QAct::F32(x)) => {
                let xs = &x[t * c..(t + 1) * c];
                wq[r * c..(r + 1) * c].iter().zip(xs).map(|(h, v)| h2f(*h) * v).sum()
            }
            _ => unreachable!("prepare() matches the weight type"),
        }
    }

    /// `out[t * rows + r] = row_r · input_t` for `n` prepared inputs, split over the
    /// current rayon pool by row chunks (each chunk reuses its rows for every input),
    /// with the process's kernel variant.
    pub fn matmul(&self, act: &QAct, n: usize, out: &mut [f32]) {
        self.matmul_with(Kernels::active(), act, n, out)
    }

    /// [`Self::matmul`] with a given kernel variant (tests compare them).
    pub fn matmul_with(&self, k: &Kernels, act: &QAct, n: usize, out: &mut [f32]) {
        assert!(out.len() >= n * self.rows);
        let ptr = OutPtr(out.as_mut_ptr());
        match &self.data {
            QData::Q4_0x8(groups, tail) => return packed::matmul(self, k, groups, tail, act, n, ptr),
            QData::Q4_1x8(groups, tail) => return packed::matmul(self, k, groups, tail, act, n, ptr),
            QData::Q5_1x8(groups, tail) => return packed::matmul(self, k, groups, tail, act, n, ptr),
            QData::Q8_0x8(groups, tail) => return packed::matmul(self, k, groups, tail, act, n, ptr),
            QData::Q5_0x8(groups, tail) => return packed::matmul(self, k, groups, tail, act, n, ptr),
            QData::Q4Kx8(groups, tail) => return packed::matmul(self, k, groups, tail, act, n, ptr),
            QData::Q5Kx8(groups, tail) => return packed::matmul(self, k, groups, tail, act, n, ptr),
            QData::Q6Kx8(groups, tail) => return packed::matmul(self, k, groups, tail, act, n, ptr),
            QData::F32(_) | QData::F16(_) => {}
        }
        // Float matrices: chunks of rows in parallel, each row against every input.
        let rows = self.rows;
        let chunk = chunk_rows(rows);
        (0..rows.div_ceil(chunk)).into_par_iter().for_each(|ci| {
            for t in 0..n {
                for r in ci * chunk..((ci + 1) * chunk).min(rows) {
                    let v = self.dot(k, r, act, t);
                    // SAFETY: (t, r) cells are disjoint across chunks and in bounds.
                    unsafe { *ptr.cell(t * rows + r) = v };
                }
            }
        });
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match &self.data {
            QData::F32(v) => v.len() * 4,
            QData::F16(v) => v.len() * 2,
            QData::Q4_0x8(groups, tail) => groups.len() * 144 + tail.len() * 18,
            QData::Q4_1x8(groups, tail) => groups.len() * 160 + tail.len() * 20,
            QData::Q5_0x8(groups, tail) => groups.len() * 176 + tail.len() * 22,
            QData::Q5_1x8(groups, tail) => groups.len() * 192 + tail.len() * 24,
            QData::Q8_0x8(groups, tail) => groups.len() * 272 + tail.len() * 34,
            QData::Q4Kx8(groups, tail) => {
                groups.len() * std::mem::size_of::<BlockQ4Kx8>() + tail.len() * std::mem::size_of::<BlockQ4K>()
            }
            QData::Q5Kx8(groups, tail) => {
                groups.len() * std::mem::size_of::<BlockQ5Kx8>() + tail.len() * std::mem::size_of::<BlockQ5K>()
            }
            QData::Q6Kx8(groups, tail) => {
                groups.len() * std::mem::size_of::<BlockQ6Kx8>() + tail.len() * std::mem::size_of::<BlockQ6K>()
            }
        }
    }
}

#[cfg(test)]
mod tests;
