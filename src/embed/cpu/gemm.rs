//! GEMM on packed weights with a fused epilogue:
//! `C = act(A · B + bias + residual)`, where A is the activations ([m, k], row-major, any row
//! stride), B weights packed once by [`super::pack`], C the destination (any row stride). The
//! loops are the BLIS ones without packing A: K in blocks whose weight panel stays in L1, the
//! micro-kernel holding an `mr` x [`NR`] tile of C in registers and broadcasting straight from
//! `mr` rows of A (the L1 prefetcher follows the row streams; a packing copy of A cost more
//! than it saved, once A's rows are an odd number of cache lines apart: [`row_stride`]).
//! bf16 and int8 first convert A once, row-major, with vector instructions.
//! Bias, residual and GELU are applied to the tile in registers on the last K block, so C is
//! written once per K block and never pre-filled. Work is split over the rayon pool by row
//! blocks (and by column panels when there are fewer row blocks than threads).

use rayon::prelude::*;

use super::kernels::KernelPath;
use super::pack::{F32Panels, PackedBf16, PackedF32, PackedI8, NR};

/// f32 values of K per block: the weight panel (KC x 32 x 4 bytes = 32 KiB) stays in L1.
const KC_F32: usize = 256;
/// bf16 pairs of K per block (the same 32 KiB).
const KC_PAIRS: usize = 256;
/// Most rows per task (the rows of A a task reads stay in L2).
const MC_MAX: usize = 512;

/// The row stride to give a matrix of `n`-value rows that is A of a GEMM: whole 64-byte
/// lines, an odd number of them. The micro-kernels read MR rows of A at once; at a stride of
/// a power-of-two multiple of the line (BERT-base's 768, 2,304 and 3,072 floats: 48, 144
/// and 192 lines) those rows fall in a few of L1's 64 sets (3,072 floats: all in one) and
/// evict each other and the weight panel, which halved the f32 GEMM's speed on an Intel
/// Xeon with AVX-512 (155-181 against 209-297 GFLOP/s at 16 values more a row). An odd
/// number of lines puts any 64 consecutive rows in 64 different sets.
pub fn row_stride(n: usize) -> usize {
    (n.div_ceil(16) | 1) * 16
}

/// What is added to the product, and the activation, before C is stored.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue {
    /// [n], added to every row; null for none.
    pub bias: *const f32,
    /// [m, n] at row stride `ldr`, added; null for none.
    pub residual: *const f32,
    pub ldr: usize,
    /// Exact (erf) GELU of the sum.
    pub gelu: bool,
}

impl Epilogue {
    /// `C = A · B`.
    pub const NONE: Epilogue = Epilogue {
        bias: std::ptr::null(),
        residual: std::ptr::null(),
        ldr: 0,
        gelu: false,
    };
}

/// C [m, n] (row stride ldc) and A [m, k] (row stride lda) as raw pointers, shareable with
/// the pool: each task writes only its own rows and columns of C.
#[derive(Clone, Copy)]
pub struct Operands {
    pub a: *const f32,
    pub lda: usize,
    pub m: usize,
    pub c: *mut f32,
    pub ldc: usize,
}

// SAFETY: tasks read A, the bias and the residual and write disjoint tiles of C (`tiles`).
unsafe impl Send for Operands {}
// SAFETY: as for Send: shared between tasks, A is only read and C written in disjoint tiles.
unsafe impl Sync for Operands {}
// SAFETY: the bias and the residual are only read while the GEMM runs.
unsafe impl Send for Epilogue {}
// SAFETY: as for Send: shared between tasks, only read.
unsafe impl Sync for Epilogue {}

/// Where one micro-kernel call stores its tile, and what it adds first.
#[derive(Clone, Copy)]
pub struct Store {
    pub c: *mut f32,
    pub ldc: usize,
    pub rows: usize,
    pub cols: usize,
    /// C holds nothing of this product yet: write the tile rather than add to it.
    pub first: bool,
    /// The K loop ends with this block: add bias and residual, apply the activation.
    pub last: bool,
    /// At the tile's first column (null for none).
    pub bias: *const f32,
    /// At the tile's first element (null for none), row stride `ldr`.
    pub residual: *const f32,
    pub ldr: usize,
    pub gelu: bool,
}

/// A rectangle of C one task computes: rows r0..r0+rows, column panels p0..p1.
#[derive(Clone, Copy, Debug)]
struct Tile {
    r0: usize,
    rows: usize,
    p0: usize,
    p1: usize,
}

/// Column panels per task at most (192 columns: the task's weights, K x 192 x 4 bytes,
/// stay in L2 while it runs over its rows).
const PANELS_PER_TASK: usize = 6;

