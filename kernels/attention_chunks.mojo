# Paged attention for a head_dim known at compile time (64, 128): what kernels/attention.mojo runs for them.
#
# Per work item (sequence, KV head, query rows) and query row, the query heads that share the KV head go
# through the context together (up to 4 at a time, 2 at head_dim 128), in chunks of CHUNK keys, each in two
# passes:
#   1. scores: 16 keys at a time, every key leaves a 16-lane vector of partial sums of its dot product, and a
#      tree of shuffles (kernels/lane_tree.mojo) sums the 16 vectors lane-wise, so the group's 16 scores land
#      in one vector with no per-key reduction. With bfloat16 queries the partial sums are integer or exact
#      products of the rows as stored: over a bfloat16 cache, vdpbf16ps (where the CPU has AVX-512 BF16);
#      over an int8 cache, vpdpwssd of the key's int8 values (sign-extended) and the query in 16-bit integers
#      (its scale and the keys' row scales multiply the 16 scores). Otherwise they are float32 products
#      (attention_parts.scores_f32; with AVX2's 16 registers, a few keys at a time for all the pass's heads, each key
#      slice widened once for them, and a tree of pair sums instead).
#      The int8 path sign-extends each key row once for the pass's heads (their count a compile-time constant)
#      and sums the tree's levels as the keys arrive: 2-3% less attention time at head_dim 64, 5% at 128.
#   2. the chunk's softmax weights (its maximum folded into the running one, as an online softmax does
#      between chunks), then V: each row widened to float32 and added into every head's accumulator,
#      weighted by its softmax weight read back from scratch (a broadcast load; over an int8 cache the weight
#      already holds the V row's scale, applied to 16 keys at once; with bfloat16 queries over an int8 cache the
#      weights go to 16 bits and V is summed in integers instead, attention_parts.add_values_i16). The float
#      accumulators are walked in slices of at most ROW_ACC_VALUES values across the heads, one pass over the
#      chunk's keys per slice, with the head count a compile-time constant, so that a slice's accumulators stay
#      in registers (with the head count a run-time branch they spilled, and every key's update waited on a
#      store). At head_dim 64 and 128 one slice holds every head's accumulators (16 zmm): each V row is then
#      read and widened once, where 8-zmm slices read it twice; 9-11% less time in attention at 32 decode rows.
#      Each value gets its keys' products added in key order in any slicing, so the slices change no bit.
# Scores and key offsets of a chunk live in the calling thread's scratch. Nothing depends on which other items
# are in the call or on the thread: a row gets the same bits in any batch. A work item's prompt rows go through the
# context together instead where the scratch has room, with the same bits: attention_prompt.mojo over an int8 cache,
# attention_prompt_bf16.mojo over a bfloat16 one.

from std.sys import llvm_intrinsic, size_of
from numerics import narrow
from params import Params, param_int, param_ptr, param_float
from kv_int8 import I8
from lane_tree import bitrev4, level_sum
from attention_parts import F32, BF16, KEYS, CHUNK, MAX_GROUP, ROW_ACC_VALUES, F32x16, I16x32, I32x16, \
    HAS_BF16_DOT, HAS_I16_DOT, I16_MAX, NEG, AHEAD, REREAD_BYTES, heads_per_pass, chunk_offsets, prefetch_rows, \
    fold_chunk, query_i16, int8_scores, masked, row_scales, scores_bf16, scores_f32
from attention_prompt import PROMPT_MIN_ROWS, PROMPT_SCRATCH_AT, prompt_scratch_floats, attend_prompt_rows
from attention_prompt_bf16 import BF16_PROMPT_MIN_ROWS, bf16_prompt_scratch_floats, attend_prompt_rows_bf16


