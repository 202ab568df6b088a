# Float32 -> activation-dtype conversions and the int8 dot product shared by the kernels.
#
# The compiler lowers a float32 -> bfloat16 `cast` to scalar code on x86-64 (about 10x slower than the
# rest of a kernel's row); these do the same round-to-nearest-even with integer vector operations.
# NaN payloads are not preserved (the activations never hold NaN).

from std.memory import bitcast
from std.sys import CompilationTarget, inlined_assembly, llvm_intrinsic

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime F16 = DType.float16
comptime F16_MAX = Float32(65504)  # float16's largest finite value


@always_inline
def bf16_bits[w: Int](x: SIMD[F32, w]) -> SIMD[DType.uint32, w]:
    """x's float32 bits rounded to nearest-even at bfloat16 precision, low 16 bits zero."""
    var bits = bitcast[DType.uint32, w](x)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000


@always_inline
def narrow[dt: DType, w: Int](x: SIMD[F32, w]) -> SIMD[dt, w]:
    """x converted to dt (float32, bfloat16, or float16 clamped to its finite range), rounding to nearest-even
    (F16C's vcvtps2ph for float16)."""
    comptime if dt == BF16:
        return bitcast[dt, w]((bf16_bits[w](x) >> 16).cast[DType.uint16]())
    elif dt == F16:
        return max(min(x, SIMD[F32, w](F16_MAX)), SIMD[F32, w](-F16_MAX)).cast[dt]()
    else:
        return x.cast[dt]()


@always_inline
def round_to[dt: DType, w: Int](x: SIMD[F32, w]) -> SIMD[F32, w]:
    """x rounded to dt and widened back: what a torch op's dt output holds."""
    comptime if dt == BF16:
        return bitcast[F32, w](bf16_bits[w](x))
    else:
        return x


@always_inline
def byte_bits[shift: Int, mask: Int, to: Int](v: SIMD[DType.uint8, 64]) -> SIMD[DType.uint8, 64]:
    """((v >> shift) & mask) << to per byte (mask << to < 256), in 16-bit lanes: the mask drops what the
    neighbouring byte shifts in. Byte shifts written as such compile to vgf2p8affineqb where the CPU has GFNI,
    which on AMD Zen 4 issues to the pipes that vpdpbusd and the FMAs use; 16-bit shifts and masks issue
    elsewhere, so the quantized matmuls' unpacking stops competing with their products."""
    comptime assert (mask << to) < 256, "the field must stay inside its byte"
    var lanes = (bitcast[DType.uint16, 32](v) >> UInt16(shift)) & UInt16(mask * 0x0101)
    return bitcast[DType.uint8, 64](lanes << UInt16(to))


@always_inline
def high_nibbles(v: SIMD[DType.uint8, 64]) -> SIMD[DType.uint8, 64]:
    """v >> 4 per byte (see byte_bits)."""
    return byte_bits[4, 0x0F, 0](v)


# AVX-512 VNNI's vpdpbusd, or (on a CPU without it, such as an AVX2-only AMD Zen 3) the same integers from AVX2's
# multiply-adds, so the quantized matmuls give every row the same bits on either kind of CPU.
comptime HAS_VNNI_512 = CompilationTarget._has_feature["avx512vnni"]()
comptime HAS_AVX512 = CompilationTarget._has_feature["avx512f"]()  # 32 zmm registers, rather than AVX2's 16 ymm
comptime HAS_AVX2 = CompilationTarget._has_feature["avx2"]()
comptime I32x8 = SIMD[DType.int32, 8]
comptime I16x16 = SIMD[DType.int16, 16]


@always_inline
def dpbusd[small_weights: Bool](acc: SIMD[DType.int32, 16], w: SIMD[DType.uint8, 64],
                                a: SIMD[DType.int8, 64]) -> SIMD[DType.int32, 16]:
    """acc + per lane i the sum over j < 4 of w[4i + j] * a[4i + j] (u8 x s8), exactly. small_weights: every w is
    below 128 (4-, 5- and 6-bit quants), so on AVX2 vpmaddubsw's pair sums cannot saturate (|2 * 127 * 128| <
    2^15) and vpmaddwd by ones adds the pairs. Larger weights (Q8_0's, up to 255) take the portable branch: on
    AVX2 the kernels multiply them as magnitude and sign instead (signed_dots)."""
    comptime if HAS_VNNI_512:
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.512", SIMD[DType.int32, 16]](acc, bitcast[DType.int8, 64](w), a)
    elif HAS_AVX2 and small_weights:
        var halves = Array[I32x8, 2](fill=I32x8(0))
        comptime for h in range(2):
            var wh = w.slice[32, offset=32 * h]()
            var ah = a.slice[32, offset=32 * h]()
            var pairs = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", I16x16](bitcast[DType.int8, 32](wh), ah)
            halves[h] = llvm_intrinsic["llvm.x86.avx2.pmadd.wd", I32x8](pairs, I16x16(1))
        return acc + halves[0].join(halves[1])
    else:
        var products = w.cast[DType.int32]() * a.cast[DType.int32]()  # [64]
        var evens_odds = products.deinterleave()
        var pairs = evens_odds[0] + evens_odds[1]  # [32]
        var quads = pairs.deinterleave()
        return acc + quads[0] + quads[1]