/// Split C into tasks, row blocks (multiples of `mr`, at most MC_MAX rows) by column groups
/// (at most PANELS_PER_TASK panels), with at least 8 tasks per thread where the shape
/// allows: on a shared host a thread slowed by a neighbour then holds the others at the join
/// for one small task, not a quarter of the work.
fn tiles(m: usize, panels: usize, mr: usize, parallel: bool) -> Vec<Tile> {
    let threads = if parallel {
        rayon::current_num_threads().max(1)
    } else {
        1
    };
    let col_split = if parallel {
        panels.div_ceil(PANELS_PER_TASK).max(1)
    } else {
        1
    };
    let wanted_rows = if parallel {
        (8 * threads).div_ceil(col_split)
    } else {
        1
    };
    let row_blocks = m
        .div_ceil(MC_MAX)
        .max(wanted_rows)
        .min(m.div_ceil(mr))
        .max(1);
    let mc = m.div_ceil(row_blocks).div_ceil(mr) * mr;
    let row_blocks = m.div_ceil(mc);
    let per = panels.div_ceil(col_split);
    let mut out = Vec::with_capacity(row_blocks * col_split);
    for rb in 0..row_blocks {
        let r0 = rb * mc;
        for cs in 0..col_split {
            let (p0, p1) = (cs * per, ((cs + 1) * per).min(panels));
            if p0 < p1 {
                out.push(Tile {
                    r0,
                    rows: mc.min(m - r0),
                    p0,
                    p1,
                });
            }
        }
    }
    out
}

/// K split into equal blocks of at most `most`.
fn k_blocks(k: usize, most: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = k.div_ceil(most).max(1);
    let size = k.div_ceil(n);
    (0..n).map(move |i| (i * size, size.min(k - i * size)))
}

/// Which loop of a task is outer. Panels outer: a weight panel (K x 32) is read from L1 or
/// L2 by every row group, the f32 and AVX-512 kernels' order (their K blocks keep the panel
/// in L1). Rows outer: a row group's A (32 x K, in AMX tiles) stays near while the task's
/// panels pass under it: the AMX kernels, which read a whole K at once and would otherwise
/// re-read all of the task's A per panel (measured: +7% to +50% on BERT-base's shapes).
#[derive(Clone, Copy)]
enum Order {
    PanelsOuter,
    RowsOuter,
}

/// The loops shared by every format: for each task's K block, column panel and row group of
/// `mr`, call `micro(k0, kc, row, panel, store)`; `k` and the block size are in the format's
/// K units (values, pairs, quads). `setup` runs on the task's thread before its first call,
/// and what it returns is dropped after its last (the AMX tiles' configuration). `Order`
/// says which of panels and row groups is the outer loop.
///
/// # Safety
/// `ops.c` writable for m rows of n values at stride ldc; `epi` valid for those rows.
#[allow(clippy::too_many_arguments)]
unsafe fn drive<F, S, G>(
    ops: Operands,
    n: usize,
    k: usize,
    (k_most, mr, order): (usize, usize, Order),
    epi: Epilogue,
    parallel: bool,
    setup: S,
    micro: F,
) where
    F: Fn(usize, usize, usize, usize, &Store) + Sync,
    S: Fn() -> G + Sync,
{
    let panels = n.div_ceil(NR);
    let task = |t: Tile| {
        // Whole-struct copies, so the closure captures the Sync structs, not their fields.
        let (ops, epi) = (ops, epi);
        let _state = setup();
        for (k0, kc) in k_blocks(k, k_most) {
            let visit = |p: usize, r: usize| {
                {
                    // SAFETY: r < m and p * NR < n: inside C, the bias and the residual.
                    let store = unsafe {
                        Store {
                            c: ops.c.add(r * ops.ldc + p * NR),
                            ldc: ops.ldc,
                            rows: mr.min(t.r0 + t.rows - r),
                            cols: NR.min(n - p * NR),
                            first: k0 == 0,
                            last: k0 + kc == k,
                            bias: if epi.bias.is_null() {
                                epi.bias
                            } else {
                                epi.bias.add(p * NR)
                            },
                            residual: if epi.residual.is_null() {
                                epi.residual
                            } else {
                                epi.residual.add(r * epi.ldr + p * NR)
                            },
                            ldr: epi.ldr,
                            gelu: epi.gelu,
                        }
                    };
                    micro(k0, kc, r, p, &store);
                }
            };
            let rows = (t.r0..t.r0 + t.rows).step_by(mr);
            match order {
                Order::PanelsOuter => {
                    for p in t.p0..t.p1 {
                        rows.clone().for_each(|r| visit(p, r));
                    }
                }
                Order::RowsOuter => {
                    for r in rows {
                        (t.p0..t.p1).for_each(|p| visit(p, r));
                    }
                }
            }
        }
    };
    let work = tiles(ops.m, panels, mr, parallel);
    if parallel && work.len() > 1 {
        work.into_par_iter().for_each(task);
    } else {
        work.into_iter().for_each(task);
    }
}

/// `C = act(A · B + bias + residual)` in f32.
///
/// # Safety
/// A readable for m rows of `b.k` values at stride lda; C writable for m rows of `b.n`
/// values at stride ldc, not overlapping A; `epi`'s bias [n] and residual [m, n] readable.
pub unsafe fn f32_gemm(
    path: KernelPath,
    ops: Operands,
    b: F32Panels,
    epi: Epilogue,
    parallel: bool,
) {
    if ops.m == 0 || b.n == 0 {
        return;
    }
    let (micro, mr): (MicroF32, usize) = match path {
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx512 => (super::avx512::micro_f32, super::avx512::MR),
        #[cfg(target_arch = "x86_64")]
        KernelPath::Avx2 => (super::avx2::micro_f32, super::avx2::MR),
        _ => (micro_f32_portable, MR_PORTABLE),
    };
    drive(
        ops,
        b.n,
        b.k,
        (KC_F32, mr, Order::PanelsOuter),
        epi,
        parallel,
        || (),
        |k0, kc, r, p, st| {
            // The whole Operands (Sync), not its raw-pointer fields, is captured.
            let ops = &ops;
            // SAFETY: row r and column k0 of A, panel p from row k0 of B: all in bounds.
            unsafe {
                micro(
                    kc,
                    ops.a.add(r * ops.lda + k0),
                    ops.lda,
                    b.panel(p, k0),
                    b.row_stride,
                    st,
                )
            }
        },
    );
}

