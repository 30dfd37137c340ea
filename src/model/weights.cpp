#include "model/weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "core/thread_pool.h"

namespace tf {
namespace {

class Loader {
 public:
  Loader(const Checkpoint& ckpt, Weights* w, const LoadProgress& progress, bool copy)
      : ckpt_(ckpt),
        w_(w),
        progress_(progress),
        copy_(copy),
        total_(progress ? ckpt.names().size() : 0) {
    if (copy_) pool_ = std::make_unique<ThreadPool>(0);
  }

  // Copy mode: one arena of `bytes` (at least everything copied; pages never touched take no
  // memory) that finish() trims to what was used. One mapping with huge pages asked for, rather
  // than one per tensor: an expert's 2 MiB matrix in a mapping of its own is never 2 MiB aligned,
  // so never a huge page. On this project's VM huge pages and two threads (copy()) made a 5 GB
  // copy 12x faster (docs/PERFORMANCE.md, "Weights copied out of the page cache").
  Status reserve(size_t bytes) {
    TF_ASSIGN_OR_RETURN(HostBlock b, map_block(bytes));
    arena_ = b.get();
    arena_size_ = b.get_deleter().bytes;
    w_->owned.push_back(std::move(b));
    arena_index_ = w_->owned.size() - 1;
    return Status::ok();
  }
  // Gives the arena's unused tail back.
  void finish() {
    if (arena_ == nullptr) return;
    HostBlock& b = w_->owned[arena_index_];
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t keep = std::max<size_t>((arena_used_ + page - 1) / page * page, page);
    if (keep < arena_size_) munmap(arena_ + keep, arena_size_ - keep);
    b.get_deleter().bytes = std::min(keep, arena_size_);
    arena_ = nullptr;
  }

  Status mat(const std::string& name, int64_t rows, int64_t cols, Mat* out) {
    TF_RETURN_IF_ERROR(view(name, rows, cols, out));
    const size_t bytes = rows * cols * dtype_size(out->dtype);
    if (!copy_) {
      w_->bytes_mapped += bytes;
      return Status::ok();
    }
    TF_ASSIGN_OR_RETURN(const void* data, copy_of(out->data, bytes));
    *out = Mat{out->dtype, data, rows, cols};
    return Status::ok();
  }

  // Rows of a [rows, cols] matrix: the concatenation of `ranges` ({begin, count} each). One range
  // is a view into the mapping (unless copying); several are copied into one owned matrix.
  Status mat_rows(const std::string& name, int64_t rows, int64_t cols,
                  const std::vector<std::pair<int64_t, int64_t>>& ranges, Mat* out) {
    Mat full;
    TF_RETURN_IF_ERROR(view(name, rows, cols, &full));
    int64_t n = 0;
    for (const auto& [b, c] : ranges) n += c;
    if (ranges.size() == 1 && !copy_) {
      w_->bytes_mapped += n * cols * dtype_size(full.dtype);
      *out = full.row_slice(ranges[0].first, ranges[0].second);
      return Status::ok();
    }
    const size_t row_bytes = cols * dtype_size(full.dtype);
    TF_ASSIGN_OR_RETURN(char* dst, own(n * row_bytes));
    *out = Mat{full.dtype, dst, n, cols};
    for (const auto& [b, c] : ranges) {
      copy(dst, static_cast<const char*>(full.data) + b * row_bytes, c * row_bytes);
      dst += c * row_bytes;
    }
    return Status::ok();
  }

  // Columns [c0, c0 + cn) of a [rows, cols] matrix (a row-parallel projection's share), copied.
  Status mat_cols(const std::string& name, int64_t rows, int64_t cols, int64_t c0, int64_t cn,
                  Mat* out) {
    if (c0 == 0 && cn == cols) return mat(name, rows, cols, out);
    Mat full;
    TF_RETURN_IF_ERROR(view(name, rows, cols, &full));
    const size_t es = dtype_size(full.dtype);
    TF_ASSIGN_OR_RETURN(char* dst, own(rows * cn * es));
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * cn * es, static_cast<const char*>(full.data) + (r * cols + c0) * es,
                  cn * es);
    *out = Mat{full.dtype, dst, rows, cn};
    return Status::ok();
  }

