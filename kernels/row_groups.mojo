# How the quantized matmuls (quant_matmul.mojo, quant_kmatmul.mojo) split a tile's rows into groups that share
# each unpacked weight block: the rule in one place, each kernel's group of rows passed in; and which of those
# groups fetch the next tile's weights ahead (prefetch_next).

from std.sys.intrinsics import prefetch, PrefetchOptions
from params import Params


@always_inline
def row_groups[R: Int, rows: def[n: Int](Params, Int, Int) thin -> None](p: Params, t: Int, start: Int, end: Int):
    """Rows start .. end-1 of tile t in groups of R (the kernel's rows per weight block), the rest in groups of 4,
    2 and 1 below R (6 rows of 4 a group run as 4 + 2, not 4 + 1 + 1): each group unpacks a weight block once for
    all its rows, and a few-row step (a speculating sequence's verification rows) pays few passes. rows[n](p, t, r)
    runs rows r .. r+n-1 of tile t; a row's arithmetic is the same in every group size, so its bits do not depend
    on the batch."""
    var r = start
    while r + R <= end:
        rows[R](p, t, r)
        r += R
    comptime if R > 4:
        while r + 4 <= end:
            rows[4](p, t, r)
            r += 4
    comptime if R > 2:
        while r + 2 <= end:
            rows[2](p, t, r)
            r += 2
    while r < end:
        rows[1](p, t, r)
        r += 1


@always_inline
def prefetch_next[R: Int, full: Int, nbytes: Int](rows: Int, here: Pointer[Scalar[DType.uint8], MutAnyOrigin],
                                                  tile_bytes: Int):
    """For a group of R rows in a call of `rows` rows whose full groups take `full`: a software prefetch (into L2)
    of the nbytes at `here` in the next tile (tile_bytes on), one request per 64-byte line. Where a tile's rows take
    several groups, the first group would read the tile's weights from memory at the pace of its products (faster
    than one core's share of the bandwidth) and the later groups from L1; fetching the next tile's weights into L2
    meanwhile lets its first group find them there (Zen 4: the default model's Q8_0 head 1.37x at 8 rows and
    1.16x at 32; Qwen3-0.6B Q4_K_M decode steps at 32 rows 1.08-1.14x). Only full groups of a call with more rows
    than one group do it: one group alone (a few decode rows) is bound by the weights' bytes already, and the
    smaller groups carry no code for it."""
    comptime if R == full:
        if rows > R:
            comptime for line in range(0, nbytes, 64):
                prefetch[PrefetchOptions().for_read().medium_locality()](here.unsafe_offset(tile_bytes + line))