/// Row pointers of a tile's `R` rows of A; rows past the last real one repeat it (they are
/// computed, never stored), so no read leaves A.
///
/// # Safety
/// `a` holds `rows` (1..=R) rows at stride lda.
#[inline(always)]
pub(super) unsafe fn row_ptrs<T, const R: usize>(
    a: *const T,
    lda: usize,
    rows: usize,
) -> [*const T; R] {
    let mut rp = [a; R];
    for (i, p) in rp.iter_mut().enumerate() {
        *p = a.add(i.min(rows - 1) * lda);
    }
    rp
}

/// An f32 micro-kernel: tile = A [rows][lda] (kc columns) · B [kc][32] (rows ldb apart).
///
/// # Safety
/// A, B and the store valid for those shapes; the CPU has the kernel's instructions.
pub type MicroF32 = unsafe fn(usize, *const f32, usize, *const f32, usize, &Store);
/// A bf16 micro-kernel over `pairs` k-pairs of A rows (u32 pairs at row stride lda).
///
/// # Safety
/// As [`MicroF32`].
pub type MicroBf16 = unsafe fn(usize, *const u32, usize, *const u32, &Store);
/// An int8 micro-kernel over `quads` k-quads, with the scales and the shift correction.
///
/// # Safety
/// As [`MicroF32`], and the scales valid for the tile's rows and columns.
pub type MicroI8 = unsafe fn(usize, *const u32, usize, *const u32, &Store, &I8Scales);

/// What turns an int8 tile's i32 sums into f32: row scale x column scale x (sum - row zero
/// point x column sum of the weights). Pointers at the tile's first row and column.
#[derive(Clone, Copy)]
pub struct I8Scales {
    pub rows: *const f32,
    /// The rows' zero points.
    pub zeros: *const i32,
    pub cols: *const f32,
    pub sums: *const i32,
}

/// A converted once for a low-precision kernel: row-major, `stride` 32-bit lanes per row.
struct Converted {
    lanes: Vec<u32>,
    stride: usize,
    /// Lanes per block of 32 rows where A is in AMX tiles ([`super::amx::tiled`]); 0 where
    /// it is row-major.
    block: usize,
    /// Per-row scale and zero point (int8 only).
    scale: Vec<f32>,
    zero: Vec<i32>,
}

/// `C = act(A · B + bias + residual)` with B in bf16 and A rounded to bf16 first: on AMX
/// tiles where the CPU has them ([`super::amx`]), else with `vdpbf16ps`.
///
/// # Safety
/// As [`f32_gemm`]; and the CPU has AVX512-BF16.
#[cfg(target_arch = "x86_64")]
pub unsafe fn bf16_gemm(ops: Operands, b: &PackedBf16, epi: Epilogue, parallel: bool) {
    bf16_gemm_on(super::kernels::features().amx_bf16, ops, b, epi, parallel)
}

/// [`bf16_gemm`], on AMX or not as `amx` says.
///
/// # Safety
/// As [`bf16_gemm`]; with `amx`, the CPU has AMX-BF16 and the process the tiles.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn bf16_gemm_on(
    amx: bool,
    ops: Operands,
    b: &PackedBf16,
    epi: Epilogue,
    parallel: bool,
) {
    if ops.m == 0 || b.n == 0 {
        return;
    }
    // The tile kernels run at least one step of K (an empty K stays on AVX-512).
    let amx = amx && b.pairs > 0;
    if amx {
        let steps = b.panel_pairs / super::amx::STEP;
        let a = convert_tiles(ops, b.k, steps);
        drive_amx(
            ops,
            b.n,
            b.pairs,
            &a,
            epi,
            parallel,
            // SAFETY: a block of 32 rows of the converted A in tiles (padded with zeros),
            // panel p of B (whole tiles of pair rows), a block of 32 x 32; the tiles are
            // configured.
            |ap, p, out| unsafe { super::amx::block_bf16(steps, ap, 64, 2048, b.panel(p, 0), out) },
            // SAFETY: the block holds the tile's sums (`drive_amx`).
            |st, out, _, _| unsafe { super::avx512::store_block_f32(st, out) },
        );
        return;
    }
    let a = convert(ops, b.k, b.pairs, 1, |row, out| {
        // SAFETY: the caller's contract (the CPU has AVX512-BF16).
        unsafe { super::avx512::to_bf16_pairs(row, out) };
        (1.0, 0)
    });
    drive(
        ops,
        b.n,
        b.pairs,
        (KC_PAIRS, super::avx512::MR, Order::PanelsOuter),
        epi,
        parallel,
        || (),
        |q0, qc, r, p, st| {
            let ap = a.lanes[r * a.stride + q0..].as_ptr();
            // SAFETY: rows r.. of the converted A, panel p from pair q0 of B.
            unsafe { super::avx512::micro_bf16(qc, ap, a.stride, b.panel(p, q0), st) }
        },
    );
}