  // A [E, R, C] packed tensor, as E matrices [R, C] (optionally a row range of each).
  Status packed(const std::string& name, int64_t E, int64_t R, int64_t C, int64_t row0,
                int64_t rows, std::vector<Mat>* out) {
    tick();
    TF_ASSIGN_OR_RETURN(TensorView t, ckpt_.get(name, {E, R, C}));
    out->clear();
    if (copy_) {  // only the rows used: [E, rows, C]
      const size_t row_bytes = C * dtype_size(t.dtype);
      TF_ASSIGN_OR_RETURN(char* dst, own(E * rows * row_bytes));
      for (int64_t e = 0; e < E; ++e) {
        copy(dst + e * rows * row_bytes,
             static_cast<const char*>(t.data) + (e * R + row0) * row_bytes, rows * row_bytes);
        out->push_back(Mat{t.dtype, dst + e * rows * row_bytes, rows, C});
      }
      return Status::ok();
    }
    TF_ASSIGN_OR_RETURN(const void* data, aligned(t));
    for (int64_t e = 0; e < E; ++e)
      out->push_back(Mat{t.dtype, data, E * R, C}.row_slice(e * R + row0, rows));
    w_->bytes_mapped += t.nbytes * rows / R;
    return Status::ok();
  }

  // Any-dtype tensor of `shape` converted to fp32.
  Status vec(const std::string& name, const std::vector<int64_t>& shape, std::vector<float>* out) {
    tick();
    TF_ASSIGN_OR_RETURN(TensorView t, ckpt_.get(name, shape));
    out->resize(t.numel());
    for (int64_t i = 0; i < t.numel(); ++i) {
      uint16_t h;
      switch (t.dtype) {
        case DType::kF32:
          std::memcpy(&(*out)[i], static_cast<const char*>(t.data) + 4 * i, 4);
          break;
        case DType::kBF16:
          std::memcpy(&h, static_cast<const char*>(t.data) + 2 * i, 2);
          (*out)[i] = bf16_to_f32(h);
          break;
        case DType::kF16:
          std::memcpy(&h, static_cast<const char*>(t.data) + 2 * i, 2);
          (*out)[i] = f16_to_f32(h);
          break;
      }
    }
    return Status::ok();
  }

 private:
  void tick() {
    if (progress_) progress_(std::min(++done_, total_), total_);
  }
  // The [rows, cols] matrix `name` as it lies in the checkpoint (copied only if misaligned).
  Status view(const std::string& name, int64_t rows, int64_t cols, Mat* out) {
    tick();
    TF_ASSIGN_OR_RETURN(TensorView t, ckpt_.get(name, {rows, cols}));
    TF_ASSIGN_OR_RETURN(const void* data, aligned(t));
    *out = Mat{t.dtype, data, rows, cols};
    return Status::ok();
  }
  // The tensor's data, copied to an aligned buffer if the file placed it off its element size.
  Result<const void*> aligned(const TensorView& t) {
    if (reinterpret_cast<uintptr_t>(t.data) % dtype_size(t.dtype) == 0) return t.data;
    return copy_of(t.data, t.nbytes);
  }
  // An owned copy of `bytes` at `data` (data itself when it is the copy aligned() just made).
  Result<const void*> copy_of(const void* data, size_t bytes) {
    if (data == last_copy_) return data;
    TF_ASSIGN_OR_RETURN(char* dst, own(bytes));
    copy(dst, static_cast<const char*>(data), bytes);
    last_copy_ = dst;
    return dst;
  }

  // `bytes` of owned memory: the next 64-byte-aligned piece of the copy mode's arena, or an
  // anonymous mapping of its own.
  Result<char*> own(size_t bytes) {
    if (arena_ != nullptr && arena_size_ - arena_used_ >= bytes) {
      char* p = arena_ + arena_used_;
      arena_used_ += (bytes + 63) / 64 * 64;
      return p;
    }
    TF_ASSIGN_OR_RETURN(HostBlock b, map_block(bytes));
    w_->owned.push_back(std::move(b));
    return w_->owned.back().get();
  }

