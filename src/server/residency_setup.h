// The server's residency owner (../shared/design/residency.md): it holds the model's buffers
// (Model::residency_ranges: on the CPU the checkpoint's mapping and the buffers the Weights own; on
// a device every device buffer, counted against the device budget, and the pinned staging) and
// the program's text at startup, follows every state buffer the engine makes (host states through
// EngineOptions::buffers, device buffers through the device heap), and ticks while idle. When the
// set cannot be made it logs one warning and the server runs without it; with --no-residency
// there is none at all.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "model/model.h"
#include "residency/keepalive.h"
#include "residency/owner.h"
#include "runtime/engine.h"

namespace tf::server {

class ServerResidency {
 public:
  // The startup set within `budget_bytes` of host memory (0: 70% of RAM) and, on a device,
  // `device_budget` of device memory (as parse_budget reads it against the device's memory; "":
  // all of it), each tick reading `touch_per_tick` bytes of the host set; or nullptr after one
  // warning saying why the server runs without it.
  static std::unique_ptr<ServerResidency> hold(const Model& model, size_t budget_bytes,
                                               const std::string& device_budget,
                                               size_t touch_per_tick);
  ~ServerResidency();  // stop(); device buffers stop reporting to the owner

  // The observer for EngineOptions::buffers (follow).
  BufferObserver* observer() { return owner_.get(); }
  // Starts the keepalive tick for `engine` (which must outlive stop()).
  void start(Engine& engine, const residency::KeepaliveOptions& o);
  // A request arrived or finished.
  void arm();
  // Stops the tick (returns at once, even with a tick pending). Idempotent.
  void stop();
  // Appends the tensorfold_residency_* lines to a /metrics body.
  void write_metrics(std::string& out) const;
  // The lines for a server without residency.
  static void write_metrics_off(std::string& out);

 private:
  std::unique_ptr<residency::Owner> owner_;
  std::unique_ptr<residency::Keepalive> keepalive_;
  const Model* model_ = nullptr;
};

}  // namespace tf::server
