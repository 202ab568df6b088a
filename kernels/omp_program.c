/* Runs a Mojo kernel's work items on the process's OpenMP team.
 *
 * torch keeps its OpenMP worker threads spinning for a while after every parallel operator; a second
 * thread pool (Mojo's) started then competes with them for the cores. Entering the kernel from an
 * OpenMP parallel region instead hands the work to those same, already-running threads. Linked against
 * libgomp.so.1, which resolves to the copy torch has already loaded (same soname), so there is one
 * team; kernels/attention.py checks that before using it.
 */
#include <omp.h>

typedef void (*range_fn)(long long params, long long begin, long long end);

static void run_share(range_fn fn, long long params, long long n_items) {
    long long t = omp_get_thread_num(), nt = omp_get_num_threads();
    long long begin = n_items * t / nt, end = n_items * (t + 1) / nt;
    if (begin < end) fn(params, begin, end);
}

void mili_omp_run(range_fn fn, long long params, long long n_items) {
#pragma omp parallel
    run_share(fn, params, n_items);
}

/* Two phases in one parallel region: every thread finishes its share of the first before any starts
 * the second (the quantized matmul quantizes activation rows, then computes column tiles from them). */
void mili_omp_run2(range_fn first, long long n_first, range_fn second, long long n_second, long long params) {
#pragma omp parallel
    {
        run_share(first, params, n_first);
#pragma omp barrier
        run_share(second, params, n_second);
    }
}

/* A program: many phases in one parallel region, in order. phases: [n_phases][4] int64, each
 * (range entry, params address, work items, flags). Between two phases every thread waits for the others
 * (a barrier), unless the later phase has flag bit 0: it splits the same number of items as the one before
 * and each item reads only what the same item wrote there, so each thread may go on with its own share.
 * One call runs a whole decode step's layers (worker/runner/decode_program.py) instead of one call per kernel. */
void mili_omp_program(const long long *phases, long long n_phases) {
#pragma omp parallel
    {
        for (long long i = 0; i < n_phases; i++) {
            const long long *phase = phases + 4 * i;
            if (i > 0 && !(phase[3] & 1)) {
#pragma omp barrier
            }
            run_share((range_fn)phase[0], phase[1], phase[2]);
        }
    }
}
