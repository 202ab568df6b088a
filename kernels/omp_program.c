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

/* Chunks per thread of a phase taken from a shared counter: few enough that taking one costs nothing beside
 * its work, enough that the thread that finishes first waits for at most a small one. */
#define CHUNKS_PER_THREAD 8

/* The items taken in chunks from the counter *next, each thread taking the next chunk when it is done with
 * its last, so a thread slowed by anything (a busier core, a neighbour on the host, its items' cost) leaves
 * its remaining chunks to the others instead of making them wait at the barrier. Which thread computes an
 * item changes nothing in its result. */
static void run_taken(range_fn fn, long long params, long long n_items, long long *next) {
    long long chunk = n_items / (omp_get_num_threads() * CHUNKS_PER_THREAD);
    if (chunk < 1) chunk = 1;
    for (;;) {
        long long begin = __atomic_fetch_add(next, chunk, __ATOMIC_RELAXED);
        if (begin >= n_items) return;
        fn(params, begin, begin + chunk < n_items ? begin + chunk : n_items);
    }
}

/* Two phases in one parallel region: every thread finishes its share of the first before any starts
 * the second (the quantized matmul quantizes activation rows, then computes column tiles from them, the
 * tiles taken in chunks: run_taken). */
void mili_omp_run2(range_fn first, long long n_first, range_fn second, long long n_second, long long params) {
    long long next = 0;
#pragma omp parallel
    {
        run_share(first, params, n_first);
#pragma omp barrier
        run_taken(second, params, n_second, &next);
    }
}

/* A program: many phases in one parallel region, in order. phases: [n_phases][4] int64, each
 * (range entry, params address, work items, flags). Between two phases every thread waits for the others
 * (a barrier), unless the later phase has flag bit 0: it splits the same number of items as the one before
 * and each item reads only what the same item wrote there, so each thread may go on with its own share.
 * Flag bit 1: the phase's items are taken in chunks (run_taken) instead of split in equal shares; such a
 * phase's items may not rely on the thread that ran an item before, so it never has bit 0 or follows
 * itself with a bit-0 phase (kernels/omp_program.py checks both).
 * One call runs a whole decode step's layers (worker/runner/decode_program.py) instead of one call per kernel. */
void mili_omp_program(const long long *phases, long long n_phases) {
    long long next[n_phases];  /* each taken phase's counter, shared by the team */
    for (long long i = 0; i < n_phases; i++) next[i] = 0;
#pragma omp parallel
    {
        for (long long i = 0; i < n_phases; i++) {
            const long long *phase = phases + 4 * i;
            if (i > 0 && !(phase[3] & 1)) {
#pragma omp barrier
            }
            if (phase[3] & 2)
                run_taken((range_fn)phase[0], phase[1], phase[2], &next[i]);
            else
                run_share((range_fn)phase[0], phase[1], phase[2]);
        }
    }
}
