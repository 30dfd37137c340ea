#include "model/model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "backends/cpu/ops.h"
#include "core/check.h"
#include "model/mtp.h"
#include "residency/cpu_backend.h"
#ifdef TF_HAVE_CUDA
#include "model/cuda_model.h"
#include "residency/cuda_backend.h"
#endif

namespace tf {

using cpu::matmul;

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const LoadProgress& progress,
                                           const LoadOptions& opts) {
  return load(dir, progress, tp_group(), opts);
}

Result<std::unique_ptr<Model>> Model::load(const std::string& dir, const LoadProgress& progress,
                                           Communicator* comm, const LoadOptions& opts) {
  auto m = std::unique_ptr<Model>(new Model());
  TF_ASSIGN_OR_RETURN(m->ckpt_, Checkpoint::open(dir));
  const Shard shard = comm != nullptr ? Shard{comm->rank(), comm->size()} : Shard{};
  TF_ASSIGN_OR_RETURN(m->tp_, make_tp_layout(m->ckpt_->config(), shard));
  TF_ASSIGN_OR_RETURN(m->weights_, load_weights(*m->ckpt_, progress, &m->tp_, opts));
  if (opts.copy) m->ckpt_->unmap();
  if (shard.size > 1) {
    m->comm_ = comm;
    if (shard.rank == 0) m->leader_ = std::make_unique<TpLeader>(comm);
  }
  const ModelConfig& c = m->config();
  // inv_freq[i] = theta^(-2i / rotary_dim), in float32 as transformers computes it.
  const int64_t rd = c.rotary_dim();
  for (int64_t i = 0; i < rd / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(rd);
    m->inv_freq_.push_back(1.0f /
                           static_cast<float>(std::pow(c.rope_theta, static_cast<double>(e))));
  }
  return m;
}

Model::~Model() {
  if (leader_) leader_->send_stop();
}

// ---- the device path (use_cuda) ---------------------------------------------------------------

void Model::CudaDeleter::operator()([[maybe_unused]] CudaModel* m) const {
#ifdef TF_HAVE_CUDA
  delete m;
#endif
}

Status Model::use_cuda([[maybe_unused]] int device) {
  if (weights_->bf16_products) {
    return Status::unsupported(
        "--matmul-precision bf16 is the CPU backend's; the CUDA backend's products take fp32 "
        "inputs (leave it at f32)");
  }
#ifdef TF_HAVE_CUDA
  if (comm_ != nullptr) return Status(StatusCode::kUnavailable, "--device cuda with --tp N > 1");
  TF_ASSIGN_OR_RETURN(std::unique_ptr<CudaModel> m, CudaModel::create(*this, device));
  cuda_.reset(m.release());
  return Status::ok();
#else
  return Status(StatusCode::kUnavailable,
                "this build has no CUDA backend (configure with -DTF_CUDA=ON where nvcc is found)");
#endif
}

std::vector<residency::Range> Model::residency_ranges() const {
  namespace rs = residency;
  std::vector<rs::Range> set;
#ifdef TF_HAVE_CUDA
  if (cuda_) {
    device_heap().for_each([&](const void* p, size_t n, BufferKind kind) {
      set.push_back(kind == BufferKind::kDevice
                        ? rs::Range{p, n, rs::Memory::kDevice, "device buffer"}
                        : rs::Range{p, n, rs::Memory::kHost, "pinned staging"});
    });
    return set;
  }
#endif
  for (const auto& f : checkpoint().files()) {
    if (f->mapping() != nullptr)  // none once LoadOptions::copy copied the weights out
      set.push_back(rs::Range{f->mapping(), f->mapping_size(), rs::Memory::kHost, "weights"});
  }
  weights().for_each_owned([&](const void* p, size_t n) {
    set.push_back(rs::Range{p, n, rs::Memory::kHost, "weights (owned copy)"});
  });
  return set;
}

Result<std::unique_ptr<residency::Backend>> Model::residency_backend() const {
  auto host = std::make_unique<residency::CpuBackend>();
#ifdef TF_HAVE_CUDA
  if (cuda_) {
    TF_ASSIGN_OR_RETURN(auto b,
                        residency::CudaBackend::create(cuda_->residency_api(), std::move(host)));
    return std::unique_ptr<residency::Backend>(std::move(b));
  }
#endif
  return std::unique_ptr<residency::Backend>(std::move(host));
}

void Model::follow_device_buffers([[maybe_unused]] BufferObserver* o) const {
#ifdef TF_HAVE_CUDA
  if (cuda_) device_heap().set_observer(o);
#endif
}

size_t Model::device_memory_bytes() const {
#ifdef TF_HAVE_CUDA
  if (cuda_) return cuda_->device_memory_bytes();
#endif
  return 0;
}

int64_t Model::graph_captures() const {
#ifdef TF_HAVE_CUDA
  if (cuda_) return cuda_->graph_captures();
#endif
  return 0;
}

