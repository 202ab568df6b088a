# Intel AMX (TMUL) tile instructions for the quantized matmul's many-row path (kernels/quant_matmul.mojo).
#
# The module is built with `--target-features +amx-tile,+amx-int8` (kernels/build.py) so these intrinsics
# compile everywhere; they run only where the CPU has amx_int8 and the process was granted the tile data
# state (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), done once from Python,
# kernels/mojo_quant.py). Tile numbers are immediates, so they are compile-time parameters here.
#
# The quantized matmul uses these tiles per 16 output columns x 16 activation rows x one 32-element block:
#   tile 0, 1: C1, C2 = int32 [16 rows, 16 columns], the dot products of q1 and q2 (activations x weights)
#   tile 5, 6: the same for the next block (tiles are not renamed: a second set lets block b + 1's
#              products run while block b's sums go through the float epilogue)
#   tile 2, 3: A1, A2 = int8 [16 rows, 32 K], the rows' q1 / q2 for the block (row stride K bytes)
#   tile 4:    B = uint8 [8 K-groups, 16 columns x 4 K] weights in the VNNI layout the tile records hold
# tdpbsud (signed A x unsigned B) sums exactly in int32, so C holds the same integers as the vpdpbusd path.

from std.sys import llvm_intrinsic
from std.memory import stack_allocation

comptime U8Ptr = Pointer[Scalar[DType.uint8], MutAnyOrigin]

comptime TILE_C1 = 0
comptime TILE_C2 = 1
comptime TILE_A1 = 2
comptime TILE_A2 = 3
comptime TILE_B = 4
comptime TILE_C1_NEXT = 5
comptime TILE_C2_NEXT = 6


@always_inline
def amx_configure():
    """Loads the palette-1 configuration of the five tiles above on the calling thread."""
    var cfg = stack_allocation[64, UInt8, alignment=64]()
    var p = U8Ptr(unsafe_from_address=Int(cfg))
    for i in range(64):
        p[unsafe_offset=i] = 0
    p[unsafe_offset=0] = 1  # palette
    var colsb = Pointer[Scalar[DType.uint16], MutAnyOrigin](unsafe_from_address=Int(cfg) + 16)
    var rows = U8Ptr(unsafe_from_address=Int(cfg) + 48)
    colsb[unsafe_offset=TILE_C1] = 64
    colsb[unsafe_offset=TILE_C2] = 64
    colsb[unsafe_offset=TILE_A1] = 32
    colsb[unsafe_offset=TILE_A2] = 32
    colsb[unsafe_offset=TILE_B] = 64
    colsb[unsafe_offset=TILE_C1_NEXT] = 64
    colsb[unsafe_offset=TILE_C2_NEXT] = 64
    rows[unsafe_offset=TILE_C1] = 16
    rows[unsafe_offset=TILE_C2] = 16
    rows[unsafe_offset=TILE_A1] = 16
    rows[unsafe_offset=TILE_A2] = 16
    rows[unsafe_offset=TILE_B] = 8
    rows[unsafe_offset=TILE_C1_NEXT] = 16
    rows[unsafe_offset=TILE_C2_NEXT] = 16
    llvm_intrinsic["llvm.x86.ldtilecfg", NoneType](p)


@always_inline
def amx_release():
    llvm_intrinsic["llvm.x86.tilerelease", NoneType]()


@always_inline
def tile_load[tile: Int](src: U8Ptr, stride: Int):
    llvm_intrinsic["llvm.x86.tileloadd64", NoneType](Int8(tile), src, Int64(stride))


@always_inline
def tile_store[tile: Int](dst: U8Ptr, stride: Int):
    llvm_intrinsic["llvm.x86.tilestored64", NoneType](Int8(tile), dst, Int64(stride))


@always_inline
def tile_zero[tile: Int]():
    llvm_intrinsic["llvm.x86.tilezero", NoneType](Int8(tile))


@always_inline
def tile_dot_su[c: Int, a: Int, b: Int]():
    """C[c] += A[a] (int8) x B[b] (uint8, VNNI layout), int32 sums of 4 products per step."""
    llvm_intrinsic["llvm.x86.tdpbsud", NoneType](Int8(c), Int8(a), Int8(b))
