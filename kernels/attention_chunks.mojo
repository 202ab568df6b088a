# Paged attention for a head_dim known at compile time (64, 128): what kernels/attention.mojo runs for them.
#
# Per work item (sequence, KV head, query rows) and query row, the query heads that share the KV head go
# through the context together (up to 4 at a time, 2 at head_dim 128), in chunks of CHUNK keys, each in two
# passes:
#   1. scores: 16 keys at a time, every key leaves a 16-lane vector of partial sums of its dot product, and a
#      tree of shuffles (four levels, three operations per pair of vectors) sums the 16 vectors lane-wise, so
#      the group's 16 scores land in one vector with no per-key reduction. Where the CPU has AVX-512 BF16 and
#      the queries are bfloat16, the partial sums are vdpbf16ps products (exact in float32) of the query and
#      key rows as stored; an int8 cache's group of keys is widened to bfloat16 once (its integers are exact
#      there) for every head, and the row scales multiply the scores. Otherwise they are float32 products.
#   2. the chunk's softmax weights (its maximum folded into the running one, as an online softmax does
#      between chunks), then V: each row widened to float32 once and added into every head's accumulator,
#      weighted by its score read back from scratch (a broadcast load).
# Scores and key offsets of a chunk live in the calling thread's scratch. Nothing depends on which other items
# are in the call or on the thread: a row gets the same bits in any batch.

from std.math import exp
from std.memory import bitcast
from std.sys import CompilationTarget, llvm_intrinsic, size_of
from std.sys.intrinsics import prefetch, PrefetchOptions
from numerics import narrow
from params import Params, param_int, param_ptr, param_float
from kv_int8 import I8, row_scale, row_width

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime KEYS = 16  # keys scored together: one float32 vector of scores per query head
comptime CHUNK = 256  # keys per two-pass chunk: a multiple of KEYS
comptime GROUPS = CHUNK // KEYS
comptime MAX_GROUP = 4  # query heads per pass (2 at head_dim 128: their accumulators fill 16 zmm)
comptime F32x16 = SIMD[F32, KEYS]
comptime BF16x32 = SIMD[BF16, 32]
comptime HAS_BF16_DOT = CompilationTarget._has_feature["avx512bf16"]()
comptime NEG = Float32(-3.0e38)
comptime AHEAD = 4  # groups of keys whose K rows are prefetched ahead of the one being scored


def chunk_scratch_floats(head_dim: Int) -> Int:
    """Float32 scratch per thread: scores [MAX_GROUP, CHUNK], key offsets [CHUNK] int64, a group of keys widened
    to bfloat16 [KEYS, head_dim] and their scales [KEYS]."""
    return MAX_GROUP * CHUNK + 2 * CHUNK + KEYS * head_dim // 2 + KEYS


@always_inline
def _bitrev4(j: Int) -> Int:
    """The 4-bit reversal of j: the tree leaves slot j's sum in lane bitrev4(j)."""
    return ((j & 1) << 3) | ((j & 2) << 1) | ((j & 4) >> 1) | ((j & 8) >> 3)


@always_inline
def _pair_sum[level: Int](a: F32x16, b: F32x16) -> F32x16:
    """One level of the tree: halves the lanes that hold each slot's partial sums, interleaving a's and b's."""
    comptime if level == 1:
        return a.shuffle[0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23](b) + \
            a.shuffle[8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31](b)
    elif level == 2:
        return a.shuffle[0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27](b) + \
            a.shuffle[4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31](b)
    elif level == 3:
        return a.shuffle[0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29](b) + \
            a.shuffle[2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31](b)
    else:
        return a.shuffle[0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30](b) + \
            a.shuffle[1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31](b)


@always_inline
def _lane_sums(p: Array[F32x16, KEYS]) -> F32x16:
    """Lane i of the result: the sum of the lanes of p[bitrev4(i)] (so key j's partials go in slot bitrev4(j))."""
    var t = Array[F32x16, 8](fill=F32x16(0))
    comptime for i in range(8):
        t[i] = _pair_sum[1](p[2 * i], p[2 * i + 1])
    var u = Array[F32x16, 4](fill=F32x16(0))
    comptime for i in range(4):
        u[i] = _pair_sum[2](t[2 * i], t[2 * i + 1])
    return _pair_sum[4](_pair_sum[3](u[0], u[1]), _pair_sum[3](u[2], u[3]))


@always_inline
def _dot_bf16(acc: F32x16, a: BF16x32, b: BF16x32) -> F32x16:
    """acc + per lane i: a[2i] b[2i] + a[2i+1] b[2i+1], the products exact (vdpbf16ps)."""
    return llvm_intrinsic["llvm.x86.avx512bf16.dpbf16ps.512", F32x16](acc, a, b)