  Result<HostBlock> map_block(size_t bytes) {
    const size_t n = std::max<size_t>(bytes, 1);
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return Status::io(
          "cannot allocate {} bytes for a copy of the weights: {} (--load-mode mmap "
          "maps the checkpoint instead)",
          n, std::strerror(errno));
    }
    if (n >= (size_t{2} << 20)) madvise(p, n, MADV_HUGEPAGE);  // advice only: errors are fine
    return HostBlock(static_cast<char*>(p), HostBlockUnmap{n});
  }

  // memcpy, spread over every core for large copies (copy mode's pool).
  void copy(char* dst, const char* src, size_t bytes) {
    constexpr size_t kPiece = size_t{4} << 20;
    if (pool_ == nullptr || bytes < 2 * kPiece) {
      std::memcpy(dst, src, bytes);
      return;
    }
    const auto pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
    pool_->parallel_for(pieces, 1, [&](int64_t b, int64_t e) {
      const size_t lo = b * kPiece, hi = std::min(bytes, e * kPiece);
      std::memcpy(dst + lo, src + lo, hi - lo);
    });
  }

  const Checkpoint& ckpt_;
  Weights* w_;
  const LoadProgress& progress_;
  const bool copy_;                   // LoadOptions::copy
  std::unique_ptr<ThreadPool> pool_;  // copy mode: the copies' threads
  char* arena_ = nullptr;             // copy mode: owned[arena_index_], arena_used_ bytes used
  size_t arena_size_ = 0, arena_used_ = 0, arena_index_ = 0;
  const void* last_copy_ = nullptr;
  size_t total_, done_ = 0;
};

Status load_ffn(Loader& ld, const std::string& p, int64_t H, int64_t I, FfnWeights* f) {
  TF_RETURN_IF_ERROR(ld.mat(p + ".gate_proj.weight", I, H, &f->gate));
  TF_RETURN_IF_ERROR(ld.mat(p + ".up_proj.weight", I, H, &f->up));
  return ld.mat(p + ".down_proj.weight", H, I, &f->down);
}

// This rank's block of the intermediate rows: gate/up rows [i0, i0 + n), down columns the same.
Status load_ffn_split(Loader& ld, const std::string& p, int64_t H, int64_t I, Shard s,
                      FfnWeights* f) {
  if (s.size == 1) return load_ffn(ld, p, H, I, f);
  int64_t i0, n;
  split_block(I, s, &i0, &n);
  TF_RETURN_IF_ERROR(ld.mat_rows(p + ".gate_proj.weight", I, H, {{i0, n}}, &f->gate));
  TF_RETURN_IF_ERROR(ld.mat_rows(p + ".up_proj.weight", I, H, {{i0, n}}, &f->up));
  return ld.mat_cols(p + ".down_proj.weight", H, I, i0, n, &f->down);
}

// Keeps the elements of v in `ranges` ({begin, count}), in order.
void select(std::vector<float>* v, const std::vector<std::pair<int64_t, int64_t>>& ranges) {
  std::vector<float> out;
  for (const auto& [b, c] : ranges) out.insert(out.end(), v->begin() + b, v->begin() + b + c);
  v->swap(out);
}

