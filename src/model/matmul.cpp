// src/model/matmul.cpp — y = x · Wᵀ, register-blocked dot products (see matmul.h).
//
// Structure (as a BLAS "NT" kernel, minus packing): the output is cut into tiles of
// kTokenTile tokens × kRowTile weight rows, distributed over the threads. Inside a tile, a
// micro-kernel computes MR tokens × NR weight rows at once: per step of one SIMD vector along
// the depth it loads NR weight vectors and MR token vectors and issues MR·NR fused multiply-adds
// into MR·NR vector accumulators, which are summed horizontally once at the end. The NR weight
// rows (a few KiB) stay in L1 while the tile's tokens stream from L2.
#include "model/matmul.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define CRISP_MODEL_X86 1
#endif
#if defined(_OPENMP)
#include <omp.h>
#endif

namespace crisp {
namespace model {
namespace {

// NOTE: tile of 48 tokens × 96 rows: the token rows of a tile (48 × depth × 4 bytes = 110 KiB at
// depth 576, 295 KiB at 1536) fit the 2 MiB L2 of one core beside the weights; both are multiples
// of every MR (6, 4) and NR (4, 3) below, so full tiles need no remainder kernels.
constexpr int64_t kTokenTile = 48;
constexpr int64_t kRowTile = 96;

using TileFn = void (*)(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                        int64_t ldy, int64_t tokens, int64_t rows, int64_t depth);

// ---------------------------------------------------------------- portable kernel
template <int MR, int NR>
void micro_portable(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
                    int64_t depth) {
  float acc[MR][NR] = {};
  for (int64_t p = 0; p < depth; ++p) {
    for (int i = 0; i < MR; ++i) {
      const float xv = x[i * ldx + p];
      for (int j = 0; j < NR; ++j) acc[i][j] += xv * w[j * ldw + p];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = acc[i][j];
}

void tile_portable(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
                   int64_t tokens, int64_t rows, int64_t depth) {
  constexpr int MR = 4, NR = 4;
  for (int64_t j = 0; j < rows; j += NR) {
    const int64_t nr = std::min<int64_t>(NR, rows - j);
    for (int64_t i = 0; i < tokens; i += MR) {
      const int64_t mr = std::min<int64_t>(MR, tokens - i);
      const float* xi = x + i * ldx;
      const float* wj = w + j * ldw;
      float* yij = y + i * ldy + j;
      if (mr == MR && nr == NR) {
        micro_portable<MR, NR>(xi, ldx, wj, ldw, yij, ldy, depth);
      } else {
        for (int64_t a = 0; a < mr; ++a)
          for (int64_t b = 0; b < nr; ++b) micro_portable<1, 1>(xi + a * ldx, ldx, wj + b * ldw, ldw, yij + a * ldy + b, ldy, depth);
      }
    }
  }
}

#if defined(CRISP_MODEL_X86) && defined(__GNUC__)
// Horizontal sums of one vector.
__attribute__((target("avx2"), always_inline)) inline float hsum256(__m256 v) {
  const __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  __m128 s = _mm_add_ps(lo, hi);
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// GCC 12 reports its own _mm512_undefined_ps() placeholder inside these intrinsics as an
// uninitialised read (a false positive of the header, not of this code): silenced here only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"), always_inline)) inline float hsum512(__m512 v) {
  const __m256 lo = _mm512_castps512_ps256(v);
  const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
  return hsum256(_mm256_add_ps(lo, hi));
}
#pragma GCC diagnostic pop

// ---------------------------------------------------------------- AVX-512 kernel
// NOTE: 6 tokens × 4 rows = 24 zmm accumulators + 4 weight vectors + 1 token vector = 29 of the
// 32 zmm registers; 10 loads feed 24 FMAs per step.
constexpr int kMr512 = 6, kNr512 = 4;

template <int MR, int NR>
__attribute__((target("avx512f"))) inline void micro_avx512(const float* x, int64_t ldx,
                                                             const float* w, int64_t ldw, float* y,
                                                             int64_t ldy, int64_t depth) {
  __m512 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t p = 0;
  for (; p + 16 <= depth; p += 16) {
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + j * ldw + p);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_loadu_ps(x + i * ldx + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
  if (p < depth) {  // depth not a multiple of 16: masked loads read only the valid lanes
    const __mmask16 mask = static_cast<__mmask16>((1u << (depth - p)) - 1u);
    __m512 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_maskz_loadu_ps(mask, w + j * ldw + p);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + i * ldx + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum512(acc[i][j]);
}

template <int NR>
__attribute__((target("avx512f"))) inline void micro_avx512_rows(const float* x, int64_t ldx,
                                                                  const float* w, int64_t ldw,
                                                                  float* y, int64_t ldy, int64_t mr,
                                                                  int64_t depth) {
  switch (mr) {
    case 6: micro_avx512<6, NR>(x, ldx, w, ldw, y, ldy, depth); break;
    case 5: micro_avx512<5, NR>(x, ldx, w, ldw, y, ldy, depth); break;
    case 4: micro_avx512<4, NR>(x, ldx, w, ldw, y, ldy, depth); break;
    case 3: micro_avx512<3, NR>(x, ldx, w, ldw, y, ldy, depth); break;
    case 2: micro_avx512<2, NR>(x, ldx, w, ldw, y, ldy, depth); break;
    default: micro_avx512<1, NR>(x, ldx, w, ldw, y, ldy, depth); break;
  }
}

__attribute__((target("avx512f"))) void tile_avx512(const float* x, int64_t ldx, const float* w,
                                                     int64_t ldw, float* y, int64_t ldy,
                                                     int64_t tokens, int64_t rows, int64_t depth) {
  for (int64_t j = 0; j < rows; j += kNr512) {
    const int64_t nr = std::min<int64_t>(kNr512, rows - j);
    for (int64_t i = 0; i < tokens; i += kMr512) {
      const int64_t mr = std::min<int64_t>(kMr512, tokens - i);
      const float* xi = x + i * ldx;
      const float* wj = w + j * ldw;
      float* yij = y + i * ldy + j;
      if (nr == kNr512) {
        micro_avx512_rows<kNr512>(xi, ldx, wj, ldw, yij, ldy, mr, depth);
      } else {
        for (int64_t b = 0; b < nr; ++b) micro_avx512_rows<1>(xi, ldx, wj + b * ldw, ldw, yij + b, ldy, mr, depth);
      }
    }
  }
}

// ---------------------------------------------------------------- AVX2 + FMA kernel
// NOTE: 4 tokens × 3 rows = 12 ymm accumulators + 3 weight vectors + 1 token vector = 16, all
// of AVX2's registers.
constexpr int kMr256 = 4, kNr256 = 3;


template <int MR, int NR>
__attribute__((target("avx2,fma"))) inline void micro_avx2(const float* x, int64_t ldx,
                                                            const float* w, int64_t ldw, float* y,
                                                            int64_t ldy, int64_t depth) {
  __m256 acc[MR][NR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= depth; p += 8) {
    __m256 wv[NR];
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) wv[j] = _mm256_loadu_ps(w + j * ldw + p);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 xv = _mm256_loadu_ps(x + i * ldx + p);
#pragma GCC unroll 8
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(xv, wv[j], acc[i][j]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < NR; ++j) {
      float s = hsum256(acc[i][j]);
      for (int64_t q = p; q < depth; ++q) s += x[i * ldx + q] * w[j * ldw + q];  // depth tail
      y[i * ldy + j] = s;
    }
  }
}

template <int NR>
__attribute__((target("avx2,fma"))) inline void micro_avx2_rows(const float* x, int64_t ldx,
                                                                 const float* w, int64_t ldw,
                                                                 float* y, int64_t ldy, int64_t mr,
                                                                 int64_t depth) {
  switch (mr) {
    case 4: micro_avx2<4, NR>(x, ldx, w, ldw, y, ldy, depth); break;
    case 3: micro_avx2<3, NR>(x, ldx, w, ldw, y, ldy, depth); break;
    case 2: micro_avx2<2, NR>(x, ldx, w, ldw, y, ldy, depth); break;
    default: micro_avx2<1, NR>(x, ldx, w, ldw, y, ldy, depth); break;
  }
}

__attribute__((target("avx2,fma"))) void tile_avx2(const float* x, int64_t ldx, const float* w,
                                                    int64_t ldw, float* y, int64_t ldy,
                                                    int64_t tokens, int64_t rows, int64_t depth) {
  for (int64_t j = 0; j < rows; j += kNr256) {
    const int64_t nr = std::min<int64_t>(kNr256, rows - j);
    for (int64_t i = 0; i < tokens; i += kMr256) {
      const int64_t mr = std::min<int64_t>(kMr256, tokens - i);
      const float* xi = x + i * ldx;
      const float* wj = w + j * ldw;
      float* yij = y + i * ldy + j;
      if (nr == kNr256) {
        micro_avx2_rows<kNr256>(xi, ldx, wj, ldw, yij, ldy, mr, depth);
      } else {
        for (int64_t b = 0; b < nr; ++b) micro_avx2_rows<1>(xi, ldx, wj + b * ldw, ldw, yij + b, ldy, mr, depth);
      }
    }
  }
}
#endif  // CRISP_MODEL_X86

struct Kernel {
  TileFn tile;
  const char* name;
};

Kernel pick_kernel() {
#if defined(CRISP_MODEL_X86) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {tile_avx512, "avx512"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {tile_avx2, "avx2"};
#endif
  return {tile_portable, "portable"};
}

const Kernel& kernel() {
  static const Kernel k = pick_kernel();
  return k;
}

}  // namespace

const char* matmul_kernel_name() { return kernel().name; }

void matmul_xwt(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y, int64_t ldy,
                int64_t tokens, int64_t rows, int64_t depth, int threads) {
  if (tokens <= 0 || rows <= 0) return;
  const TileFn tile = kernel().tile;
  const int64_t token_tiles = (tokens + kTokenTile - 1) / kTokenTile;
  const int64_t row_tiles = (rows + kRowTile - 1) / kRowTile;
  const int64_t tiles = token_tiles * row_tiles;
#if defined(_OPENMP)
  const int nthreads = threads > 0 ? threads : omp_get_max_threads();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads) if (tiles > 1)
#else
  (void)threads;
#endif
  for (int64_t t = 0; t < tiles; ++t) {
    // Consecutive tiles share their weight rows, so a thread's next tile finds them in cache.
    const int64_t rt = t / token_tiles, tt = t % token_tiles;
    const int64_t i0 = tt * kTokenTile, j0 = rt * kRowTile;
    tile(x + i0 * ldx, ldx, w + j0 * ldw, ldw, y + i0 * ldy + j0, ldy,
         std::min(kTokenTile, tokens - i0), std::min(kRowTile, rows - j0), depth);
  }
}

}  // namespace model
}  // namespace crisp
