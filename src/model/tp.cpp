#include "model/tp.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>
#include <utility>

#include "comm/mpi_comm.h"
#include "core/thread_pool.h"
#include "model/model.h"

namespace tf {
namespace {

// Little byte writer / reader of the messages (same binary on every rank: native layout).
template <class T>
void put(std::vector<uint8_t>* b, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b->insert(b->end(), p, p + sizeof(T));
}

struct Reader {
  const std::vector<uint8_t>& b;
  size_t at = 0;
  template <class T>
  T get() {
    TF_CHECK(at + sizeof(T) <= b.size(), "tensor-parallel message truncated at byte {}", at);
    T v;
    std::memcpy(&v, b.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
};

std::unique_ptr<Communicator>& group() {
  static std::unique_ptr<Communicator> g;
  return g;
}
std::atomic<bool> g_stop_sent{false};

}  // namespace

// ---- Rank 0: recording and sending -------------------------------------------------------------

void TpLeader::op(TpOp o, uint64_t a, int64_t b) {
  put(&ops_, static_cast<uint8_t>(o));
  put(&ops_, a);
  put(&ops_, b);
  ++n_ops_;
}

uint64_t TpLeader::create(bool mtp) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  op(TpOp::kNew, id, mtp ? 1 : 0);
  return id;
}

uint64_t TpLeader::copy(uint64_t src, uint64_t dst) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dst == 0) dst = next_id_++;
  op(TpOp::kCopy, src, static_cast<int64_t>(dst));
  return dst;
}

void TpLeader::free(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  op(TpOp::kFree, id, 0);
}

void TpLeader::rollback(uint64_t id, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  op(TpOp::kRollback, id, n);
}

void TpLeader::release_verify(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  op(TpOp::kReleaseVerify, id, 0);
}

// Message: [call u8][n_ops u64][ops][body]; sent as its size (i64), then its bytes.
void TpLeader::send(TpCall call, const std::vector<uint8_t>& body) {
  std::vector<uint8_t> msg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    put(&msg, static_cast<uint8_t>(call));
    put(&msg, static_cast<uint64_t>(n_ops_));
    msg.insert(msg.end(), ops_.begin(), ops_.end());
    ops_.clear();
    n_ops_ = 0;
  }
  msg.insert(msg.end(), body.begin(), body.end());
  int64_t size = static_cast<int64_t>(msg.size());
  tp_check(comm_->broadcast(&size, sizeof(size), 0));
  tp_check(comm_->broadcast(msg.data(), size, 0));
}

namespace {
uint64_t id_of(const SequenceState* s) {
  TF_CHECK(s->link.leader() != nullptr, "a state not made by Model::new_state in a TP group");
  return s->link.id();
}
}  // namespace

void TpLeader::send_forward(std::span<const StepInput> inputs) {
  std::vector<uint8_t> b;
  put(&b, static_cast<uint64_t>(inputs.size()));
  for (const StepInput& in : inputs) {
    put(&b, id_of(in.state));
    put(&b, static_cast<uint64_t>(in.tokens.size()));
    for (int32_t t : in.tokens) put(&b, t);
    put(&b, static_cast<uint8_t>(in.all_logits));
    put(&b, static_cast<uint8_t>(in.verify));
    put(&b, static_cast<uint8_t>(in.form));
  }
  send(TpCall::kForward, b);
}

void TpLeader::send_draft(std::span<const DraftInput> inputs) {
  std::vector<uint8_t> b;
  put(&b, static_cast<uint64_t>(inputs.size()));
  for (const DraftInput& d : inputs) {
    put(&b, id_of(d.state));
    put(&b, d.next_token);
    put(&b, d.max_tokens);
    put(&b, d.p_min);
    put(&b, static_cast<uint8_t>(d.want_logits));
  }
  send(TpCall::kDraft, b);
}