# ----- AVX2's int8 products in 16-bit pair sums ---------------------------------------------------------------
# A CPU without AVX-512 VNNI computes vpdpbusd's sums with vpmaddubsw (u8 x s8 pairs into int16 lanes) and
# vpmaddwd by ones (pairs into int32): two multiplies where VNNI issues one. Where the weights are small, several
# vectors' pair sums fit an int16 lane exactly, so they are added there (vpaddw) and widened once: the same
# int32s as dpbusd's, with about half the multiplies (the K-quant matmul's AVX2 path, quant_kmatmul.mojo).
comptime PAIRS_PATH = HAS_AVX2 and not HAS_VNNI_512
comptime I16x32 = SIMD[DType.int16, 32]
# Rows a weight vector serves at a time on the AVX2 pairs path, with one activation part and with two: each row's
# int16 sums (two ymm a part) held in registers beside the weight vector (add_pair_sums). Measured on AMD Zen 3 at
# 8-512 rows, with those sums pinned to registers: 6 rows with one part (5 measured 0-5% slower); 3 with two (4
# spills: Q4_K 1.06-1.12x with 3, Q6_K 0.98-0.99x).
comptime PAIRS_ROWS_ONE = 6
comptime PAIRS_ROWS_TWO = 3
# The same for 8-bit weights (signed_dots): each row's int32 sum takes the place of its int16 pair sums, and the
# weights' magnitudes and signs are held beside them. Two parts add into one sum (add_signed_dots), which leaves room
# for 3 rows (AMD Zen 3: 1.00-1.02x the 2 rows of two sums each).
comptime SIGNED_ROWS_ONE = 4
comptime SIGNED_ROWS_TWO = 3


@always_inline
def pair_span(max_weight: Int) -> Int:
    """How many vectors' pair sums an int16 lane holds exactly for unsigned weights up to max_weight and any int8
    activations: each pair is at most 2 * max_weight * 128 in magnitude (4 bits: 8 vectors, 5 bits: 4, 6 bits: 2).
    vpmaddubsw saturates a pair at int16's range, which such weights never reach."""
    return 32767 // (2 * max_weight * 128)


@always_inline
def pair_sums(w: SIMD[DType.uint8, 64], a: Int32) -> I16x32:
    """Per 32-bit lane i of w (column i): int16 lanes 2i and 2i + 1 = w[4i] a0 + w[4i+1] a1 and w[4i+2] a2 +
    w[4i+3] a3, where a holds the four int8s a0..a3 (the same for every lane). w below 128."""
    var a8 = bitcast[DType.int8, 32](I32x8(a))
    var lo = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", I16x16](bitcast[DType.int8, 32](w.slice[32, offset=0]()), a8)
    var hi = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", I16x16](bitcast[DType.int8, 32](w.slice[32, offset=32]()), a8)
    return lo.join(hi)


comptime Words = Pointer[Scalar[DType.int32], MutAnyOrigin]  # int8 activations, 4 K-steps a word
comptime Ints = Pointer[Scalar[DType.int32], MutAnyOrigin]
comptime Floats = Pointer[Scalar[F32], MutAnyOrigin]


@always_inline
def add_pair_sums[R: Int, two: Bool, g: Int](mut pairs1: Array[I16x32, R], mut pairs2: Array[I16x32, R],
                                             w: SIMD[DType.uint8, 64], a1: Words, a2: Words, row_words: Int):
    """R rows' int16 pair sums plus those of weight vector g (K-steps 4g..4g+3 of a block) with each row's q1 word
    (and q2's with two parts): row r's at a1 + r * row_words + g (a2 likewise). The kernels' pairs path, where
    the caller keeps the sums within pair_span vectors; each sum is pinned to registers (in_registers)."""
    comptime for r in range(R):
        pairs1[r] = in_registers(pairs1[r] + pair_sums(w, a1[unsafe_offset=r * row_words + g]))
        comptime if two:
            pairs2[r] = in_registers(pairs2[r] + pair_sums(w, a2[unsafe_offset=r * row_words + g]))


