//! Which CPU kernels run: chosen at run time from the CPU's features, or forced by the model's
//! `[model.kernels] cpu = "avx512|avx2|portable"` or `RAGLINE_CPU_KERNELS` (to test every path
//! on one machine; see [`crate::embed::kernel_choice`]).
//!
//! All paths live in one binary, compiled with `#[target_feature]` per function, so no
//! `-C target-cpu=native` is needed and the binary runs on any x86-64 (or other) CPU.

use std::fmt;

use crate::embed::kernel_choice::{chosen, CPU_ENV};

/// Why a kernel path or precision cannot run here.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// `kernels.cpu` (or `RAGLINE_CPU_KERNELS`) names no kernel path.
    #[error(
        "kernels.cpu ({CPU_ENV}) = {0} is not a kernel path: use avx512, avx2, portable or auto"
    )]
    Unknown(String),
    /// The path or precision needs CPU features this one lacks: the message names them and
    /// what to use instead.
    #[error("{0}")]
    Unsupported(String),
}

/// A family of CPU kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelPath {
    /// AVX-512 F/BW/VL intrinsics: ragline's own packed GEMM (f32, and bf16 or int8 where
    /// the CPU has AVX512-BF16 or AVX512-VNNI), attention, softmax, GELU and layer norm.
    Avx512,
    /// AVX2 + FMA intrinsics: ragline's packed GEMM with an AVX2 micro-kernel (f32 only),
    /// layer norm and GELU; softmax compiled for AVX2.
    Avx2,
    /// Plain Rust that runs anywhere: ragline's packed GEMM with a scalar micro-kernel that
    /// the compiler vectorises for the baseline instruction set.
    Portable,
}

impl KernelPath {
    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Avx512 => "avx512",
            KernelPath::Avx2 => "avx2",
            KernelPath::Portable => "portable",
        }
    }

    /// Whether this CPU can run the path.
    pub fn supported(self) -> bool {
        match self {
            KernelPath::Portable => true,
            KernelPath::Avx2 => features().avx2_fma,
            KernelPath::Avx512 => features().avx512,
        }
    }

    /// The fastest path this CPU supports.
    pub fn best() -> KernelPath {
        [KernelPath::Avx512, KernelPath::Avx2]
            .into_iter()
            .find(|p| p.supported())
            .unwrap_or(KernelPath::Portable)
    }

    /// The path the process's kernels name (`kernels.cpu`, `RAGLINE_CPU_KERNELS` over it),
    /// or the best one for `auto`.
    pub fn chosen() -> Result<KernelPath, KernelError> {
        KernelPath::choose(&chosen().cpu)
    }

    /// The path a `RAGLINE_CPU_KERNELS` value names, checked against this CPU.
    pub fn choose(value: &str) -> Result<KernelPath, KernelError> {
        let path = match value.trim() {
            "" | "auto" => return Ok(KernelPath::best()),
            "avx512" => KernelPath::Avx512,
            "avx2" => KernelPath::Avx2,
            "portable" => KernelPath::Portable,
            other => return Err(KernelError::Unknown(other.to_string())),
        };
        if !path.supported() {
            return Err(KernelError::Unsupported(format!(
                "kernels.cpu ({CPU_ENV}) = {} but this CPU lacks {} (it has: {}); use {} or auto",
                path.name(),
                match path {
                    KernelPath::Avx512 => "AVX-512 F/BW/VL",
                    _ => "AVX2 and FMA",
                },
                features(),
                KernelPath::best().name()
            )));
        }
        Ok(path)
    }
}

impl fmt::Display for KernelPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The CPU features the kernels care about.
#[derive(Clone, Copy, Debug, Default)]
pub struct Features {
    pub avx2_fma: bool,
    /// AVX-512 F, BW and VL together.
    pub avx512: bool,
    pub avx512_bf16: bool,
    pub avx512_vnni: bool,
    /// AMX-BF16 tiles, granted by the OS, beside AVX512-BF16 (the bf16 GEMM runs on them).
    pub amx_bf16: bool,
    /// AMX-INT8 tiles, granted by the OS, beside AVX512-VNNI (the int8 GEMM runs on them).
    pub amx_int8: bool,
}