@always_inline
def _key_sums_i16[HD: Int, G: Int, NG: Int](q16: Array[I16x32, G * (HD // 32)],
                                         k_cache: Pointer[Scalar[I8], MutAnyOrigin],
                                         offs: Pointer[Scalar[DType.int64], MutAnyOrigin]) -> Array[I32x16, G]:
    """Lane j of result g (g < NG): the exact integer dot product of query head g's 16-bit values (HD of them)
    with the int8 row of key j at offs[j], by vpdpwssd (|q| <= 32767, |k| <= 127: a sum of 256 products stays
    far inside int32). Each key's row is sign-extended once for all NG heads (NG a constant), and lane_tree's
    levels are combined as the keys arrive (slot order), so each head holds a few partial vectors, not 16."""
    comptime C = HD // 32
    var l1 = Array[I32x16, NG * 8](fill=I32x16(0))
    var l2 = Array[I32x16, NG * 4](fill=I32x16(0))
    var l3 = Array[I32x16, NG * 2](fill=I32x16(0))
    var sums = Array[I32x16, G](fill=I32x16(0))
    comptime for pair in range(8):
        # Slots 2 pair and 2 pair + 1 hold keys bitrev4(slot): lane_sums leaves key j's sum in lane j.
        var rows = Array[I16x32, 2 * C](fill=I16x32(0))
        comptime for half in range(2):
            var k = k_cache.unsafe_offset(Int(offs[unsafe_offset=bitrev4(2 * pair + half)]))
            comptime for c in range(C):
                rows[half * C + c] = k.unsafe_offset(32 * c).unsafe_load[width=32]().cast[DType.int16]()
        comptime for g in range(NG):
            var dots = Array[I32x16, 2](fill=I32x16(0))
            comptime for half in range(2):
                comptime for c in range(C):
                    dots[half] = llvm_intrinsic["llvm.x86.avx512.vpdpwssd.512", I32x16](
                        dots[half], q16[g * C + c], rows[half * C + c])
            l1[g * 8 + pair] = level_sum[1](dots[0], dots[1])
            comptime if pair % 2 == 1:
                l2[g * 4 + pair // 2] = level_sum[2](l1[g * 8 + pair - 1], l1[g * 8 + pair])
            comptime if pair % 4 == 3:
                l3[g * 2 + pair // 4] = level_sum[3](l2[g * 4 + pair // 2 - 1], l2[g * 4 + pair // 2])
            comptime if pair == 7:
                sums[g] = level_sum[4](l3[g * 2], l3[g * 2 + 1])
    return sums^


def attend_chunks[dt: DType, cdt: DType, HD: Int](args: Params, begin: Int, end: Int):
    """Work items [begin, end) of kernels/attention.mojo's paged_attention (same parameters) for head_dim HD."""
    comptime G = heads_per_pass[HD]()
    comptime S = min(HD, ROW_ACC_VALUES // G)  # values per accumulator slice (a multiple of 16)
    comptime NS = HD // S
    comptime BF16_DOT = HAS_BF16_DOT and dt == BF16 and cdt == BF16
    comptime I16_DOT = HAS_I16_DOT and dt == BF16 and cdt == I8
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
    # This thread's scratch, the first item's (the items of one range run on one thread, one after another):
    # scores [MAX_GROUP, CHUNK] float32, the keys' values and (int8) scale offsets [2, CHUNK] int64, and where
    # kernels/attention.py's _scratch_width allots it for prompt rows over an int8 cache, attention_prompt.mojo's part.
    var scores = param_ptr[F32](args, 17).unsafe_offset(begin * scratch_width)
    var offsets = Pointer[Scalar[DType.int64], MutAnyOrigin](
        unsafe_from_address=Int(scores.unsafe_offset(MAX_GROUP * CHUNK)))
    var scale_offsets = offsets.unsafe_offset(CHUNK)
    var group = num_heads // kv_heads
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
        var r_begin = Int(items[unsafe_offset=4 * i + 2])
        var r_end = Int(items[unsafe_offset=4 * i + 3])
        # A prompt's rows together where the scratch has room (the same bits).
        comptime if I16_DOT:
            if r_end - r_begin >= PROMPT_MIN_ROWS and scratch_width >= PROMPT_SCRATCH_AT + prompt_scratch_floats():
                attend_prompt_rows[dt, HD](args, scores, seq, kvh, r_begin, r_end)
                continue
        elif BF16_DOT:
            if (r_end - r_begin >= BF16_PROMPT_MIN_ROWS
                    and scratch_width >= PROMPT_SCRATCH_AT + bf16_prompt_scratch_floats()):
                attend_prompt_rows_bf16[HD](args, scores, seq, kvh, r_begin, r_end)
                continue
        for r in range(r_begin, r_end):
            var token = q0_token + r
            var visible = ctx - q_len + r + 1  # causal: keys up to this token's own position
            # A prompt's later rows find the keys the row before them read still in cache, unless there are too many.
            var fetch = r == r_begin or visible * 2 * HD * size_of[cdt]() > REREAD_BYTES
            var g0 = 0
            while g0 < group:
                var ng = min(G, group - g0)
                var qp = query.unsafe_offset(token * q_stride + (kvh * group + g0) * HD)
                var qf = Array[SIMD[F32, HD], G](fill=SIMD[F32, HD](0))  # scaled float32 queries
                var q16 = Array[I16x32, G * (HD // 32)](fill=I16x32(0))  # I16_DOT: 16-bit queries ...
                var q16_scale = Array[Float32, G](fill=Float32(0))  # ... and the factor that restores them
                comptime if I16_DOT:
                    comptime for g in range(G):
                        if g < ng:
                            var qi = query_i16[HD](qp.unsafe_offset(g * HD).unsafe_load[width=HD]().cast[F32](), scale)
                            comptime for c in range(HD // 32):
                                q16[g * (HD // 32) + c] = qi[0].slice[32, offset=32 * c]()
                            q16_scale[g] = qi[1]
                elif not BF16_DOT:
                    comptime for g in range(G):
                        if g < ng:
                            qf[g] = qp.unsafe_offset(g * HD).unsafe_load[width=HD]().cast[F32]() * scale
                # Head g's accumulator as NS slices of S values: slice j at acc[g * NS + j].
                var acc = Array[SIMD[F32, S], G * NS](fill=SIMD[F32, S](0))
                var m = Array[Float32, G](fill=NEG)
                var l = Array[Float32, G](fill=Float32(0))
                var c0 = 0
                while c0 < visible:
                    var nk = min(CHUNK, visible - c0)
                    var n_groups = (nk + KEYS - 1) // KEYS
                    chunk_offsets[cdt, HD](offsets, scale_offsets, table, c0, nk, kvh, block_size, kv_heads)
                    if fetch:
                        prefetch_rows[cdt, HD](k_cache, offsets, scale_offsets, min(nk, AHEAD * KEYS))
                    # Pass 1: the chunk's scores, each head's running maximum in a vector.
                    var maxes = Array[F32x16, G](fill=F32x16(NEG))
                    for gi in range(n_groups):
                        var j0 = gi * KEYS
                        var n = min(KEYS, nk - j0)
                        var offs = offsets.unsafe_offset(j0)
                        if fetch:
                            if j0 + AHEAD * KEYS < nk:
                                prefetch_rows[cdt, HD](k_cache, offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                                        scale_offsets.unsafe_offset(j0 + AHEAD * KEYS),
                                                        min(KEYS, nk - j0 - AHEAD * KEYS))
                            prefetch_rows[cdt, HD](v_cache, offs, scale_offsets.unsafe_offset(j0), n)  # for pass 2
                        var k_scales = row_scales[cdt](k_cache, scale_offsets.unsafe_offset(j0))
                        var key_sums = Array[I32x16, G](fill=I32x16(0))
                        var f32_scores = Array[F32x16, G](fill=F32x16(0))
                        comptime for n in range(1, G + 1):  # the head count as a constant (see pass 2)
                            if ng == n:
                                comptime if I16_DOT:
                                    key_sums = _key_sums_i16[HD, G, n](
                                        q16, rebind[Pointer[Scalar[I8], MutAnyOrigin]](k_cache), offs)
                                elif not BF16_DOT:
                                    f32_scores = scores_f32[cdt, HD, G, n](qf, k_cache, offs, k_scales)
                        comptime for g in range(G):
                            if g < ng:
                                var s: F32x16
                                comptime if I16_DOT:
                                    s = int8_scores(key_sums[g], k_scales, q16_scale[g])
                                elif BF16_DOT:
                                    s = scores_bf16[HD](
                                        rebind[Pointer[Scalar[BF16], MutAnyOrigin]](qp.unsafe_offset(g * HD)),
                                        rebind[Pointer[Scalar[BF16], MutAnyOrigin]](k_cache), offs, scale)
                                else:
                                    s = f32_scores[g]
                                s = masked(s, n, lane)
                                maxes[g] = max(maxes[g], s)
                                scores.unsafe_offset(g * CHUNK + j0).unsafe_store(s)
                    fold_chunk[cdt, HD, G, S, I16_DOT](acc, m, l, maxes, scores, ng, nk, v_cache, offsets,
                                                       scale_offsets)
                    c0 += CHUNK
                var op = out.unsafe_offset(token * out_stride + (kvh * group + g0) * HD)
                comptime for g in range(G):
                    if g < ng:
                        comptime for j in range(NS):
                            op.unsafe_offset(g * HD + j * S).unsafe_store(narrow[dt, S](acc[g * NS + j] / l[g]))
                g0 += G