@always_inline
def _partials_bf16[HD: Int](q: Pointer[Scalar[BF16], MutAnyOrigin], k: Pointer[Scalar[BF16], MutAnyOrigin]) -> F32x16:
    """16 partial sums of the bfloat16 rows q[:HD] . k[:HD]."""
    var acc = F32x16(0)
    comptime for c in range(0, HD, 32):
        acc = _dot_bf16(acc, q.unsafe_offset(c).unsafe_load[width=32](), k.unsafe_offset(c).unsafe_load[width=32]())
    return acc


@always_inline
def _prefetch_rows[cdt: DType, RW: Int](cache: Pointer[Scalar[cdt], MutAnyOrigin],
                                        offsets: Pointer[Scalar[DType.int64], MutAnyOrigin], n: Int):
    """Software prefetch (into L2) of the n cache rows at offsets[:n], one request per 64-byte line."""
    comptime per_line = 64 // size_of[cdt]()
    for t in range(n):
        var row = cache.unsafe_offset(Int(offsets[unsafe_offset=t]))
        comptime for e in range(0, RW, per_line):
            prefetch[PrefetchOptions().for_read().medium_locality()](row.unsafe_offset(e))


def attend_chunks[dt: DType, cdt: DType, HD: Int](args: Params, begin: Int, end: Int):
    """Work items [begin, end) of kernels/attention.mojo's paged_attention (same parameters) for head_dim HD."""
    comptime RW = row_width[cdt](HD)
    comptime G = MAX_GROUP if HD <= 64 else 2
    comptime BF16_DOT = HAS_BF16_DOT and dt == BF16 and (cdt == BF16 or cdt == I8)
    var out = param_ptr[dt](args, 0)
    var query = param_ptr[dt](args, 1)
    var k_cache = param_ptr[cdt](args, 2)
    var v_cache = param_ptr[cdt](args, 3)
    var block_tables = param_ptr[DType.int32](args, 4)
    var context_lens = param_ptr[DType.int32](args, 5)
    var query_start = param_ptr[DType.int32](args, 6)
    var items = param_ptr[DType.int32](args, 7)
    var num_heads = param_int(args, 9)
    var kv_heads = param_int(args, 10)
    var block_size = param_int(args, 12)
    var max_blocks = param_int(args, 13)
    var q_stride = param_int(args, 14)
    var out_stride = param_int(args, 15)
    var scale = param_float(args, 16)
    var scratch_width = param_int(args, 20)
    # This thread's scratch: the first item's (the items of one range run on one thread, one after another).
    var scores = param_ptr[F32](args, 17).unsafe_offset(begin * scratch_width)
    var offsets = Pointer[Scalar[DType.int64], MutAnyOrigin](unsafe_from_address=Int(scores.unsafe_offset(MAX_GROUP * CHUNK)))
    var wide_keys = Pointer[Scalar[BF16], MutAnyOrigin](
        unsafe_from_address=Int(scores.unsafe_offset(MAX_GROUP * CHUNK + 2 * CHUNK)))
    var key_scales = scores.unsafe_offset(MAX_GROUP * CHUNK + 2 * CHUNK + KEYS * HD // 2)
    var group = num_heads // kv_heads
    var row_stride = kv_heads * RW
    var lane = F32x16(0)
    comptime for j in range(KEYS):
        lane[j] = Float32(j)

    for i in range(begin, end):
        var seq = Int(items[unsafe_offset=4 * i])
        var kvh = Int(items[unsafe_offset=4 * i + 1])
        var ctx = Int(context_lens[unsafe_offset=seq])
        var q0_token = Int(query_start[unsafe_offset=seq])
        var q_len = Int(query_start[unsafe_offset=seq + 1]) - q0_token
        var table = block_tables.unsafe_offset(seq * max_blocks)
        for r in range(Int(items[unsafe_offset=4 * i + 2]), Int(items[unsafe_offset=4 * i + 3])):
            var token = q0_token + r
            var visible = ctx - q_len + r + 1  # causal: keys up to this token's own position
            var g0 = 0
            while g0 < group:
                var ng = min(G, group - g0)
                var qp = query.unsafe_offset(token * q_stride + (kvh * group + g0) * HD)
                var qf = Array[SIMD[F32, HD], G](fill=SIMD[F32, HD](0))  # scaled float32 queries
                comptime if not BF16_DOT:
                    comptime for g in range(G):
                        if g < ng:
                            qf[g] = qp.unsafe_offset(g * HD).unsafe_load[width=HD]().cast[F32]() * scale
                var acc = Array[SIMD[F32, HD], G](fill=SIMD[F32, HD](0))
                var m = Array[Float32, G](fill=NEG)
                var l = Array[Float32, G](fill=Float32(0))
                var c0 = 0
                while c0 < visible:
                    var nk = min(CHUNK, visible - c0)
                    var n_groups = (nk + KEYS - 1) // KEYS
                    # Each key's row offset in the cache (K and V share the layout).
                    var t = 0
                    while t < nk:
                        var pos = c0 + t
                        var page = Int(table[unsafe_offset=pos // block_size])
                        var in_page = pos % block_size
                        var run = min(block_size - in_page, nk - t)
                        var base = (page * block_size + in_page) * row_stride + kvh * RW
                        for u in range(run):
                            offsets[unsafe_offset=t + u] = Int64(base + u * row_stride)
                        t += run
                    _prefetch_rows[cdt, RW](k_cache, offsets, min(nk, AHEAD * KEYS))
                    # Pass 1: the chunk's scores, each head's running maximum in a vector.
                    var maxes = Array[F32x16, G](fill=F32x16(NEG))
                    for gi in range(n_groups):
                        var j0 = gi * KEYS
                        var n = min(KEYS, nk - j0)
                        var offs = offsets.unsafe_offset(j0)
                        if j0 + AHEAD * KEYS < nk:
                            _prefetch_rows[cdt, RW](k_cache, offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                                    min(KEYS, nk - j0 - AHEAD * KEYS))
                        _prefetch_rows[cdt, RW](v_cache, offs, n)  # for pass 2
                        var row_scales = F32x16(1)
                        comptime if BF16_DOT and cdt == I8:
                            for j in range(KEYS):
                                if j < n:
                                    var row = k_cache.unsafe_offset(Int(offs[unsafe_offset=j]))
                                    var f = row.unsafe_load[width=HD]().cast[F32]()
                                    wide_keys.unsafe_offset(j * HD).unsafe_store(
                                        bitcast[BF16, HD]((bitcast[DType.uint32, HD](f) >> 16).cast[DType.uint16]()))
                                    key_scales[unsafe_offset=j] = row_scale[cdt](row, HD)
                                else:
                                    key_scales[unsafe_offset=j] = Float32(1)
                            row_scales = key_scales.unsafe_load[width=KEYS]()
                        comptime for g in range(G):
                            if g < ng:
                                var p = Array[F32x16, KEYS](fill=F32x16(0))
                                comptime for j in range(KEYS):
                                    if j < n:
                                        var k_row = k_cache.unsafe_offset(Int(offs[unsafe_offset=j]))
                                        comptime if BF16_DOT:
                                            var q_row = rebind[Pointer[Scalar[BF16], MutAnyOrigin]](
                                                qp.unsafe_offset(g * HD))
                                            comptime if cdt == I8:
                                                p[_bitrev4(j)] = _partials_bf16[HD](q_row, wide_keys.unsafe_offset(j * HD))
                                            else:
                                                p[_bitrev4(j)] = _partials_bf16[HD](
                                                    q_row, rebind[Pointer[Scalar[BF16], MutAnyOrigin]](k_row))
                                        else:
                                            var prod = (qf[g] * k_row.unsafe_load[width=HD]().cast[F32]()).reduce_add[KEYS]()
                                            comptime if cdt == I8:
                                                prod = prod * row_scale[cdt](k_row, HD)
                                            p[_bitrev4(j)] = prod
                                var s = _lane_sums(p)
                                comptime if BF16_DOT:
                                    s = s * row_scales * scale
                                s = lane.lt(F32x16(Float32(n))).select(s, F32x16(NEG))
                                maxes[g] = max(maxes[g], s)
                                scores.unsafe_offset(g * CHUNK + j0).unsafe_store(s)
                    # The chunk's weights, folded into the running softmax.
                    comptime for g in range(G):
                        if g < ng:
                            var new_m = max(m[g], maxes[g].reduce_max())
                            var corr = exp(m[g] - new_m)
                            var total = F32x16(0)
                            var sg = scores.unsafe_offset(g * CHUNK)
                            for gi in range(n_groups):
                                var e = exp(sg.unsafe_offset(gi * KEYS).unsafe_load[width=KEYS]() - new_m)
                                sg.unsafe_offset(gi * KEYS).unsafe_store(e)
                                total += e  # lanes past the context: exp(-3e38 - m) = 0
                            l[g] = l[g] * corr + total.reduce_add()
                            acc[g] = acc[g] * corr
                            m[g] = new_m
                    # Pass 2: V rows, each widened once and added into every head's accumulator.
                    for t2 in range(nk):
                        var v_row = v_cache.unsafe_offset(Int(offsets[unsafe_offset=t2]))
                        var v = v_row.unsafe_load[width=HD]().cast[F32]()
                        var vs = row_scale[cdt](v_row, HD)
                        comptime for g in range(G):
                            if g < ng:
                                var w = scores[unsafe_offset=g * CHUNK + t2]
                                comptime if cdt == I8:
                                    w = w * vs
                                acc[g] += v * w
                    c0 += CHUNK
                var op = out.unsafe_offset(token * out_stride + (kvh * group + g0) * HD)
                comptime for g in range(G):
                    if g < ng:
                        op.unsafe_offset(g * HD).unsafe_store(narrow[dt, HD](acc[g] / l[g]))
                g0 += G