/// The loops of the AMX GEMMs: for each task (its tiles configured on its thread), each 32
/// rows r of the converted A and each panel p ([`Order::RowsOuter`]), `kernel(A at row r, p, block)` fills a
/// 32 x 32 block with the sums over the whole of K, then `store(store, block, r, p)` writes
/// the block's rows of C through the epilogue. `lanes`: K in the format's lanes.
///
/// # Safety
/// As [`drive`]; the CPU has AMX and the process the tiles; `a` padded to whole tiles.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn drive_amx<T, K, S>(
    ops: Operands,
    n: usize,
    lanes: usize,
    a: &Converted,
    epi: Epilogue,
    parallel: bool,
    kernel: K,
    store: S,
) where
    K: Fn(*const u32, usize, *mut T) + Sync,
    S: Fn(&Store, *const T, usize, usize) + Sync,
{
    drive(
        ops,
        n,
        lanes,
        (usize::MAX, super::amx::MR, Order::RowsOuter),
        epi,
        parallel,
        // SAFETY: the caller's contract (AMX granted).
        || unsafe { super::amx::Tiles::configure() },
        |_, _, r, p, st| {
            // Every value is written by the kernel before `store` reads it.
            let mut block = std::mem::MaybeUninit::<Block<T>>::uninit();
            let out = block.as_mut_ptr().cast::<T>();
            kernel(a.rows(r), p, out);
            store(st, out, r, p);
        },
    );
}

/// Values of an AMX block of C (32 x 32).
#[cfg(target_arch = "x86_64")]
const BLOCK: usize = 32 * 32;

/// An AMX block of C as the tiles store it, 32 values to a row, rows on whole lines.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct Block<T>([T; BLOCK]);

/// An input channel whose |value| passes this in any row of a batch is an outlier: BERT's
/// hidden states have a few channels of large magnitude, and one would take the whole int8
/// range of its token. Those channels are computed in f32 instead (LLM.int8()'s
/// decomposition; a handful of 384, so about 1% of the work).
pub const OUTLIER_THRESHOLD: f32 = 6.0;

/// `C = act(A · B + bias + residual)` with B in int8 per output channel and A quantised per
/// row (token) to u8 with a zero point, as `vpdpbusd` wants its first operand unsigned:
/// symmetric, or asymmetric for one-signed inputs (GELU's output). Input channels past
/// [`OUTLIER_THRESHOLD`] in this batch are multiplied in f32, the rest in int8.
///
/// # Safety
/// As [`f32_gemm`]; and the CPU has AVX512-VNNI.
#[cfg(target_arch = "x86_64")]
pub unsafe fn i8_gemm(
    ops: Operands,
    b: &PackedI8,
    epi: Epilogue,
    asymmetric: bool,
    parallel: bool,
) {
    let amx = super::kernels::features().amx_int8;
    i8_gemm_on(amx, ops, b, epi, asymmetric, parallel)
}

/// [`i8_gemm`], on AMX or not as `amx` says.
///
/// # Safety
/// As [`i8_gemm`]; with `amx`, the CPU has AMX-INT8 and the process the tiles.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn i8_gemm_on(
    amx: bool,
    ops: Operands,
    b: &PackedI8,
    epi: Epilogue,
    asymmetric: bool,
    parallel: bool,
) {
    if ops.m == 0 || b.n == 0 {
        return;
    }
    let k = b.k;
    let outliers = outlier_channels(ops, k);
    let mut epi = epi;
    let keep: Option<Vec<f32>> = if outliers.is_empty() {
        None
    } else {
        // C = A[:, outliers] · B[outliers, :] + bias + residual in f32 first; the int8 pass
        // then adds to C (as its residual) and applies the activation.
        let mut a_out = vec![0f32; ops.m * outliers.len()];
        for (r, dst) in a_out.chunks_exact_mut(outliers.len()).enumerate() {
            for (d, &j) in dst.iter_mut().zip(&outliers) {
                *d = *ops.a.add(r * ops.lda + j);
            }
        }
        let mut w_out = Vec::with_capacity(outliers.len() * b.n);
        for &j in &outliers {
            w_out.extend_from_slice(&b.rows[j * b.n..(j + 1) * b.n]);
        }
        let w_out = PackedF32::from_rows(&w_out, outliers.len(), b.n);
        let first = Operands {
            a: a_out.as_ptr(),
            lda: outliers.len(),
            ..ops
        };
        f32_gemm(
            KernelPath::Avx512,
            first,
            w_out.view(),
            Epilogue { gelu: false, ..epi },
            parallel,
        );
        epi = Epilogue {
            bias: std::ptr::null(),
            residual: ops.c,
            ldr: ops.ldc,
            gelu: epi.gelu,
        };
        let mut keep = vec![1f32; k];
        for &j in &outliers {
            keep[j] = 0.0;
        }
        Some(keep)
    };
    let amx = amx && b.quads > 0;
    let pad = if amx { super::amx::MR } else { 1 };
    let a = convert(ops, k, b.quads, pad, |row, out| {
        // SAFETY: the caller's contract (the CPU has AVX512-VNNI, hence AVX-512 BW).
        unsafe { super::avx512::quantize_row(row, keep.as_deref(), asymmetric, out) }
    });
    let scales = |r: usize, p: usize| I8Scales {
        rows: a.scale[r..].as_ptr(),
        zeros: a.zero[r..].as_ptr(),
        cols: b.scale[p * NR..].as_ptr(),
        sums: b.sums[p * NR..].as_ptr(),
    };
    if amx {
        let (steps, lda) = (b.panel_quads / super::amx::STEP, a.stride * 4);
        drive_amx(
            ops,
            b.n,
            b.quads,
            &a,
            epi,
            parallel,
            // SAFETY: 32 rows of the quantised A (padded to whole tiles), panel p of B (whole
            // tiles of quad rows), a block of 32 x 32; the tiles are configured.
            |ap, p, out| unsafe { super::amx::block_i8(steps, ap, lda, 64, b.panel(p), out) },
            // SAFETY: the block holds the tile's sums, the scales cover its rows and columns.
            |st, out, r, p| unsafe { super::avx512::store_block_i8(st, out, &scales(r, p)) },
        );
        return;
    }
    // One K block: the i32 sums of a tile must see all of K before they are scaled.
    drive(
        ops,
        b.n,
        b.quads,
        (usize::MAX, super::avx512::MR, Order::PanelsOuter),
        epi,
        parallel,
        || (),
        |_, qc, r, p, st| {
            let ap = a.lanes[r * a.stride..].as_ptr();
            // SAFETY: rows r.. of the quantised A, panel p of B, the scales of both.
            unsafe { super::avx512::micro_i8(qc, ap, a.stride, b.panel(p), st, &scales(r, p)) }
        },
    );
}

