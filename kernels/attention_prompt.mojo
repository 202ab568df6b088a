# Paged attention for a work item's prompt rows together, over an int8 cache with bfloat16 queries (head_dim 64
# and 128): what attention_chunks.mojo runs for an item of at least PROMPT_MIN_ROWS rows when the scratch has room.
#
# The row path scores each row against each chunk of keys on its own: every key's offsets and scales, its row
# sign-extended, and a lane tree per 16 keys (16 lanes of partial sums reduced to one score each) come again for
# every row. Here the item's rows (at most ROWS, kernels/attention.py's ROWS_PER_ITEM) go through the context
# together, chunk by chunk:
#   - the chunk's key offsets and K scales are found once for all its rows;
#   - scores have the rows in the lanes: each query head's 16-bit values are transposed once per item into
#     vectors of 16 rows' value pairs, so that a key's score for 16 rows is HD/2 vpdpwssd of those vectors with
#     the key's value pairs broadcast, with no tree; 16 keys' vectors are then transposed (lane_tree.transpose16)
#     into each row's 16 scores;
#   - each row then folds the chunk into its running softmax and V accumulators (attention_parts.fold_chunk,
#     which the row path runs too), its state kept in scratch between chunks.
# The scores are the same exact integers as the row path's and every float step after them is the same, so a row
# gets the same bits on either path: how a prompt is chunked or batched never changes its result.

from std.memory import bitcast
from std.sys import llvm_intrinsic
from numerics import narrow
from params import Params, param_int, param_ptr, param_float
from kv_int8 import I8
from lane_tree import transpose16
from attention_parts import F32, I32, KEYS, CHUNK, MAX_GROUP, ACC_VALUES, F32x16, I32x16, NEG, AHEAD, \
    heads_per_pass, chunk_offsets, prefetch_rows, fold_chunk, query_i16, int8_scores, masked, row_scales

comptime ROWS = 16  # query rows per item at most (kernels/attention.py's ROWS_PER_ITEM): one lane each
# Below this many rows the row path is faster: a score vector of 16 lanes serves only the item's rows.
comptime PROMPT_MIN_ROWS = 8
# Scratch (4-byte words) after the row path's: queries transposed [heads, HD/2, ROWS] int32 (value pairs), a key
# group's rows [KEYS, HD/2] int32, the chunk's scores [ROWS, MAX_GROUP, CHUNK] int32, its K scales [CHUNK], and per
# (row, head) the query's scale, the running maximum and sum, and the V accumulators [HD] float32.
comptime QT_WORDS = ACC_VALUES // 2 * ROWS  # heads_per_pass x HD is ACC_VALUES at head_dim 64 and 128
comptime KW_WORDS = KEYS * 64
comptime SC_WORDS = ROWS * MAX_GROUP * CHUNK
comptime STATE_WORDS = ROWS * MAX_GROUP * 3 + ROWS * ACC_VALUES
comptime PROMPT_SCRATCH_AT = MAX_GROUP * CHUNK + 4 * CHUNK  # after the row path's part of an item's scratch


@always_inline
def prompt_scratch_floats() -> Int:
    """Scratch words an item takes here, beyond the row path's (kernels/attention.py allots them, and its tests
    check its figure against this one)."""
    return QT_WORDS + KW_WORDS + SC_WORDS + CHUNK + STATE_WORDS


@always_inline
def _score_group[HD: Int, NG: Int](qt: Pointer[Scalar[I32], MutAnyOrigin], kw: Pointer[Scalar[I32], MutAnyOrigin],
                                   sc: Pointer[Scalar[I32], MutAnyOrigin], nr: Int, j0: Int):
    """For each of the first NG heads, the exact integer dot products of 16 keys (their value pairs at kw) with the
    item's rows (lanes of qt), stored per row: row r's 16 sums at sc[(r * MAX_GROUP + g) * CHUNK + j0]."""
    comptime P = HD // 2
    comptime for g in range(NG):
        var acc = Array[I32x16, KEYS](fill=I32x16(0))  # acc[j]: key j's sums, a lane per row
        for p in range(P):
            var qv = bitcast[DType.int16, 32](qt.unsafe_offset((g * P + p) * ROWS).unsafe_load[width=ROWS]())
            comptime for j in range(KEYS):
                var kv = bitcast[DType.int16, 32](I32x16(kw[unsafe_offset=j * P + p]))
                acc[j] = llvm_intrinsic["llvm.x86.avx512.vpdpwssd.512", I32x16](acc[j], qv, kv)
        transpose16(acc)  # acc[r]: row r's sums, a lane per key
        comptime for r in range(ROWS):
            if r < nr:
                sc.unsafe_offset((r * MAX_GROUP + g) * CHUNK + j0).unsafe_store(acc[r])


