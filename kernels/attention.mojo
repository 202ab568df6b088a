# MILI's CPU attention kernels over the paged KV cache, called from Python (kernels/attention.py).
#
# Cache layout per layer: K and V as [num_blocks, block_size, kv_heads, row], float32 or bfloat16 rows of
# head_dim values, or int8 rows of head_dim values and their float32 scale (kernels/kv_int8.mojo). An int8
# cache goes with float32 or bfloat16 queries, a float16 cache with float32 queries; their rows are widened
# to float32 as they are read.
# Every pointer, shape and stride arrives in one int64 parameter array (kernels/params.mojo);
# kernels/attention.py has checked them (dtypes, contiguity, index ranges) before the call, so nothing
# here re-validates. paged_attention can also be entered from C for a range of its work items, which
# is how it runs on torch's OpenMP threads (kernels/omp_program.c).
#
# paged_attention handles a whole ragged batch in one call: decode rows (one query token) and prefill
# chunks (causal over their own tokens, attending to their cached prefix) alike. Work items are
# (sequence, KV head, range of query rows), planned once per step in Python; each item walks the
# sequence's pages with an online softmax in float32 for the query heads that share its KV head, so K and V
# are read from the cache in place (no gather copy). head_dim 64 and 128 run kernels/attention_chunks.mojo
# (16 keys scored at once, chunks of keys in two passes); other head dims the per-key loop below.

from std.python import PythonObject
from std.python.bindings import PythonModuleBuilder
from std.os import abort
from std.math import exp
from std.sys import simd_width_of
from numerics import narrow
from params import Params, param_int, param_ptr, param_float
from kv_int8 import I8, F16, CACHE_INT8, CACHE_F16, quantize_row, scale_at, scale_offset, value_offset
from attention_chunks import attend_chunks
from attention_prompt import prompt_scratch_floats
from attention_prompt_bf16 import bf16_prompt_scratch_floats

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime W = simd_width_of[F32]()  # 16 lanes with AVX-512
comptime W8 = 8  # head_dim is a multiple of 8; a 16-lane loop leaves at most one 8-lane tail

comptime DTYPE_F32 = 0
comptime DTYPE_BF16 = 1
comptime CACHE_KIND_PARAM = 19  # paged_attention's: kv_int8.mojo's CACHE_SAME, CACHE_INT8 or CACHE_F16
comptime SCRATCH_WIDTH_PARAM = 20  # paged_attention's: float32 scratch per work item (kernels/attention.py)


@export
def PyInit_mili_attention() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("mili_attention")
        m.def_function[paged_attention]("paged_attention", docstring="ragged paged attention (decode + prefill)")
        m.def_function[write_kv]("write_kv", docstring="scatter new K/V rows into the paged cache")
        m.def_function[prompt_rows_scratch]("prompt_rows_scratch",
                                            docstring="scratch floats an item's prompt rows take over an int8 cache")
        return m.finalize()
    except e:
        abort(String("error creating module:", e))



def _dot[dt: DType](q: Pointer[Scalar[F32], MutAnyOrigin], k: Pointer[Scalar[dt], MutAnyOrigin], n: Int) -> Float32:
    """sum(q[:n] * k[:n]) in float32; q is float32, k in the cache dtype (int8 unscaled)."""
    var acc = SIMD[F32, W](0)
    var d = 0
    while d + W <= n:
        acc += q.unsafe_offset(d).unsafe_load[width=W]() * k.unsafe_offset(d).unsafe_load[width=W]().cast[F32]()
        d += W
    var s = acc.reduce_add()
    if d < n:
        var kd = k.unsafe_offset(d).unsafe_load[width=W8]().cast[F32]()
        s += (q.unsafe_offset(d).unsafe_load[width=W8]() * kd).reduce_add()
    return s


def _scale_add[dt: DType](acc: Pointer[Scalar[F32], MutAnyOrigin], corr: Float32, w: Float32,
                          v: Pointer[Scalar[dt], MutAnyOrigin], n: Int):
    """acc[:n] = acc[:n] * corr + w * v[:n]."""
    var d = 0
    while d + W <= n:
        var a = acc.unsafe_offset(d).unsafe_load[width=W]()
        acc.unsafe_offset(d).unsafe_store(a * corr + v.unsafe_offset(d).unsafe_load[width=W]().cast[F32]() * w)
        d += W
    if d < n:
        var a8 = acc.unsafe_offset(d).unsafe_load[width=W8]()
        acc.unsafe_offset(d).unsafe_store(a8 * corr + v.unsafe_offset(d).unsafe_load[width=W8]().cast[F32]() * w)


comptime GROUP_KEYS = 16  # keys per online-softmax update in _attend_rows


