# Intel AMX (TMUL) tile instructions for the quantized matmuls' many-row paths (kernels/quant_matmul.mojo,
# kernels/quant_kmatmul.mojo).
#
# The modules are built with `--target-features +amx-tile,+amx-int8` (kernels/builder/modules.py) so these intrinsics
# compile everywhere; they run only where the CPU has amx_int8 and the process was granted the tile data
# state (Linux: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), done once from Python,
# kernels/quant_matmul.py). Tile numbers are immediates, so they are compile-time parameters here.
#
# Two configurations, per 16 output columns x 16 activation rows:
# amx_configure: one 32-element block a step (every type whose scales hold for 32 weights):
#   tile 0, 1: C1, C2 = int32 [16 rows, 16 columns], the dot products of q1 and q2 (activations x weights)
#   tile 5, 6: the same for the next block (tiles are not renamed: a second set lets block b + 1's
#              products run while block b's sums go through the float epilogue)
#   tile 2, 3: A1, A2 = int8 [16 rows, 32 K], the rows' q1 / q2 for the block (row stride K bytes)
#   tile 4:    B = uint8 [8 K-groups, 16 columns x 4 K] weights in the VNNI layout the tile records hold
# amx_configure_halves: the two 16-element halves of a block apart (Q6_K, whose scales change every 16
# weights and whose halves' scaled sums may not add up exactly in int32):
#   tile 0, 1: C1, C2 of the first half; tile 2, 3: C1, C2 of the second half (int32 [16 rows, 16 columns])
#   tile 4, 5: A1, A2 = int8 [16 rows, 16 K], one half's q1 / q2 (loaded once per half)
#   tile 6, 7: B of the first and of the second half, uint8 [4 K-groups, 16 columns x 4 K]
# tdpbsud (signed A x unsigned B) sums exactly in int32, so C holds the same integers as the vpdpbusd path.
# With one-part int8 activations (quant_activations.mojo's ACT_INT8) only the q1 tiles run: A1 and C1 (A1_HALF,
# C1_LO, C1_HI), one tile product per block where two parts take two; the A2 / C2 tiles stay configured, unused.
#
# Both kernels run their rows in chunks whose int8 activations stay in the core's L2 while a thread's tiles
# pass over them (amx_row_chunk), and unpack each tile's weights into the B-tile layout once per chunk.

from std.sys import llvm_intrinsic
from std.memory import stack_allocation

comptime U8Ptr = Pointer[Scalar[DType.uint8], MutAnyOrigin]

# amx_configure's tiles
comptime TILE_C1 = 0
comptime TILE_C2 = 1
comptime TILE_A1 = 2
comptime TILE_A2 = 3
comptime TILE_B = 4
comptime TILE_C1_NEXT = 5
comptime TILE_C2_NEXT = 6

# amx_configure_halves' tiles
comptime TILE_C1_LO = 0
comptime TILE_C2_LO = 1
comptime TILE_C1_HI = 2
comptime TILE_C2_HI = 3
comptime TILE_A1_HALF = 4
comptime TILE_A2_HALF = 5
comptime TILE_B_LO = 6
comptime TILE_B_HI = 7


# The activation bytes (q1 and q2) one row chunk may hold: a quarter of a 2 MiB L2, leaving the rest for
# the tile's weights and the output rows.
comptime AMX_ACT_CACHE_BYTES = 512 * 1024


@always_inline
def amx_row_chunk(k: Int) -> Int:
    """Rows per chunk for activations of K int8 in two parts: whole groups of 16 rows, at least one."""
    return max(16, (AMX_ACT_CACHE_BYTES // (2 * k)) // 16 * 16)


@always_inline
def _load_config(rows: SIMD[DType.uint8, 8], colsb: SIMD[DType.uint16, 8]):
    """Loads a palette-1 configuration of tiles 0-7 (rows x bytes per row; 0 leaves a tile unused)."""
    var cfg = stack_allocation[64, UInt8, alignment=64]()
    var p = U8Ptr(unsafe_from_address=Int(cfg))
    for i in range(64):
        p[unsafe_offset=i] = 0
    p[unsafe_offset=0] = 1  # palette
    var cfg_colsb = Pointer[Scalar[DType.uint16], MutAnyOrigin](unsafe_from_address=Int(cfg) + 16)
    var cfg_rows = U8Ptr(unsafe_from_address=Int(cfg) + 48)
    comptime for t in range(8):
        cfg_colsb[unsafe_offset=t] = colsb[t]
        cfg_rows[unsafe_offset=t] = rows[t]
    llvm_intrinsic["llvm.x86.ldtilecfg", NoneType](p)


@always_inline
def amx_configure():
    """Loads the one-block-a-step configuration (tiles C1, C2, A1, A2, B, C1_NEXT, C2_NEXT) on the calling
    thread."""
    # Per tile number 0-7: rows, and bytes per row.
    _load_config(SIMD[DType.uint8, 8](16, 16, 16, 16, 8, 16, 16, 0),
                 SIMD[DType.uint16, 8](64, 64, 32, 32, 64, 64, 64, 0))


@always_inline
def amx_configure_halves():
    """Loads the half-block configuration (tiles *_LO, *_HI, *_HALF) on the calling thread."""
    _load_config(SIMD[DType.uint8, 8](16, 16, 16, 16, 16, 16, 4, 4),
                 SIMD[DType.uint16, 8](64, 64, 64, 64, 16, 16, 64, 64))


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
