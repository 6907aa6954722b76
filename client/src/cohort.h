// Cohort handover inside one Client (issue 19, item 4; Sherman's HOCL on one node): threads of
// one client that want an exclusive lock the client already holds or is acquiring queue here,
// in-process, and the holder hands the session's remote grant to the next of them with no RDMA
// operation. The remote grant (its ticket, lease, record entry) stays the session's; only which
// LockHandle::State carries it changes (Client::Impl::HandOver, lock_handle.cc).
//
// Who uses it: exclusive blocking requests (Client::LockSlot with or without a timeout,
// TryLockSlot) and exclusive async requests, with or without a fencing token. A locally
// handed-over grant has no new ticket: the k-th holder after the remote grant gets
// proto::LocalHandoverToken(remote token, k), the remote grant's token with k in its low bits
// (protocol version 5), larger than every earlier holder's and smaller than the next remote
// grant's. A waiter that wants a token is not handed a grant acquired without one (it becomes
// the entry's owner and acquires from lockd). Async requests (Client::LockSlotAsync) join on
// the pump and wait in the cohort on an async waiter thread (Client::Impl::CohortWait). A set
// (Client::LockManySlots) waits only at lockd; its exclusive grants take their free entries once
// granted and are handed over at release.
//
// Shared requests (auto-renewed, blocking or async; Client::Impl::CohortShare, also the pump's):
// one that finds its entry free owns it and acquires a shared grant from lockd; that grant goes
// into an internal
// *carrier* state (linked and renewed like any grant) and the caller gets a *rider* state that
// refers to it. A later shared request of the same session whose entry has a carrier joins it
// in-process (another rider, no RDMA operation), while no exclusive request of this client
// queues in the entry (kContended) and at most kMaxSharedJoins times per remote grant; else it
// goes to lockd as before. The last rider to leave releases the carrier's grant to lockd, which
// passes the entry on (an exclusive waiter acquires from lockd: a shared grant is never handed
// to one). A carrier lost (lease, session) reports the loss to every rider.
//
// The table: kBuckets entries, one per bucket (slot mod kBuckets). An entry's `word` is 0 when no
// thread of this client holds or acquires a slot of its bucket through the cohort, else
// Key(slot) (the owner: the thread acquiring remotely, the holder's State, or a waiter being
// promoted), with kContended added while waiters may be queued. A request for a slot whose
// bucket another slot occupies bypasses the cohort (goes to lockd as before).
//
// Waiting: a waiter within spin_places() of the head of its queue, while the grant is held in
// this process and lockd gave it at once (CohortEntry::held_here), yields the CPU up to
// kSpinYields times watching for its turn before it parks (CohortWaiter::bell); each
// handover wakes the waiter it brings within spin_places() (the head, when more wait), so that
// waiter's wake-up overlaps the new holder's critical section instead of following its
// release. Whether to spin is decided when the waiter starts to: one that started spins its
// budget out even if the grant goes back to lockd meanwhile (after kMaxLocalHandovers, the next
// owner's acquire is one round trip when no other session queued). Spinning is only about
// speed: a waiter's outcome is still read under the entry's mu. A waiter is chosen (served, or
// woken to spin) under the entry's mu but woken after the chooser unlocks it (it parks on a
// futex, CohortWaiter::bell), so that the wake-up does not find the mutex held.
//
// Threads: any caller's thread. Lock-free for the uncontended request: taking a free entry and
// giving it back are one CAS each (no mutex, no allocation). `mu` is taken only by a thread that
// finds its slot's entry owned (to queue), by an owner leaving an entry that has kContended set,
// and by a holder handing over. mu guards the waiter queue (head/tail and every queued waiter's
// `next` and `outcome`) and every change of `word` while kContended is set (so an owner's CAS
// from Key(slot) to 0 cannot race with a waiter queueing: it fails, and the owner takes mu).
//
// Lock order: LockHandle::State::mu -> CohortEntry::mu -> HeldList::mu_ (a leaf). A holder
// leaves (LockHandle::State::SetState) and hands over under its State::mu; a waiter takes no
// State::mu while it holds an entry's mu (its own state is not published until it is granted).
// Neither ThreadChannel::mu nor Impl::mu_ is ever taken under an entry's mu.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "common/sync/bell.h"
#include "common/sync/mutex.h"
#include "common/sync/thread_annotations.h"
#include "rdmalock/client.h"
#include "rdmalock/proto/lock_word.h"

