# MILI's fused per-layer CPU kernels around the matmuls (checked entry points: kernels/layers.py).
#
# Each replaces a run of small torch operators with one pass over the rows:
#   rms_norm:      [residual += x;] dst = weight * norm(residual or x)        (5-6 torch ops)
#   rope_write_kv: q/k head norms (Qwen3), rotary on q and k, K and V into the paged cache  (~12 ops)
#   silu_mul:      dst = silu(gate) * up over the fused gate|up projection     (2 ops)
# Rounding follows transformers' bfloat16 modules step by step (every torch op rounds its result to
# the activation dtype; each intermediate here is rounded at the same points), so the fused path
# agrees with the reference as closely as the unfused one does. Math is float32 in between.
#
# Pointers, shapes and strides arrive as one int64 array (kernels/params.mojo); kernels/layers.py
# checks them first. Rows are independent, so a call may split its rows over threads (torch's OpenMP
# team, through kernels/omp_program.c) without changing any row's result.

from std.python import PythonObject
from std.python.bindings import PythonModuleBuilder
from std.os import abort
from std.math import exp, sqrt
from std.sys import simd_width_of
from numerics import narrow, round_to
from params import Params, param_int, param_ptr, param_float
from kv_int8 import I8, F16, CACHE_INT8, CACHE_F16, quantize_row, row_width, scale_offset, value_offset

comptime F32 = DType.float32
comptime BF16 = DType.bfloat16
comptime W = simd_width_of[F32]()  # 16 lanes with AVX-512
comptime W8 = 8  # every row length here is a multiple of 8

comptime DTYPE_F32 = 0
comptime DTYPE_BF16 = 1


@export
def PyInit_mili_layers() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("mili_layers")
        m.def_function[rms_norm]("rms_norm", docstring="optional residual add, then RMSNorm times weight")
        m.def_function[rope_write_kv]("rope_write_kv", docstring="q/k norm, rotary, K/V into the paged cache")
        m.def_function[silu_mul]("silu_mul", docstring="silu(gate) * up")
        return m.finalize()
    except e:
        abort(String("error creating module:", e))


@always_inline
def _round[dt: DType, w: Int](x: SIMD[F32, w]) -> SIMD[F32, w]:
    return round_to[dt, w](x)


@always_inline
def _load[dt: DType, w: Int](p: Pointer[Scalar[dt], MutAnyOrigin], i: Int) -> SIMD[F32, w]:
    return p.unsafe_offset(i).unsafe_load[width=w]().cast[F32]()


@always_inline
def _store[dt: DType, w: Int](p: Pointer[Scalar[dt], MutAnyOrigin], i: Int, x: SIMD[F32, w]):
    p.unsafe_offset(i).unsafe_store(narrow[dt, w](x))


def _sum_squares[dt: DType](x: Pointer[Scalar[dt], MutAnyOrigin], n: Int) -> Float32:
    var acc = SIMD[F32, W](0)
    var d = 0
    while d + W <= n:
        var v = _load[dt, W](x, d)
        acc += v * v
        d += W
    var total = acc.reduce_add()
    if d < n:
        var v = _load[dt, W8](x, d)
        total += (v * v).reduce_add()
    return total


def _norm_row[dt: DType](dst: Pointer[Scalar[dt], MutAnyOrigin], x: Pointer[Scalar[dt], MutAnyOrigin],
                         weight: Pointer[Scalar[dt], MutAnyOrigin], n: Int, eps: Float32):
    """dst = weight * dt(x * rsqrt(mean(x^2) + eps)), the product rounded again (transformers' RMSNorm)."""
    var inv = Float32(1) / sqrt(_sum_squares[dt](x, n) / Float32(n) + eps)
    var d = 0
    while d + W <= n:
        var normed = _round[dt, W](_load[dt, W](x, d) * inv)
        _store[dt, W](dst, d, normed * _load[dt, W](weight, d))
        d += W
    if d < n:
        var normed = _round[dt, W8](_load[dt, W8](x, d) * inv)
        _store[dt, W8](dst, d, normed * _load[dt, W8](weight, d))


