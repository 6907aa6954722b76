// The queue budgets of one client connection (one QP), named and tied together in one place, so
// a change to one shows at compile time what it implies for the others (eRPC's static_assert'ed
// budgets, tensorpipe's constants.h). Used by the protocol engine (how many operations it puts in
// one doorbell) and by the verbs backend (work requests, scratch buffers, send queue depth).
// Constants only; no thread state.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmalock::budget {

// Most operations one doorbell carries (RemoteMemory::Execute, Start or Post: one chain of work
// requests). The engine batches LockMany/ReleaseMany up to this; the verbs backend keeps this many
// work requests and scratch buffers per kind of batch. 16 covers a set of 8 locks with tokens
// (FA + READ each) or 8 releases (done mark + CAS each) in one doorbell.
inline constexpr size_t kMaxOpsPerDoorbell = 16;

// Unsignalled WRITEs (heartbeats, record entries: RemoteMemory::Post) outstanding before one must
// be retired by a signalled completion. RC completes in order, so the next signalled completion
// retires all of them; past this many, Post waits (it executes the batch signalled).
inline constexpr size_t kMaxPostedUnsignalled = 15;

// Posted WRITEs that are not inline take their data from a ring of this many buffers. A buffer is
// reused only kPostRing posts later, when at most kMaxPostedUnsignalled can still be in flight:
// twice that is never reused while the NIC may read it.
inline constexpr size_t kPostRing = 32;
static_assert(kPostRing >= 2 * kMaxPostedUnsignalled,
              "a post-ring buffer could be reused in flight");

// Work requests outstanding on one QP at worst: the unsignalled posts, a started batch
// (RemoteMemory::Start, the async pump) and an executing one. The send queue is asked for
// kSendQueueDepth; a device that grants less than the need is refused at connect
// (VerbsMemory::Connect names the device's max_qp_wr).
inline constexpr size_t kSendQueueNeed = kMaxPostedUnsignalled + 2 * kMaxOpsPerDoorbell;
inline constexpr uint32_t kSendQueueDepth = 64;
static_assert(kSendQueueDepth >= kSendQueueNeed, "the send queue cannot hold the worst case");

// Bytes of local buffer per operation (an atomic's operands or result, a 16-byte record WRITE).
inline constexpr size_t kOpScratch = 16;

// Most bytes one READ may carry into a buffer of the caller's (RemoteOp::into): a block of lock
// slots whose generations an acquire learns in its FA's doorbell (LockEngine::
// kGenerationBlockSlots). One 1,024-byte RoCE MTU. At most one such READ per doorbell: the verbs
// backend lands it in its bulk bounce buffer.
inline constexpr size_t kMaxBlockRead = 1024;

}  // namespace rdmalock::budget
