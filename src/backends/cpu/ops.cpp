#include "backends/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tf::cpu {

void rmsnorm_zc(const float* x, const float* w, int64_t n, int64_t dim, float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * dim;
    float ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += xr[d] * xr[d];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    float* yr = y + i * dim;
    for (int64_t d = 0; d < dim; ++d) yr[d] = xr[d] * r * (1.0f + w[d]);
  }
}

void rmsnorm_gated(const float* x, const float* z, const float* w, int64_t n, int64_t dim,
                   float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * dim;
    const float* zr = z + i * dim;
    float ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += xr[d] * xr[d];
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    float* yr = y + i * dim;
    for (int64_t d = 0; d < dim; ++d) yr[d] = w[d] * (xr[d] * r) * silu(zr[d]);
  }
}

void l2norm_scale(float* x, int64_t n, int64_t dim, float eps, float scale) {
  for (int64_t i = 0; i < n; ++i) {
    float* xr = x + i * dim;
    float ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += xr[d] * xr[d];
    const float r = 1.0f / std::sqrt(ss + eps);
    for (int64_t d = 0; d < dim; ++d) xr[d] = xr[d] * r * scale;
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

void attention(const float* q, int64_t T, const int64_t* pos, const float* k_cache,
               const float* v_cache, int64_t n_heads, int64_t n_kv, int64_t D, float scale,
               float* out, ThreadPool* pool) {
  const int64_t group = n_heads / n_kv;
  auto run = [&](int64_t b, int64_t e) {
    std::vector<float> p;
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / n_heads, h = th % n_heads, kvh = h / group;
      const float* qv = q + (t * n_heads + h) * D;
      const int64_t L = pos[t] + 1;
      p.resize(L);
      float m = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        const float* kv = k_cache + (j * n_kv + kvh) * D;
        float s = 0;
        for (int64_t d = 0; d < D; ++d) s += qv[d] * kv[d];
        p[j] = s * scale;
        m = std::max(m, p[j]);
      }
      float sum = 0;
      for (int64_t j = 0; j < L; ++j) {
        p[j] = std::exp(p[j] - m);
        sum += p[j];
      }
      float* o = out + (t * n_heads + h) * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t j = 0; j < L; ++j) {
        const float* vv = v_cache + (j * n_kv + kvh) * D;
        const float pj = p[j];
        for (int64_t d = 0; d < D; ++d) o[d] += pj * vv[d];
      }
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    }
  };
  if (pool != nullptr)
    pool->parallel_for(T * n_heads, 1, run);
  else
    run(0, T * n_heads);
}

void delta_rule_recurrent(const DeltaArgs& a, ThreadPool* pool) {
  const int64_t r = a.Hv / a.Hk;
  auto run = [&](int64_t hb, int64_t he) {
    std::vector<float> kv(a.Dv);
    for (int64_t h = hb; h < he; ++h) {
      float* S = a.S + h * a.Dk * a.Dv;  // [Dk, Dv]
      for (int64_t t = 0; t < a.T; ++t) {
        const float* q = a.q + (t * a.Hk + h / r) * a.Dk;
        const float* k = a.k + (t * a.Hk + h / r) * a.Dk;
        const float* v = a.v + (t * a.Hv + h) * a.Dv;
        const float decay = std::exp(a.g[t * a.Hv + h]);
        const float beta = a.beta[t * a.Hv + h];
        for (int64_t i = 0; i < a.Dk * a.Dv; ++i) S[i] *= decay;
        std::fill(kv.begin(), kv.end(), 0.0f);
        for (int64_t i = 0; i < a.Dk; ++i) {
          const float* Si = S + i * a.Dv;
          for (int64_t j = 0; j < a.Dv; ++j) kv[j] += Si[j] * k[i];
        }
        for (int64_t j = 0; j < a.Dv; ++j) kv[j] = beta * (v[j] - kv[j]);  // kv now holds d
        float* o = a.out + (t * a.Hv + h) * a.Dv;
        std::fill(o, o + a.Dv, 0.0f);
        for (int64_t i = 0; i < a.Dk; ++i) {
          float* Si = S + i * a.Dv;
          const float ki = k[i], qi = q[i];
          for (int64_t j = 0; j < a.Dv; ++j) {
            Si[j] += ki * kv[j];
            o[j] += Si[j] * qi;
          }
        }
      }
    }
  };
  if (pool != nullptr)
    pool->parallel_for(a.Hv, 1, run);
  else
    run(0, a.Hv);
}