/// The input channels of A whose |value| passes [`OUTLIER_THRESHOLD`] in some row.
///
/// # Safety
/// A readable for m rows of k values at stride lda; the CPU has AVX-512.
#[cfg(target_arch = "x86_64")]
unsafe fn outlier_channels(ops: Operands, k: usize) -> Vec<usize> {
    let max = (0..ops.m.div_ceil(64))
        .into_par_iter()
        .map(|block| {
            // The whole Operands (Sync), not its raw-pointer fields, is captured.
            let ops = &ops;
            let mut max = vec![0f32; k];
            for r in block * 64..(block * 64 + 64).min(ops.m) {
                // SAFETY: row r < m of A has k values (the caller's contract).
                let row = unsafe { std::slice::from_raw_parts(ops.a.add(r * ops.lda), k) };
                // SAFETY: the CPU has AVX-512 (the caller's contract).
                unsafe { super::avx512::column_abs_max(row, k, &mut max) };
            }
            max
        })
        .reduce(
            || vec![0f32; k],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x = x.max(*y));
                a
            },
        );
    max.iter()
        .enumerate()
        .filter(|(_, &m)| m > OUTLIER_THRESHOLD)
        .map(|(j, _)| j)
        .collect()
}

/// Convert every row of A (k values) into `lanes` 32-bit lanes with `f`, which returns the
/// row's scale and zero point; rows in parallel. The rows are padded with zero rows to a
/// multiple of `pad` (and every row with zero lanes to its stride, a multiple of 16): the
/// AMX kernels read whole tiles.
///
/// # Safety
/// A readable for m rows of k values at stride lda; `f` writes `lanes` lanes (k values).
unsafe fn convert(
    ops: Operands,
    k: usize,
    lanes: usize,
    pad: usize,
    f: impl Fn(&[f32], &mut [u32]) -> (f32, i32) + Sync,
) -> Converted {
    // Converted rows are the micro-kernel's A too: at the stride that spreads them over L1.
    let stride = row_stride(lanes);
    let rows = ops.m.div_ceil(pad) * pad;
    let m = ops.m;
    let mut out = Converted {
        lanes: Converted::buffer(rows * stride),
        stride,
        block: 0,
        scale: vec![0f32; rows],
        zero: vec![0i32; rows],
    };
    // The padding rows are zeros (the kernels read whole tiles); every other row's padding
    // lanes are zeroed below as the row is written.
    out.lanes[m * stride..rows * stride].fill(0);
    out.lanes[..m * stride]
        .par_chunks_mut(stride * 64)
        .zip(out.scale[..m].par_chunks_mut(64))
        .zip(out.zero[..m].par_chunks_mut(64))
        .enumerate()
        .for_each(|(block, ((dst, scales), zeros))| {
            // The whole Operands (Sync), not its raw-pointer fields, is captured.
            let ops = &ops;
            for (i, ((row_out, s), z)) in dst.chunks_mut(stride).zip(scales).zip(zeros).enumerate()
            {
                let r = block * 64 + i;
                // SAFETY: r < m (the chunks cover m rows); row r of A has k values.
                let row = unsafe { std::slice::from_raw_parts(ops.a.add(r * ops.lda), k) };
                let (values, padding) = row_out.split_at_mut(lanes);
                (*s, *z) = f(row, values);
                padding.fill(0);
            }
        });
    out
}