void TpLeader::send_mtp_sync(std::span<SequenceState* const> states) {
  std::vector<uint8_t> b;
  put(&b, static_cast<uint64_t>(states.size()));
  for (const SequenceState* s : states) put(&b, id_of(s));
  send(TpCall::kMtpSync, b);
}

void TpLeader::send_stop() {
  send(TpCall::kStop, {});
  g_stop_sent = true;
}

// ---- StateLink ---------------------------------------------------------------------------------

StateLink::StateLink(const StateLink& o) : leader_(o.leader_) {
  if (leader_ != nullptr) id_ = leader_->copy(o.id_, 0);
}

StateLink& StateLink::operator=(const StateLink& o) {
  if (this == &o) return *this;
  if (o.leader_ == nullptr) {
    reset();
  } else if (leader_ == o.leader_) {
    id_ = leader_->copy(o.id_, id_);  // overwrite this state's shards in place
  } else {
    reset();
    leader_ = o.leader_;
    id_ = leader_->copy(o.id_, 0);
  }
  return *this;
}

StateLink::StateLink(StateLink&& o) noexcept : leader_(o.leader_), id_(o.id_) {
  o.leader_ = nullptr;
  o.id_ = 0;
}

StateLink& StateLink::operator=(StateLink&& o) noexcept {
  if (this == &o) return *this;
  reset();
  leader_ = std::exchange(o.leader_, nullptr);
  id_ = std::exchange(o.id_, 0);
  return *this;
}

StateLink::~StateLink() {
  reset();
}

void StateLink::reset() noexcept {
  if (leader_ != nullptr && id_ != 0) leader_->free(id_);
  leader_ = nullptr;
  id_ = 0;
}

// ---- The group ---------------------------------------------------------------------------------

void tp_install(std::unique_ptr<Communicator> comm) {
  group() = std::move(comm);
}

Communicator* tp_group() {
  return group().get();
}

void tp_stop_followers() {
  Communicator* comm = tp_group();
  if (comm == nullptr || comm->rank() != 0 || comm->size() == 1 || g_stop_sent) return;
  TpLeader(comm).send_stop();
}

void tp_uninstall() {
  group().reset();
  mpi_finalize();
}

// ---- Followers ---------------------------------------------------------------------------------