#ifdef TF_HAVE_CUDA
namespace {
CudaSequenceState* device_state(SequenceState* s) {
  TF_CHECK(s->device, "a host state given to the device model");
  return static_cast<CudaSequenceState*>(s->device.get());
}
}  // namespace
#endif

void Model::forward_cuda([[maybe_unused]] std::span<const StepInput> inputs,
                         [[maybe_unused]] CudaRun how, [[maybe_unused]] std::vector<float>* logits,
                         [[maybe_unused]] std::vector<int32_t>* tokens) const {
#ifdef TF_HAVE_CUDA
  std::vector<CudaStepInput> in;
  in.reserve(inputs.size());
  for (const StepInput& i : inputs) {
    TF_CHECK(i.state->verify.base < 0,
             "the state's verify window (from n_past {}) is open: call rollback() first",
             i.state->verify.base);
    in.push_back(CudaStepInput{device_state(i.state), i.tokens, i.all_logits, i.verify});
    if (i.verify && !i.tokens.empty()) {
      i.state->verify.base = i.state->n_past;
      i.state->verify.T = static_cast<int64_t>(i.tokens.size());
    }
  }
  switch (how) {
    case CudaRun::kLogits:
      cuda_->forward(in, logits);
      break;
    case CudaRun::kArgmax:
      cuda_->forward_greedy(in, tokens);
      break;
    case CudaRun::kLaunch:
    case CudaRun::kLaunchChained:
      cuda_->launch_greedy(in, how == CudaRun::kLaunchChained);
      break;
  }
  for (const StepInput& i : inputs) i.state->n_past = device_state(i.state)->n_past;
#endif
}

void Model::launch_argmax(std::span<const StepInput> inputs, bool chained, ThreadPool* pool) const {
  if (cuda_) {
    forward_cuda(inputs, chained ? CudaRun::kLaunchChained : CudaRun::kLaunch, nullptr, nullptr);
    return;
  }
  TF_CHECK(launched_.size() < 2, "launch_argmax: two steps launched and not taken");
  std::vector<int32_t> tokens;
  if (!chained) {
    forward_argmax(inputs, &tokens, pool);
  } else {
    TF_CHECK(!launched_.empty() && launched_.back().size() == inputs.size(),
             "launch_argmax: a chained step needs the step before, one token per row");
    std::vector<StepInput> in(inputs.begin(), inputs.end());
    for (size_t i = 0; i < in.size(); ++i) {
      TF_CHECK(in[i].tokens.size() == 1 && !in[i].verify, "launch_argmax: chained rows decode");
      in[i].tokens = std::span<const int32_t>(&launched_.back()[i], 1);
    }
    forward_argmax(in, &tokens, pool);
  }
  launched_.push_back(std::move(tokens));
}

void Model::take_argmax(std::vector<int32_t>* tokens) const {
#ifdef TF_HAVE_CUDA
  if (cuda_) {
    cuda_->take_greedy(tokens);
    return;
  }
#endif
  TF_CHECK(!launched_.empty(), "take_argmax: no step launched");
  tokens->insert(tokens->end(), launched_.front().begin(), launched_.front().end());
  launched_.pop_front();
}

void Model::set_chained_token([[maybe_unused]] SequenceState* state,
                              [[maybe_unused]] int32_t token) const {
#ifdef TF_HAVE_CUDA
  if (!cuda_) return;
  CudaSequenceState* d = device_state(state);
  if (d->has_mtp) cuda_->set_chained_token(d, token);
#endif
}

void Model::reduce(float* y, int64_t n) const {
  if (comm_ != nullptr) tp_check(comm_->all_reduce_sum(y, n));
}

void Model::embed_rows(std::span<const int32_t> toks, float* out, int64_t ld) const {
  const Weights& w = *weights_;
  const int64_t H = config().hidden_size, M = static_cast<int64_t>(toks.size());
  if (comm_ == nullptr) {
    for (int64_t i = 0; i < M; ++i) cpu::row_to_f32(w.embed, toks[i], out + i * ld);
    return;
  }
  const int R = tp_.shard.size;
  std::vector<float> mine(M * H, 0.0f), all(R * M * H);
  for (int64_t i = 0; i < M; ++i) {
    const int64_t v = toks[i] - tp_.vocab0;
    if (v >= 0 && v < tp_.vocab_n) cpu::row_to_f32(w.embed, v, &mine[i * H]);
  }
  tp_check(comm_->all_gather(mine.data(), M * H, all.data()));
  const int64_t V = config().vocab_size;
  for (int64_t i = 0; i < M; ++i) {
    int owner = 0;  // the rank whose block [V r / R, V (r + 1) / R) holds toks[i]
    while (toks[i] >= V * (owner + 1) / R) ++owner;
    std::copy_n(&all[(owner * M + i) * H], H, out + i * ld);
  }
}

