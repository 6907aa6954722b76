// Reads a small text file whole (a config file, a cluster map) with an error that says why not.
// `std::ifstream` opens a directory and reads it as nothing, which a YAML parser takes for an
// empty file: lockd started with every default, and a map file was "line 0: expected 'shards:'"
// (found by review, 2026-12-06). Thread-safety: a function of the file; any thread.
#pragma once

#include <cstddef>
#include <string>

#include "rdmalock/status.h"

namespace rdmalock {

// The bytes of `path`: a regular file, or a pipe or device (`<(...)`, /dev/stdin), up to
// `max_bytes`. kIo, the message "PATH: why" (strerror's words: "Is a directory", "No such file or
// directory"), if it cannot be read or is larger.
Result<std::string> ReadTextFile(const std::string& path, size_t max_bytes = size_t{1} << 20);

}  // namespace rdmalock