int tp_follow(const std::string& dir, int threads, const LoadOptions& opts) {
  Communicator* comm = tp_group();
  TF_CHECK(comm != nullptr && comm->rank() != 0, "tp_follow() on rank 0 or without a group");
  // mpirun forwards SIGINT/SIGTERM to every rank; a follower ends when rank 0 says stop (after
  // rank 0's own clean shutdown), or when mpirun kills it because rank 0 is gone.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  auto model_or = Model::load(dir, {}, opts);
  if (!model_or) tp_fatal(fmt::format("rank {}: {}", comm->rank(), model_or.status().to_string()));
  const Model& model = **model_or;
  ThreadPool pool(threads);
  std::map<uint64_t, SequenceState> states;  // rank 0's state id -> this rank's shard of it
  std::vector<uint8_t> msg;
  std::vector<int32_t> tokens;
  std::vector<float> logits;
  for (;;) {
    int64_t size = 0;
    tp_check(comm->broadcast(&size, sizeof(size), 0));
    msg.resize(size);
    tp_check(comm->broadcast(msg.data(), size, 0));
    Reader rd{msg};
    const auto call = static_cast<TpCall>(rd.get<uint8_t>());
    const auto n_ops = rd.get<uint64_t>();
    for (uint64_t i = 0; i < n_ops; ++i) {
      const auto o = static_cast<TpOp>(rd.get<uint8_t>());
      const auto a = rd.get<uint64_t>();
      const auto b = rd.get<int64_t>();
      switch (o) {
        case TpOp::kNew:
          states.insert_or_assign(a, model.new_state(nullptr, b != 0));
          break;
        case TpOp::kCopy:
          if (a != static_cast<uint64_t>(b)) states.insert_or_assign(b, states.at(a));
          break;
        case TpOp::kFree:
          states.erase(a);
          break;
        case TpOp::kRollback:
          states.at(a).rollback(b);
          break;
        case TpOp::kReleaseVerify:
          states.at(a).release_verify();
          break;
      }
    }
    switch (call) {
      case TpCall::kStop:
        return 0;
      case TpCall::kForward: {
        const auto n = rd.get<uint64_t>();
        std::vector<StepInput> inputs(n);
        std::vector<size_t> offsets(n);
        tokens.clear();
        for (uint64_t i = 0; i < n; ++i) {
          inputs[i].state = &states.at(rd.get<uint64_t>());
          const auto T = rd.get<uint64_t>();
          offsets[i] = tokens.size();
          for (uint64_t t = 0; t < T; ++t) tokens.push_back(rd.get<int32_t>());
          inputs[i].tokens = std::span<const int32_t>(tokens.data() + offsets[i], T);
          inputs[i].all_logits = rd.get<uint8_t>() != 0;
          inputs[i].verify = rd.get<uint8_t>() != 0;
          inputs[i].form = static_cast<DeltaForm>(rd.get<uint8_t>());
        }
        // tokens may have moved while growing: point the spans again.
        for (uint64_t i = 0; i < n; ++i)
          inputs[i].tokens =
              std::span<const int32_t>(tokens.data() + offsets[i], inputs[i].tokens.size());
        logits.clear();
        model.forward(inputs, &logits, &pool);
        break;
      }
      case TpCall::kDraft: {
        const auto n = rd.get<uint64_t>();
        std::vector<DraftInput> inputs(n);
        for (DraftInput& d : inputs) {
          d.state = &states.at(rd.get<uint64_t>());
          d.next_token = rd.get<int32_t>();
          d.max_tokens = rd.get<int>();
          d.p_min = rd.get<float>();
          d.want_logits = rd.get<uint8_t>() != 0;
        }
        std::vector<Draft> out(n);
        model.draft(inputs, out, &pool);
        break;
      }
      case TpCall::kMtpSync: {
        const auto n = rd.get<uint64_t>();
        std::vector<SequenceState*> ss(n);
        for (auto& s : ss) s = &states.at(rd.get<uint64_t>());
        model.mtp_sync(ss, &pool);
        break;
      }
    }
  }
}

// ---- Watchdog ----------------------------------------------------------------------------------

namespace {
// Alive: /proc/<pid> exists and is not a zombie (a dead child its launcher has not reaped yet).
bool alive(int pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  if (!f) return false;
  std::string line;
  std::getline(f, line);
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] != 'Z' &&
         line[close + 2] != 'X';
}
}  // namespace

void tp_start_watchdog() {
  Communicator* comm = tp_group();
  if (comm == nullptr || comm->size() == 1) return;
  // Every rank's pid and host name, from each rank in turn.
  struct Who {
    int64_t pid;
    char host[64];
  };
  std::vector<Who> who(comm->size());
  for (int r = 0; r < comm->size(); ++r) {
    if (r == comm->rank()) {
      who[r].pid = getpid();
      std::memset(who[r].host, 0, sizeof(who[r].host));
      gethostname(who[r].host, sizeof(who[r].host) - 1);
    }
    tp_check(comm->broadcast(&who[r], sizeof(Who), r));
  }
  if (comm->rank() != 0) return;
  std::vector<std::pair<int, int>> local;  // (rank, pid) on this host
  for (int r = 1; r < comm->size(); ++r) {
    if (std::strncmp(who[r].host, who[0].host, sizeof(who[r].host)) == 0)
      local.push_back({r, static_cast<int>(who[r].pid)});
  }
  std::thread([local] {
    // Until rank 0 tells the followers to stop: after that they exit, and that is no death.
    while (!g_stop_sent) {
      for (const auto& [r, pid] : local) {
        if (g_stop_sent) return;
        if (!alive(pid)) tp_fatal(fmt::format("rank {} (pid {}) died", r, pid));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }).detach();
}

}  // namespace tf
