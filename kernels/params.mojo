# Kernel arguments as one int64 array: addresses, sizes, and floats stored as their float64 bits.
#
# The same kernel can then be entered from Python (the array's address in a tuple) and, for a range
# of its rows or work items, from C on torch's OpenMP team (kernels/omp_program.c), which passes only
# integers. The Python side packs the arrays (kernels/attention.py, kernels/layers.py).

from std.memory import bitcast

comptime Params = Pointer[Scalar[DType.int64], MutAnyOrigin]


@always_inline
def param_int(p: Params, i: Int) -> Int:
    return Int(p[unsafe_offset=i])


@always_inline
def param_ptr[dt: DType](p: Params, i: Int) -> Pointer[Scalar[dt], MutAnyOrigin]:
    return Pointer[Scalar[dt], MutAnyOrigin](unsafe_from_address=param_int(p, i))


@always_inline
def param_float(p: Params, i: Int) -> Float32:
    return bitcast[DType.float64, 1](p[unsafe_offset=i]).cast[DType.float32]()