/// Convert A (m rows of k values) to bf16 pairs in AMX tiles ([`super::amx::tiled`]): rows
/// padded with zero rows to a multiple of 32, lanes with zeros to `steps` x 16; blocks of 32
/// rows in parallel.
///
/// # Safety
/// As [`bf16_gemm`]; `steps` x 32 >= k.
#[cfg(target_arch = "x86_64")]
unsafe fn convert_tiles(ops: Operands, k: usize, steps: usize) -> Converted {
    let block = super::amx::tiled(steps);
    let blocks = ops.m.div_ceil(32);
    let mut out = Converted {
        lanes: Converted::buffer(blocks * block),
        stride: 0,
        block,
        scale: Vec::new(),
        zero: Vec::new(),
    };
    out.lanes[..blocks * block]
        .par_chunks_mut(block)
        .enumerate()
        .for_each(|(b, dst)| {
            // The whole Operands (Sync), not its raw-pointer fields, is captured.
            let ops = &ops;
            for i in 0..32 {
                let r = b * 32 + i;
                if r >= ops.m {
                    // Row i's 16 lanes of step s: tile i / 16, row i % 16 of it.
                    let at = |s: usize| (s * 2 + i / 16) * 256 + (i % 16) * 16;
                    (0..steps).for_each(|s| dst[at(s)..at(s) + 16].fill(0));
                    continue;
                }
                // SAFETY: r < m; row r of A has k values (the caller's contract); the block
                // holds `tiled(steps)` lanes, steps x 32 >= k; the CPU has AVX512-BF16 (the
                // caller's contract).
                unsafe {
                    let row = std::slice::from_raw_parts(ops.a.add(r * ops.lda), k);
                    super::avx512::to_bf16_tile_row(row, steps, dst, i);
                }
            }
        });
    out
}

