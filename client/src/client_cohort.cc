// Cohort handover among a client's threads (cohort.h): the table's queue, a request's turn in it
// (Client::Impl::CohortAcquire) and a holder's handover (Client::Impl::HandOver).
#include <sched.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "client/src/client_impl.h"

namespace rdmalock {

using sdk::CohortEntry;
using sdk::CohortTable;
using sdk::CohortWaiter;
using sdk::ThreadChannel;

namespace sdk {

CohortTable::Join CohortTable::Wait(uint64_t slot, CohortWaiter* w,
                                    std::chrono::steady_clock::time_point deadline,
                                    const std::atomic<bool>* cancel, bool* served) {
  CohortEntry& e = Entry(slot);
  const uint64_t key = Key(slot);
  MutexLock lk(&e.mu);
  // Mark the entry contended before queueing, so that its owner's lock-free Leave (a CAS from
  // Key(slot)) fails and it takes mu to find this waiter. Once kContended is set, `word` only
  // changes under mu.
  for (uint64_t cur = e.word.load(std::memory_order_acquire);;) {
    if (cur == 0) {
      if (e.word.compare_exchange_weak(cur, key, std::memory_order_acq_rel)) return Join::kOwner;
      continue;
    }
    if ((cur & ~CohortEntry::kContended) != key) return Join::kBypass;
    if (cur == key && !e.word.compare_exchange_weak(cur, key | CohortEntry::kContended,
                                                    std::memory_order_acq_rel)) {
      continue;
    }
    break;
  }
  w->next = nullptr;
  w->outcome = CohortWaiter::Outcome::kWaiting;
  w->signalled.store(false, std::memory_order_relaxed);
  if (e.tail != nullptr) {
    e.tail->next = w;
  } else {
    e.head = w;
  }
  e.tail = w;
  const uint32_t place = ++e.waiting;  // 1: served at the holder's next release
  // While a thread of this client holds the grant that lockd gave at once (no other session
  // was queued for it), it hands it over at its release with no RDMA operation. A waiter that
  // will be served within spin_places_ handovers watches for its turn a little, without the
  // mutex, before parking (a parked waiter costs the holder a futex wake and itself a context
  // switch per handover). One further back, or behind a remote holder, or for a grant other
  // sessions queued for, parks at once: the CPU is the holder's and theirs
  // (CohortEntry::held_here). A waiter that started to spin spins its budget out even if the
  // grant goes back to lockd meanwhile (held_here cleared): the next owner's acquire there is
  // one round trip when no other session queued, and parking then would make each of the
  // handovers after it wait for a futex wake.
  w->spin = place <= spin_places_;
  const auto cancelled = [&] {
    return cancel != nullptr && cancel->load(std::memory_order_acquire);
  };
  while (w->outcome == CohortWaiter::Outcome::kWaiting && !cancelled()) {
    if (w->spin && e.held_here.load(std::memory_order_relaxed)) {
      w->spin = false;
      lk.Unlock();
      for (int i = 0; i < kSpinYields; ++i) {
        if (w->signalled.load(std::memory_order_acquire) || cancelled() ||
            (i % 16 == 15 && std::chrono::steady_clock::now() >= deadline)) {
          break;
        }
        std::this_thread::yield();
      }
      lk.Lock();
      continue;
    }
    // Parked on the bell, without the mu: a waker rings it under the mu (so after this read,
    // and the wait then returns at once) and wakes it once it has unlocked the mu.
    const uint32_t seen = w->bell.Read();
    w->parked = true;
    lk.Unlock();
    const bool in_time = w->bell.WaitUntil(seen, deadline);
    lk.Lock();
    w->parked = false;
    if (!in_time) break;  // served meanwhile or not: the outcome says
  }
  *served = w->outcome != CohortWaiter::Outcome::kWaiting;
  if (!*served) {
    // Timed out or cancelled, still queued (a served waiter is out of the queue): leave it.
    CohortWaiter* prev = nullptr;
    for (CohortWaiter* p = e.head; p != w; p = p->next) prev = p;
    (prev != nullptr ? prev->next : e.head) = w->next;
    if (e.tail == w) e.tail = prev;
    --e.waiting;
    if (e.head == nullptr) e.word.store(key, std::memory_order_release);  // nobody waits now
  }
  return Join::kQueued;
}

void CohortTable::WakeAll() {
  // Every entry under its mu (Close's path, not the lock path's: 4,096 uncontended locks). A
  // waiter queues and reads its cancel flag under the same mu, so either it sees the flag
  // (set before this call) before it parks, or it is in the list here and is woken. Skipping
  // entries whose word read 0, as this did, could miss one: the flag's store and the word's
  // load here, the word's CAS and the flag's load there, with only acquire/release between
  // them, may each see the other's old value (found by review, 2026-12-06; no test shows it).
  for (CohortEntry& e : entries_) {
    MutexLock lk(&e.mu);
    for (CohortWaiter* w = e.head; w != nullptr; w = w->next) Bell::Wake(w->Waker());
  }
}

unsigned CohortTable::UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return std::max(std::thread::hardware_concurrency(), 1u);
}

CohortWaiter* CohortTable::Pop(CohortEntry& e, uint64_t slot) {
  CohortWaiter* w = e.head;
  if (w == nullptr) return nullptr;
  e.head = w->next;
  --e.waiting;
  if (e.head == nullptr) {
    e.tail = nullptr;
    e.word.store(Key(slot), std::memory_order_release);  // owned (by w from now on), uncontended
  }
  w->next = nullptr;
  return w;
}

const Bell* CohortTable::WakeNearHead(CohortEntry& e) const {
  if (!e.held_here.load(std::memory_order_relaxed)) return nullptr;
  CohortWaiter* near = e.head;
  const uint32_t place = e.waiting > spin_places_ ? 1 : spin_places_;
  for (uint32_t i = 1; near != nullptr && i < place; ++i) near = near->next;
  if (near == nullptr || near->spin) return nullptr;  // fewer waiters, or about to spin anyway
  near->spin = true;
  return near->Waker();
}

void CohortTable::Leave(uint64_t slot) {
  CohortEntry& e = Entry(slot);
  e.held_here.store(false, std::memory_order_relaxed);  // the grant went back, or never came
  uint64_t cur = Key(slot);
  if (e.word.compare_exchange_strong(cur, 0, std::memory_order_acq_rel)) return;  // nobody waits
  const Bell* served = nullptr;
  {
    MutexLock lk(&e.mu);
    CohortWaiter* w = Pop(e, slot);
    if (w == nullptr) {
      e.word.store(0, std::memory_order_release);  // the waiters timed out meanwhile
      return;
    }
    served = w->Serve(CohortWaiter::Outcome::kRemote);
  }
  Bell::Wake(served);
}

}  // namespace sdk

