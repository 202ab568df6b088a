# MILI's quantized-weight matmul for the GGUF types of K-quant files: y = x @ W.T (+ bias), W in
# llama.cpp's Q5_0, Q5_1 (32-weight blocks), Q4_K or Q6_K (256-weight super-blocks), repacked once at
# load (kernels/formats/kblocks.py) into 16-row tiles. The same two phases and instruction scheme as
# kernels/quant_matmul.mojo, with the weights' own scale structure kept, so a token streams about the
# bytes the GGUF stores (4.625 bits per weight for Q4_K, 6.625 for Q6_K, 5.5 / 6.0 for Q5_0 / Q5_1).
#
#   1. quantize_rows (kernels/quant_activations.mojo, the main kernel's own): each activation row, per
#      32-element block, in the server's activation mode: two int8 parts, q = 254 q1 + q2 in about 15
#      bits with a float32 scale da = max|x| / 32258 (int8x2), or one, q = q1 with da = max|x| / 127
#      (int8); plus the block's sum of q and its sum over elements 0-15 (Q6_K's scales change every 16
#      weights; sum_hi = sum - sum_lo).
#   2. tiles: per 16-column tile and 32-element block, sixteen vpdpbusd (u8 weights x s8 q1, and x s8 q2;
#      int8: the first eight only) give exact int32 dots of 16 columns, 254 * dot(w, q1) + dot(w, q2) or
#      dot(w, q1): for Q6_K lo over K-steps 0-15 and hi over 16-31 (|lo|, |hi| <= 16 * 63 * 32258), for the
#      others the whole block's in lo and hi = 0 (|lo| <= 32 * 31 * 32258):
#        Q5_0: y += d * da * (lo + hi - 16 * sum q)
#        Q5_1: y += d * da * (lo + hi) + m * (da * sum q)
#        Q4_K: y += (d * sc) * da * (lo + hi) - (dmin * mn) * (da * sum q)     sc, mn: 6-bit, per 32
#        Q6_K: y += d * da * (f32(sc_lo * (lo - 32 * sum_lo q)) + f32(sc_hi * (hi - 32 * sum_hi q)))
#      sc: int8, per 16. d * sc and dmin * mn are exact in float32 (an 11-bit mantissa times 6 bits).
#      Each of Q6_K's two products is an exact int32 (|sc| <= 128, |q - 32| <= 32: at most
#      128 * 16 * 32 * 32258 < 2^31) but their sum may not be, so they meet in float32. Blocks are added
#      in order; every output element is computed by the same instructions whatever the batch, the row's
#      place in it or the thread, as in quant_matmul.mojo.
#      From 16 rows (parameter 15, kernels/quant_matmul.py's use_amx), AMX int8 tiles compute the same integers
#      for whole groups of 16 rows (tdpbsud sums exactly; kernels/quant_amx.mojo): per block, C1 and C2 =
#      the 16 rows' dots with q1 and q2 (int8: C1 alone) over all 32 K-steps (Q5_0, Q5_1, Q4_K need only
#      lo + hi), or for
#      Q6_K over each half apart, on tiles 16 K-steps wide, so that lo and hi are the same two int32s. The
#      sums then go through the vpdpbusd path's own epilogue function: the same bits at every row count.
#      A tile's weights are unpacked into the B-tile layout (the records' vectors g, as vpdpbusd reads
#      them) once per chunk of rows, for all the chunk's 16-row groups.
#
# Tile records (per 16-column tile, K in order; weights unsigned, nibble byte (g*16 + c)*4 + j holds
# q[c, 4g+j] in its low half and q[c, 4(g+4)+j] in its high half, g < 4, c the column, j < 4):
#   Q5_0 block: 256 B nibbles | 64 B bit 4 | 16 x f16 d                                  (352 B)
#   Q5_1 block: 256 B nibbles | 64 B bit 4 | 16 x f16 d | 16 x f16 m                     (384 B)
#   Q4_K super-block: 16 x f16 d | 16 x f16 dmin, then 8 x [256 B nibbles | 16 u8 sc | 16 u8 mn]
#                                                                                  (64 + 8 x 288 B)
#   Q6_K super-block: 16 x f16 d | 32 B zero, then 8 x [256 B nibbles | 64 B bits 4-5 of groups 0-3 |
#                     64 B bits 4-5 of groups 4-7 | 16 i8 sc_lo | 16 i8 sc_hi]       (64 + 8 x 416 B)
# "bit 4" byte (c*4 + j) holds bit 4 of q[c, 4g+j] at bit g; "bits 4-5" byte (c*4 + j) holds bits 4-5
# of q[c, 4g+j] at bits 2(g mod 4).

