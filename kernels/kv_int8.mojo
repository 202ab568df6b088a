# The int8 KV cache's rows, shared by the KV writes (attention.mojo, layers.mojo) and attention's reads.
#
# Layout and rule (kernels/kv_int8.py, the torch form the tests compare against bit for bit): a row of one
# token and one KV head is head_dim int8 values, then their float32 scale in 4 bytes;
# q = round-half-even(x * (127 / max|x|)), scale = max|x| / 127, a zero row stores zeros. A cache of
# another dtype (float32, bfloat16) has rows of head_dim values and scale 1.

from std.math import round
from std.memory import bitcast

comptime I8 = DType.int8
comptime F32 = DType.float32
comptime SCALE_BYTES = 4


@always_inline
def row_width[cdt: DType](head_dim: Int) -> Int:
    """Elements per cache row of one token and one KV head."""
    comptime if cdt == I8:
        return head_dim + SCALE_BYTES
    else:
        return head_dim


def quantize_row[dt: DType](dst: Pointer[Scalar[I8], MutAnyOrigin], src: Pointer[Scalar[dt], MutAnyOrigin],
                            head_dim: Int):
    """dst[:head_dim + 4] = the int8 row of src[:head_dim] (head_dim a multiple of 8)."""
    var m = SIMD[F32, 8](0)
    var d = 0
    while d < head_dim:
        m = max(m, abs(src.unsafe_offset(d).unsafe_load[width=8]().cast[F32]()))
        d += 8
    var amax = m.reduce_max()
    var inv = Float32(127) / amax if amax > 0 else Float32(0)
    d = 0
    while d < head_dim:
        # round() is half-to-even; one product and no sum, so no FMA contraction can change a value.
        var t = src.unsafe_offset(d).unsafe_load[width=8]().cast[F32]() * inv
        dst.unsafe_offset(d).unsafe_store(round(t).cast[DType.int32]().cast[I8]())
        d += 8
    dst.unsafe_offset(head_dim).unsafe_store(bitcast[I8, SCALE_BYTES](SIMD[F32, 1](amax / 127)))


@always_inline
def row_scale[cdt: DType](row: Pointer[Scalar[cdt], MutAnyOrigin], head_dim: Int) -> Float32:
    """The scale of the cache row starting at `row` (1 for a cache that is not int8)."""
    comptime if cdt == I8:
        return bitcast[F32, 1](row.unsafe_offset(head_dim).unsafe_load[width=SCALE_BYTES]())
    else:
        return Float32(1)
