// Residency settings as the command line gives them: the budget and the tick's durations.
#pragma once

#include <chrono>
#include <cstddef>
#include <string_view>

#include "core/status.h"

namespace tf::residency {

// The default host budget: this share of physical RAM.
inline constexpr double kDefaultBudgetPercent = 70.0;
// Physical RAM in bytes (sysconf).
size_t physical_memory_bytes();

// A budget: "" (70% of `physical`), "N%" (0 < N <= 100, decimals allowed), or bytes "N" with an
// optional binary suffix K, M, G, T (also KiB, MiB, GiB, TiB; case-insensitive).
Result<size_t> parse_budget(std::string_view spec, size_t physical);

// A size in bytes: "N" with an optional binary suffix K, M, G, T (also KiB, ...; case-insensitive).
Result<size_t> parse_bytes(std::string_view spec);

// A duration: seconds "N" or "N" with a suffix ms, s, m, h ("1", "0.5s", "250ms", "10m").
Result<std::chrono::milliseconds> parse_duration(std::string_view spec);

}  // namespace tf::residency
