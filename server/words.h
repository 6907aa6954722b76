// Loads and stores of lockd's registered memory (the info page, the lock table, the session
// table), which the NIC reads and writes concurrently: 8 bytes, aligned, relaxed atomics.
//
// Threading: plain functions; any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rdmalock::lockd {

inline void Store64(uint8_t* base, size_t off, uint64_t v) {
  std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(base + off))
      .store(v, std::memory_order_relaxed);
}

// A load of memory the NIC writes (a client's RDMA WRITE): aligned, 8 bytes, whole.
inline uint64_t Load64(const uint8_t* base, size_t off) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(base) + off))
      .load(std::memory_order_relaxed);
}

inline uint64_t UnixNs(std::chrono::system_clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count());
}

inline double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace rdmalock::lockd
