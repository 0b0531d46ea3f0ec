// The two limits the deployment-latency targets run into on an x86 CPU, measured: the float32
// FMA peak (AVX-512 where the compiler targets it, and AVX2) and the rate at which each core
// streams a weight slice that stays in its own L2 (the recurrent product at B=1 reads W_h once
// a step, split by columns among the cores). docs/performance.md quotes its output.
//
//   gcc -O3 -march=native -pthread scripts/cpu_limits.c -o cpu_limits && ./cpu_limits [THREADS]
//
// THREADS (default 2) run at once, one per core; SLICE_KIB (default 512: W_h of I=H=256 float32
// split over 2 cores) sets the slice each streams.
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ACCUMULATORS 12  // independent FMA chains: enough to cover latency x pipes
#define FMA_STEPS 3000000000L  // per thread: about a second, long enough to be steady

typedef void* (*Worker)(void*);

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}

// Run `worker` on `threads` threads at once; returns the seconds they took together.
static double timed(Worker worker, int threads) {
  pthread_t* th = malloc(sizeof(pthread_t) * threads);
  float* sink = calloc(threads, sizeof(float));
  double start = now();
  for (int i = 0; i < threads; ++i) pthread_create(&th[i], NULL, worker, &sink[i]);
  for (int i = 0; i < threads; ++i) pthread_join(th[i], NULL);
  double seconds = now() - start;
  free(th);
  free(sink);
  return seconds;
}

#define FMA_WORKER(NAME, VEC, SET1, FMA, LANES)                          \
  static void* NAME(void* out) {                                        \
    VEC acc[ACCUMULATORS];                                              \
    VEC b = SET1(1.0000001f), c = SET1(1e-7f);                          \
    for (int i = 0; i < ACCUMULATORS; ++i) acc[i] = SET1((float)i);     \
    for (long k = 0; k < FMA_STEPS / ACCUMULATORS; ++k)                 \
      for (int i = 0; i < ACCUMULATORS; ++i) acc[i] = FMA(acc[i], b, c); \
    float lanes[LANES], s = 0;                                          \
    for (int i = 0; i < ACCUMULATORS; ++i) {                            \
      memcpy(lanes, &acc[i], sizeof lanes);                             \
      s += lanes[0];                                                    \
    }                                                                   \
    *(float*)out = s;                                                   \
    return NULL;                                                        \
  }

FMA_WORKER(fma_avx2, __m256, _mm256_set1_ps, _mm256_fmadd_ps, 8)
#ifdef __AVX512F__
FMA_WORKER(fma_avx512, __m512, _mm512_set1_ps, _mm512_fmadd_ps, 16)
#endif

static size_t slice_bytes = 512 * 1024;
#define STREAM_PASSES 20000

#ifdef __AVX512F__
#define STREAM_VEC __m512
#define STREAM_LANES 16
#define STREAM_SET1 _mm512_set1_ps
#define STREAM_FMA(w, h, acc) _mm512_fmadd_ps(_mm512_load_ps(w), h, acc)
#else
#define STREAM_VEC __m256
#define STREAM_LANES 8
#define STREAM_SET1 _mm256_set1_ps
#define STREAM_FMA(w, h, acc) _mm256_fmadd_ps(_mm256_load_ps(w), h, acc)
#endif

// Stream this thread's slice STREAM_PASSES times with the widest vector loads (8 sums).
static void* stream_slice(void* out) {
  size_t n = slice_bytes / sizeof(float), step = 8 * STREAM_LANES;
  float* w = aligned_alloc(64, slice_bytes);
  for (size_t i = 0; i < n; ++i) w[i] = (float)i * 1e-9f;
  STREAM_VEC acc[8], h = STREAM_SET1(1.0f);
  for (int j = 0; j < 8; ++j) acc[j] = STREAM_SET1(0.0f);
  for (int r = 0; r < STREAM_PASSES; ++r)
    for (size_t i = 0; i + step <= n; i += step)
      for (int j = 0; j < 8; ++j) acc[j] = STREAM_FMA(w + i + STREAM_LANES * j, h, acc[j]);
  float lanes[STREAM_LANES], s = 0;
  for (int j = 0; j < 8; ++j) {
    memcpy(lanes, &acc[j], sizeof lanes);
    s += lanes[0];
  }
  *(float*)out = s;
  free(w);
  return NULL;
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? atoi(argv[1]) : 2;
  if (threads < 1 || threads > 1024) {
    fprintf(stderr, "usage: %s [THREADS in 1..1024]\n", argv[0]);
    return 2;
  }
  const char* kib = getenv("SLICE_KIB");
  if (kib && atol(kib) > 0) slice_bytes = (size_t)atol(kib) * 1024;
  double flops = 2.0 * (FMA_STEPS / ACCUMULATORS * ACCUMULATORS) * threads;
#ifdef __AVX512F__
  printf("FMA peak, AVX-512, %d threads: %.1f GFLOP/s\n", threads,
         flops * 16 / timed(fma_avx512, threads) / 1e9);
#endif
  printf("FMA peak, AVX2,    %d threads: %.1f GFLOP/s\n", threads,
         flops * 8 / timed(fma_avx2, threads) / 1e9);
  double seconds = timed(stream_slice, threads);
  printf("%zu KiB slice per thread, %d threads: %.1f GB/s, %.2f us per pass over all slices\n",
         slice_bytes / 1024, threads, (double)slice_bytes * threads * STREAM_PASSES / seconds / 1e9,
         seconds / STREAM_PASSES * 1e6);
  return 0;
}