void Model::lm_head_rows(const float* h, int64_t M, float* logits, ThreadPool* pool) const {
  const Weights& w = *weights_;
  if (comm_ == nullptr) {
    matmul(w.lm_head, h, M, logits, pool);
    return;
  }
  // Each rank's [M, vocab_n] block, padded to vocab_stride columns so every rank sends the same
  // count; then [R, M, stride] -> [M, V].
  const int R = tp_.shard.size;
  const int64_t S = tp_.vocab_stride, V = config().vocab_size;
  std::vector<float> mine(M * S, 0.0f), all(R * M * S);
  matmul(w.lm_head, h, w.lm_head.cols, M, mine.data(), S, pool);
  tp_check(comm_->all_gather(mine.data(), M * S, all.data()));
  for (int r = 0; r < R; ++r) {
    const int64_t v0 = V * r / R, n = V * (r + 1) / R - v0;
    for (int64_t i = 0; i < M; ++i) std::copy_n(&all[(r * M + i) * S], n, logits + i * V + v0);
  }
}

size_t SequenceState::bytes() const {
  size_t n = 0;
  for (const Attention& a : attn) n += a.k.capacity() + a.v.capacity();
  for (const DeltaNet& d : delta) n += d.conv.capacity() + d.S.capacity();
  n += mtp_kv.k.capacity() + mtp_kv.v.capacity() + mtp_hidden.capacity();
  for (const FloatBuf& b : verify.conv_hist) n += b.capacity();
  for (const FloatBuf& b : verify.S_hist) n += b.capacity();
  return n * sizeof(float) + mtp_tokens.capacity() * sizeof(int32_t) +
         (device ? device.get()->bytes() : 0);
}

void SequenceState::rollback(int64_t n) {
  if (link.leader() != nullptr) link.leader()->rollback(link.id(), n);
  TF_CHECK(verify.base >= 0 && verify.base < n && n <= n_past,
           "rollback to {}: the verify window is [{}, {}]", n, verify.base, n_past);
  TF_CHECK(n_past == verify.base + verify.T, "n_past {} moved since the verify step", n_past);
  if (device) {  // the buffers are the device state's
    device.get()->rollback(n);
    n_past = n;
    verify.base = -1;
    verify.T = 0;
    return;
  }
  if (n < n_past) {
    const int64_t j = n - verify.base;  // tokens of the verify step that stay, 1..T-1
    for (size_t li = 0; li < attn.size(); ++li) {
      if (delta[li].S.empty()) {
        attn[li].k.resize(n * kv_row);
        attn[li].v.resize(n * kv_row);
        continue;
      }
      DeltaNet& d = delta[li];
      const size_t ns = d.S.size(), nc = d.conv.size(), conv_dim = nc / conv_rows;
      std::copy_n(verify.S_hist[li].begin() + (j - 1) * ns, ns, d.S.begin());
      std::copy_n(verify.conv_hist[li].begin() + j * conv_dim, nc, d.conv.begin());
    }
    if (has_mtp) {
      // The verify step only collected pending rows (forward syncs outside verify steps only).
      const int64_t R = static_cast<int64_t>(mtp_kv.k.size()) / kv_row;
      mtp_hidden.resize((n - R) * hidden_size);
      mtp_tokens.resize(n - 1 - R);
    }
    n_past = n;
  }
  verify.base = -1;
  verify.T = 0;
}

void SequenceState::release_verify() {
  TF_CHECK(verify.base < 0, "release_verify(): the verify window from {} is open", verify.base);
  if (link.leader() != nullptr) link.leader()->release_verify(link.id());
  if (device) device.get()->release_verify();
  for (FloatBuf& b : verify.conv_hist) FloatBuf(b.get_allocator()).swap(b);
  for (FloatBuf& b : verify.S_hist) FloatBuf(b.get_allocator()).swap(b);
}

SequenceState Model::new_state(BufferObserver* observer, bool mtp) const {
  const ModelConfig& c = config();
  TF_CHECK(!mtp || has_mtp(), "new_state(mtp = true): the checkpoint has no MTP head");
  SequenceState s;
#ifdef TF_HAVE_CUDA
  if (cuda_) {
    s.device = DeviceStateBox(std::make_unique<CudaSequenceState>(cuda_->new_state(mtp)));
    s.has_mtp = mtp;
    return s;
  }
#endif
  const TrackedAllocator<float> alloc(observer);
  s.attn.resize(c.num_hidden_layers, SequenceState::Attention{FloatBuf(alloc), FloatBuf(alloc)});
  s.delta.resize(c.num_hidden_layers, SequenceState::DeltaNet{FloatBuf(alloc), FloatBuf(alloc)});
  // This rank's heads only (TP=1: all of them).
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.full_attention[i]) continue;
    s.delta[i].conv.assign((c.linear_conv_kernel_dim - 1) * tp_.conv_dim, 0.0f);
    s.delta[i].S.assign(tp_.hv * c.linear_key_head_dim * c.linear_value_head_dim, 0.0f);
  }
  s.has_mtp = mtp;
  s.mtp_kv = SequenceState::Attention{FloatBuf(alloc), FloatBuf(alloc)};
  s.mtp_hidden = FloatBuf(alloc);
  s.verify.conv_hist.resize(c.num_hidden_layers, FloatBuf(alloc));
  s.verify.S_hist.resize(c.num_hidden_layers, FloatBuf(alloc));
  s.kv_row = tp_.nkv * c.head_dim;
  s.conv_rows = c.linear_conv_kernel_dim - 1;
  s.hidden_size = c.hidden_size;
  if (leader_) s.link = StateLink(leader_.get(), leader_->create(mtp));
  return s;
}

