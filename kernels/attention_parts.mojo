# What the two CPU paged-attention paths over head_dim 64 and 128 share (attention_chunks.mojo: one query row at a
# time; attention_prompt.mojo: a work item's prompt rows together over an int8 cache): their constants, a chunk's
# key offsets, the software prefetch, and the online softmax and V pass that fold one chunk of keys into a row's
# accumulators. Both paths run these same steps on the same scores, so a row gets the same bits on either.

from std.math import exp, round
from std.sys import CompilationTarget, size_of
from std.sys.intrinsics import prefetch, PrefetchOptions
from kv_int8 import I8, scale_at, scale_offset, value_offset

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime KEYS = 16  # keys scored together: one float32 vector of scores per query head
comptime CHUNK = 256  # keys per two-pass chunk: a multiple of KEYS
comptime MAX_GROUP = 4  # query heads per pass (2 at head_dim 128: their accumulators fill 16 zmm)
comptime ACC_VALUES = 256  # float32 accumulators per pass over V, across the pass's heads: 16 zmm
comptime F32x16 = SIMD[F32, KEYS]
comptime BF16x32 = SIMD[BF16, 32]
comptime I16x32 = SIMD[DType.int16, 32]
comptime I32x16 = SIMD[DType.int32, KEYS]
comptime HAS_BF16_DOT = CompilationTarget._has_feature["avx512bf16"]()
comptime HAS_I16_DOT = CompilationTarget.has_vnni()
comptime I16_MAX = Float32(32767)
comptime NEG = Float32(-3.0e38)
comptime AHEAD = 4  # groups of keys whose K rows are prefetched ahead of the one being scored
# A KV head's K and V rows up to this size are still in cache (L2, else L3) when a prompt's next query row reads them
# again: only a work item's first row prefetches them. At 2048 tokens (1 MiB a head) prefetching every row cost 10%.
comptime REREAD_BYTES = 4096 * 1024


@always_inline
def heads_per_pass[HD: Int]() -> Int:
    """Query heads that go through the context together (their V accumulators fill 16 zmm)."""
    return MAX_GROUP if HD <= 64 else 2


