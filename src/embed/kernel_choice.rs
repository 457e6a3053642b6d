//! Which kernels the encoders run on: part of the model's configuration (`[model.kernels]`
//! of ragline.toml), with the environment variables over it (`RAGLINE_CPU_KERNELS`,
//! `RAGLINE_CPU_AMX`, `RAGLINE_CUBLASLT`, `RAGLINE_PIPELINE`: for trying a path without
//! editing a file). The choice is the process's: the CPU's features and the tile permission
//! are set up once, so the first model loaded fixes it, and a later model asking for other
//! kernels is told so in the log.

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

/// The kernel settings of a model.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Kernels {
    /// The CPU kernel path: auto (the best this CPU has), avx512, avx2 or portable.
    /// `RAGLINE_CPU_KERNELS` overrides it.
    pub cpu: String,
    /// bf16 and int8 dense layers on AMX tiles where the CPU has them (false: the AVX-512
    /// kernels alone). `RAGLINE_CPU_AMX=off` overrides it.
    pub amx: bool,
    /// CUDA in f16: the linear layers through cuBLASLt with fused bias and GELU.
    /// `RAGLINE_CUBLASLT=1` overrides it.
    pub cublaslt: bool,
    /// A GPU: copy a batch's vectors back while the next batches run. `RAGLINE_PIPELINE=1`
    /// overrides it.
    pub pipeline: bool,
}

impl Default for Kernels {
    fn default() -> Self {
        Kernels {
            cpu: "auto".into(),
            amx: true,
            cublaslt: false,
            pipeline: false,
        }
    }
}

/// The variable that forces a CPU kernel path.
pub const CPU_ENV: &str = "RAGLINE_CPU_KERNELS";
/// The variable that turns AMX off (`off`, `0`, `no`) or on.
pub const AMX_ENV: &str = "RAGLINE_CPU_AMX";
/// The variable that turns the cuBLASLt path on (`1`).
pub const CUBLASLT_ENV: &str = "RAGLINE_CUBLASLT";
/// The variable that turns the GPU readback pipeline on (`1`).
pub const PIPELINE_ENV: &str = "RAGLINE_PIPELINE";

impl Kernels {
    /// These settings with the environment's variables over them.
    pub fn with_env(&self) -> Kernels {
        let var = |name: &str| std::env::var(name).ok();
        let flag = |name: &str, now: bool| match var(name).as_deref().map(str::trim) {
            Some("1" | "on" | "yes" | "true") => true,
            Some("0" | "off" | "no" | "false") => false,
            _ => now,
        };
        Kernels {
            cpu: var(CPU_ENV).unwrap_or_else(|| self.cpu.clone()),
            amx: flag(AMX_ENV, self.amx),
            cublaslt: flag(CUBLASLT_ENV, self.cublaslt),
            pipeline: flag(PIPELINE_ENV, self.pipeline),
        }
    }
}

static CHOSEN: OnceLock<Kernels> = OnceLock::new();

/// Fix the process's kernels from a model's settings (the environment over them), before
/// its first model loads; a later call asking for other kernels keeps the first choice and
/// says so.
pub fn choose(settings: &Kernels) {
    let wanted = settings.with_env();
    let chosen = CHOSEN.get_or_init(|| wanted.clone());
    if *chosen != wanted {
        tracing::warn!(
            "kernels {wanted:?} asked for after the process chose {chosen:?}: the first model's \
             choice stays (kernels are chosen once per process)"
        );
    }
}

/// The process's kernels: those [`choose`] fixed, else the defaults with the environment over
/// them.
pub fn chosen() -> &'static Kernels {
    CHOSEN.get_or_init(|| Kernels::default().with_env())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_settings_read_back_and_refuse_unknown_keys() {
        let k: Kernels = toml::from_str("cpu = \"avx2\"\namx = false\n").unwrap();
        assert_eq!(k.cpu, "avx2");
        assert!(!k.amx && !k.cublaslt && !k.pipeline);
        assert!(toml::from_str::<Kernels>("amx_tiles = true\n").is_err());
        assert_eq!(Kernels::default().cpu, "auto");
    }
}
