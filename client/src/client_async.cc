// Asynchronous acquires (Client::LockAsync, LockSlotAsync): the pump thread posts up to
// kAsyncBatch queued requests' FETCH_AND_ADDs in one doorbell; kAsyncWaiters waiter threads
// finish those not granted at once. Their queues are guarded by async_mu_.
#include <algorithm>
#include <tuple>

#include "client/src/client_impl.h"

namespace rdmalock {

using sdk::EndedWhileGranted;
using sdk::Session;
using sdk::ThreadChannel;

Status Client::Impl::Submit(AsyncRequest req) {
  {
    MutexLock lk(&async_mu_);
    if (async_stop_) return Error(ErrorCode::kConnection, "client closed");
    if (!pump_.joinable()) {
      // As the keeper's, these threads hold the Impl while they run (see Start).
      pump_ = std::thread([self = shared_from_this()] { self->PumpLoop(); });
      for (int i = 0; i < kAsyncWaiters; ++i) {
        waiters_.emplace_back([self = shared_from_this()] { self->WaiterLoop(); });
        waiter_ids_.push_back(waiters_.back().get_id());
      }
    }
    async_q_.push_back(std::move(req));
    // Under the lock: once it is released, the request's callback may run and destroy the
    // client, this Impl (and its condition variable) with it, before this thread goes on.
    async_cv_.Signal();
  }
  return Status::Ok();
}

// Takes up to kAsyncBatch queued requests and posts their FAs in one doorbell. Granted ones
// complete here; the others go to the waiters.
void Client::Impl::PumpLoop() {
  for (;;) {
    std::vector<AsyncRequest> batch;
    {
      MutexLock lk(&async_mu_);
      async_cv_.Wait(lk, [&] {
        async_mu_.AssertHeld();
        return async_stop_ || !async_q_.empty();
      });
      if (async_stop_) return;
      while (!async_q_.empty() && batch.size() < kAsyncBatch) {
        batch.push_back(std::move(async_q_.front()));
        async_q_.pop_front();
      }
    }
    Clock::time_point deadline = Clock::time_point::max();
    for (const auto& r : batch) deadline = std::min(deadline, r.deadline);
    auto chr = Channel(deadline);
    if (!chr.ok()) {
      for (auto& r : batch) r.done(chr.status());
      continue;
    }
    ThreadChannel& ch = **chr;
    const Session& sess = *ch.session;
    std::vector<ManyRequest> reqs;
    reqs.reserve(batch.size());
    for (const auto& r : batch) {
      reqs.push_back({r.slot, r.mode, r.options.fencing_token && r.mode == Mode::kExclusive});
    }
    Result<std::vector<Issued>> issued = Error(ErrorCode::kInternal, "not issued");
    {
      MutexLock clk(&ch.mu);
      Status st = ch.Reap();
      if (st.ok()) {
        issued = sess.engine->IssueMany(
            *ch.mem, reqs, false, [&] { return ch.TakeEntry(opts_.record_requests); }, &ch.pending,
            &ch.events);
      } else {
        issued = st;
      }
      ch.NotePending();
    }
    if (!issued.ok()) {
      OnSessionError(sess.gen, issued.status());
      for (auto& r : batch) r.done(issued.status());
      continue;
    }
    std::vector<AsyncWait> waits;
    for (size_t i = 0; i < batch.size(); ++i) {
      const Issued& is = (*issued)[i];
      if (is.granted) {
        TestHook("granted");
        LockHandle h = MakeHandle(ch, is.grant, batch[i].options.auto_renew, batch[i].submitted);
        if (h.state() == LockState::kLost) {
          batch[i].done(EndedWhileGranted());
        } else {
          batch[i].done(std::move(h));
        }
      } else {
        waits.push_back({std::move(batch[i]), is.grant, is.frozen, sess.gen});
      }
    }
    if (!waits.empty()) {
      {
        MutexLock lk(&async_mu_);
        for (auto& w : waits) wait_q_.push_back(std::move(w));
      }
      wait_cv_.SignalAll();
    }
  }
}

// Finishes requests the pump could not grant at once, one at a time, on this thread's channel.
void Client::Impl::WaiterLoop() {
  for (;;) {
    AsyncWait w;
    {
      MutexLock lk(&async_mu_);
      wait_cv_.Wait(lk, [&] {
        async_mu_.AssertHeld();
        return async_stop_ || !wait_q_.empty();
      });
      if (async_stop_ && wait_q_.empty()) return;
      w = std::move(wait_q_.front());
      wait_q_.pop_front();
    }
    auto chr = Channel(w.req.deadline);
    if (!chr.ok()) {
      // The pump's FA queued the request (unless the word was frozen): a waiter that cannot
      // join (the session's connection cap) hands the ticket to the reaper, which releases it at
      // its turn, or the lock's queue would stop at it. Of an ended session it is dropped
      // (lockd frees what the record shows).
      if (!w.frozen) Abandon(w.gen, w.queued.ticket);
      w.req.done(chr.status());
      continue;
    }
    ThreadChannel& ch = **chr;
    const Session& sess = *ch.session;
    AcquireOptions ao;
    ao.deadline = w.req.deadline;
    ao.try_only = w.req.options.timeout && w.req.options.timeout->count() == 0;
    ao.want_token = w.req.options.fencing_token && w.req.mode == Mode::kExclusive;
    Result<Grant> g = Error(ErrorCode::kInternal, "not acquired");
    {
      MutexLock clk(&ch.mu);
      Status st = ch.Reap();
      if (!st.ok()) {
        g = st;
      } else if (w.queued.ticket.record != 0 && w.frozen) {
        g = Error(ErrorCode::kInternal, "frozen request with a record");  // IssueMany never does
      } else if (w.frozen && ao.try_only) {
        g = Error(ErrorCode::kBusy, "lock word is being reset; try again");
      } else if (w.frozen) {
        std::tie(ao.record, ao.record_seq) = ch.TakeEntry(opts_.record_requests);
        ao.pending = &ch.pending;
        g = sess.engine->Acquire(*ch.mem, w.req.slot, w.req.mode, ao, &ch.events);
      } else {
        g = sess.engine->FinishAcquire(*ch.mem, w.queued, ao, &ch.events);
      }
      ch.NotePending();
    }
    if (!g.ok()) {
      if (g.status().code() == ErrorCode::kTimeout) ++ch.timeouts;
      OnSessionError(sess.gen, g.status());
      w.req.done(g.status());
      continue;
    }
    TestHook("granted");
    LockHandle h = MakeHandle(ch, *g, w.req.options.auto_renew, w.req.submitted);
    if (h.state() == LockState::kLost) {
      w.req.done(EndedWhileGranted());
    } else {
      w.req.done(std::move(h));
    }
  }
}

// Stops the async threads. Waiters blocked in a wait are woken by shutting their connections
// (after reaping any release they posted); what is still queued completes with kConnection.
void Client::Impl::StopAsync(std::thread::id me) {
  std::vector<std::thread::id> ids;
  {
    MutexLock lk(&async_mu_);
    async_stop_ = true;
    ids = waiter_ids_;
  }
  async_cv_.SignalAll();
  wait_cv_.SignalAll();
  JoinOrDetach(pump_, me);
  std::vector<std::shared_ptr<ThreadChannel>> chans;
  {
    MutexLock lk(&mu_);
    for (auto id : ids) {
      if (auto it = channels_.find(id); it != channels_.end()) chans.push_back(it->second);
    }
  }
  for (auto& ch : chans) {
    if (!ch->mu.TryLock()) continue;
    (void)ch->Reap();
    ch->mu.Unlock();
  }
  {
    MutexLock lk(&async_mu_);
    for (auto& w : wait_q_) async_q_.push_back(std::move(w.req));
    wait_q_.clear();
  }
  for (auto& ch : chans) ch->mem->Shutdown();
  for (auto& t : waiters_) JoinOrDetach(t, me);
  std::deque<AsyncRequest> left;
  {
    MutexLock lk(&async_mu_);
    left.swap(async_q_);
  }
  for (auto& r : left) r.done(Error(ErrorCode::kConnection, "client closed"));
}

Status Client::LockAsync(std::string_view name, const LockOptions& options, LockCallback done) {
  if (name.empty()) return Error(ErrorCode::kInvalidArgument, "lock name is empty");
  if (impl_->inherited()) return Impl::InheritedError();
  return LockSlotAsync(SlotForName(name, impl_->latest_session()->reply.lock_count), options,
                       std::move(done));
}

Status Client::LockSlotAsync(uint64_t slot, const LockOptions& options, LockCallback done) {
  if (!done) return Error(ErrorCode::kInvalidArgument, "LockSlotAsync needs a callback");
  if (impl_->inherited()) return Impl::InheritedError();
  if (options.timeout && options.timeout->count() < 0) {
    return Error(ErrorCode::kInvalidArgument, "negative lock timeout");
  }
  const uint64_t count = impl_->latest_session()->reply.lock_count;
  if (slot >= count) {
    return Error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) +
                                                  " is out of range (lock_count " +
                                                  std::to_string(count) + ")");
  }
  if (!impl_->budget_->Take(slot)) return impl_->budget_->Refusal(slot);
  Impl::AsyncRequest r;
  r.slot = slot;
  r.mode = static_cast<Mode>(options.mode);
  r.options = options;
  if (options.timeout) r.deadline = Clock::now() + *options.timeout;
  // A request that ends without a grant gives its unit back; a grant's handle holds it.
  r.done = [budget = impl_->budget_, slot, done = std::move(done)](Result<LockHandle> h) {
    if (!h.ok()) budget->Give(slot);
    done(std::move(h));
  };
  Status st = impl_->Submit(std::move(r));
  if (!st.ok()) impl_->budget_->Give(slot);
  return st;
}

}  // namespace rdmalock