def _rms_norm[dt: DType](args: Params, begin: Int, end: Int):
    var dst = param_ptr[dt](args, 0)
    var x = param_ptr[dt](args, 1)
    var residual = param_ptr[dt](args, 2)  # address 0: no residual add
    var weight = param_ptr[dt](args, 3)
    var rows = param_int(args, 4)
    var dim = param_int(args, 5)
    var eps = param_float(args, 6)
    var add = param_int(args, 2) != 0

    def row(r: Int) {imm dst, imm x, imm residual, imm weight, imm dim, imm eps, imm add}:
        var xr = x.unsafe_offset(r * dim)
        var src = xr
        if add:
            # residual = dt(residual + x): the decoder layer's `x = x + sublayer(x)`, kept for the next layer.
            src = residual.unsafe_offset(r * dim)
            var d = 0
            while d + W <= dim:
                _store[dt, W](src, d, _load[dt, W](src, d) + _load[dt, W](xr, d))
                d += W
            if d < dim:
                _store[dt, W8](src, d, _load[dt, W8](src, d) + _load[dt, W8](xr, d))
        _norm_row[dt](dst.unsafe_offset(r * dim), src, weight, dim, eps)

    for r in range(begin, end):
        row(r)


def _rms_norm_any(p: Params, begin: Int, end: Int):
    if param_int(p, 7) == DTYPE_BF16:
        _rms_norm[BF16](p, begin, end)
    else:
        _rms_norm[F32](p, begin, end)


