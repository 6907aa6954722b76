// Randomized stress of the protocol engine over the in-process backend: many threads, random
// modes, slots, timeouts, renewals, process pauses (before any remote operation, including a
// release) and crashes (a client that stops at any operation, holding or waiting). A shadow owner
// table checks that no two conflicting grants are ever lease-valid at once, and that fencing
// tokens of exclusive grants strictly increase per slot.
//
// Scale with RDMALOCK_STRESS_THREADS and RDMALOCK_STRESS_OPS (defaults 16 and 100000).
#include <atomic>
#include <catch2/catch.hpp>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <shared_mutex>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "client/src/entry_pool.h"
#include "engine/lock_engine.h"
#include "rdmalock/proto/layout.h"
#include "tests/support/inproc_memory.h"
#include "tests/support/test_env.h"

using namespace rdmalock;
using namespace std::chrono_literals;

namespace {

using testing::EnvInt;

struct Holder {
  int thread;
  uint64_t serial;
  Mode mode;
  Clock::time_point lease_end;
};

// An exclusive grant as the shadow saw it, kept so that a token violation can print both grants.
struct ExclusiveGrant {
  int thread = -1;
  uint64_t serial = 0;
  uint64_t ticket_word = 0;  // word0 as the request's FA returned it
  uint64_t generation = 0;
  uint64_t token = 0;
  Clock::time_point lease_start;
  Clock::time_point returned;  // when Acquire returned
  Clock::time_point observed;  // when the shadow judged it (under sh.mu)
  uint64_t restarts = 0;       // tickets given up and drawn again (skipped, reset, paused)
  bool waited = false;         // granted in Wait rather than by its FA
  bool gave_up = false;        // the deadline had passed: granted while giving up its ticket
};

struct SlotShadow {
  std::mutex mu;
  std::vector<Holder> holders;
  uint64_t last_token = 0;
  ExclusiveGrant last;  // the grant that set last_token
};

struct Totals {
  std::atomic<uint64_t> grants{0}, violations{0}, token_violations{0}, crashes{0}, pauses{0},
      timeouts{0}, lost{0}, renewals{0}, errors{0}, posted{0};
  std::mutex report_mu;
  std::string report;  // each violation, both grants in full
};

// Fencing, as lockd does it: once a client is declared dead, none of its operations (from any of
// its channels, including its reaper's) lands any more. Operations hold the fence shared.
struct Fence {
  std::shared_mutex mu;
  bool dead = false;
};

class FencedMemory : public RemoteMemory {
 public:
  FencedMemory(InProcessTable* table, Fence* fence) : inner_(table), fence_(fence) {
    set_min_round_trip(std::chrono::microseconds(20));
  }
  Status ReadBytes(RegionId r, uint64_t off, std::span<uint8_t> dst) override {
    return inner_.ReadBytes(r, off, dst);
  }

 protected:
  Status DoExecute(std::span<RemoteOp> ops) override {
    std::shared_lock lk(fence_->mu);
    if (fence_->dead) return Error(ErrorCode::kConnection, "fenced");
    return inner_.Execute(ops);
  }

 private:
  InProcessMemory inner_;
  Fence* fence_;
};

// Frees abandoned tickets on its own channel, as the SDK's reaper does: all of them stepped
// together without blocking (LockEngine::Reap, own = true).
class Reaper {
 public:
  // `fence_of`: the fence of a ticket's owner (null: unfenced).
  Reaper(InProcessTable* table, const LockEngine* engine,
         std::function<Fence*(const Ticket&)> fence_of = {})
      : table_(table), engine_(engine), fence_of_(std::move(fence_of)) {
    thread_ = std::thread([this] { Run(); });
  }
  ~Reaper() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Add(const Ticket& t) {
    {
      std::lock_guard lk(mu_);
      q_.push_back(t);
    }
    cv_.notify_all();
  }

