// Asynchronous acquires (Client::LockAsync, LockSlotAsync): the pump thread posts up to
// kAsyncBatch queued requests' FETCH_AND_ADDs in one doorbell; kAsyncWaiters waiter threads
// finish those not granted at once. Their queues are guarded by async_mu_.
#include <algorithm>
#include <string>
#include <system_error>
#include <thread>
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
      // As the keeper's, these threads hold the Impl while they run (see Start). The waiters
      // first, the pump last: a start that fails part way is taken up again by the next
      // request (no pump yet), and none is queued for a pump that does not run.
      try {
        TestHook("starting async threads");
        waiters_.reserve(kAsyncWaiters);  // no reallocation once a thread runs
        waiter_ids_.reserve(kAsyncWaiters);
        while (waiters_.size() < static_cast<size_t>(kAsyncWaiters)) {
          waiters_.emplace_back([self = shared_from_this()] { self->WaiterLoop(); });
          waiter_ids_.push_back(waiters_.back().get_id());
        }
        pump_ = std::thread([self = shared_from_this()] { self->PumpLoop(); });
      } catch (const std::system_error& e) {  // no thread to be had now (EAGAIN)
        return Error(ErrorCode::kResource,
                     std::string("cannot start the client's async threads: ") + e.what());
      }
    }
    async_q_.push_back(std::move(req));
    // Under the lock: once it is released, the request's callback may run and destroy the
    // client, this Impl (and its condition variable) with it, before this thread goes on.
    async_cv_.Signal();
  }
  return Status::Ok();
}

void Client::Impl::GiveUnit(AsyncRequest& r) {
  if (r.holds_unit) budget_->Give(r.slot);
  r.holds_unit = false;
}

void Client::Impl::Finish(AsyncRequest& r, Status st) {
  GiveUnit(r);
  r.done(std::move(st));
}

void Client::Impl::FinishUngranted(AsyncRequest& r, bool cohort_owner, Status st) {
  if (cohort_owner) cohort_->Leave(r.slot);  // the next local waiter goes to lockd
  Finish(r, std::move(st));
}

void Client::Impl::FinishAdopted(AsyncRequest& r, LockHandle h) {
  GiveUnit(r);
  FinishGranted(r, std::move(h));
}

void Client::Impl::FinishGranted(AsyncRequest& r, LockHandle h) {
  // The grant's state holds the unit from now on, also when it was lost at once: its Settle
  // gives it back (giving it back here too counted it twice, and the slot's count wrapped).
  r.holds_unit = false;
  if (h.state() == LockState::kLost) {
    r.done(EndedWhileGranted());  // the handle passed its cohort entry on, if it had one
  } else if (Status st =
                 r.hashed_with != 0 ? sdk::SameNameMapping(*h.state_, r.hashed_with) : Status::Ok();
             !st.ok()) {
    h = LockHandle();  // released
    r.done(std::move(st));
  } else {
    r.done(std::move(h));
  }
}