Status load_moe(const Checkpoint& ckpt, Loader& ld, const ModelConfig& c, const TpLayout& T,
                const std::string& p, LayerWeights* L) {
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  TF_RETURN_IF_ERROR(ld.mat(p + ".gate.weight", E, H, &L->router));
  L->experts.resize(E);
  if (ckpt.has(p + ".experts.gate_up_proj")) {
    // Packed (Qwen3.5 style): gate_up_proj [E, 2I, H] with gate rows first; down_proj [E, H, I].
    std::vector<Mat> gate, up, down;
    TF_RETURN_IF_ERROR(ld.packed(p + ".experts.gate_up_proj", E, 2 * I, H, 0, I, &gate));
    TF_RETURN_IF_ERROR(ld.packed(p + ".experts.gate_up_proj", E, 2 * I, H, I, I, &up));
    TF_RETURN_IF_ERROR(ld.packed(p + ".experts.down_proj", E, H, I, 0, H, &down));
    for (int64_t e = 0; e < E; ++e) L->experts[e] = FfnWeights{gate[e], up[e], down[e]};
  } else {
    // Expert parallelism: only this rank's experts (the others stay empty matrices).
    for (int64_t e = T.e0; e < T.e1; ++e) {
      TF_RETURN_IF_ERROR(load_ffn(ld, fmt::format("{}.experts.{}", p, e), H, I, &L->experts[e]));
    }
  }
  TF_RETURN_IF_ERROR(load_ffn_split(ld, p + ".shared_expert", H, c.shared_expert_intermediate_size,
                                    T.shard, &L->shared));
  return ld.vec(p + ".shared_expert_gate.weight", {1, H}, &L->shared_gate);
}

Status load_attention(Loader& ld, const ModelConfig& c, const TpLayout& T, const std::string& p,
                      LayerWeights* L) {
  const int64_t H = c.hidden_size, D = c.head_dim;
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  if (T.whole()) {
    TF_RETURN_IF_ERROR(ld.mat(p + ".q_proj.weight", nh * D * 2, H, &L->q_proj));
    TF_RETURN_IF_ERROR(ld.mat(p + ".k_proj.weight", nkv * D, H, &L->k_proj));
    TF_RETURN_IF_ERROR(ld.mat(p + ".v_proj.weight", nkv * D, H, &L->v_proj));
    TF_RETURN_IF_ERROR(ld.mat(p + ".o_proj.weight", H, nh * D, &L->o_proj));
  } else {
    // Column-parallel q (per head [query D | gate D]), k, v; row-parallel o.
    TF_RETURN_IF_ERROR(ld.mat_rows(p + ".q_proj.weight", nh * D * 2, H,
                                   {{T.q0 * 2 * D, T.nh * 2 * D}}, &L->q_proj));
    TF_RETURN_IF_ERROR(
        ld.mat_rows(p + ".k_proj.weight", nkv * D, H, {{T.kv0 * D, T.nkv * D}}, &L->k_proj));
    TF_RETURN_IF_ERROR(
        ld.mat_rows(p + ".v_proj.weight", nkv * D, H, {{T.kv0 * D, T.nkv * D}}, &L->v_proj));
    TF_RETURN_IF_ERROR(
        ld.mat_cols(p + ".o_proj.weight", H, nh * D, T.q0 * D, T.nh * D, &L->o_proj));
  }
  TF_RETURN_IF_ERROR(ld.vec(p + ".q_norm.weight", {D}, &L->q_norm));
  return ld.vec(p + ".k_norm.weight", {D}, &L->k_norm);
}