void Model::forward_argmax(std::span<const StepInput> inputs, std::vector<int32_t>* tokens,
                           ThreadPool* pool) const {
  if (cuda_) {
    forward_cuda(inputs, CudaRun::kArgmax, nullptr, tokens);
    return;
  }
  std::vector<float> logits;
  forward(inputs, &logits, pool);
  const int64_t V = config().vocab_size, R = static_cast<int64_t>(logits.size()) / V;
  for (int64_t r = 0; r < R; ++r)
    tokens->push_back(argmax_row(std::span<const float>(logits).subspan(r * V, V)));
}

void Model::forward(std::span<const StepInput> inputs, std::vector<float>* logits,
                    ThreadPool* pool) const {
  if (cuda_) {
    forward_cuda(inputs, CudaRun::kLogits, logits, nullptr);
    return;
  }
  if (leader_) leader_->send_forward(inputs);
  const ModelConfig& c = config();
  const Weights& w = *weights_;
  const int64_t H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  std::vector<int64_t> n0;  // n_past of each input before the step
  for (const auto& in : inputs) {
    TF_CHECK(in.state->verify.base < 0,
             "the state's verify window (from n_past {}) is open: call rollback() first",
             in.state->verify.base);
    N += static_cast<int64_t>(in.tokens.size());
    n0.push_back(in.state->n_past);
  }
  if (N == 0) return;
  for (const auto& in : inputs) {
    if (!in.verify || in.tokens.empty()) continue;
    in.state->verify.base = in.state->n_past;
    in.state->verify.T = static_cast<int64_t>(in.tokens.size());
  }

  std::vector<float> x(N * H), xn(N * H), y(N * H);
  std::vector<int32_t> toks;
  for (const auto& in : inputs) toks.insert(toks.end(), in.tokens.begin(), in.tokens.end());
  embed_rows(toks, x.data(), H);
  int64_t row = 0;

  std::vector<AttnRows> seqs;
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const LayerWeights& L = w.layers[li];
    cpu::rmsnorm_zc(x.data(), L.input_norm.data(), N, H, eps, xn.data());
    if (L.full_attention) {
      seqs.clear();
      for (const auto& in : inputs) {
        seqs.push_back(
            {&in.state->attn[li], in.state->n_past, static_cast<int64_t>(in.tokens.size())});
      }
      attention_layer(L, seqs, xn.data(), y.data(), pool);
    } else {
      deltanet_layer(L, li, inputs, xn.data(), y.data(), pool);
    }
    reduce(y.data(), N * H);  // row-parallel o_proj / out_proj
    for (int64_t i = 0; i < N * H; ++i) x[i] += y[i];
    cpu::rmsnorm_zc(x.data(), L.post_norm.data(), N, H, eps, xn.data());
    if (L.moe)
      moe(L, xn.data(), N, y.data(), pool);
    else
      ffn(L.mlp, xn.data(), N, y.data(), pool);
    reduce(y.data(), N * H);  // this rank's experts and its share of the shared expert
    for (int64_t i = 0; i < N * H; ++i) x[i] += y[i];
  }

  // Final norm of every row (H[p]: lm_head's input and the MTP head's), lm_head on the rows that
  // want logits.
  std::vector<float>& h = xn;
  cpu::rmsnorm_zc(x.data(), w.final_norm.data(), N, H, eps, h.data());
  std::vector<int64_t> rows;
  row = 0;
  for (const auto& in : inputs) {
    const int64_t T = static_cast<int64_t>(in.tokens.size());
    if (T > 0) {
      for (int64_t t = in.all_logits || in.verify ? 0 : T - 1; t < T; ++t) rows.push_back(row + t);
    }
    row += T;
  }
  std::vector<float> hl(rows.size() * H);
  for (size_t i = 0; i < rows.size(); ++i) std::copy_n(&h[rows[i] * H], H, &hl[i * H]);
  const size_t first = logits->size();
  logits->resize(first + rows.size() * c.vocab_size);
  lm_head_rows(hl.data(), static_cast<int64_t>(rows.size()), logits->data() + first, pool);

  for (const auto& in : inputs) in.state->n_past += static_cast<int64_t>(in.tokens.size());
  if (has_mtp()) mtp_collect(inputs, n0, h.data(), pool);
}