// The pump's channel for `batch`. Each request waits for a session as a blocking request would:
// until its own deadline, and at most the connect timeout from its submission. A request whose
// time comes first, a try-lock say, ends with the error and the others wait on. The wait goes in
// slices (kSessionWaitSlice), and requests queued meanwhile join the batch (up to kAsyncBatch)
// rather than wait behind it. Once there is a session, the pump thread's channel (a join, if it
// has none) gets the batch's earliest deadline, as a blocking request's gets its own. Ends every
// request of the batch when it returns an error (the batch is then empty).
Result<std::shared_ptr<ThreadChannel>> Client::Impl::BatchChannel(
    std::vector<AsyncRequest>& batch) {
  const auto wait_end = [this](const AsyncRequest& r) {
    return std::min(r.deadline, sdk::DeadlineAfter(r.submitted, opts_.connect_timeout));
  };
  for (;;) {
    Clock::time_point until = Clock::time_point::max(), deadline = Clock::time_point::max();
    for (const auto& r : batch) {
      until = std::min(until, wait_end(r));
      deadline = std::min(deadline, r.deadline);
    }
    // With a session (the common case) straight to the channel, whose thread's cache takes no
    // mutex; without one, a slice of waiting for it.
    Status st = gen_.load(std::memory_order_acquire) != 0
                    ? Status::Ok()
                    : WaitForSession(std::min(until, Clock::now() + kSessionWaitSlice));
    std::chrono::milliseconds busy_retry(0);
    if (st.ok()) {
      auto chr = Channel(deadline, {}, &busy_retry);
      if (chr.ok()) {
        if (auto owned = OwnChannel(*chr)) return owned;
        // Not cached as Channel leaves it (it always is): look again after a slice, no spin.
        std::this_thread::sleep_for(kSessionWaitSlice);
        continue;
      }
      st = chr.status();
    }
    // No session (yet, or again: a join that failed with the connection ended it): the requests
    // whose wait is over end; the rest wait on. A join refused busy with the batch's earliest
    // deadline too near to retry: the requests whose wait ends before lockd's retry delay end
    // (as Join's rule for one deadline), and the rest retry with the next deadline (a try-lock
    // failed the whole batch; found by review, 2026-12-06). Another failure while the session
    // lives (the session's connection cap: kResource) or the client closing ends them all.
    const Clock::time_point now = Clock::now();
    const bool busy = busy_retry.count() > 0;
    // Without reconnect no session is coming: the session's end fails the batch at once (the
    // pump looped without sleeping until each request's connect timeout; found by review,
    // 2026-12-07).
    const bool waiting =
        !ClosingAsync() &&
        (busy || (st.code() == ErrorCode::kConnection && session() == nullptr && opts_.reconnect));
    std::vector<AsyncRequest> rest;
    for (auto& r : batch) {
      if (waiting && wait_end(r) > (busy ? now + busy_retry : now)) {
        rest.push_back(std::move(r));
      } else {
        Finish(r, st);
      }
    }
    batch = std::move(rest);
    if (waiting) {
      // The batch fills up from the queue; a request queued behind a full batch whose wait is
      // over ends now too, not once the batch has room (up to the connect timeout late; found
      // by review, 2026-12-06).
      std::vector<AsyncRequest> over;
      {
        MutexLock lk(&async_mu_);
        while (!async_q_.empty() && batch.size() < kAsyncBatch) {
          batch.push_back(std::move(async_q_.front()));
          async_q_.pop_front();
        }
        for (auto it = async_q_.begin(); it != async_q_.end();) {
          if (wait_end(*it) <= now) {
            over.push_back(std::move(*it));
            it = async_q_.erase(it);
          } else {
            ++it;
          }
        }
      }
      for (auto& r : over) Finish(r, st);
    }
    if (batch.empty()) return st;
  }
}

