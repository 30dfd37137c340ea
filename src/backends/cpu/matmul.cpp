#include "backends/cpu/matmul.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "backends/cpu/gemm_kernels.h"
#include "backends/cpu/parallel.h"
#include "core/check.h"

namespace tf::cpu {
namespace {

// Rows are handed to threads in units of 48 (a multiple of the 6- and 8-row tiles).
constexpr int64_t kRowUnit = 48;
// Below this many multiply-adds a product runs on the calling thread: a pool dispatch costs about
// as much as streaming 256 KiB of weights.
constexpr int64_t kSerialMacs = int64_t{1} << 18;

}  // namespace

void matmul_multi(std::span<const MatmulJob> jobs, int64_t n, ThreadPool* pool) {
  if (n <= 0 || jobs.empty()) return;
  // Units: (job, row block of kRowUnit rows), each costing rows * cols; threads take contiguous
  // runs of units of about equal cost. Any split gives the same bits (each element is computed by
  // one thread with the canonical sequence), so the split only has to balance the load.
  struct Unit {
    int64_t job, r0, r1;
  };
  std::vector<Unit> units;
  std::vector<double> end_cost;  // cumulative cost at the end of each unit
  double total = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Mat& w = jobs[j].w;
    for (int64_t r = 0; r < w.rows; r += kRowUnit) {
      units.push_back({static_cast<int64_t>(j), r, std::min(w.rows, r + kRowUnit)});
      total += static_cast<double>(units.back().r1 - r) * static_cast<double>(w.cols);
      end_cost.push_back(total);
    }
  }
  // bf16 products over more than 4 tokens read their inputs rounded to bf16: rounded here once per
  // distinct input (q/k/v share theirs), not once per unit (a [12288, 2048] product has 256), into
  // grow-only scratch (a fresh buffer per call costs page faults).
  std::vector<kern::XRows> xs(jobs.size());
  std::vector<size_t> first(jobs.size());  // the job whose rounding job j reads
  size_t rounded_size = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const MatmulJob& job = jobs[j];
    xs[j] = kern::XRows{job.x, job.ldx != 0 ? job.ldx : job.w.cols, nullptr};
    first[j] = j;
    if (!job.w.bf16_inputs || n <= 4) continue;
    for (size_t i = 0; i < j && first[j] == j; ++i) {
      if (xs[i].bf16_ld != 0 && xs[i].base == xs[j].base && xs[i].ld == xs[j].ld &&
          jobs[i].w.cols == job.w.cols)
        first[j] = i;
    }
    xs[j].bf16_ld = job.w.cols;
    if (first[j] == j) rounded_size += n * job.w.cols;
  }
  if (rounded_size > 0) {
    thread_local std::vector<uint16_t> rounded;
    if (rounded.size() < rounded_size) rounded.resize(rounded_size);
    size_t at = 0;
    for (size_t j = 0; j < jobs.size(); ++j) {
      if (xs[j].bf16_ld == 0) continue;
      if (first[j] == j) {
        kern::round_rows_bf16(jobs[j].x, xs[j].ld, n, jobs[j].w.cols, rounded.data() + at);
        xs[j].bf16 = rounded.data() + at;
        at += n * jobs[j].w.cols;
      } else {
        xs[j].bf16 = xs[first[j]].bf16;
      }
    }
  }
  auto run_units = [&](size_t ub, size_t ue) {
    for (size_t u = ub; u < ue; ++u) {
      const MatmulJob& job = jobs[units[u].job];
      const kern::XRows& x = xs[units[u].job];
      kern::gemm_rows(job.w, x, n, job.y + units[u].r0, job.ldy != 0 ? job.ldy : job.w.rows,
                      units[u].r0, units[u].r1);
    }
  };
  if (pool == nullptr || pool->size() == 1 || total * static_cast<double>(n) < kSerialMacs) {
    run_units(0, units.size());
    return;
  }
  parallel_region(pool, [&](const Worker& wk) {
    // Unit u belongs to the worker whose share of the total cost holds the unit's midpoint.
    auto owner = [&](size_t u) {
      const double mid = end_cost[u] - 0.5 * (end_cost[u] - (u > 0 ? end_cost[u - 1] : 0.0));
      return std::min<int>(wk.n - 1, static_cast<int>(mid / total * wk.n));
    };
    size_t ub = 0;
    while (ub < units.size() && owner(ub) < wk.id) ++ub;
    size_t ue = ub;
    while (ue < units.size() && owner(ue) == wk.id) ++ue;
    run_units(ub, ue);
  });
}

void matmul(const Mat& w, const float* x, int64_t ldx, int64_t n, float* y, int64_t ldy,
            ThreadPool* pool) {
  if (n <= 0 || w.rows <= 0) return;
  const MatmulJob job{w, x, ldx, y, ldy};
  matmul_multi({&job, 1}, n, pool);
}

float dot_row(const Mat& w, int64_t r, const float* x) {
  float y = 0;
  matmul(w.row_slice(r, 1), x, w.cols, 1, &y, 1, nullptr);
  return y;
}

void row_to_f32(const Mat& w, int64_t r, float* out) {
  TF_CHECK(r >= 0 && r < w.rows, "row {} of {}", r, w.rows);
  const int64_t K = w.cols;
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(w.data) + r * K, K * sizeof(float));
      return;
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(w.data) + r * K;
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(p[k]);
      return;
    }
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(w.data) + r * K;
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(p[k]);
      return;
    }
  }
}

}  // namespace tf::cpu