namespace {

// A state for a grant that may be handed over to this thread: like MakeHandle's, but with no
// grant and no budget unit yet (settled), and not published (no list links it) until a holder
// hands a grant over into it under the cohort entry's mutex.
std::shared_ptr<LockHandle::State> WaitingState(ThreadChannel& ch, bool auto_renew,
                                                bool wants_token) NO_THREAD_SAFETY_ANALYSIS {
  auto state = std::allocate_shared<LockHandle::State>(sdk::StateAllocator<LockHandle::State>());
  state->ctx = ch.grants;
  state->auto_renew = auto_renew;
  state->wants_token = wants_token;
  state->settled = true;  // no unit until it holds a grant
  return state;
}

// The grant moves from `from` to `to` (a waiter's unpublished state): the ticket, lease and
// record entry, the budget unit, the cohort entry and the count of local handovers. The new
// holder has no newer ticket: if it asked for a token it gets the remote grant's with its
// handover's number in the low bits (proto::LocalHandoverToken), larger than every earlier
// holder's of this grant and smaller than the next remote grant's.
void AdoptGrant(LockHandle::State& to, LockHandle::State& from) NO_THREAD_SAFETY_ANALYSIS {
  to.grant = from.grant;
  to.settled = false;
  from.settled = true;
  to.cohort = std::exchange(from.cohort, nullptr);
  to.local_run = from.local_run + 1;
  to.remote_token = from.remote_token;
  to.grant.token = to.wants_token ? proto::LocalHandoverToken(from.remote_token, to.local_run) : 0;
}

}  // namespace

