// fork() and the SDK (issue 17, finding 11). A forked child inherits the parent's clients,
// connections and lock handles as memory, but their QPs, cm_ids and memory regions live in the
// rdma files the child shares with the parent: a child that used or destroyed them (~LockHandle
// posting a release, ~Client disconnecting, a QP destroyed) would do so to the parent's, and
// lockd would free the parent's locks. So what owns such resources notes the fork generation it
// was made in, and in a later one (a child) it is inert: calls fail, and destruction frees none of
// the inherited resources (Bury keeps them, untouched, for the child's lifetime).
//
// Process-wide state, because fork() is process-wide: the generation (bumped by a pthread_atfork
// child handler that Install registers once) and the list Bury appends to. Any thread may call
// these functions; the list's mutex is taken by the atfork prepare handler and released in the
// parent and the child, so a child never inherits it locked.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace rdmalock::fork_guard {

// Registers the atfork handlers (once per process). Clients and connections call it when made.
void Install();

// Keeps `inherited` alive, never destroyed, for the rest of this process: the child's copy of an
// object that owns its parent's rdma resources.
void Bury(std::shared_ptr<void> inherited);

namespace internal {
extern std::atomic<uint64_t> generation;
}  // namespace internal

// How many fork()s this process is below the one that loaded the library: 0 there, 1 in its
// child, ... (counted once Install has run). Cheap, one relaxed load: the SDK checks it on every
// call.
inline uint64_t Generation() { return internal::generation.load(std::memory_order_relaxed); }

}  // namespace rdmalock::fork_guard