// Takes up to kAsyncBatch queued requests and posts their FAs in one doorbell. Granted ones
// complete here; the others go to the waiters.
void Client::Impl::PumpLoop() {
  for (;;) {
    std::vector<AsyncRequest> batch;
    // Waits past their deadline that no waiter thread took (all of them busy with waits of their
    // own): the pump finishes them (they give up at once), or their callbacks came only when a
    // thread was free, and a ticket granted meanwhile held the lock from everyone, unwatched
    // (found by review, 2026-12-07).
    std::vector<AsyncWait> overdue;
    {
      MutexLock lk(&async_mu_);
      for (;;) {
        if (async_stop_) return;
        const Clock::time_point next = TakeOverdueLocked(Clock::now(), &overdue);
        if (!overdue.empty() || !async_q_.empty()) break;
        if (next == Clock::time_point::max()) {
          async_cv_.Wait(lk);
        } else {
          (void)async_cv_.WaitUntil(lk, next);
        }
      }
      while (!async_q_.empty() && batch.size() < kAsyncBatch) {
        batch.push_back(std::move(async_q_.front()));
        async_q_.pop_front();
      }
    }
    for (auto& w : overdue) FinishWait(w, /*overdue=*/true);
    if (batch.empty()) continue;
    auto chr = BatchChannel(batch);
    if (!chr.ok()) continue;  // every request of the batch ended
    const std::shared_ptr<ThreadChannel> owned = std::move(chr).value();  // through callbacks
    ThreadChannel& ch = *owned;
    const Session& sess = *ch.session;
    // Cohort handover (cohort.h), as for a blocking request: an exclusive request whose slot's
    // entry another of the client's requests owns is not issued; it waits in the cohort on a
    // waiter thread (a try-lock is busy at once). One that takes a free entry owns it.
    // A shared request joins another of the client's shared grants of its lock in-process if it
    // can (complete at once, no unit: a rider holds none); one that takes a free entry owns it,
    // and its grant becomes the entry's carrier (ShareGrant).
    std::vector<AsyncWait> queued;  // not issued: they wait in the cohort on a waiter thread
    std::vector<bool> owner, share;
    {
      std::vector<AsyncRequest> issue;
      issue.reserve(batch.size());
      for (auto& r : batch) {
        // The slot was checked against the lock count the client knew when the request was
        // made; lockd may have come back with fewer locks since (this channel's session). Such
        // a request fails alone: IssueMany refuses a whole list with one slot out of range, and
        // failed every request beside it with this one's error (listed by an earlier review,
        // fixed 2026-12-07). One made by name fails as any whose lockd changed its lock count.
        if (r.slot >= sess.reply.lock_count) {
          Finish(r, r.hashed_with != 0
                        ? sdk::SameNameMapping(r.hashed_with, sess.reply.lock_count)
                        : Error(ErrorCode::kInvalidArgument,
                                "slot " + std::to_string(r.slot) + " is out of range (lock_count " +
                                    std::to_string(sess.reply.lock_count) +
                                    ": lockd came back with fewer locks since the request was "
                                    "made)"));
          continue;
        }
        bool own = false;
        if (SharesInCohort(r.mode, r.options)) {
          if (LockHandle j = CohortShare(ch, r.slot, &own); j.valid()) {
            FinishAdopted(r, std::move(j));  // a rider holds no unit
            continue;
          }
          owner.push_back(own);
          share.push_back(own);
          issue.push_back(std::move(r));
          continue;
        }
        if (cohort_ && r.mode == Mode::kExclusive) {
          switch (cohort_->TryOwn(r.slot)) {
            case sdk::CohortTable::Join::kOwner:
              own = true;
              break;
            case sdk::CohortTable::Join::kBypass:
              break;
            case sdk::CohortTable::Join::kQueued:
              if (r.options.timeout && r.options.timeout->count() == 0) {
                Finish(r, Error(ErrorCode::kBusy, "slot " + std::to_string(r.slot) + " is held"));
              } else {
                AsyncWait w;
                w.req = std::move(r);
                w.cohort_queued = true;
                queued.push_back(std::move(w));
              }
              continue;
          }
        }
        owner.push_back(own);
        share.push_back(false);
        issue.push_back(std::move(r));
      }
      batch = std::move(issue);
    }
    // The entries of requests that end here without a grant go to the next local waiter.
    auto leave = [&](size_t i) {
      if (owner[i]) cohort_->Leave(batch[i].slot);
    };
    std::vector<ManyRequest> reqs;
    reqs.reserve(batch.size());
    for (const auto& r : batch) {
      reqs.push_back({r.slot, r.mode, r.options.fencing_token && r.mode == Mode::kExclusive});
    }
    Result<std::vector<Issued>> issued = std::vector<Issued>{};
    Clock::time_point completed{};  // the channel's last completion, read under its lock
    if (!batch.empty()) {
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
      completed = ch.mem->last_completed();
    }
    std::vector<AsyncWait> waits;  // issued, not granted at once
    if (!issued.ok()) {
      OnSessionError(sess.gen, issued.status());
      for (size_t i = 0; i < batch.size(); ++i) {
        leave(i);
        Finish(batch[i], issued.status());
      }
    } else {
      for (size_t i = 0; i < batch.size(); ++i) {
        const Issued& is = (*issued)[i];
        if (is.granted) {
          TestHook("granted");
          LockHandle h = MakeHandle(ch, is.grant, completed, batch[i].options.auto_renew,
                                    batch[i].submitted, owner[i] ? cohort_.get() : nullptr);
          FinishGranted(batch[i], share[i] ? ShareGrant(std::move(h), ch) : std::move(h));
        } else {
          AsyncWait w;
          w.req = std::move(batch[i]);
          w.queued = is.grant;
          w.frozen = is.frozen;
          w.gen = sess.gen;
          w.cohort_owner = owner[i];
          w.cohort_share = share[i];
          waits.push_back(std::move(w));
        }
      }
    }
    // An owner's wait goes into the queue before any request that waits in the cohort behind
    // it, and the waiter threads take the queue in order: the owner's acquire is always being
    // finished on some waiter thread while requests of its entry wait there (no waiter thread
    // waits in the cohort for a request no thread works on).
    for (auto& w : queued) waits.push_back(std::move(w));
    if (!waits.empty()) {
      bool stopped = false;
      {
        MutexLock lk(&async_mu_);
        stopped = async_stop_;
        if (!stopped) {
          for (auto& w : waits) wait_q_.push_back(std::move(w));
        }
      }
      if (!stopped) {
        wait_cv_.SignalAll();
      } else {
        // A callback above closed the client: StopAsync has run, and no waiter thread serves the
        // queue any more. These end as StopAsync ends what it finds queued (client.h: each
        // callback runs once, kConnection on close).
        for (auto& w : waits) {
          FinishUngranted(w.req, w.cohort_owner, Error(ErrorCode::kConnection, "client closed"));
        }
      }
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
        return async_stop_ || TakeableLocked();
      });
      if (async_stop_ && wait_q_.empty()) return;
      w = TakeWaitLocked();
    }
    const bool in_cohort = w.cohort_queued;
    FinishWait(w);
    if (in_cohort) {
      {
        MutexLock lk(&async_mu_);
        --cohort_waiting_;
      }
      wait_cv_.SignalAll();  // a wait in the cohort may be taken again
    }
  }
}

