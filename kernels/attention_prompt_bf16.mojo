# Paged attention for a work item's prompt rows together, over a bfloat16 cache with bfloat16 queries (head_dim 64
# and 128, a CPU with AVX-512 BF16): what attention_chunks.mojo runs for an item of at least BF16_PROMPT_MIN_ROWS
# rows when the scratch has room.
#
# The row path walks the context once per row, and for every key of every chunk widens the V row from bfloat16 to
# float32 again (a zero-extend and a shift per 16 values: as many vector operations as the multiply-adds they feed,
# two query heads sharing them at head_dim 128); in a 2048-token prompt the V walk was 44% of the kernel's samples,
# half of its instructions the widening. Here the item's rows (at most ROWS) go through the context together, chunk
# by chunk:
#   - the chunk's key offsets are found once for all its rows, and its V rows are widened once into scratch;
#   - each row scores the chunk (attention_parts.scores_bf16, the row path's code) and folds it into its running
#     softmax (attention_parts.chunk_weights, the row path's) and V accumulators (attention_parts.add_values, the
#     row path's own, over the widened rows: its multiply-adds in its order on the same float32 values), its state
#     kept in scratch between chunks.
# Every step is the row path's on the same numbers, so a row gets the same bits on either path: how a prompt is
# chunked or batched never changes its result (tested).

from numerics import narrow
from params import Params, param_int, param_ptr, param_float
from attention_parts import F32, BF16, KEYS, CHUNK, MAX_GROUP, ACC_VALUES, F32x16, NEG, AHEAD, heads_per_pass, \
    chunk_offsets, prefetch_rows, chunk_weights, add_values, masked, scores_bf16
from attention_prompt import ROWS, PROMPT_SCRATCH_AT

# From this many rows an item's widened V chunk serves enough rows to pay for its stores (a 2-row item already gains).
comptime BF16_PROMPT_MIN_ROWS = 2
# Scratch (4-byte words) after the row path's: the chunk's V rows widened [CHUNK, HD] float32 (HD at most 128), and
# per (row, head) the running maximum and sum and the V accumulators [HD] float32.
comptime VF_WORDS = CHUNK * 128
comptime STATE_WORDS = ROWS * MAX_GROUP * 2 + ROWS * ACC_VALUES


@always_inline
def bf16_prompt_scratch_floats() -> Int:
    """Scratch words an item takes here beyond the row path's (kernels/attention.py allots the larger of this and
    attention_prompt.prompt_scratch_floats(), and its tests check its figure against the kernel's)."""
    return VF_WORDS + STATE_WORDS


def attend_prompt_rows_bf16[HD: Int](args: Params, scratch: Pointer[Scalar[F32], MutAnyOrigin], seq: Int, kvh: Int,
                                     r_begin: Int, r_end: Int):
    """Rows r_begin .. r_end-1 (at most ROWS) of sequence seq for KV head kvh, kernels/attention.mojo's parameters
    with bfloat16 queries and cache; scratch: the item's, the row path's part first and then
    bf16_prompt_scratch_floats()."""
    comptime G = heads_per_pass[HD]()
    comptime S = min(HD, ACC_VALUES // G)
    comptime NS = HD // S
    var out = param_ptr[BF16](args, 0)
    var query = param_ptr[BF16](args, 1)
    var k_cache = param_ptr[BF16](args, 2)
    var v_cache = param_ptr[BF16](args, 3)
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
    var scale_offsets = offsets.unsafe_offset(CHUNK)  # unused over a bfloat16 cache, filled alike
    var values = scratch.unsafe_offset(PROMPT_SCRATCH_AT)  # [CHUNK, HD]: the chunk's V rows in float32
    var run_max = values.unsafe_offset(VF_WORDS)  # [ROWS, MAX_GROUP]
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
        for r in range(nr):
            for g in range(ng):
                run_max[unsafe_offset=r * MAX_GROUP + g] = NEG
                run_sum[unsafe_offset=r * MAX_GROUP + g] = 0
                comptime for d in range(0, HD, 16):
                    accs.unsafe_offset((r * G + g) * HD + d).unsafe_store(F32x16(0))
        var c0 = 0
        while c0 < last_visible:
            var nk = min(CHUNK, last_visible - c0)  # the keys the item's last row sees in this chunk
            var n_groups = (nk + KEYS - 1) // KEYS
            chunk_offsets[BF16, HD](offsets, scale_offsets, table, c0, nk, kvh, block_size, kv_heads)
            prefetch_rows[BF16, HD](v_cache, offsets, scale_offsets, min(nk, AHEAD * KEYS))
            for gi in range(n_groups):  # V widened once for every row, the next groups' rows on their way
                var j0 = gi * KEYS
                if j0 + AHEAD * KEYS < nk:
                    prefetch_rows[BF16, HD](v_cache, offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                            scale_offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                            min(KEYS, nk - j0 - AHEAD * KEYS))
                for t in range(j0, min(j0 + KEYS, nk)):
                    var v = v_cache.unsafe_offset(Int(offsets[unsafe_offset=t])).unsafe_load[width=HD]()
                    values.unsafe_offset(t * HD).unsafe_store(v.cast[F32]())
            prefetch_rows[BF16, HD](k_cache, offsets, scale_offsets, min(nk, AHEAD * KEYS))
            for r in range(nr):
                var visible = first_visible + r
                if visible <= c0:
                    continue
                var nk_r = min(CHUNK, visible - c0)
                var qp = query.unsafe_offset((q0_token + r_begin + r) * q_stride + (kvh * group + g0) * HD)
                var maxes = Array[F32x16, G](fill=F32x16(NEG))
                for gi in range((nk_r + KEYS - 1) // KEYS):
                    var j0 = gi * KEYS
                    if r == 0 and j0 + AHEAD * KEYS < nk_r:  # the first row brings K in; the others find it cached
                        prefetch_rows[BF16, HD](k_cache, offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                                scale_offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                                min(KEYS, nk_r - j0 - AHEAD * KEYS))
                    comptime for g in range(G):
                        if g < ng:
                            var s = masked(scores_bf16[HD](qp.unsafe_offset(g * HD), k_cache,
                                                           offsets.unsafe_offset(j0), scale),
                                           min(KEYS, nk_r - j0), lane)
                            maxes[g] = max(maxes[g], s)
                            scores.unsafe_offset(g * CHUNK + j0).unsafe_store(s)
                var acc = Array[SIMD[F32, S], G * NS](fill=SIMD[F32, S](0))
                var m = Array[Float32, G](fill=NEG)
                var l = Array[Float32, G](fill=Float32(0))
                comptime for g in range(G):
                    if g < ng:
                        m[g] = run_max[unsafe_offset=r * MAX_GROUP + g]
                        l[g] = run_sum[unsafe_offset=r * MAX_GROUP + g]
                        comptime for j in range(NS):
                            acc[g * NS + j] = accs.unsafe_offset((r * G + g) * HD + j * S).unsafe_load[width=S]()
                _ = chunk_weights[BF16, HD, G, S, False](acc, m, l, maxes, scores, ng, nk_r, v_cache, scale_offsets)
                comptime for n in range(1, G + 1):  # the head count as a constant, as fold_chunk has it
                    if ng == n:
                        comptime for j in range(NS):
                            add_values[F32, HD, G, S, n, WIDENED=True](acc, j, values, offsets, scores, nk_r)
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
                    op.unsafe_offset(g * HD + d).unsafe_store(narrow[BF16, 16](a / total))
        g0 += G
