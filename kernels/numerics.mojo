# Float32 -> activation-dtype conversions and the int8 dot product shared by the kernels.
#
# The compiler lowers a float32 -> bfloat16 `cast` to scalar code on x86-64 (about 10x slower than the
# rest of a kernel's row); these do the same round-to-nearest-even with integer vector operations.
# NaN payloads are not preserved (the activations never hold NaN).

from std.memory import bitcast
from std.sys import CompilationTarget, llvm_intrinsic

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16


@always_inline
def bf16_bits[w: Int](x: SIMD[F32, w]) -> SIMD[DType.uint32, w]:
    """x's float32 bits rounded to nearest-even at bfloat16 precision, low 16 bits zero."""
    var bits = bitcast[DType.uint32, w](x)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000


@always_inline
def narrow[dt: DType, w: Int](x: SIMD[F32, w]) -> SIMD[dt, w]:
    """x converted to dt (float32 or bfloat16), rounding to nearest-even."""
    comptime if dt == BF16:
        return bitcast[dt, w]((bf16_bits[w](x) >> 16).cast[DType.uint16]())
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
    2^15) and vpmaddwd by ones adds the pairs; otherwise (Q8_0's w up to 255) the bytes are widened to 16 bits
    first and vpmaddwd multiplies them (each product fits 16 bits, each pair sum 32)."""
    comptime if HAS_VNNI_512:
        return llvm_intrinsic["llvm.x86.avx512.vpdpbusd.512", SIMD[DType.int32, 16]](acc, bitcast[DType.int8, 64](w), a)
    elif HAS_AVX2:
        var halves = Array[I32x8, 2](fill=I32x8(0))
        comptime for h in range(2):
            var wh = w.slice[32, offset=32 * h]()
            var ah = a.slice[32, offset=32 * h]()
            comptime if small_weights:
                var pairs = llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", I16x16](bitcast[DType.int8, 32](wh), ah)
                halves[h] = llvm_intrinsic["llvm.x86.avx2.pmadd.wd", I32x8](pairs, I16x16(1))
            else:
                var w16 = wh.cast[DType.int16]()
                var a16 = ah.cast[DType.int16]()
                var lo = llvm_intrinsic["llvm.x86.avx2.pmadd.wd", I32x8](w16.slice[16, offset=0](), a16.slice[16, offset=0]())
                var hi = llvm_intrinsic["llvm.x86.avx2.pmadd.wd", I32x8](w16.slice[16, offset=16](), a16.slice[16, offset=16]())
                var pairs = lo.join(hi).deinterleave()  # adjacent pair sums: the even and the odd ones
                halves[h] = pairs[0] + pairs[1]
        return acc + halves[0].join(halves[1])
    else:
        var products = w.cast[DType.int32]() * a.cast[DType.int32]()  # [64]
        var evens_odds = products.deinterleave()
        var pairs = evens_odds[0] + evens_odds[1]  # [32]
        var quads = pairs.deinterleave()
        return acc + quads[0] + quads[1]
