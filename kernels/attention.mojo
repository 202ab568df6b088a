# MILI's CPU attention kernels over the paged KV cache, called from Python (kernels/attention.py).
#
# Cache layout per layer: K and V as [num_blocks, block_size, kv_heads, row], float32 or bfloat16 rows of
# head_dim values, or int8 rows of head_dim values and their float32 scale (kernels/kv_int8.mojo). An int8
# cache goes with float32 or bfloat16 queries; its rows are dequantized to float32 as they are read.
# Every pointer, shape and stride arrives in one int64 parameter array (kernels/params.mojo);
# kernels/attention.py has checked them (dtypes, contiguity, index ranges) before the call, so nothing
# here re-validates. paged_attention can also be entered from C for a range of its work items, which
# is how it runs on torch's OpenMP threads (kernels/omp_program.c).
#
# paged_attention handles a whole ragged batch in one call: decode rows (one query token) and prefill
# chunks (causal over their own tokens, attending to their cached prefix) alike. Work items are
# (sequence, KV head, range of query rows), planned once per step in Python; each item walks the
# sequence's pages with an online softmax in float32, one page at a time, for the query heads that
# share its KV head, so K and V are read from the cache in place (no gather copy).

from std.python import PythonObject
from std.python.bindings import PythonModuleBuilder
from std.os import abort
from std.math import exp
from std.sys import simd_width_of, size_of
from std.sys.intrinsics import prefetch, PrefetchOptions
from numerics import narrow
from params import Params, param_int, param_ptr, param_float
from kv_int8 import I8, quantize_row, row_scale, row_width

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime W = simd_width_of[F32]()  # 16 lanes with AVX-512
comptime W8 = 8  # head_dim is a multiple of 8; a 16-lane loop leaves at most one 8-lane tail

comptime DTYPE_F32 = 0
comptime DTYPE_BF16 = 1
comptime CACHE_INT8_PARAM = 19  # paged_attention's: 1 when the cache is int8, else it has the queries' dtype


