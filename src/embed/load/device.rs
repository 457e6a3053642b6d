//! Choosing the devices the embedder runs on, and saying which and why.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::str::FromStr;

use candle_core::{DType, Device};

use crate::embed::EmbedError;

/// `--device`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// CUDA if built in and present, then Metal, then the CPU.
    Auto,
    Cpu,
    /// `cuda`, `cuda:1`, `cuda:0,1`: one embedder per listed GPU.
    Cuda(Vec<usize>),
    Metal,
}

impl FromStr for DeviceChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "metal" => Ok(DeviceChoice::Metal),
            "cuda" => Ok(DeviceChoice::Cuda(vec![0])),
            _ => {
                let list = s.strip_prefix("cuda:").ok_or_else(|| {
                    format!("unknown device `{s}`: use auto, cpu, cuda[:N[,M..]] or metal")
                })?;
                let ordinals = list
                    .split(',')
                    .map(|n| n.trim().parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| format!("bad GPU list in `{s}`: use e.g. cuda:0 or cuda:0,1"))?;
                Ok(DeviceChoice::Cuda(ordinals))
            }
        }
    }
}

/// `--dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeChoice {
    /// f32 on the CPU, f16 on a GPU.
    Auto,
    F32,
    F16,
    BF16,
    /// int8 dense layers on the CPU (AVX512-VNNI).
    Int8,
}

impl FromStr for DTypeChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(DTypeChoice::Auto),
            "f32" => Ok(DTypeChoice::F32),
            "f16" => Ok(DTypeChoice::F16),
            "bf16" => Ok(DTypeChoice::BF16),
            "int8" => Ok(DTypeChoice::Int8),
            _ => Err(format!(
                "unknown dtype `{s}`: use auto, f32, f16, bf16 or int8"
            )),
        }
    }
}

impl DTypeChoice {
    /// The choice that names `dtype` (f32 for any other).
    pub fn of(dtype: candle_core::DType) -> Self {
        match dtype {
            candle_core::DType::F16 => DTypeChoice::F16,
            candle_core::DType::BF16 => DTypeChoice::BF16,
            _ => DTypeChoice::F32,
        }
    }

    /// The dtype a model that runs in f32 on the CPU (a reranker, a SPLADE model: `what`)
    /// takes for this choice: f32 there (bf16 and int8 are the embedders' fused engine's,
    /// refused); f16 or bf16 on a GPU (int8 refused).
    pub fn f32_on_cpu(
        self,
        device: &Device,
        what: &str,
    ) -> Result<DType, crate::embed::EmbedError> {
        match (device.is_cpu(), self) {
            (true, DTypeChoice::Auto | DTypeChoice::F32) => Ok(DType::F32),
            (true, _) => Err(crate::embed::EmbedError::Unsupported(format!(
                "{what} runs in f32 on the CPU; use --dtype f32 (or auto)"
            ))),
            (false, DTypeChoice::Int8) => Err(crate::embed::EmbedError::Unsupported(
                "--dtype int8 runs on the CPU only; on a GPU use f16 or bf16".into(),
            )),
            (false, c) => Ok(c.resolve(device)),
        }
    }

    pub fn resolve(self, device: &Device) -> DType {
        match self {
            DTypeChoice::Auto if device.is_cpu() => DType::F32,
            DTypeChoice::Auto => DType::F16,
            DTypeChoice::F32 => DType::F32,
            DTypeChoice::F16 => DType::F16,
            DTypeChoice::BF16 => DType::BF16,
            // Not a candle dtype: the fused CPU encoder quantises its weights from f32.
            DTypeChoice::Int8 => DType::F32,
        }
    }
}

/// A device to run an embedder on, with why it was chosen.
#[derive(Clone, Debug)]
pub struct SelectedDevice {
    pub device: Device,
    /// "cpu", "cuda:0", "metal".
    pub label: String,
    pub reason: String,
}