Result<LockHandle> Client::Impl::CohortAcquire(ThreadChannel** chp, uint64_t slot,
                                               const AcquireOptions& ao, bool auto_renew,
                                               Clock::time_point* started, bool* owner,
                                               const std::atomic<bool>* cancel) {
  CohortTable& table = *cohort_;
  *owner = false;
  switch (table.TryOwn(slot)) {
    case CohortTable::Join::kOwner:
      *owner = true;
      return LockHandle();
    case CohortTable::Join::kBypass:
      return LockHandle();
    case CohortTable::Join::kQueued:
      break;
  }
  // One of the client's threads holds or acquires the lock: as lockd would say to a try-lock.
  if (ao.try_only) return Error(ErrorCode::kBusy, "slot " + std::to_string(slot) + " is held");
  // The latency of a request that waits here includes the wait (also when it then acquires
  // from lockd as the entry's next owner).
  if (*started == Clock::time_point{}) *started = Clock::now();
  ThreadChannel& ch = **chp;
  std::shared_ptr<LockHandle::State> state = WaitingState(ch, auto_renew, ao.want_token);
  CohortWaiter w;
  w.state = state.get();
  w.session = ch.session.get();
  w.wants_token = ao.want_token;
  bool served = false;
  switch (table.Wait(slot, &w, ao.deadline, cancel, &served)) {
    case CohortTable::Join::kOwner:
      *owner = true;
      return LockHandle();
    case CohortTable::Join::kBypass:
      return LockHandle();
    case CohortTable::Join::kQueued:
      break;
  }
  if (!served) {
    if (cancel != nullptr && cancel->load(std::memory_order_acquire)) {
      return Error(ErrorCode::kConnection, "client closed");
    }
    ++ch.timeouts;
    return Error(ErrorCode::kTimeout, "timed out waiting for slot " + std::to_string(slot));
  }
  // Served: the outcome is final and w is out of the queue (read after the entry's mutex).
  switch (w.outcome) {
    case CohortWaiter::Outcome::kGranted: {
      ++ch.acquires;
      ch.latency.Add(Clock::now() - *started);
      TestHook("granted");
      LockHandle h(std::move(state));
      // The session ended after the handover linked the state (EndLeases marked it lost).
      if (h.state_->ended.load(std::memory_order_acquire)) return sdk::EndedWhileGranted();
      return h;
    }
    case CohortWaiter::Outcome::kEnded: {
      MutexLock lk(&state->mu);
      state->LoseTold();  // passes the entry on
      return sdk::EndedWhileGranted();
    }
    case CohortWaiter::Outcome::kRemote:
    case CohortWaiter::Outcome::kWaiting:
      break;
  }
  // The entry is ours without a grant (the holder released to lockd or lost the lock): acquire
  // from lockd. The session may have ended meanwhile: this thread's channel in the current one,
  // waiting for a reconnection as a blocking Lock does when it starts.
  *owner = true;
  auto again = Channel(ao.deadline);
  if (!again.ok()) {
    table.Leave(slot);
    *owner = false;
    return again.status();
  }
  *chp = *again;
  return LockHandle();
}

