// The two limits lstm-tvm bench compares lstm_tvm with, measured on this machine
// (lstm_tvm/bench/limits.py builds and runs this file):
//
// - the float32 FMA peak: every thread runs independent chains of vector FMAs at the widest
//   vector width the compiler targets (GCC/Clang vector extensions: no intrinsics, so the same
//   file builds for x86-64 and AArch64);
// - the streaming rate of a weight slice per core: every thread sums its own slice (of the
//   recurrent weights W_h, split by columns among the cores) over and over; a slice that fits
//   the core's L2 streams at the L2's rate.
//
//   cc -O3 -march=native -ffp-contract=fast -pthread limits.c -o bench_limits
//   ./bench_limits THREADS SECONDS REPEATS [SLICE_BYTES ...]
//
// THREADS run at once, one per CPU of the process's affinity (Linux); each measurement lasts
// about SECONDS and the best of REPEATS is kept. Prints one JSON object on stdout.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__)
#define VBYTES 64
#define ISA "AVX-512"
#elif defined(__AVX2__)
#define VBYTES 32
#define ISA "AVX2"
#elif defined(__AVX__)
#define VBYTES 32
#define ISA "AVX"
#elif defined(__ARM_FEATURE_SVE_BITS) && __ARM_FEATURE_SVE_BITS > 128
#define VBYTES (__ARM_FEATURE_SVE_BITS / 8)
#define ISA "SVE"
#elif defined(__ARM_NEON) || defined(__aarch64__)
#define VBYTES 16
#define ISA "NEON"
#elif defined(__SSE2__)
#define VBYTES 16
#define ISA "SSE2"
#else
#define VBYTES 16
#define ISA "generic"
#endif

#if defined(__FMA__) || defined(__aarch64__) || defined(__ARM_FEATURE_FMA)
#define HAS_FMA 1
#else
#define HAS_FMA 0  // a*b+c is a multiply and an add: still two FLOPs a lane
#endif

typedef float vf __attribute__((vector_size(VBYTES), aligned(VBYTES)));
#define LANES (VBYTES / (int)sizeof(float))
#define CHAINS 12      // independent FMA chains: FMA latency x FMA pipes, with room to spare
#define SUMS 8         // independent sums in the streaming loop
#define MAX_SLICES 16

// A start line for every thread (pthread_barrier_t is missing on some systems).
typedef struct {
  pthread_mutex_t lock;
  pthread_cond_t go;
  int waiting, total;
} Barrier;

static void barrier_wait(Barrier* b) {
  pthread_mutex_lock(&b->lock);
  if (++b->waiting == b->total)
    pthread_cond_broadcast(&b->go);
  else
    while (b->waiting < b->total) pthread_cond_wait(&b->go, &b->lock);
  pthread_mutex_unlock(&b->lock);
}

typedef struct {
  int cpu;         // CPU to pin to, -1: not pinned
  long count;      // FMA steps (of CHAINS FMAs) or passes over the slice
  size_t bytes;    // the slice's size (streaming)
  const float* w;  // the slice (streaming)
  Barrier* start;
  double t0, t1;   // when this thread started and finished
  float sink;      // the result, so nothing is optimized away
  int pinned;
} Job;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void pin(Job* job) {
  job->pinned = 0;
#ifdef __linux__
  if (job->cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(job->cpu, &set);
    job->pinned = pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
  }
#endif
}

static float lane_sum(vf v) {
  float lanes[LANES], s = 0;
  memcpy(lanes, &v, sizeof lanes);
  for (int i = 0; i < LANES; ++i) s += lanes[i];
  return s;
}

// Hides `v`'s value from the compiler, in its register, so no product with it is hoisted.
static inline void opaque(vf* v) {
#if defined(__aarch64__) || defined(__arm__)
  __asm__("" : "+w"(*v));
#elif defined(__x86_64__) || defined(__i386__)
  __asm__("" : "+x"(*v));
#else
  __asm__("" : "+m"(*v));
#endif
}

static void fma_steps(Job* job) {
  vf acc[CHAINS], x, y;
  for (int i = 0; i < LANES; ++i) {
    x[i] = 1e-4f;
    y[i] = 1e-4f;
  }
  for (int i = 0; i < CHAINS; ++i) acc[i] = x * 0.0f + 1.0f + 0.01f * i;
  // acc += x * y with the accumulator as the FMA's addend: one instruction a step on every ISA
  // (AArch64's FMLA overwrites its addend); every value stays a normal float (without FMA,
  // acc * y + x tends to x / (1 - y)).
  for (long k = 0; k < job->count; ++k) {
#if HAS_FMA
    opaque(&y);
    for (int i = 0; i < CHAINS; ++i) acc[i] = acc[i] + x * y;
#else
    // A multiply and an add per chain: the product must not be shared among the chains.
    for (int i = 0; i < CHAINS; ++i) acc[i] = acc[i] * y + x;
#endif
  }
  float s = 0;
  for (int i = 0; i < CHAINS; ++i) s += lane_sum(acc[i]);
  job->sink = s;
}

static void stream_passes(Job* job) {
  const vf* w = (const vf*)job->w;
  size_t n = job->bytes / VBYTES;
  vf acc[SUMS];
  for (int j = 0; j < SUMS; ++j) acc[j] = w[0] * 0.0f;
  for (long r = 0; r < job->count; ++r) {
    for (size_t i = 0; i < n; i += SUMS)
      for (int j = 0; j < SUMS; ++j) acc[j] += w[i + j];
    __asm__ __volatile__("" ::: "memory");  // every pass reads the slice again
  }
  float s = 0;
  for (int j = 0; j < SUMS; ++j) s += lane_sum(acc[j]);
  job->sink = s;
}