void Model::mtp_collect(std::span<const StepInput> inputs, std::span<const int64_t> n0,
                        const float* h, ThreadPool* pool) const {
  const int64_t H = config().hidden_size;
  std::vector<SequenceState*> due;
  int64_t row = 0;
  for (size_t s = 0; s < inputs.size(); ++s) {
    const StepInput& in = inputs[s];
    const int64_t T = static_cast<int64_t>(in.tokens.size());
    SequenceState& st = *in.state;
    if (st.has_mtp && T > 0) {
      // x[0] follows no position; every later token is the next token of the position before.
      st.mtp_hidden.insert(st.mtp_hidden.end(), h + row * H, h + (row + T) * H);
      st.mtp_tokens.insert(st.mtp_tokens.end(), in.tokens.begin() + (n0[s] == 0 ? 1 : 0),
                           in.tokens.end());
      if (!in.verify && st.mtp_tokens.size() >= kMtpSyncRows) due.push_back(&st);
    }
    row += T;
  }
  if (!due.empty()) mtp_sync_local(due, pool);
}

void Model::mtp_sync(std::span<SequenceState* const> states, ThreadPool* pool) const {
#ifdef TF_HAVE_CUDA
  if (cuda_) {
    std::vector<CudaSequenceState*> dev;
    for (SequenceState* st : states) {
      TF_CHECK(st->verify.base < 0, "mtp_sync(): needs an MTP state, window closed");
      dev.push_back(device_state(st));
    }
    cuda_->mtp_sync(dev);
    return;
  }
#endif
  if (leader_) leader_->send_mtp_sync(states);
  mtp_sync_local(states, pool);
}

void Model::mtp_sync_local(std::span<SequenceState* const> states, ThreadPool* pool) const {
  const ModelConfig& c = config();
  const MtpWeights& m = *weights_->mtp;
  const int64_t H = c.hidden_size;
  // Pending row i of a state: position R + i, hidden H[R + i], token x[R + i + 1].
  std::vector<int32_t> toks;
  std::vector<const float*> hid;
  std::vector<AttnRows> seqs;
  for (SequenceState* st : states) {
    TF_CHECK(st->has_mtp && st->verify.base < 0, "mtp_sync(): needs an MTP state, window closed");
    const int64_t R = static_cast<int64_t>(st->mtp_kv.k.size()) / st->kv_row;
    const int64_t n = static_cast<int64_t>(st->mtp_tokens.size());
    TF_CHECK((R + n + 1 == st->n_past || (st->n_past == 0 && n == 0)) &&
                 static_cast<int64_t>(st->mtp_hidden.size()) == (st->n_past - R) * H,
             "MTP state: {} rows + {} pending, {} hidden floats at n_past {}", R, n,
             st->mtp_hidden.size(), st->n_past);
    for (int64_t i = 0; i < n; ++i) {
      toks.push_back(st->mtp_tokens[i]);
      hid.push_back(st->mtp_hidden.data() + i * H);
    }
    if (n > 0) seqs.push_back({&st->mtp_kv, R, n});
  }
  const int64_t M = static_cast<int64_t>(toks.size());
  if (M == 0) return;
  std::vector<float> u(M * 2 * H), xf(M * H);
  mtp_input(toks, hid, u.data());
  matmul(m.fc, u.data(), M, xf.data(), pool);
  cpu::rmsnorm_zc(xf.data(), m.layer.input_norm.data(), M, H, static_cast<float>(c.rms_norm_eps),
                  xf.data());
  append_kv(m.layer, seqs, xf.data(), pool);
  for (SequenceState* st : states) {  // keep H[n_past - 1] only
    const size_t n = st->mtp_tokens.size();
    st->mtp_hidden.erase(st->mtp_hidden.begin(), st->mtp_hidden.begin() + n * H);
    st->mtp_tokens.clear();
  }
}

void Model::mtp_input(std::span<const int32_t> toks, std::span<const float* const> hidden,
                      float* u) const {
  const ModelConfig& c = config();
  const MtpWeights& m = *weights_->mtp;
  const int64_t H = c.hidden_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  embed_rows(toks, u, 2 * H);
  for (size_t r = 0; r < toks.size(); ++r) {
    float* ur = u + r * 2 * H;
    cpu::rmsnorm_zc(ur, m.pre_fc_norm_embedding.data(), 1, H, eps, ur);
    cpu::rmsnorm_zc(hidden[r], m.pre_fc_norm_hidden.data(), 1, H, eps, ur + H);
  }
}

