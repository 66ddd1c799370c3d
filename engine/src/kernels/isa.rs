//! Which SIMD kernels the CPU engine runs, chosen once at start from the CPU it finds.
//!
//! One binary serves every host of a mixed fleet: it is built for the baseline of its
//! architecture (no `target-cpu=native`), and each kernel family exists in several
//! variants compiled with `#[target_feature]`. [`active`] picks the best variant the
//! CPU supports, unless `SWITCHYARD_CPU_ISA` forces one (for tests and comparisons).
//!
//! Every variant computes the same bits: the integer parts of the dot products are
//! exact whatever the instructions, and the float parts keep ggml's AVX2 order (8
//! lanes per block, the same fused multiply-adds, the same horizontal sums). So a
//! prompt gets the same tokens on an AVX2 laptop, an AVX-512 server and the portable
//! path, and one reference (a llama-server built for AVX2) checks them all exactly.

use std::sync::OnceLock;

/// A kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Plain Rust, no intrinsics: any CPU (LLVM vectorises it with the baseline SIMD
    /// of the target, e.g. SSE2 on x86-64 and NEON on aarch64).
    Portable,
    /// AVX2 + FMA + F16C (Haswell, Zen 1 and later): ggml's own AVX2 kernels.
    Avx2,
    /// AVX2 with AVX-VNNI's `vpdpbusd` for the 8-bit dot products (Alder Lake, Sierra
    /// Forest, Zen 5).
    AvxVnni,
    /// AVX-512 F/BW/VL/DQ with VNNI (Ice Lake, Sapphire Rapids, Zen 4/5): 512-bit
    /// registers holding two rows' 8 lanes each.
    Avx512,
}

/// Why `SWITCHYARD_CPU_ISA` could not be honoured.
#[derive(Debug, thiserror::Error)]
pub enum IsaError {
    #[error("SWITCHYARD_CPU_ISA={0:?} is not a kernel variant (one of: portable, avx2, avx-vnni, avx512)")]
    Unknown(String),
    #[error("SWITCHYARD_CPU_ISA={name} needs CPU features this host lacks ({needs}); it supports: {supported}")]
    Unsupported {
        name: &'static str,
        needs: &'static str,
        supported: String,
    },
}

impl Isa {
    /// Every variant, best first.
    pub const ALL: [Isa; 4] = [Isa::Avx512, Isa::AvxVnni, Isa::Avx2, Isa::Portable];

    /// The name used in logs, `status` and `SWITCHYARD_CPU_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512 => "avx512",
        }
    }

    /// The CPU features the variant needs, as `/proc/cpuinfo` names them.
    pub fn needs(self) -> &'static str {
        match self {
            Isa::Portable => "nothing",
            Isa::Avx2 => "avx2 fma f16c",
            Isa::AvxVnni => "avx2 fma f16c avx_vnni",
            Isa::Avx512 => "avx512f avx512bw avx512vl avx512dq avx512_vnni fma f16c",
        }
    }

    /// Parses a name (also accepts `avxvnni`, `avx512vnni`, `scalar`).
    pub fn parse(s: &str) -> Option<Isa> {
        match s.trim().to_ascii_lowercase().replace('_', "-").as_str() {
            "portable" | "scalar" | "generic" => Some(Isa::Portable),
            "avx2" => Some(Isa::Avx2),
            "avx-vnni" | "avxvnni" => Some(Isa::AvxVnni),
            "avx512" | "avx-512" | "avx512vnni" | "avx512-vnni" => Some(Isa::Avx512),
            _ => None,
        }
    }

    /// Whether this CPU can run the variant.
    pub fn supported(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            let avx2 = has!("avx2") && has!("fma") && has!("f16c");
            match self {
                Isa::Portable => true,
                Isa::Avx2 => avx2,
                Isa::AvxVnni => avx2 && has!("avxvnni"),
                Isa::Avx512 => {
                    avx2 && has!("avx512f")
                        && has!("avx512bw")
                        && has!("avx512vl")
                        && has!("avx512dq")
                        && has!("avx512vnni")
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Isa::Portable
        }
    }

    /// The variants this CPU supports, best first.
    pub fn available() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.supported()).collect()
    }

    /// The best variant this CPU supports.
    pub fn best() -> Isa {
        Isa::ALL.into_iter().find(|i| i.supported()).unwrap_or(Isa::Portable)
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The variant `SWITCHYARD_CPU_ISA` asks for (or the best one when it is unset or
/// empty), checked against this CPU.
pub fn select() -> Result<Isa, IsaError> {
    match std::env::var("SWITCHYARD_CPU_ISA") {
        Ok(v) if !v.trim().is_empty() => {
            let isa = Isa::parse(&v).ok_or(IsaError::Unknown(v))?;
            if isa.supported() {
                Ok(isa)
            } else {
                Err(IsaError::Unsupported {
                    name: isa.name(),
                    needs: isa.needs(),
                    supported: Isa::available().iter().map(|i| i.name()).collect::<Vec<_>>().join(", "),
                })
            }
        }
        _ => Ok(Isa::best()),
    }
}

static ACTIVE: OnceLock<Isa> = OnceLock::new();

/// Chooses the engine's variant once per process (see [`select`]) and logs it. Loading
/// a model calls this first, so a bad `SWITCHYARD_CPU_ISA` fails the load by name.
pub fn init() -> Result<Isa, IsaError> {
    if let Some(isa) = ACTIVE.get() {
        return Ok(*isa);
    }
    let isa = select()?;
    let isa = *ACTIVE.get_or_init(|| isa);
    tracing::info!(
        kernels = isa.name(),
        available = %Isa::available().iter().map(|i| i.name()).collect::<Vec<_>>().join(","),
        "cpu engine kernels"
    );
    Ok(isa)
}

/// The variant in use ([`init`]'s choice; the best supported one if `init` failed or
/// was never called, so kernels never run instructions the CPU lacks).
#[inline]
pub fn active() -> Isa {
    *ACTIVE.get_or_init(|| select().unwrap_or_else(|_| Isa::best()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_the_best_is_supported() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse(isa.name()), Some(isa));
        }
        assert_eq!(Isa::parse("AVX_VNNI"), Some(Isa::AvxVnni));
        assert_eq!(Isa::parse("sse9"), None);
        assert!(Isa::best().supported());
        assert!(Isa::Portable.supported());
        assert_eq!(Isa::available()[0], Isa::best());
    }
}
