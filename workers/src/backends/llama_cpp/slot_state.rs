//! llama-server's slot files — what `POST /slots/{id}?action=save` writes and
//! `?action=restore` reads (`llama_state_seq_save_file`, sequence state version 4 of
//! the llama.cpp build the project pins) — read into the KV of each position, and
//! written back from it, so a slot's KV can travel in the exchange's blocks
//! ([`SlotState::blocks`], [`write`]).
//!
//! A file is: the magic `ggsq`, the version, the slot's tokens (plain, or llama-server's
//! packed list: a `-1` marker, its version, the ids, the media keys), then the cache:
//! its stream count, and per stream the cells of the sequence — each cell's position
//! and sequence ids — then the data: whether V is transposed, the layer count, the key
//! and value rotations, each layer's K rows (one per cell), each layer's V rows (or,
//! transposed, V's elements row by row across the cells).
//!
//! Only what a plain attention cache writes is read: one cache (no sliding-window
//! pair, no recurrent state), one sequence per cell, positions `0..n` each once, the
//! same row widths on every layer. Anything else is an error, and the worker then
//! exchanges no KV: the caller computes.

/// `LLAMA_STATE_SEQ_MAGIC` (`ggsq`).
pub const MAGIC: u32 = 0x6767_7371;
/// `LLAMA_STATE_SEQ_VERSION` of the pinned build.
pub const VERSION: u32 = 4;
/// llama-server's packed token list starts with `LLAMA_TOKEN_NULL`.
const PACKED: i32 = -1;
/// `SERVER_TOKENS_STATE_VERSION`.
const PACKED_VERSION: u32 = 1;

/// How a server lays its KV out, as its files show: equal layouts read each other's
/// files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Streams of the cache (1 when unified).
    pub streams: u32,
    pub v_trans: bool,
    pub layers: u32,
    pub rot_k: u32,
    pub rot_v: u32,
    /// ggml types of keys and values (1: f16).
    pub k_type: i32,
    pub v_type: i32,
    /// Bytes of one cell's keys, and values, in one layer.
    pub k_row: usize,
    pub v_row: usize,
    /// Bytes of one element of V (the transposed layout's unit; 0 otherwise).
    pub v_el: u32,
}

/// A slot's KV, position by position.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotState {
    pub layout: Layout,
    /// The tokens the slot says it holds (may run one past its cells: the last token
    /// sampled is not yet run).
    pub tokens: Vec<u32>,
    /// Cells, positions `0..cells`.
    pub cells: usize,
    /// Per layer, `cells` rows of keys in position order.
    pub k: Vec<Vec<u8>>,
    /// Per layer, `cells` rows of values in position order (transposed files are
    /// turned into rows).
    pub v: Vec<Vec<u8>>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.bytes.len());
        let Some(end) = end else {
            return Err(format!("slot file ends inside {what} (at byte {})", self.at));
        };
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn i32(&mut self, what: &str) -> Result<i32, String> {
        Ok(self.u32(what)? as i32)
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
}

/// The most tokens or cells a file may claim: far past any context.
const MAX_CELLS: usize = 1 << 22;

/// Reads a slot file.
pub fn parse(bytes: &[u8]) -> Result<SlotState, String> {
    let mut r = Reader { bytes, at: 0 };
    if r.u32("the magic")? != MAGIC {
        return Err("not a llama.cpp sequence state file".into());
    }
    let version = r.u32("the version")?;
    if version != VERSION {
        return Err(format!("sequence state version {version}, this worker reads {VERSION}"));
    }
    let n = r.u32("the token count")? as usize;
    if n > MAX_CELLS {
        return Err(format!("{n} tokens"));
    }
    let raw: Vec<i32> = r
        .take(4 * n, "the tokens")?
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let tokens = unpack(&raw)?;
    let streams = r.u32("the stream count")?;
    if streams == 0 || streams > 4096 {
        return Err(format!("{streams} streams"));
    }
    let mut state = None;
    for _ in 0..streams {
        let cells = r.u32("a cell count")? as usize;
        if cells == 0 {
            continue;
        }
        if state.is_some() {
            return Err("the sequence spans more than one stream".into());
        }
        if cells > MAX_CELLS {
            return Err(format!("{cells} cells"));
        }
        state = Some(read_stream(&mut r, cells, streams, &tokens)?);
    }
    if r.at != bytes.len() {
        return Err(format!(
            "{} bytes after the cache (a cache this worker does not read: sliding-window or recurrent)",
            bytes.len() - r.at
        ));
    }
    state.ok_or_else(|| "the slot holds no KV".to_string())
}

