// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html), as
// leveldb's port/thread_annotations.h has them. Under clang with -Wthread-safety (CI's
// thread-safety stage, tests/thread-safety/check.sh) the compiler checks that a field marked
// GUARDED_BY(mu_) is touched only with mu_ held and that a function marked REQUIRES(mu_) is called
// only so; under GCC they expand to nothing.
#pragma once

#if defined(__clang__)
#define RDMALOCK_TSA(x) __attribute__((x))
#else
#define RDMALOCK_TSA(x)
#endif

#define CAPABILITY(x) RDMALOCK_TSA(capability(x))
#define SCOPED_CAPABILITY RDMALOCK_TSA(scoped_lockable)
#define GUARDED_BY(x) RDMALOCK_TSA(guarded_by(x))
#define PT_GUARDED_BY(x) RDMALOCK_TSA(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) RDMALOCK_TSA(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) RDMALOCK_TSA(acquired_after(__VA_ARGS__))
#define REQUIRES(...) RDMALOCK_TSA(requires_capability(__VA_ARGS__))
#define ACQUIRE(...) RDMALOCK_TSA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) RDMALOCK_TSA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) RDMALOCK_TSA(try_acquire_capability(__VA_ARGS__))
#define EXCLUDES(...) RDMALOCK_TSA(locks_excluded(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) RDMALOCK_TSA(assert_capability(x))
#define RETURN_CAPABILITY(x) RDMALOCK_TSA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS RDMALOCK_TSA(no_thread_safety_analysis)
