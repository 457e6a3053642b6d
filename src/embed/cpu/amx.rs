//! Intel AMX (Advanced Matrix Extensions: Sapphire Rapids and later) for the bf16 and int8
//! GEMMs. One `tdpbf16ps` (`tdpbusd`) multiplies a 16 x 32 bf16 (16 x 64 u8) tile of A by a
//! 16-pair (16-quad) by 16-column tile of B into a 16 x 16 tile of f32 (i32) sums: 16,384
//! FLOPs per instruction, against 1,024 for an AVX-512 `vdpbf16ps` (`vpdpbusd`).
//!
//! The kernels hold a 32 x 32 block of C in four accumulator tiles (tmm0-3), load two tiles
//! of A (rows 0-15 and 16-31, tmm4-5) and two of B (columns 0-15 and 16-31, tmm6-7) per 16
//! lane rows of K, and run over the whole of K before they store: C is written once. B is
//! read straight from the packed panels ([`super::pack`]: lane rows 128 bytes apart, so the
//! two B tiles of a panel sit side by side, 64 bytes each); A from the converted rows, which
//! the caller pads to whole tiles (rows to a multiple of 32, lanes to a multiple of 16, with
//! zeros). The epilogue (bias, residual, GELU; the int8 scales) is the AVX-512 one, applied
//! as the block leaves the tiles.
//!
//! The tiles are process state the kernel must ask for: Linux hands them out after
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, and each thread configures them
//! (`ldtilecfg`) before use and releases them (`tilerelease`) after, which [`Tiles`] does
//! per GEMM task. Stable Rust has no AMX intrinsics, so the instructions are inline `asm!`.

use std::arch::asm;

/// Lane rows of K per tile step (a tile row is 64 bytes: 16 pairs or 16 quads).
pub const STEP: usize = 16;
/// Rows of C per block (two tiles of 16).
pub const MR: usize = 32;

/// `arch_prctl` request that asks the kernel for an extended state component.
const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
/// The AMX tile data state component.
const XFEATURE_XTILEDATA: libc::c_ulong = 18;

/// Whether this CPU has AMX-TILE with AMX-BF16 and AMX-INT8 (CPUID leaf 7, EDX bits 22, 24,
/// 25), as (bf16, int8).
fn cpu_has_amx() -> (bool, bool) {
    // Leaf 7 exists wherever AVX-512 was detected (the only callers); elsewhere it reads 0.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    let tile = leaf.edx & (1 << 24) != 0;
    (
        tile && leaf.edx & (1 << 22) != 0,
        tile && leaf.edx & (1 << 25) != 0,
    )
}

/// Ask Linux for the tile state. False where the kernel is too old (before 5.16), the
/// hypervisor hides AMX, or the process was refused.
fn os_grants_tiles() -> bool {
    // SAFETY: arch_prctl with this request reads no memory; it fails with an error code
    // where AMX is not offered.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// AMX for (bf16, int8) on this machine: the CPU has it and the OS granted the tiles.
/// `[model.kernels] amx = false` (or `RAGLINE_CPU_AMX=off`) leaves AMX out, for the AVX-512
/// kernels alone.
pub fn detect() -> (bool, bool) {
    let off = !crate::embed::kernel_choice::chosen().amx;
    let (bf16, int8) = cpu_has_amx();
    if off || !(bf16 || int8) || !os_grants_tiles() {
        return (false, false);
    }
    (bf16, int8)
}

/// The tile configuration (palette 1): tmm0-7 all 16 rows of 64 bytes.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

static CONFIG: TileConfig = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    TileConfig(c)
};

/// The tiles configured on this thread while it lives; released when dropped.
pub struct Tiles(());

