# What the CPU paged-attention paths over head_dim 64 and 128 share (attention_chunks.mojo: one query row at a
# time; attention_prompt.mojo and attention_prompt_bf16.mojo: a work item's prompt rows together over an int8 or a
# bfloat16 cache): their constants, a chunk's key offsets, the software prefetch, the scores over a bfloat16 cache,
# and the online softmax and V pass that fold one chunk of keys into a row's accumulators. Every path runs these
# same steps on the same scores, so a row gets the same bits on any.

from std.math import exp, round
from std.memory import bitcast
from std.sys import CompilationTarget, llvm_intrinsic, size_of
from std.sys.intrinsics import prefetch, PrefetchOptions
from kv_int8 import I8, SCALE_BYTES, scale_at, scale_offset, value_offset
from lane_tree import bitrev4, lane_sums
from numerics import HAS_AVX512

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime KEYS = 16  # keys scored together: one float32 vector of scores per query head
comptime CHUNK = 256  # keys per two-pass chunk: a multiple of KEYS
comptime MAX_GROUP = 4  # query heads per pass (2 at head_dim 128: their accumulators fill 16 zmm)
comptime ACC_VALUES = 256  # float32 accumulators per pass over V, across the pass's heads: 16 zmm
# A query row's pass over V (attention_chunks.mojo) in AVX2's 16 ymm: 8 of them (the V slice and the weights take the
# rest; with 16, every key's update went through the stack). The slices change no bit (see add_values).
comptime ROW_ACC_VALUES = ACC_VALUES if HAS_AVX512 else 64
comptime F32x16 = SIMD[F32, KEYS]
comptime BF16x32 = SIMD[BF16, 32]
comptime I16x32 = SIMD[DType.int16, 32]
comptime I32x16 = SIMD[DType.int32, KEYS]
comptime HAS_BF16_DOT = CompilationTarget._has_feature["avx512bf16"]()
comptime HAS_I16_DOT = CompilationTarget.has_vnni()
comptime I16_MAX = Float32(32767)
comptime I16 = DType.int16
comptime I32 = DType.int32
comptime NEG = Float32(-3.0e38)
comptime AHEAD = 4  # groups of keys whose K rows are prefetched ahead of the one being scored
# Keys ahead whose V slice a pass over V prefetches (AVX2; add_values). AMD Zen 3, Qwen3-0.6B's heads over a float16
# cache: 0.82-0.94x the attention time of 32 decode rows whose context is out of cache, the same at one row (16
# ahead: no better). The V rows' prefetch during the scores pass alone left a third of the time on the V loads.
comptime V_AHEAD = 8
# A KV head's K and V rows up to this size are still in cache (L2, else L3) when a prompt's next query row reads them
# again: only a work item's first row prefetches them. At 2048 tokens (1 MiB a head) prefetching every row cost 10%.
comptime REREAD_BYTES = 4096 * 1024


@always_inline
def heads_per_pass[HD: Int]() -> Int:
    """Query heads that go through the context together (their V accumulators fill 16 zmm)."""
    return MAX_GROUP if HD <= 64 else 2


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
def scores_bf16[HD: Int](q: Pointer[Scalar[BF16], MutAnyOrigin], k_cache: Pointer[Scalar[BF16], MutAnyOrigin],
                         offs: Pointer[Scalar[DType.int64], MutAnyOrigin], scale: Float32) -> F32x16:
    """The scaled scores of one bfloat16 query head (q[:HD]) against the 16 keys whose rows sit at offs[:16] in a
    bfloat16 cache (AVX-512 BF16): each key leaves a vector of partial sums of exact products, and the lane tree
    sums the 16 vectors into one vector of 16 scores, key j's in lane j."""
    var p = Array[F32x16, KEYS](fill=F32x16(0))
    comptime for j in range(KEYS):
        p[bitrev4(j)] = _partials_bf16[HD](q, k_cache.unsafe_offset(Int(offs[unsafe_offset=j])))
    return lane_sums(p) * scale


comptime F32x8 = SIMD[F32, 8]


@always_inline
def _hadd8(a: F32x8, b: F32x8) -> F32x8:
    """Adjacent pairs of a and b within each 128-bit half: (a0+a1, a2+a3, b0+b1, b2+b3, a4+a5, ..) (vhaddps)."""
    return a.shuffle[0, 2, 8, 10, 4, 6, 12, 14](b) + a.shuffle[1, 3, 9, 11, 5, 7, 13, 15](b)