/// The features of this CPU, detected once.
pub fn features() -> Features {
    static FEATURES: std::sync::OnceLock<Features> = std::sync::OnceLock::new();
    *FEATURES.get_or_init(detect)
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Features {
    use std::is_x86_feature_detected as has;
    let avx512 = has!("avx512f") && has!("avx512bw") && has!("avx512vl");
    let (avx512_bf16, avx512_vnni) = (avx512 && has!("avx512bf16"), avx512 && has!("avx512vnni"));
    let (amx_bf16, amx_int8) = if avx512_bf16 || avx512_vnni {
        super::amx::detect()
    } else {
        (false, false)
    };
    Features {
        avx2_fma: has!("avx2") && has!("fma"),
        avx512,
        avx512_bf16,
        avx512_vnni,
        amx_bf16: amx_bf16 && avx512_bf16,
        amx_int8: amx_int8 && avx512_vnni,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Features {
    Features::default()
}

impl fmt::Display for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = [
            (self.avx2_fma, "avx2+fma"),
            (self.avx512, "avx512f/bw/vl"),
            (self.avx512_bf16, "avx512-bf16"),
            (self.avx512_vnni, "avx512-vnni"),
            (self.amx_bf16, "amx-bf16"),
            (self.amx_int8, "amx-int8"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if names.is_empty() {
            f.write_str("no SIMD extension ragline uses")
        } else {
            f.write_str(&names.join(", "))
        }
    }
}

/// The f32 FLOP/s this machine reaches on `path`'s widest FMA, all rayon threads busy with
/// independent FMA chains for about `seconds`: the roof of a roofline. None on the portable
/// path (its width is the compiler's choice).
pub fn peak_flops(path: KernelPath, seconds: f64) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        use rayon::prelude::*;
        let (probe, flops_per_iter): (unsafe fn(usize) -> f32, f64) = match path {
            KernelPath::Avx512 => (super::avx512::fma_probe, 24.0 * 16.0 * 2.0),
            KernelPath::Avx2 => (super::avx2::fma_probe, 12.0 * 8.0 * 2.0),
            KernelPath::Portable => return None,
        };
        if !path.supported() {
            return None;
        }
        let threads = rayon::current_num_threads().max(1);
        // Calibrate on one thread, then time all of them together.
        let mut iters = 1 << 16;
        let per_iter = loop {
            let t = std::time::Instant::now();
            // SAFETY: the CPU supports the path (checked above).
            std::hint::black_box(unsafe { probe(iters) });
            let s = t.elapsed().as_secs_f64();
            if s > 0.05 {
                break s / iters as f64;
            }
            iters *= 4;
        };
        let iters = ((seconds / per_iter) as usize).max(1);
        let t = std::time::Instant::now();
        (0..threads).into_par_iter().for_each(|_| {
            // SAFETY: as above.
            std::hint::black_box(unsafe { probe(iters) });
        });
        let s = t.elapsed().as_secs_f64();
        Some(threads as f64 * iters as f64 * flops_per_iter / s)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (path, seconds);
        None
    }
}

/// The number format of the encoder's dense layers on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    F32,
    /// bf16 weights and activations, f32 accumulation (AMX `tdpbf16ps` where the CPU and
    /// the OS offer the tiles, else AVX512-BF16 `vdpbf16ps`).
    Bf16,
    /// int8 weights per output channel and activations per token, i32 accumulation (AMX
    /// `tdpbusd` where offered, else AVX512-VNNI `vpdpbusd`).
    Int8,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
        }
    }

    /// Check that `path` on this CPU runs this precision natively; the message names what is
    /// missing and what to do instead (never a slow emulation).
    pub fn check(self, path: KernelPath) -> Result<(), KernelError> {
        let f = features();
        let (ok, needs) = match self {
            Precision::F32 => return Ok(()),
            Precision::Bf16 => (
                path == KernelPath::Avx512 && f.avx512_bf16,
                "AVX512-BF16 (Intel Cooper Lake, Sapphire Rapids or later; AMD Zen 4 or later)",
            ),
            Precision::Int8 => (
                path == KernelPath::Avx512 && f.avx512_vnni,
                "AVX512-VNNI (Intel Cascade Lake or later; AMD Zen 4 or later)",
            ),
        };
        if ok {
            return Ok(());
        }
        Err(KernelError::Unsupported(format!(
            "--dtype {} on the CPU needs {needs} and the avx512 kernels; this CPU has {} and \
             runs the {} kernels. Use --dtype f32 (the default on the CPU)",
            self.name(),
            f,
            path
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_the_cpu_lacks_is_refused_with_the_fix() {
        assert_eq!(
            KernelPath::choose("portable").unwrap(),
            KernelPath::Portable
        );
        assert_eq!(KernelPath::choose("auto").unwrap(), KernelPath::best());
        let err = KernelPath::choose("sse9").unwrap_err().to_string();
        assert!(err.contains("use avx512, avx2, portable"), "{err}");
        if !KernelPath::Avx512.supported() {
            let err = KernelPath::choose("avx512").unwrap_err().to_string();
            assert!(
                err.contains("lacks AVX-512") && err.contains("unset it"),
                "{err}"
            );
        }
    }

    #[test]
    fn low_precision_needs_the_avx512_path() {
        assert!(Precision::F32.check(KernelPath::Portable).is_ok());
        let err = Precision::Bf16
            .check(KernelPath::Portable)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--dtype f32"), "{err}");
        let err = Precision::Int8
            .check(KernelPath::Avx2)
            .unwrap_err()
            .to_string();
        assert!(err.contains("AVX512-VNNI"), "{err}");
    }
}
