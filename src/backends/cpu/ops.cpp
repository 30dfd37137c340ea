#include "backends/cpu/ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/panel.h"
#include "backends/cpu/simd.h"

// Vectorised over the innermost dimension with 16-lane AVX-512 (simd.h, gemm_kernels.h). Sums over
// a vector (norms, dot products) use matmul's canonical 16-lane order and reduction tree; sums over
// rows (keys, state rows, chunk tokens) run one fma per term in ascending order. Either way an
// element's arithmetic never depends on which other rows, heads or threads share the call.

namespace tf::cpu {
namespace {

using simd::kLanes;

// sum_d a[d] * b[d] in the canonical 16-lane order.
inline float dot(const float* a, const float* b, int64_t n) {
  kern::Vec acc = kern::vzero();
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes) acc = kern::fma(kern::load_x(a, d), kern::load_x(b, d), acc);
  if (d < n) {
    const auto m = kern::tail_mask(n - d);
    acc = kern::fma(kern::load_x_tail(a, d, m), kern::load_x_tail(b, d, m), acc);
  }
  return kern::hsum(acc);
}

// y[d] = x[d] * a (+ nothing else); in place ok.
inline void scale_row(const float* x, float a, int64_t n, float* y) {
  const auto av = simd::set1(a);
  for (int64_t d = 0; d < n; d += kLanes) {
    const auto m = simd::mask_for(n - d);
    simd::store(y + d, simd::mul(simd::load(x + d, m), av), m);
  }
}

// y[d] = fma(a, x[d], y[d]) over n.
inline void axpy(float a, const float* x, int64_t n, float* y) {
  const auto av = simd::set1(a);
  for (int64_t d = 0; d < n; d += kLanes) {
    const auto m = simd::mask_for(n - d);
    simd::store(y + d, simd::fma(av, simd::load(x + d, m), simd::load(y + d, m)), m);
  }
}

// Column blocks of 8 vectors (128 floats) kept in registers across a loop over rows.
constexpr int kBlockVecs = 8;
constexpr int64_t kBlock = kBlockVecs * kLanes;

struct BlockMasks {
  simd::M m[kBlockVecs];
  BlockMasks(int64_t j0, int64_t n) {
    for (int v = 0; v < kBlockVecs; ++v)
      m[v] = simd::mask_for(std::max<int64_t>(0, n - j0 - v * kLanes));
  }
};

}  // namespace

void rmsnorm_zc(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * dim;
    const float ss = dot(xr, xr, dim);
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    const auto rv = simd::set1(r), one = simd::set1(1.0f);
    float* yr = y + i * dim;
    for (int64_t d = 0; d < dim; d += kLanes) {
      const auto m = simd::mask_for(dim - d);
      const auto v =
          simd::mul(simd::mul(simd::load(xr + d, m), rv), simd::add(one, simd::load(w + d, m)));
      simd::store(yr + d, v, m);
    }
  }
}

void rmsnorm_gated(const float* x, const float* z, const float* w, int64_t n, int64_t dim,
                   float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * dim;
    const float* zr = z + i * dim;
    const float ss = dot(xr, xr, dim);
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    const auto rv = simd::set1(r);
    float* yr = y + i * dim;
    for (int64_t d = 0; d < dim; d += kLanes) {
      const auto m = simd::mask_for(dim - d);
      const auto xn = simd::mul(simd::load(xr + d, m), rv);
      const auto v =
          simd::mul(simd::mul(simd::load(w + d, m), xn), simd::silu(simd::load(zr + d, m)));
      simd::store(yr + d, v, m);
    }
  }
}

void l2norm_scale(float* x, int64_t n, int64_t dim, float eps, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    float* xr = x + i * dim;
    const float ss = dot(xr, xr, dim);
    const float r = 1.0f / std::sqrt(ss + eps);
    const auto rv = simd::set1(r), sv = simd::set1(scale);
    for (int64_t d = 0; d < dim; d += kLanes) {
      const auto m = simd::mask_for(dim - d);
      simd::store(xr + d, simd::mul(simd::mul(simd::load(xr + d, m), rv), sv), m);
    }
  }
}

