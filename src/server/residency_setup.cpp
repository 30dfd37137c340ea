#include "server/residency_setup.h"

#include <chrono>

#include <spdlog/spdlog.h>

#include "residency/cpu_backend.h"
#include "residency/options.h"

namespace tf::server {

namespace rs = residency;

std::unique_ptr<ServerResidency> ServerResidency::hold(const Model& model, size_t budget_bytes,
                                                       const std::string& device_budget,
                                                       size_t touch_per_tick) {
  std::vector<rs::Range> set = model.residency_ranges();
  size_t bytes[rs::kMemoryKinds] = {0, 0}, program = 0;
  for (const rs::Range& r : set) bytes[static_cast<int>(r.memory)] += r.bytes;
  for (const rs::Range& r : rs::program_ranges()) {
    set.push_back(r);
    program += r.bytes;
  }
  if (budget_bytes == 0) budget_bytes = rs::parse_budget("", rs::physical_memory_bytes()).value();
  rs::OwnerOptions oo;
  oo.budget[static_cast<int>(rs::Memory::kHost)] = budget_bytes;
  if (model.on_device()) {
    // Device memory is not evicted: the budget only bounds what the set counts (100% default).
    auto b = rs::parse_budget(device_budget.empty() ? "100%" : device_budget,
                              model.device_memory_bytes());
    if (!b) {
      spdlog::warn("residency: {}; serving without residency", b.status().message());
      return nullptr;
    }
    oo.budget[static_cast<int>(rs::Memory::kDevice)] = *b;
  }
  oo.touch_per_tick = touch_per_tick;
  const auto t0 = std::chrono::steady_clock::now();
  auto backend = model.residency_backend();
  if (!backend) {
    spdlog::warn("residency: {}; serving without residency", backend.status().message());
    return nullptr;
  }
  auto owner = rs::Owner::hold(std::move(*backend), oo, set);
  if (!owner) {
    spdlog::warn("residency: cannot hold the engine's buffers: {}; serving without residency",
                 owner.status().message());
    return nullptr;
  }
  const size_t host = bytes[static_cast<int>(rs::Memory::kHost)];
  const size_t device = bytes[static_cast<int>(rs::Memory::kDevice)];
  spdlog::info(
      "residency: holding {:.1f} MiB of host memory ({} {:.1f} MiB, program {:.1f} MiB) of a "
      "{:.1f} MiB budget{} in {:.2f} s",
      (host + program) / 1048576.0, model.on_device() ? "pinned staging" : "weights",
      host / 1048576.0, program / 1048576.0, budget_bytes / 1048576.0,
      model.on_device()
          ? fmt::format(", and {:.1f} MiB of device memory of a {:.1f} MiB device budget",
                        device / 1048576.0,
                        oo.budget[static_cast<int>(rs::Memory::kDevice)] / 1048576.0)
          : std::string(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  auto r = std::unique_ptr<ServerResidency>(new ServerResidency());
  r->owner_ = std::move(*owner);
  r->model_ = &model;
  // Device buffers made and freed from now on (states, kept copies, grown scratch) follow.
  model.follow_device_buffers(r->owner_.get());
  return r;
}

ServerResidency::~ServerResidency() {
  stop();
  if (model_ != nullptr) model_->follow_device_buffers(nullptr);  // before the owner goes
}

void ServerResidency::start(Engine& engine, const rs::KeepaliveOptions& o) {
  keepalive_ = std::make_unique<rs::Keepalive>(
      *owner_, o, [&engine] { engine.wake(); },
      [&engine] {
        const EngineStats s = engine.stats();
        return s.running > 0 || s.waiting > 0;
      });
}

void ServerResidency::arm() {
  if (keepalive_) keepalive_->arm();
}

void ServerResidency::stop() {
  if (keepalive_) keepalive_->stop();
}

void ServerResidency::write_metrics(std::string& out) const {
  const rs::Stats s = owner_->stats();
  out +=
      "# HELP tensorfold_residency_active 1 when the residency owner holds the engine's buffers.\n"
      "# TYPE tensorfold_residency_active gauge\ntensorfold_residency_active 1\n";
  struct Gauge {
    const char *name, *help;
    size_t rs::Stats::PerMemory::*field;
  };
  for (const Gauge& g :
       {Gauge{"budget_bytes", "The residency budget.", &rs::Stats::PerMemory::budget},
        Gauge{"held_bytes", "Bytes held resident (committed).", &rs::Stats::PerMemory::held},
        Gauge{"staged_bytes", "Bytes joined, waiting for the next commit.",
              &rs::Stats::PerMemory::staged}}) {
    out += fmt::format("# HELP tensorfold_residency_{} {}\n# TYPE tensorfold_residency_{} gauge\n",
                       g.name, g.help, g.name);
    for (int k = 0; k < rs::kMemoryKinds; ++k) {
      const rs::Stats::PerMemory& pm = s.memory[k];
      if (k > 0 && pm.budget == 0) continue;  // no device budget on the CPU backend
      out += fmt::format("tensorfold_residency_{}{{memory=\"{}\"}} {}\n", g.name,
                         rs::memory_name(static_cast<rs::Memory>(k)), pm.*g.field);
    }
  }
  out +=
      "# HELP tensorfold_residency_refused_bytes_total Bytes of joins refused by the budget.\n"
      "# TYPE tensorfold_residency_refused_bytes_total counter\n";
  for (int k = 0; k < rs::kMemoryKinds; ++k) {
    if (k > 0 && s.memory[k].budget == 0) continue;
    out += fmt::format("tensorfold_residency_refused_bytes_total{{memory=\"{}\"}} {}\n",
                       rs::memory_name(static_cast<rs::Memory>(k)), s.memory[k].refused);
  }
  out += fmt::format(
      "# HELP tensorfold_residency_members Buffers in the resident set (held + staged).\n"
      "# TYPE tensorfold_residency_members gauge\ntensorfold_residency_members {}\n"
      "# HELP tensorfold_residency_ticks_total Keepalive ticks run while idle.\n"
      "# TYPE tensorfold_residency_ticks_total counter\ntensorfold_residency_ticks_total {}\n"
      "# HELP tensorfold_residency_pages_found_out_total Held pages a tick found not resident "
      "(and made resident again).\n"
      "# TYPE tensorfold_residency_pages_found_out_total counter\n"
      "tensorfold_residency_pages_found_out_total {}\n"
      "# HELP tensorfold_residency_pages_touched_total Held pages the ticks read.\n"
      "# TYPE tensorfold_residency_pages_touched_total counter\n"
      "tensorfold_residency_pages_touched_total {}\n"
      "# HELP tensorfold_residency_touch_seconds_total CPU time the ticks spent reading held "
      "pages.\n"
      "# TYPE tensorfold_residency_touch_seconds_total counter\n"
      "tensorfold_residency_touch_seconds_total {:.3f}\n"
      "# HELP tensorfold_residency_cold_sweeps_total Ticks that found held pages cold (reclaimed "
      "outside this kernel, e.g. by a virtual machine's host) and read the whole set.\n"
      "# TYPE tensorfold_residency_cold_sweeps_total counter\n"
      "tensorfold_residency_cold_sweeps_total {}\n"
      "# HELP tensorfold_residency_unheld_buffers_total Buffers the engine made that could not "
      "join or commit (used without residency).\n"
      "# TYPE tensorfold_residency_unheld_buffers_total counter\n"
      "tensorfold_residency_unheld_buffers_total {}\n",
      s.members, s.ticks, s.pages_found_out, s.pages_touched, s.touch_ns / 1e9, s.cold_sweeps,
      s.follow_failures + s.commit_failures);
}

void ServerResidency::write_metrics_off(std::string& out) {
  out +=
      "# HELP tensorfold_residency_active 1 when the residency owner holds the engine's buffers.\n"
      "# TYPE tensorfold_residency_active gauge\ntensorfold_residency_active 0\n";
}

}  // namespace tf::server