thread_local! {
    /// The converted A of this thread's last GEMM, kept for its next one: a layer's A is
    /// megabytes, and a fresh allocation of that size is fresh pages the OS zeroes first.
    static CONVERTED: std::cell::Cell<Vec<u32>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Converted {
    /// Where rows r.. start (r a multiple of 32 where A is in tiles).
    fn rows(&self, r: usize) -> *const u32 {
        if self.block == 0 {
            self.lanes[r * self.stride..].as_ptr()
        } else {
            debug_assert_eq!(r % 32, 0);
            self.lanes[r / 32 * self.block..].as_ptr()
        }
    }

    /// This thread's kept buffer, at least `len` lanes long (their values are whatever they
    /// were; the lanes past `len` are not read).
    fn buffer(len: usize) -> Vec<u32> {
        let lanes = CONVERTED.take();
        if lanes.len() >= len {
            lanes
        } else {
            vec![0; len]
        }
    }
}

impl Drop for Converted {
    fn drop(&mut self) {
        let lanes = std::mem::take(&mut self.lanes);
        // A nested GEMM's smaller buffer (a pool thread that ran one while waiting) does not
        // replace a larger one.
        let kept = CONVERTED.take();
        CONVERTED.set(if kept.len() > lanes.len() {
            kept
        } else {
            lanes
        });
    }
}

/// Rows of the portable micro-kernel.
pub const MR_PORTABLE: usize = 4;

/// The portable micro-kernel: plain Rust the compiler vectorises for the baseline target.
///
/// # Safety
/// `a` holds `st.rows` rows of kc values at stride lda, `b` kc rows of NR values at stride
/// ldb; the store's pointers are valid for its rows and columns.
unsafe fn micro_f32_portable(
    kc: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    st: &Store,
) {
    let mut acc = [[0f32; NR]; MR_PORTABLE];
    for (i, acc_row) in acc.iter_mut().enumerate().take(st.rows) {
        let a_row = std::slice::from_raw_parts(a.add(i * lda), kc);
        for (kk, &av) in a_row.iter().enumerate() {
            let bk = std::slice::from_raw_parts(b.add(kk * ldb), NR);
            for (x, &bv) in acc_row.iter_mut().zip(bk) {
                *x += av * bv;
            }
        }
    }
    for (i, acc_row) in acc.iter().enumerate().take(st.rows) {
        let dst = std::slice::from_raw_parts_mut(st.c.add(i * st.ldc), st.cols);
        for (j, (d, &x)) in dst.iter_mut().zip(acc_row).enumerate() {
            let mut v = if st.first { x } else { *d + x };
            if st.last {
                if !st.bias.is_null() {
                    v += *st.bias.add(j);
                }
                if !st.residual.is_null() {
                    v += *st.residual.add(i * st.ldr + j);
                }
                if st.gelu {
                    v = super::super::gelu::gelu(v);
                }
            }
            *d = v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::cpu::kernels::{features, KernelPath};

    /// A · B + bias + residual, in f64.
    fn reference(a: &[f32], b: &[f32], bias: &[f32], res: &[f32], k: usize, n: usize) -> Vec<f64> {
        (0..res.len())
            .map(|i| {
                let (r, col) = (i / n, i % n);
                f64::from(res[i])
                    + f64::from(bias[col])
                    + (0..k)
                        .map(|x| f64::from(a[r * k + x]) * f64::from(b[x * n + col]))
                        .sum::<f64>()
            })
            .collect()
    }

    fn data(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) % 2001) as f32 / 1000.0
                    - 1.0
            })
            .collect()
    }

    /// Shapes with every kind of remainder: rows not a multiple of the micro-kernel's, columns
    /// not a multiple of 32, K over one block and not a multiple of 2 or 4.
    const SHAPES: [(usize, usize, usize); 6] = [
        (1, 1, 1),
        (13, 7, 33),
        (29, 384, 96),
        (100, 517, 70),
        (600, 64, 32),
        (3, 1537, 40),
    ];

    type Run<'a> = &'a dyn Fn(Operands, &[f32], usize, usize, Epilogue);

    /// `run`'s C = A · B + bias + residual (the test's B, bias and residual) and the f64
    /// reference.
    fn product(run: Run<'_>, a: &[f32], m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f64>) {
        let b = data(k * n, 2);
        let res = data(m * n, 3);
        let bias = data(n, 4);
        let mut c = vec![f32::NAN; m * n];
        let ops = Operands {
            a: a.as_ptr(),
            lda: k,
            m,
            c: c.as_mut_ptr(),
            ldc: n,
        };
        let epi = Epilogue {
            bias: bias.as_ptr(),
            residual: res.as_ptr(),
            ldr: n,
            gelu: false,
        };
        run(ops, &b, k, n, epi);
        let want = reference(a, &b, &bias, &res, k, n);
        (c, want)
    }

    /// The largest error of C against the reference (infinite for a NaN).
    fn largest_error(c: &[f32], want: &[f64]) -> f64 {
        c.iter()
            .zip(want)
            .map(|(&x, &w)| (f64::from(x) - w).abs())
            .fold(0f64, |worst, e| {
                if e.is_nan() {
                    f64::INFINITY
                } else {
                    worst.max(e)
                }
            })
    }

    /// The largest error of `run`'s C = A · B + bias + residual against the f64 reference.
    fn worst_error(run: Run<'_>, a: &[f32], m: usize, k: usize, n: usize) -> f64 {
        let (c, want) = product(run, a, m, k, n);
        largest_error(&c, &want)
    }

    fn check(run: Run<'_>, tol: f64, what: &str) {
        for (m, k, n) in SHAPES {
            let worst = worst_error(run, &data(m * k, 1), m, k, n);
            assert!(
                worst <= tol * (k as f64).sqrt(),
                "{what} {m}x{k}x{n}: off by {worst}"
            );
        }
    }

    fn f32_path(path: KernelPath) {
        check(
            &|ops, b, k, n, epi| {
                let b = PackedF32::from_rows(b, k, n);
                // SAFETY: the operands are the test's vectors, of the right sizes.
                unsafe { f32_gemm(path, ops, b.view(), epi, true) };
            },
            1e-5,
            path.name(),
        );
    }

    #[test]
    fn portable_f32_gemm_matches_the_reference() {
        f32_path(KernelPath::Portable);
    }

    #[test]
    fn avx512_f32_gemm_matches_the_reference() {
        if !KernelPath::Avx512.supported() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        f32_path(KernelPath::Avx512);
    }

    #[test]
    fn avx2_f32_gemm_matches_the_reference() {
        if !KernelPath::Avx2.supported() {
            eprintln!("skipped: this CPU has no AVX2 and FMA");
            return;
        }
        f32_path(KernelPath::Avx2);
    }

    #[test]
    fn fused_gelu_is_gelu_of_the_sum() {
        for path in [KernelPath::Portable, KernelPath::Avx2, KernelPath::Avx512] {
            if !path.supported() {
                continue;
            }
            let (m, k, n) = (31, 300, 45);
            let (a, bw, bias) = (data(m * k, 5), data(k * n, 6), data(n, 7));
            let b = PackedF32::from_rows(&bw, k, n);
            let mut plain = vec![0f32; m * n];
            let mut fused = plain.clone();
            let ops = |c: &mut Vec<f32>| Operands {
                a: a.as_ptr(),
                lda: k,
                m,
                c: c.as_mut_ptr(),
                ldc: n,
            };
            let epi = |gelu| Epilogue {
                bias: bias.as_ptr(),
                gelu,
                ..Epilogue::NONE
            };
            // SAFETY: the operands are the vectors above, of the right sizes.
            unsafe {
                f32_gemm(path, ops(&mut plain), b.view(), epi(false), false);
                f32_gemm(path, ops(&mut fused), b.view(), epi(true), false);
            }
            for (p, f) in plain.iter().zip(&fused) {
                let want = crate::embed::gelu::gelu(*p);
                assert!(
                    (want - f).abs() < 1e-5,
                    "{}: gelu({p}) = {want}, fused {f}",
                    path.name()
                );
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn bf16_gemm_is_within_bf16_rounding() {
        if !features().avx512_bf16 {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        // Both operands rounded to 8 significant bits: relative error about 2^-8 per product.
        check(
            &|ops, b, k, n, epi| {
                let b = PackedBf16::from_rows(b, k, n);
                // SAFETY: as above; the CPU has AVX512-BF16.
                unsafe { bf16_gemm(ops, &b, epi, true) };
            },
            1e-2,
            "bf16",
        );
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn int8_gemm_is_within_quantisation_error() {
        if !features().avx512_vnni {
            eprintln!("skipped: this CPU has no AVX512-VNNI");
            return;
        }
        check(
            &|ops, b, k, n, epi| {
                let b = PackedI8::from_rows(b, k, n);
                // SAFETY: as above; the CPU has AVX512-VNNI.
                unsafe { i8_gemm(ops, &b, epi, false, true) };
            },
            2e-2,
            "int8",
        );
    }

    /// Shapes for the AMX kernels: rows past one 32-row block and not a multiple of 16, K
    /// not a multiple of a tile's 32 bf16 (64 int8) and past several tiles, columns not a
    /// multiple of 32; then a BERT-base layer's (K 768 -> 3,072 and back).
    #[cfg(target_arch = "x86_64")]
    const AMX_SHAPES: [(usize, usize, usize); 6] = [
        (1, 1, 1),
        (13, 7, 33),
        (45, 200, 70),
        (70, 33, 100),
        (130, 768, 96),
        (64, 3072, 40),
    ];

    /// The AMX kernels against the f64 reference (within the rounding of their format), and
    /// against the AVX-512 kernels of the same format: the same sums up to the order of
    /// addition (bf16), exactly (int8: integer sums).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn amx_gemms_match_the_reference_and_the_avx512_kernels() {
        let f = features();
        if !(f.amx_bf16 || f.amx_int8) {
            eprintln!("skipped: this CPU or OS offers no AMX tiles ({f})");
            return;
        }
        for (m, k, n) in AMX_SHAPES {
            let a = data(m * k, 21);
            let tol = (k as f64).sqrt();
            if f.amx_bf16 {
                let bf16 = |amx| {
                    product(
                        &|ops, b, k, n, epi| {
                            let b = PackedBf16::from_rows(b, k, n);
                            // SAFETY: the test's operands; the CPU has AMX-BF16 and
                            // AVX512-BF16.
                            unsafe { bf16_gemm_on(amx, ops, &b, epi, true) }
                        },
                        &a,
                        m,
                        k,
                        n,
                    )
                };
                let ((tiles, want), (avx, _)) = (bf16(true), bf16(false));
                let worst = largest_error(&tiles, &want);
                assert!(worst <= 1e-2 * tol, "bf16 amx {m}x{k}x{n}: off by {worst}");
                let apart = tiles
                    .iter()
                    .zip(&avx)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0f32, f32::max);
                assert!(
                    apart <= 1e-4 * tol as f32,
                    "bf16 {m}x{k}x{n}: amx and avx512 {apart} apart"
                );
            }
            if f.amx_int8 {
                for asymmetric in [false, true] {
                    let int8 = |amx| {
                        product(
                            &|ops, b, k, n, epi| {
                                let b = PackedI8::from_rows(b, k, n);
                                // SAFETY: the test's operands; the CPU has AMX-INT8 and
                                // AVX512-VNNI.
                                unsafe { i8_gemm_on(amx, ops, &b, epi, asymmetric, true) }
                            },
                            &a,
                            m,
                            k,
                            n,
                        )
                    };
                    let ((tiles, want), (avx, _)) = (int8(true), int8(false));
                    let worst = largest_error(&tiles, &want);
                    assert!(worst <= 2e-2 * tol, "int8 amx {m}x{k}x{n}: off by {worst}");
                    assert_eq!(tiles, avx, "int8 {m}x{k}x{n} asymmetric {asymmetric}");
                }
            }
        }
    }

    /// A channel of large values (an outlier) would take the whole int8 range of every row it
    /// is in; it is computed in f32, so the result stays within the quantisation error of the
    /// other channels (without that, the error here is about 10x the tolerance).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn int8_gemm_computes_outlier_channels_in_f32() {
        if !features().avx512_vnni {
            eprintln!("skipped: this CPU has no AVX512-VNNI");
            return;
        }
        for asymmetric in [false, true] {
            let (m, k, n) = (37, 100, 40);
            let mut a = data(m * k, 11);
            for r in 0..m {
                a[r * k + 3] *= 60.0;
            }
            let run = |ops, b: &[f32], k, n, epi| {
                let packed = PackedI8::from_rows(b, k, n);
                // SAFETY: the test's operands; the CPU has AVX512-VNNI.
                unsafe { i8_gemm(ops, &packed, epi, asymmetric, true) };
            };
            let worst = worst_error(&run, &a, m, k, n);
            assert!(
                worst < 2e-2 * (k as f64).sqrt(),
                "asymmetric {asymmetric}: off by {worst}"
            );
        }
    }

    #[test]
    fn row_strides_are_an_odd_number_of_lines() {
        for n in [1, 16, 384, 400, 768, 1152, 1536, 2304, 3072, 3088, 1000] {
            let s = row_stride(n);
            assert!(s >= n && s - n <= 32, "{n} -> {s}");
            assert_eq!(s % 16, 0, "{n} -> {s}: whole lines");
            assert_eq!((s / 16) % 2, 1, "{n} -> {s}: an odd number of lines");
            // 64 consecutive rows start in 64 different sets of a 64-set L1.
            let sets: std::collections::HashSet<usize> =
                (0..64).map(|i| (i * s / 16) % 64).collect();
            assert_eq!(sets.len(), 64, "{n}");
        }
    }

    #[test]
    fn tiles_cover_c_exactly_once() {
        for (m, panels, mr) in [
            (1, 1, 14),
            (2048, 36, 14),
            (15, 12, 14),
            (700, 1, 4),
            (3, 48, 14),
        ] {
            let mut seen = vec![0u8; m * panels];
            for t in tiles(m, panels, mr, true) {
                assert_eq!(t.r0 % mr, 0);
                for r in t.r0..t.r0 + t.rows {
                    for p in t.p0..t.p1 {
                        seen[r * panels + p] += 1;
                    }
                }
            }
            assert!(seen.iter().all(|&s| s == 1), "{m} rows, {panels} panels");
        }
    }
}
