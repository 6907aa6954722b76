// The test drivers' precompiled header (tests/CMakeLists.txt): Catch2's single header and the
// standard headers most test files include, parsed once per test executable instead of once per
// test file. Nothing of ours. A test file still includes what it uses (only tests/rdma's files
// are compiled without this header anywhere: docs/architecture.md).
#pragma once

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>