int64_t argmax(const float* x, int64_t n) {
  if (n <= 1 || std::isnan(x[0])) return 0;  // nothing compares greater than a NaN x[0]
  // Lane j of 16 sees x[j], x[j + 16], ...: its largest value (strictly greater replaces, so the
  // first occurrence stays) and that value's index, starting from x[0] at index 0. Four 4-lane
  // vectors of GCC's vector extensions: SSE2 registers without -march=native (the device
  // machines' builds), joined by the compiler where AVX-512 is there. (One 16-lane vector was
  // slower than the scan without AVX-512; lanes written as arrays were left scalar.)
  using F4 = float __attribute__((vector_size(16)));
  using I4 = int32_t __attribute__((vector_size(16)));
  F4 val[4];
  I4 idx[4], cur[4];
  for (int v = 0; v < 4; ++v)
    for (int j = 0; j < 4; ++j) val[v][j] = x[0], idx[v][j] = 0, cur[v][j] = 4 * v + j;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int v = 0; v < 4; ++v) {
      F4 e;
      std::memcpy(&e, x + i + 4 * v, sizeof(e));
      const I4 gt = e > val[v];  // all ones where greater (never where e is NaN)
      val[v] = gt ? e : val[v];
      idx[v] = gt ? cur[v] : idx[v];
      cur[v] += 16;
    }
  }
  float best_v = x[0];
  int64_t best = 0;
  for (; i < n; ++i) {  // the tail, after every lane's elements: joined below by index
    if (x[i] > best_v) best_v = x[i], best = i;
  }
  // The largest value of the lanes and the tail, and the lowest index holding it.
  for (int v = 0; v < 4; ++v) {
    for (int j = 0; j < 4; ++j) {
      if (val[v][j] > best_v || (val[v][j] == best_v && idx[v][j] < best))
        best_v = val[v][j], best = idx[v][j];
    }
  }
  return best;
}

int64_t argmax_prob(const float* x, int64_t n, float* prob) {
  const int64_t best = argmax(x, n);
  const auto mv = simd::set1(x[best]);
  simd::V sum = simd::set1(0.0f);
  float e[kLanes];
  for (int64_t i = 0; i < n; i += kLanes) {
    // Through e[]: the lanes past n come back as 0 instead of e^(0 - max).
    const auto m = simd::mask_for(n - i);
    simd::store(e, simd::exp(simd::sub(simd::load(x + i, m), mv)), m);
    sum = simd::add(sum, simd::load(e, m));
  }
  *prob = 1.0f / kern::hsum(sum);
  return best;
}

void causal_conv_silu(const float* in, const float* w, int64_t T, int64_t C, int64_t K,
                      float* out) {
  std::vector<float> taps(K * kLanes);  // taps[j * 16 + l] = w[(c0 + l) * K + j]
  for (int64_t c0 = 0; c0 < C; c0 += kLanes) {
    const int64_t nc = std::min<int64_t>(kLanes, C - c0);
    const auto m = simd::mask_for(nc);
    for (int64_t j = 0; j < K; ++j)
      for (int64_t l = 0; l < kLanes; ++l)
        taps[j * kLanes + l] = l < nc ? w[(c0 + l) * K + j] : 0.0f;
    for (int64_t t = 0; t < T; ++t) {
      auto acc = simd::set1(0.0f);
      for (int64_t j = 0; j < K; ++j) {
        acc = simd::fma(simd::load(taps.data() + j * kLanes, m),
                        simd::load(in + (t + j) * C + c0, m), acc);
      }
      simd::store(out + t * C + c0, simd::silu(acc), m);
    }
  }
}

void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t rotary_dim,
               const float* inv_freq, int64_t pos) {
  const int64_t half = rotary_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    // fp32 angle, as transformers computes inv_freq[i] * pos in float32.
    const float ang = static_cast<float>(pos) * inv_freq[i];
    const float c = std::cos(ang), s = std::sin(ang);
    for (int64_t h = 0; h < n_heads; ++h) {
      float* xh = x + h * head_dim;
      const float a = xh[i], b = xh[i + half];
      xh[i] = a * c - b * s;
      xh[i + half] = b * c + a * s;
    }
  }
}

