# Reducing 16 vectors of 16 lanes each to one vector of their 16 results (a sum or a maximum per vector), by a
# tree of shuffles: four levels, each combining pairs of vectors so that every output holds half as many
# lanes of each input's slot. Reducing each vector on its own costs a chain of shuffles per vector; the tree
# costs about three operations per vector in all. The attention kernel sums 16 keys' partial dot products into
# 16 scores (attention_chunks.mojo); the activation quantizer reduces 16 blocks' maxima and sums at once
# (quant_activations.mojo).
#
# The tree leaves slot j's result in lane bitrev4(j): a caller puts input i in slot bitrev4(i) to read input
# i's result in lane i. Sums of integers are exact; float sums are in the tree's order (fixed: the same bits
# for the same inputs).

comptime LANES = 16


@always_inline
def bitrev4(j: Int) -> Int:
    """The 4-bit reversal of j."""
    return ((j & 1) << 3) | ((j & 2) << 1) | ((j & 4) >> 1) | ((j & 8) >> 3)


@always_inline
def halves[level: Int, dt: DType](a: SIMD[dt, LANES], b: SIMD[dt, LANES]) -> Tuple[SIMD[dt, LANES], SIMD[dt, LANES]]:
    """One level of the tree: the two vectors to combine (by + or max), each with half as many lanes of each of
    a's and b's slots, interleaved."""
    comptime if level == 1:
        return (a.shuffle[0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23](b),
                a.shuffle[8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31](b))
    elif level == 2:
        return (a.shuffle[0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27](b),
                a.shuffle[4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31](b))
    elif level == 3:
        return (a.shuffle[0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29](b),
                a.shuffle[2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31](b))
    else:
        return (a.shuffle[0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30](b),
                a.shuffle[1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31](b))


@always_inline
def _combine[use_max: Bool, dt: DType](h: Tuple[SIMD[dt, LANES], SIMD[dt, LANES]]) -> SIMD[dt, LANES]:
    comptime if use_max:
        return max(h[0], h[1])
    else:
        return h[0] + h[1]


@always_inline
def _reduce[use_max: Bool, dt: DType](v: Array[SIMD[dt, LANES], LANES]) -> SIMD[dt, LANES]:
    var t = Array[SIMD[dt, LANES], 8](fill=SIMD[dt, LANES](0))
    comptime for i in range(8):
        t[i] = _combine[use_max](halves[1](v[2 * i], v[2 * i + 1]))
    var u = Array[SIMD[dt, LANES], 4](fill=SIMD[dt, LANES](0))
    comptime for i in range(4):
        u[i] = _combine[use_max](halves[2](t[2 * i], t[2 * i + 1]))
    var a = _combine[use_max](halves[3](u[0], u[1]))
    var b = _combine[use_max](halves[3](u[2], u[3]))
    return _combine[use_max](halves[4](a, b))


@always_inline
def level_sum[level: Int, dt: DType](a: SIMD[dt, LANES], b: SIMD[dt, LANES]) -> SIMD[dt, LANES]:
    """One level of lane_sums' tree on its own, for a caller that combines its inputs as they are produced
    (level 1: slots 2i and 2i+1; level l: two results of level l-1, in slot order). The same sums as lane_sums."""
    return _combine[False](halves[level](a, b))


@always_inline
def lane_sums[dt: DType](v: Array[SIMD[dt, LANES], LANES]) -> SIMD[dt, LANES]:
    """Lane i: the sum of the lanes of v[bitrev4(i)]."""
    return _reduce[False](v)


@always_inline
def lane_maxima[dt: DType](v: Array[SIMD[dt, LANES], LANES]) -> SIMD[dt, LANES]:
    """Lane i: the largest lane of v[bitrev4(i)]."""
    return _reduce[True](v)


@always_inline
def transpose16[dt: DType](mut v: Array[SIMD[dt, LANES], LANES]):
    """v[i][j] becomes v[j][i]: the tree's levels as a network of block swaps (level l swaps the off-diagonal
    blocks of side 16 >> l), with no sums."""
    comptime for level in range(1, 5):
        comptime side = LANES >> level
        comptime for i in range(LANES):
            comptime if i % (2 * side) < side:
                var h = halves[level](v[i], v[i + side])
                v[i] = h[0]
                v[i + side] = h[1]