@export
def PyInit_mili_attention() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("mili_attention")
        m.def_function[paged_attention]("paged_attention", docstring="ragged paged attention (decode + prefill)")
        m.def_function[write_kv]("write_kv", docstring="scatter new K/V rows into the paged cache")
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
        s += (q.unsafe_offset(d).unsafe_load[width=W8]() * k.unsafe_offset(d).unsafe_load[width=W8]().cast[F32]()).reduce_add()
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
    var rw = row_width[cdt](head_dim)  # one head's row in the cache
    var row_stride = kv_heads * rw  # between consecutive tokens of a page
    var scratch_per_item = 2 * head_dim + 4 * max(block_size, W8)  # sized as the fixed path's

    def item(i: Int) {imm out, imm query, imm k_cache, imm v_cache, imm block_tables, imm context_lens,
                      imm query_start, imm items, imm head_dim, imm block_size, imm max_blocks, imm q_stride,
                      imm out_stride, imm scale, imm scratch, imm group, imm rw, imm row_stride,
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
                var n_blocks = (visible + block_size - 1) // block_size
                for b in range(n_blocks):
                    var page = Int(block_tables[unsafe_offset=seq * max_blocks + b])
                    var n = min(block_size, visible - b * block_size)
                    var base = (page * block_size) * row_stride + kvh * rw
                    var block_max = Float32(-3.0e38)
                    for j in range(n):
                        var k_row = k_cache.unsafe_offset(base + j * row_stride)
                        var s = _dot[cdt](q, k_row, head_dim) * row_scale[cdt](k_row, head_dim)
                        scores[unsafe_offset=j] = s
                        block_max = max(block_max, s)
                    var new_m = max(m, block_max)
                    var corr = exp(m - new_m)
                    l = l * corr
                    for j in range(n):
                        var w = exp(scores[unsafe_offset=j] - new_m)
                        l += w
                        # The correction applies once per page; later rows of the page add with corr 1.
                        var v_row = v_cache.unsafe_offset(base + j * row_stride)
                        _scale_add[cdt](acc, corr if j == 0 else Float32(1), w * row_scale[cdt](v_row, head_dim),
                                        v_row, head_dim)
                    m = new_m
                var inv = Float32(1) / l
                var o = out.unsafe_offset(token * out_stride + head * head_dim)
                for d in range(head_dim):
                    o[unsafe_offset=d] = narrow[dt, 1](acc[unsafe_offset=d] * inv)

    for i in range(begin, end):
        item(i)


def _exp_row(scores: Pointer[Scalar[F32], MutAnyOrigin], padded: Int, row_max: Float32) -> Float32:
    """scores[:padded] = exp(scores - row_max) in place, 8 lanes at a time; returns their sum."""
    var total = Float32(0)
    var j = 0
    while j < padded:
        var w = exp(scores.unsafe_offset(j).unsafe_load[width=W8]() - row_max)
        scores.unsafe_offset(j).unsafe_store(w)
        total += w.reduce_add()
        j += W8
    return total


@always_inline
def _prefetch_page[cdt: DType, RW: Int](k_cache: Pointer[Scalar[cdt], MutAnyOrigin],
                                        v_cache: Pointer[Scalar[cdt], MutAnyOrigin], base: Int, rows: Int,
                                        row_stride: Int):
    """Software prefetch of one head's K and V rows (RW elements each) of a page, one request per 64-byte line."""
    comptime per_line = 64 // size_of[cdt]()
    for j in range(rows):
        var offset = base + j * row_stride
        comptime for e in range(0, RW, per_line):
            prefetch[PrefetchOptions().for_read().high_locality()](k_cache.unsafe_offset(offset + e))
            prefetch[PrefetchOptions().for_read().high_locality()](v_cache.unsafe_offset(offset + e))


def _attend_rows_fixed[dt: DType, cdt: DType, HD: Int](args: Params, begin: Int, end: Int):
    """The same computation as _attend_rows for a head_dim known at compile time. The query heads that
    share a KV head go through the pages together, up to 4 at a time with their queries and
    accumulators in registers, so each K and V row is loaded and widened to float32 once per pass
    instead of once per head; each page's weights are exponentiated 8 at a time. An int8 row's scale
    multiplies its dot products (K) or its weights (V), scalars, not the widened row."""
    comptime RW = row_width[cdt](HD)
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
    var block_size = param_int(args, 12)
    var max_blocks = param_int(args, 13)
    var q_stride = param_int(args, 14)
    var out_stride = param_int(args, 15)
    var scale = param_float(args, 16)
    var scratch = param_ptr[F32](args, 17)
    var group = num_heads // kv_heads
    var row_stride = kv_heads * RW
    var padded = max(block_size, W8)  # one head's page of scores, a whole number of 8-lane vectors
    var scratch_per_item = 2 * HD + 4 * padded

    def item(i: Int) {imm out, imm query, imm k_cache, imm v_cache, imm block_tables, imm context_lens,
                      imm query_start, imm items, imm block_size, imm max_blocks, imm q_stride,
                      imm out_stride, imm scale, imm scratch, imm group, imm row_stride, imm padded,
                      imm scratch_per_item}:
        var seq = Int(items[unsafe_offset=4 * i])
        var kvh = Int(items[unsafe_offset=4 * i + 1])
        var row_begin = Int(items[unsafe_offset=4 * i + 2])
        var row_end = Int(items[unsafe_offset=4 * i + 3])
        var ctx = Int(context_lens[unsafe_offset=seq])
        var q0_token = Int(query_start[unsafe_offset=seq])
        var q_len = Int(query_start[unsafe_offset=seq + 1]) - q0_token
        var s0 = scratch.unsafe_offset(i * scratch_per_item)  # scores of the pass's heads 0..3
        var s1 = s0.unsafe_offset(padded)
        var s2 = s1.unsafe_offset(padded)
        var s3 = s2.unsafe_offset(padded)
        for r in range(row_begin, row_end):
            var token = q0_token + r
            var visible = ctx - q_len + r + 1
            var g0 = 0
            while g0 < group:
                var ng = min(4, group - g0)
                var head = kvh * group + g0
                var qp = query.unsafe_offset(token * q_stride + head * HD)
                var q0 = qp.unsafe_load[width=HD]().cast[F32]() * scale
                var q1 = SIMD[F32, HD](0)
                var q2 = SIMD[F32, HD](0)
                var q3 = SIMD[F32, HD](0)
                if ng > 1:
                    q1 = qp.unsafe_offset(HD).unsafe_load[width=HD]().cast[F32]() * scale
                if ng > 2:
                    q2 = qp.unsafe_offset(2 * HD).unsafe_load[width=HD]().cast[F32]() * scale
                if ng > 3:
                    q3 = qp.unsafe_offset(3 * HD).unsafe_load[width=HD]().cast[F32]() * scale
                var a0 = SIMD[F32, HD](0)
                var a1 = SIMD[F32, HD](0)
                var a2 = SIMD[F32, HD](0)
                var a3 = SIMD[F32, HD](0)
                var m0 = Float32(-3.0e38)
                var m1 = Float32(-3.0e38)
                var m2 = Float32(-3.0e38)
                var m3 = Float32(-3.0e38)
                var l0 = Float32(0)
                var l1 = Float32(0)
                var l2 = Float32(0)
                var l3 = Float32(0)
                var n_blocks = (visible + block_size - 1) // block_size
                for b in range(n_blocks):
                    var page = Int(block_tables[unsafe_offset=seq * max_blocks + b])
                    var n = min(block_size, visible - b * block_size)
                    var base = (page * block_size) * row_stride + kvh * RW
                    if b + 1 < n_blocks:
                        # Pages sit at random places in a cache far larger than the CPU caches: ask for
                        # the next one now so its rows arrive while this one is computed.
                        var next_page = Int(block_tables[unsafe_offset=seq * max_blocks + b + 1])
                        _prefetch_page[cdt, RW](k_cache, v_cache, (next_page * block_size) * row_stride + kvh * RW,
                                                block_size, row_stride)
                    var b0 = Float32(-3.0e38)
                    var b1 = Float32(-3.0e38)
                    var b2 = Float32(-3.0e38)
                    var b3 = Float32(-3.0e38)
                    for j in range(padded):  # lanes past n weigh exp(-inf) = 0
                        s0[unsafe_offset=j] = Float32(-3.0e38)
                        s1[unsafe_offset=j] = Float32(-3.0e38)
                        s2[unsafe_offset=j] = Float32(-3.0e38)
                        s3[unsafe_offset=j] = Float32(-3.0e38)
                    for j in range(n):
                        var k_row = k_cache.unsafe_offset(base + j * row_stride)
                        var k = k_row.unsafe_load[width=HD]().cast[F32]()
                        var ks = row_scale[cdt](k_row, HD)  # an int8 row's scale goes on the dot products
                        var x0 = _scaled[cdt]((q0 * k).reduce_add(), ks)
                        s0[unsafe_offset=j] = x0
                        b0 = max(b0, x0)
                        if ng > 1:
                            var x1 = _scaled[cdt]((q1 * k).reduce_add(), ks)
                            s1[unsafe_offset=j] = x1
                            b1 = max(b1, x1)
                        if ng > 2:
                            var x2 = _scaled[cdt]((q2 * k).reduce_add(), ks)
                            s2[unsafe_offset=j] = x2
                            b2 = max(b2, x2)
                        if ng > 3:
                            var x3 = _scaled[cdt]((q3 * k).reduce_add(), ks)
                            s3[unsafe_offset=j] = x3
                            b3 = max(b3, x3)
                    var n0 = max(m0, b0)
                    var c0 = exp(m0 - n0)
                    a0 = a0 * c0
                    l0 = l0 * c0 + _exp_row(s0, padded, n0)
                    m0 = n0
                    if ng > 1:
                        var n1 = max(m1, b1)
                        var c1 = exp(m1 - n1)
                        a1 = a1 * c1
                        l1 = l1 * c1 + _exp_row(s1, padded, n1)
                        m1 = n1
                    if ng > 2:
                        var n2 = max(m2, b2)
                        var c2 = exp(m2 - n2)
                        a2 = a2 * c2
                        l2 = l2 * c2 + _exp_row(s2, padded, n2)
                        m2 = n2
                    if ng > 3:
                        var n3 = max(m3, b3)
                        var c3 = exp(m3 - n3)
                        a3 = a3 * c3
                        l3 = l3 * c3 + _exp_row(s3, padded, n3)
                        m3 = n3
                    for j in range(n):
                        var v_row = v_cache.unsafe_offset(base + j * row_stride)
                        var v = v_row.unsafe_load[width=HD]().cast[F32]()
                        var vs = row_scale[cdt](v_row, HD)  # and an int8 V row's on its weights
                        a0 += v * _scaled[cdt](s0[unsafe_offset=j], vs)
                        if ng > 1:
                            a1 += v * _scaled[cdt](s1[unsafe_offset=j], vs)
                        if ng > 2:
                            a2 += v * _scaled[cdt](s2[unsafe_offset=j], vs)
                        if ng > 3:
                            a3 += v * _scaled[cdt](s3[unsafe_offset=j], vs)
                var op = out.unsafe_offset(token * out_stride + head * HD)
                op.unsafe_store(narrow[dt, HD](a0 / l0))
                if ng > 1:
                    op.unsafe_offset(HD).unsafe_store(narrow[dt, HD](a1 / l1))
                if ng > 2:
                    op.unsafe_offset(2 * HD).unsafe_store(narrow[dt, HD](a2 / l2))
                if ng > 3:
                    op.unsafe_offset(3 * HD).unsafe_store(narrow[dt, HD](a3 / l3))
                g0 += 4

    for i in range(begin, end):
        item(i)


@always_inline
def _scaled[cdt: DType](x: Float32, scale: Float32) -> Float32:
    """x times an int8 row's scale; a float cache's rows have none (no multiply, the float path's bits)."""
    comptime if cdt == I8:
        return x * scale
    else:
        return x


def _attend_cache[dt: DType, cdt: DType](p: Params, begin: Int, end: Int):
    var head_dim = param_int(p, 11)
    if head_dim == 64:
        _attend_rows_fixed[dt, cdt, 64](p, begin, end)
    elif head_dim == 128:
        _attend_rows_fixed[dt, cdt, 128](p, begin, end)
    else:
        _attend_rows[dt, cdt](p, begin, end)


def _attend(p: Params, begin: Int, end: Int):
    var code = param_int(p, 18)
    var int8_cache = param_int(p, CACHE_INT8_PARAM) != 0
    if code == DTYPE_BF16:
        if int8_cache:
            _attend_cache[BF16, I8](p, begin, end)
        else:
            _attend_cache[BF16, BF16](p, begin, end)
    else:
        if int8_cache:
            _attend_cache[F32, I8](p, begin, end)
        else:
            _attend_cache[F32, F32](p, begin, end)


def paged_attention(args: PythonObject) raises -> PythonObject:
    """Every work item, on the calling thread. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    _attend(p, 0, param_int(p, 8))
    return PythonObject(None)


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
    var kv_heads = param_int(p, 6) // head_dim
    var rw = row_width[I8](head_dim)
    for t in range(num_tokens):
        var slot = Int(slots[unsafe_offset=t])
        for h in range(kv_heads):
            var dst = (slot * kv_heads + h) * rw
            quantize_row[dt](k_cache.unsafe_offset(dst), key.unsafe_offset(t * key_stride + h * head_dim), head_dim)
            quantize_row[dt](v_cache.unsafe_offset(dst), value.unsafe_offset(t * value_stride + h * head_dim),
                             head_dim)


def _copy_rows[dt: DType](p: Params):
    var k_cache = param_ptr[dt](p, 0)
    var v_cache = param_ptr[dt](p, 1)
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
            kd.unsafe_offset(d).unsafe_store(ks.unsafe_offset(d).unsafe_load[width=W8]())
            vd.unsafe_offset(d).unsafe_store(vs.unsafe_offset(d).unsafe_load[width=W8]())
            d += W8


def write_kv(args: PythonObject) raises -> PythonObject:
    """Scatters the step's K and V rows. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    var int8_cache = param_int(p, 10) != 0
    if param_int(p, 9) == DTYPE_BF16:
        if int8_cache:
            _quantize_rows[BF16](p)
        else:
            _copy_rows[BF16](p)
    else:
        if int8_cache:
            _quantize_rows[F32](p)
        else:
            _copy_rows[F32](p)
    return PythonObject(None)