bool Client::Impl::HandOver(LockHandle::State& s, ThreadChannel& c) {
  // A shared grant (a carrier's) is never handed to a waiter: the cohort's waiters are all
  // exclusive, and they acquire from lockd once the carrier leaves the entry.
  if (!s.cohort || s.grant.ticket.mode != Mode::kExclusive) return false;
  const uint64_t slot = s.grant.ticket.slot;
  CohortEntry& e = s.cohort->Entry(slot);
  // Nobody queued (the common case): one load, then the release goes to lockd.
  if (e.word.load(std::memory_order_acquire) !=
      (CohortTable::Key(slot) | CohortEntry::kContended)) {
    return false;
  }
  // Never hand over a grant whose lease has run out: the release then says kLockLost, and
  // leaving kHeld passes the entry to the waiter, which queues at lockd. Nor one with less than
  // a quarter of its lease left (a holder without renewal that kept it long): the new holder
  // would lose it within milliseconds, where lockd gives it a whole lease; it goes back to lockd
  // instead. A renewed grant has more: the keeper renews once a third of the lease has passed,
  // so a late renewal has five twelfths of the lease before handovers stop.
  const LockEngine& engine = *s.ctx->session->engine;
  const Clock::time_point now = Clock::now();
  if (s.local_run >= sdk::kMaxLocalHandovers || !engine.LeaseValid(s.grant, now) ||
      now >= s.grant.lease_start + engine.params().lease * 3 / 4) {
    return false;
  }
  const Bell *served = nullptr, *near = nullptr;
  {
    MutexLock lk(&e.mu);
    CohortWaiter* w = e.head;
    // A waiter of another session (this one is ending), or one that wants a fencing token from
    // a grant that has none, acquires from lockd instead: Leave, as the caller's release passes
    // the entry on.
    if (w == nullptr || w->session != s.ctx->session.get()) return false;
    if (w->wants_token && s.remote_token == 0) return false;
    CohortTable::Pop(e, slot);
    near = s.cohort->WakeNearHead(e);
    LockHandle::State& to = *w->state;
    AdoptGrant(to, s);
    // Linked into the waiter's channel's list, so the keeper renews it from now on and a
    // session's end reports it lost. A closed list: the session is ending (lockd frees the
    // grant once its connections close); the waiter marks its state lost, which passes the
    // entry on.
    served = w->Serve(to.ctx->held->Link(&to) ? CohortWaiter::Outcome::kGranted
                                              : CohortWaiter::Outcome::kEnded);
  }
  // The wake-ups after the entry's mu is unlocked (CohortWaiter::Waker): the served one first.
  Bell::Wake(served);
  Bell::Wake(near);
  ++c.local_handovers;
  return true;
}

namespace {

// A rider's state on `ch` (cohort.h): no grant of its own, no budget unit, never linked; its
// `grant` is the carrier's ticket and lease start (for slot() and mode()), without a token.
std::shared_ptr<LockHandle::State> RiderState(ThreadChannel& ch) NO_THREAD_SAFETY_ANALYSIS {
  auto r = std::allocate_shared<LockHandle::State>(sdk::StateAllocator<LockHandle::State>());
  r->ctx = ch.grants;
  r->settled = true;
  return r;
}

// Links rider `r` into carrier `c`'s list, with the entry's mu held.
void LinkRider(LockHandle::State& c, LockHandle::State& r) NO_THREAD_SAFETY_ANALYSIS {
  r.rider_prev = nullptr;
  r.rider_next = c.riders;
  if (c.riders != nullptr) c.riders->rider_prev = &r;
  c.riders = &r;
  r.rider_linked = true;
}

// Takes rider `r` off carrier `c`'s list (if it is still on it), with the entry's mu held.
void UnlinkRider(LockHandle::State& c, LockHandle::State& r) NO_THREAD_SAFETY_ANALYSIS {
  if (!r.rider_linked) return;
  (r.rider_prev != nullptr ? r.rider_prev->rider_next : c.riders) = r.rider_next;
  if (r.rider_next != nullptr) r.rider_next->rider_prev = r.rider_prev;
  r.rider_prev = r.rider_next = nullptr;
  r.rider_linked = false;
}

// The rider's copy of the carrier's grant (read under the carrier's mu, written under the
// rider's, never both held).
void SetRiderGrant(LockHandle::State& r, Grant g) NO_THREAD_SAFETY_ANALYSIS {
  g.token = 0;  // shared grants carry no fencing token
  MutexLock lk(&r.mu);
  r.grant = g;
}

}  // namespace

LockHandle Client::Impl::CohortShare(ThreadChannel& ch, uint64_t slot, bool* owner) {
  *owner = false;
  switch (cohort_->TryOwn(slot)) {
    case CohortTable::Join::kOwner:
      *owner = true;
      return LockHandle();
    case CohortTable::Join::kBypass:
      return LockHandle();
    case CohortTable::Join::kQueued:
      break;
  }
  return JoinShared(ch, slot);
}

