# The KV cache's layout (every dtype) and the int8 cache's rule, shared by the KV writes (attention.mojo,
# layers.mojo) and attention's reads (attention.mojo, attention_chunks.mojo).
#
# Layout and rule (kernels/kv_int8.py, the torch form the tests compare against bit for bit): a block holds
# block_size x kv_heads rows of head_dim values, row (t, h) at (t * kv_heads + h) * head_dim; an int8 cache's
# block then holds the rows' float32 scales, in the same order, in its last block_size x kv_heads x 4 bytes.
# q = round-half-even(x * (127 / max|x|)), scale = max|x| / 127, a zero row stores zeros. A cache of another
# dtype (float32, bfloat16, float16) has no scales (scale 1).
#
# The kernels learn a cache's dtype from a code beside the activations' (kernels/kv_int8.py cache_kind): CACHE_SAME,
# rows in the activations' dtype; CACHE_INT8; CACHE_F16, float16 rows beside float32 activations (what a CPU without
# bfloat16 arithmetic keeps at half the bytes), each value rounded to nearest-even and clamped to float16's range.

from std.math import round
from std.memory import bitcast

comptime I8 = DType.int8
comptime F32 = DType.float32
comptime F16 = DType.float16
comptime SCALE_BYTES = 4
comptime CACHE_SAME = 0
comptime CACHE_INT8 = 1
comptime CACHE_F16 = 2


@always_inline
def row_width[cdt: DType](head_dim: Int) -> Int:
    """Elements per (token, KV head) in a block: its values, and an int8 row's scale bytes."""
    comptime if cdt == I8:
        return head_dim + SCALE_BYTES
    else:
        return head_dim


@always_inline
def value_offset[cdt: DType](page: Int, in_page: Int, head: Int, block_size: Int, kv_heads: Int,
                             head_dim: Int) -> Int:
    """Elements from the cache's start to the values of token in_page of block page, KV head head."""
    return page * block_size * kv_heads * row_width[cdt](head_dim) + (in_page * kv_heads + head) * head_dim


@always_inline
def scale_offset[cdt: DType](page: Int, in_page: Int, head: Int, block_size: Int, kv_heads: Int,
                             head_dim: Int) -> Int:
    """Bytes from an int8 cache's start to the scale of that row (0 for other dtypes: they have none)."""
    comptime if cdt == I8:
        return page * block_size * kv_heads * (head_dim + SCALE_BYTES) + block_size * kv_heads * head_dim \
            + (in_page * kv_heads + head) * SCALE_BYTES
    else:
        return 0


@always_inline
def scale_at[cdt: DType](cache: Pointer[Scalar[cdt], MutAnyOrigin], offset: Int) -> Float32:
    """The scale at scale_offset `offset` of an int8 cache (1 for a cache that is not int8)."""
    comptime if cdt == I8:
        return bitcast[F32, 1](cache.unsafe_offset(offset).unsafe_load[width=SCALE_BYTES]())
    else:
        return Float32(1)


def quantize_row[dt: DType](values: Pointer[Scalar[I8], MutAnyOrigin], scale: Pointer[Scalar[I8], MutAnyOrigin],
                            src: Pointer[Scalar[dt], MutAnyOrigin], head_dim: Int):
    """values[:head_dim] and the 4 bytes at scale = the int8 row of src[:head_dim] (head_dim a multiple of 8)."""
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
        values.unsafe_offset(d).unsafe_store(round(t).cast[DType.int32]().cast[I8]())
        d += 8
    scale.unsafe_store(bitcast[I8, SCALE_BYTES](SIMD[F32, 1](amax / 127)))