@always_inline
def _row_place[cdt: DType](block_tables: Pointer[Scalar[DType.int32], MutAnyOrigin], table: Int, pos: Int,
                           block_size: Int, kv_heads: Int, head: Int, head_dim: Int) -> Tuple[Int, Int]:
    """(values offset, scale offset) of position pos's row for KV head `head` in the sequence whose table starts
    at block_tables[table] (kernels/kv_int8.mojo)."""
    var page = Int(block_tables[unsafe_offset=table + pos // block_size])
    var in_page = pos % block_size
    return (value_offset[cdt](page, in_page, head, block_size, kv_heads, head_dim),
            scale_offset[cdt](page, in_page, head, block_size, kv_heads, head_dim))


def _attend_rows[dt: DType, cdt: DType](args: Params, begin: Int, end: Int):
    var out = param_ptr[dt](args, 0)
    var query = param_ptr[dt](args, 1)
    var k_cache = param_ptr[cdt](args, 2)
    var v_cache = param_ptr[cdt](args, 3)
    var block_tables = param_ptr[DType.int32](args, 4)
    var context_lens = param_ptr[DType.int32](args, 5)
    var query_start = param_ptr[DType.int32](args, 6)
    var items = param_ptr[DType.int32](args, 7)
    var n_items = param_int(args, 8)
    var num_heads = param_int(args, 9)
    var kv_heads = param_int(args, 10)
    var head_dim = param_int(args, 11)
    var block_size = param_int(args, 12)
    var max_blocks = param_int(args, 13)
    var q_stride = param_int(args, 14)
    var out_stride = param_int(args, 15)
    var scale = param_float(args, 16)
    var scratch = param_ptr[F32](args, 17)
    var group = num_heads // kv_heads
    var scratch_per_item = param_int(args, SCRATCH_WIDTH_PARAM)

    def item(i: Int) {imm out, imm query, imm k_cache, imm v_cache, imm block_tables, imm context_lens,
                      imm query_start, imm items, imm head_dim, imm block_size, imm max_blocks, imm q_stride,
                      imm out_stride, imm scale, imm scratch, imm group, imm kv_heads,
                      imm scratch_per_item}:
        var seq = Int(items[unsafe_offset=4 * i])
        var kvh = Int(items[unsafe_offset=4 * i + 1])
        var row_begin = Int(items[unsafe_offset=4 * i + 2])
        var row_end = Int(items[unsafe_offset=4 * i + 3])
        var ctx = Int(context_lens[unsafe_offset=seq])
        var q0 = Int(query_start[unsafe_offset=seq])
        var q_len = Int(query_start[unsafe_offset=seq + 1]) - q0
        var acc = scratch.unsafe_offset(i * scratch_per_item)
        var q = acc.unsafe_offset(head_dim)
        var scores = q.unsafe_offset(head_dim)
        for r in range(row_begin, row_end):
            var token = q0 + r
            var visible = ctx - q_len + r + 1  # causal: keys up to this token's own position
            for g in range(group):
                var head = kvh * group + g
                var q_in = query.unsafe_offset(token * q_stride + head * head_dim)
                for d in range(head_dim):
                    q[unsafe_offset=d] = q_in[unsafe_offset=d].cast[F32]() * scale
                    acc[unsafe_offset=d] = 0
                var m = Float32(-3.0e38)
                var l = Float32(0)
                # Keys in groups of GROUP_KEYS positions, whatever the page size, so a row's bits do not depend
                # on --block-size.
                var k0 = 0
                while k0 < visible:
                    var n = min(GROUP_KEYS, visible - k0)
                    var block_max = Float32(-3.0e38)
                    for j in range(n):
                        var at = _row_place[cdt](block_tables, seq * max_blocks, k0 + j, block_size, kv_heads, kvh,
                                                 head_dim)
                        var s = _dot[cdt](q, k_cache.unsafe_offset(at[0]), head_dim) * scale_at[cdt](k_cache, at[1])
                        scores[unsafe_offset=j] = s
                        block_max = max(block_max, s)
                    var new_m = max(m, block_max)
                    var corr = exp(m - new_m)
                    l = l * corr
                    for j in range(n):
                        var w = exp(scores[unsafe_offset=j] - new_m)
                        l += w
                        # The correction applies once per group; later keys of the group add with corr 1.
                        var at = _row_place[cdt](block_tables, seq * max_blocks, k0 + j, block_size, kv_heads, kvh,
                                                 head_dim)
                        _scale_add[cdt](acc, corr if j == 0 else Float32(1), w * scale_at[cdt](v_cache, at[1]),
                                        v_cache.unsafe_offset(at[0]), head_dim)
                    m = new_m
                    k0 += GROUP_KEYS
                var inv = Float32(1) / l
                var o = out.unsafe_offset(token * out_stride + head * head_dim)
                for d in range(head_dim):
                    o[unsafe_offset=d] = narrow[dt, 1](acc[unsafe_offset=d] * inv)

    for i in range(begin, end):
        item(i)


def _attend_cache[dt: DType, cdt: DType](p: Params, begin: Int, end: Int):
    var head_dim = param_int(p, 11)
    if head_dim == 64:
        attend_chunks[dt, cdt, 64](p, begin, end)
    elif head_dim == 128:
        attend_chunks[dt, cdt, 128](p, begin, end)
    else:
        _attend_rows[dt, cdt](p, begin, end)


def _attend(p: Params, begin: Int, end: Int):
    var code = param_int(p, 18)
    var kind = param_int(p, CACHE_KIND_PARAM)
    if code == DTYPE_BF16:
        if kind == CACHE_INT8:
            _attend_cache[BF16, I8](p, begin, end)
        else:
            _attend_cache[BF16, BF16](p, begin, end)
    else:
        if kind == CACHE_INT8:
            _attend_cache[F32, I8](p, begin, end)
        elif kind == CACHE_F16:
            _attend_cache[F32, F16](p, begin, end)
        else:
            _attend_cache[F32, F32](p, begin, end)


def paged_attention(args: PythonObject) raises -> PythonObject:
    """Every work item, on the calling thread. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    _attend(p, 0, param_int(p, 8))
    return PythonObject(None)


def prompt_rows_scratch(args: PythonObject) raises -> PythonObject:
    """The prompt-row paths' scratch per work item beyond the row path's, the larger of attention_prompt.mojo's (an
    int8 cache) and attention_prompt_bf16.mojo's (a bfloat16 cache) (args: ()): what kernels/attention.py allots."""
    return PythonObject(max(prompt_scratch_floats(), bf16_prompt_scratch_floats()))


@export
def mili_paged_attention_range(params: Int, begin: Int, end: Int) abi("C"):
    """Work items [begin, end) on the calling thread: entered from C by each thread of an OpenMP team."""
    _attend(Params(unsafe_from_address=params), begin, end)


def _quantize_rows[dt: DType](p: Params):
    """write_kv into an int8 cache: each (token, KV head) row quantized on its own (kernels/kv_int8.mojo)."""
    var k_cache = param_ptr[I8](p, 0)
    var v_cache = param_ptr[I8](p, 1)
    var key = param_ptr[dt](p, 2)
    var value = param_ptr[dt](p, 3)
    var slots = param_ptr[DType.int64](p, 4)
    var num_tokens = param_int(p, 5)
    var key_stride = param_int(p, 7)
    var value_stride = param_int(p, 8)
    var head_dim = param_int(p, 11)
    var block_size = param_int(p, 12)
    var kv_heads = param_int(p, 6) // head_dim
    for t in range(num_tokens):
        var slot = Int(slots[unsafe_offset=t])
        var page = slot // block_size
        var in_page = slot % block_size
        for h in range(kv_heads):
            var at = value_offset[I8](page, in_page, h, block_size, kv_heads, head_dim)
            var scale = scale_offset[I8](page, in_page, h, block_size, kv_heads, head_dim)
            quantize_row[dt](k_cache.unsafe_offset(at), k_cache.unsafe_offset(scale),
                             key.unsafe_offset(t * key_stride + h * head_dim), head_dim)
            quantize_row[dt](v_cache.unsafe_offset(at), v_cache.unsafe_offset(scale),
                             value.unsafe_offset(t * value_stride + h * head_dim), head_dim)


def _copy_rows[dt: DType, cdt: DType](p: Params):
    """write_kv into a float cache: rows copied, or narrowed to float16 (numerics.narrow)."""
    var k_cache = param_ptr[cdt](p, 0)
    var v_cache = param_ptr[cdt](p, 1)
    var key = param_ptr[dt](p, 2)
    var value = param_ptr[dt](p, 3)
    var slots = param_ptr[DType.int64](p, 4)
    var num_tokens = param_int(p, 5)
    var row = param_int(p, 6)  # kv_heads * head_dim, a multiple of 8
    var key_stride = param_int(p, 7)
    var value_stride = param_int(p, 8)
    for t in range(num_tokens):
        var slot = Int(slots[unsafe_offset=t])
        var kd = k_cache.unsafe_offset(slot * row)
        var vd = v_cache.unsafe_offset(slot * row)
        var ks = key.unsafe_offset(t * key_stride)
        var vs = value.unsafe_offset(t * value_stride)
        var d = 0
        while d < row:
            comptime if cdt == dt:
                kd.unsafe_offset(d).unsafe_store(rebind[SIMD[cdt, W8]](ks.unsafe_offset(d).unsafe_load[width=W8]()))
                vd.unsafe_offset(d).unsafe_store(rebind[SIMD[cdt, W8]](vs.unsafe_offset(d).unsafe_load[width=W8]()))
            else:
                var k = ks.unsafe_offset(d).unsafe_load[width=W8]().cast[F32]()
                var v = vs.unsafe_offset(d).unsafe_load[width=W8]().cast[F32]()
                kd.unsafe_offset(d).unsafe_store(narrow[cdt, W8](k))
                vd.unsafe_offset(d).unsafe_store(narrow[cdt, W8](v))
            d += W8


def write_kv(args: PythonObject) raises -> PythonObject:
    """Scatters the step's K and V rows. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    var kind = param_int(p, 10)  # kv_int8.mojo's cache kinds
    if param_int(p, 9) == DTYPE_BF16:
        if kind == CACHE_INT8:
            _quantize_rows[BF16](p)
        else:
            _copy_rows[BF16, BF16](p)
    else:
        if kind == CACHE_INT8:
            _quantize_rows[F32](p)
        elif kind == CACHE_F16:
            _copy_rows[F32, F16](p)
        else:
            _copy_rows[F32, F32](p)
    return PythonObject(None)
