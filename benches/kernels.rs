//! The CPU GEMM kernels on the encoder's shapes, in FLOP/s (`Throughput::Elements` counts
//! floating-point operations: 2 x M x K x N): M = 2,048 tokens (the CPU batch budget), the
//! (K, N) of all-MiniLM-L6-v2's dense layers (QKV, attention output, FFN in, FFN out), or of
//! BERT-base's with `RAGLINE_BENCH_SHAPES=base`, per kernel path and precision this CPU
//! supports (bf16 and int8 on AMX tiles where the CPU and the OS offer them; with
//! `RAGLINE_CPU_AMX=off` on AVX-512 alone). `gemm-crate` is the `gemm` crate (candle's CPU
//! GEMM; it picks its own kernels), for comparison.
//!
//! A's rows are K values apart, or K + `RAGLINE_BENCH_PAD` (the encoder lays its activations
//! out at `gemm::row_stride`, which adds 16 to these shapes: compare with 0 and 16).
//!
//!     cargo bench --bench kernels
//!     RAGLINE_BENCH_SHAPES=base RAGLINE_BENCH_PAD=16 cargo bench --bench kernels

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ragline::embed::cpu::gemm::{self, Epilogue, Operands};
use ragline::embed::cpu::kernels::{features, KernelPath};
use ragline::embed::cpu::pack::{PackedBf16, PackedF32, PackedI8};

const M: usize = 2048;
const MINILM: [(&str, usize, usize); 4] = [
    ("qkv-384x1152", 384, 1152),
    ("out-384x384", 384, 384),
    ("ffn-in-384x1536", 384, 1536),
    ("ffn-out-1536x384", 1536, 384),
];
const BASE: [(&str, usize, usize); 4] = [
    ("qkv-768x2304", 768, 2304),
    ("out-768x768", 768, 768),
    ("ffn-in-768x3072", 768, 3072),
    ("ffn-out-3072x768", 3072, 768),
];

fn data(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect()
}

fn kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let shapes = match std::env::var("RAGLINE_BENCH_SHAPES").as_deref() {
        Ok("base") => BASE,
        _ => MINILM,
    };
    // Extra values at the end of each row of A (`RAGLINE_BENCH_PAD`): the row stride the
    // encoder's activations have.
    let pad: usize = std::env::var("RAGLINE_BENCH_PAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for (name, k, n) in shapes {
        let lda = k + pad;
        let a = data(M * lda);
        let b = data(k * n);
        let mut out = vec![0f32; M * n];
        group.throughput(Throughput::Elements((2 * M * k * n) as u64));
        let ops = |out: &mut Vec<f32>| Operands {
            a: a.as_ptr(),
            lda,
            m: M,
            c: out.as_mut_ptr(),
            ldc: n,
        };
        group.bench_function(BenchmarkId::new("gemm-crate", name), |bench| {
            let threads = gemm_crate_threads();
            // SAFETY: A [M, k] at lda, B [k, n], C [M, n]: the vectors above, of those sizes.
            bench.iter(|| unsafe {
                ::gemm::gemm(
                    M,
                    n,
                    k,
                    out.as_mut_ptr(),
                    1,
                    n as isize,
                    true,
                    a.as_ptr(),
                    1,
                    lda as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    threads,
                )
            })
        });
        for path in [KernelPath::Avx512, KernelPath::Avx2, KernelPath::Portable] {
            if !path.supported() {
                continue;
            }
            let packed = PackedF32::from_rows(&b, k, n);
            group.bench_function(BenchmarkId::new(format!("{path}-f32"), name), |bench| {
                // SAFETY: the operands are the vectors above, of the right sizes.
                bench.iter(|| unsafe {
                    gemm::f32_gemm(path, ops(&mut out), packed.view(), Epilogue::NONE, true)
                })
            });
        }
        #[cfg(target_arch = "x86_64")]
        if features().avx512_bf16 {
            let packed = PackedBf16::from_rows(&b, k, n);
            let label = if features().amx_bf16 {
                "amx-bf16"
            } else {
                "avx512-bf16"
            };
            group.bench_function(BenchmarkId::new(label, name), |bench| {
                // SAFETY: as above, and the CPU has AVX512-BF16.
                bench.iter(|| unsafe {
                    gemm::bf16_gemm(ops(&mut out), &packed, Epilogue::NONE, true)
                })
            });
        }
        #[cfg(target_arch = "x86_64")]
        if features().avx512_vnni {
            let packed = PackedI8::from_rows(&b, k, n);
            let label = if features().amx_int8 {
                "amx-int8"
            } else {
                "avx512-int8"
            };
            group.bench_function(BenchmarkId::new(label, name), |bench| {
                // SAFETY: as above, and the CPU has AVX512-VNNI.
                bench.iter(|| unsafe {
                    gemm::i8_gemm(ops(&mut out), &packed, Epilogue::NONE, false, true)
                })
            });
        }
    }
    group.finish();
}

fn gemm_crate_threads() -> ::gemm::Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => ::gemm::Parallelism::None,
        t => ::gemm::Parallelism::Rayon(t),
    }
}

criterion_group!(benches, kernels);
criterion_main!(benches);
