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
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "inproc_memory.h"
#include "lock_engine.h"

using namespace rdmalock;
using namespace std::chrono_literals;

namespace {

int EnvInt(const char* name, int def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoi(v) : def;
}

struct Holder {
  int thread;
  uint64_t serial;
  Mode mode;
  Clock::time_point lease_end;
};

struct SlotShadow {
  std::mutex mu;
  std::vector<Holder> holders;
  uint64_t last_token = 0;
};

struct Totals {
  std::atomic<uint64_t> grants{0}, violations{0}, token_violations{0}, crashes{0}, pauses{0},
      timeouts{0}, lost{0}, renewals{0}, errors{0};
};

// Drains abandoned tickets on its own channel, as the SDK's reaper does.
class Reaper {
 public:
  Reaper(InProcessTable* table, const LockEngine* engine) : table_(table), engine_(engine) {
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
    for (;;) {
      Ticket t;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return stop_ || !q_.empty(); });
        if (stop_) return;
        t = q_.front();
        q_.pop_front();
      }
      (void)engine_->Drain(mem, t);
    }
  }
  InProcessTable* table_;
  const LockEngine* engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ticket> q_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

TEST_CASE("randomized stress: crashes, pauses and renewals never give two lease-valid holders") {
  const int threads = EnvInt("RDMALOCK_STRESS_THREADS", 16);
  const int ops = EnvInt("RDMALOCK_STRESS_OPS", 100000);
  constexpr uint64_t kSlots = 64;
  const auto lease = 20ms;
  InProcessTable table(kSlots);
  std::unique_ptr<Reaper> reaper;
  EngineParams p;
  p.lock_count = kSlots;
  p.lease = lease;
  p.stall_factor = 2;
  p.epoch = 3;
  LockEngine engine(p, [&](const Ticket& t) { reaper->Add(t); });
  reaper = std::make_unique<Reaper>(&table, &engine);
  std::vector<SlotShadow> shadow(kSlots);
  Totals tot;

  auto worker = [&](int id) {
    std::mt19937_64 rng(static_cast<uint64_t>(id) * 1000003u + 12345u);
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
    auto mem = make_channel();
    uint64_t serial = 0;
    for (int i = 0; i < ops; ++i) {
      const uint64_t slot = rng() % kSlots;
      const Mode mode = chance(0.35) ? Mode::kExclusive : Mode::kShared;
      AcquireOptions o;
      o.want_token = mode == Mode::kExclusive;
      if (chance(0.3)) o.deadline = Clock::now() + std::chrono::microseconds(rng() % 40000);
      auto g = engine.Acquire(*mem, slot, mode, o);
      if (!g.ok()) {
        if (g.status().code() == ErrorCode::kConnection) {
          mem = make_channel();  // crashed: a new client process takes over
        } else if (g.status().code() == ErrorCode::kTimeout) {
          tot.timeouts++;
        } else {
          tot.errors++;
        }
        continue;
      }
      tot.grants++;
      const auto observed = Clock::now();
      const uint64_t me = ++serial;
      SlotShadow& sh = shadow[slot];
      {
        std::lock_guard lk(sh.mu);
        std::erase_if(sh.holders, [&](const Holder& h) { return h.lease_end <= observed; });
        // The invariant is about lease-valid holders: a grant whose lease already ran out by the
        // time this thread looked (it was descheduled or paused) may legitimately have been
        // recovered past, so it is neither checked nor recorded.
        if (engine.LeaseValid(*g, observed)) {
          for (const Holder& h : sh.holders) {
            if (mode == Mode::kExclusive || h.mode == Mode::kExclusive) tot.violations++;
          }
          if (mode == Mode::kExclusive) {
            if (g->token <= sh.last_token) tot.token_violations++;
            sh.last_token = g->token;
          }
          sh.holders.push_back({id, me, mode, g->lease_start + lease});
        }
      }
      // Hold: maybe renew; maybe crash while holding.
      const int renewals = chance(0.002) ? 1 + static_cast<int>(rng() % 3) : 0;
      bool alive = true;
      for (int r = 0; r < renewals && alive; ++r) {
        std::this_thread::sleep_for(lease / 4);
        const Status st = engine.Renew(*mem, *g);
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
        mem = make_channel();
        continue;
      }
      {
        std::lock_guard lk(sh.mu);  // leave the shadow before the release can land
        std::erase_if(sh.holders,
                      [&](const Holder& h) { return h.thread == id && h.serial == me; });
      }
      const Status st = engine.Release(*mem, *g);
      if (st.code() == ErrorCode::kConnection) {
        mem = make_channel();
      } else if (st.code() == ErrorCode::kLockLost) {
        tot.lost++;
      } else if (!st.ok()) {
        tot.errors++;
      }
    }
  };

  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) ts.emplace_back(worker, t);
  for (auto& t : ts) t.join();
  reaper.reset();

  INFO("grants " << tot.grants << ", crashes " << tot.crashes << ", pauses " << tot.pauses
                 << ", timeouts " << tot.timeouts << ", lost " << tot.lost << ", renewals "
                 << tot.renewals << ", errors " << tot.errors);
  WARN("stress: " << threads << " threads x " << ops << " ops: grants " << tot.grants
                  << ", crashes " << tot.crashes << ", pauses " << tot.pauses << ", timeouts "
                  << tot.timeouts << ", lost " << tot.lost << ", renewals " << tot.renewals);
  REQUIRE(tot.violations == 0);
  REQUIRE(tot.token_violations == 0);
  REQUIRE(tot.errors == 0);
  REQUIRE(tot.grants > static_cast<uint64_t>(threads) * ops / 2);
  REQUIRE(tot.crashes > 0);
  REQUIRE(tot.pauses > 0);
}
