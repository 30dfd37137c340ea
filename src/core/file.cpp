#include "core/file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace tf {

Result<std::string> read_file(const std::string& path) {
  std::error_code ec;
  // A directory opens on Linux and reads as nothing: say what it is instead of returning "".
  if (std::filesystem::is_directory(path, ec)) return Status::io("{} is a directory", path);
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::not_found("cannot open {}", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::io("cannot read {}", path);
  return ss.str();
}

}  // namespace tf
