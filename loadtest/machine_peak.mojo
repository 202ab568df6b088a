# The machine's arithmetic peaks, for loadtest/bench_peak.py: each work item runs one instruction kind in a
# loop over independent accumulators, with nothing else in the loop, so the time is the instruction's
# throughput on one core. The matmul kernels' GOP/s are then read against these figures.
#
# Kinds (params[0]); operations counted as 2 per multiply-add, as GFLOP/s counts them:
#   0 int8:  vpdpbusd, 512-bit: 64 u8 x s8 products into 16 int32 lanes (the quantized matmuls' vnni path); on a
#            CPU without AVX-512 VNNI, the same integers as the matmuls compute them there (numerics.dpbusd:
#            vpmaddubsw, then vpmaddwd by ones and vpaddd, on two 256-bit halves)
#   1 bf16:  vdpbf16ps, 512-bit: 32 bfloat16 products into 16 float32 lanes (what oneDNN's bf16 linear runs)
#   2 fp32:  vfmadd, 512-bit: 16 float32 multiply-adds
#   3 amx:   tdpbsud on the quantized matmuls' tile shapes (kernels/quant_amx.mojo's amx_configure):
#            16 rows x 16 columns x 32 K int8 per tile product
#   5 int8 pairs: vpmaddubsw, 256-bit, into int16 lanes with vpaddw (2 x CHAINS chains): 32 u8 x s8 products (AVX2's int8 multiply
#            on its own, the rate a kernel that sums pairs in 16 bits before widening can approach)
#   4 read:  sums a buffer's bytes with 8 independent 512-bit accumulators: memory read bandwidth, when the
#            buffer is much larger than the caches (work item i reads bytes [i * size, (i + 1) * size))
# params: [kind, iterations, address of an int64 sink (one slot per work item), buffer address, size per work
# item (bytes, a multiple of 512)]. The sink takes a value computed from the accumulators, so the loop cannot
# be removed as dead.

from std.python import PythonObject
from std.python.bindings import PythonModuleBuilder
from std.os import abort
from std.sys import CompilationTarget, inlined_assembly, llvm_intrinsic
from std.memory import bitcast, stack_allocation
from numerics import dpbusd
from params import Params, param_int, param_ptr
from quant_amx import U8Ptr, amx_configure, amx_release, tile_dot_su, tile_load, tile_store, tile_zero

comptime I32x16 = SIMD[DType.int32, 16]
comptime F32x16 = SIMD[DType.float32, 16]
comptime BF16x32 = SIMD[DType.bfloat16, 32]
# Independent chains per loop: more than any core's latency x issue width needs (Zen 4: 2 pipes, latency 4;
# Sapphire Rapids: 2 ports, latency 5), so the loop is bound by throughput alone. AVX2 holds a 512-bit chain in
# two of its 16 registers: 6 chains leave room for the operands (Zen 3's FMA: 2 pipes, latency 3), where 16
# would spill to the stack and time the spills.
comptime CHAINS = 16 if CompilationTarget._has_feature["avx512f"]() else 6
comptime HAS_BF16 = CompilationTarget._has_feature["avx512bf16"]()

comptime KIND_INT8 = 0
comptime KIND_BF16 = 1
comptime KIND_FP32 = 2
comptime KIND_AMX = 3
comptime KIND_READ = 4
comptime KIND_INT8_PAIRS = 5
comptime I16x16 = SIMD[DType.int16, 16]
comptime READ_CHAINS = 8


@export
def PyInit_mili_peak() abi("C") -> PythonObject:
    try:
        var m = PythonModuleBuilder("mili_peak")
        m.def_function[peak]("peak", docstring="one instruction kind's loop, on the calling thread")
        m.def_function[chains]("chains", docstring="the loops' independent accumulators, as this build chose")
        return m.finalize()
    except e:
        abort(String("error creating module:", e))


@always_inline
def _opaque(v: SIMD[DType.uint8, 32]) -> SIMD[DType.uint8, 32]:
    """v, which the compiler can no longer see through: a loop over operands it knows would otherwise be folded
    (AVX2's multiply-adds are not opaque intrinsics as vpdpbusd is; LLVM hoists and sums them)."""
    return inlined_assembly["", SIMD[DType.uint8, 32], constraints="=x,0", has_side_effect=True](v)


def _int8(iterations: Int, seed: Int) -> Int:
    var half = SIMD[DType.uint8, 32](UInt8(seed & 0x3F))
    var b = SIMD[DType.int8, 64](Int8((seed * 7) & 0x1F))
    var acc = Array[I32x16, CHAINS](fill=I32x16(0))
    for _ in range(iterations):
        comptime for j in range(CHAINS):  # each chain's operand opaque apart, or one product serves them all
            acc[j] = dpbusd[True](acc[j], _opaque(half).join(_opaque(half)), b)
    var total = I32x16(0)
    comptime for j in range(CHAINS):
        total += acc[j]
    return Int(total.reduce_add())