def attend_prompt_rows[dt: DType, HD: Int](args: Params, scratch: Pointer[Scalar[F32], MutAnyOrigin], seq: Int,
                                           kvh: Int, r_begin: Int, r_end: Int):
    """Rows r_begin .. r_end-1 (at most ROWS) of sequence seq for KV head kvh, kernels/attention.mojo's parameters;
    scratch: the item's, the row path's part first (attention_chunks.mojo) and then prompt_scratch_floats()."""
    comptime G = heads_per_pass[HD]()
    comptime S = min(HD, ACC_VALUES // G)
    comptime NS = HD // S
    comptime P = HD // 2
    var out = param_ptr[dt](args, 0)
    var query = param_ptr[dt](args, 1)
    var k_cache = param_ptr[I8](args, 2)
    var v_cache = param_ptr[I8](args, 3)
    var block_tables = param_ptr[DType.int32](args, 4)
    var context_lens = param_ptr[DType.int32](args, 5)
    var query_start = param_ptr[DType.int32](args, 6)
    var num_heads = param_int(args, 9)
    var kv_heads = param_int(args, 10)
    var block_size = param_int(args, 12)
    var max_blocks = param_int(args, 13)
    var q_stride = param_int(args, 14)
    var out_stride = param_int(args, 15)
    var scale = param_float(args, 16)
    var scores = scratch  # [MAX_GROUP, CHUNK]: one row's scores, then weights (the row path's layout)
    var offsets = Pointer[Scalar[DType.int64], MutAnyOrigin](
        unsafe_from_address=Int(scratch.unsafe_offset(MAX_GROUP * CHUNK)))
    var scale_offsets = offsets.unsafe_offset(CHUNK)
    var own = scratch.unsafe_offset(PROMPT_SCRATCH_AT)
    var qt = Pointer[Scalar[I32], MutAnyOrigin](unsafe_from_address=Int(own))
    var kw = qt.unsafe_offset(QT_WORDS)
    var sc = kw.unsafe_offset(KW_WORDS)
    var k_scales = own.unsafe_offset(QT_WORDS + KW_WORDS + SC_WORDS)
    var q_scales = k_scales.unsafe_offset(CHUNK)  # [ROWS, MAX_GROUP]
    var run_max = q_scales.unsafe_offset(ROWS * MAX_GROUP)
    var run_sum = run_max.unsafe_offset(ROWS * MAX_GROUP)
    var accs = run_sum.unsafe_offset(ROWS * MAX_GROUP)  # [ROWS, G, HD]
    var group = num_heads // kv_heads
    var ctx = Int(context_lens[unsafe_offset=seq])
    var q0_token = Int(query_start[unsafe_offset=seq])
    var q_len = Int(query_start[unsafe_offset=seq + 1]) - q0_token
    var table = block_tables.unsafe_offset(seq * max_blocks)
    var nr = r_end - r_begin
    var first_visible = ctx - q_len + r_begin + 1  # causal: row r sees keys up to its own position
    var last_visible = first_visible + nr - 1
    var lane = F32x16(0)
    comptime for j in range(KEYS):
        lane[j] = Float32(j)

    var g0 = 0
    while g0 < group:
        var ng = min(G, group - g0)
        # The rows' queries in 16-bit integers, transposed: qt[(g * P + p) * ROWS + r] = row r's value pair p.
        for x in range(0, QT_WORDS, ROWS):
            qt.unsafe_offset(x).unsafe_store(SIMD[I32, ROWS](0))
        for r in range(nr):
            var qp = query.unsafe_offset((q0_token + r_begin + r) * q_stride + (kvh * group + g0) * HD)
            for g in range(ng):
                var qi = query_i16[HD](qp.unsafe_offset(g * HD).unsafe_load[width=HD]().cast[F32](), scale)
                var pairs = bitcast[I32, P](qi[0])
                comptime for p in range(P):
                    qt[unsafe_offset=(g * P + p) * ROWS + r] = pairs[p]
                q_scales[unsafe_offset=r * MAX_GROUP + g] = qi[1]
                run_max[unsafe_offset=r * MAX_GROUP + g] = NEG
                run_sum[unsafe_offset=r * MAX_GROUP + g] = 0
                comptime for d in range(0, HD, 16):
                    accs.unsafe_offset((r * G + g) * HD + d).unsafe_store(F32x16(0))
        var c0 = 0
        while c0 < last_visible:
            var nk = min(CHUNK, last_visible - c0)  # the keys the item's last row sees in this chunk
            var n_groups = (nk + KEYS - 1) // KEYS
            chunk_offsets[I8, HD](offsets, scale_offsets, table, c0, nk, kvh, block_size, kv_heads)
            prefetch_rows[I8, HD](k_cache, offsets, scale_offsets, min(nk, AHEAD * KEYS))
            for gi in range(n_groups):
                k_scales.unsafe_offset(gi * KEYS).unsafe_store(
                    row_scales[I8](k_cache, scale_offsets.unsafe_offset(gi * KEYS)))
            # Scores: every row's, 16 keys at a time.
            for gi in range(n_groups):
                var j0 = gi * KEYS
                if j0 + AHEAD * KEYS < nk:
                    prefetch_rows[I8, HD](k_cache, offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                          scale_offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                          min(KEYS, nk - j0 - AHEAD * KEYS))
                prefetch_rows[I8, HD](v_cache, offsets.unsafe_offset(j0), scale_offsets.unsafe_offset(j0),
                                      min(KEYS, nk - j0))
                comptime for j in range(KEYS):  # the group's keys sign-extended once: their 16-bit value pairs
                    var k_row = k_cache.unsafe_offset(Int(offsets[unsafe_offset=j0 + j]))
                    var k16 = k_row.unsafe_load[width=HD]().cast[DType.int16]()
                    kw.unsafe_offset(j * P).unsafe_store(bitcast[I32, P](k16))
                comptime for n in range(1, G + 1):
                    if ng == n:
                        _score_group[HD, n](qt, kw, sc, nr, j0)
            # Each row folds the chunk in, as the row path does.
            for r in range(nr):
                var visible = first_visible + r
                if visible <= c0:
                    continue
                var nk_r = min(CHUNK, visible - c0)
                var maxes = Array[F32x16, G](fill=F32x16(NEG))
                for gi in range((nk_r + KEYS - 1) // KEYS):
                    var n = min(KEYS, nk_r - gi * KEYS)
                    var row_scales = k_scales.unsafe_offset(gi * KEYS).unsafe_load[width=KEYS]()
                    comptime for g in range(G):
                        if g < ng:
                            var at = (r * MAX_GROUP + g) * CHUNK + gi * KEYS
                            var s = masked(int8_scores(sc.unsafe_offset(at).unsafe_load[width=KEYS](), row_scales,
                                                       q_scales[unsafe_offset=r * MAX_GROUP + g]), n, lane)
                            maxes[g] = max(maxes[g], s)
                            scores.unsafe_offset(g * CHUNK + gi * KEYS).unsafe_store(s)
                var acc = Array[SIMD[F32, S], G * NS](fill=SIMD[F32, S](0))
                var m = Array[Float32, G](fill=NEG)
                var l = Array[Float32, G](fill=Float32(0))
                comptime for g in range(G):
                    if g < ng:
                        m[g] = run_max[unsafe_offset=r * MAX_GROUP + g]
                        l[g] = run_sum[unsafe_offset=r * MAX_GROUP + g]
                        comptime for j in range(NS):
                            acc[g * NS + j] = accs.unsafe_offset((r * G + g) * HD + j * S).unsafe_load[width=S]()
                fold_chunk[I8, HD, G, S, True](acc, m, l, maxes, scores, ng, nk_r, v_cache, offsets, scale_offsets)
                comptime for g in range(G):
                    if g < ng:
                        run_max[unsafe_offset=r * MAX_GROUP + g] = m[g]
                        run_sum[unsafe_offset=r * MAX_GROUP + g] = l[g]
                        comptime for j in range(NS):
                            accs.unsafe_offset((r * G + g) * HD + j * S).unsafe_store(acc[g * NS + j])
            c0 += CHUNK
        for r in range(nr):
            var op = out.unsafe_offset((q0_token + r_begin + r) * out_stride + (kvh * group + g0) * HD)
            for g in range(ng):
                var total = run_sum[unsafe_offset=r * MAX_GROUP + g]
                comptime for d in range(0, HD, 16):
                    var a = accs.unsafe_offset((r * G + g) * HD + d).unsafe_load[width=16]()
                    op.unsafe_offset(g * HD + d).unsafe_store(narrow[dt, 16](a / total))
        g0 += G