from std.python import PythonObject
from std.python.bindings import PythonModuleBuilder
from std.os import abort
from std.memory import alloc, bitcast, stack_allocation
from numerics import PAIRS_PATH, PAIRS_ROWS_ONE, PAIRS_ROWS_TWO, Floats, I16x32, Ints, Words, add_pair_sums, \
    byte_bits, dpbusd, high_nibbles, narrow, pair_span, widen_pairs, widen_parts
from params import Params, param_int, param_ptr
from row_groups import prefetch_next, row_groups
from quant_activations import P_BLOCK_STRIDE, P_D, P_K, P_M, P_Q1, P_Q2, P_SUM, P_SUM_F, P_SUM_LO, combine_parts, \
    quantize_rows, row_chunk, two_parts
from quant_amx import TILE_A1, TILE_A1_HALF, TILE_A2, TILE_A2_HALF, TILE_B, TILE_B_HI, TILE_B_LO, TILE_C1, \
    TILE_C1_HI, TILE_C1_LO, TILE_C1_NEXT, TILE_C2, TILE_C2_HI, TILE_C2_LO, TILE_C2_NEXT, amx_configure, \
    amx_configure_halves, amx_release, amx_row_chunk, tile_dot_su, tile_load, tile_store, tile_zero

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime TN = 16  # output columns per tile
comptime QK = 32  # activation block


@always_inline
def rows_per_block[kind: Int, two: Bool]() -> Int:
    """Activation rows sharing one unpacked weight block, as many as their accumulators, dot-product chains
    and the block's 8 weight vectors leave zmm registers for: a chain a part over the whole block (every type
    but Q6_K) gives 8 rows with one int8 part and 6 with two; Q6_K keeps its halves' sums apart, two chains a
    part: 6 rows with one part, 3 with two (with 4, the compiler kept some of their values on the stack).
    The AVX2 pairs path (_block_rows_pairs) holds one weight vector at a time and each row's int16 pair sums,
    in 16 ymm registers: numerics.PAIRS_ROWS_ONE and _TWO."""
    comptime if PAIRS_PATH:
        return PAIRS_ROWS_TWO if two else PAIRS_ROWS_ONE
    comptime if kind == KIND_Q6_K:
        return 3 if two else 6
    return 6 if two else 8


# The output's row stride in elements (kernels/quant_operands.py: >= N, for a column slice of a wider output).
comptime P_LDC = 17

comptime DTYPE_F32 = 0
comptime DTYPE_BF16 = 1

comptime KIND_Q5_0 = 0
comptime KIND_Q5_1 = 1
comptime KIND_Q4_K = 2
comptime KIND_Q6_K = 3

comptime I32x16 = SIMD[DType.int32, TN]
comptime F32x16 = SIMD[F32, TN]
comptime U8x64 = SIMD[DType.uint8, 64]
comptime Bytes = Pointer[Scalar[DType.uint8], MutAnyOrigin]


@export
def PyInit_mili_quant_k() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("mili_quant_k")
        m.def_function[qmatmul]("qmatmul", docstring="K-quant-file matmul, both phases on the calling thread")
        return m.finalize()
    except e:
        abort(String("error creating module:", e))


@always_inline
def blocks_per_group[kind: Int]() -> Int:
    comptime if kind == KIND_Q4_K or kind == KIND_Q6_K:
        return 8
    else:
        return 1


@always_inline
def header_bytes[kind: Int]() -> Int:
    comptime if kind == KIND_Q4_K or kind == KIND_Q6_K:
        return 64
    else:
        return 0


@always_inline
def block_bytes[kind: Int]() -> Int:
    comptime if kind == KIND_Q5_0:
        return 352
    elif kind == KIND_Q5_1:
        return 384
    elif kind == KIND_Q4_K:
        return 288
    else:
        return 416


@always_inline
def _dpbusd(acc: I32x16, w: U8x64, a: Int32) -> I32x16:
    """acc + per lane the sum of 4 products u8 w x s8 a (a: 4 packed int8, the same for every lane)."""
    return dpbusd[True](acc, w, bitcast[DType.int8, 64](I32x16(a)))  # every K-quant weight is below 64


@always_inline
def _f16x16(p: Bytes, offset: Int) -> F32x16:
    return bitcast[DType.float16, TN](p.unsafe_offset(offset).unsafe_load[width=2 * TN]()).cast[F32]()


# ----- phase 2: 16-column tiles ------------------------------------------------------------------------