static void* fma_thread(void* arg) {
  Job* job = arg;
  pin(job);
  barrier_wait(job->start);
  job->t0 = now();
  fma_steps(job);
  job->t1 = now();
  return NULL;
}

static void* stream_thread(void* arg) {
  Job* job = arg;
  pin(job);
  // The slice is written by the thread that reads it: it lies in that core's memory and caches.
  float* w = aligned_alloc(64, job->bytes);
  if (w == NULL) {
    barrier_wait(job->start);
    job->t0 = job->t1 = 0;
    return NULL;
  }
  for (size_t i = 0; i < job->bytes / sizeof(float); ++i) w[i] = (float)(i % 1000) * 1e-6f;
  job->w = w;
  long count = job->count;
  job->count = 1;  // one untimed pass brings the slice into the cache
  stream_passes(job);
  job->count = count;
  barrier_wait(job->start);
  job->t0 = now();
  stream_passes(job);
  job->t1 = now();
  free(w);
  job->w = NULL;
  return NULL;
}

static int cpus[1024], n_cpus;

// Run `body` on `threads` threads at once, each `count` times; returns the wall time from the
// first start to the last finish (-1 on failure) and whether every thread was pinned.
static double run(void* (*body)(void*), int threads, long count, size_t bytes, int* pinned) {
  Job jobs[1024];
  pthread_t th[1024];
  Barrier start = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, threads};
  for (int i = 0; i < threads; ++i) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].cpu = n_cpus ? cpus[i % n_cpus] : -1;
    jobs[i].count = count;
    jobs[i].bytes = bytes;
    jobs[i].start = &start;
  }
  for (int i = 0; i < threads; ++i) pthread_create(&th[i], NULL, body, &jobs[i]);
  for (int i = 0; i < threads; ++i) pthread_join(th[i], NULL);
  double t0 = 0, t1 = 0;
  *pinned = 1;
  for (int i = 0; i < threads; ++i) {
    if (jobs[i].t1 <= jobs[i].t0) return -1;
    if (i == 0 || jobs[i].t0 < t0) t0 = jobs[i].t0;
    if (i == 0 || jobs[i].t1 > t1) t1 = jobs[i].t1;
    *pinned &= jobs[i].pinned;
  }
  return t1 - t0;
}

// The count whose run on one thread takes about `seconds`: doubled from 1 until a run takes a
// tenth of it, then scaled.
static long calibrate(void* (*body)(void*), size_t bytes, double seconds) {
  int pinned;
  for (long count = 1;; count *= 2) {
    double t = run(body, 1, count, bytes, &pinned);
    if (t < 0) return -1;
    if (t >= seconds / 10 || count > (1L << 40)) {
      double scaled = count * seconds / t;
      return scaled < 1 ? 1 : (long)scaled;
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s THREADS SECONDS REPEATS [SLICE_BYTES ...]\n", argv[0]);
    return 2;
  }
  int threads = atoi(argv[1]), repeats = atoi(argv[3]), n_slices = argc - 4;
  double seconds = atof(argv[2]);
  if (threads < 1 || threads > 1024 || !(seconds > 0) || repeats < 1 || n_slices > MAX_SLICES) {
    fprintf(stderr, "%s: THREADS in 1..1024, SECONDS > 0, REPEATS >= 1, at most %d slices\n",
            argv[0], MAX_SLICES);
    return 2;
  }
#ifdef __linux__
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
    for (int c = 0; c < CPU_SETSIZE && n_cpus < 1024; ++c)
      if (CPU_ISSET(c, &allowed)) cpus[n_cpus++] = c;
#endif
  int pinned_all = 1, pinned;
  long steps = calibrate(fma_thread, 0, seconds);
  if (steps < 0) return 1;
  double flops = 2.0 * LANES * CHAINS * (double)steps * threads, best = 0;
  printf("{\"isa\": \"%s\", \"vector_bits\": %d, \"fma\": %s, \"threads\": %d, "
         "\"cpus\": %d, ",
         ISA, VBYTES * 8, HAS_FMA ? "true" : "false", threads, n_cpus);
  printf("\"fma_gflops\": [");
  for (int r = 0; r < repeats; ++r) {
    double t = run(fma_thread, threads, steps, 0, &pinned);
    if (t <= 0) return 1;
    pinned_all &= pinned;
    printf("%s%.6g", r ? ", " : "", flops / t / 1e9);
    if (flops / t / 1e9 > best) best = flops / t / 1e9;
  }
  printf("], \"fma_peak_gflops\": %.6g, \"stream\": [", best);
  for (int s = 0; s < n_slices; ++s) {
    // Whole groups of SUMS vectors; at least one.
    size_t group = (size_t)SUMS * VBYTES, asked = (size_t)atoll(argv[4 + s]);
    size_t bytes = (asked + group - 1) / group * group;
    if (bytes == 0) bytes = group;
    long passes = calibrate(stream_thread, bytes, seconds);
    if (passes < 0) return 1;
    double best_t = 0;
    printf("%s{\"slice_bytes\": %zu, \"passes\": %ld, \"pass_s\": [", s ? ", " : "", bytes,
           passes);
    for (int r = 0; r < repeats; ++r) {
      double t = run(stream_thread, threads, passes, bytes, &pinned);
      if (t <= 0) return 1;
      pinned_all &= pinned;
      printf("%s%.6g", r ? ", " : "", t / passes);
      if (best_t == 0 || t < best_t) best_t = t;
    }
    double pass_s = best_t / passes;
    printf("], \"best_pass_s\": %.6g, \"gbs_per_core\": %.6g, \"gbs\": %.6g}", pass_s,
           bytes / pass_s / 1e9, bytes * (double)threads / pass_s / 1e9);
  }
  printf("], \"pinned\": %s}\n", pinned_all ? "true" : "false");
  return 0;
}
