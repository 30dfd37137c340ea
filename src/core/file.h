// Whole-file reads for the small text files a checkpoint directory and the CLI carry (config.json,
// tokenizer.json, chat templates, request files): one helper so that every reader gives the same
// errors, naming the path.
#pragma once

#include <string>

#include "core/status.h"

namespace tf {

// The file's bytes. kNotFound when it cannot be opened, kIo when it is a directory or reading it
// fails.
Result<std::string> read_file(const std::string& path);

}  // namespace tf