void Model::draft(std::span<const DraftInput> inputs, std::span<Draft> out,
                  ThreadPool* pool) const {
  TF_CHECK(inputs.size() == out.size(), "{} inputs, {} outputs", inputs.size(), out.size());
  if (inputs.empty()) return;
  TF_CHECK(has_mtp(), "draft(): the checkpoint has no MTP head");
#ifdef TF_HAVE_CUDA
  if (cuda_) {
    for (const DraftInput& d : inputs) device_state(d.state);
    cuda_->draft(inputs, out);
    return;
  }
#endif
  if (leader_) leader_->send_draft(inputs);
  const ModelConfig& c = config();
  const MtpWeights& m = *weights_->mtp;
  const LayerWeights& L = m.layer;
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // A sequence still drafting: its next row's position, token and hidden state.
  struct Live {
    size_t i;
    int64_t pos;
    int32_t tok;
    std::vector<float> hid;
  };
  std::vector<SequenceState*> states;
  for (const DraftInput& d : inputs) states.push_back(d.state);
  mtp_sync_local(states, pool);
  std::vector<Live> live;
  int max_steps = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DraftInput& d = inputs[i];
    const SequenceState& st = *d.state;
    TF_CHECK(st.has_mtp && st.n_past >= 1 && st.verify.base < 0,
             "draft(): needs an MTP state after a step with its window closed (n_past {})",
             st.n_past);
    out[i] = Draft{};
    if (d.max_tokens <= 0) continue;
    live.push_back({i, st.n_past - 1, d.next_token,
                    std::vector<float>(st.mtp_hidden.begin(), st.mtp_hidden.end())});
    max_steps = std::max(max_steps, d.max_tokens);
  }
  std::vector<int32_t> toks;
  std::vector<const float*> hid;
  std::vector<AttnRows> seqs;
  std::vector<float> u, x, xn, y, lg;
  for (int step = 0; step < max_steps && !live.empty(); ++step) {
    const int64_t M = static_cast<int64_t>(live.size());
    toks.clear();
    hid.clear();
    seqs.clear();
    for (Live& l : live) {
      toks.push_back(l.tok);
      hid.push_back(l.hid.data());
      seqs.push_back({&inputs[l.i].state->mtp_kv, l.pos, 1});
    }
    // One decoder layer of the head (§6.1): fc, gated attention over its own cache, MoE, norm.
    u.resize(M * 2 * H);
    x.resize(M * H);
    xn.resize(M * H);
    y.resize(M * H);
    mtp_input(toks, hid, u.data());
    matmul(m.fc, u.data(), M, x.data(), pool);
    cpu::rmsnorm_zc(x.data(), L.input_norm.data(), M, H, eps, xn.data());
    attention_layer(L, seqs, xn.data(), y.data(), pool);
    reduce(y.data(), M * H);
    for (int64_t k = 0; k < M * H; ++k) x[k] += y[k];
    cpu::rmsnorm_zc(x.data(), L.post_norm.data(), M, H, eps, xn.data());
    if (L.moe)
      moe(L, xn.data(), M, y.data(), pool);
    else
      ffn(L.mlp, xn.data(), M, y.data(), pool);
    reduce(y.data(), M * H);
    for (int64_t k = 0; k < M * H; ++k) x[k] += y[k];
    cpu::rmsnorm_zc(x.data(), m.norm.data(), M, H, eps, xn.data());
    lg.resize(M * V);
    lm_head_rows(xn.data(), M, lg.data(), pool);

    std::vector<Live> next;
    for (int64_t r = 0; r < M; ++r) {
      Live& l = live[r];
      const DraftInput& d = inputs[l.i];
      Draft& o = out[l.i];
      const float* lr = &lg[r * V];
      float p = 0;
      const auto best = static_cast<int32_t>(cpu::argmax_prob(lr, V, &p));
      if (p < d.p_min) continue;
      o.tokens.push_back(best);
      o.top_prob.push_back(p);
      if (d.want_logits) o.logits.insert(o.logits.end(), lr, lr + V);
      if (static_cast<int>(o.tokens.size()) == d.max_tokens) continue;
      l.pos += 1;
      l.tok = best;
      l.hid.assign(&xn[r * H], &xn[(r + 1) * H]);
      next.push_back(std::move(l));
    }
    live.swap(next);
  }
  // Drop the scratch rows: the head's cache is back to max(n_past - 1, 0) rows.
  for (size_t i = 0; i < inputs.size(); ++i) {
    SequenceState& st = *inputs[i].state;
    st.mtp_kv.k.resize((st.n_past - 1) * st.kv_row);
    st.mtp_kv.v.resize((st.n_past - 1) * st.kv_row);
  }
}

void Model::append_kv(const LayerWeights& L, std::span<const AttnRows> seqs, const float* xn,
                      ThreadPool* pool) const {
  const ModelConfig& c = config();
  const int64_t nkv = tp_.nkv, D = c.head_dim;  // this rank's KV heads
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  for (const auto& s : seqs) N += s.T;
  std::vector<float> k(N * nkv * D), v(N * nkv * D);
  matmul(L.k_proj, xn, N, k.data(), pool);
  matmul(L.v_proj, xn, N, v.data(), pool);
  cpu::rmsnorm_zc(k.data(), L.k_norm.data(), N * nkv, D, eps, k.data());
  int64_t row = 0;
  for (const auto& s : seqs) {
    SequenceState::Attention& cache = *s.cache;
    TF_CHECK(static_cast<int64_t>(cache.k.size()) == s.pos0 * nkv * D,
             "attention cache has {} floats, appending at position {}", cache.k.size(), s.pos0);
    for (int64_t t = 0; t < s.T; ++t) {
      cpu::rope_neox(&k[(row + t) * nkv * D], nkv, D, c.rotary_dim(), inv_freq_.data(), s.pos0 + t);
    }
    cache.k.insert(cache.k.end(), k.begin() + row * nkv * D, k.begin() + (row + s.T) * nkv * D);
    cache.v.insert(cache.v.end(), v.begin() + row * nkv * D, v.begin() + (row + s.T) * nkv * D);
    row += s.T;
  }
}