Status load_deltanet(Loader& ld, const ModelConfig& c, const TpLayout& T, const std::string& p,
                     LayerWeights* L) {
  const int64_t H = c.hidden_size, Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim,
                K = c.linear_conv_kernel_dim;
  const int64_t r = Hv / Hk;
  if (T.whole()) {
    TF_RETURN_IF_ERROR(
        ld.mat(p + ".in_proj_qkvz.weight", Hk * (2 * Dk + 2 * r * Dv), H, &L->in_qkvz));
    TF_RETURN_IF_ERROR(ld.mat(p + ".in_proj_ba.weight", Hk * 2 * r, H, &L->in_ba));
    TF_RETURN_IF_ERROR(ld.mat(p + ".out_proj.weight", H, Hv * Dv, &L->out_proj));
  } else {
    // Per held key head g, the value heads [ja, jb) of its group of r that this rank holds; the
    // local rows keep the checkpoint's grouping with r_local = jb - ja:
    //   qkvz group: [q Dk | k Dk | v r Dv | z r Dv] -> [q | k | v (jb-ja) Dv | z (jb-ja) Dv]
    //   ba group:   [b r | a r]                     -> [b (jb-ja) | a (jb-ja)]
    const int64_t G = 2 * Dk + 2 * r * Dv;
    std::vector<std::pair<int64_t, int64_t>> qkvz, ba;
    for (int64_t g = T.k0; g < T.k0 + T.hk; ++g) {
      const int64_t ja = std::max(T.v0, g * r) - g * r;
      const int64_t jb = std::min(T.v0 + T.hv, (g + 1) * r) - g * r;
      qkvz.push_back({g * G, 2 * Dk});
      qkvz.push_back({g * G + 2 * Dk + ja * Dv, (jb - ja) * Dv});
      qkvz.push_back({g * G + 2 * Dk + r * Dv + ja * Dv, (jb - ja) * Dv});
      ba.push_back({g * 2 * r + ja, jb - ja});
      ba.push_back({g * 2 * r + r + ja, jb - ja});
    }
    TF_RETURN_IF_ERROR(ld.mat_rows(p + ".in_proj_qkvz.weight", Hk * G, H, qkvz, &L->in_qkvz));
    TF_RETURN_IF_ERROR(ld.mat_rows(p + ".in_proj_ba.weight", Hk * 2 * r, H, ba, &L->in_ba));
    TF_RETURN_IF_ERROR(
        ld.mat_cols(p + ".out_proj.weight", H, Hv * Dv, T.v0 * Dv, T.hv * Dv, &L->out_proj));
  }
  TF_RETURN_IF_ERROR(ld.vec(p + ".conv1d.weight", {c.conv_dim(), 1, K}, &L->conv));
  TF_RETURN_IF_ERROR(ld.vec(p + ".dt_bias", {Hv}, &L->dt_bias));
  std::vector<float> a_log;
  TF_RETURN_IF_ERROR(ld.vec(p + ".A_log", {Hv}, &a_log));
  if (!T.whole()) {
    // Conv channels [q Hk Dk | k Hk Dk | v Hv Dv], K taps each: the held heads' channels.
    const int64_t kd = Hk * Dk;
    select(&L->conv, {{T.k0 * Dk * K, T.hk * Dk * K},
                      {(kd + T.k0 * Dk) * K, T.hk * Dk * K},
                      {(2 * kd + T.v0 * Dv) * K, T.hv * Dv * K}});
    select(&L->dt_bias, {{T.v0, T.hv}});
    select(&a_log, {{T.v0, T.hv}});
  }
  L->neg_exp_a.resize(a_log.size());
  for (size_t h = 0; h < a_log.size(); ++h) L->neg_exp_a[h] = -std::exp(a_log[h]);
  return ld.vec(p + ".norm.weight", {Dv}, &L->gnorm);
}

Status load_mlp(const Checkpoint& ckpt, Loader& ld, const ModelConfig& c, const TpLayout& T,
                int64_t i, const std::string& p, LayerWeights* L) {
  L->moe = c.is_moe_layer(i);
  if (L->moe) return load_moe(ckpt, ld, c, T, p + ".mlp", L);
  return load_ffn_split(ld, p + ".mlp", c.hidden_size, c.intermediate_size, T.shard, &L->mlp);
}

}  // namespace

void HostBlockUnmap::operator()(char* p) const {
  munmap(p, bytes);
}