namespace rdmalock::sdk {

struct Session;

// At most this many local handovers of one remote grant in a row; then the holder releases to
// lockd and the next local waiter queues there again with its own FETCH_AND_ADD, behind whatever
// other sessions queued meanwhile, so that they are never starved. Counted per grant (the count
// travels with it from state to state), not per entry, so an entry freed and taken again starts
// from zero with its new remote grant. We do not read the word to skip the bound when nobody else
// seems queued: the grant's last seen word is from the acquire or the last renewal, and a session
// that queued since would be starved for as long as the cohort kept handing over.
inline constexpr uint32_t kMaxLocalHandovers = 8;
static_assert(kMaxLocalHandovers >= 1 && kMaxLocalHandovers <= 64,
              "the bound must let some local handover happen and keep other sessions' waits short");
// At most this many readers join one shared remote grant in-process (the reader that acquired
// it not counted); later ones go to lockd, where they queue behind any exclusive request of
// another session that queued meanwhile. Without a bound, overlapping readers of one client
// would keep the grant for ever and starve the other sessions' writers.
inline constexpr uint32_t kMaxSharedJoins = 8;
static_assert(kMaxSharedJoins >= 1 && kMaxSharedJoins <= 64,
              "the bound must let some readers join and keep other sessions' writers' waits short");
// The k-th handover's holder gets the remote grant's token with k in its low bits.
static_assert(kMaxLocalHandovers <= proto::kTokenLocalMax,
              "every local handover of one grant needs its own fencing token");

// One thread waiting for an entry, on its own stack, queued under the entry's mu.
struct CohortWaiter {
  enum class Outcome : uint8_t {
    kWaiting,  // queued
    kGranted,  // the grant was handed over into `state`, which is linked and holds it
    kEnded,    // handed over, but the waiter's channel's list was closed: the session ended
    kRemote,   // the entry is this waiter's now, without a grant: it acquires from lockd
  };
  LockHandle::State* state = nullptr;   // made by the waiter, unpublished until granted
  const Session* session = nullptr;     // the waiter's channel's session (a grant must match)
  bool wants_token = false;             // only a grant that has a token can be handed to it
  CohortWaiter* next = nullptr;         // guarded by the entry's mu
  Outcome outcome = Outcome::kWaiting;  // guarded by the entry's mu
  Bell bell;  // parked on without the entry's mu (read under it first), rung under it
  // Guarded by the entry's mu: within spin_places() of the head (when it queued, or brought
  // there by a handover: WakeNearHead), it may spin once before parking (CohortTable::Wait).
  bool spin = false;
  // Set (under the entry's mu) when the waiter is served: a waiter that spins before it parks
  // (CohortTable::Wait) watches it without the mutex.
  std::atomic<bool> signalled{false};
  // Guarded by the entry's mu: the waiter is parked on `bell` (it checked its outcome and
  // `spin` under the mu before, so one that is not parked needs no wake-up: it sees them first).
  bool parked = false;
  // Under the entry's mu: rings the bell of a parked waiter and returns it, for Bell::Wake once
  // the mu is unlocked (the wake-up then neither preempts a thread that holds the mutex the
  // waiter needs nor finds it held); else null. Only the bell's address leaves the mu: the
  // waiter may see why it was rung, and end, before the wake-up.
  [[nodiscard]] const Bell* Waker() {
    if (!parked) return nullptr;
    bell.Ring();
    return &bell;
  }
  // Serves the waiter (under the entry's mu): its outcome is final from now on. Returns what
  // the caller passes to Bell::Wake once it has unlocked the entry's mu.
  [[nodiscard]] const Bell* Serve(Outcome o) {
    outcome = o;
    signalled.store(true, std::memory_order_release);
    return Waker();
  }
};

struct alignas(64) CohortEntry {
  static constexpr uint64_t kContended = 1;
  std::atomic<uint64_t> word{0};
  Mutex mu;
  CohortWaiter* head GUARDED_BY(mu) = nullptr;
  CohortWaiter* tail GUARDED_BY(mu) = nullptr;
  uint32_t waiting GUARDED_BY(mu) = 0;  // waiters in the queue
  // Shared requests (Client::Impl::CohortShare): the state that carries the session's shared
  // grant of the entry's slot while readers may join it, else null. Set only by the entry's
  // owner; cleared when its last reader leaves or it leaves kHeld. Non-null implies the carrier
  // has a reader, whose reference keeps it alive. Its readers are the carrier's `riders` list.
  LockHandle::State* carrier GUARDED_BY(mu) = nullptr;
  uint32_t joins GUARDED_BY(mu) = 0;  // readers that joined the carrier's grant so far
  // A hint, not a guard: a state of this client holds the slot's exclusive grant through the
  // entry, and lockd gave it at once (set when the owner is granted with no request ahead of
  // its FETCH_AND_ADD, kept through handovers, cleared by Leave). A waiter starts to spin a
  // little before it parks only while it is set: the grant is then passed on in-process at the
  // holder's release, soon. A waiter behind a remote holder (the owner still queued at lockd)
  // may wait for a long time, and one behind a grant that other sessions queued for shares the
  // CPU with them (on one host: 2 processes x 4 threads on 2 cores were half as fast when
  // their waiters spun); both park at once. Read when a waiter starts to spin, not while it
  // spins (CohortTable::Wait says why).
  std::atomic<bool> held_here{false};
};

class CohortTable {
 public:
  static constexpr size_t kBuckets = 4096;
  // How many times a waiter yields the CPU, watching for its turn, before it parks on its
  // condition variable (it starts only while the grant is held here: held_here). A local
  // handover costs the holder a futex wake and the waiter a context switch when it has parked,
  // which on a slow host costs about what the remote operations it saves do (issue 19).
  static constexpr int kSpinYields = 200;
  // How many waiters at the head of a queue spin (SpinPlaces). At least kMinSpinPlaces: with
  // that few waiting, none has to park, and no handover then waits for a wake-up, which costs
  // more than their spinning even on 2 CPUs; more only as the CPUs allow (one each, the
  // holder's left free). A queue longer than that has waiters that park, so every handover
  // wakes one; then only the head spins (WakeNearHead), as spinners behind it would take the
  // CPU the holder and the head need.
  static constexpr uint32_t kMinSpinPlaces = 3;
  static constexpr uint32_t kMaxSpinPlaces = 64;
  static uint32_t SpinPlaces(unsigned cpus) {
    return std::clamp<uint32_t>(cpus > 0 ? cpus - 1 : 0, kMinSpinPlaces, kMaxSpinPlaces);
  }
  explicit CohortTable(uint32_t spin_places = SpinPlaces(UsableCpus()))
      : spin_places_(std::clamp<uint32_t>(spin_places, 1, kMaxSpinPlaces)) {}
  uint32_t spin_places() const { return spin_places_; }
  // The CPUs this process may run on (its affinity mask), at least 1.
  static unsigned UsableCpus();
  static constexpr uint64_t Key(uint64_t slot) { return (slot + 1) << 1; }
  CohortEntry& Entry(uint64_t slot) { return entries_[slot % kBuckets]; }