// For each of HP heads hh: o[hh][c] = inv[hh] * sum_j p[hh][j] v_j[c] over the NV vectors of one
// column block, one fma per key in ascending order, the accumulators held in registers across
// the keys and each value row loaded once for the HP heads.
template <int NV, int HP>
void attend_values(const float* const* p, int64_t L, const float* v, int64_t v_stride,
                   const BlockMasks& bm, const float* inv, float* const* o) {
  simd::V acc[HP][NV];
#pragma GCC unroll 8
  for (int hh = 0; hh < HP; ++hh)
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) acc[hh][u] = simd::set1(0.0f);
  for (int64_t j = 0; j < L; ++j) {
    const float* vr = v + j * v_stride;
    simd::V pj[HP];
#pragma GCC unroll 8
    for (int hh = 0; hh < HP; ++hh) pj[hh] = simd::set1(p[hh][j]);
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u) {
      const simd::V x = simd::load(vr + u * kLanes, bm.m[u]);
#pragma GCC unroll 8
      for (int hh = 0; hh < HP; ++hh) acc[hh][u] = simd::fma(pj[hh], x, acc[hh][u]);
    }
  }
#pragma GCC unroll 8
  for (int hh = 0; hh < HP; ++hh)
#pragma GCC unroll 8
    for (int u = 0; u < NV; ++u)
      simd::store(o[hh] + u * kLanes, simd::mul(acc[hh][u], simd::set1(inv[hh])), bm.m[u]);
}

// attend_values<NV, HP> for NV = 1 .. kBlockVecs, at NV - 1.
using AttendValues = void (*)(const float* const*, int64_t, const float*, int64_t,
                              const BlockMasks&, const float*, float* const*);
template <int HP, size_t... I>
constexpr std::array<AttendValues, sizeof...(I)> attend_values_table(std::index_sequence<I...>) {
  return {attend_values<static_cast<int>(I) + 1, HP>...};
}
template <int HP>
constexpr auto kAttendValues = attend_values_table<HP>(std::make_index_sequence<kBlockVecs>());

// Attention of token t's query heads h0 .. h0 + HP - 1 (one KV head kvh) over keys 0 .. L - 1,
// each head's arithmetic the same whatever HP: scores, 16 / HP keys x HP heads at a time, each
// key's lanes summed over d in ascending order and reduced by hsum's tree (hsum16), so p[j] =
// dot(q, k_j) * scale with dot's bits (past the last key the lanes repeat it and are not read);
// p = e^(s - max) summed in the canonical 16-lane order; then attend_values. HP > 1 loads each
// key and value row once for HP heads.
template <int HP>
void attend_heads(const float* q, int64_t L, const float* k_cache, const float* v_cache,
                  int64_t n_kv, int64_t kvh, int64_t D, float scale, float* out,
                  std::vector<float>* pbuf) {
  constexpr int kb = kLanes / HP;  // keys per block
  float m[HP];
  for (int hh = 0; hh < HP; ++hh) {
    pbuf[hh].resize(L);
    m[hh] = -INFINITY;
  }
  for (int64_t j0 = 0; j0 < L; j0 += kb) {
    const int n = static_cast<int>(std::min<int64_t>(kb, L - j0));
    const float* key[kb];
    for (int i = 0; i < kb; ++i) key[i] = k_cache + ((j0 + std::min(i, n - 1)) * n_kv + kvh) * D;
    kern::Vec acc[kLanes];  // [hh * kb + i]
#pragma GCC unroll 16
    for (int i = 0; i < kLanes; ++i) acc[i] = kern::vzero();
    int64_t d = 0;
    for (; d + kLanes <= D; d += kLanes) {
#pragma GCC unroll 16
      for (int i = 0; i < kb; ++i) {
        const kern::Vec kd = kern::load_x(key[i], d);
#pragma GCC unroll 4
        for (int hh = 0; hh < HP; ++hh)
          acc[hh * kb + i] = kern::fma(kern::load_x(q + hh * D, d), kd, acc[hh * kb + i]);
      }
    }
    if (d < D) {
      const auto tm = kern::tail_mask(D - d);
#pragma GCC unroll 16
      for (int i = 0; i < kb; ++i) {
        const kern::Vec kd = kern::load_x_tail(key[i], d, tm);
#pragma GCC unroll 4
        for (int hh = 0; hh < HP; ++hh)
          acc[hh * kb + i] = kern::fma(kern::load_x_tail(q + hh * D, d, tm), kd, acc[hh * kb + i]);
      }
    }
    float s[kLanes];
    kern::hsum16(acc, s);
    for (int hh = 0; hh < HP; ++hh) {
      for (int i = 0; i < n; ++i) {
        pbuf[hh][j0 + i] = s[hh * kb + i] * scale;
        m[hh] = std::max(m[hh], pbuf[hh][j0 + i]);
      }
    }
  }
  const float* p[HP];
  float inv[HP];
  float* o[HP];
  for (int hh = 0; hh < HP; ++hh) {
    float* ph = pbuf[hh].data();
    const auto mv = simd::set1(m[hh]);
    for (int64_t j = 0; j < L; j += kLanes) {
      const auto mk = simd::mask_for(L - j);
      simd::store(ph + j, simd::exp(simd::sub(simd::load(ph + j, mk), mv)), mk);
    }
    simd::V psum = simd::set1(0.0f);
    for (int64_t j = 0; j < L; j += kLanes)
      psum = simd::add(psum, simd::load(ph + j, simd::mask_for(L - j)));
    p[hh] = ph;
    inv[hh] = 1.0f / kern::hsum(psum);
  }
  // Blocks of up to 128 columns (stored once, not per key).
  for (int64_t c0 = 0; c0 < D; c0 += kBlock) {
    const BlockMasks bm(c0, D);
    for (int hh = 0; hh < HP; ++hh) o[hh] = out + hh * D + c0;
    const int64_t nv = (std::min(D - c0, kBlock) + kLanes - 1) / kLanes;
    kAttendValues<HP>[nv - 1](p, L, v_cache + kvh * D + c0, n_kv * D, bm, inv, o);
  }
}

