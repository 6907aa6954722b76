// The test drivers' precompiled header (tests/CMakeLists.txt): Catch2's single header and the
// standard headers most test files include, parsed once per test executable instead of once per
// test file. Nothing of ours: a test file still includes what it uses, so it compiles without it.
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
