//! Chunked prefill's budget: how many prompt tokens ride in one decode step while
//! other streams generate (the batcher's [`ChunkBudget`]).

/// How many prompt tokens a chunk gets: fixed, or so that a chunk costs about one
/// decode step, from running averages of what steps took.
pub struct ChunkBudget {
    /// Tokens per chunk; 0 = from the averages.
    fixed: usize,
    /// Microseconds of a step with no chunk (exponential average).
    step_us: f64,
    /// Microseconds per prompt token (exponential average).
    token_us: f64,
}

impl ChunkBudget {
    /// Bounds of a measured chunk: small enough to matter, large enough that the
    /// prompt's matmuls still run as tiles.
    const MIN: usize = 16;
    const MAX: usize = 512;

    pub fn new(fixed: usize) -> Self {
        Self {
            fixed,
            step_us: 0.0,
            token_us: 0.0,
        }
    }

    pub fn tokens(&self) -> usize {
        if self.fixed > 0 {
            return self.fixed;
        }
        if self.step_us <= 0.0 || self.token_us <= 0.0 {
            return 64;
        }
        ((self.step_us / self.token_us) as usize).clamp(Self::MIN, Self::MAX)
    }

    fn average(avg: &mut f64, sample: f64) {
        *avg = if *avg <= 0.0 { sample } else { 0.8 * *avg + 0.2 * sample };
    }

    /// A step of `rows` decode rows and `chunk` prompt tokens took `us`.
    pub fn observe(&mut self, rows: usize, chunk: usize, us: f64) {
        if chunk == 0 {
            if rows > 0 {
                Self::average(&mut self.step_us, us);
            }
        } else if rows == 0 {
            Self::average(&mut self.token_us, us / chunk as f64);
        } else if self.step_us > 0.0 {
            let extra = (us - self.step_us).max(us * 0.1);
            Self::average(&mut self.token_us, extra / chunk as f64);
        }
    }
}
