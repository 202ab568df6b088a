# MILI's quantized-weight matmul for the CPU: y = x @ W.T (+ bias), W in llama.cpp's Q4_0, Q4_1 or Q8_0
# blocks of 32 weights, repacked once at load (kernels/formats/blocks.py) into 16-row tiles.
#
# Two phases, so a call can run on torch's OpenMP team with a barrier between them (kernels/omp_program.c):
#   1. quantize_rows (kernels/quant_activations.mojo, shared with quant_kmatmul.mojo): each activation row,
#      per 32-element block, in the server's activation mode (parameter 18): two int8 parts q1 (llama.cpp's
#      int8) and q2 (its residual in 1/254 steps), x ~= d * (254 q1 + q2), about 15 bits per activation
#      (int8x2); or q1 alone, x ~= d * q1 (int8). Plus the block's sum of q (what Q4_0's and Q8_0's
#      offsets and Q4_1's min need).
#   2. tiles: each 16-output-column tile, for every row. Per block, vpdpbusd (u8 weights x s8 q1, and in
#      int8x2 x s8 q2; 4 products summed per int32 lane) per 4 K-steps give the exact integer dot products
#      of 16 columns, combined exactly as 254 * dot1 + dot2 in int32 (int8x2) or dot1 itself (int8); the
#      float epilogue then adds d_w * d_a * (dot - offset * sum) (+ m_w * d_a * sum for Q4_1), blocks in
#      order. Decode reads each weight byte once for both parts, so int8x2's second vpdpbusd costs little
#      where weight bytes bound the time; many-row prefill is bound by the vpdpbusd themselves, so int8
#      (one per 4 K-steps) is about twice as fast there.
#      From 16 rows (parameter 15, kernels/quant_matmul.py's use_amx), AMX int8 tiles compute the same integers
#      for whole groups of 16 rows (kernels/quant_amx.mojo), which then go through the same epilogue.
#      Rows run in chunks whose q1 and q2 stay in cache; Q4_0 / Q4_1 tiles are unpacked into the B-tile
#      layout once per chunk (Q8_0's records are that layout already).
#
# Every output element is computed by the same instruction sequence whatever the batch size, the row's
# place in it or the thread that runs it: a request's result does not depend on what else is batched.
#
# Tile record per (16-column tile, K block), the layout the kernel streams linearly:
#   Q4_0: 256 B nibbles | 16 x f16 d             (288 B)   nibble byte (g*16 + c)*4 + j holds
#   Q4_1: 256 B nibbles | 16 x f16 d | 16 x f16 m (320 B)   q[c, 4g+j] low and q[c, 4(g+4)+j] high, g < 4
#   Q8_0: 512 B (q + 128) as u8 | 16 x f16 d     (544 B)   byte (g*16 + c)*4 + j holds q[c, 4g+j] + 128
# The unsigned weights make every format one u8 x s8 dot; Q8_0's +128 and Q4_0's 8 come back out as
# offset * sum_q. A CPU without AVX-512 VNNI computes the same integers on AVX2 (_block_rows_pairs): 4-bit
# weights' pair sums in int16 lanes, Q8_0's signed quants as magnitude and sign (numerics.signed_dots).

from std.python import PythonObject
from std.python.bindings import PythonModuleBuilder
from std.os import abort
from std.memory import alloc, bitcast, stack_allocation
from numerics import PAIRS_PATH, PAIRS_ROWS_ONE, PAIRS_ROWS_TWO, SIGNED_ROWS_ONE, SIGNED_ROWS_TWO, Floats, I16x32, \
    Ints, Words, add_pair_sums, add_signed_dots, dpbusd, high_nibbles, narrow, pair_span, widen_pairs, widen_parts
from params import Params, param_int, param_ptr
from row_groups import prefetch_next, row_groups
from quant_activations import P_BLOCK_STRIDE, P_D, P_K, P_M, P_Q1, P_Q2, P_SUM, P_SUM_F, combine_parts, \
    quantize_rows, row_chunk, two_parts
