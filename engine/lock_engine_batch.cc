// LockEngine's batches: sets of locks acquired and released in as few doorbells as
// budget::kMaxOpsPerDoorbell allows, and the async path's issue and finish (engine/lock_engine.h).
#include <algorithm>
#include <utility>
#include <vector>

#include "engine/lock_engine.h"
#include "engine/lock_engine_internal.h"

namespace rdmalock {
using namespace engine_internal;  // NOLINT: the engine's own helpers
using proto::Word0;

std::vector<Status> LockEngine::ReleaseMany(RemoteMemory& mem, std::span<const Grant> grants,
                                            EngineEvents* ev) const {
  std::vector<Status> out(grants.size());
  for (size_t base = 0; base < grants.size();) {
    RemoteOp ops[kBatchOps];
    // One entry per release in this doorbell: a release is one operation (the CAS: unrecorded,
    // or a tagged exclusive entry) or two (the done mark and the CAS), so up to kBatchOps of them.
    size_t cas_at[kBatchOps];
    size_t idx[kBatchOps];
    size_t n = 0, k = 0;
    for (; base < grants.size() && n + 2 <= kBatchOps; ++base) {
      const Grant& g = grants[base];
      Word0 cur = g.seen;
      if (Status st = CheckReleasable(mem, g, &cur); !st.ok()) {
        out[base] = st;
        continue;
      }
      RemoteOp two[2];
      const size_t first = ReleaseOps(g.ticket, cur, two);
      for (size_t i = first; i < 2; ++i) ops[n++] = two[i];
      cas_at[k] = n - 1;
      idx[k++] = base;
    }
    if (Status st = mem.Execute(std::span<RemoteOp>(ops, n)); !st.ok()) {
      for (size_t i = 0; i < k; ++i) out[idx[i]] = st;  // entries stay out (see Release)
      continue;
    }
    for (size_t i = 0; i < k; ++i) {
      const Grant& g = grants[idx[i]];
      const RemoteOp& cas = ops[cas_at[i]];
      if (cas.result[0] == cas.operand) {
        if (g.ticket.record != 0 && on_record_free_) on_record_free_(g.ticket.record);
        const Word0 now = Word0::Decode(cas.swap);
        if (now.Resettable()) out[idx[i]] = ResetDrained(mem, g.ticket.slot, now, ev);
        continue;
      }
      out[idx[i]] = ReleaseFrom(mem, g, Word0::Decode(cas.result[0]), /*missed=*/true, ev);
    }
  }
  return out;
}

Result<std::vector<Issued>> LockEngine::IssueMany(RemoteMemory& mem,
                                                  std::span<const ManyRequest> reqs,
                                                  bool want_token, const EntrySource& take,
                                                  PendingRelease* pending, EngineEvents* ev) const {
  for (const ManyRequest& r : reqs) {
    if (r.slot >= params_.lock_count) {
      return Error(ErrorCode::kInvalidArgument, "slot " + std::to_string(r.slot) +
                                                    " is out of range (lock_count " +
                                                    std::to_string(params_.lock_count) + ")");
    }
  }
  const auto token = [&](const ManyRequest& r) {
    return (want_token || r.want_token) && r.mode == Mode::kExclusive;
  };
  // Recorded requests tag their entries with the slot's generation as Acquire's do
  // (lock_engine.cc, AcquireImpl): from a READ after the request's FA in its doorbell, or from
  // what the session learned before. A token READs word1 of its slot. A tag the session knows no
  // recent generation for READs the words of its slot's whole block (kGenerationBlockSlots slots,
  // 1 KiB), as Acquire's does, and the session learns every slot there (LearnBlock): one block a
  // doorbell (budget::kMaxBlockRead), the first such request's; the doorbell's other requests in
  // that block take their word1 from it, and those in another block READ word1 alone. The block
  // READ goes after every FA of its doorbell, so it shows each of them word1 after its own FA.
  const bool recorded = static_cast<bool>(take);
  std::vector<Issued> got(reqs.size());
  // A slot the session saw frozen (FrozenMarks) is looked at first: one READ, no FA while it is
  // still frozen (the request is `frozen`, as a bounce's, and its caller queues it again, where
  // Acquire waits for the thaw). A loop of sets, or of async try-locks, then bounces off one
  // freeze once, not once per call (AcquireImpl).
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (!frozen_.Marked(reqs[i].slot)) continue;
    RDMALOCK_ASSIGN_OR_RETURN(const bool thawed, LookThawed(mem, reqs[i].slot, nullptr, ev));
    if (thawed) continue;
    got[i].frozen = true;
    got[i].grant.ticket = Ticket{reqs[i].slot, reqs[i].mode, Word0{}, 0, 0};
  }
  const auto last_seen = mem.last_completed();
  uint64_t block[2 * kGenerationBlockSlots];  // word0, word1 of slot b.first + i at 2i, 2i + 1
  for (size_t base = 0; base < reqs.size();) {
    RemoteOp ops[kBatchOps];
    size_t fa_at[kBatchOps];
    GenerationTable::Hint hints[kBatchOps];
    bool read_word1[kBatchOps];  // word1 READ after the FA: its own, or the block's
    uint64_t* word1[kBatchOps];  // where that READ's word1 lands
    bool have_block = false;     // the doorbell READs block b
    GenerationBlock b;
    size_t n = 0, first = base;
    // Stops when the doorbell is full: a request takes one operation or two (with its own READ),
    // and the block READ, once chosen, one at the end.
    for (; base < reqs.size() && n < kBatchOps && base - first < kBatchOps; ++base) {
      if (got[base].frozen) continue;  // still frozen: no FA (above)
      const ManyRequest& r = reqs[base];
      const size_t k = base - first;  // < kBatchOps (the loop's bound)
      const bool tag = recorded;
      const bool learn = !token(r) && tag && !RecentGeneration(r.slot, last_seen, &hints[k]);
      read_word1[k] = token(r) || learn;
      const GenerationBlock its = BlockOf(r.slot);
      const bool new_block = learn && !have_block;
      const bool via_block = learn && (new_block || its.first == b.first);
      const size_t need =
          1 + (read_word1[k] && !via_block ? 1 : 0) + (have_block || new_block ? 1 : 0);
      if (n + need > kBatchOps) break;
      fa_at[k] = n;
      ops[n++] =
          RemoteOp::FetchAdd(RegionId::kLocks, Word0Off(r.slot), proto::AcquireIncrement(r.mode));
      if (new_block) {
        b = its;
        have_block = true;
      }
      if (via_block) {
        word1[k] = &block[2 * (r.slot - b.first) + 1];
      } else if (read_word1[k]) {
        ops[n] = RemoteOp::Read(RegionId::kLocks, Word1Off(r.slot), 8);
        word1[k] = &ops[n++].result[0];
      }
    }
    if (n == 0) continue;  // every request of this round still frozen
    if (have_block) ops[n++] = b.Read(block);
    RDMALOCK_RETURN_IF_ERROR(mem.Execute(std::span<RemoteOp>(ops, n)));
    const auto issue = mem.last_issued();  // before the FAs were posted: the leases' start
    // The block's slots first: the requests' own tags below learn theirs again with their FAs'
    // counts. A slot whose word1 looks torn is not learned (LearnBlock).
    if (have_block) LearnBlock(b, block, /*except=*/~uint64_t{0}, issue);
    for (size_t i = first; i < base; ++i) {  // word1 for tokens and tags: made whole
      if (got[i].frozen || !read_word1[i - first]) continue;
      RDMALOCK_RETURN_IF_ERROR(WholeWord1(mem, reqs[i].slot, word1[i - first]));
    }
    RemoteOp queued[kBatchOps];
    size_t nq = 0;
    for (size_t i = first; i < base; ++i) {
      const ManyRequest& r = reqs[i];
      Issued& s = got[i];
      if (s.frozen) continue;  // no FA: still frozen when looked at
      const RemoteOp& fa = ops[fa_at[i - first]];
      const Word0 prev = Word0::Decode(fa.result[0]);
      s.grant.ticket = Ticket{r.slot, r.mode, prev, 0, 0};
      s.grant.lease_start = issue;
      if (prev.Frozen()) {
        // The word awaits a reset: take the increment back; the caller queues again.
        frozen_.Mark(r.slot);
        s.frozen = true;
        RDMALOCK_RETURN_IF_ERROR(WithdrawFrozen(mem, r.slot, proto::AcquireIncrement(r.mode),
                                                Word0::Decode(fa.result[0] + fa.operand), issue,
                                                ev));
        continue;
      }
      Ticket& t = s.grant.ticket;
      if (take) std::tie(t.record, t.record_seq) = take();
      if (t.record != 0) {
        const size_t k = i - first;
        RDMALOCK_RETURN_IF_ERROR(
            TagTicket(mem, &t, read_word1[k] ? word1[k] : nullptr, hints[k], issue));
      }
      if (t.record != 0) {
        queued[nq++] =
            EntryWrite(t.record, t.record_seq, r.slot, r.mode, proto::RequestEntry::State::kQueued,
                       prev.Encode(), t.tagged, t.generation);
      }
      s.grant.seen = Word0::Decode(prev.Encode() + fa.operand);
      if (token(r)) {
        s.grant.generation = proto::Generation(*word1[i - first]);
        s.grant.has_generation = true;
      }
      s.granted = proto::Granted(prev, prev, r.mode);
      if (s.granted) FillToken(&s.grant);
    }
    if (nq > 0) RDMALOCK_RETURN_IF_ERROR(mem.Post(std::span<RemoteOp>(queued, nq)));
    RDMALOCK_RETURN_IF_ERROR(ReapPending(mem, pending, ev));
  }
  return got;
}