Result<TpLayout> make_tp_layout(const ModelConfig& c, Shard s) {
  TpLayout T;
  T.shard = s;
  const int64_t N = s.size;
  if (N < 1 || s.rank < 0 || s.rank >= N) return Status::invalid("rank {} of {}", s.rank, N);
  // Query heads split evenly; the KV heads they read: a block of whole groups, or one KV head
  // shared (replicated) by the ranks that split its group.
  const int64_t nh = c.num_attention_heads, nkv = c.num_key_value_heads;
  if (nh % N != 0) {
    return Status::unsupported("--tp {}: the {} attention heads do not split evenly over {} ranks",
                               N, nh, N);
  }
  T.nh = nh / N;
  T.q0 = T.nh * s.rank;
  const int64_t g = nh / nkv;  // query heads per KV head
  if (T.nh % g != 0 && g % T.nh != 0) {
    return Status::unsupported(
        "--tp {}: {} query heads per rank do not align with groups of {} per KV head", N, T.nh, g);
  }
  T.kv0 = T.q0 / g;
  T.nkv = std::max<int64_t>(1, T.nh / g);
  // GDN: value heads split evenly; the key heads they read, the same way.
  const int64_t Hk = c.linear_num_key_heads, Hv = c.linear_num_value_heads;
  const bool any_gdn =
      std::find(c.full_attention.begin(), c.full_attention.end(), false) != c.full_attention.end();
  if (any_gdn) {
    if (Hv % N != 0) {
      return Status::unsupported(
          "--tp {}: the {} Gated DeltaNet value heads do not split evenly over {} ranks", N, Hv, N);
    }
    const int64_t r = Hv / Hk;
    T.hv = Hv / N;
    T.v0 = T.hv * s.rank;
    if (T.hv % r != 0 && r % T.hv != 0) {
      return Status::unsupported(
          "--tp {}: {} value heads per rank do not align with groups of {} per key head", N, T.hv,
          r);
    }
    T.k0 = T.v0 / r;
    T.hk = std::max<int64_t>(1, T.hv / r);
    T.conv_dim = 2 * T.hk * c.linear_key_head_dim + T.hv * c.linear_value_head_dim;
  }
  int64_t ne;
  split_block(c.num_experts, s, &T.e0, &ne);
  T.e1 = T.e0 + ne;
  split_block(c.vocab_size, s, &T.vocab0, &T.vocab_n);
  T.vocab_stride = (c.vocab_size + N - 1) / N;
  for (int64_t I : {c.intermediate_size, c.shared_expert_intermediate_size}) {
    if (I > 0 && I < N)
      return Status::unsupported("--tp {}: an MLP of {} rows cannot split over {} ranks", N, I, N);
  }
  return T;
}

void Weights::for_each_owned(const std::function<void(const void*, size_t)>& fn) const {
  auto vec = [&](const std::vector<float>& v) {
    if (!v.empty()) fn(v.data(), v.size() * sizeof(float));
  };
  auto layer = [&](const LayerWeights& L) {
    for (const auto* v : {&L.input_norm, &L.post_norm, &L.q_norm, &L.k_norm, &L.conv, &L.dt_bias,
                          &L.neg_exp_a, &L.gnorm, &L.shared_gate})
      vec(*v);
  };
  vec(final_norm);
  for (const LayerWeights& L : layers) layer(L);
  if (mtp) {
    for (const auto* v : {&mtp->pre_fc_norm_embedding, &mtp->pre_fc_norm_hidden, &mtp->norm})
      vec(*v);
    layer(mtp->layer);
  }
  for (const HostBlock& b : owned) fn(b.get(), b.get_deleter().bytes);
}

void Weights::for_each_mat(const std::function<void(Mat&)>& fn) {
  auto ffn = [&](FfnWeights& f) {
    for (Mat* m : {&f.gate, &f.up, &f.down}) fn(*m);
  };
  auto layer = [&](LayerWeights& L) {
    for (Mat* m :
         {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.in_qkvz, &L.in_ba, &L.out_proj, &L.router})
      fn(*m);
    for (FfnWeights& f : L.experts) ffn(f);
    ffn(L.shared);
    ffn(L.mlp);
  };
  fn(embed);
  fn(lm_head);
  for (LayerWeights& L : layers) layer(L);
  if (mtp) {
    fn(mtp->fc);
    layer(mtp->layer);
  }
}