from quant_amx import TILE_A1, TILE_A2, TILE_B, TILE_C1, TILE_C1_NEXT, TILE_C2, TILE_C2_NEXT, U8Ptr, amx_configure, \
    amx_release, amx_row_chunk, tile_dot_su, tile_load, tile_store, tile_zero

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime TN = 16  # output columns per tile: one zmm of int32 / float32 lanes
comptime QK = 32  # weights per block


@always_inline
def rows_per_block[kind: Int, two: Bool]() -> Int:
    """Activation rows sharing one unpacked weight block: their accumulators, dot-product chains and the
    block's 8 weight vectors fill the 32 zmm registers (two parts: 4 rows x (sum + 2 x 2 chains); one
    part: 8 rows x (sum + 1 chain), whose 8 independent chains hide vpdpbusd's latency). On AVX2 every kind
    takes the pairs path (_block_rows_pairs), one weight vector at a time, with numerics' row counts."""
    comptime if PAIRS_PATH:
        comptime if kind == KIND_Q8_0:
            return SIGNED_ROWS_TWO if two else SIGNED_ROWS_ONE
        return PAIRS_ROWS_TWO if two else PAIRS_ROWS_ONE
    return 4 if two else 8

# The output's row stride in elements (kernels/quant_operands.py: >= N, for a column slice of a wider output).
comptime P_LDC = 17

comptime DTYPE_F32 = 0
comptime DTYPE_BF16 = 1

comptime KIND_Q4_0 = 0
comptime KIND_Q4_1 = 1
comptime KIND_Q8_0 = 2

comptime I32x16 = SIMD[DType.int32, TN]
comptime F32x16 = SIMD[F32, TN]
comptime U8x64 = SIMD[DType.uint8, 64]


@export
def PyInit_mili_quant() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("mili_quant")
        m.def_function[qmatmul]("qmatmul", docstring="quantized-weight matmul, both phases on the calling thread")
        return m.finalize()
    except e:
        abort(String("error creating module:", e))


@always_inline
def record_bytes[kind: Int]() -> Int:
    comptime if kind == KIND_Q4_0:
        return 288
    elif kind == KIND_Q4_1:
        return 320
    else:
        return 544


@always_inline
def quant_bytes[kind: Int]() -> Int:
    comptime if kind == KIND_Q8_0:
        return 512
    else:
        return 256


@always_inline
def _dpbusd[small: Bool](acc: I32x16, w: U8x64, a: I32x16) -> I32x16:
    """acc + per lane the sum of 4 products u8 w x s8 a (a's lanes are 4 packed int8); small: w < 128 (4-bit)."""
    return dpbusd[small](acc, w, bitcast[DType.int8, 64](a))


# ----- phase 2: 16-column tiles ------------------------------------------------------------------------


@always_inline
def _weights[kind: Int, g: Int](rec: Pointer[Scalar[DType.uint8], MutAnyOrigin]) -> U8x64:
    """The block's weight vector g: K-steps 4g..4g+3 of all 16 columns, as u8."""
    comptime if kind == KIND_Q8_0:
        return rec.unsafe_offset(g * 64).unsafe_load[width=64]()
    var v = rec.unsafe_offset((g % 4) * 64).unsafe_load[width=64]()
    comptime if g < 4:
        return v & 0x0F
    return high_nibbles(v)


@always_inline
def _unpack[kind: Int](rec: Pointer[Scalar[DType.uint8], MutAnyOrigin]) -> Array[U8x64, 8]:
    """The block's 8 weight vectors (_weights)."""
    var w = Array[U8x64, 8](fill=U8x64(0))
    comptime for g in range(8):
        w[g] = _weights[kind, g](rec)
    return w^