void Model::attention_layer(const LayerWeights& L, std::span<const AttnRows> seqs, const float* xn,
                            float* y, ThreadPool* pool) const {
  const ModelConfig& c = config();
  const int64_t nh = tp_.nh, nkv = tp_.nkv, D = c.head_dim;  // this rank's heads
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  for (const auto& s : seqs) N += s.T;

  std::vector<float> qg(N * nh * 2 * D);
  matmul(L.q_proj, xn, N, qg.data(), pool);
  append_kv(L, seqs, xn, pool);
  // Split each head's [query D | gate D].
  std::vector<float> q(N * nh * D), gate(N * nh * D), o(N * nh * D);
  for (int64_t r = 0; r < N * nh; ++r) {
    std::copy_n(&qg[r * 2 * D], D, &q[r * D]);
    std::copy_n(&qg[r * 2 * D + D], D, &gate[r * D]);
  }
  cpu::rmsnorm_zc(q.data(), L.q_norm.data(), N * nh, D, eps, q.data());

  int64_t row = 0;
  std::vector<int64_t> pos;
  for (const auto& s : seqs) {
    pos.resize(s.T);
    for (int64_t t = 0; t < s.T; ++t) {
      pos[t] = s.pos0 + t;
      cpu::rope_neox(&q[(row + t) * nh * D], nh, D, c.rotary_dim(), inv_freq_.data(), pos[t]);
    }
    cpu::attention(&q[row * nh * D], s.T, pos.data(), s.cache->k.data(), s.cache->v.data(), nh, nkv,
                   D, 1.0f / std::sqrt(static_cast<float>(D)), &o[row * nh * D], pool);
    row += s.T;
  }
  for (int64_t i = 0; i < N * nh * D; ++i) o[i] *= cpu::sigmoid(gate[i]);
  matmul(L.o_proj, o.data(), N, y, pool);
}