 private:
  void Run() {
    InProcessMemory mem(table_);
    std::vector<ReapState> pending;
    for (;;) {
      {
        std::unique_lock lk(mu_);
        const auto wake = [&] { return stop_ || !q_.empty(); };
        if (pending.empty()) {
          cv_.wait(lk, wake);
        } else {
          cv_.wait_for(lk, std::chrono::microseconds(200), wake);
        }
        if (stop_) return;
        for (const Ticket& t : q_) {
          ReapState r;
          r.ticket = t;
          r.own = true;
          pending.push_back(r);
        }
        q_.clear();
      }
      for (size_t i = 0; i < pending.size();) {
        Fence* f = fence_of_ ? fence_of_(pending[i].ticket) : nullptr;
        Result<bool> done = false;
        if (f != nullptr) {
          FencedMemory fm(table_, f);  // the reaper is part of the ticket's client process
          done = engine_->Reap(fm, pending[i]);
        } else {
          done = engine_->Reap(mem, pending[i]);
        }
        if (!done.ok() || *done) {  // finished, or its client died (fenced): nothing more to do
          pending[i] = pending.back();
          pending.pop_back();
        } else {
          ++i;
        }
      }
    }
  }
  InProcessTable* table_;
  const LockEngine* engine_;
  std::function<Fence*(const Ticket&)> fence_of_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ticket> q_;
  bool stop_ = false;
  std::thread thread_;
};

// One client thread's session records: each "process" (incarnation) of the thread gets a record
// of its own, handed out entry by entry as the SDK does.
constexpr uint64_t kRecordsPerThread = 256;

class RecordSpace {
 public:
  void Reset(uint64_t base) {
    std::lock_guard lk(mu_);
    pool_ = std::make_unique<EntryPool>(base, proto::SessionRecord::kMaxEntries);
  }
  uint64_t base() {
    std::lock_guard lk(mu_);
    return pool_->record_offset();
  }
  std::pair<uint64_t, uint32_t> Take() {
    std::lock_guard lk(mu_);
    return pool_->Take();
  }
  void Give(uint64_t rec) {  // an older incarnation's entries are ignored by the pool
    std::lock_guard lk(mu_);
    pool_->Give(rec);
  }

 private:
  std::mutex mu_;
  std::unique_ptr<EntryPool> pool_;
};

// lockd's fast recovery: frees what a crashed client's record shows, stepping Reap() on a channel
// of its own, as lockd's recovery thread does on its loopback QP.
class FastRecovery {
 public:
  FastRecovery(InProcessTable* table, const LockEngine* engine) : table_(table), engine_(engine) {
    thread_ = std::thread([this] { Run(); });
  }
  ~FastRecovery() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // The client is fenced (its channel broke: nothing of it lands any more): take its record.
  void Take(uint64_t base) {
    std::vector<ReapState> items;
    for (uint32_t i = 0; i < proto::SessionRecord::kMaxEntries; ++i) {
      const uint64_t off = base + proto::SessionRecord::EntryOffset(i);
      const uint64_t a = table_->session_word(off).load();
      const uint64_t b = table_->session_word(off + 8).load();
      const uint64_t d = table_->session_word(off + proto::RequestEntry::kDone).load();
      proto::RequestEntry e;
      if (!proto::RequestEntry::DecodeLive(a, b, d, &e)) continue;
      if (e.state != proto::RequestEntry::State::kQueued) continue;
      items.push_back(ReapState::ForEntry(e));
      items.back().NoteScan(table_->Load(e.slot, 1));
    }
    std::lock_guard lk(mu_);
    for (auto& r : items) q_.push_back(r);
    cv_.notify_all();
  }
  uint64_t released() const { return released_.load(); }