@always_inline
def _weights[kind: Int, g: Int](blk: Bytes) -> U8x64:
    """The block's weight vector g: K-steps 4g..4g+3 of all 16 columns, unsigned."""
    var v = blk.unsafe_offset((g % 4) * 64).unsafe_load[width=64]()
    var w: U8x64
    comptime if g < 4:
        w = v & 0x0F
    else:
        w = high_nibbles(v)
    comptime if kind == KIND_Q5_0 or kind == KIND_Q5_1:
        w |= byte_bits[g, 1, 4](blk.unsafe_offset(256).unsafe_load[width=64]())
    elif kind == KIND_Q6_K:
        w |= byte_bits[2 * (g % 4), 3, 4](blk.unsafe_offset(256 + 64 * (g // 4)).unsafe_load[width=64]())
    return w


@always_inline
def _unpack[kind: Int](blk: Bytes) -> Array[U8x64, 8]:
    """The block's 8 weight vectors (_weights)."""
    var w = Array[U8x64, 8](fill=U8x64(0))
    comptime for g in range(8):
        w[g] = _weights[kind, g](blk)
    return w^


@always_inline
def max_weight[kind: Int]() -> Int:
    """The largest unsigned weight of the kind: 4 bits (Q4_K), 5 (Q5_0, Q5_1) or 6 (Q6_K)."""
    comptime if kind == KIND_Q4_K:
        return 15
    elif kind == KIND_Q6_K:
        return 63
    return 31


@always_inline
def _block_scales[kind: Int](d_sb: F32x16, dmin_sb: F32x16, blk: Bytes, mut dw: F32x16, mut mw: F32x16,
                             mut sc_lo: I32x16, mut sc_hi: I32x16):
    """One block's per-column scales for the epilogue, from the block record and (K-quants) the super-block's
    d and dmin: both paths get them here, so the same float32 values."""
    comptime if kind == KIND_Q5_0:
        dw = _f16x16(blk, 320)
    elif kind == KIND_Q5_1:
        dw = _f16x16(blk, 320)
        mw = _f16x16(blk, 352)
    elif kind == KIND_Q4_K:
        # Both products exact in float32; the min enters negated (w = d*sc*q - dmin*mn).
        dw = d_sb * blk.unsafe_offset(256).unsafe_load[width=TN]().cast[F32]()
        mw = -(dmin_sb * blk.unsafe_offset(256 + TN).unsafe_load[width=TN]().cast[F32]())
    else:
        dw = d_sb
        sc_lo = bitcast[DType.int8, TN](blk.unsafe_offset(384).unsafe_load[width=TN]()).cast[DType.int32]()
        sc_hi = bitcast[DType.int8, TN](blk.unsafe_offset(400).unsafe_load[width=TN]()).cast[DType.int32]()


@always_inline
def _block_row[kind: Int, two: Bool](y: F32x16, w: Array[U8x64, 8], dw: F32x16, mw: F32x16, sc_lo: I32x16,
                                     sc_hi: I32x16, a: SIMD[DType.int8, QK], a2: SIMD[DType.int8, QK], da: Float32,
                                     sum: Int32, lo_sum: Int32, s_f: Float32) -> F32x16:
    """y plus one block's contribution for one activation row (the same instructions for every row)."""
    var a32 = bitcast[DType.int32, 8](a)
    # Dependency chains per part, and for Q6_K per half of the block; the rows of a group run theirs side by side.
    # Integer sums, so exact in any order.
    var lo1 = I32x16(0)
    var hi1 = I32x16(0)
    comptime if two and kind == KIND_Q6_K:
        var b32 = bitcast[DType.int32, 8](a2)
        var lo2 = I32x16(0)
        var hi2 = I32x16(0)
        comptime for g in range(4):
            lo1 = _dpbusd(lo1, w[g], a32[g])
            lo2 = _dpbusd(lo2, w[g], b32[g])
            hi1 = _dpbusd(hi1, w[g + 4], a32[g + 4])
            hi2 = _dpbusd(hi2, w[g + 4], b32[g + 4])
        return _block_epilogue[kind](y, combine_parts(lo1, lo2), combine_parts(hi1, hi2), dw, mw, sc_lo, sc_hi, da,
                                     sum, lo_sum, s_f)
    elif two:  # one chain a part over the whole block; the epilogue adds lo + hi, here hi = 0 (as the AMX path)
        var b32 = bitcast[DType.int32, 8](a2)
        var lo2 = I32x16(0)
        comptime for g in range(8):
            lo1 = _dpbusd(lo1, w[g], a32[g])
            lo2 = _dpbusd(lo2, w[g], b32[g])
        return _block_epilogue[kind](y, combine_parts(lo1, lo2), hi1, dw, mw, sc_lo, sc_hi, da, sum, lo_sum, s_f)
    elif kind == KIND_Q6_K:
        comptime for g in range(4):
            lo1 = _dpbusd(lo1, w[g], a32[g])
            hi1 = _dpbusd(hi1, w[g + 4], a32[g + 4])
        return _block_epilogue[kind](y, lo1, hi1, dw, mw, sc_lo, sc_hi, da, sum, lo_sum, s_f)
    else:  # one chain over the whole block (the epilogue adds lo + hi); rows_per_block rows run side by side
        comptime for g in range(8):
            lo1 = _dpbusd(lo1, w[g], a32[g])
        return _block_epilogue[kind](y, lo1, hi1, dw, mw, sc_lo, sc_hi, da, sum, lo_sum, s_f)


@always_inline
def _block_rows_pairs[kind: Int, R: Int, two: Bool](mut y: Array[F32x16, R], blk: Bytes, dw: F32x16, mw: F32x16,
                                                   sc_lo: I32x16, sc_hi: I32x16, a1: Words, a2: Words,
                                                   row_words: Int, da: Floats, s: Ints, s_lo: Ints, s_f: Floats,
                                                   j0: Int):
    """y[r] plus one block's contribution for a group's R rows, on a CPU without AVX-512 VNNI: the weight
    vectors one at a time (AVX2's 16 registers hold no whole unpacked block), each row's pair sums added in int16
    lanes over pair_span vectors and widened once (numerics.mojo), so about half the multiplies of dpbusd's
    emulation. The int32 sums are _block_row's (integer sums in another order), and so is the epilogue: the
    same bits as every other path. a1, a2: the first row's q1 and q2 at this block, 4 int8 K-steps a word, the rows
    row_words apart; da, s, s_lo, s_f: the per-block arrays, the first row's values for this block at j0 (addresses
    worked out once per block by the caller)."""
    comptime span = pair_span(max_weight[kind]())
    comptime assert 4 % span == 0 or span == 8, "a span must not cross Q6_K's halves or the block's end"
    # One int32 sum a row and half: two parts widen straight into 254 * dot1 + dot2 (numerics.widen_parts), which
    # is linear, so each span's share adds into it (Q6_K: 4 such sums a row where there were 8, so fewer spills).
    var lo = Array[I32x16, R](fill=I32x16(0))
    var hi = Array[I32x16, R](fill=I32x16(0))
    comptime for g0 in range(0, 8, span):
        var pairs1 = Array[I16x32, R](fill=I16x32(0))
        var pairs2 = Array[I16x32, R](fill=I16x32(0))
        comptime for g in range(g0, g0 + span):
            var w = _weights[kind, g](blk)
            add_pair_sums[R, two, g](pairs1, pairs2, w, a1, a2, row_words)
        comptime for r in range(R):
            var dots: I32x16
            comptime if two:
                dots = widen_parts(pairs1[r], pairs2[r])
            else:
                dots = widen_pairs(pairs1[r])
            comptime if kind == KIND_Q6_K and g0 >= 4:  # Q6_K's halves apart, as _block_row's
                hi[r] += dots
            else:
                lo[r] += dots
    comptime for r in range(R):
        var j = j0 + r
        y[r] = _block_epilogue[kind](y[r], lo[r], hi[r], dw, mw, sc_lo, sc_hi, da[unsafe_offset=j],
                                     s[unsafe_offset=j], s_lo[unsafe_offset=j], s_f[unsafe_offset=j])


@always_inline
def _block_epilogue[kind: Int](y: F32x16, lo: I32x16, hi: I32x16, dw: F32x16, mw: F32x16, sc_lo: I32x16,
                               sc_hi: I32x16, da: Float32, sum: Int32, lo_sum: Int32, s_f: Float32) -> F32x16:
    """y plus one block's contribution given its exact integer dot products 254 * dot(w, q1) + dot(w, q2)
    (int8: dot(w, q1)) over K-steps 0-15 (lo) and 16-31 (hi). Both paths (vpdpbusd and AMX tiles) end here,
    so a row's float steps are the same whichever computed its sums;
    only Q6_K needs the halves apart (the AMX path passes
    the whole block's sum as lo and 0 as hi for the others: the same integer lo + hi)."""
    var acc: F32x16
    comptime if kind == KIND_Q6_K:
        var hi_sum = sum - lo_sum
        acc = (sc_lo * (lo - I32x16(32 * lo_sum))).cast[F32]() + (sc_hi * (hi - I32x16(32 * hi_sum))).cast[F32]()
    elif kind == KIND_Q5_0:
        acc = (lo + hi - I32x16(16 * sum)).cast[F32]()
    else:
        acc = (lo + hi).cast[F32]()
    var res = acc.fma(dw * da, y)
    comptime if kind == KIND_Q5_1 or kind == KIND_Q4_K:
        res = mw.fma(F32x16(s_f), res)
    return res


def _store_tile[out_dt: DType](dst: Pointer[Scalar[out_dt], MutAnyOrigin], y: F32x16, count: Int):
    if count == TN:
        dst.unsafe_store(narrow[out_dt, TN](y))
    else:
        var narrowed = narrow[out_dt, TN](y)
        for c in range(count):
            dst[unsafe_offset=c] = narrowed[c]


def _finish_row[out_dt: DType](p: Params, y: F32x16, row: Int, t: Int):
    """Adds the bias to one row's 16 columns of tile t and stores them."""
    var dst = param_ptr[out_dt](p, 0)  # [M, N] with row stride ldc (>= N: a column slice of a wider output)
    var bias = param_ptr[F32](p, 3)  # [N] or address 0
    var n = param_int(p, 5)
    var col0 = t * TN
    var count = min(TN, n - col0)
    var v = y
    if param_int(p, 3) != 0:
        var b_vec = F32x16(0)
        if count == TN:
            b_vec = bias.unsafe_offset(col0).unsafe_load[width=TN]()
        else:
            for c in range(count):
                b_vec[c] = bias[unsafe_offset=col0 + c]
        v = y + b_vec
    _store_tile[out_dt](dst.unsafe_offset(row * param_int(p, P_LDC) + col0), v, count)


def _tile_rows[kind: Int, out_dt: DType, R: Int, two: Bool](p: Params, t: Int, row0: Int):
    """Rows row0 .. row0+R-1 of tile t, every K block; each weight block is unpacked once for the R rows."""
    var wp = param_ptr[DType.uint8](p, 2)
    var k = param_int(p, P_K)
    var qa = param_ptr[DType.int8](p, P_Q1)
    var qa2 = param_ptr[DType.int8](p, P_Q2)
    var da = param_ptr[F32](p, P_D)
    var s = param_ptr[DType.int32](p, P_SUM)
    var s_lo = param_ptr[DType.int32](p, P_SUM_LO)
    var stride = param_int(p, P_BLOCK_STRIDE)
    var s_f = param_ptr[F32](p, P_SUM_F)
    var nb = k // QK
    var row_words = k // 4  # the activations as 4 int8 K-steps a word (the pairs path)
    var q1_words = param_ptr[DType.int32](p, P_Q1)
    var q2_words = param_ptr[DType.int32](p, P_Q2)
    comptime bpg = blocks_per_group[kind]()
    comptime hdr = header_bytes[kind]()
    comptime blk_bytes = block_bytes[kind]()
    comptime group_bytes = hdr + bpg * blk_bytes
    var groups = nb // bpg
    var y = Array[F32x16, R](fill=F32x16(0))
    var rec = wp.unsafe_offset(t * groups * group_bytes)
    var rows = param_int(p, P_M)
    for grp in range(groups):
        prefetch_next[R, rows_per_block[kind, two](), group_bytes](rows, rec, groups * group_bytes)
        var d_sb = F32x16(0)
        var dmin_sb = F32x16(0)
        comptime if hdr > 0:
            d_sb = _f16x16(rec, 0)
            dmin_sb = _f16x16(rec, 2 * TN)
        var blk = rec.unsafe_offset(hdr)
        comptime if PAIRS_PATH:
            # A loop, not unrolled: a super-block's 8 unrolled blocks of AVX2 code overflow the core's op cache.
            for bi in range(bpg):
                var dw = F32x16(0)
                var mw = F32x16(0)
                var sc_lo = I32x16(0)
                var sc_hi = I32x16(0)
                _block_scales[kind](d_sb, dmin_sb, blk, dw, mw, sc_lo, sc_hi)
                var b = grp * bpg + bi
                var at = row0 * row_words + b * (QK // 4)
                _block_rows_pairs[kind, R, two](y, blk, dw, mw, sc_lo, sc_hi, q1_words.unsafe_offset(at),
                                                q2_words.unsafe_offset(at), row_words, da, s, s_lo, s_f,
                                                b * stride + row0)
                blk = blk.unsafe_offset(blk_bytes)
        else:
            comptime for bi in range(bpg):
                var b = grp * bpg + bi
                var dw = F32x16(0)
                var mw = F32x16(0)
                var sc_lo = I32x16(0)
                var sc_hi = I32x16(0)
                _block_scales[kind](d_sb, dmin_sb, blk, dw, mw, sc_lo, sc_hi)
                var w = _unpack[kind](blk)
                comptime for r in range(R):
                    var row = row0 + r
                    var a = qa.unsafe_offset(row * k + b * QK).unsafe_load[width=QK]()
                    var a2 = SIMD[DType.int8, QK](0)
                    comptime if two:
                        a2 = qa2.unsafe_offset(row * k + b * QK).unsafe_load[width=QK]()
                    var j = b * stride + row
                    y[r] = _block_row[kind, two](y[r], w, dw, mw, sc_lo, sc_hi, a, a2, da[unsafe_offset=j],
                                                 s[unsafe_offset=j], s_lo[unsafe_offset=j], s_f[unsafe_offset=j])
                blk = blk.unsafe_offset(blk_bytes)
        rec = rec.unsafe_offset(group_bytes)
    comptime for r in range(R):
        _finish_row[out_dt](p, y[r], row0 + r, t)


def _row_groups[kind: Int, out_dt: DType, two: Bool](p: Params, t: Int, start: Int, end: Int):
    """Rows start .. end-1 of tile t, grouped by row_groups.mojo's rule."""
    @always_inline
    def rows[n: Int](p: Params, t: Int, r: Int):
        _tile_rows[kind, out_dt, n, two](p, t, r)

    row_groups[rows_per_block[kind, two](), rows](p, t, start, end)


def _tiles[kind: Int, out_dt: DType, two: Bool](p: Params, begin: Int, end: Int):
    var m = param_int(p, 4)
    # Rows in chunks that keep their int8 activations in cache while the thread's tiles pass over them.
    var chunk = row_chunk[two](param_int(p, P_K))
    var r0 = 0
    while r0 < m:
        var r1 = min(r0 + chunk, m)
        for t in range(begin, end):
            _row_groups[kind, out_dt, two](p, t, r0, r1)
        r0 = r1


# ----- phase 2 on AMX tiles ----------------------------------------------------------------------------


@always_inline
def _group_bytes[kind: Int]() -> Int:
    return header_bytes[kind]() + blocks_per_group[kind]() * block_bytes[kind]()


@always_inline
def _sums_bytes[kind: Int]() -> Int:
    """Bytes of one block's int32 sums for 16 rows x 16 columns: C1 and C2, per half for Q6_K."""
    comptime if kind == KIND_Q6_K:
        return 4096
    else:
        return 2048


@always_inline
def _amx_sums[kind: Int, second: Bool, two: Bool](wb: Bytes, a1: Int, a2: Int, k: Int, sums: Bytes):
    """The exact int32 dot products of one block's 16 weight columns (wb: unpacked by _unpack_tile) with
    16 rows' q1 and q2 (at addresses a1 and a2, row stride k), stored to sums as [part, 16 rows, 16
    columns] int32, parts C1, C2 (whole block) or, for Q6_K, C1 and C2 of K-steps 0-15 then of 16-31.
    One part (`two` False): only the C1 tiles are computed and stored, and C2's places are left as they are.
    `second` picks the other tile set (amx_configure's *_NEXT), so that a block's products can run while
    the previous block's epilogue does; Q6_K's configuration has one set (its sums may still be issued
    before the previous epilogue: each tilezero waits for the last tilestore of its tile)."""
    comptime if kind == KIND_Q6_K:
        tile_load[TILE_B_LO](wb, 64)
        tile_load[TILE_B_HI](wb.unsafe_offset(256), 64)
        tile_zero[TILE_C1_LO]()
        tile_zero[TILE_C1_HI]()
        tile_load[TILE_A1_HALF](Bytes(unsafe_from_address=a1), k)
        tile_dot_su[TILE_C1_LO, TILE_A1_HALF, TILE_B_LO]()
        tile_load[TILE_A1_HALF](Bytes(unsafe_from_address=a1 + 16), k)
        tile_dot_su[TILE_C1_HI, TILE_A1_HALF, TILE_B_HI]()
        tile_store[TILE_C1_LO](sums, 64)
        tile_store[TILE_C1_HI](sums.unsafe_offset(2048), 64)
        comptime if two:
            tile_zero[TILE_C2_LO]()
            tile_zero[TILE_C2_HI]()
            tile_load[TILE_A2_HALF](Bytes(unsafe_from_address=a2), k)
            tile_dot_su[TILE_C2_LO, TILE_A2_HALF, TILE_B_LO]()
            tile_load[TILE_A2_HALF](Bytes(unsafe_from_address=a2 + 16), k)
            tile_dot_su[TILE_C2_HI, TILE_A2_HALF, TILE_B_HI]()
            tile_store[TILE_C2_LO](sums.unsafe_offset(1024), 64)
            tile_store[TILE_C2_HI](sums.unsafe_offset(3072), 64)
    else:
        comptime c1 = TILE_C1_NEXT if second else TILE_C1
        comptime c2 = TILE_C2_NEXT if second else TILE_C2
        tile_load[TILE_B](wb, 64)
        tile_load[TILE_A1](Bytes(unsafe_from_address=a1), k)
        tile_zero[c1]()
        tile_dot_su[c1, TILE_A1, TILE_B]()
        tile_store[c1](sums, 64)
        comptime if two:
            tile_load[TILE_A2](Bytes(unsafe_from_address=a2), k)
            tile_zero[c2]()
            tile_dot_su[c2, TILE_A2, TILE_B]()
            tile_store[c2](sums.unsafe_offset(1024), 64)


@always_inline
def _unpack_tile[kind: Int](tile_rec: Bytes, nb: Int, wtile: Bytes):
    """Every block of one tile's weights in the layout B tiles take (block b's 8 x 64 bytes at b * 512,
    row g = K-steps 4g..4g+3 of the 16 columns): once per tile and row chunk for all the chunk's row
    groups, and far enough ahead of the tile loads that they need not wait for these stores."""
    for b in range(nb):
        var w = _unpack[kind](_block_at[kind](tile_rec, b))
        comptime for g in range(8):
            wtile.unsafe_offset(b * 512 + g * 64).unsafe_store(w[g])


@always_inline
def _amx_epilogue[kind: Int, two: Bool](mut y: Array[F32x16, TN], tile_rec: Bytes, b: Int, buf: Int,
                             da: Pointer[Scalar[F32], MutAnyOrigin], s: Pointer[Scalar[DType.int32], MutAnyOrigin],
                             s_lo: Pointer[Scalar[DType.int32], MutAnyOrigin], s_f: Pointer[Scalar[F32], MutAnyOrigin],
                             j0: Int):
    """Block b's epilogue for the 16 rows of y, from the sums in buf (as _amx_sums left them), combined
    as _block_row combines them; j0 indexes row 0's per-block activation values."""
    var grp = tile_rec.unsafe_offset((b // blocks_per_group[kind]()) * _group_bytes[kind]())
    var blk = _block_at[kind](tile_rec, b)
    var d_sb = F32x16(0)
    var dmin_sb = F32x16(0)
    comptime if header_bytes[kind]() > 0:
        d_sb = _f16x16(grp, 0)
        dmin_sb = _f16x16(grp, 2 * TN)
    var dw = F32x16(0)
    var mw = F32x16(0)
    var sc_lo = I32x16(0)
    var sc_hi = I32x16(0)
    _block_scales[kind](d_sb, dmin_sb, blk, dw, mw, sc_lo, sc_hi)
    var sums = Pointer[Scalar[DType.int32], MutAnyOrigin](unsafe_from_address=buf)
    comptime for r in range(TN):
        var lo = sums.unsafe_offset(r * TN).unsafe_load[width=TN]()
        comptime if two:
            lo = combine_parts(lo, sums.unsafe_offset(256 + r * TN).unsafe_load[width=TN]())
        var hi = I32x16(0)
        comptime if kind == KIND_Q6_K:
            hi = sums.unsafe_offset(512 + r * TN).unsafe_load[width=TN]()
            comptime if two:
                hi = combine_parts(hi, sums.unsafe_offset(768 + r * TN).unsafe_load[width=TN]())
        var j = j0 + r
        y[r] = _block_epilogue[kind](y[r], lo, hi, dw, mw, sc_lo, sc_hi, da[unsafe_offset=j], s[unsafe_offset=j],
                                     s_lo[unsafe_offset=j], s_f[unsafe_offset=j])


@always_inline
def _block_at[kind: Int](tile_rec: Bytes, b: Int) -> Bytes:
    """Block b's record in a tile's records."""
    comptime bpg = blocks_per_group[kind]()
    return tile_rec.unsafe_offset((b // bpg) * _group_bytes[kind]() + header_bytes[kind]()
                                  + (b % bpg) * block_bytes[kind]())


def _tiles_amx[kind: Int, out_dt: DType, two: Bool](p: Params, begin: Int, end: Int):
    """Phase 2 on AMX tiles: per 16 columns x 16 rows x block, tdpbsud gives the exact int32 dot products
    of q1 and (int8x2) q2 (the same integers vpdpbusd sums), stored to a buffer and passed row by row through the
    same epilogue. Block b + 1's products are issued before block b's epilogue, into the other buffer, so
    the two overlap. Whole groups of 16 rows only; the last M % 16 rows take the vpdpbusd path: the same
    bits. Each thread unpacks its current tile's weights into a heap buffer (K / 32 x 512 bytes)."""
    var wp = param_ptr[DType.uint8](p, 2)
    var m = param_int(p, P_M)
    var k = param_int(p, P_K)
    var qa = param_int(p, P_Q1)  # addresses of q1 / q2 [M, K] int8
    var qa2 = param_int(p, P_Q2)
    var da = param_ptr[F32](p, P_D)
    var s = param_ptr[DType.int32](p, P_SUM)
    var s_lo = param_ptr[DType.int32](p, P_SUM_LO)
    var stride = param_int(p, P_BLOCK_STRIDE)
    var s_f = param_ptr[F32](p, P_SUM_F)
    var nb = k // QK
    var tile_bytes = (nb // blocks_per_group[kind]()) * _group_bytes[kind]()
    comptime sums_bytes = _sums_bytes[kind]()
    var wtile_mem = alloc[UInt8](nb * 512, alignment=64)  # one tile's unpacked weights: [nb, 8, 64]
    var wtile = Bytes(unsafe_from_address=Int(wtile_mem))
    var bufs = Int(stack_allocation[2 * sums_bytes, UInt8, alignment=64]())  # two blocks' sums
    comptime if kind == KIND_Q6_K:
        amx_configure_halves()
    else:
        amx_configure()
    var full = m - m % TN
    # Rows in chunks whose int8 activations (q1 and q2) stay in cache while the thread's tiles pass over
    # them; each tile's weights are unpacked once per chunk. The last chunk also runs the M % 16 rows.
    var chunk = amx_row_chunk(k)
    var r0 = 0
    while True:
        var r1 = min(r0 + chunk, full)
        for t in range(begin, end):
            var tile_rec = wp.unsafe_offset(t * tile_bytes)
            if r1 > r0:
                _unpack_tile[kind](tile_rec, nb, wtile)
            var g0 = r0
            while g0 < r1:
                var y = Array[F32x16, TN](fill=F32x16(0))
                var a0 = g0 * k
                _amx_sums[kind, False, two](wtile, qa + a0, qa2 + a0, k, Bytes(unsafe_from_address=bufs))
                var b = 0
                while b < nb:  # two blocks a turn: even ones into buffer 0 (tiles C1/C2), odd ones the others
                    if b + 1 < nb:
                        var a1 = a0 + (b + 1) * QK
                        _amx_sums[kind, True, two](wtile.unsafe_offset((b + 1) * 512), qa + a1, qa2 + a1, k,
                                              Bytes(unsafe_from_address=bufs + sums_bytes))
                    _amx_epilogue[kind, two](y, tile_rec, b, bufs, da, s, s_lo, s_f, b * stride + g0)
                    if b + 1 < nb:
                        if b + 2 < nb:
                            var a2 = a0 + (b + 2) * QK
                            _amx_sums[kind, False, two](wtile.unsafe_offset((b + 2) * 512), qa + a2, qa2 + a2, k,
                                                   Bytes(unsafe_from_address=bufs))
                        _amx_epilogue[kind, two](y, tile_rec, b + 1, bufs + sums_bytes, da, s, s_lo, s_f,
                                            (b + 1) * stride + g0)
                    b += 2
                comptime for r in range(TN):
                    _finish_row[out_dt](p, y[r], g0 + r, t)
                g0 += TN
            if r1 == full:
                _row_groups[kind, out_dt, two](p, t, full, m)
        if r1 == full:
            break
        r0 = r1
    amx_release()
    wtile_mem.unsafe_free()


def _tiles_out[kind: Int](p: Params, begin: Int, end: Int):
    if two_parts(p):
        _tiles_mode[kind, True](p, begin, end)
    else:
        _tiles_mode[kind, False](p, begin, end)


def _tiles_mode[kind: Int, two: Bool](p: Params, begin: Int, end: Int):
    var amx = param_int(p, 15) != 0
    if param_int(p, 13) == DTYPE_BF16:
        if amx:
            _tiles_amx[kind, BF16, two](p, begin, end)
        else:
            _tiles[kind, BF16, two](p, begin, end)
    else:
        if amx:
            _tiles_amx[kind, F32, two](p, begin, end)
        else:
            _tiles[kind, F32, two](p, begin, end)


def _tiles_any(p: Params, begin: Int, end: Int):
    var kind = param_int(p, 7)
    if kind == KIND_Q5_0:
        _tiles_out[KIND_Q5_0](p, begin, end)
    elif kind == KIND_Q5_1:
        _tiles_out[KIND_Q5_1](p, begin, end)
    elif kind == KIND_Q4_K:
        _tiles_out[KIND_Q4_K](p, begin, end)
    else:
        _tiles_out[KIND_Q6_K](p, begin, end)


def qmatmul(args: PythonObject) raises -> PythonObject:
    """Both phases on the calling thread. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    quantize_rows(p, 0, param_int(p, P_M))
    _tiles_any(p, 0, (param_int(p, 5) + TN - 1) // TN)
    return PythonObject(None)


@export
def mili_quantk_rows_range(params: Int, begin: Int, end: Int) abi("C"):
    """Phase 1 for activation rows [begin, end): entered from C by each thread of an OpenMP team."""
    quantize_rows(Params(unsafe_from_address=params), begin, end)


@export
def mili_quantk_tiles_range(params: Int, begin: Int, end: Int) abi("C"):
    """Phase 2 for column tiles [begin, end): entered from C by each thread of an OpenMP team."""
    _tiles_any(Params(unsafe_from_address=params), begin, end)