impl Tiles {
    /// # Safety
    /// [`detect`] found AMX (the process holds the tile permission).
    pub unsafe fn configure() -> Tiles {
        asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `configure` on this thread.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// A in tiles: row block `r / 32`'s lanes for step s (16 lanes of K) are two tiles of 16
/// rows x 16 lanes, rows 64 bytes apart, stored together, the steps one after another: the
/// kernel reads A as one stream (as it reads B) rather than 32 rows, whose lines the
/// hardware prefetcher does not follow. Lanes (u32) per block of 32 rows.
pub fn tiled(steps: usize) -> usize {
    steps * 2 * 16 * 16
}

/// Bytes between the lane rows of a B panel (32 lanes of 4 bytes).
const LDB: usize = 32 * 4;

/// One kernel per instruction: the 32 x 32 block of C, `out[i][j]` = the sum over `steps` x
/// 16 lane rows q of A[i][q] . B[q][j], each lane a bf16 pair (`tdpbf16ps`, f32 sums) or a
/// u8 x i8 quad (`tdpbusd`: A unsigned, B signed, i32 sums).
macro_rules! block_kernel {
    ($name:ident, $op:literal, $out:ty) => {
        /// # Safety
        /// Tiles configured on this thread; `steps` >= 1; `a` holds 32 rows of steps x 16
        /// lanes, `lda` bytes apart, each step's two tiles `a_step` bytes after the last's
        /// (64 in row-major rows; 2,048 in [`tiled`] blocks, lda 64); `b` steps x 16 lane
        /// rows of 32 lanes, 128 bytes apart; `out` 32 x 32 values (128-byte rows).
        pub unsafe fn $name(
            steps: usize,
            a: *const u32,
            lda: usize,
            a_step: usize,
            b: *const u32,
            out: *mut $out,
        ) {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "2:",
                "tileloadd tmm4, [{a} + {lda}*1]",
                "tileloadd tmm5, [{a2} + {lda}*1]",
                "tileloadd tmm6, [{b} + {ldb}*1]",
                "tileloadd tmm7, [{b} + {ldb}*1 + 64]",
                // B two steps ahead (its 2 KiB a step are 32 lines): the hardware prefetcher
                // does not follow tile loads far enough, and B comes from L2. Past the panel's
                // end this reads the next panel's start, which the next call needs; past the
                // buffer's end it is a hint on an address never loaded (prefetches do not fault).
                "prefetcht0 [{b} + 4096]",
                "prefetcht0 [{b} + 4160]",
                "prefetcht0 [{b} + 4224]",
                "prefetcht0 [{b} + 4288]",
                "prefetcht0 [{b} + 4352]",
                "prefetcht0 [{b} + 4416]",
                "prefetcht0 [{b} + 4480]",
                "prefetcht0 [{b} + 4544]",
                "prefetcht0 [{b} + 4608]",
                "prefetcht0 [{b} + 4672]",
                "prefetcht0 [{b} + 4736]",
                "prefetcht0 [{b} + 4800]",
                "prefetcht0 [{b} + 4864]",
                "prefetcht0 [{b} + 4928]",
                "prefetcht0 [{b} + 4992]",
                "prefetcht0 [{b} + 5056]",
                "prefetcht0 [{b} + 5120]",
                "prefetcht0 [{b} + 5184]",
                "prefetcht0 [{b} + 5248]",
                "prefetcht0 [{b} + 5312]",
                "prefetcht0 [{b} + 5376]",
                "prefetcht0 [{b} + 5440]",
                "prefetcht0 [{b} + 5504]",
                "prefetcht0 [{b} + 5568]",
                "prefetcht0 [{b} + 5632]",
                "prefetcht0 [{b} + 5696]",
                "prefetcht0 [{b} + 5760]",
                "prefetcht0 [{b} + 5824]",
                "prefetcht0 [{b} + 5888]",
                "prefetcht0 [{b} + 5952]",
                "prefetcht0 [{b} + 6016]",
                "prefetcht0 [{b} + 6080]",
                concat!($op, " tmm0, tmm4, tmm6"),
                concat!($op, " tmm1, tmm4, tmm7"),
                concat!($op, " tmm2, tmm5, tmm6"),
                concat!($op, " tmm3, tmm5, tmm7"),
                "add {a}, {a_step}",
                "add {a2}, {a_step}",
                "add {b}, {step_b}",
                "dec {n}",
                "jnz 2b",
                "tilestored [{c} + {ldb}*1], tmm0",
                "tilestored [{c} + {ldb}*1 + 64], tmm1",
                "tilestored [{c2} + {ldb}*1], tmm2",
                "tilestored [{c2} + {ldb}*1 + 64], tmm3",
                a = inout(reg) a => _,
                a2 = inout(reg) a.byte_add(16 * lda) => _,
                b = inout(reg) b => _,
                n = inout(reg) steps => _,
                lda = in(reg) lda,
                a_step = in(reg) a_step,
                ldb = in(reg) LDB,
                step_b = const STEP * LDB,
                c = in(reg) out,
                c2 = in(reg) out.add(16 * 32),
                options(nostack),
            );
        }
    };
}

block_kernel!(block_bf16, "tdpbf16ps", f32);
block_kernel!(block_i8, "tdpbusd", i32);