// A wait in the cohort blocks its thread until its entry's owner hands the grant over (or its
// deadline). Taken ahead of an owner's wait still in this queue, four of them held every waiter
// thread and the owner's wait was never finished: neither were theirs (found by review,
// 2026-12-07). One thread is always left out of the cohort, so an owner's wait always gets one,
// also one that took its entry after those threads began their waits in the cohort (its wait
// not yet queued when they took theirs). The cost: while three wait in the cohort (behind a
// lock the application holds, say), a fourth wait in the cohort, of another lock, waits for one
// of them to end, even if its own lock is free by then.
std::deque<Client::Impl::AsyncWait>::const_iterator Client::Impl::FirstTakeableLocked() const {
  const bool cohort_ok = async_stop_ || cohort_waiting_ < kAsyncWaiters - 1;
  return std::find_if(wait_q_.begin(), wait_q_.end(),
                      [&](const AsyncWait& w) { return !w.cohort_queued || cohort_ok; });
}

bool Client::Impl::TakeableLocked() const { return FirstTakeableLocked() != wait_q_.end(); }

Client::Impl::AsyncWait Client::Impl::TakeWaitLocked() {
  // The first that may be taken, in the order they came (TakeableLocked: there is one).
  auto it = wait_q_.begin() + (FirstTakeableLocked() - wait_q_.cbegin());
  AsyncWait w = std::move(*it);
  wait_q_.erase(it);
  if (w.cohort_queued) ++cohort_waiting_;
  return w;
}

Clock::time_point Client::Impl::TakeOverdueLocked(Clock::time_point now,
                                                  std::vector<AsyncWait>* overdue) {
  Clock::time_point next = Clock::time_point::max();
  for (auto it = wait_q_.begin(); it != wait_q_.end();) {
    const Clock::time_point d = it->req.deadline;
    const Clock::time_point due =
        d >= Clock::time_point::max() - kOverdueWait ? Clock::time_point::max() : d + kOverdueWait;
    if (due <= now) {
      overdue->push_back(std::move(*it));
      it = wait_q_.erase(it);
    } else {
      next = std::min(next, due);
      ++it;
    }
  }
  return next;
}