@always_inline
def _paired_sums[kind: Int, R: Int, two: Bool](rec: Pointer[Scalar[DType.uint8], MutAnyOrigin], a1: Words, a2: Words,
                                                row_words: Int) -> Array[I32x16, R]:
    """4-bit weights' block dots for R rows: each row's pair sums added in int16 lanes over the whole block (8
    vectors fit, numerics.pair_span) and widened once."""
    comptime assert pair_span(15) >= 8, "a 4-bit block's pair sums must fit int16 lanes"
    var pairs1 = Array[I16x32, R](fill=I16x32(0))
    var pairs2 = Array[I16x32, R](fill=I16x32(0))
    comptime for g in range(8):
        add_pair_sums[R, two, g](pairs1, pairs2, _weights[kind, g](rec), a1, a2, row_words)
    var dots = Array[I32x16, R](fill=I32x16(0))
    comptime for r in range(R):
        comptime if two:
            dots[r] = widen_parts(pairs1[r], pairs2[r])
        else:
            dots[r] = widen_pairs(pairs1[r])
    return dots^


@always_inline
def _signed_sums[R: Int, two: Bool](rec: Pointer[Scalar[DType.uint8], MutAnyOrigin], a1: Words, a2: Words,
                                    row_words: Int) -> Array[I32x16, R]:
    """Q8_0's block dots for R rows: the signed quants (stored + 128) through numerics.signed_dots, so the sums
    already lack the offset."""
    var dots = Array[I32x16, R](fill=I32x16(0))
    comptime for g in range(8):
        var q = bitcast[DType.int8, 64](_weights[KIND_Q8_0, g](rec) ^ 0x80)
        add_signed_dots[R, two, g](dots, bitcast[DType.uint8, 64](abs(q)), q, a1, a2, row_words)
    return dots^


@always_inline
def _block_rows_pairs[kind: Int, R: Int, two: Bool](mut y: Array[F32x16, R], rec: Pointer[Scalar[DType.uint8],
                                                   MutAnyOrigin], dw: F32x16, mw: F32x16, a1: Words, a2: Words,
                                                   row_words: Int, da: Floats, sa_i: Ints, sa_f: Floats, j0: Int):
    """y[r] plus one block's contribution for a group's R rows on a CPU without AVX-512 VNNI, each weight
    vector in turn: 4-bit weights' pair sums (_paired_sums) or Q8_0's magnitude and sign (_signed_sums).
    _block_dot's integers, and its epilogue: the same bits. a1, a2: the first row's q1 and q2 at this block, 4
    int8 K-steps a word, the rows row_words apart; da, sa_i, sa_f: the per-block arrays, the first row's value for
    this block at j0 (every address worked out once per block by the caller: a signed division per row and block
    cost 8-17% here)."""
    comptime eight_bit = kind == KIND_Q8_0
    var dots: Array[I32x16, R]
    comptime if eight_bit:
        dots = _signed_sums[R, two](rec, a1, a2, row_words)
    else:
        dots = _paired_sums[kind, R, two](rec, a1, a2, row_words)
    comptime for r in range(R):
        var j = j0 + r
        y[r] = _block_epilogue[kind, eight_bit](y[r], dots[r], dw, mw, da[unsafe_offset=j], sa_i[unsafe_offset=j],
                                                sa_f[unsafe_offset=j])


@always_inline
def _f16x16(p: Pointer[Scalar[DType.uint8], MutAnyOrigin], offset: Int) -> F32x16:
    return bitcast[DType.float16, TN](p.unsafe_offset(offset).unsafe_load[width=2 * TN]()).cast[F32]()


@always_inline
def _block_dot[two: Bool, small: Bool](w: Array[U8x64, 8], a: SIMD[DType.int8, QK], a2: SIMD[DType.int8, QK],
                                       start: I32x16) -> I32x16:
    """One block's exact integer dot products of 16 weight columns with one row's activations:
    254 * dot(w, q1) + dot(w, q2) (two parts; |.| <= 32 * 255 * 32385 < 2^31) or start + dot(w, q1) (one)."""
    var a32 = bitcast[DType.int32, 8](a)
    # Independent dependency chains (vpdpbusd's latency is ~5 cycles); integer sums, so exact in any order.
    var hi0 = I32x16(0)
    var hi1 = I32x16(0)
    comptime if two:
        var b32 = bitcast[DType.int32, 8](a2)
        var lo0 = I32x16(0)
        var lo1 = I32x16(0)
        comptime for g in range(0, 8, 2):
            hi0 = _dpbusd[small](hi0, w[g], I32x16(a32[g]))
            lo0 = _dpbusd[small](lo0, w[g], I32x16(b32[g]))
            hi1 = _dpbusd[small](hi1, w[g + 1], I32x16(a32[g + 1]))
            lo1 = _dpbusd[small](lo1, w[g + 1], I32x16(b32[g + 1]))
        return combine_parts(hi0 + hi1, lo0 + lo1)
    else:  # one chain from `start`: the rows of rows_per_block run theirs side by side
        hi0 = start
        comptime for g in range(8):
            hi0 = _dpbusd[small](hi0, w[g], I32x16(a32[g]))
        return hi0