def _int8_pairs(iterations: Int, seed: Int) -> Int:
    var a = SIMD[DType.uint8, 32](UInt8(seed & 0x3F))
    var b = SIMD[DType.int8, 32](Int8((seed * 7) & 0x1F))
    var acc = Array[I16x16, 2 * CHAINS](fill=I16x16(0))  # 256-bit chains: as many registers as the others
    for _ in range(iterations):
        comptime for j in range(2 * CHAINS):
            acc[j] += llvm_intrinsic["llvm.x86.avx2.pmadd.ub.sw", I16x16](bitcast[DType.int8, 32](_opaque(a)), b)
    var total = I16x16(0)
    comptime for j in range(2 * CHAINS):
        total += acc[j]
    return Int(total.cast[DType.int32]().reduce_add())


def _bf16(iterations: Int, seed: Int) -> Int:
    var a = BF16x32(Float32(seed & 7) * 0.001)
    var b = BF16x32(Float32(seed & 3) * 0.002)
    var acc = Array[F32x16, CHAINS](fill=F32x16(0))
    for _ in range(iterations):
        comptime for j in range(CHAINS):
            acc[j] = llvm_intrinsic["llvm.x86.avx512bf16.dpbf16ps.512", F32x16](acc[j], a, b)
    var total = F32x16(0)
    comptime for j in range(CHAINS):
        total += acc[j]
    return Int(total.reduce_add())


def _fp32(iterations: Int, seed: Int) -> Int:
    var a = F32x16(Float32(seed & 7) * 0.001)
    var b = F32x16(Float32(seed & 3) * 0.002)
    var acc = Array[F32x16, CHAINS](fill=F32x16(0))
    for _ in range(iterations):
        comptime for j in range(CHAINS):
            acc[j] = a.fma(b, acc[j])
    var total = F32x16(0)
    comptime for j in range(CHAINS):
        total += acc[j]
    return Int(total.reduce_add())


def _amx(iterations: Int, seed: Int) -> Int:
    """Four independent tile products a step (C1, C2, C1_NEXT, C2_NEXT of amx_configure), operands loaded once."""
    var buffer = stack_allocation[1024, UInt8, alignment=64]()
    var p = U8Ptr(unsafe_from_address=Int(buffer))
    for i in range(1024):
        p[unsafe_offset=i] = UInt8((seed + i) & 0x0F)
    amx_configure()
    tile_zero[0]()
    tile_zero[1]()
    tile_zero[5]()
    tile_zero[6]()
    tile_load[2](p, 32)
    tile_load[3](p, 32)
    tile_load[4](p, 64)
    for _ in range(iterations):
        tile_dot_su[0, 2, 4]()
        tile_dot_su[1, 3, 4]()
        tile_dot_su[5, 2, 4]()
        tile_dot_su[6, 3, 4]()
    tile_store[0](p, 64)
    amx_release()
    var total = 0
    for i in range(16):
        total += Int(p[unsafe_offset=i])
    return total


def _read(iterations: Int, base: Int, size: Int) -> Int:
    var acc = Array[I32x16, READ_CHAINS](fill=I32x16(0))
    var step = READ_CHAINS * 64
    for _ in range(iterations):
        for offset in range(0, size, step):
            var row = Pointer[Scalar[DType.int32], MutAnyOrigin](unsafe_from_address=base + offset)
            comptime for j in range(READ_CHAINS):
                acc[j] += row.unsafe_offset(16 * j).unsafe_load[width=16]()
    var total = I32x16(0)
    comptime for j in range(READ_CHAINS):
        total += acc[j]
    return Int(total.reduce_add())


def _run(p: Params, begin: Int, end: Int):
    var kind = param_int(p, 0)
    var iterations = param_int(p, 1)
    var sink = param_ptr[DType.int64](p, 2)
    for item in range(begin, end):
        var result: Int
        if kind == KIND_INT8:
            result = _int8(iterations, item + 1)
        elif kind == KIND_BF16:
            comptime if HAS_BF16:
                result = _bf16(iterations, item + 1)
            else:
                result = 0
        elif kind == KIND_INT8_PAIRS:
            result = _int8_pairs(iterations, item + 1)
        elif kind == KIND_FP32:
            result = _fp32(iterations, item + 1)
        elif kind == KIND_AMX:
            result = _amx(iterations, item + 1)
        else:
            var size = param_int(p, 4)
            result = _read(iterations, param_int(p, 3) + item * size, size)
        sink[unsafe_offset=item] = Int64(result)


def chains(args: PythonObject) raises -> PythonObject:
    """CHAINS as compiled: the compile target decides it, which a build for another CPU than this one may not share
    with this CPU's flags. args: ()."""
    return PythonObject(CHAINS)


def peak(args: PythonObject) raises -> PythonObject:
    """One work item on the calling thread. args: (address of the int64 parameter array,)."""
    _run(Params(unsafe_from_address=Int(py=args[0])), 0, 1)
    return PythonObject(None)


@export
def mili_peak_range(params: Int, begin: Int, end: Int) abi("C"):
    """Work items [begin, end) on the calling thread: entered from C by each thread of an OpenMP team."""
    _run(Params(unsafe_from_address=params), begin, end)
