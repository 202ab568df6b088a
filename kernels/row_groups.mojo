# How the quantized matmuls (quant_matmul.mojo, quant_kmatmul.mojo) split a tile's rows into groups that share
# each unpacked weight block: the rule in one place, each kernel's group of rows passed in.

from params import Params


@always_inline
def row_groups[R: Int, rows: def[n: Int](Params, Int, Int) thin -> None](p: Params, t: Int, start: Int, end: Int):
    """Rows start .. end-1 of tile t in groups of R (the kernel's rows per weight block), the rest in halving
    groups (6 rows of 4 a group run as 4 + 2, not 4 + 1 + 1): each group unpacks a weight block once for all its
    rows, and a few-row step (a speculating sequence's verification rows) pays few passes. rows[n](p, t, r) runs
    rows r .. r+n-1 of tile t; a row's arithmetic is the same in every group size, so its bits do not depend on
    the batch."""
    var r = start
    while r + R <= end:
        rows[R](p, t, r)
        r += R
    comptime if R >= 8:
        if r + 4 <= end:
            rows[4](p, t, r)
            r += 4
    comptime if R >= 4:
        if r + 2 <= end:
            rows[2](p, t, r)
            r += 2
    if r < end:
        rows[1](p, t, r)