/// Open the devices `choice` names.
pub fn select(choice: &DeviceChoice) -> Result<Vec<SelectedDevice>, EmbedError> {
    match choice {
        DeviceChoice::Cpu => Ok(vec![cpu("asked for with --device cpu".into())]),
        DeviceChoice::Cuda(ordinals) => ordinals
            .iter()
            .map(|&i| {
                open_cuda(i).map(|device| SelectedDevice {
                    device,
                    label: format!("cuda:{i}"),
                    reason: "asked for with --device".into(),
                })
            })
            .collect(),
        DeviceChoice::Metal => open_metal().map(|device| {
            vec![SelectedDevice {
                device,
                label: "metal".into(),
                reason: "asked for with --device metal".into(),
            }]
        }),
        DeviceChoice::Auto => {
            let cuda_why = if cfg!(feature = "cuda") {
                match open_cuda(0) {
                    Ok(device) => {
                        return Ok(vec![SelectedDevice {
                            device,
                            label: "cuda:0".into(),
                            reason: "auto: a CUDA GPU is present".into(),
                        }])
                    }
                    Err(e) => format!("no usable CUDA GPU ({e})"),
                }
            } else {
                "built without the `cuda` feature".to_string()
            };
            let metal_why = if cfg!(feature = "metal") {
                match open_metal() {
                    Ok(device) => {
                        return Ok(vec![SelectedDevice {
                            device,
                            label: "metal".into(),
                            reason: format!("auto: {cuda_why}; a Metal GPU is present"),
                        }])
                    }
                    Err(e) => format!("no usable Metal GPU ({e})"),
                }
            } else {
                "built without the `metal` feature".to_string()
            };
            Ok(vec![cpu(format!("auto: {cuda_why}; {metal_why}"))])
        }
    }
}

fn cpu(reason: String) -> SelectedDevice {
    SelectedDevice {
        device: Device::Cpu,
        label: "cpu".into(),
        reason,
    }
}

/// Open a CUDA device. A missing driver or library can panic inside the CUDA bindings: that
/// becomes an error, not a crash.
fn open_cuda(ordinal: usize) -> Result<Device, EmbedError> {
    if !cfg!(feature = "cuda") {
        return Err(EmbedError::Device(
            "this ragline was built without CUDA; rebuild with `--features cuda` \
             (scripts/build-cuda.sh) or use --device cpu"
                .into(),
        ));
    }
    match catch_unwind(AssertUnwindSafe(|| Device::new_cuda(ordinal))) {
        Ok(Ok(device)) => Ok(device),
        Ok(Err(e)) => Err(EmbedError::Device(format!(
            "cannot open cuda:{ordinal}: {e}"
        ))),
        Err(_) => Err(EmbedError::Device(format!(
            "cannot open cuda:{ordinal}: the CUDA driver or libraries are missing \
             (check LD_LIBRARY_PATH and `nvidia-smi`)"
        ))),
    }
}

fn open_metal() -> Result<Device, EmbedError> {
    if !cfg!(feature = "metal") {
        return Err(EmbedError::Device(
            "this ragline was built without Metal; rebuild with `--features metal` or use \
             --device cpu"
                .into(),
        ));
    }
    Device::new_metal(0).map_err(|e| EmbedError::Device(format!("cannot open Metal: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_lists() {
        assert_eq!("cuda:0,1".parse(), Ok(DeviceChoice::Cuda(vec![0, 1])));
        assert_eq!("cuda".parse(), Ok(DeviceChoice::Cuda(vec![0])));
        assert!("tpu".parse::<DeviceChoice>().is_err());
        assert!("cuda:x".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn auto_says_why_it_fell_back_to_the_cpu() {
        if cfg!(feature = "cuda") || cfg!(feature = "metal") {
            return;
        }
        let picked = select(&DeviceChoice::Auto).unwrap();
        assert_eq!(picked.len(), 1);
        assert_eq!(picked[0].label, "cpu");
        assert!(
            picked[0].reason.contains("without the `cuda` feature"),
            "{}",
            picked[0].reason
        );
    }
}