// One chunk of n tokens (local rows c0..c0+n) for head h. Notation of qwen3-next.md §5.
static void delta_chunk(const DeltaArgs& a, int64_t h, int64_t c0, int64_t n, float* S,
                        std::vector<float>& buf) {
  const int64_t r = a.Hv / a.Hk, Dk = a.Dk, Dv = a.Dv;
  buf.resize(n + n * n * 2 + n * Dk + n * Dv * 2);
  float* gam = buf.data();  // [n] cumulative log decay
  float* A = gam + n;       // [n, n] strictly lower, then Tm
  float* QK = A + n * n;    // [n, n] q_i . k_j
  float* W = QK + n * n;    // [n, Dk]
  float* U = W + n * Dk;    // [n, Dv], becomes Vn
  float* O = U + n * Dv;    // [n, Dv]
  auto qrow = [&](int64_t i) { return a.q + ((c0 + i) * a.Hk + h / r) * Dk; };
  auto krow = [&](int64_t i) { return a.k + ((c0 + i) * a.Hk + h / r) * Dk; };
  auto vrow = [&](int64_t i) { return a.v + ((c0 + i) * a.Hv + h) * Dv; };
  auto beta = [&](int64_t i) { return a.beta[(c0 + i) * a.Hv + h]; };

  float acc = 0;
  for (int64_t i = 0; i < n; ++i) gam[i] = (acc += a.g[(c0 + i) * a.Hv + h]);
  auto dot = [&](const float* x, const float* y) {
    float s = 0;
    for (int64_t d = 0; d < Dk; ++d) s += x[d] * y[d];
    return s;
  };
  // A_ij = beta_i (k_i . k_j) exp(gam_i - gam_j), i > j.
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      A[i * n + j] = j < i ? beta(i) * dot(krow(i), krow(j)) * std::exp(gam[i] - gam[j]) : 0.0f;
      QK[i * n + j] = j <= i ? dot(qrow(i), krow(j)) * std::exp(gam[i] - gam[j]) : 0.0f;
    }
  }
  // Tm = (I + A)^-1 by forward substitution, row by row, in place over A (diagonal implicit 1):
  // Tm_ij = -A_ij - sum_{j<m<i} A_im Tm_mj.
  for (int64_t i = 1; i < n; ++i) {
    for (int64_t j = 0; j < i; ++j) {
      float s = A[i * n + j];
      for (int64_t m = j + 1; m < i; ++m) s += A[i * n + m] * A[m * n + j];
      A[i * n + j] = -s;
    }
  }
  // W = Tm diag(beta e^gam) K,  U = Tm diag(beta) V.
  for (int64_t i = 0; i < n; ++i) {
    float* Wi = W + i * Dk;
    float* Ui = U + i * Dv;
    const float bi = beta(i), ei = std::exp(gam[i]);
    for (int64_t d = 0; d < Dk; ++d) Wi[d] = bi * ei * krow(i)[d];
    for (int64_t d = 0; d < Dv; ++d) Ui[d] = bi * vrow(i)[d];
    for (int64_t j = 0; j < i; ++j) {
      const float t = A[i * n + j], bj = beta(j), ej = std::exp(gam[j]);
      for (int64_t d = 0; d < Dk; ++d) Wi[d] += t * bj * ej * krow(j)[d];
      for (int64_t d = 0; d < Dv; ++d) Ui[d] += t * bj * vrow(j)[d];
    }
  }
  // Vn = U - W S0;  O = diag(e^gam) Q S0 + (QK masked) Vn.
  for (int64_t i = 0; i < n; ++i) {
    float* Ui = U + i * Dv;
    float* Oi = O + i * Dv;
    std::fill(Oi, Oi + Dv, 0.0f);
    const float* Wi = W + i * Dk;
    const float* qi = qrow(i);
    const float ei = std::exp(gam[i]);
    for (int64_t d = 0; d < Dk; ++d) {
      const float* Sd = S + d * Dv;
      const float w = Wi[d], qd = qi[d] * ei;
      for (int64_t e = 0; e < Dv; ++e) {
        Ui[e] -= w * Sd[e];
        Oi[e] += qd * Sd[e];
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    float* Oi = O + i * Dv;
    for (int64_t j = 0; j <= i; ++j) {
      const float c = QK[i * n + j];
      const float* Uj = U + j * Dv;
      for (int64_t e = 0; e < Dv; ++e) Oi[e] += c * Uj[e];
    }
    float* out = a.out + ((c0 + i) * a.Hv + h) * Dv;
    std::copy(Oi, Oi + Dv, out);
  }
  // S1 = e^gam_n S0 + sum_j e^(gam_n - gam_j) k_j Vn_j^T.
  const float gn = gam[n - 1], en = std::exp(gn);
  for (int64_t i = 0; i < Dk * Dv; ++i) S[i] *= en;
  for (int64_t j = 0; j < n; ++j) {
    const float c = std::exp(gn - gam[j]);
    const float* kj = krow(j);
    const float* Uj = U + j * Dv;
    for (int64_t d = 0; d < Dk; ++d) {
      float* Sd = S + d * Dv;
      const float kd = c * kj[d];
      for (int64_t e = 0; e < Dv; ++e) Sd[e] += kd * Uj[e];
    }
  }
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