@always_inline
def _offset_sum[kind: Int](s_i: Int32) -> Int32:
    """The stored quants' offset (Q4_0: 8, Q8_0: 128) times the activations' sum, which a block's dot
    product loses: |offset * s_i| <= 128 * 32 * 32258."""
    comptime if kind == KIND_Q4_0:
        return 8 * s_i
    elif kind == KIND_Q8_0:
        return 128 * s_i
    else:
        return 0


@always_inline
def _block_epilogue[kind: Int, corrected: Bool](y: F32x16, dot: I32x16, dw: F32x16, mw: F32x16, da: Float32,
                                                s_i: Int32, s_f: Float32) -> F32x16:
    """y plus one block's contribution given its exact integer dot product (_block_dot's), less the
    offset's sum unless `corrected` (the one-part vpdpbusd path starts its chain at minus that sum: the same
    int32). Both paths (vpdpbusd and AMX tiles) end here, so a row's float steps are the same whichever
    computed its sums."""
    var acc = dot
    comptime if not corrected:
        acc -= I32x16(_offset_sum[kind](s_i))
    var res = acc.cast[F32]().fma(dw * da, y)
    comptime if kind == KIND_Q4_1:
        res = mw.fma(F32x16(s_f), res)
    return res


def _store_tile[out_dt: DType](dst: Pointer[Scalar[out_dt], MutAnyOrigin], y: F32x16, count: Int):
    if count == TN:
        dst.unsafe_store(narrow[out_dt, TN](y))
    else:
        var narrowed = narrow[out_dt, TN](y)
        for c in range(count):
            dst[unsafe_offset=c] = narrowed[c]


