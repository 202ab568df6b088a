# The activation side of MILI's quantized matmuls (quant_matmul.mojo and quant_kmatmul.mojo): phase 1,
# each activation row quantized per 32-element block, written to one scratch layout both kernels read
# (kernels/quant_operands.py allocates it). Two modes, chosen once per server (parameter P_ACT_MODE, the
# same for every call of a model, so a row's bits never depend on its batch):
#
# ACT_INT8X2 (two int8 parts, about 15 bits; what generating servers use). With t = x * 127 / max|x|
# per block, q = round-half-even(254 t) in about 15 bits, held as q1 = round-half-even(t) (llama.cpp's
# Q8_0/Q8_1 activations) and q2 = q - 254 q1, the residual in 1/254 steps: |254 t - 254 q1| <= 127
# and both bounds are integers, so |q2| <= 127, and x ~= d * (254 q1 + q2) with d = max|x| / 32258.
# |t| <= 127 (to a float32 rounding), so |q| <= 32258.
# A kernel sums 254 * dot(w, q1) + dot(w, q2) exactly in int32. Per block it also gets the sum of q
# (what Q4_0's and Q8_0's offsets, Q4_1's, Q5's and Q4_K's mins need), the sum over the block's first 16
# elements (Q6_K's scales change every 16 weights), and d * sum q.
#
# ACT_INT8 (one int8 part, llama.cpp's Q8_0 activations; what embedding and scoring servers use): q = q1 =
# round-half-even(t), d = max|x| / 127, so x ~= d * q, and q2 is neither written nor read. A kernel then
# runs one vpdpbusd (or AMX tile product) per 4 K-steps instead of two: about twice the prefill
# throughput, at about 8 bits per activation. The sums are of this q (|q| <= 127).
#
# Per-block values are stored block-major, [K / 32, stride] (P_BLOCK_STRIDE), so the AMX path reads 16 rows'
# contiguously.

from std.math import round
from std.sys import inlined_assembly
from numerics import HAS_AVX512
from params import Params, param_int, param_ptr
from lane_tree import bitrev4, lane_maxima, lane_sums

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime QK = 32  # activations per block
comptime DTYPE_F32 = 0
comptime DTYPE_BF16 = 1

# The parameter slots of the activations and their scratch: the same in both kernels' parameter arrays.
comptime P_X = 1  # [M, K] float32 or bfloat16
comptime P_M = 4
comptime P_K = 6
comptime P_X_DTYPE = 8
comptime P_Q1 = 9  # [M, K] int8 q1
comptime P_D = 10  # [K / 32, stride] float32 d = max|x| / 32258 (ACT_INT8: / 127)
comptime P_SUM = 11  # [K / 32, stride] int32 sum of q over the block
comptime P_SUM_F = 12  # [K / 32, stride] float32 d * sum of q
comptime P_Q2 = 14  # [M, K] int8 q2, the residual (ACT_INT8X2 only)
comptime P_SUM_LO = 16  # [K / 32, stride] int32 sum of q over the block's elements 0-15
comptime P_ACT_MODE = 18  # ACT_INT8X2 or ACT_INT8
# Rows between consecutive blocks in the [K / 32, stride] per-block arrays (>= M; kernels/quant_operands.py's
# block_stride): a multiple of 16 rows whose count of 16s is odd, so block b's row r and block b + 1's never share
# a cache set. With the stride M itself, 2048 rows put every block's value 8 KiB apart, all in one L1 set.
comptime P_BLOCK_STRIDE = 19

comptime ACT_INT8X2 = 0
comptime ACT_INT8 = 1


@always_inline
def combine_parts(dot1: SIMD[DType.int32, 16], dot2: SIMD[DType.int32, 16]) -> SIMD[DType.int32, 16]:
    """254 * dot1 + dot2, exactly (int32), as 256 * dot1 - 2 * dot1 + dot2. A vpmulld issues to the pipes the
    kernels' vpdpbusd and FMAs use (AMD Zen 4: about 5% of a two-part matmul), a shift and adds do not; the
    shift is written as one instruction because LLVM folds shifts and adds by constants back into vpmulld."""
    comptime if HAS_AVX512:
        var times256 = inlined_assembly["vpslld $$8, $1, $0", SIMD[DType.int32, 16], constraints="=v,v",
                                        has_side_effect=False](dot1)
        return times256 - (dot1 + dot1) + dot2
    else:  # the instruction above takes one 512-bit register; AVX2 holds the vector in two
        return (dot1 << 8) - (dot1 + dot1) + dot2


# The int8 activation bytes a row chunk of the vpdpbusd paths may hold: a quarter of a 1 MiB L2 (Zen 5's), the
# rest for the tile's weights and the output rows (512 KiB measured 7-10% slower at K = 3072, 2% faster at 1024).
comptime ACT_CACHE_BYTES = 256 * 1024