void attention(const float* q, int64_t T, const int64_t* pos, const float* k_cache,
               const float* v_cache, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
               float* out, ThreadPool* pool) {
  const int64_t group = n_heads / n_kv;
  // Pairs of heads that share a KV head when there is work for every thread in pairs (prompts),
  // else one head a unit (a decode row's few heads spread over the threads). Same bits either way.
  const int threads = pool != nullptr ? pool->size() : 1;
  const int64_t hp = group % 2 == 0 && T * n_heads >= 8 * threads ? 2 : 1;
  auto run = [&](int64_t b, int64_t e) {
    std::vector<float> pbuf[2];
    for (int64_t u = b; u < e; ++u) {
      const int64_t th = u * hp, t = th / n_heads, h = th % n_heads, kvh = h / group;
      const int64_t at = (t * n_heads + h) * D;
      if (hp == 2)
        attend_heads<2>(q + at, pos[t] + 1, k_cache, v_cache, n_kv, kvh, D, scale, out + at, pbuf);
      else
        attend_heads<1>(q + at, pos[t] + 1, k_cache, v_cache, n_kv, kvh, D, scale, out + at, pbuf);
    }
  };
  const int64_t units = T * n_heads / hp;
  if (pool != nullptr && units > 1)
    pool->parallel_for(units, 1, run);
  else
    run(0, units);
}