def rms_norm(args: PythonObject) raises -> PythonObject:
    """Every row, on the calling thread. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    _rms_norm_any(p, 0, param_int(p, 4))
    return PythonObject(None)


@export
def mili_rms_norm_range(params: Int, begin: Int, end: Int) abi("C"):
    """Rows [begin, end) on the calling thread: entered from C by each thread of an OpenMP team."""
    _rms_norm_any(Params(unsafe_from_address=params), begin, end)


def _rope_head[dt: DType, ot: DType](dst: Pointer[Scalar[ot], MutAnyOrigin], src: Pointer[Scalar[dt], MutAnyOrigin],
                                     norm_w: Pointer[Scalar[dt], MutAnyOrigin], has_norm: Bool, eps: Float32,
                                     cos: Pointer[Scalar[F32], MutAnyOrigin],
                                     sin_signed: Pointer[Scalar[F32], MutAnyOrigin],
                                     tmp: Pointer[Scalar[F32], MutAnyOrigin], head_dim: Int):
    """dst = rope(norm(src)) for one head. NeoX rotary: x * cos + roll(x, half) * sin_signed, with the tables
    rounded to dt first and every product and the sum rounded to dt (transformers' order). dst is dt,
    float32 holding the same dt-rounded values (what an int8 cache row is quantized from), or float16."""
    var half = head_dim // 2
    if has_norm:
        var inv = Float32(1) / sqrt(_sum_squares[dt](src, head_dim) / Float32(head_dim) + eps)
        var d = 0
        while d < head_dim:
            var normed = _round[dt, W8](_load[dt, W8](src, d) * inv)
            tmp.unsafe_offset(d).unsafe_store(_round[dt, W8](normed * _load[dt, W8](norm_w, d)))
            d += W8
    else:
        var d = 0
        while d < head_dim:
            tmp.unsafe_offset(d).unsafe_store(_load[dt, W8](src, d))
            d += W8
    var d = 0
    while d < head_dim:
        var x = tmp.unsafe_offset(d).unsafe_load[width=W8]()
        var rolled = tmp.unsafe_offset((d + half) % head_dim).unsafe_load[width=W8]()
        var c = _round[dt, W8](cos.unsafe_offset(d).unsafe_load[width=W8]())
        var s = _round[dt, W8](sin_signed.unsafe_offset(d).unsafe_load[width=W8]())
        _store[ot, W8](dst, d, _round[dt, W8](_round[dt, W8](x * c) + _round[dt, W8](rolled * s)))
        d += W8


def _rope_write_kv[dt: DType, cdt: DType](args: Params, begin: Int, end: Int):
    """cdt: the cache's dtype: dt, int8 (then each K and V row is quantized as it is written) or float16 beside
    float32 (each value narrowed as it is written, numerics.narrow)."""
    var q_out = param_ptr[dt](args, 0)  # [tokens, heads, head_dim] contiguous
    var qkv = param_ptr[dt](args, 1)  # [tokens, qkv_stride]: q heads, k heads, v heads
    # K and V caches: params 2 and 3, [slots, kv_heads, row] in cdt (read below in the dtype of each path).
    var slots = param_ptr[DType.int64](args, 4)
    var positions = param_ptr[DType.int64](args, 5)
    var cos = param_ptr[F32](args, 6)  # [max_positions, head_dim] float32
    var sin_signed = param_ptr[F32](args, 7)
    var q_norm = param_ptr[dt](args, 8)  # address 0: no per-head norms
    var k_norm = param_ptr[dt](args, 9)
    var tokens = param_int(args, 10)
    var heads = param_int(args, 11)
    var kv_heads = param_int(args, 12)
    var head_dim = param_int(args, 13)
    var qkv_stride = param_int(args, 14)
    var eps = param_float(args, 15)
    var scratch = param_ptr[F32](args, 16)  # [tokens, 2 * head_dim] float32
    var has_norm = param_int(args, 8) != 0
    var block_size = param_int(args, 19)
    var kv_row = kv_heads * row_width[cdt](head_dim)  # a float cache's token: its heads' rows together

    def token(t: Int) {imm args, imm q_out, imm qkv, imm slots, imm positions, imm cos,
                       imm sin_signed, imm q_norm, imm k_norm, imm heads, imm kv_heads, imm head_dim,
                       imm qkv_stride, imm eps, imm scratch, imm has_norm, imm block_size, imm kv_row}:
        var src = qkv.unsafe_offset(t * qkv_stride)
        var pos = Int(positions[unsafe_offset=t])
        var c = cos.unsafe_offset(pos * head_dim)
        var s = sin_signed.unsafe_offset(pos * head_dim)
        var tmp = scratch.unsafe_offset(2 * t * head_dim)
        var rotated = tmp.unsafe_offset(head_dim)  # an int8 cache's K row before quantization
        for h in range(heads):
            _rope_head[dt, dt](q_out.unsafe_offset((t * heads + h) * head_dim), src.unsafe_offset(h * head_dim),
                               q_norm, has_norm, eps, c, s, tmp, head_dim)
        var slot = Int(slots[unsafe_offset=t])
        var k_src = src.unsafe_offset(heads * head_dim)
        var v_src = k_src.unsafe_offset(kv_heads * head_dim)
        comptime if cdt == I8:
            var k_i8 = param_ptr[I8](args, 2)
            var v_i8 = param_ptr[I8](args, 3)
            var page = slot // block_size
            var in_page = slot % block_size
            for h in range(kv_heads):
                _rope_head[dt, F32](rotated, k_src.unsafe_offset(h * head_dim), k_norm, has_norm, eps, c, s, tmp,
                                    head_dim)
                var at = value_offset[I8](page, in_page, h, block_size, kv_heads, head_dim)
                var scale_at = scale_offset[I8](page, in_page, h, block_size, kv_heads, head_dim)
                quantize_row[F32](k_i8.unsafe_offset(at), k_i8.unsafe_offset(scale_at), rotated, head_dim)
                quantize_row[dt](v_i8.unsafe_offset(at), v_i8.unsafe_offset(scale_at),
                                 v_src.unsafe_offset(h * head_dim), head_dim)
        else:
            var k_dst = param_ptr[cdt](args, 2)
            var v_dst = param_ptr[cdt](args, 3).unsafe_offset(slot * kv_row)
            for h in range(kv_heads):
                _rope_head[dt, cdt](k_dst.unsafe_offset(slot * kv_row + h * head_dim),
                                    k_src.unsafe_offset(h * head_dim), k_norm, has_norm, eps, c, s, tmp, head_dim)
            var d = 0
            while d < kv_row:
                comptime if cdt == dt:
                    var v = v_src.unsafe_offset(d).unsafe_load[width=W8]()
                    v_dst.unsafe_offset(d).unsafe_store(rebind[SIMD[cdt, W8]](v))
                else:
                    _store[cdt, W8](v_dst, d, _load[dt, W8](v_src, d))
                d += W8

    for t in range(begin, end):
        token(t)


def _rope_write_kv_any(p: Params, begin: Int, end: Int):
    var kind = param_int(p, 18)  # kv_int8.mojo's cache kinds
    if param_int(p, 17) == DTYPE_BF16:
        if kind == CACHE_INT8:
            _rope_write_kv[BF16, I8](p, begin, end)
        else:
            _rope_write_kv[BF16, BF16](p, begin, end)
    else:
        if kind == CACHE_INT8:
            _rope_write_kv[F32, I8](p, begin, end)
        elif kind == CACHE_F16:
            _rope_write_kv[F32, F16](p, begin, end)
        else:
            _rope_write_kv[F32, F32](p, begin, end)


def rope_write_kv(args: PythonObject) raises -> PythonObject:
    """Every row, on the calling thread. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    _rope_write_kv_any(p, 0, param_int(p, 10))
    return PythonObject(None)


@export
def mili_rope_write_kv_range(params: Int, begin: Int, end: Int) abi("C"):
    """Tokens [begin, end) on the calling thread: entered from C by each thread of an OpenMP team."""
    _rope_write_kv_any(Params(unsafe_from_address=params), begin, end)


def _silu_mul[dt: DType](args: Params, begin: Int, end: Int):
    var dst = param_ptr[dt](args, 0)  # [rows, inter]
    var gate_up = param_ptr[dt](args, 1)  # [rows, 2 * inter]: gate then up
    var rows = param_int(args, 2)
    var inter = param_int(args, 3)

    def row(r: Int) {imm dst, imm gate_up, imm inter}:
        var g_row = gate_up.unsafe_offset(r * 2 * inter)
        var u_row = g_row.unsafe_offset(inter)
        var o_row = dst.unsafe_offset(r * inter)
        var d = 0
        while d + W <= inter:
            var g = _load[dt, W](g_row, d)
            var act = _round[dt, W](g / (1 + exp(-g)))
            _store[dt, W](o_row, d, act * _load[dt, W](u_row, d))
            d += W
        if d < inter:
            var g = _load[dt, W8](g_row, d)
            var act = _round[dt, W8](g / (1 + exp(-g)))
            _store[dt, W8](o_row, d, act * _load[dt, W8](u_row, d))

    for r in range(begin, end):
        row(r)


def _silu_mul_any(p: Params, begin: Int, end: Int):
    if param_int(p, 4) == DTYPE_BF16:
        _silu_mul[BF16](p, begin, end)
    else:
        _silu_mul[F32](p, begin, end)


def silu_mul(args: PythonObject) raises -> PythonObject:
    """Every row, on the calling thread. args: (address of the int64 parameter array,)."""
    var p = Params(unsafe_from_address=Int(py=args[0]))
    _silu_mul_any(p, 0, param_int(p, 2))
    return PythonObject(None)


@export
def mili_silu_mul_range(params: Int, begin: Int, end: Int) abi("C"):
    """Rows [begin, end) on the calling thread: entered from C by each thread of an OpenMP team."""
    _silu_mul_any(Params(unsafe_from_address=params), begin, end)