@always_inline
def row_chunk[two: Bool](k: Int) -> Int:
    """Rows per chunk on the vpdpbusd paths: a thread's tiles pass over a chunk's rows while their int8
    activations (K bytes a row per part) stay in its L2, so that the weights stream from memory once
    per chunk. Whole groups of 16 rows, at least 64."""
    return max(64, (ACT_CACHE_BYTES // ((2 if two else 1) * k)) // 16 * 16)


@always_inline
def two_parts(p: Params) -> Bool:
    """Whether this call's activations are in two int8 parts (ACT_INT8X2) rather than one (ACT_INT8)."""
    return param_int(p, P_ACT_MODE) == ACT_INT8X2


comptime GROUP = 16  # blocks quantized together: their maxima, scales and sums as 16-lane vectors
comptime F32x16 = SIMD[F32, GROUP]
comptime I32x16 = SIMD[DType.int32, GROUP]


def _quantize_rows[dt: DType, two: Bool](p: Params, begin: Int, end: Int):
    """Up to GROUP blocks of a row at a time: their maxima, 127 / max, and sums are reduced lane-wise by a tree
    (kernels/lane_tree.mojo: no per-block horizontal reduction), then stored per block. The same operations per
    value as one block at a time, so the same bits (kernels/reference/quant_matmul.py)."""
    var x = param_ptr[dt](p, P_X)
    var m = param_int(p, P_M)
    var k = param_int(p, P_K)
    var qa = param_ptr[DType.int8](p, P_Q1)
    var qa2 = param_ptr[DType.int8](p, P_Q2)
    var da = param_ptr[F32](p, P_D)
    var sa = param_ptr[DType.int32](p, P_SUM)
    var sa_f = param_ptr[F32](p, P_SUM_F)
    var sa_lo = param_ptr[DType.int32](p, P_SUM_LO)
    var stride = param_int(p, P_BLOCK_STRIDE)
    var nb = k // QK
    for r in range(begin, end):
        var b0 = 0
        while b0 < nb:
            var n = min(GROUP, nb - b0)
            var peaks = Array[F32x16, GROUP](fill=F32x16(0))  # per block: max |x| of its two 16-value halves
            comptime for j in range(GROUP):
                if j < n:
                    var v = x.unsafe_offset(r * k + (b0 + j) * QK).unsafe_load[width=QK]().cast[F32]()
                    var a = abs(v)
                    peaks[bitrev4(j)] = max(a.slice[16, offset=0](), a.slice[16, offset=16]())
            var amax = lane_maxima(peaks)  # lane j: block b0 + j's max |x|
            var inv = amax.gt(F32x16(0)).select(F32x16(127) / amax, F32x16(0))
            var lo_parts = Array[I32x16, GROUP](fill=I32x16(0))
            var hi_parts = Array[I32x16, GROUP](fill=I32x16(0))
            comptime for j in range(GROUP):
                if j < n:
                    var at = r * k + (b0 + j) * QK
                    var t = x.unsafe_offset(at).unsafe_load[width=QK]().cast[F32]() * inv[j]
                    # round() is half-to-even. No sum of products here, so FMA contraction cannot make these
                    # differ from the NumPy reference (kernels/reference/quant_matmul.py).
                    var q1i = round(t).cast[DType.int32]()
                    qa.unsafe_offset(at).unsafe_store(q1i.cast[DType.int8]())
                    var q = q1i
                    comptime if two:
                        var q2i = round(t * 254).cast[DType.int32]() - q1i * 254
                        qa2.unsafe_offset(at).unsafe_store(q2i.cast[DType.int8]())
                        q = q1i * 254 + q2i
                    lo_parts[bitrev4(j)] = q.slice[16, offset=0]()  # |lo| <= 16 * 32258
                    hi_parts[bitrev4(j)] = q.slice[16, offset=16]()
            var lo = lane_sums(lo_parts)
            var s = lo + lane_sums(hi_parts)  # |s| <= 32 * 32258
            var d = amax / Float32(32258 if two else 127)
            var d_s = d * s.cast[F32]()
            # Lane j goes to block b0 + j's column. A compile-time lane index extracts from the register; a
            # run-time one spilled each vector to the stack and read lanes back, and those reloads stalled on
            # the spills (half of this phase's time at 32 rows).
            comptime for j in range(GROUP):
                if j < n:
                    var at = (b0 + j) * stride + r
                    da[unsafe_offset=at] = d[j]
                    sa[unsafe_offset=at] = s[j]
                    sa_f[unsafe_offset=at] = d_s[j]
                    sa_lo[unsafe_offset=at] = lo[j]
            b0 += GROUP


def quantize_rows(p: Params, begin: Int, end: Int):
    """Phase 1 for activation rows [begin, end), in the call's mode."""
    if two_parts(p):
        _quantize_dtype[True](p, begin, end)
    else:
        _quantize_dtype[False](p, begin, end)


def _quantize_dtype[two: Bool](p: Params, begin: Int, end: Int):
    if param_int(p, P_X_DTYPE) == DTYPE_BF16:
        _quantize_rows[BF16, two](p, begin, end)
    else:
        _quantize_rows[F32, two](p, begin, end)