  enum class Join : uint8_t {
    kOwner,   // the entry is the caller's: acquire from lockd, then hold it (or Leave)
    kQueued,  // owned for this slot by another of the client's threads (the caller may queue)
    kBypass,  // the bucket is another slot's: acquire from lockd outside the cohort
  };
  // Lock-free: takes the entry if it is free.
  Join TryOwn(uint64_t slot) {
    CohortEntry& e = Entry(slot);
    uint64_t w = e.word.load(std::memory_order_acquire);
    for (;;) {
      if (w == 0) {
        if (e.word.compare_exchange_weak(w, Key(slot), std::memory_order_acq_rel)) {
          return Join::kOwner;
        }
        continue;
      }
      return (w & ~CohortEntry::kContended) == Key(slot) ? Join::kQueued : Join::kBypass;
    }
  }
  // The owner of `slot`'s entry now holds its exclusive grant (CohortEntry::held_here).
  void MarkHeld(uint64_t slot) { Entry(slot).held_here.store(true, std::memory_order_relaxed); }
  // Whether one of the client's threads holds or acquires `slot` through the cohort now.
  bool Owned(uint64_t slot) {
    return (Entry(slot).word.load(std::memory_order_acquire) & ~CohortEntry::kContended) ==
           Key(slot);
  }
  // Queues `w` behind the owner of `slot`'s entry and waits until it is served, `deadline`
  // passes or `*cancel` (may be null) is set and WakeAll called (then it is taken out of the
  // queue: false). Returns kOwner at once (w untouched) if the entry was freed meanwhile and the
  // caller took it, kBypass if another slot took it. On kQueued, *served says whether w was
  // served (w->outcome) or gave up.
  Join Wait(uint64_t slot, CohortWaiter* w, std::chrono::steady_clock::time_point deadline,
            const std::atomic<bool>* cancel, bool* served) NO_THREAD_SAFETY_ANALYSIS;
  // Wakes every queued waiter, so that those whose `cancel` flag is set (set before this call)
  // give up (a closing client's async waiter threads, Client::Impl::StopAsync). Takes every
  // entry's mutex in turn: for Close, not for the lock path.
  void WakeAll() NO_THREAD_SAFETY_ANALYSIS;
  // The owner of `slot`'s entry gives it up without handing a grant over: the first waiter, if
  // any, becomes the owner (kRemote) and acquires from lockd; else the entry is free.
  void Leave(uint64_t slot) NO_THREAD_SAFETY_ANALYSIS;
  // `carrier` (a shared grant's state, cohort.h) leaves kHeld: no reader joins it from now on.
  void Unshare(uint64_t slot, const LockHandle::State* carrier) NO_THREAD_SAFETY_ANALYSIS {
    CohortEntry& e = Entry(slot);
    MutexLock lk(&e.mu);
    if (e.carrier == carrier) e.carrier = nullptr;
  }
  // For a handover, with the entry's mu held: the first waiter, taken out of the queue (with
  // kContended cleared if it was the last), or null if none.
  static CohortWaiter* Pop(CohortEntry& e, uint64_t slot) REQUIRES(e.mu);
  // After a handover's Pop, with the entry's mu held: every waiter moved up one place, and one
  // is to be woken to spin (Wait) while the new holder runs, so that its wake-up is off the
  // path of the handover that serves it: the spin_places()-th, or the head when more wait
  // (then only the head spins). Returns its bell (for Bell::Wake, once the mu is unlocked), or null
  // if it spins already or nothing is held here (held_here).
  [[nodiscard]] const Bell* WakeNearHead(CohortEntry& e) const REQUIRES(e.mu);

 private:
  const uint32_t spin_places_;
  std::array<CohortEntry, kBuckets> entries_{};
};

}  // namespace rdmalock::sdk