void Client::Impl::FinishWait(AsyncWait& w, bool overdue) {
  // The ticket the pump queued is session w.gen's (a frozen request and one that waits in the
  // cohort hold none). Once that session has ended, before this thread took the request or
  // while it waited for a connection, the ticket is not the client's: lockd frees it from the
  // record at its turn. Watched for through the next session's connection, it was seen granted
  // before lockd's release of it, and the caller held a lock lockd then gave another client
  // (unit test `session keeping: an async request queued in an ended session is never
  // granted`). The request fails, as a blocking one does whose session ends while it waits.
  const auto queued_in_ended_session = [&](uint64_t gen) {
    if (w.frozen || w.cohort_queued || gen == w.gen) return false;
    FinishUngranted(w.req, w.cohort_owner,
                    Error(ErrorCode::kConnection,
                          "the session with lockd ended while the request was queued; lockd "
                          "frees its ticket"));
    return true;
  };
  if (queued_in_ended_session(gen_.load(std::memory_order_acquire))) return;
  // On the pump (overdue): no join, which could keep every new request waiting behind it for
  // a second or more; its time is up anyway.
  Result<ThreadChannel*> chr = overdue ? ExistingChannel() : Channel(w.req.deadline);
  if (overdue && (!chr.ok() || *chr == nullptr)) {
    const bool try_only = w.req.options.timeout && w.req.options.timeout->count() == 0;
    chr = try_only ? Error(ErrorCode::kBusy, "slot " + std::to_string(w.req.slot) + " is held")
                   : Error(ErrorCode::kTimeout, "timed out waiting for slot " +
                                                    std::to_string(w.req.slot) +
                                                    " (no connection of this thread's to wait on)");
  }
  if (!chr.ok()) {
    // The pump's FA queued the request (unless the word was frozen): a waiter that cannot
    // join (the session's connection cap) hands the ticket to the reaper, which releases it at
    // its turn, or the lock's queue would stop at it. Of an ended session it is dropped
    // (lockd frees what the record shows).
    if (!w.frozen && !w.cohort_queued) {
      Abandon(w.gen, w.queued.ticket, w.queued.lease_start);  // unwatched since its FA
    }
    FinishUngranted(w.req, w.cohort_owner, chr.status());
    return;
  }
  if (ClosingAsync()) {  // after Channel(): see ClosingAsync
    FinishUngranted(w.req, w.cohort_owner, Error(ErrorCode::kConnection, "client closed"));
    return;
  }
  if (w.cohort_queued) {
    CohortWait(w, *chr);
    return;
  }
  ThreadChannel& ch = **chr;
  const Session& sess = *ch.session;
  if (queued_in_ended_session(sess.gen)) return;
  AcquireOptions ao;
  ao.deadline = w.req.deadline;
  ao.try_only = w.req.options.timeout && w.req.options.timeout->count() == 0;
  ao.want_token = w.req.options.fencing_token && w.req.mode == Mode::kExclusive;
  Result<Grant> g = Error(ErrorCode::kInternal, "not acquired");
  Clock::time_point completed{};
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
    completed = ch.mem->last_completed();
  }
  if (!g.ok()) {
    if (w.cohort_owner) cohort_->Leave(w.req.slot);
    if (g.status().code() == ErrorCode::kTimeout) ++ch.timeouts;
    FailWait(w.req, sess.gen, g.status());
    return;
  }
  TestHook("granted");
  LockHandle h = MakeHandle(ch, *g, completed, w.req.options.auto_renew, w.req.submitted,
                            w.cohort_owner ? cohort_.get() : nullptr);
  FinishGranted(w.req, w.cohort_share ? ShareGrant(std::move(h), ch) : std::move(h));
}

// A request the pump did not issue because another of the client's requests owns its slot's
// cohort entry: it waits there as a blocking Lock does (CohortAcquire), on this waiter thread,
// until a holder hands it the grant, or the entry comes to it without one (it acquires from
// lockd here), or its deadline passes, or the client closes (StopAsync sets async_cancel_).
void Client::Impl::CohortWait(AsyncWait& w, ThreadChannel* ch) {
  const uint64_t slot = w.req.slot;
  AcquireOptions ao;
  ao.deadline = w.req.deadline;
  ao.want_token = w.req.options.fencing_token;  // exclusive (only those join the cohort)
  Clock::time_point started = w.req.submitted;
  bool owner = false;
  auto local =
      CohortAcquire(&ch, slot, ao, w.req.options.auto_renew, &started, &owner, &async_cancel_);
  if (!local.ok()) {
    Finish(w.req, local.status());
    return;
  }
  if (local->valid()) {
    // A handed-over grant brings its own budget unit (AdoptGrant): the request's goes back.
    FinishAdopted(w.req, std::move(local).value());
    return;
  }
  // The entry is this request's (or another slot's: bypass): acquire from lockd, as a blocking
  // request does, with the budget unit LockSlotAsync took; CohortAcquire may have joined a new
  // session for it, so not if the client is closing (ClosingAsync).
  if (ClosingAsync()) {
    FinishUngranted(w.req, owner, Error(ErrorCode::kConnection, "client closed"));
    return;
  }
  const Session& sess = *ch->session;
  Result<Grant> g = Error(ErrorCode::kInternal, "not acquired");
  Clock::time_point completed{};
  {
    MutexLock clk(&ch->mu);
    Status st = ch->Reap();
    if (st.ok()) {
      std::tie(ao.record, ao.record_seq) = ch->TakeEntry(opts_.record_requests);
      ao.pending = &ch->pending;
      g = sess.engine->Acquire(*ch->mem, slot, Mode::kExclusive, ao, &ch->events);
    } else {
      g = st;
    }
    ch->NotePending();
    completed = ch->mem->last_completed();
  }
  if (!g.ok()) {
    if (owner) cohort_->Leave(slot);
    if (g.status().code() == ErrorCode::kTimeout) ++ch->timeouts;
    FailWait(w.req, sess.gen, g.status());
    return;
  }
  TestHook("granted");
  FinishGranted(w.req, MakeHandle(*ch, *g, completed, w.req.options.auto_renew, started,
                                  owner ? cohort_.get() : nullptr));
}

