# Float32 -> activation-dtype conversions shared by the kernels.
#
# The compiler lowers a float32 -> bfloat16 `cast` to scalar code on x86-64 (about 10x slower than the
# rest of a kernel's row); these do the same round-to-nearest-even with integer vector operations.
# NaN payloads are not preserved (the activations never hold NaN).

from std.memory import bitcast

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