LockHandle Client::Impl::JoinShared(ThreadChannel& ch, uint64_t slot) {
  CohortEntry& e = cohort_->Entry(slot);
  std::shared_ptr<LockHandle::State> rider;  // made only to join (from the thread's cache)
  std::shared_ptr<LockHandle::State> carrier;
  {
    MutexLock lk(&e.mu);
    LockHandle::State* c = e.carrier;
    // Only while no exclusive request of this client queues in the entry, and a bounded number
    // of times per remote grant (kMaxSharedJoins): other sessions' writers queue at lockd.
    if (c == nullptr || e.joins >= sdk::kMaxSharedJoins ||
        (e.word.load(std::memory_order_relaxed) & CohortEntry::kContended) != 0 ||
        c->ctx->session != ch.session) {
      return LockHandle();
    }
    carrier = c->shared_from_this();  // alive: a rider refers to it while it is the entry's
    rider = RiderState(ch);
    ++e.joins;
    rider->carrier = carrier;
    LinkRider(*carrier, *rider);
  }
  // The carrier's grant must still hold for a while: never join a lease that ran out (the
  // keeper may not have noticed yet). Otherwise leave again (releasing the grant if this was
  // its last reader) and acquire from lockd.
  Grant g;
  bool live = false;
  const Clock::time_point now = Clock::now();
  {
    MutexLock lk(&carrier->mu);
    live = carrier->state == LockState::kHeld &&
           carrier->ctx->session->engine->LeaseValid(carrier->grant, now);
    g = carrier->grant;
  }
  SetRiderGrant(*rider, g);
  if (!live) {
    rider->uncounted = true;  // never handed out: no acquire, so no release or loss, counted
    (void)LockHandle(std::move(rider)).Release();
    return LockHandle();
  }
  ++ch.acquires;
  ++ch.local_shares;
  ch.latency.Add(Clock::duration::zero());  // granted in-process, at once
  TestHook("shared");
  return LockHandle(std::move(rider));
}

LockHandle Client::Impl::ShareGrant(LockHandle h, ThreadChannel& ch) {
  std::shared_ptr<LockHandle::State> carrier = std::move(h.state_);
  std::shared_ptr<LockHandle::State> rider = RiderState(ch);
  Grant g;
  {
    MutexLock lk(&carrier->mu);
    // Lost already (the session ended): it left the entry; the caller sees the loss.
    if (carrier->state != LockState::kHeld || carrier->cohort == nullptr) {
      return LockHandle(std::move(carrier));
    }
    carrier->shares = true;
    // The keeper's and a session's end's report of the carrier's loss reaches every rider.
    carrier->on_lost = [weak = std::weak_ptr<LockHandle::State>(carrier)](const Status& why) {
      if (auto c = weak.lock()) ReportRidersLost(c, why);
    };
    g = carrier->grant;
    CohortEntry& e = carrier->cohort->Entry(g.ticket.slot);
    MutexLock el(&e.mu);
    e.carrier = carrier.get();
    e.joins = 0;
    rider->carrier = carrier;
    LinkRider(*carrier, *rider);
  }
  SetRiderGrant(*rider, g);
  return LockHandle(std::move(rider));
}

bool Client::Impl::LeaveShared(LockHandle::State& carrier, LockHandle::State& rider) {
  CohortEntry& e = carrier.ctx->cohort->Entry(carrier.ticket().slot);
  MutexLock el(&e.mu);
  UnlinkRider(carrier, rider);
  // The last reader: nobody joins from now on (a carrier lost already has no list either; its
  // release then says so).
  const bool last = carrier.riders == nullptr;
  if (last && e.carrier == &carrier) e.carrier = nullptr;
  return last;
}

void Client::Impl::ReportRidersLost(const std::shared_ptr<LockHandle::State>& carrier,
                                    const Status& why) NO_THREAD_SAFETY_ANALYSIS {
  std::vector<std::shared_ptr<LockHandle::State>> riders;
  {
    CohortEntry& e = carrier->ctx->cohort->Entry(carrier->ticket().slot);
    MutexLock el(&e.mu);
    if (e.carrier == carrier.get()) e.carrier = nullptr;  // no reader joins a lost grant
    while (LockHandle::State* r = carrier->riders) {
      UnlinkRider(*carrier, *r);
      // A linked rider is held, so its handle (a reference) still lives; lock() is for safety.
      if (auto sp = r->weak_from_this().lock()) riders.push_back(std::move(sp));
    }
  }
  std::vector<std::function<void(const Status&)>> notify;
  for (auto& r : riders) {
    MutexLock lk(&r->mu);
    if (r->state != LockState::kHeld) continue;  // released meanwhile
    if (auto cb = r->Lose(why)) notify.push_back(std::move(cb));
  }
  for (auto& f : notify) f(why);
}

}  // namespace rdmalock