Result<std::unique_ptr<Weights>> load_weights(const Checkpoint& ckpt, const LoadProgress& progress,
                                              const TpLayout* layout, const LoadOptions& opts) {
  const ModelConfig& c = ckpt.config();
  TpLayout whole;
  if (layout == nullptr) {
    TF_ASSIGN_OR_RETURN(whole, make_tp_layout(c, Shard{}));
    layout = &whole;
  }
  const TpLayout& T = *layout;
  auto w = std::make_unique<Weights>();
  Loader ld(ckpt, w.get(), progress, opts.copy);
  if (opts.copy) {
    size_t bytes = 0;  // every tensor with 64 bytes of alignment slack: at least what is copied
    for (const auto& f : ckpt.files())
      for (const auto& [name, t] : f->tensors()) bytes += t.nbytes + 64;
    TF_RETURN_IF_ERROR(ld.reserve(bytes));
  }
  const int64_t H = c.hidden_size, V = c.vocab_size;
  // Vocab-parallel: this rank's rows of the embedding and of lm_head (one range: views).
  TF_RETURN_IF_ERROR(
      ld.mat_rows("model.embed_tokens.weight", V, H, {{T.vocab0, T.vocab_n}}, &w->embed));
  if (c.tie_word_embeddings) {
    w->lm_head = w->embed;
  } else {
    TF_RETURN_IF_ERROR(ld.mat_rows("lm_head.weight", V, H, {{T.vocab0, T.vocab_n}}, &w->lm_head));
  }
  TF_RETURN_IF_ERROR(ld.vec("model.norm.weight", {H}, &w->final_norm));
  w->layers.resize(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& L = w->layers[i];
    const std::string p = fmt::format("model.layers.{}", i);
    L.full_attention = c.full_attention[i];
    TF_RETURN_IF_ERROR(ld.vec(p + ".input_layernorm.weight", {H}, &L.input_norm));
    TF_RETURN_IF_ERROR(ld.vec(p + ".post_attention_layernorm.weight", {H}, &L.post_norm));
    if (L.full_attention) {
      TF_RETURN_IF_ERROR(load_attention(ld, c, T, p + ".self_attn", &L));
    } else {
      TF_RETURN_IF_ERROR(load_deltanet(ld, c, T, p + ".linear_attn", &L));
    }
    TF_RETURN_IF_ERROR(load_mlp(ckpt, ld, c, T, i, p, &L));
  }
  // MTP (§6): one full-attention + MoE layer, present only if the checkpoint ships mtp.* tensors.
  if (ckpt.has("mtp.fc.weight")) {
    auto m = std::make_unique<MtpWeights>();
    TF_RETURN_IF_ERROR(ld.mat("mtp.fc.weight", H, 2 * H, &m->fc));
    TF_RETURN_IF_ERROR(ld.vec("mtp.pre_fc_norm_embedding.weight", {H}, &m->pre_fc_norm_embedding));
    TF_RETURN_IF_ERROR(ld.vec("mtp.pre_fc_norm_hidden.weight", {H}, &m->pre_fc_norm_hidden));
    TF_RETURN_IF_ERROR(ld.vec("mtp.norm.weight", {H}, &m->norm));
    LayerWeights& L = m->layer;
    L.full_attention = true;
    TF_RETURN_IF_ERROR(ld.vec("mtp.layers.0.input_layernorm.weight", {H}, &L.input_norm));
    TF_RETURN_IF_ERROR(ld.vec("mtp.layers.0.post_attention_layernorm.weight", {H}, &L.post_norm));
    // Split like the target's layers (its KV cache lives split too); fc is replicated.
    TF_RETURN_IF_ERROR(load_attention(ld, c, T, "mtp.layers.0.self_attn", &L));
    L.moe = c.num_experts > 0;
    if (L.moe) {
      TF_RETURN_IF_ERROR(load_moe(ckpt, ld, c, T, "mtp.layers.0.mlp", &L));
    } else {
      TF_RETURN_IF_ERROR(
          load_ffn_split(ld, "mtp.layers.0.mlp", H, c.intermediate_size, T.shard, &L.mlp));
    }
    w->mtp = std::move(m);
  }
  ld.finish();
  if (opts.bf16_products) {
    w->bf16_products = true;
    w->for_each_mat([](Mat& m) { m.bf16_inputs = m.dtype == DType::kBF16; });
  }
  return w;
}

}  // namespace tf
