// Tensor parallelism across processes: rank 0 runs everything a single process runs (engine,
// server, CLI) and each other rank follows it, computing its shard of every step.
//
// Rank 0's Model sends, before each compute call (forward, draft, mtp_sync), one message over the
// communicator: the state operations since the last message, then the call and its inputs. A
// follower (tp_follow) applies the state operations to its own shards of the same sequences, then
// makes the same call. So the engine, the kept-state pool and the MTP drafting code are unchanged:
// they copy, keep and free SequenceStates as before, and each state carries a StateLink that
// records those operations for the followers (a copy is a kCopy, a destructor a kFree, rollback()
// a kRollback, ...). With TP=1 no state has a link and nothing is recorded or sent.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "model/weights.h"

namespace tf {

class Model;
struct StepInput;
struct DraftInput;
struct SequenceState;

// The operations a follower mirrors, in the order rank 0 did them.
enum class TpOp : uint8_t { kNew, kCopy, kFree, kRollback, kReleaseVerify };
// The compute call a message carries.
enum class TpCall : uint8_t { kForward, kDraft, kMtpSync, kStop };

// Rank 0's side: records state operations (from any thread) and sends them with each call.
class TpLeader {
 public:
  explicit TpLeader(Communicator* comm) : comm_(comm) {}

  uint64_t create(bool mtp);                  // a new state; returns its id
  uint64_t copy(uint64_t src, uint64_t dst);  // dst = copy of src; dst 0: a new id, returned
  void free(uint64_t id);
  void rollback(uint64_t id, int64_t n);
  void release_verify(uint64_t id);

  // Each sends the pending operations and the call to every follower (a failure is tp_fatal).
  void send_forward(std::span<const StepInput> inputs);
  void send_draft(std::span<const DraftInput> inputs);
  void send_mtp_sync(std::span<SequenceState* const> states);
  void send_stop();

 private:
  void op(TpOp o, uint64_t a, int64_t b);
  void send(TpCall call, const std::vector<uint8_t>& body);

  Communicator* comm_;
  std::mutex mu_;
  uint64_t next_id_ = 1;
  std::vector<uint8_t> ops_;  // pending: [op u8, a u64, b i64] each
  size_t n_ops_ = 0;
};

// A state's identity in a tensor-parallel group, on rank 0 only (elsewhere it is empty). Copying a
// linked state makes a new id and records the copy; destroying it records the free; so
// SequenceState keeps its value semantics.
class StateLink {
 public:
  StateLink() = default;
  StateLink(TpLeader* leader, uint64_t id) : leader_(leader), id_(id) {}
  StateLink(const StateLink& o);
  StateLink& operator=(const StateLink& o);
  StateLink(StateLink&& o) noexcept;
  StateLink& operator=(StateLink&& o) noexcept;
  ~StateLink();

  TpLeader* leader() const { return leader_; }
  uint64_t id() const { return id_; }

 private:
  void reset() noexcept;
  TpLeader* leader_ = nullptr;
  uint64_t id_ = 0;
};

// The process's tensor-parallel group, set up by the CLI (--tp N) before any model is loaded;
// Model::load then loads this rank's shard and joins the group. Null (the default): TP=1.
void tp_install(std::unique_ptr<Communicator> comm);
Communicator* tp_group();
// On rank 0: tells the followers to stop if no model did (e.g. the command failed before it loaded
// one), so that they never wait for a step that will not come.
void tp_stop_followers();
// Ends the group (after tp_stop_followers on rank 0, or tp_follow elsewhere); finalises MPI.
void tp_uninstall();

// A follower's whole life: loads its shard of the model at `dir` (with `opts`: every rank must
// multiply as rank 0 does), then mirrors rank 0's calls until rank 0 sends stop (its model was
// destroyed). Returns the exit code.
int tp_follow(const std::string& dir, int threads, const LoadOptions& opts = {});

// On rank 0: a thread that checks every 20 ms that the other ranks of this host are alive, and
// when one is gone prints "rank R (pid P) died" and ends the process (exit code 3), so that a
// step blocked in a collective never hangs the server. Ranks on other hosts are left to MPI's
// error handler and mpirun. Collective over the group (every rank calls it once).
void tp_start_watchdog();

}  // namespace tf