 private:
  void Run() {
    InProcessMemory mem(table_);
    std::vector<ReapState> pending;
    for (;;) {
      {
        std::unique_lock lk(mu_);
        if (pending.empty()) cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (stop_) return;
        for (auto& r : q_) pending.push_back(r);
        q_.clear();
      }
      for (auto& r : pending) {
        auto done = engine_->Reap(mem, r);
        if (!done.ok()) r.outcome = ReapState::Outcome::kGaveUp;
        if (r.outcome == ReapState::Outcome::kReleased) released_++;
      }
      std::erase_if(pending,
                    [](const ReapState& r) { return r.outcome != ReapState::Outcome::kPending; });
      if (!pending.empty()) std::this_thread::sleep_for(20us);
    }
  }
  InProcessTable* table_;
  const LockEngine* engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<ReapState> q_;
  bool stop_ = false;
  std::atomic<uint64_t> released_{0};
  std::thread thread_;
};

// `records`: clients record their requests and a crashed client's locks are freed at once by
// FastRecovery (a crashed holder stops counting as a holder when it dies). Without, only the
// waiters' stall recovery frees them.
void Stress(bool records) {
  const int threads = EnvInt("RDMALOCK_STRESS_THREADS", 16);
  const int ops = EnvInt("RDMALOCK_STRESS_OPS", 100000) / (records ? 2 : 1);
  const unsigned seed = testing::StressSeed();
  CAPTURE(seed);
  constexpr uint64_t kSlots = 64;
  const auto lease = 20ms;
  InProcessTable table(
      kSlots, static_cast<uint64_t>(threads) * kRecordsPerThread * proto::kSessionRecordSize);
  std::unique_ptr<Reaper> reaper;
  std::vector<RecordSpace> spaces(static_cast<size_t>(threads));
  EngineParams p;
  p.lock_count = kSlots;
  p.lease = lease;
  p.stall_factor = 2;
  p.epoch = 3;
  LockEngine engine(
      p, [&](const Ticket& t) { reaper->Add(t); },
      [&](uint64_t rec) {
        spaces[rec / (kRecordsPerThread * proto::kSessionRecordSize)].Give(rec);
      });
  // One fence per record (client incarnation).
  std::vector<std::unique_ptr<Fence>> fences(static_cast<size_t>(threads) * kRecordsPerThread);
  for (auto& f : fences) f = std::make_unique<Fence>();
  reaper = std::make_unique<Reaper>(&table, &engine, [&](const Ticket& t) -> Fence* {
    if (!records || t.record == 0) return nullptr;
    return fences[t.record / proto::kSessionRecordSize].get();
  });
  FastRecovery fast(&table, &engine);
  std::vector<SlotShadow> shadow(kSlots);
  Totals tot;

  const auto start = Clock::now();
  const auto us = [&](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(t - start).count();
  };
  const auto describe = [&](const ExclusiveGrant& x) {
    std::ostringstream os;
    const proto::Word0 w = proto::Word0::Decode(x.ticket_word);
    os << "thread " << x.thread << " #" << x.serial << " "
       << (x.waited ? (x.gave_up ? "granted while giving up (GiveUpTicket)" : "after waiting")
                    : "at once")
       << " after " << x.restarts << " restart(s): ticket word 0x" << std::hex << x.ticket_word
       << std::dec << " (maxX " << w.max_x << " maxS " << w.max_s << " nX " << w.n_x << " nS "
       << w.n_s << "), generation " << x.generation << ", token 0x" << std::hex << x.token
       << std::dec << ", lease_start " << us(x.lease_start) << " us, lease_end "
       << us(x.lease_start + lease) << " us, Acquire returned " << us(x.returned)
       << " us, observed under sh.mu " << us(x.observed) << " us";
    return os.str();
  };
  auto worker = [&](int id) {
    std::mt19937_64 rng(testing::MixSeed(static_cast<uint64_t>(id) * 1000003u + 12345u, seed));
    auto chance = [&](double p_) { return std::uniform_real_distribution<>(0, 1)(rng) < p_; };
    auto make_channel = [&] {
      auto mem = std::make_unique<InProcessMemory>(&table);
      mem->set_min_round_trip(std::chrono::microseconds(20));  // poll at an RDMA NIC's cadence
      // A pause before an operation models a stalled process (or a delayed operation): the
      // operation lands after it, whatever the engine checked before posting it.
      mem->set_hook([&](const RemoteOp&) {
        if (chance(0.00003)) {
          tot.pauses++;
          std::this_thread::sleep_for(std::chrono::microseconds(
              std::uniform_int_distribution<int>(0, 2500 * 20)(rng)));  // up to 2.5 leases
        }
        if (chance(0.00002)) {
          tot.crashes++;
          return false;  // the client dies here; this operation never lands
        }
        return true;
      });
      return mem;
    };
    RecordSpace& space = spaces[static_cast<size_t>(id)];
    uint64_t incarnation = 0;
    const auto record_base = [&] {
      return (static_cast<uint64_t>(id) * kRecordsPerThread + incarnation % kRecordsPerThread) *
             proto::kSessionRecordSize;
    };
    space.Reset(record_base());
    auto mem = make_channel();
    if (records && incarnation >= kRecordsPerThread) FAIL("out of records");
    // The client died (its channel is broken: nothing more of it lands). With records, lockd
    // frees what its record shows; a new client process takes over with a record of its own.
    auto died = [&] {
      if (records) {
        {
          Fence& f = *fences[space.base() / proto::kSessionRecordSize];
          std::unique_lock lk(f.mu);  // waits out any operation of ours in flight
          f.dead = true;
        }
        fast.Take(space.base());
        ++incarnation;
        space.Reset(record_base());
      }
      mem = make_channel();
    };
    uint64_t serial = 0;
    // Half the releases are posted without waiting (StartRelease) and reaped by the next
    // acquire, as the SDK does.
    PendingRelease pending;
    for (int i = 0; i < ops; ++i) {
      const uint64_t slot = rng() % kSlots;
      const Mode mode = chance(0.35) ? Mode::kExclusive : Mode::kShared;
      AcquireOptions o;
      o.want_token = mode == Mode::kExclusive;
      if (chance(0.3)) o.deadline = Clock::now() + std::chrono::microseconds(rng() % 40000);
      if (records) {
        std::tie(o.record, o.record_seq) = space.Take();
        if (o.record == 0) FAIL("out of record entries");
      }
      o.pending = &pending;
      EngineEvents ev;
      auto g = engine.Acquire(*mem, slot, mode, o, &ev);
      if (!g.ok()) {
        if (g.status().code() == ErrorCode::kConnection) {
          pending.active = false;  // the channel is gone, and what it posted with it
          died();
        } else if (g.status().code() == ErrorCode::kTimeout) {
          tot.timeouts++;
        } else {
          tot.errors++;
        }
        continue;
      }
      tot.grants++;
      const auto returned = Clock::now();  // Acquire returned
      const uint64_t me = ++serial;
      SlotShadow& sh = shadow[slot];
      {
        std::lock_guard lk(sh.mu);
        // The clock is read under sh.mu, not before taking it: the shadow's holders and
        // last_token are in the order threads take sh.mu, so a grant must be judged lease-valid
        // at a time inside that order. Then a grant valid at `observed` was granted before any
        // later holder of the lock (that one needs our release, which comes after this block,
        // or a stall recovery, which comes at least a lease after our lease ended; fast recovery
        // frees only dead clients), so that holder takes sh.mu after us. Read before sh.mu, a
        // thread descheduled between the clock and the lock for over F x L checked its grant, valid
        // when it read the clock, against tokens of grants made after its lease ran out and the
        // lock was recovered past it: a false token violation, in every run with a 60 ms pause
        // there, and the likely cause of one failure on a loaded host.
        const auto observed = Clock::now();
        std::erase_if(sh.holders, [&](const Holder& h) { return h.lease_end <= observed; });
        // The invariant is about lease-valid holders: a grant whose lease already ran out by the
        // time this thread looked (it was descheduled or paused) may legitimately have been
        // recovered past, so it is neither checked nor recorded.
        if (engine.LeaseValid(*g, observed)) {
          for (const Holder& h : sh.holders) {
            if (mode == Mode::kExclusive || h.mode == Mode::kExclusive) tot.violations++;
          }
          if (mode == Mode::kExclusive) {
            ExclusiveGrant x;
            x.thread = id;
            x.serial = me;
            x.ticket_word = g->ticket.word.Encode();
            x.generation = g->generation;
            x.token = g->token;
            x.lease_start = g->lease_start;
            x.observed = observed;
            x.returned = returned;
            x.restarts = ev.restarts.get();
            x.waited = ev.waits.get() > 0;
            x.gave_up = returned >= o.deadline;
            if (g->token <= sh.last_token) {
              tot.token_violations++;
              std::lock_guard rl(tot.report_mu);
              tot.report += "token violation on slot " + std::to_string(slot) + ":\n  earlier " +
                            describe(sh.last) + "\n  this    " + describe(x) + "\n";
            }
            sh.last_token = g->token;
            sh.last = x;
          }
          sh.holders.push_back({id, me, mode, g->lease_start + lease});
        }
      }
      // Hold: maybe renew; maybe crash while holding.
      const int renewals = chance(0.002) ? 1 + static_cast<int>(rng() % 3) : 0;
      bool alive = true;
      for (int r = 0; r < renewals && alive; ++r) {
        std::this_thread::sleep_for(lease / 4);
        Status st = engine.FinishRelease(*mem, &pending);
        if (st.code() == ErrorCode::kLockLost) st = Status::Ok();  // an earlier lock's
        if (st.ok()) st = engine.Renew(*mem, *g);
        if (st.ok()) {
          tot.renewals++;
          std::lock_guard lk(sh.mu);
          for (Holder& h : sh.holders) {
            if (h.thread == id && h.serial == me) h.lease_end = g->lease_start + lease;
          }
        } else if (st.code() == ErrorCode::kConnection) {
          alive = false;
        } else {
          tot.lost++;
          break;
        }
      }
      if (alive && chance(0.0002)) {
        tot.crashes++;
        alive = false;  // dies holding the lock: never releases
      }
      if (!alive) {
        pending.active = false;
        if (records) {  // a dead process no longer uses the resource; lockd may free it at once
          std::lock_guard lk(sh.mu);
          std::erase_if(sh.holders,
                        [&](const Holder& h) { return h.thread == id && h.serial == me; });
        }
        died();
        continue;
      }
      {
        std::lock_guard lk(sh.mu);  // leave the shadow before the release can land
        std::erase_if(sh.holders,
                      [&](const Holder& h) { return h.thread == id && h.serial == me; });
      }
      Status st;
      if (chance(0.5)) {
        st = engine.StartRelease(*mem, *g, &pending);
        if (st.ok() && chance(0.1)) st = engine.FinishRelease(*mem, &pending);
        if (st.ok()) tot.posted++;
      } else {
        st = engine.FinishRelease(*mem, &pending);
        if (st.ok()) st = engine.Release(*mem, *g);
      }
      if (st.code() == ErrorCode::kConnection) {
        pending.active = false;
        died();
      } else if (st.code() == ErrorCode::kLockLost) {
        tot.lost++;
      } else if (!st.ok()) {
        tot.errors++;
      }
    }
    if (const Status st = engine.FinishRelease(*mem, &pending);
        !st.ok() && st.code() != ErrorCode::kConnection && st.code() != ErrorCode::kLockLost) {
      tot.errors++;
    }
  };

  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  reaper.reset();
  const uint64_t fast_released = fast.released();

  INFO("grants " << tot.grants << ", crashes " << tot.crashes << ", pauses " << tot.pauses
                 << ", timeouts " << tot.timeouts << ", lost " << tot.lost << ", renewals "
                 << tot.renewals << ", errors " << tot.errors);
  WARN("stress" << (records ? " (records, fast recovery)" : "") << ": " << threads << " threads x "
                << ops << " ops: grants " << tot.grants << ", crashes " << tot.crashes
                << ", pauses " << tot.pauses << ", timeouts " << tot.timeouts << ", lost "
                << tot.lost << ", renewals " << tot.renewals << ", posted releases " << tot.posted
                << ", freed by fast recovery " << fast_released);
  if (!tot.report.empty()) WARN(tot.report);
  REQUIRE(tot.violations == 0);
  REQUIRE(tot.token_violations == 0);
  REQUIRE(tot.errors == 0);
  REQUIRE(tot.grants > static_cast<uint64_t>(threads) * ops / 2);
  REQUIRE(tot.crashes > 0);
  REQUIRE(tot.pauses > 0);
  REQUIRE(tot.posted > 0);
  if (records) REQUIRE(fast_released > 0);
}

}  // namespace

TEST_CASE("randomized stress: crashes, pauses and renewals never give two lease-valid holders") {
  Stress(false);
}

TEST_CASE("randomized stress with request records: lockd's fast recovery of crashed clients") {
  Stress(true);
}