void delta_rule_recurrent(const DeltaArgs& a, ThreadPool* pool) {
  const int64_t r = a.Hv / a.Hk, Dk = a.Dk, Dv = a.Dv;
  auto run = [&](int64_t hb, int64_t he) {
    for (int64_t h = hb; h < he; ++h) {
      float* S = a.S + h * Dk * Dv;  // [Dk, Dv]
      for (int64_t t = 0; t < a.T; ++t) {
        const float* q = a.q + (t * a.Hk + h / r) * Dk;
        const float* k = a.k + (t * a.Hk + h / r) * Dk;
        const float* v = a.v + (t * a.Hv + h) * Dv;
        float* o = a.out + (t * a.Hv + h) * Dv;
        const auto decay = simd::set1(std::exp(a.g[t * a.Hv + h]));
        const auto beta = simd::set1(a.beta[t * a.Hv + h]);
        // Per block of 128 value columns: kv = sum_i k_i (e^g S_i); d = beta (v - kv);
        // S_i = e^g S_i + k_i d; o = sum_i q_i S_i (new S), each sum one fma per i ascending.
        for (int64_t j0 = 0; j0 < Dv; j0 += kBlock) {
          const BlockMasks bm(j0, Dv);
          simd::V acc[kBlockVecs], dv[kBlockVecs];
          for (int u = 0; u < kBlockVecs; ++u) acc[u] = simd::set1(0.0f);
          for (int64_t i = 0; i < Dk; ++i) {
            const float* Si = S + i * Dv + j0;
            const auto ki = simd::set1(k[i]);
            for (int u = 0; u < kBlockVecs; ++u)
              acc[u] =
                  simd::fma(simd::mul(simd::load(Si + u * kLanes, bm.m[u]), decay), ki, acc[u]);
          }
          for (int u = 0; u < kBlockVecs; ++u) {
            dv[u] = simd::mul(beta, simd::sub(simd::load(v + j0 + u * kLanes, bm.m[u]), acc[u]));
            acc[u] = simd::set1(0.0f);
          }
          for (int64_t i = 0; i < Dk; ++i) {
            float* Si = S + i * Dv + j0;
            const auto ki = simd::set1(k[i]), qi = simd::set1(q[i]);
            for (int u = 0; u < kBlockVecs; ++u) {
              const auto s =
                  simd::fma(ki, dv[u], simd::mul(simd::load(Si + u * kLanes, bm.m[u]), decay));
              simd::store(Si + u * kLanes, s, bm.m[u]);
              acc[u] = simd::fma(s, qi, acc[u]);
            }
          }
          for (int u = 0; u < kBlockVecs; ++u) simd::store(o + j0 + u * kLanes, acc[u], bm.m[u]);
        }
        if (a.S_hist != nullptr) std::copy_n(S, Dk * Dv, a.S_hist + (t * a.Hv + h) * Dk * Dv);
      }
    }
  };
  if (pool != nullptr && a.Hv > 1)
    pool->parallel_for(a.Hv, 1, run);
  else
    run(0, a.Hv);
}

