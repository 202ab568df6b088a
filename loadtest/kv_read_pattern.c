/* How fast this machine reads a paged KV cache in decode attention's order, with next to no arithmetic: the
 * memory side of the attention kernel's time, measured apart from its compute.
 *
 * The cache is MILI's CPU layout, [blocks, 16 tokens, 8 KV heads, 128 values] float16 (Qwen3-0.6B's KV heads),
 * blocks scattered at random as a long-running server leaves them; 32 sequences of 208 tokens over 28 layers, each
 * layer's K and V read once, as one decode step of 32 users reads them. Two orders, on every OpenMP thread:
 *   per (sequence, KV head): the attention kernel's work items: each reads its head's 256-byte rows, 2 KiB apart;
 *   per sequence: each reads its blocks whole, 32 KiB in address order.
 * Prints the best of 5 passes of each in GB/s.
 *
 *   mkdir -p build && clang-19 -O2 -mavx2 -fopenmp loadtest/kv_read_pattern.c -o build/kv_read_pattern
 *   OMP_NUM_THREADS=2 build/kv_read_pattern
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { TOKENS = 16, HEADS = 8, ROW = 128 * 2, BLOCK = TOKENS * HEADS * ROW, SEQS = 32, CONTEXT = 208, LAYERS = 28 };
enum { BLOCKS_PER_SEQ = CONTEXT / TOKENS };

static __m256i add_bytes(const char *p, int n, __m256i acc) {
    for (int i = 0; i < n; i += 32) acc = _mm256_add_epi32(acc, _mm256_loadu_si256((const __m256i *)(p + i)));
    return acc;
}

/* One decode step's reads; table[layer][seq][k or v][block] is a block's index in the cache. */
static long step(const char *cache, const int *table, int whole_blocks) {
    long sink = 0;
    for (int layer = 0; layer < LAYERS; layer++) {
        const int *tab = table + (long)layer * SEQS * 2 * BLOCKS_PER_SEQ;
        int items = whole_blocks ? SEQS : SEQS * HEADS;
#pragma omp parallel for schedule(static) reduction(+ : sink)
        for (int item = 0; item < items; item++) {
            int seq = whole_blocks ? item : item / HEADS, head = item % HEADS;
            __m256i acc = _mm256_setzero_si256();
            for (int kv = 0; kv < 2; kv++)
                for (int b = 0; b < BLOCKS_PER_SEQ; b++) {
                    const char *block = cache + (long)tab[(seq * 2 + kv) * BLOCKS_PER_SEQ + b] * BLOCK;
                    if (whole_blocks)
                        acc = add_bytes(block, BLOCK, acc);
                    else
                        for (int t = 0; t < TOKENS; t++) acc = add_bytes(block + (t * HEADS + head) * ROW, ROW, acc);
                }
            sink += _mm256_extract_epi32(acc, 0);
        }
    }
    return sink;
}

int main(void) {
    long n = (long)LAYERS * SEQS * 2 * BLOCKS_PER_SEQ;
    char *cache = aligned_alloc(4096, n * BLOCK);
    int *table = malloc(n * sizeof(int));
    memset(cache, 1, n * BLOCK);
    for (long i = 0; i < n; i++) table[i] = (int)i;
    srand(1);
    for (long i = n - 1; i > 0; i--) {
        long j = rand() % (i + 1);
        int t = table[i];
        table[i] = table[j];
        table[j] = t;
    }
    printf("%d threads, %.0f MB of K and V a step\n", omp_get_max_threads(), (double)n * BLOCK / 1e6);
    for (int whole = 0; whole < 2; whole++) {
        double best = 1e9;
        long sink = 0;
        for (int pass = 0; pass < 5; pass++) {
            double t0 = omp_get_wtime();
            sink += step(cache, table, whole);
            double t = omp_get_wtime() - t0;
            best = t < best ? t : best;
        }
        /* The sums are printed (as nothing) so that the compiler keeps the reads that make them. */
        printf("%-28s %6.1f ms  %5.1f GB/s%s\n", whole ? "per sequence, whole blocks" : "per (sequence, KV head)",
               best * 1e3, (double)n * BLOCK / best / 1e9, sink == 42 ? " " : "");
    }
    return 0;
}