def _tile_rows[kind: Int, out_dt: DType, R: Int, two: Bool](p: Params, t: Int, row0: Int):
    """Rows row0 .. row0+R-1 of tile t, every K block; each weight block is unpacked once for the R rows."""
    var wp = param_ptr[DType.uint8](p, 2)
    var k = param_int(p, P_K)
    var qa = param_ptr[DType.int8](p, P_Q1)
    var qa2 = param_ptr[DType.int8](p, P_Q2)
    var da = param_ptr[F32](p, P_D)
    var sa_i = param_ptr[DType.int32](p, P_SUM)
    var sa_f = param_ptr[F32](p, P_SUM_F)
    var stride = param_int(p, P_BLOCK_STRIDE)
    var nb = k // QK
    var row_words = k // 4  # the activations as 4 int8 K-steps a word (the pairs path)
    var q1_words = param_ptr[DType.int32](p, P_Q1)
    var q2_words = param_ptr[DType.int32](p, P_Q2)
    comptime rec_bytes = record_bytes[kind]()
    comptime qbytes = quant_bytes[kind]()
    var y = Array[F32x16, R](fill=F32x16(0))
    var rec = wp.unsafe_offset(t * nb * rec_bytes)
    var rows = param_int(p, P_M)
    for b in range(nb):
        prefetch_next[R, rows_per_block[kind, two](), rec_bytes](rows, rec, nb * rec_bytes)
        var dw = _f16x16(rec, qbytes)
        var mw = F32x16(0)
        comptime if kind == KIND_Q4_1:
            mw = _f16x16(rec, qbytes + 2 * TN)
        comptime if PAIRS_PATH:
            var at = row0 * row_words + b * (QK // 4)
            _block_rows_pairs[kind, R, two](y, rec, dw, mw, q1_words.unsafe_offset(at), q2_words.unsafe_offset(at),
                                            row_words, da, sa_i, sa_f, b * stride + row0)
        else:
            var w = _unpack[kind](rec)
            comptime for r in range(R):
                var row = row0 + r
                var a = qa.unsafe_offset(row * k + b * QK).unsafe_load[width=QK]()
                var a2 = SIMD[DType.int8, QK](0)
                comptime if two:
                    a2 = qa2.unsafe_offset(row * k + b * QK).unsafe_load[width=QK]()
                var j = b * stride + row
                var s_i = sa_i[unsafe_offset=j]
                # One part: the chain starts at minus the offset's sum (no subtraction in the epilogue).
                var dot = _block_dot[two, kind != KIND_Q8_0](w, a, a2, I32x16(-_offset_sum[kind](s_i)))
                y[r] = _block_epilogue[kind, not two](y[r], dot, dw, mw, da[unsafe_offset=j], s_i,
                                                      sa_f[unsafe_offset=j])
        rec = rec.unsafe_offset(rec_bytes)
    comptime for r in range(R):
        _finish_row[out_dt](p, y[r], row0 + r, t)


def _finish_row[out_dt: DType](p: Params, y: F32x16, row: Int, t: Int):
    """Adds the bias to one row's 16 columns of tile t and stores them."""
    var dst = param_ptr[out_dt](p, 0)  # [M, N] with row stride ldc (>= N: a column slice of a wider output)
    var bias = param_ptr[F32](p, 3)  # [N] or address 0
    var n = param_int(p, 5)
    var ldc = param_int(p, P_LDC)
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
    _store_tile[out_dt](dst.unsafe_offset(row * ldc + col0), v, count)


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


@always_inline
def _amx_block_sums[c1: Int, c2: Int, two: Bool](wb: U8Ptr, a1: Int, a2: Int, k: Int, sums: U8Ptr):
    """The exact int32 dot products of one block's 16 weight columns (wb: 8 x 64 bytes in the B-tile
    layout) with 16 rows' q1 and (two parts) q2, at addresses a1 and a2, row stride k, on tiles c1 and
    c2, stored to sums: [2, 16 rows, 16 columns] int32 (one part: only the first)."""
    tile_load[TILE_B](wb, 64)
    tile_load[TILE_A1](U8Ptr(unsafe_from_address=a1), k)
    tile_zero[c1]()
    tile_dot_su[c1, TILE_A1, TILE_B]()
    tile_store[c1](sums, 64)
    comptime if two:
        tile_load[TILE_A2](U8Ptr(unsafe_from_address=a2), k)
        tile_zero[c2]()
        tile_dot_su[c2, TILE_A2, TILE_B]()
        tile_store[c2](sums.unsafe_offset(1024), 64)


@always_inline
def _unpack_block[kind: Int](tile_rec: U8Ptr, wtile: U8Ptr, b: Int):
    """Block b of one tile's Q4_0 / Q4_1 weights as u8 in the layout B tiles take, at wtile + b * 512:
    row g = K-steps 4g..4g+3 of the 16 columns (low nibbles are K-groups 0-3, high 4-7)."""
    var w = _unpack[kind](tile_rec.unsafe_offset(b * record_bytes[kind]()))
    comptime for g in range(8):
        wtile.unsafe_offset(b * 512 + g * 64).unsafe_store(w[g])


@always_inline
def _block_weights[kind: Int](tile_rec: U8Ptr, wtile: U8Ptr, b: Int) -> U8Ptr:
    """Block b's weights in the B-tile layout: Q8_0's records hold them so already (u8, row stride 64);
    the 4-bit types' come from the tile's unpacked copy."""
    comptime if kind == KIND_Q8_0:
        return tile_rec.unsafe_offset(b * record_bytes[kind]())
    else:
        return wtile.unsafe_offset(b * 512)


@always_inline
def _amx_epilogue[kind: Int, two: Bool](mut y: Array[F32x16, TN], rec: U8Ptr, buf: Int,
                                        da: Pointer[Scalar[F32], MutAnyOrigin],
                                        sa_i: Pointer[Scalar[DType.int32], MutAnyOrigin],
                                        sa_f: Pointer[Scalar[F32], MutAnyOrigin], j0: Int):
    """One block's epilogue for the 16 rows of y, from the sums in buf (C1 then, two parts, C2, as
    tile_store left them), combined as _block_dot combines them; j0 indexes row 0's per-block values."""
    comptime qbytes = quant_bytes[kind]()
    var sums = Pointer[Scalar[DType.int32], MutAnyOrigin](unsafe_from_address=buf)
    var dw = _f16x16(rec, qbytes)
    var mw = F32x16(0)
    comptime if kind == KIND_Q4_1:
        mw = _f16x16(rec, qbytes + 2 * TN)
    comptime for r in range(TN):
        var dot = sums.unsafe_offset(r * TN).unsafe_load[width=TN]()
        comptime if two:
            dot = combine_parts(dot, sums.unsafe_offset(256 + r * TN).unsafe_load[width=TN]())
        y[r] = _block_epilogue[kind, False](y[r], dot, dw, mw, da[unsafe_offset=j0 + r], sa_i[unsafe_offset=j0 + r],
                                     sa_f[unsafe_offset=j0 + r])


# Blocks the first row group of a chunk unpacks ahead of its tile loads (at least 3: a turn issues the
# products of blocks b + 1 and b + 2), so that a tile load never waits for the stores just before it.
comptime UNPACK_LEAD = 4


def _group_amx[kind: Int, out_dt: DType, unpack: Bool, two: Bool](p: Params, t: Int, g0: Int, tile_rec: U8Ptr,
                                                                  wtile: U8Ptr, bufs: Int):
    """Rows g0 .. g0+15 of tile t on AMX tiles, every K block. Block b + 1's tiles are issued before
    block b's epilogue, on the other tile set and buffer, so the two overlap. With `unpack` (the chunk's
    first group, Q4_0 / Q4_1), the tile's weights are unpacked into wtile on the way, UNPACK_LEAD blocks
    ahead, for this group and the chunk's later ones."""
    var k = param_int(p, P_K)
    var qa = param_int(p, P_Q1)  # addresses of q1 / q2 [M, K] int8
    var qa2 = param_int(p, P_Q2)
    var da = param_ptr[F32](p, P_D)
    var sa_i = param_ptr[DType.int32](p, P_SUM)
    var sa_f = param_ptr[F32](p, P_SUM_F)
    var stride = param_int(p, P_BLOCK_STRIDE)
    var nb = k // QK
    comptime rec_bytes = record_bytes[kind]()
    comptime if unpack:
        for b in range(min(UNPACK_LEAD, nb)):
            _unpack_block[kind](tile_rec, wtile, b)
    var y = Array[F32x16, TN](fill=F32x16(0))
    var a0 = g0 * k
    _amx_block_sums[TILE_C1, TILE_C2, two](_block_weights[kind](tile_rec, wtile, 0), qa + a0, qa2 + a0, k,
                                      U8Ptr(unsafe_from_address=bufs))
    var b = 0
    while b < nb:  # two blocks a turn: even ones on tiles C1/C2 and buffer 0, odd ones on the others
        comptime if unpack:
            if b + UNPACK_LEAD < nb:
                _unpack_block[kind](tile_rec, wtile, b + UNPACK_LEAD)
            if b + 1 + UNPACK_LEAD < nb:
                _unpack_block[kind](tile_rec, wtile, b + 1 + UNPACK_LEAD)
        if b + 1 < nb:
            var a1 = a0 + (b + 1) * QK
            _amx_block_sums[TILE_C1_NEXT, TILE_C2_NEXT, two](_block_weights[kind](tile_rec, wtile, b + 1), qa + a1,
                                                        qa2 + a1, k, U8Ptr(unsafe_from_address=bufs + 2048))
        _amx_epilogue[kind, two](y, tile_rec.unsafe_offset(b * rec_bytes), bufs, da, sa_i, sa_f, b * stride + g0)
        if b + 1 < nb:
            if b + 2 < nb:
                var a2 = a0 + (b + 2) * QK
                _amx_block_sums[TILE_C1, TILE_C2, two](_block_weights[kind](tile_rec, wtile, b + 2), qa + a2, qa2 + a2,
                                                  k, U8Ptr(unsafe_from_address=bufs))
            _amx_epilogue[kind, two](y, tile_rec.unsafe_offset((b + 1) * rec_bytes), bufs + 2048, da, sa_i, sa_f,
                                (b + 1) * stride + g0)
        b += 2
    comptime for r in range(TN):
        _finish_row[out_dt](p, y[r], g0 + r, t)


def _tiles_amx[kind: Int, out_dt: DType, two: Bool](p: Params, begin: Int, end: Int):
    """Phase 2 on AMX tiles: per 16 columns x 16 rows x block, one tdpbsud per activation part gives
    the exact int32 dot products of q1 (and q2) (the same integers vpdpbusd sums), stored to a buffer and
    passed row by row through the same epilogue. Whole groups of 16 rows only (no per-row conditions in the epilogue);
    the last M % 16 rows take the vpdpbusd path: the same bits. Rows run in chunks whose int8
    activations stay in cache while the thread's tiles pass over them (amx_row_chunk); for Q4_0 / Q4_1
    each tile's weights are unpacked once per chunk, by its first row group, into a heap buffer (K / 32
    x 512 bytes per thread) that the chunk's other groups read."""
    var wp = param_ptr[DType.uint8](p, 2)
    var m = param_int(p, P_M)
    var k = param_int(p, P_K)
    var nb = k // QK
    comptime rec_bytes = record_bytes[kind]()
    comptime unpacked = kind != KIND_Q8_0
    var wtile_mem = alloc[UInt8](nb * 512 if unpacked else 64, alignment=64)  # [nb, 8, 64] u8
    var wtile = U8Ptr(unsafe_from_address=Int(wtile_mem))
    var bufs = Int(stack_allocation[4096, UInt8, alignment=64]())  # two sets of [C1 | C2] sums
    amx_configure()
    var full = m - m % TN
    var chunk = amx_row_chunk(k)
    var r0 = 0
    while True:  # row chunks; the last one also runs the M % 16 rows
        var r1 = min(r0 + chunk, full)
        for t in range(begin, end):
            var tile_rec = wp.unsafe_offset(t * nb * rec_bytes)
            var g0 = r0
            if g0 < r1:  # the chunk's first group unpacks the tile's weights (Q4_0 / Q4_1) for all of them
                _group_amx[kind, out_dt, unpacked, two](p, t, g0, tile_rec, wtile, bufs)
                g0 += TN
            while g0 < r1:
                _group_amx[kind, out_dt, False, two](p, t, g0, tile_rec, wtile, bufs)
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
    if kind == KIND_Q4_0:
        _tiles_out[KIND_Q4_0](p, begin, end)
    elif kind == KIND_Q4_1:
        _tiles_out[KIND_Q4_1](p, begin, end)
    else:
        _tiles_out[KIND_Q8_0](p, begin, end)


def qmatmul(args: PythonObject) raises -> PythonObject:
    """Both phases on the calling thread. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    quantize_rows(p, 0, param_int(p, P_M))
    _tiles_any(p, 0, (param_int(p, 5) + TN - 1) // TN)
    return PythonObject(None)


@export
def mili_quantize_rows_range(params: Int, begin: Int, end: Int) abi("C"):
    """Phase 1 for activation rows [begin, end): entered from C by each thread of an OpenMP team."""
    quantize_rows(Params(unsafe_from_address=params), begin, end)


@export
def mili_qmatmul_tiles_range(params: Int, begin: Int, end: Int) abi("C"):
    """Phase 2 for column tiles [begin, end): entered from C by each thread of an OpenMP team."""
    _tiles_any(Params(unsafe_from_address=params), begin, end)