// One chunk of n tokens (local rows c0..c0+n) for head h. Notation of qwen3-next.md §5; every
// product below is one panel_gemm (one fma per term, ascending) or one canonical matmul dot.
static void delta_chunk(const DeltaArgs& a, int64_t h, int64_t c0, int64_t n, float* S,
                        std::vector<float>& buf) {
  const int64_t r = a.Hv / a.Hk, Dk = a.Dk, Dv = a.Dv, ldk = a.Hk * Dk, ldv = a.Hv * Dv;
  buf.resize(n * 3 + n * n * 4 + n * Dk * 3 + n * Dv * 2 + Dk * n);
  float* gam = buf.data();  // [n] cumulative log decay
  float* eg = gam + n;      // [n] e^gam
  float* dec = eg + n;      // [n] e^(gam_i - gam_j) of one row i
  float* KK = dec + n;      // [n, n] k_i . k_j (all pairs)
  float* QKf = KK + n * n;  // [n, n] q_i . k_j (all pairs)
  float* Tm = QKf + n * n;  // [n, n] strictly lower: A, then (I + A)^-1 - I
  float* QK = Tm + n * n;   // [n, n] (q_i . k_j) e^(gam_i - gam_j), j <= i, else 0
  float* KB = QK + n * n;   // [n, Dk] beta_j e^gam_j k_j
  float* W = KB + n * Dk;   // [n, Dk]
  float* QE = W + n * Dk;   // [n, Dk] e^gam_i q_i
  float* VB = QE + n * Dk;  // [n, Dv] beta_j v_j
  float* U = VB + n * Dv;   // [n, Dv] U, then Vn
  float* CK = U + n * Dv;   // [Dk, n] e^(gam_n - gam_j) k_j[d]
  const float* k0 = a.k + (c0 * a.Hk + h / r) * Dk;  // row i at k0 + i * ldk
  const float* q0 = a.q + (c0 * a.Hk + h / r) * Dk;
  const float* v0 = a.v + (c0 * a.Hv + h) * Dv;  // row i at v0 + i * ldv
  auto beta = [&](int64_t i) { return a.beta[(c0 + i) * a.Hv + h]; };

  float acc = 0;
  for (int64_t i = 0; i < n; ++i) {
    gam[i] = (acc += a.g[(c0 + i) * a.Hv + h]);
    eg[i] = std::exp(gam[i]);
  }
  // KK[i, j] = k_i . k_j, QKf[i, j] = q_i . k_j with matmul's kernel (rows of k as the "weights").
  const char* kw = reinterpret_cast<const char*>(k0);
  kern::gemm<DType::kF32>(kw, ldk * 4, Dk, 0, n, kern::XRows{k0, ldk, nullptr}, n, KK, n);
  kern::gemm<DType::kF32>(kw, ldk * 4, Dk, 0, n, kern::XRows{q0, ldk, nullptr}, n, QKf, n);
  // A_ij = beta_i (k_i . k_j) e^(gam_i - gam_j), i > j;  QK_ij = (q_i . k_j) e^(gam_i - gam_j).
  std::fill(Tm, Tm + 2 * n * n, 0.0f);  // Tm and QK: zero above the diagonal
  for (int64_t i = 0; i < n; ++i) {
    const auto gi = simd::set1(gam[i]);
    for (int64_t j = 0; j <= i; j += kLanes) {
      const auto m = simd::mask_for(i + 1 - j);
      simd::store(dec + j, simd::exp(simd::sub(gi, simd::load(gam + j, m))), m);
    }
    const float bi = beta(i);
    for (int64_t j = 0; j < i; ++j) Tm[i * n + j] = bi * KK[i * n + j] * dec[j];
    for (int64_t j = 0; j <= i; ++j) QK[i * n + j] = QKf[i * n + j] * dec[j];
  }
  // (I + A)^-1 = I + Tm by forward substitution, in place:
  // Tm_ij = -A_ij - sum_{j<m<i} A_im Tm_mj, as row vectors: Tm_i = -(A_i + sum_m A_im Tm_m).
  std::vector<float> row(n);
  for (int64_t i = 1; i < n; ++i) {
    std::copy_n(Tm + i * n, i, row.data());
    for (int64_t m = 1; m < i; ++m) axpy(Tm[i * n + m], Tm + m * n, m, row.data());
    for (int64_t j = 0; j < i; ++j) Tm[i * n + j] = -row[j];
  }
  // W = (I + Tm) diag(beta e^gam) K,  U = (I + Tm) diag(beta) V.
  for (int64_t j = 0; j < n; ++j) {
    scale_row(k0 + j * ldk, beta(j) * eg[j], Dk, KB + j * Dk);
    scale_row(v0 + j * ldv, beta(j), Dv, VB + j * Dv);
    scale_row(q0 + j * ldk, eg[j], Dk, QE + j * Dk);
  }
  panel_gemm(Tm, n, KB, Dk, KB, Dk, W, Dk, n, Dk, n);
  panel_gemm(Tm, n, VB, Dv, VB, Dv, U, Dv, n, Dv, n);
  // Vn = U - W S0;  O = diag(e^gam) Q S0 + QK Vn, written straight to the output rows.
  panel_gemm_sub(W, Dk, S, Dv, U, Dv, U, Dv, n, Dv, Dk);
  float* out = a.out + (c0 * a.Hv + h) * Dv;  // row i at out + i * ldv
  panel_gemm(QE, Dk, S, Dv, nullptr, 0, out, ldv, n, Dv, Dk);
  panel_gemm(QK, n, U, Dv, out, ldv, out, ldv, n, Dv, n);
  // S1 = e^gam_n S0 + sum_j e^(gam_n - gam_j) k_j Vn_j^T.
  const float gn = gam[n - 1];
  for (int64_t j = 0; j < n; ++j) {
    const float cj = std::exp(gn - gam[j]);
    for (int64_t d = 0; d < Dk; ++d) CK[d * n + j] = cj * k0[j * ldk + d];
  }
  for (int64_t d = 0; d < Dk; ++d) scale_row(S + d * Dv, eg[n - 1], Dv, S + d * Dv);
  panel_gemm(CK, n, U, Dv, S, Dv, S, Dv, Dk, Dv, n);
}

void delta_rule_chunked(const DeltaArgs& a, int64_t pos0, int64_t chunk, ThreadPool* pool) {
  auto run = [&](int64_t hb, int64_t he) {
    std::vector<float> buf;
    for (int64_t h = hb; h < he; ++h) {
      float* S = a.S + h * a.Dk * a.Dv;
      int64_t t = 0;
      while (t < a.T) {
        // The chunk ends at the next absolute multiple of `chunk`.
        const int64_t abs = pos0 + t;
        const int64_t n = std::min(a.T - t, chunk - abs % chunk);
        delta_chunk(a, h, t, n, S, buf);
        t += n;
      }
    }
  };
  if (pool != nullptr)
    pool->parallel_for(a.Hv, 1, run);
  else
    run(0, a.Hv);
}

}  // namespace tf::cpu