fn unpack(raw: &[i32]) -> Result<Vec<u32>, String> {
    let ids = |s: &[i32]| -> Result<Vec<u32>, String> {
        s.iter()
            .map(|&t| u32::try_from(t).map_err(|_| format!("token id {t}")))
            .collect()
    };
    if raw.first() != Some(&PACKED) {
        return ids(raw);
    }
    // The packed list: marker, version, count, ids, media keys (none for text).
    if raw.get(1).map(|v| *v as u32) != Some(PACKED_VERSION) {
        return Err(format!("packed token list version {:?}", raw.get(1)));
    }
    let n = raw.get(2).map_or(usize::MAX, |n| *n as u32 as usize);
    let end = 3usize.saturating_add(n);
    if end >= raw.len() {
        return Err("packed token list is short".into());
    }
    if raw[end] != 0 || end + 1 != raw.len() {
        return Err("the slot holds media (an mmproj's), not only tokens".into());
    }
    ids(&raw[3..end])
}

fn read_stream(r: &mut Reader, cells: usize, streams: u32, tokens: &[u32]) -> Result<SlotState, String> {
    // Each cell's position: where its rows go.
    let mut at_pos = vec![usize::MAX; cells];
    for cell in 0..cells {
        let pos = r.i32("a cell's position")?;
        let seqs = r.u32("a cell's sequence count")?;
        if seqs != 1 {
            return Err(format!("a cell of {seqs} sequences"));
        }
        r.i32("a cell's sequence")?;
        let slot = usize::try_from(pos)
            .ok()
            .filter(|p| *p < cells)
            .ok_or_else(|| format!("cell at position {pos} of {cells}"))?;
        if at_pos[slot] != usize::MAX {
            return Err(format!("two cells at position {pos}"));
        }
        at_pos[slot] = cell;
    }
    let v_trans = r.u32("the V layout")? != 0;
    let layers = r.u32("the layer count")?;
    if layers == 0 || layers > 4096 {
        return Err(format!("{layers} layers"));
    }
    let rot_k = r.u32("the key rotation")?;
    let rot_v = r.u32("the value rotation")?;
    let reorder = |data: &[u8], row: usize| -> Vec<u8> {
        let mut out = Vec::with_capacity(data.len());
        for &cell in &at_pos {
            out.extend_from_slice(&data[cell * row..(cell + 1) * row]);
        }
        out
    };
    let (mut k, mut k_type, mut k_row) = (Vec::with_capacity(layers as usize), None, None);
    for _ in 0..layers {
        let ty = r.i32("a key type")?;
        let row = r.u64("a key row size")? as usize;
        same(&mut k_type, ty, "key types")?;
        same(&mut k_row, row, "key rows")?;
        let len = row.checked_mul(cells).ok_or("key rows overflow")?;
        k.push(reorder(r.take(len, "the keys")?, row));
    }
    let (mut v, mut v_type, mut v_row, mut v_el) = (Vec::with_capacity(layers as usize), None, None, 0);
    for _ in 0..layers {
        let ty = r.i32("a value type")?;
        same(&mut v_type, ty, "value types")?;
        if !v_trans {
            let row = r.u64("a value row size")? as usize;
            same(&mut v_row, row, "value rows")?;
            let len = row.checked_mul(cells).ok_or("value rows overflow")?;
            v.push(reorder(r.take(len, "the values")?, row));
            continue;
        }
        let el = r.u32("a value element size")?;
        let width = r.u32("a value width")? as usize;
        v_el = el;
        let el = el as usize;
        let row = width * el;
        same(&mut v_row, row, "value rows")?;
        let data = r.take(row.checked_mul(cells).ok_or("values overflow")?, "the values")?;
        // Element j of cell c sits at (j * cells + c) * el.
        let mut rows = vec![0u8; row * cells];
        for (p, &cell) in at_pos.iter().enumerate() {
            for j in 0..width {
                let from = (j * cells + cell) * el;
                rows[p * row + j * el..p * row + (j + 1) * el].copy_from_slice(&data[from..from + el]);
            }
        }
        v.push(rows);
    }
    let layout = Layout {
        streams,
        v_trans,
        layers,
        rot_k,
        rot_v,
        k_type: k_type.unwrap_or_default(),
        v_type: v_type.unwrap_or_default(),
        k_row: k_row.unwrap_or_default(),
        v_row: v_row.unwrap_or_default(),
        v_el,
    };
    Ok(SlotState {
        layout,
        tokens: tokens.to_vec(),
        cells,
        k,
        v,
    })
}

