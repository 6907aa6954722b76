// An allocator for the one block std::allocate_shared makes per grant (the handle's shared
// state and its control block), so that an uncontended acquire and release allocate nothing
// from the heap in steady state (issue 19). Freed blocks go to a small cache of the thread that
// frees them; a thread allocates from its own cache and falls back to operator new when it is
// empty. No lock and no shared cache line: threads never touch each other's cache.
// Thread-safety: any thread; each thread's cache is its own (thread_local), and a block may be
// freed on another thread than the one that made it.
#pragma once

#include <cstddef>
#include <new>

namespace rdmalock::sdk {

// A thread's cache of free blocks of `Size` bytes. Trivially destructible on purpose: a block
// freed after the thread's Drain (a handle destroyed late in the thread's exit) goes back to
// operator delete instead of to a cache that is gone.
template <size_t Size>
struct BlockCache {
  static constexpr int kMaxBlocks = 64;
  void* blocks[kMaxBlocks];
  int count = 0;
  bool drained = false;  // the thread is ending: no more caching

  static BlockCache& Mine() {
    thread_local BlockCache cache;
    // Frees the cached blocks when the thread ends.
    thread_local struct Drainer {
      ~Drainer() {
        BlockCache& c = cache;
        while (c.count > 0) ::operator delete(c.blocks[--c.count]);
        c.drained = true;
      }
    } drainer;
    (void)drainer;
    return cache;
  }
};

template <typename T>
struct StateAllocator {
  using value_type = T;
  StateAllocator() = default;
  template <typename U>
  StateAllocator(const StateAllocator<U>&) {}  // NOLINT: allocators convert implicitly

  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
  T* allocate(size_t n) {
    if (n == 1) {
      BlockCache<sizeof(T)>& c = BlockCache<sizeof(T)>::Mine();
      if (c.count > 0) return static_cast<T*>(c.blocks[--c.count]);
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, size_t n) {
    if (n == 1) {
      BlockCache<sizeof(T)>& c = BlockCache<sizeof(T)>::Mine();
      if (!c.drained && c.count < BlockCache<sizeof(T)>::kMaxBlocks) {
        c.blocks[c.count++] = p;
        return;
      }
    }
    ::operator delete(p);
  }
  template <typename U>
  bool operator==(const StateAllocator<U>&) const {
    return true;
  }
};

}  // namespace rdmalock::sdk
