#include "residency/options.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tf::residency {
namespace {

// "12.5GiB" -> 12.5 and "gib"; false when there is no number.
bool split_number(std::string_view spec, double* value, std::string* unit) {
  const std::string s(spec);
  if (s.empty() || !(std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.')) return false;
  char* end = nullptr;
  *value = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(*value)) return false;
  unit->clear();
  for (const char* p = end; *p; ++p) {
    if (*p == ' ') continue;
    *unit += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  }
  return true;
}

}  // namespace

size_t physical_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

Result<size_t> parse_budget(std::string_view spec, size_t physical) {
  if (spec.empty()) return static_cast<size_t>(physical * (kDefaultBudgetPercent / 100.0));
  double v = 0;
  std::string unit;
  if (!split_number(spec, &v, &unit)) {
    return Status::invalid(
        "residency limit '{}': expected bytes (e.g. 12G) or a percent of RAM "
        "(e.g. 70%)",
        spec);
  }
  if (unit == "%") {
    if (v <= 0 || v > 100)
      return Status::invalid("residency limit '{}': a percent must be in (0, 100]", spec);
    return static_cast<size_t>(physical * (v / 100.0));
  }
  auto bytes = parse_bytes(spec);
  if (!bytes)
    return Status::invalid("residency limit {} (or a percent of RAM, e.g. 70%)",
                           bytes.status().message());
  return bytes;
}

Result<size_t> parse_bytes(std::string_view spec) {
  double v = 0;
  std::string unit;
  if (!split_number(spec, &v, &unit))
    return Status::invalid("'{}': expected bytes, e.g. 4096, 512M or 12G", spec);
  double scale = 0;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else {
    static constexpr const char* kUnits = "kmgt";
    const char* at = std::strchr(kUnits, unit[0]);
    const std::string rest = unit.substr(1);
    if (at != nullptr && (rest.empty() || rest == "b" || rest == "ib"))
      scale = std::ldexp(1.0, 10 * static_cast<int>(at - kUnits + 1));
  }
  if (scale == 0) return Status::invalid("'{}': unknown unit '{}' (use K, M, G or T)", spec, unit);
  if (v * scale > 1.8e19) return Status::invalid("'{}' is too large", spec);
  return static_cast<size_t>(v * scale);
}

Result<std::chrono::milliseconds> parse_duration(std::string_view spec) {
  double v = 0;
  std::string unit;
  if (!split_number(spec, &v, &unit))
    return Status::invalid("duration '{}': expected a number with ms, s, m or h", spec);
  double ms = 0;
  if (unit == "ms")
    ms = v;
  else if (unit.empty() || unit == "s")
    ms = v * 1e3;
  else if (unit == "m" || unit == "min")
    ms = v * 60e3;
  else if (unit == "h")
    ms = v * 3600e3;
  else
    return Status::invalid("duration '{}': unknown unit '{}' (use ms, s, m or h)", spec, unit);
  if (ms > 1e12) return Status::invalid("duration '{}' is too long", spec);
  return std::chrono::milliseconds(static_cast<int64_t>(std::llround(ms)));
}

}  // namespace tf::residency