@always_inline
def add_signed_dots[R: Int, two: Bool, g: Int](mut dots: Array[SIMD[DType.int32, 16], R],
                                               magnitudes: SIMD[DType.uint8, 64], q: SIMD[DType.int8, 64], a1: Words,
                                               a2: Words, row_words: Int):
    """R rows' int32 sums plus those of signed weight vector g (its magnitudes and q, signed_dots') with each row's
    q1 word, the rows' words as add_pair_sums reads them: 8-bit weights' pairs path. With two parts, 254 times q1's
    products plus q2's, so each row's sum is quant_activations.combine_parts' 254 * dot1 + dot2 as it grows (one
    accumulator a row, and no combine after)."""
    comptime for r in range(R):
        comptime if two:
            dots[r] = signed_dots[254](dots[r], magnitudes, q, a1[unsafe_offset=r * row_words + g])
            dots[r] = signed_dots(dots[r], magnitudes, q, a2[unsafe_offset=r * row_words + g])
        else:
            dots[r] = signed_dots(dots[r], magnitudes, q, a1[unsafe_offset=r * row_words + g])


@always_inline
def in_registers(v: I16x32) -> I16x32:
    """v, held in two ymm registers at this point of the program, in program order with the other such points.
    Without it LLVM ran a block row by row: it unpacked all 8 weight vectors first, spilled them to the stack and
    reloaded them for every row, so the loads (2 ymm a cycle on Zen 3) bounded the multiplies. Pinned, the block
    runs a weight vector at a time across the rows, as written: one-part 4-bit products 1.21-1.30x, two-part
    1.08-1.18x (AMD Zen 3, 8-512 rows; the same integers in the same order of additions per row)."""
    var lo = inlined_assembly["", I16x16, constraints="=x,0", has_side_effect=True](v.slice[16, offset=0]())
    var hi = inlined_assembly["", I16x16, constraints="=x,0", has_side_effect=True](v.slice[16, offset=16]())
    return lo.join(hi)


@always_inline
def widen_pairs(pairs: I16x32) -> SIMD[DType.int32, 16]:
    """Per column i, the sum of its two int16 pair lanes as an int32 (vpmaddwd by ones: exact)."""
    return _widen_times[1](pairs)


@always_inline
def _widen_times[times: Int](pairs: I16x32) -> SIMD[DType.int32, 16]:
    """Per column i, `times` x the sum of its two int16 pair lanes, as an int32 (vpmaddwd by `times`)."""
    var lo = llvm_intrinsic["llvm.x86.avx2.pmadd.wd", I32x8](pairs.slice[16, offset=0](), I16x16(times))
    var hi = llvm_intrinsic["llvm.x86.avx2.pmadd.wd", I32x8](pairs.slice[16, offset=16](), I16x16(times))
    return lo.join(hi)


@always_inline
def widen_parts(pairs1: I16x32, pairs2: I16x32) -> SIMD[DType.int32, 16]:
    """Per column i, 254 * (the sum of pairs1's two lanes) + the sum of pairs2's: two activation parts' pair sums
    widened straight into quant_activations.combine_parts' 254 * dot1 + dot2, the 254 as vpmaddwd's multiplier in
    place of widen_pairs' ones (its products exact: 254 x 2 x 32767 < 2^31, within what pair_span allows). One
    accumulator a row where there were two, and no shift and subtract to combine them."""
    return _widen_times[254](pairs1) + _widen_times[1](pairs2)


@always_inline
def signed_dots[times: Int = 1](acc: SIMD[DType.int32, 16], magnitudes: SIMD[DType.uint8, 64],
                                q: SIMD[DType.int8, 64], a: Int32) -> SIMD[DType.int32, 16]:
    """acc + per 32-bit lane i of q (column i) `times` the sum over j < 4 of q[4i + j] * a_j, exactly, where
    magnitudes = |q| (128 for -128) and a holds the four int8s a0..a3, each in [-127, 127] (the activations' bound).
    For 8-bit weights, whose pair sums do not fit int16 lanes as unsigned bytes (2 x 255 x 127): vpsignb moves q's
    sign onto the activation, so vpmaddubsw's pairs |q| x (+-a) are at most 2 x 128 x 127 = 32512 < 2^15, and
    vpmaddwd by `times` (1, or 254 for a first activation part: 2 x 254 x 32512 < 2^31) widens them."""
    comptime assert 0 < times < 32768, "vpmaddwd's multiplier is an int16"
    var a8 = bitcast[DType.int8, 32](I32x8(a))
    var halves = Array[I32x8, 2](fill=I32x8(0))
    comptime for h in range(2):
        var signed_a = llvm_intrinsic["llvm.x86.avx2.psign.b", SIMD[DType.int8, 32]](a8, q.slice[32, offset=32 * h]())
        var pairs = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", I16x16](
            bitcast[DType.int8, 32](magnitudes.slice[32, offset=32 * h]()), signed_a)
        halves[h] = llvm_intrinsic["llvm.x86.avx2.pmadd.wd", I32x8](pairs, I16x16(times))
    return acc + halves[0].join(halves[1])