Result<Grant> LockEngine::FinishAcquire(RemoteMemory& mem, const Grant& queued,
                                        const AcquireOptions& opt, EngineEvents* ev) const {
  const Ticket& t = queued.ticket;
  Grant g = queued;
  bool handed_off = false;
  if (opt.try_only) {
    if (Clock::now() - g.lease_start > params_.lease) {
      // Unwatched since its FA for more than a lease (an async try queued for a waiter thread):
      // not given up on the word as it is now, which may have been reset and brought back to
      // these numbers by others since (a withdrawal would take back the increment of the client
      // queued last; review, 2026-12-08). Its grant, were it granted, has a lapsed lease anyway:
      // handed over as Wait hands over a lapsed ticket.
      AbandonLapsed(t, g.lease_start, ev, &handed_off);
      if (!handed_off) FreeRecord(mem, t.record, t.record_seq);  // left to stall recovery
      return Error(ErrorCode::kBusy, "slot " + std::to_string(t.slot) + " is held");
    }
    auto gu = GiveUpTicket(mem, t, &g.seen, g.lease_start, ev);
    if (!gu.ok()) return gu.status();
    if (*gu == GiveUp::kGranted) {
      const bool lapsed = Clock::now() - g.lease_start > params_.lease;
      // Granted while the request waited unseen (an async try in the queue for a waiter thread)
      // for longer than a lease: its lease has run out, so its holder could never release it.
      // The handler releases it, and the try is busy. Its entry's rearm is waited for then: the
      // handler ends the entry on its own QP, which a WRITE still in flight on this one could
      // land after (and over the entry's next use).
      RDMALOCK_RETURN_IF_ERROR(RearmAfterGiveUp(mem, &g, /*wait=*/lapsed && on_abandon_));
      if (!lapsed || !on_abandon_) {
        FillToken(&g);
        return g;  // lapsed without a handler: waiters recover it after F x L, as in Wait
      }
      AbandonLapsed(g.ticket, g.lease_start, ev, &handed_off);  // unwatched since its FA
    } else if (*gu != GiveUp::kAbandoned) {
      FreeRecord(mem, t.record, t.record_seq);
    }
    return Error(ErrorCode::kBusy, "slot " + std::to_string(t.slot) + " is held");
  }
  Count(&EngineEvents::waits, ev);
  auto out = Wait(mem, t, g.lease_start, opt.deadline, &g, ev, &handed_off, &opt.while_waiting);
  if (!out.ok()) return out.status();
  if (*out == WaitOutcome::kGranted) {
    FillToken(&g);
    return g;
  }
  if (*out == WaitOutcome::kTimeout) {
    if (!handed_off) FreeRecord(mem, t.record, t.record_seq);
    return Error(ErrorCode::kTimeout, "timed out waiting for slot " + std::to_string(t.slot));
  }
  // Skipped, reset or paused: queue again, as Acquire() would, on the same record entry (none
  // when the paused ticket took it to the abandon handler).
  Count(&EngineEvents::restarts, ev);
  AcquireOptions again = opt;
  again.pending = nullptr;
  again.record = handed_off ? 0 : t.record;
  again.record_seq = handed_off ? 0 : t.record_seq;
  return Acquire(mem, t.slot, t.mode, again, ev);
}