@always_inline
def _tree_top(lo: F32x8, hi: F32x8) -> F32x8:
    """The last level of 8 vectors' lane sums: lane j of the result, v[j]'s sum, where lo = _hadd8 of the pair sums of
    v0..v3 (their 128-bit half sums: low halves, then high) and hi the same of v4..v7."""
    return lo.shuffle[0, 1, 2, 3, 8, 9, 10, 11](hi) + lo.shuffle[4, 5, 6, 7, 12, 13, 14, 15](hi)


@always_inline
def _key_scores_avx512[cdt: DType, HD: Int](q: SIMD[F32, HD], k_cache: Pointer[Scalar[cdt], MutAnyOrigin],
                                            offs: Pointer[Scalar[DType.int64], MutAnyOrigin],
                                            k_scales: F32x16) -> F32x16:
    """One head's 16 scores with AVX-512: each key leaves a vector of partial sums and the lane tree sums the 16
    (its 16 vectors and the query's 8 fill the 32 zmm)."""
    var p = Array[F32x16, KEYS](fill=F32x16(0))
    comptime for j in range(KEYS):
        var kf = k_cache.unsafe_offset(Int(offs[unsafe_offset=j])).unsafe_load[width=HD]().cast[F32]()
        var prod = (q * kf).reduce_add[KEYS]()
        comptime if cdt == I8:
            prod = prod * k_scales[j]
        p[bitrev4(j)] = prod
    return lane_sums(p)


@always_inline
def keys_per_pass(heads: Int) -> Int:
    """Keys whose 8-lane accumulators the AVX2 path holds for `heads` heads at once: at most 8 accumulators, so that
    they, the widened key slices and a query slice fit AVX2's 16 ymm."""
    return 4 if heads <= 2 else 2