void Model::deltanet_layer(const LayerWeights& L, int64_t li, std::span<const StepInput> inputs,
                           const float* xn, float* y, ThreadPool* pool) const {
  const ModelConfig& c = config();
  const int64_t Hk = tp_.hk, Hv = tp_.hv;  // this rank's key and value heads
  const int64_t Dk = c.linear_key_head_dim, Dv = c.linear_value_head_dim, r = Hv / Hk;
  const int64_t K = c.linear_conv_kernel_dim, C = tp_.conv_dim, kd = Hk * Dk;
  const int64_t G = 2 * Dk + 2 * r * Dv;  // qkvz row group per k-head
  const float eps = static_cast<float>(c.rms_norm_eps);
  int64_t N = 0;
  for (const auto& in : inputs) N += static_cast<int64_t>(in.tokens.size());

  std::vector<float> P(N * Hk * G), BA(N * Hk * 2 * r);
  matmul(L.in_qkvz, xn, N, P.data(), pool);
  matmul(L.in_ba, xn, N, BA.data(), pool);
  // De-interleave the per-k-head groups into the conv channel order [q | k | v], z, b, a.
  std::vector<float> xc(N * C), z(N * Hv * Dv), b(N * Hv), a(N * Hv);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t g = 0; g < Hk; ++g) {
      const float* src = &P[(t * Hk + g) * G];
      std::copy_n(src, Dk, &xc[t * C + g * Dk]);
      std::copy_n(src + Dk, Dk, &xc[t * C + kd + g * Dk]);
      std::copy_n(src + 2 * Dk, r * Dv, &xc[t * C + 2 * kd + g * r * Dv]);
      std::copy_n(src + 2 * Dk + r * Dv, r * Dv, &z[(t * Hv + g * r) * Dv]);
      const float* ba = &BA[(t * Hk + g) * 2 * r];
      for (int64_t j = 0; j < r; ++j) {
        b[t * Hv + g * r + j] = ba[j];
        a[t * Hv + g * r + j] = ba[r + j];
      }
    }
  }

  std::vector<float> o(N * Hv * Dv), hist, q, k, v, beta, gl;
  int64_t row = 0;
  for (const auto& in : inputs) {
    const int64_t T = static_cast<int64_t>(in.tokens.size());
    SequenceState::DeltaNet& st = in.state->delta[li];
    // Causal depthwise conv over [K-1 history rows | T new rows], then SiLU.
    hist.assign(st.conv.begin(), st.conv.end());
    hist.insert(hist.end(), xc.begin() + row * C, xc.begin() + (row + T) * C);
    q.resize(T * kd);
    k.resize(T * kd);
    v.resize(T * Hv * Dv);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t ch = 0; ch < C; ++ch) {
        float s = 0;
        for (int64_t j = 0; j < K; ++j) s += L.conv[ch * K + j] * hist[(t + j) * C + ch];
        s = cpu::silu(s);
        if (ch < kd)
          q[t * kd + ch] = s;
        else if (ch < 2 * kd)
          k[t * kd + ch - kd] = s;
        else
          v[t * Hv * Dv + ch - 2 * kd] = s;
      }
    }
    st.conv.assign(hist.end() - (K - 1) * C, hist.end());
    cpu::l2norm_scale(q.data(), T * Hk, Dk, 1e-6f, 1.0f / std::sqrt(static_cast<float>(Dk)));
    cpu::l2norm_scale(k.data(), T * Hk, Dk, 1e-6f, 1.0f);
    beta.resize(T * Hv);
    gl.resize(T * Hv);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hv; ++h) {
        beta[t * Hv + h] = cpu::sigmoid(b[(row + t) * Hv + h]);
        gl[t * Hv + h] = L.neg_exp_a[h] * cpu::softplus(a[(row + t) * Hv + h] + L.dt_bias[h]);
      }
    }
    cpu::DeltaArgs args{q.data(), k.data(), v.data(), gl.data(), beta.data(), T,
                        Hk,       Hv,       Dk,       Dv,        st.S.data(), &o[row * Hv * Dv]};
    if (in.verify) {
      // Token recurrence with S kept after every token, and the conv inputs, for rollback().
      SequenceState::Verify& vr = in.state->verify;
      vr.conv_hist[li].assign(hist.begin(), hist.end());
      // Grown only: rollback() keeps the size, so a steady k does not re-zero it every step.
      if (vr.S_hist[li].size() < static_cast<size_t>(T * Hv * Dk * Dv))
        vr.S_hist[li].resize(T * Hv * Dk * Dv);
      args.S_hist = vr.S_hist[li].data();
    }
    const bool recurrent =
        in.verify || (in.form == DeltaForm::kAuto ? T == 1 : in.form == DeltaForm::kRecurrent);
    TF_CHECK(!recurrent || T == 1 || in.verify, "the recurrent form takes one token, got {}", T);
    if (recurrent)
      cpu::delta_rule_recurrent(args, pool);
    else
      cpu::delta_rule_chunked(args, in.state->n_past, kDeltaChunk, pool);
    row += T;
  }
  cpu::rmsnorm_gated(o.data(), z.data(), L.gnorm.data(), N * Hv, Dv, eps, o.data());
  matmul(L.out_proj, o.data(), N, y, pool);
}

void Model::ffn(const FfnWeights& f, const float* x, int64_t N, float* y, ThreadPool* pool) const {
  cpu::ffn(f, x, N, y, pool);
}

// Router, routed experts and shared expert in one fused op (backends/cpu/moe.h): softmax over
// the experts in fp32, top-k (ties to the lower index), optional renormalisation, each row's
// experts summed in ascending index order, then the sigmoid-gated shared expert.
void Model::moe(const LayerWeights& L, const float* xn, int64_t N, float* y,
                ThreadPool* pool) const {
  const ModelConfig& c = config();
  cpu::MoeArgs a;
  a.router = L.router;
  a.experts = L.experts.data();
  a.expert_begin = tp_.e0;  // expert parallelism: this rank's experts only
  a.expert_end = tp_.e1;
  a.top_k = c.num_experts_per_tok;
  a.norm_topk_prob = c.norm_topk_prob;
  a.shared = &L.shared;
  a.shared_gate = L.shared_gate.data();
  cpu::moe_ffn(a, xn, N, y, pool);
}

double Model::decode_bytes_per_token() const {
  const ModelConfig& c = config();
  const Weights& w = *weights_;
  auto bytes = [](const Mat& m) {
    return static_cast<double>(m.rows * m.cols * dtype_size(m.dtype));
  };
  auto ffn_bytes = [&](const FfnWeights& f) { return bytes(f.gate) + bytes(f.up) + bytes(f.down); };
  double total = bytes(w.lm_head) + static_cast<double>(c.hidden_size * dtype_size(w.embed.dtype));
  for (const LayerWeights& L : w.layers) {
    if (L.full_attention)
      total += bytes(L.q_proj) + bytes(L.k_proj) + bytes(L.v_proj) + bytes(L.o_proj);
    else
      total += bytes(L.in_qkvz) + bytes(L.in_ba) + bytes(L.out_proj);
    if (L.moe) {
      total += bytes(L.router) + ffn_bytes(L.shared) +
               (tp_.e1 > tp_.e0
                    ? static_cast<double>(c.num_experts_per_tok) * ffn_bytes(L.experts[tp_.e0])
                    : 0.0);
    } else {
      total += ffn_bytes(L.mlp);
    }
  }
  return total;
}

}  // namespace tf
