// The reaper thread: frees tickets that gave up while others queued behind them, and reaps
// releases that threads posted and left. Owns idle_reap_ticks_; its channel is its own, made
// for each session before any application thread can join it (JoinOwnThreads, Reconnect).
// Releases left by other threads it reaps on their own connections.
#include "client/src/client_impl.h"

namespace rdmalock {

using sdk::Session;
using sdk::ThreadChannel;

void Client::Impl::Abandon(uint64_t gen, Ticket t, Clock::time_point watched) {
  t.watched = watched;
  {
    MutexLock lk(&mu_);
    if (session_ == nullptr || session_->gen != gen) return;  // the session is gone anyway
    abandoned_.emplace_back(gen, t);
    budget_->Force(t.slot);  // the reaper's until it is done with the ticket
  }
  cv_.SignalAll();
}

void Client::Impl::GiveAll(std::vector<ReapState>* pending) {
  for (const ReapState& r : *pending) budget_->Give(r.ticket.slot);
  pending->clear();
}

// Frees tickets that gave up (a timeout or a busy try) while others were queued behind them:
// each must be released when its turn comes. They are stepped together, without blocking
// (LockEngine::Reap, one READ each per round): draining them one at a time could stall them
// all behind one whose turn waits for a holder that itself waits behind another abandoned
// ticket (docs/protocol.md §3).
void Client::Impl::ReaperLoop() {
  std::vector<ReapState> pending;
  uint64_t pending_gen = 0;  // the session the pending tickets belong to
  for (;;) {
    {
      MutexLock lk(&mu_);
      const auto wake = [&] {
        mu_.AssertHeld();
        return stopping_ || !abandoned_.empty() || wake_reaper_;
      };
      if (!pending.empty()) {
        cv_.WaitFor(lk, std::chrono::microseconds(500), wake);
      } else if (reap_fast_.load(std::memory_order_relaxed)) {
        cv_.WaitFor(lk, kReapTick, wake);
      } else {
        cv_.Wait(lk, wake);
      }
      wake_reaper_ = false;
      if (stopping_) return;
      while (!abandoned_.empty()) {
        ReapState r;
        r.ticket = abandoned_.front().second;
        r.own = true;
        if (abandoned_.front().first != pending_gen) GiveAll(&pending);  // an ended session's
        pending_gen = abandoned_.front().first;
        abandoned_.pop_front();
        pending.push_back(r);
      }
    }
    // Releases other threads posted and left: reaped here, not on the keeper, whose heartbeat
    // must never wait behind another connection's retransmissions.
    if (reap_fast_.load(std::memory_order_relaxed) &&
        !release_reaping_paused_.load(std::memory_order_relaxed)) {
      ReapLeftReleases();
    }
    if (pending.empty()) continue;
    auto ch = Channel(Clock::now());
    if (!ch.ok()) {
      GiveAll(&pending);  // the session ended: lockd frees what the record shows
      continue;
    }
    ThreadChannel& c = **ch;
    if (c.session->gen != pending_gen) {
      GiveAll(&pending);
      continue;
    }
    Status st;
    {
      MutexLock clk(&c.mu);
      st = c.Reap();
      for (size_t i = 0; st.ok() && i < pending.size();) {
        auto done = c.session->engine->Reap(*c.mem, pending[i], &c.events);
        if (!done.ok()) {
          st = done.status();
        } else if (*done) {
          budget_->Give(pending[i].ticket.slot);
          pending[i] = pending.back();
          pending.pop_back();
        } else {
          ++i;
        }
      }
    }
    if (!st.ok()) {
      GiveAll(&pending);
      OnSessionError(c.session->gen, st);
    }
  }
}

// Reaps releases that threads posted and then left (no call on the client since): a release
// whose CAS missed must be retried soon, or the lock's waiters wait for it.
void Client::Impl::ReapLeftReleases() {
  std::vector<std::shared_ptr<ThreadChannel>> left;
  bool any = false;
  {
    MutexLock lk(&mu_);
    for (auto& [tid, ch] : channels_) {
      const uint64_t post = ch->pending_post.load(std::memory_order_relaxed);
      if (post == 0) {
        ch->reaper_seen = 0;
        continue;
      }
      any = true;
      // The same release outstanding at this tick and the last: left for at least a tick.
      if (post == ch->reaper_seen) left.push_back(ch);
      ch->reaper_seen = post;
    }
  }
  if (any) {
    idle_reap_ticks_ = 0;
  } else if (++idle_reap_ticks_ > 20) {
    TestHook("reaper_slowing");
    SlowDown();
  }
  for (auto& ch : left) {
    if (!ch->mu.TryLock()) continue;  // its thread is using it, and reaps it itself
    const Status st = ch->Reap();
    ch->mu.Unlock();
    if (!st.ok()) OnSessionError(ch->session->gen, st);
  }
}

// 20 ms with no posted release left: the reaper stops ticking. A thread may post a release
// after the look at the channels and see the flag still set (ReleasePosted): after clearing it,
// the reaper looks again, and ticks on if it finds one. Both sides store, then load, in
// sequentially consistent order (the post in ThreadChannel::NotePending), so one of the two
// sees the other's store.
void Client::Impl::SlowDown() {
  idle_reap_ticks_ = 0;
  reap_fast_.store(false, std::memory_order_seq_cst);
  MutexLock lk(&mu_);
  for (auto& [tid, ch] : channels_) {
    if (ch->pending_post.load(std::memory_order_seq_cst) != 0) {
      reap_fast_.store(true, std::memory_order_relaxed);
      return;
    }
  }
}

// A thread posted a release (ThreadChannel::NotePending set its pending_post): make sure the
// reaper thread ticks fast enough to reap it if the thread makes no further call.
void Client::Impl::ReleasePosted() {
  if (reap_fast_.load(std::memory_order_seq_cst)) return;  // after the post (SlowDown)
  {
    MutexLock lk(&mu_);
    reap_fast_.store(true, std::memory_order_relaxed);
    wake_reaper_ = true;
  }
  cv_.SignalAll();
}

}  // namespace rdmalock