fn same<T: PartialEq + Copy + std::fmt::Debug>(seen: &mut Option<T>, now: T, what: &str) -> Result<(), String> {
    match seen {
        Some(s) if *s != now => Err(format!("{what} differ between layers ({s:?}, {now:?})")),
        _ => {
            *seen = Some(now);
            Ok(())
        }
    }
}

impl SlotState {
    /// Leading tokens whose KV it holds that begin `tokens` too.
    pub fn shared_prefix(&self, tokens: &[u32]) -> usize {
        self.tokens[..self.cells.min(self.tokens.len())]
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Blocks `first..first + count` of `block_tokens` positions each, as the
    /// exchange sends them: every layer's key rows of the block, then every
    /// layer's value rows.
    pub fn blocks(&self, first: usize, count: usize, block_tokens: usize) -> Vec<u8> {
        let (k_row, v_row) = (self.layout.k_row, self.layout.v_row);
        let mut out = Vec::with_capacity(count * block_tokens * self.layout.layers as usize * (k_row + v_row));
        for b in first..first + count {
            let (from, to) = (b * block_tokens, (b + 1) * block_tokens);
            for k in &self.k {
                out.extend_from_slice(&k[from * k_row..to * k_row]);
            }
            for v in &self.v {
                out.extend_from_slice(&v[from * v_row..to * v_row]);
            }
        }
        out
    }
}

/// Bytes of one block of `block_tokens` positions in `layout`.
pub fn block_bytes(layout: &Layout, block_tokens: usize) -> usize {
    block_tokens * layout.layers as usize * (layout.k_row + layout.v_row)
}

/// A slot file holding `tokens` (a whole number of blocks) with the KV in `blocks`
/// ([`SlotState::blocks`]' order), for a server of `layout` to restore.
pub fn write(layout: &Layout, tokens: &[u32], blocks: &[u8], block_tokens: usize) -> Result<Vec<u8>, String> {
    let n = tokens.len();
    let per_block = block_bytes(layout, block_tokens);
    if block_tokens == 0 || !n.is_multiple_of(block_tokens) || blocks.len() != n / block_tokens * per_block {
        return Err(format!(
            "{} bytes of KV for {n} tokens in blocks of {block_tokens} ({per_block} bytes each)",
            blocks.len()
        ));
    }
    let layers = layout.layers as usize;
    let (k_row, v_row) = (layout.k_row, layout.v_row);
    // Rows per layer, position order.
    let mut k = vec![Vec::with_capacity(n * k_row); layers];
    let mut v = vec![Vec::with_capacity(n * v_row); layers];
    for block in blocks.chunks_exact(per_block) {
        let mut at = 0;
        for rows in k.iter_mut() {
            rows.extend_from_slice(&block[at..at + block_tokens * k_row]);
            at += block_tokens * k_row;
        }
        for rows in v.iter_mut() {
            rows.extend_from_slice(&block[at..at + block_tokens * v_row]);
            at += block_tokens * v_row;
        }
    }
    let mut out = Vec::with_capacity(64 + 16 * n + blocks.len());
    let u32s = |out: &mut Vec<u8>, x: u32| out.extend_from_slice(&x.to_le_bytes());
    u32s(&mut out, MAGIC);
    u32s(&mut out, VERSION);
    u32s(&mut out, n as u32);
    for &t in tokens {
        u32s(&mut out, t);
    }
    u32s(&mut out, layout.streams);
    // The cells go in the first stream; the server reads them into the slot's own.
    u32s(&mut out, n as u32);
    for pos in 0..n {
        u32s(&mut out, pos as u32);
        u32s(&mut out, 1);
        u32s(&mut out, 0);
    }
    u32s(&mut out, u32::from(layout.v_trans));
    u32s(&mut out, layout.layers);
    u32s(&mut out, layout.rot_k);
    u32s(&mut out, layout.rot_v);
    for rows in &k {
        u32s(&mut out, layout.k_type as u32);
        out.extend_from_slice(&(k_row as u64).to_le_bytes());
        out.extend_from_slice(rows);
    }
    for rows in &v {
        u32s(&mut out, layout.v_type as u32);
        if !layout.v_trans {
            out.extend_from_slice(&(v_row as u64).to_le_bytes());
            out.extend_from_slice(rows);
            continue;
        }
        let el = layout.v_el as usize;
        if el == 0 || !v_row.is_multiple_of(el) {
            return Err(format!("a transposed V of {v_row}-byte rows in {el}-byte elements"));
        }
        let width = v_row / el;
        u32s(&mut out, el as u32);
        u32s(&mut out, width as u32);
        for j in 0..width {
            for p in 0..n {
                out.extend_from_slice(&rows[p * v_row + j * el..p * v_row + (j + 1) * el]);
            }
        }
    }
    for _ in 1..layout.streams {
        u32s(&mut out, 0);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(v_trans: bool) -> Layout {
        Layout {
            streams: 2,
            v_trans,
            layers: 3,
            rot_k: 0,
            rot_v: 0,
            k_type: 1,
            v_type: 1,
            k_row: 8,
            v_row: 8,
            v_el: if v_trans { 2 } else { 0 },
        }
    }

    fn kv(n: usize) -> Vec<u8> {
        (0..n * 3 * 16).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn a_written_file_reads_back_to_the_same_blocks_in_both_v_layouts() {
        for v_trans in [false, true] {
            let l = layout(v_trans);
            let tokens: Vec<u32> = (100..108).collect();
            let blocks = kv(8);
            let file = write(&l, &tokens, &blocks, 4).unwrap();
            let s = parse(&file).unwrap();
            assert_eq!(s.layout, l);
            assert_eq!(s.tokens, tokens);
            assert_eq!(s.cells, 8);
            assert_eq!(s.blocks(0, 2, 4), blocks, "v_trans {v_trans}");
            assert_eq!(s.blocks(1, 1, 4), blocks[blocks.len() / 2..]);
            assert_eq!(s.shared_prefix(&[100, 101, 9]), 2);
        }
    }

    #[test]
    fn cells_out_of_order_are_put_in_position_order() {
        // Two cells written by hand with positions 1 then 0, one layer.
        let mut f = Vec::new();
        for x in [MAGIC, VERSION, 2, 5, 6, 1, 2] {
            f.extend_from_slice(&x.to_le_bytes());
        }
        for (pos, seq) in [(1u32, 0u32), (0, 0)] {
            for x in [pos, 1, seq] {
                f.extend_from_slice(&x.to_le_bytes());
            }
        }
        for x in [0u32, 1, 0, 0, 1] {
            f.extend_from_slice(&x.to_le_bytes());
        }
        f.extend_from_slice(&2u64.to_le_bytes());
        f.extend_from_slice(&[11, 11, 22, 22]); // K: cell 0 (pos 1), cell 1 (pos 0)
        f.extend_from_slice(&1u32.to_le_bytes());
        f.extend_from_slice(&2u64.to_le_bytes());
        f.extend_from_slice(&[33, 33, 44, 44]);
        let s = parse(&f).unwrap();
        assert_eq!(s.k[0], vec![22, 22, 11, 11]);
        assert_eq!(s.v[0], vec![44, 44, 33, 33]);
        assert_eq!(s.tokens, vec![5, 6]);
    }

    #[test]
    fn truncated_foreign_and_packed_files() {
        let l = layout(false);
        let file = write(&l, &[1, 2, 3, 4], &kv(4), 4).unwrap();
        for cut in [0, 3, 11, 40, file.len() - 1] {
            assert!(parse(&file[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = file.clone();
        extra.push(0);
        assert!(parse(&extra).unwrap_err().contains("after the cache"));
        let mut other = file.clone();
        other[4] = 3;
        assert!(parse(&other).unwrap_err().contains("version 3"));
        assert_eq!(unpack(&[-1, 1, 2, 7, 8, 0]).unwrap(), vec![7, 8]);
        assert!(unpack(&[-1, 1, 2, 7, 8, 1, 0]).unwrap_err().contains("media"));
        assert!(write(&l, &[1, 2, 3], &kv(3), 4).is_err(), "not whole blocks");
    }
}