Result<std::vector<Grant>> LockEngine::AcquireMany(RemoteMemory& mem,
                                                   std::span<const ManyRequest> reqs,
                                                   const AcquireOptions& opt,
                                                   const EntrySource& take_entry,
                                                   EngineEvents* ev) const {
  for (size_t i = 1; i < reqs.size(); ++i) {  // IssueMany checks the range
    if (reqs[i].slot <= reqs[i - 1].slot) {
      return Error(ErrorCode::kInvalidArgument, "AcquireMany needs distinct slots in order");
    }
  }
  RDMALOCK_RETURN_IF_ERROR(ReapPending(mem, opt.pending, ev));
  const EntrySource& take = take_entry;

  // Phase 1: every FA (and token READ) in as few doorbells as the batch limit allows.
  RDMALOCK_ASSIGN_OR_RETURN(std::vector<Issued> got,
                            IssueMany(mem, reqs, opt.want_token, take, opt.pending, ev));
  size_t k = 0;  // the first lock not granted at once
  while (k < got.size() && got[k].granted) ++k;
  std::vector<Grant> grants;
  grants.reserve(got.size());
  for (size_t i = 0; i < k; ++i) grants.push_back(got[i].grant);
  if (k == got.size()) return grants;
  Count(&EngineEvents::batch_fallbacks, ev);

  // Phase 2: give back everything above k (granted ones released, queued ones withdrawn or
  // abandoned), so that while waiting for k this set holds only locks below it.
  auto give_back = [&](size_t from, bool include_from) {
    std::vector<Grant> rel;
    for (size_t i = include_from ? from : from + 1; i < got.size(); ++i) {
      Issued& s = got[i];
      if (s.frozen) continue;
      if (s.granted) {
        rel.push_back(s.grant);
        continue;
      }
      Word0 cur = s.grant.seen;
      const Ticket& tk = s.grant.ticket;
      auto gu = GiveUpTicket(mem, tk, &cur, s.grant.lease_start, ev);
      if (!gu.ok()) return gu.status();
      if (*gu == GiveUp::kGranted) {
        Grant g = s.grant;
        g.seen = cur;
        g.has_generation = false;  // released at once: no token, so no READ of word1 for one
        // Live again until its release lands, as a single request's (the withdrawal marked it
        // done): a client that died meanwhile would leave lockd nothing to free.
        if (Status st = RearmAfterGiveUp(mem, &g); !st.ok()) return st;
        rel.push_back(g);
      } else if (*gu != GiveUp::kAbandoned) {
        FreeRecord(mem, tk.record, tk.record_seq);
      }
    }
    for (const Status& st : ReleaseMany(mem, rel, ev)) {
      if (st.code() == ErrorCode::kConnection) return st;
    }
    return Status::Ok();
  };
  auto fail = [&](Status why) -> Result<std::vector<Grant>> {
    for (const Status& st : ReleaseMany(mem, grants, ev)) {
      if (st.code() == ErrorCode::kConnection) return st;
    }
    return why;
  };
  if (opt.try_only) {
    if (Status st = give_back(k, true); !st.ok()) return st;
    return fail(Error(ErrorCode::kBusy, "slot " + std::to_string(reqs[k].slot) + " is held"));
  }
  if (Status st = give_back(k, false); !st.ok()) return st;

  // Phase 3: wait for k with the ticket in hand, then take the rest one by one, in order. The
  // locks granted so far are this set's, and nothing else renews them while it waits (they
  // become handles, which the SDK's keeper renews, only once the whole set is granted): renew
  // them here, when a third of their lease has gone, as the keeper would. One that cannot be
  // renewed fails the set (all or nothing).
  Status renewal;
  const std::function<bool()> renew_held = [&] {
    const auto now = Clock::now();
    for (Grant& g : grants) {
      if (now - g.lease_start < params_.lease / 3) continue;
      renewal = Renew(mem, g, ev);
      Count(renewal.ok() ? &EngineEvents::renewals : &EngineEvents::renew_failures, ev);
      if (!renewal.ok()) return false;  // ends the wait: the set fails, the rest released
    }
    return true;
  };
  for (size_t i = k; i < got.size(); ++i) {
    Issued& s = got[i];
    AcquireOptions one = opt;
    one.pending = nullptr;
    one.while_waiting = renew_held;
    Result<Grant> g = Error(ErrorCode::kInternal, "not acquired");
    if (i == k && !s.frozen) {
      one.try_only = false;
      g = FinishAcquire(mem, s.grant, one, ev);
    } else {
      if (take) std::tie(one.record, one.record_seq) = take();
      g = Acquire(mem, reqs[i].slot, reqs[i].mode, one, ev);
    }
    if (!renewal.ok()) {
      // A lock of the set could not be renewed (lost, or the connection broke): the wait ended
      // there, and the set fails; what it still holds is released while the leases run.
      if (g.ok()) grants.push_back(*g);
      if (renewal.code() == ErrorCode::kConnection) return renewal;
      return fail(
          Error(ErrorCode::kLockLost, "a lock of the set was lost while the set waited for slot " +
                                          std::to_string(reqs[i].slot) + ": " + renewal.message()));
    }
    if (!g.ok()) {
      if (g.status().code() == ErrorCode::kConnection) return g.status();
      return fail(g.status());
    }
    grants.push_back(*g);
  }
  return grants;
}
}  // namespace rdmalock