@always_inline
def chunk_offsets[cdt: DType, HD: Int](offsets: Pointer[Scalar[DType.int64], MutAnyOrigin],
                                       scale_offsets: Pointer[Scalar[DType.int64], MutAnyOrigin],
                                       table: Pointer[Scalar[DType.int32], MutAnyOrigin], c0: Int, nk: Int, kvh: Int,
                                       block_size: Int, kv_heads: Int):
    """Each of the chunk's nk keys (positions c0 ..) its values offset in the cache and an int8 row's scale offset
    (K and V share the layout, kernels/kv_int8.mojo). The last group's keys past the chunk read key 0's row
    instead: every group then scores 16 keys with no per-key branch, and lanes past the chunk are masked (a
    lane's score depends on its own key only)."""
    var row_stride = kv_heads * HD  # between a page's consecutive tokens' values
    var t = 0
    while t < nk:
        var pos = c0 + t
        var page = Int(table[unsafe_offset=pos // block_size])
        var in_page = pos % block_size
        var run = min(block_size - in_page, nk - t)
        var base = value_offset[cdt](page, in_page, kvh, block_size, kv_heads, HD)
        for u in range(run):
            offsets[unsafe_offset=t + u] = Int64(base + u * row_stride)
        comptime if cdt == I8:
            var scale_base = scale_offset[cdt](page, in_page, kvh, block_size, kv_heads, HD)
            for u in range(run):
                scale_offsets[unsafe_offset=t + u] = Int64(scale_base + u * kv_heads * 4)
        t += run
    for u in range(nk, (nk + KEYS - 1) // KEYS * KEYS):
        offsets[unsafe_offset=u] = offsets[unsafe_offset=0]
        scale_offsets[unsafe_offset=u] = scale_offsets[unsafe_offset=0]


@always_inline
def prefetch_rows[cdt: DType, HD: Int](cache: Pointer[Scalar[cdt], MutAnyOrigin],
                                       offsets: Pointer[Scalar[DType.int64], MutAnyOrigin],
                                       scale_offsets: Pointer[Scalar[DType.int64], MutAnyOrigin], n: Int):
    """Software prefetch (into L2) of the n cache rows' values at offsets[:n], one request per 64-byte line, and
    of an int8 cache's row scales at scale_offsets[:n]."""
    comptime per_line = 64 // size_of[cdt]()
    for t in range(n):
        var row = cache.unsafe_offset(Int(offsets[unsafe_offset=t]))
        comptime for e in range(0, HD, per_line):
            prefetch[PrefetchOptions().for_read().medium_locality()](row.unsafe_offset(e))
        comptime if cdt == I8:
            prefetch[PrefetchOptions().for_read().medium_locality()](
                cache.unsafe_offset(Int(scale_offsets[unsafe_offset=t])))


@always_inline
def add_values[cdt: DType, HD: Int, G: Int, S: Int, NG: Int](
        mut acc: Array[SIMD[F32, S], G * (HD // S)], j: Int, v_cache: Pointer[Scalar[cdt], MutAnyOrigin],
        offsets: Pointer[Scalar[DType.int64], MutAnyOrigin], weights: Pointer[Scalar[F32], MutAnyOrigin], nk: Int):
    """Slice j (values j*S .. j*S+S-1) of the first NG heads' accumulators plus the chunk's nk V rows, each times
    its weight in scratch (weights[g * CHUNK + t], an int8 row's scale included), in key order. NG is a constant
    and the slice's NG * S / 16 accumulators stay in registers for the whole walk."""
    comptime NS = HD // S
    var part = Array[SIMD[F32, S], NG](fill=SIMD[F32, S](0))
    comptime for g in range(NG):
        part[g] = acc[g * NS + j]
    for t in range(nk):
        var v = v_cache.unsafe_offset(Int(offsets[unsafe_offset=t]) + j * S).unsafe_load[width=S]().cast[F32]()
        comptime for g in range(NG):
            part[g] += v * weights[unsafe_offset=g * CHUNK + t]
    comptime for g in range(NG):
        acc[g * NS + j] = part[g]


@always_inline
def row_scales[cdt: DType](cache: Pointer[Scalar[cdt], MutAnyOrigin],
                           scale_offsets: Pointer[Scalar[DType.int64], MutAnyOrigin]) -> F32x16:
    """The row scales of 16 keys at scale_offsets[:16] (chunk_offsets pads a chunk's last group with key 0's, so
    all 16 are readable); ones for a cache that is not int8."""
    var scales = F32x16(1)
    comptime if cdt == I8:
        comptime for j in range(KEYS):
            scales[j] = scale_at[cdt](cache, Int(scale_offsets[unsafe_offset=j]))
    return scales


@always_inline
def fold_chunk[cdt: DType, HD: Int, G: Int, S: Int](
        mut acc: Array[SIMD[F32, S], G * (HD // S)], mut m: Array[Float32, G], mut l: Array[Float32, G],
        maxes: Array[F32x16, G], scores: Pointer[Scalar[F32], MutAnyOrigin], ng: Int, nk: Int,
        v_cache: Pointer[Scalar[cdt], MutAnyOrigin], offsets: Pointer[Scalar[DType.int64], MutAnyOrigin],
        scale_offsets: Pointer[Scalar[DType.int64], MutAnyOrigin]):
    """One chunk of nk keys into the first ng heads' running softmax (m, l) and accumulators (acc, NS slices of S
    values a head): the chunk's scores in scratch (scores[g * CHUNK + t], masked lanes -3e38) become their
    weights, its maximum (maxes, lane-wise) folds into the running one, and its V rows are added, one slice of S
    values at a time, into every head's accumulator slice. Over an int8 cache each weight is stored times its V
    row's scale (16 keys' scales read once for every head), so the V walk is one multiply-add per value."""
    comptime NS = HD // S
    var n_groups = (nk + KEYS - 1) // KEYS
    var new_m = Array[Float32, G](fill=NEG)
    var totals = Array[F32x16, G](fill=F32x16(0))
    comptime for g in range(G):
        if g < ng:
            new_m[g] = max(m[g], maxes[g].reduce_max())
    for gi in range(n_groups):
        var v_scales = row_scales[cdt](v_cache, scale_offsets.unsafe_offset(gi * KEYS))
        comptime for g in range(G):
            if g < ng:
                var at = scores.unsafe_offset(g * CHUNK + gi * KEYS)
                var e = exp(at.unsafe_load[width=KEYS]() - new_m[g])
                totals[g] += e  # lanes past the context: about 4e-39 (exp's floor), not 0; V stops before them
                comptime if cdt == I8:
                    e = e * v_scales
                at.unsafe_store(e)
    comptime for g in range(G):
        if g < ng:
            var corr = exp(m[g] - new_m[g])
            l[g] = l[g] * corr + totals[g].reduce_add()
            comptime for j in range(NS):
                acc[g * NS + j] = acc[g * NS + j] * corr
            m[g] = new_m[g]
    comptime for n in range(1, G + 1):  # the head count as a constant: no branch in the key loop
        if ng == n:
            comptime for j in range(NS):
                add_values[cdt, HD, G, S, n](acc, j, v_cache, offsets, scores, nk)


@always_inline
def int8_scores(sums: I32x16, key_scales: F32x16, q_scale: Float32) -> F32x16:
    """16 keys' scores over an int8 cache from their exact integer dot products with a query_i16 query: both paths
    compute them by this one expression, so a row gets the same bits on either."""
    return sums.cast[F32]() * key_scales * q_scale


@always_inline
def masked(s: F32x16, n: Int, lane: F32x16) -> F32x16:
    """s with its lanes from n on (keys past the chunk or the row's context) at -3e38 (lane: 0, 1, .. 15)."""
    return lane.lt(F32x16(Float32(n))).select(s, F32x16(NEG))


@always_inline
def query_i16[HD: Int](q: SIMD[F32, HD], scale: Float32) -> Tuple[SIMD[DType.int16, HD], Float32]:
    """A query head in 16-bit integers (round-half-even of q * 32767 / max|q|) and the factor that restores it,
    times the attention scale: what scores against an int8 cache's keys as exact integer dot products."""
    var qmax = abs(q).reduce_max()
    var qi = round(q * (I16_MAX / qmax if qmax > 0 else Float32(0))).cast[DType.int16]()
    return (qi, qmax / I16_MAX * scale)