// A waiter's wait at lockd failed with `st`. While the client closes, that is StopAsync shutting
// the waiter's connection, not the session's end: the request ends "client closed", and the
// session is left to Close, which tells the held locks so on its own thread (the waiter ended the
// session, and they were told "session with lockd ended" here; found by review, 2026-12-08).
void Client::Impl::FailWait(AsyncRequest& r, uint64_t gen, const Status& st) {
  if (ClosingAsync()) {
    Finish(r, Error(ErrorCode::kConnection, "client closed"));
    return;
  }
  OnSessionError(gen, st);
  Finish(r, st);
}

// Whether StopAsync has begun. A waiter thread asks after it has its connection and before it
// waits at lockd: StopAsync shuts the waiters' connections it finds registered (which ends their
// waits) and then joins them, so a connection registered after it looked (a waiter still joining
// the session then) was never shut, and its wait for a lock another client held kept the close
// waiting until that client released (unit test `async: closing a client whose waiter thread is
// still joining the session ends it`). Registered before this reads false, a connection is one
// StopAsync finds: it sets the flag before it looks.
bool Client::Impl::ClosingAsync() {
  MutexLock lk(&async_mu_);
  return async_stop_;
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
  // Waiters waiting in the cohort (CohortWait) behind a lock that may never be released (its
  // holder's handle lives on) give up: their requests end with kConnection.
  if (cohort_) {
    async_cancel_.store(true, std::memory_order_release);
    cohort_->WakeAll();
  }
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
  std::vector<uint64_t> owned;  // cohort entries of requests no waiter took: passed on
  {
    MutexLock lk(&async_mu_);
    for (auto& w : wait_q_) {
      if (w.cohort_owner) owned.push_back(w.req.slot);
      async_q_.push_back(std::move(w.req));
    }
    wait_q_.clear();
  }
  for (uint64_t slot : owned) cohort_->Leave(slot);  // not under async_mu_ (a leaf)
  for (auto& ch : chans) ch->mem->Shutdown();
  for (auto& t : waiters_) JoinOrDetach(t, me);
  std::deque<AsyncRequest> left;
  {
    MutexLock lk(&async_mu_);
    left.swap(async_q_);
  }
  for (auto& r : left) Finish(r, Error(ErrorCode::kConnection, "client closed"));
}

Status Client::LockAsync(std::string_view name, const LockOptions& options, LockCallback done) {
  if (name.empty()) return Error(ErrorCode::kInvalidArgument, "lock name is empty");
  if (impl_->inherited()) return Impl::InheritedError();
  const uint64_t count = impl_->latest_session()->reply.lock_count;
  impl_->TestHook("hashed");
  return impl_->SubmitLock(SlotForName(name, count), options, std::move(done), count);
}

Status Client::LockSlotAsync(uint64_t slot, const LockOptions& options, LockCallback done) {
  return impl_->SubmitLock(slot, options, std::move(done), 0);
}

Status Client::Impl::SubmitLock(uint64_t slot, const LockOptions& options,
                                Client::LockCallback done, uint64_t hashed_with) {
  if (!done) return Error(ErrorCode::kInvalidArgument, "LockSlotAsync needs a callback");
  if (inherited()) return InheritedError();
  if (options.timeout && options.timeout->count() < 0) {
    return Error(ErrorCode::kInvalidArgument, "negative lock timeout");
  }
  const uint64_t count = latest_session()->reply.lock_count;
  if (hashed_with != 0) RDMALOCK_RETURN_IF_ERROR(sdk::SameNameMapping(hashed_with, count));
  if (slot >= count) {
    return Error(ErrorCode::kInvalidArgument, "slot " + std::to_string(slot) +
                                                  " is out of range (lock_count " +
                                                  std::to_string(count) + ")");
  }
  if (!budget_->Take(slot)) return budget_->Refusal(slot);
  AsyncRequest r;
  r.slot = slot;
  r.mode = static_cast<Mode>(options.mode);
  r.options = options;
  r.hashed_with = hashed_with;
  if (options.timeout) r.deadline = sdk::DeadlineAfter(Clock::now(), *options.timeout);
  // The request holds the unit until a grant of its own takes it (Impl::FinishGranted) or it
  // ends (Impl::Finish gives it back).
  r.done = std::move(done);
  TestHook("submitting");
  Status st = Submit(std::move(r));
  if (!st.ok()) budget_->Give(slot);
  return st;
}

}  // namespace rdmalock