@always_inline
def scores_f32[cdt: DType, HD: Int, G: Int, NG: Int](q: Array[SIMD[F32, HD], G],
                                                     k_cache: Pointer[Scalar[cdt], MutAnyOrigin],
                                                     offs: Pointer[Scalar[DType.int64], MutAnyOrigin],
                                                     k_scales: F32x16) -> Array[F32x16, G]:
    """The scores of the first NG float32 query heads (q[g], the attention scale applied) against the 16 keys whose
    rows sit at offs[:16]: per head, each key's float32 dot product times its row scale (k_scales: ones unless the
    cache is int8). With AVX-512, head by head (_key_scores_avx512). AVX2's 16 ymm hold neither a head's 16 partial
    vectors nor its query, so each key takes one 8-lane accumulator per head over the query's 8-value slices, a
    few keys at a time for all NG heads (each key slice loaded and widened once for every head, where head by head
    loaded it NG times: AMD Zen 3, Qwen3-0.6B's heads over a float16 cache, 0.88-0.93x the attention time of a
    decode row), and a fixed tree of pair sums reduces each 8 keys' accumulators: per key and head the same
    multiply-adds and sums in the same order whatever NG."""
    var out = Array[F32x16, G](fill=F32x16(0))
    comptime if HAS_AVX512:
        comptime for g in range(NG):
            out[g] = _key_scores_avx512[cdt, HD](q[g], k_cache, offs, k_scales)
    else:
        comptime KP = keys_per_pass(NG)
        var halves = Array[F32x8, NG * 2](fill=F32x8(0))  # head g's scores of keys 0-7 at 2g, of keys 8-15 at 2g + 1
        comptime for h in range(2):
            # pairs[g * 4 + p]: head g's pair sums of keys 8h + 2p and 8h + 2p + 1 (_hadd8), the tree's first level.
            var pairs = Array[F32x8, NG * 4](fill=F32x8(0))
            comptime for k0 in range(0, 8, KP):
                var acc = Array[F32x8, NG * KP](fill=F32x8(0))
                comptime for c in range(0, HD, 8):
                    comptime for j in range(KP):
                        var k = k_cache.unsafe_offset(Int(offs[unsafe_offset=8 * h + k0 + j]) + c).unsafe_load[
                            width=8]().cast[F32]()
                        comptime for g in range(NG):
                            acc[g * KP + j] = q[g].slice[8, offset=c]().fma(k, acc[g * KP + j])
                comptime for g in range(NG):
                    comptime for j in range(0, KP, 2):
                        pairs[g * 4 + (k0 + j) // 2] = _hadd8(acc[g * KP + j], acc[g * KP + j + 1])
            comptime for g in range(NG):
                halves[2 * g + h] = _tree_top(_hadd8(pairs[g * 4], pairs[g * 4 + 1]),
                                              _hadd8(pairs[g * 4 + 2], pairs[g * 4 + 3]))
        comptime for g in range(NG):
            out[g] = halves[2 * g].join(halves[2 * g + 1])
            comptime if cdt == I8:
                out[g] = out[g] * k_scales
    return out^


@always_inline
def _fill_run(dst: Pointer[Scalar[DType.int64], MutAnyOrigin], base: Int, step: Int, n: Int):
    """dst[u] = base + u * step for u < n, 8 at a time."""
    comptime STEPS = SIMD[DType.int64, 8](0, 1, 2, 3, 4, 5, 6, 7)
    var u = 0
    while u + 8 <= n:
        dst.unsafe_offset(u).unsafe_store(SIMD[DType.int64, 8](base + u * step) + STEPS * Int64(step))
        u += 8
    while u < n:
        dst[unsafe_offset=u] = Int64(base + u * step)
        u += 1


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
        _fill_run(offsets.unsafe_offset(t), value_offset[cdt](page, in_page, kvh, block_size, kv_heads, HD),
                  row_stride, run)
        comptime if cdt == I8:
            _fill_run(scale_offsets.unsafe_offset(t), scale_offset[cdt](page, in_page, kvh, block_size, kv_heads, HD),
                      kv_heads * SCALE_BYTES, run)
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
def add_values[cdt: DType, HD: Int, G: Int, S: Int, NG: Int, WIDENED: Bool = False](
        mut acc: Array[SIMD[F32, S], G * (HD // S)], j: Int, rows: Pointer[Scalar[cdt], MutAnyOrigin],
        offsets: Pointer[Scalar[DType.int64], MutAnyOrigin], weights: Pointer[Scalar[F32], MutAnyOrigin], nk: Int):
    """Slice j (values j*S .. j*S+S-1) of the first NG heads' accumulators plus the chunk's nk V rows, each times
    its weight in scratch (weights[g * CHUNK + t], an int8 row's scale included), in key order. NG is a constant
    and the slice's NG * S / 16 accumulators stay in registers for the whole walk. Key t's row is at offsets[t] in
    the cache, or, WIDENED, at t * HD in a chunk's rows already widened to float32 (rows: float32; offsets unread):
    the same multiply-adds in the same order on the same numbers, so the same bits."""
    comptime NS = HD // S
    comptime assert not WIDENED or cdt == F32, "widened rows are float32"
    var part = Array[SIMD[F32, S], NG](fill=SIMD[F32, S](0))
    comptime for g in range(NG):
        part[g] = acc[g * NS + j]
    for t in range(nk):
        var at: Int
        comptime if WIDENED:
            at = t * HD
        else:
            at = Int(offsets[unsafe_offset=t])
            comptime if not HAS_AVX512:  # measured on AVX2 only, where a slice is one cache line of a float16 row
                prefetch[PrefetchOptions().for_read().high_locality()](
                    rows.unsafe_offset(Int(offsets[unsafe_offset=min(t + V_AHEAD, nk - 1)]) + j * S))
        var v = rows.unsafe_offset(at + j * S).unsafe_load[width=S]().cast[F32]()
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
def weights_i16[G: Int](scores: Pointer[Scalar[F32], MutAnyOrigin], tops: Array[F32x16, G], ng: Int,
                        nk: Int) -> Array[Float32, G]:
    """The first ng heads' chunk weights (scores[g * CHUNK + t], t < nk; tops[g]: their lane-wise maxima) in 16-bit
    integers, in place at the start of each head's row (int16 t at byte 2t, written behind the floats still to be
    read): round-half-even of w * 32767 / max w, the entry after an odd nk zeroed (the V walk takes keys in pairs).
    Returns each head's factor back to floats, max w / 32767."""
    var n_groups = (nk + KEYS - 1) // KEYS
    var factors = Array[Float32, G](fill=Float32(0))
    comptime for g in range(G):
        if g < ng:
            var row = scores.unsafe_offset(g * CHUNK)
            var w_max = tops[g].reduce_max()
            var inv = I16_MAX / w_max if w_max > 0 else Float32(0)
            var w16 = Pointer[Scalar[I16], MutAnyOrigin](unsafe_from_address=Int(row))
            for gi in range(n_groups):
                var w = row.unsafe_offset(gi * KEYS).unsafe_load[width=KEYS]()
                w16.unsafe_offset(gi * KEYS).unsafe_store(round(w * inv).cast[I16]())
            if nk % 2 == 1:
                w16[unsafe_offset=nk] = 0
            factors[g] = w_max / I16_MAX
    return factors^


@always_inline
def _pairs_lo(a: I16x32, b: I16x32) -> I16x32:
    """(a[d], b[d]) for d in 0-3, 8-11, 16-19, 24-27 (vpunpcklwd: within each 128-bit lane)."""
    return a.shuffle[0, 32, 1, 33, 2, 34, 3, 35, 8, 40, 9, 41, 10, 42, 11, 43,
                     16, 48, 17, 49, 18, 50, 19, 51, 24, 56, 25, 57, 26, 58, 27, 59](b)


@always_inline
def _pairs_hi(a: I16x32, b: I16x32) -> I16x32:
    """(a[d], b[d]) for d in 4-7, 12-15, 20-23, 28-31 (vpunpckhwd)."""
    return a.shuffle[4, 36, 5, 37, 6, 38, 7, 39, 12, 44, 13, 45, 14, 46, 15, 47,
                     20, 52, 21, 53, 22, 54, 23, 55, 28, 60, 29, 61, 30, 62, 31, 63](b)


@always_inline
def add_values_i16[HD: Int, G: Int, NG: Int](mut acc: Array[SIMD[F32, HD], G],
                                            v_cache: Pointer[Scalar[I8], MutAnyOrigin],
                                            offsets: Pointer[Scalar[DType.int64], MutAnyOrigin],
                                            weights: Pointer[Scalar[F32], MutAnyOrigin], factors: Array[Float32, G],
                                            nk: Int):
    """The first NG heads' accumulators plus the chunk's nk int8 V rows, each times its 16-bit weight (weights_i16's,
    the V row's scale inside), as exact integer sums: two keys at a time, a lane per value holding the pair
    (v_t, v_t+1) against the broadcast pair (w_t, w_t+1) in one vpdpwssd (|sum| <= 256 x 32767 x 127 < 2^31).
    The pairs come from in-lane unpacks, so each 32 values' sums sit in two vectors in the unpacks' order until
    the end of the chunk; each head's sums then enter its float accumulator once, times its factor."""
    comptime P = HD // 32  # 32-value blocks of a row: two int32 vectors of sums each
    var sums = Array[I32x16, NG * 2 * P](fill=I32x16(0))
    var t = 0
    while t < nk:  # an odd nk's partner row is a padded offset's, with weight 0
        var a = v_cache.unsafe_offset(Int(offsets[unsafe_offset=t])).unsafe_load[width=HD]().cast[I16]()
        var b = v_cache.unsafe_offset(Int(offsets[unsafe_offset=t + 1])).unsafe_load[width=HD]().cast[I16]()
        var pairs = Array[I16x32, 2 * P](fill=I16x32(0))
        comptime for c in range(P):
            var a_c = a.slice[32, offset=32 * c]()
            var b_c = b.slice[32, offset=32 * c]()
            pairs[2 * c] = _pairs_lo(a_c, b_c)
            pairs[2 * c + 1] = _pairs_hi(a_c, b_c)
        comptime for g in range(NG):
            var w16 = Pointer[Scalar[I32], MutAnyOrigin](unsafe_from_address=Int(weights.unsafe_offset(g * CHUNK)))
            var w = bitcast[I16, 32](I32x16(w16[unsafe_offset=t // 2]))  # (w_t, w_t+1) in every lane
            comptime for c in range(2 * P):
                sums[g * 2 * P + c] = llvm_intrinsic["llvm.x86.avx512.vpdpwssd.512", I32x16](
                    sums[g * 2 * P + c], pairs[c], w)
        t += 2
    comptime for g in range(NG):
        var total = SIMD[F32, HD](0)
        comptime for c in range(P):
            var lo = sums[g * 2 * P + 2 * c]
            var hi = sums[g * 2 * P + 2 * c + 1]
            var first = lo.shuffle[0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23](hi)  # values 0-15
            var second = lo.shuffle[8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31](hi)  # 16-31
            total = total.insert[offset=32 * c](first.cast[F32]())
            total = total.insert[offset=32 * c + 16](second.cast[F32]())
        acc[g] += total * factors[g]


@always_inline
def chunk_weights[cdt: DType, HD: Int, G: Int, S: Int, INT_V: Bool](
        mut acc: Array[SIMD[F32, S], G * (HD // S)], mut m: Array[Float32, G], mut l: Array[Float32, G],
        maxes: Array[F32x16, G], scores: Pointer[Scalar[F32], MutAnyOrigin], ng: Int, nk: Int,
        v_cache: Pointer[Scalar[cdt], MutAnyOrigin],
        scale_offsets: Pointer[Scalar[DType.int64], MutAnyOrigin]) -> Array[F32x16, G]:
    """The first half of fold_chunk: the chunk's scores in scratch become their weights in place, its maximum
    (maxes, lane-wise) folds into the running one (m), and the running sum (l) and accumulators are rescaled to it.
    Returns the weights' lane-wise maxima (INT_V's scale)."""
    comptime NS = HD // S
    var n_groups = (nk + KEYS - 1) // KEYS
    var new_m = Array[Float32, G](fill=NEG)
    var totals = Array[F32x16, G](fill=F32x16(0))
    var tops = Array[F32x16, G](fill=F32x16(0))
    comptime for g in range(G):
        if g < ng:
            new_m[g] = max(m[g], maxes[g].reduce_max())
    for gi in range(n_groups):
        var v_scales = row_scales[cdt](v_cache, scale_offsets.unsafe_offset(gi * KEYS))
        comptime for g in range(G):
            if g < ng:
                var at = scores.unsafe_offset(g * CHUNK + gi * KEYS)
                var e = exp(at.unsafe_load[width=KEYS]() - new_m[g])
                # Lanes past the context: about 4e-39 (exp's floor), not 0, never a maximum; V stops before them.
                totals[g] += e
                comptime if cdt == I8:
                    e = e * v_scales
                comptime if INT_V:
                    tops[g] = max(tops[g], e)
                at.unsafe_store(e)
    comptime for g in range(G):
        if g < ng:
            var corr = exp(m[g] - new_m[g])
            l[g] = l[g] * corr + totals[g].reduce_add()
            comptime for j in range(NS):
                acc[g * NS + j] = acc[g * NS + j] * corr
            m[g] = new_m[g]
    return tops^


@always_inline
def fold_chunk[cdt: DType, HD: Int, G: Int, S: Int, INT_V: Bool](
        mut acc: Array[SIMD[F32, S], G * (HD // S)], mut m: Array[Float32, G], mut l: Array[Float32, G],
        maxes: Array[F32x16, G], scores: Pointer[Scalar[F32], MutAnyOrigin], ng: Int, nk: Int,
        v_cache: Pointer[Scalar[cdt], MutAnyOrigin], offsets: Pointer[Scalar[DType.int64], MutAnyOrigin],
        scale_offsets: Pointer[Scalar[DType.int64], MutAnyOrigin]):
    """One chunk of nk keys into the first ng heads' running softmax (m, l) and accumulators (acc, NS slices of S
    values a head): the chunk's scores in scratch (scores[g * CHUNK + t], masked lanes -3e38) become their
    weights, its maximum (maxes, lane-wise) folds into the running one, and its V rows are added, one slice of S
    values at a time, into every head's accumulator slice. Over an int8 cache each weight is stored times its V
    row's scale (16 keys' scales read once for every head), so the V walk is one multiply-add per value; with
    INT_V (an int8 cache, bfloat16 queries, a CPU with AVX512-VNNI) the walk is add_values_i16's integer sums
    instead, over the weights in 16 bits: half the instructions of the float walk, and a relative error per
    weight under 2^-16 of the chunk's largest."""
    comptime NS = HD // S
    var tops = chunk_weights[cdt, HD, G, S, INT_V](acc, m, l, maxes, scores, ng, nk, v_cache, scale_offsets)
    comptime if INT_V:
        comptime assert cdt == I8 and S == HD, "integer V sums take an int8 cache, one slice a head"
        var factors = weights_i16[G](scores, tops, ng, nk)
        comptime for n in range(1, G + 1):
            if ng == n:
                add_values_i16[HD, G, n](rebind[Array[SIMD[F32, HD], G]](acc),
                                         rebind[Pointer[Scalar[I8], MutAnyOrigin]](v_cache), offsets, scores,
                                         factors, nk)
    else:
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
