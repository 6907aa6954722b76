// rdma_bare_lock: the bare verbs ticket lock the performance suite judges rdmalock against (issue
// 19, item 1). It is rdmalock's lock word and nothing else: the "1.0" of every ratio to "bare" in
// deploy/perf/run-perf.sh's table. Not installed; a benchmark tool, not a lock service.
//
//   rdma_bare_lock server [--address A] [--port P] [--locks N]
//   rdma_bare_lock client --server IP [--port P] [--threads T] [--locks N] [--duration S]
//                         [--warmup S] [--hold-us H] [--json] [--entry-write none|after|fenced]
//
// The server registers one memory region of N 16-byte slots laid out as lockd's lock table
// (proto/rdmalock/proto/layout.h, SlotOffset; no info page, no probe slot, no session records),
// zeroed, and accepts every rdma_cm connection, giving the region's address, rkey and slot count in
// the accept's private data. It never posts a work request: the clients' one-sided operations are
// all there is. No authentication, no sessions, no leases, no recovery.
//
// The client runs --threads threads, each on its own RC connection (one QP per thread, as DSLR
// does), in a closed loop like `lockctl bench`: draw a slot uniformly, acquire it exclusively, hold
// --hold-us, release. The word is rdmalock's (proto/rdmalock/proto/lock_word.h):
//   acquire: one FETCH_AND_ADD of AcquireIncrement(kExclusive) on word0, signalled and waited for.
//            Granted(prev, prev) means granted at once. Otherwise the thread polls word0 with RDMA
//            READ until Granted(now, ticket), as DSLR polls: with k requests ahead (Ahead) it
//            sleeps k - 1 estimated handovers before the next READ; the next in line READs back
//            to back, one READ per round trip (BareLock::Acquire says why not all of them).
//   release: one FETCH_AND_ADD of ReleaseIncrement(kExclusive) on word0 (nX += 1, DSLR's release),
//            posted and not waited for. It is unsignalled unless kMaxPostedUnsignalled posts are
//            outstanding; the next signalled operation's completion retires it (RC completes in
//            order), and a failed one shows as an error completion on the next wait.
// --entry-write (not run by run-perf.sh; issue 19's question whether a record entry's WRITE is
// cheaper fenced in the FA's doorbell than posted after it) adds, to each acquire's FA, a 16-byte
// WRITE to a slot no key draws (the last slots of the table, one per thread): `after` posts it
// once the FA has returned, as the SDK posts its entry; `fenced` posts it with the FA in one
// doorbell, IBV_SEND_FENCE, gathering the FA's result from the buffer the FA wrote.
// The one thing beyond that is the counters' wrap-around, without which a run on one lock breaks
// after 65,536 acquisitions (maxX would carry into nS). As in DSLR and in rdmalock's protocol, a
// word whose maxX reached kCountMax is frozen: an acquire that draws such a ticket polls (READ)
// until the word thaws and queues again. The holder of the last ticket admitted (kCountMax - 1)
// releases by COMPARE_AND_SWAP of the word to 0 instead, retried with the value the CAS returned
// until it takes; it waits for that. Once in 32,768 acquisitions of a lock; counted in the ops.
// Exclusive only; no byte-order probe (rdma_rxe and the NICs rdmalock has run on return atomic
// results in host order; the SDK checks, this tool does not).
//
// Waiting for a completion spins on the CQ and, after 64 empty polls, yields between polls: the
// SDK's own wait (engine/verbs_memory.cc, WaitFor), so the two compare on the same footing on a
// software NIC whose work shares the CPUs with the spinners.
//
// --json prints one object with the keys of `lockctl --json bench` for the figures it has
// (client/lockctl/bench/report.cc): acquire_us, release_us, pair_us (p50/p90/p99/p999/max),
// pairs_per_s, rdma_ops_per_pair, pair_hist_us, pair_quantiles_us and the rest, so that
// run-perf.sh reads both alike; and a few of its own (reads_per_pair, bounced_acquires,
// word_resets).
//
// Threading: the server is one thread. The client's main thread starts the workers and owns the
// run's flags (Shared: atomics only); each worker owns its Conn and writes only its ThreadResult,
// which the main thread reads after joining it. Nothing here takes a lock.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/rdma/verbs.h"
#include "engine/budgets.h"
#include "rdmalock/proto/layout.h"
#include "rdmalock/proto/lock_word.h"
#include "rdmalock/proto/wire.h"

namespace bare {
namespace {

using rdmalock::Error;
using rdmalock::ErrorCode;
using rdmalock::Result;
using rdmalock::Status;
namespace proto = rdmalock::proto;
namespace rdma = rdmalock::rdma;
using Clock = std::chrono::steady_clock;
using std::chrono::duration_cast;
using std::chrono::nanoseconds;

// The accept's private data: magic, the table's address, its rkey, its slot count.
constexpr uint64_t kMagic = 0x6b636f6c65726162ull;  // "barelock" read little-endian
constexpr size_t kAcceptBytes = 32;
struct TableDesc {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint64_t slots = 0;
};
std::vector<uint8_t> EncodeDesc(const TableDesc& d) {
  std::vector<uint8_t> b(kAcceptBytes, 0);
  proto::PutLe(b, 0, kMagic, 8);
  proto::PutLe(b, 8, d.addr, 8);
  proto::PutLe(b, 16, d.rkey, 4);
  proto::PutLe(b, 24, d.slots, 8);
  return b;
}
bool DecodeDesc(std::span<const uint8_t> b, TableDesc* d) {
  if (b.size() < kAcceptBytes || proto::GetLe(b, 0, 8) != kMagic) return false;
  d->addr = proto::GetLe(b, 8, 8);
  d->rkey = static_cast<uint32_t>(proto::GetLe(b, 16, 4));
  d->slots = proto::GetLe(b, 24, 8);
  return d->slots > 0;
}

// ---- server

// Zeroed anonymous memory for the table (mmap gives zero pages, page-aligned).
class Mapping {
 public:
  explicit Mapping(size_t len) : len_((len + 4095) / 4096 * 4096) {
    void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    addr_ = p == MAP_FAILED ? nullptr : p;
  }
  ~Mapping() {
    if (addr_ != nullptr) munmap(addr_, len_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* data() const { return addr_; }
  size_t size() const { return len_; }

 private:
  size_t len_;
  void* addr_ = nullptr;
};

struct ServerOptions {
  std::string address = "0.0.0.0";
  uint16_t port = 7480;
  uint64_t locks = 65536;  // lockd's default lock_count
};

// Members in the teardown order of common/rdma/verbs.h, reversed: the connections' ids and QPs go
// first, then the listener, the MR, the CQ, the PD, the channel, and the memory last.
struct Server {
  std::unique_ptr<Mapping> table;
  rdma::EventChannel channel;
  ibv_context* ctx = nullptr;  // the device of the first connection (the table's MR is on it)
  rdma::QpSizes sizes;
  rdma::ProtectionDomain pd;
  rdma::CompletionQueue cq;  // the QPs need one; nothing is ever posted on the server's side
  rdma::MemoryRegion mr;
  rdma::CmId listener;
  std::vector<rdma::CmId> conns;
  uint64_t slots = 0;

  // The PD, CQ and MR, on the device the first request arrived on.
  Status OpenDevice(ibv_context* c) {
    RDMALOCK_ASSIGN_OR_RETURN(sizes, rdma::DeviceQpSizes(c, 1));
    RDMALOCK_ASSIGN_OR_RETURN(pd, rdma::AllocPd(c));
    RDMALOCK_ASSIGN_OR_RETURN(cq, rdma::CreateCq(c, 16));
    RDMALOCK_ASSIGN_OR_RETURN(
        mr, rdma::RegisterMr(pd.get(), table->data(), proto::SlotOffset(slots),
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC));
    ctx = c;
    std::fprintf(stderr, "rdma_bare_lock server: table of %llu slots registered on %s\n",
                 static_cast<unsigned long long>(slots), rdma::DeviceName(c).c_str());
    return Status::Ok();
  }

  Status AcceptOne(rdma_cm_event* ev) {
    rdma_cm_id* id = ev->id;
    if (ctx == nullptr) RDMALOCK_RETURN_IF_ERROR(OpenDevice(id->verbs));
    if (id->verbs != ctx) {
      return Error(ErrorCode::kUnsupported,
                   "a request on a second RDMA device: the table is "
                   "registered on the first only");
    }
    rdma::QpSizes q{1, 1, sizes.rd_atomic, 0};
    RDMALOCK_RETURN_IF_ERROR(rdma::CreateRcQp(id, pd.get(), cq.get(), &q));
    const auto data = EncodeDesc({reinterpret_cast<uint64_t>(table->data()), mr->rkey, slots});
    rdma_conn_param param{};
    param.private_data = data.data();
    param.private_data_len = static_cast<uint8_t>(data.size());
    param.responder_resources =
        static_cast<uint8_t>(std::min<uint32_t>(sizes.rd_atomic, ev->param.conn.initiator_depth));
    param.initiator_depth = static_cast<uint8_t>(
        std::min<uint32_t>(sizes.rd_atomic, ev->param.conn.responder_resources));
    param.retry_count = 7;
    param.rnr_retry_count = 7;
    return rdma::Accept(id, &param);
  }

  void OnEvent(rdma::CmEvent ev) {
    switch (ev->event) {
      case RDMA_CM_EVENT_CONNECT_REQUEST: {
        rdma::CmId owned(ev->id);  // a request's id is ours to destroy, after its event's ack
        const Status st = AcceptOne(ev.get());
        if (!st.ok()) {
          std::fprintf(stderr, "rdma_bare_lock server: refusing a connection: %s\n",
                       st.ToString().c_str());
          (void)rdma::Reject(owned.get(), {});
        }
        ev.reset();
        if (st.ok()) conns.push_back(std::move(owned));
        return;
      }
      case RDMA_CM_EVENT_DISCONNECTED: {
        rdma_cm_id* id = ev->id;
        ev.reset();
        std::erase_if(conns, [id](const rdma::CmId& c) { return c.get() == id; });
        return;
      }
      default:
        return;
    }
  }
};

int RunServer(const ServerOptions& o) {
  if (o.locks < 1 || o.locks > proto::kMaxLockCount) {
    std::fprintf(stderr, "rdma_bare_lock server: --locks must be in [1, %llu]\n",
                 static_cast<unsigned long long>(proto::kMaxLockCount));
    return 2;
  }
  // SIGTERM and SIGINT arrive on a signalfd, so the loop ends and every object is torn down in
  // order (no handler, no global flag).
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  if (sigprocmask(SIG_BLOCK, &mask, nullptr) != 0) return 1;
  rdma::Fd sig(signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!sig) {
    std::perror("rdma_bare_lock server: signalfd");
    return 1;
  }
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "rdma_bare_lock server: %s\n", st.ToString().c_str());
    return 1;
  };
  Server s;
  s.slots = o.locks;
  s.table = std::make_unique<Mapping>(proto::SlotOffset(o.locks));
  if (s.table->data() == nullptr) return fail(Error(ErrorCode::kResource, "mmap of the table"));
  auto ch = rdma::CreateEventChannel();
  if (!ch.ok()) return fail(ch.status());
  s.channel = std::move(ch).value();
  if (Status st = rdma::SetNonBlocking(s.channel->fd, "the event channel"); !st.ok()) {
    return fail(st);
  }
  auto id = rdma::CreateId(s.channel.get(), nullptr);
  if (!id.ok()) return fail(id.status());
  s.listener = std::move(id).value();
  auto addr = rdma::ResolveAddress(o.address == "0.0.0.0" ? "" : o.address, o.port, true);
  if (!addr.ok()) return fail(addr.status());
  if (o.address == "0.0.0.0") {
    auto* in = reinterpret_cast<sockaddr_in*>(addr->get());
    in->sin_family = AF_INET;
    in->sin_addr.s_addr = htonl(INADDR_ANY);
    in->sin_port = htons(o.port);
  }
  const std::string where = o.address + ":" + std::to_string(o.port);
  if (Status st = rdma::Listen(s.listener.get(), addr->get(), 128, where); !st.ok()) {
    return fail(st);
  }
  std::fprintf(stderr, "rdma_bare_lock server: listening on %s, %llu slots\n", where.c_str(),
               static_cast<unsigned long long>(o.locks));
  for (;;) {
    pollfd fds[2] = {{s.channel->fd, POLLIN, 0}, {sig.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      std::perror("rdma_bare_lock server: poll");
      return 1;
    }
    if (fds[1].revents != 0) break;
    for (;;) {
      auto ev = rdma::TryGetEvent(s.channel.get());
      if (!ev.ok()) return fail(ev.status());
      if (!*ev) break;
      s.OnEvent(std::move(ev).value());
    }
  }
  std::fprintf(stderr, "rdma_bare_lock server: stopping (%zu connections)\n", s.conns.size());
  return 0;
}

// ---- client

struct ClientOptions {
  std::string server;
  uint16_t port = 7480;
  int threads = 1;
  uint64_t locks = 10000;
  double duration_s = 5.0;
  double warmup_s = 0.5;
  int hold_us = 0;
  bool json = false;
  std::string entry_write = "none";  // none | after | fenced
};

constexpr size_t kMaxPosted = rdmalock::budget::kMaxPostedUnsignalled;
constexpr auto kCompletionTimeout = std::chrono::seconds(5);
// An acquire not granted within this long means a lock left held (a client that died in an
// earlier run): the thread reports an error instead of waiting for ever.
constexpr auto kGrantTimeout = std::chrono::seconds(30);

// One thread's connection: its QP, a small registered buffer for the operations' results, and the
// table's address. Owned and used by one worker thread.
class Conn {
 public:
  ~Conn() {
    if (conn_ && conn_->id) (void)conn_->id.FenceQp();  // nothing executes while we tear down
    mr_.reset();                                        // before the connection's PD
  }

  Status Connect(const ClientOptions& o) {
    std::vector<uint8_t> reject;
    RDMALOCK_ASSIGN_OR_RETURN(conn_,
                              rdma::ConnectRc(o.server, o.port, {}, std::chrono::seconds(5),
                                              rdmalock::budget::kSendQueueDepth, 8, &reject));
    if (!DecodeDesc(conn_->accept_data, &table_)) {
      return Error(ErrorCode::kProtocol, "the server's accept is not a bare lock's");
    }
    if (o.locks > table_.slots) {
      return Error(ErrorCode::kInvalidArgument, "--locks " + std::to_string(o.locks) +
                                                    " is more than the server's " +
                                                    std::to_string(table_.slots) + " slots");
    }
    if (o.entry_write != "none" && o.locks + static_cast<uint64_t>(o.threads) > table_.slots) {
      return Error(ErrorCode::kInvalidArgument,
                   "--entry-write needs a slot no key draws for each thread: --locks " +
                       std::to_string(o.locks) + " + --threads " + std::to_string(o.threads) +
                       " is more than the server's " + std::to_string(table_.slots) + " slots");
    }
    RDMALOCK_ASSIGN_OR_RETURN(
        mr_, rdma::RegisterMr(conn_->pd.get(), buf_.data(), sizeof(buf_), IBV_ACCESS_LOCAL_WRITE));
    qp_ = conn_->id->qp;
    cq_ = conn_->cq.get();
    return Status::Ok();
  }

  // The three one-sided operations, waited for; each counts one op.
  Status FetchAdd(uint64_t slot, uint64_t add, uint64_t* prev) {
    ibv_send_wr wr = Atomic(kFaBuf, IBV_WR_ATOMIC_FETCH_AND_ADD, slot, add, 0);
    RDMALOCK_RETURN_IF_ERROR(PostAndWait(wr));
    *prev = buf_[kFaBuf];
    return Status::Ok();
  }
  Status CompareSwap(uint64_t slot, uint64_t expect, uint64_t swap, uint64_t* prev) {
    ibv_send_wr wr = Atomic(kCasBuf, IBV_WR_ATOMIC_CMP_AND_SWP, slot, expect, swap);
    RDMALOCK_RETURN_IF_ERROR(PostAndWait(wr));
    *prev = buf_[kCasBuf];
    return Status::Ok();
  }
  Status Read(uint64_t slot, uint64_t* word0) {
    ibv_sge sge{reinterpret_cast<uint64_t>(&buf_[kReadBuf]), 8, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.wr.rdma = {table_.addr + proto::SlotOffset(slot) + proto::kWord0Offset, table_.rkey};
    // sg_list points at this frame's sge: post and wait here.
    RDMALOCK_RETURN_IF_ERROR(PostAndWait(wr));
    *word0 = buf_[kReadBuf];
    return Status::Ok();
  }
  // The posted FETCH_AND_ADD: not waited for. Its result lands in a buffer nobody reads.
  Status PostFetchAdd(uint64_t slot, uint64_t add) {
    ibv_sge sge{};
    ibv_send_wr wr = Atomic(kPostBuf, IBV_WR_ATOMIC_FETCH_AND_ADD, slot, add, 0, &sge);
    wr.wr_id = next_wr_id_++;
    // Past kMaxPostedUnsignalled unretired posts, this one asks for a completion, so the send
    // queue cannot fill with WRs nobody retires; the next wait reaps it.
    if (++unretired_ >= kMaxPosted) wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
      return rdma::ErrnoStatus(ErrorCode::kConnection, "ibv_post_send", rc);
    }
    return Status::Ok();
  }
  // --entry-write: the FA and a 16-byte WRITE (a record entry's size: a word of ours and the
  // FA's result) to `scratch`, a slot no key draws. `fenced`: the WRITE goes in the FA's
  // doorbell with IBV_SEND_FENCE, so it executes once the FA has completed, and gathers the FA's
  // result from the buffer the FA wrote (one post). Otherwise it is posted once the FA has
  // returned, as rdmalock's entry is (two posts). Each counts one op; the WRITE is not waited for.
  Status FetchAddEntry(uint64_t slot, uint64_t add, uint64_t scratch, bool fenced, uint64_t* prev) {
    buf_[kEntryBuf] = slot;
    ibv_send_wr fa = Atomic(kEntryBuf + 1, IBV_WR_ATOMIC_FETCH_AND_ADD, slot, add, 0);
    ibv_sge wsge{reinterpret_cast<uint64_t>(&buf_[kEntryBuf]), 16, mr_->lkey};
    ibv_send_wr w{};
    w.sg_list = &wsge;
    w.num_sge = 1;
    w.opcode = IBV_WR_RDMA_WRITE;
    w.wr.rdma = {table_.addr + proto::SlotOffset(scratch), table_.rkey};
    w.wr_id = next_wr_id_++;
    if (fenced) {
      w.send_flags = IBV_SEND_FENCE;
      fa.next = &w;
      // fa and w point at this frame's sges: post and wait here. The FA's completion does not
      // cover the WRITE behind it: one unretired post.
      RDMALOCK_RETURN_IF_ERROR(PostAndWait(fa));
      *prev = buf_[kEntryBuf + 1];
      unretired_ = 1;
      return Status::Ok();
    }
    RDMALOCK_RETURN_IF_ERROR(PostAndWait(fa));
    *prev = buf_[kEntryBuf + 1];
    if (++unretired_ >= kMaxPosted) w.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(qp_, &w, &bad); rc != 0) {
      return rdma::ErrnoStatus(ErrorCode::kConnection, "ibv_post_send", rc);
    }
    return Status::Ok();
  }
  uint64_t slots() const { return table_.slots; }

  // Waits until everything posted has executed (one signalled READ behind it).
  Status Flush() {
    if (unretired_ == 0) return Status::Ok();
    uint64_t ignored = 0;
    return Read(0, &ignored);
  }

 private:
  enum : size_t { kFaBuf = 0, kReadBuf = 1, kCasBuf = 2, kPostBuf = 3, kEntryBuf = 4 };

  ibv_send_wr Atomic(size_t b, ibv_wr_opcode op, uint64_t slot, uint64_t operand, uint64_t swap,
                     ibv_sge* sge = nullptr) {
    ibv_sge& s = sge != nullptr ? *sge : sge_;
    s = {reinterpret_cast<uint64_t>(&buf_[b]), 8, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.wr.atomic = {table_.addr + proto::SlotOffset(slot) + proto::kWord0Offset, operand, swap,
                    table_.rkey};
    return wr;
  }

  // Posts `wr` signalled and polls the CQ until it completes. Earlier signalled posts complete on
  // the way (RC completes in order) and are dropped; an error completion ends the run.
  Status PostAndWait(ibv_send_wr& wr) {
    wr.wr_id = next_wr_id_++;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (const int rc = ibv_post_send(qp_, &wr, &bad); rc != 0) {
      return rdma::ErrnoStatus(ErrorCode::kConnection, "ibv_post_send", rc);
    }
    // As the SDK's WaitFor: the 5 s start once the CQ comes up empty past the spins, so a
    // completion that is there costs no clock reading.
    Clock::time_point deadline{};
    for (uint32_t spins = 0;; ++spins) {
      ibv_wc wc[4];
      const int got = ibv_poll_cq(cq_, 4, wc);
      if (got < 0) return Error(ErrorCode::kConnection, "ibv_poll_cq failed");
      for (int i = 0; i < got; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          return Error(ErrorCode::kConnection,
                       std::string("RDMA operation failed: ") + ibv_wc_status_str(wc[i].status));
        }
        if (wc[i].wr_id == wr.wr_id) {
          unretired_ = 0;  // everything posted before it has executed too
          return Status::Ok();
        }
      }
      if (got == 0 && spins > 64) {
        if (deadline == Clock::time_point{}) {
          deadline = Clock::now() + kCompletionTimeout;
        } else if (Clock::now() > deadline) {
          return Error(ErrorCode::kTimeout, "no completion in 5 s");
        }
        std::this_thread::yield();
      }
    }
  }

  alignas(64) std::array<uint64_t, 8> buf_{};
  ibv_sge sge_{};
  std::unique_ptr<rdma::ActiveConnection> conn_;
  rdma::MemoryRegion mr_;
  ibv_qp* qp_ = nullptr;
  ibv_cq* cq_ = nullptr;
  TableDesc table_;
  uint64_t next_wr_id_ = 1;
  size_t unretired_ = 0;  // posts (unsignalled or not yet reaped) since the last completion seen
};

// What one acquire-release pair cost, in operations.
struct PairOps {
  uint64_t ops = 0, reads = 0, bounces = 0, resets = 0;
};

// The lock itself: acquire and release of slot `slot`, exclusive.
class BareLock {
 public:
  enum class EntryWrite { kNone, kAfter, kFenced };  // --entry-write
  BareLock(Conn* c, EntryWrite entry, uint64_t scratch) : c_(c), entry_(entry), scratch_(scratch) {}

  // `t0`: when the caller started the acquire (it reads the clock anyway, for the latency).
  Status Acquire(uint64_t slot, Clock::time_point t0, PairOps* n) {
    const Clock::time_point deadline = t0 + kGrantTimeout;
    for (;;) {
      uint64_t prev = 0;
      if (entry_ == EntryWrite::kNone) {
        RDMALOCK_RETURN_IF_ERROR(
            c_->FetchAdd(slot, proto::AcquireIncrement(proto::Mode::kExclusive), &prev));
      } else {
        RDMALOCK_RETURN_IF_ERROR(c_->FetchAddEntry(slot,
                                                   proto::AcquireIncrement(proto::Mode::kExclusive),
                                                   scratch_, entry_ == EntryWrite::kFenced, &prev));
        ++n->ops;
      }
      ++n->ops;
      ticket_ = proto::Word0::Decode(prev);
      if (!ticket_.Frozen()) break;
      // A frozen word: this ticket is void. Poll until the last holder's reset thaws it.
      ++n->bounces;
      for (;;) {
        uint64_t now = 0;
        RDMALOCK_RETURN_IF_ERROR(c_->Read(slot, &now));
        ++n->ops;
        ++n->reads;
        if (!proto::Word0::Decode(now).Frozen()) break;
        if (Clock::now() > deadline) return Error(ErrorCode::kTimeout, "the word stays frozen");
      }
    }
    if (proto::Granted(ticket_, ticket_, proto::Mode::kExclusive)) return Status::Ok();
    // Waiting: DSLR's polling. A waiter with k requests ahead sleeps k - 1 handovers before its
    // next READ; the next in line READs back to back. A handover (hold 0) is estimated at two of
    // this thread's round trips, the holder's release FA and the READ that sees it, from the FA
    // just made. Without the sleeps, waiters that all spin on rdma_rxe starve the CPUs the
    // software NIC and the holder need (4 threads on one lock: 79 pairs/s, 182 READs per
    // acquisition; 8 threads: waits past 10 s).
    const Clock::duration handover = 2 * (Clock::now() - t0);
    proto::Word0 now = ticket_;
    for (;;) {
      const uint32_t ahead = proto::Ahead(now, ticket_, proto::Mode::kExclusive);
      if (ahead > 1) std::this_thread::sleep_for(handover * (ahead - 1));
      uint64_t word0 = 0;
      RDMALOCK_RETURN_IF_ERROR(c_->Read(slot, &word0));
      ++n->ops;
      ++n->reads;
      now = proto::Word0::Decode(word0);
      if (proto::Granted(now, ticket_, proto::Mode::kExclusive)) return Status::Ok();
      if (Clock::now() > deadline) {
        return Error(ErrorCode::kTimeout, "not granted within 30 s (a lock left held?)");
      }
    }
  }

  Status Release(uint64_t slot, PairOps* n) {
    if (ticket_.max_x != proto::kCountMax - 1) {
      ++n->ops;
      return c_->PostFetchAdd(slot, proto::ReleaseIncrement(proto::Mode::kExclusive));
    }
    // The last ticket admitted: every earlier one has released, every later one bounced. Reset
    // the word to 0 (released, thawed), whatever the bounced tickets added to maxX meanwhile.
    ++n->resets;
    proto::Word0 expect;
    expect.max_x = proto::kCountMax;
    expect.n_x = proto::kCountMax - 1;
    uint64_t want = expect.Encode();
    for (;;) {
      uint64_t prev = 0;
      RDMALOCK_RETURN_IF_ERROR(c_->CompareSwap(slot, want, 0, &prev));
      ++n->ops;
      if (prev == want) return Status::Ok();
      const proto::Word0 seen = proto::Word0::Decode(prev);
      if (seen.n_x != proto::kCountMax - 1 || seen.max_x < proto::kCountMax) {
        return Error(ErrorCode::kInternal, "the word changed under its holder");
      }
      want = prev;
    }
  }

 private:
  Conn* c_;
  EntryWrite entry_;
  uint64_t scratch_;  // --entry-write's target: a slot no key draws
  proto::Word0 ticket_;
};

struct ThreadResult {
  std::vector<uint32_t> acquire, release, pair;  // ns, capped at 2^32 - 1
  PairOps ops;                                   // over the measured pairs
  uint64_t errors = 0;
  std::string first_error;
  void Error(const Status& st) {
    if (errors++ == 0) first_error = st.ToString();
  }
};

struct Shared {
  const ClientOptions* o = nullptr;
  std::atomic<int> connected{0}, failed{0};
  std::atomic<bool> go{false}, measuring{false}, stop{false};
};

uint32_t Ns(Clock::time_point a, Clock::time_point b) {
  const int64_t ns = duration_cast<nanoseconds>(b - a).count();
  return static_cast<uint32_t>(std::clamp<int64_t>(ns, 0, UINT32_MAX));
}

void Hold(int hold_us) {
  if (hold_us <= 0) return;
  const auto until = Clock::now() + std::chrono::microseconds(hold_us);
  while (Clock::now() < until) {
  }
}

void Worker(Shared& sh, int t, ThreadResult& r) {
  const ClientOptions& o = *sh.o;
  Conn conn;
  if (Status st = conn.Connect(o); !st.ok()) {
    r.Error(st);
    sh.failed.fetch_add(1);
    return;
  }
  sh.connected.fetch_add(1);
  while (!sh.go.load()) {
    if (sh.stop.load()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  r.acquire.reserve(1 << 20);
  r.release.reserve(1 << 20);
  r.pair.reserve(1 << 20);
  // lockctl bench's generator and seed for thread t of the first process (its draws differ:
  // bench also draws each request's mode).
  std::mt19937_64 rng(static_cast<uint64_t>(t) * 7919 + 17);
  std::uniform_int_distribution<uint64_t> keys(0, o.locks - 1);
  const auto entry = o.entry_write == "after"    ? BareLock::EntryWrite::kAfter
                     : o.entry_write == "fenced" ? BareLock::EntryWrite::kFenced
                                                 : BareLock::EntryWrite::kNone;
  BareLock lock(&conn, entry, conn.slots() - 1 - static_cast<uint64_t>(t));
  while (!sh.stop.load(std::memory_order_relaxed)) {
    const uint64_t slot = keys(rng);
    PairOps n;
    const auto t0 = Clock::now();
    Status st = lock.Acquire(slot, t0, &n);
    const auto t1 = Clock::now();
    if (!st.ok()) {
      r.Error(st);
      break;  // the connection is gone or the lock is wedged: nothing more to measure here
    }
    Hold(o.hold_us);
    const auto t1r = Clock::now();
    st = lock.Release(slot, &n);
    const auto t2 = Clock::now();
    if (!st.ok()) {
      r.Error(st);
      break;
    }
    if (sh.measuring.load(std::memory_order_relaxed)) {
      r.acquire.push_back(Ns(t0, t1));
      r.release.push_back(Ns(t1r, t2));
      r.pair.push_back(Ns(t0, t2));
      r.ops.ops += n.ops;
      r.ops.reads += n.reads;
      r.ops.bounces += n.bounces;
      r.ops.resets += n.resets;
    }
  }
  // The last release is posted: let it execute before the QP goes.
  if (Status st = conn.Flush(); !st.ok()) r.Error(st);
}

// ---- the report, computed as lockctl bench computes its own (client/lockctl/bench/report.cc)

using Json = nlohmann::ordered_json;

double Fixed(double v, int decimals) {  // lockctl's Fixed: printf's rounding
  char buf[64];
  const int n = std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof(buf)) return v;
  return std::strtod(buf, nullptr);
}

double At(const std::vector<uint32_t>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1,
                            static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5));
  return static_cast<double>(sorted[i]) / 1000.0;
}

Json PctJson(const std::vector<uint32_t>& s) {
  return {{"p50", Fixed(At(s, 0.5), 2)},
          {"p90", Fixed(At(s, 0.9), 2)},
          {"p99", Fixed(At(s, 0.99), 2)},
          {"p999", Fixed(At(s, 0.999), 2)},
          {"max", Fixed(At(s, 1.0), 2)}};
}

Json Log2Histogram(const std::vector<uint32_t>& sorted) {
  Json out = Json::array();
  uint64_t bound_us = 1, count = 0;
  for (const uint32_t ns : sorted) {
    while (ns > bound_us * 1000) {
      if (count > 0) out.push_back({bound_us, count});
      count = 0;
      bound_us *= 2;
    }
    ++count;
  }
  if (count > 0) out.push_back({bound_us, count});
  return out;
}

// The same quantiles as lockctl bench's pair_quantiles_us: 0 (min), every percent, 99.5, 99.9,
// 99.99 and 1 (max).
Json Quantiles(const std::vector<uint32_t>& sorted) {
  Json out = Json::array();
  if (sorted.empty()) return out;
  std::vector<double> qs;
  for (int i = 0; i <= 99; ++i) qs.push_back(i / 100.0);
  for (const double q : {0.995, 0.999, 0.9999, 1.0}) qs.push_back(q);
  for (const double q : qs) out.push_back({Fixed(q, 4), Fixed(At(sorted, q), 2)});
  return out;
}

int RunClient(const ClientOptions& o) {
  if (o.threads < 1 || o.locks < 1 || !(o.duration_s > 0) || !(o.warmup_s >= 0) || o.hold_us < 0) {
    std::fprintf(stderr, "rdma_bare_lock client: bad options\n");
    return 2;
  }
  Shared sh;
  sh.o = &o;
  std::vector<ThreadResult> results(static_cast<size_t>(o.threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < o.threads; ++t) {
    workers.emplace_back([&sh, &results, t] { Worker(sh, t, results[static_cast<size_t>(t)]); });
  }
  // Every thread connects before any starts, as lockctl bench's processes do.
  while (sh.connected.load() + sh.failed.load() < o.threads) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (sh.failed.load() == 0) {
    sh.go.store(true);
    std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_s));
    sh.measuring.store(true);
  }
  const auto start = Clock::now();
  if (sh.failed.load() == 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.duration_s));
  }
  sh.measuring.store(false);
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  sh.stop.store(true);
  for (auto& w : workers) w.join();

  std::vector<uint32_t> acq, rel, pair;
  PairOps ops;
  uint64_t errors = 0;
  std::string first_error;
  for (auto& r : results) {
    acq.insert(acq.end(), r.acquire.begin(), r.acquire.end());
    rel.insert(rel.end(), r.release.begin(), r.release.end());
    pair.insert(pair.end(), r.pair.begin(), r.pair.end());
    ops.ops += r.ops.ops;
    ops.reads += r.ops.reads;
    ops.bounces += r.ops.bounces;
    ops.resets += r.ops.resets;
    errors += r.errors;
    if (first_error.empty()) first_error = r.first_error;
  }
  std::sort(acq.begin(), acq.end());
  std::sort(rel.begin(), rel.end());
  std::sort(pair.begin(), pair.end());
  const uint64_t n = pair.size();
  const double rate = elapsed > 0 ? static_cast<double>(n) / elapsed : 0;
  auto per = [n](uint64_t v) { return n ? static_cast<double>(v) / static_cast<double>(n) : 0.0; };
  if (o.json) {
    const Json out = {{"threads", o.threads},
                      {"locks", o.locks},
                      {"duration_s", Fixed(elapsed, 3)},
                      {"shared_ratio", 0.0},
                      {"token", false},
                      {"acquisitions", n},
                      {"pairs_per_s", Fixed(rate, 1)},
                      {"acquire_us", PctJson(acq)},
                      {"release_us", PctJson(rel)},
                      {"pair_us", PctJson(pair)},
                      {"hold_us", o.hold_us},
                      {"rdma_ops_per_pair", Fixed(per(ops.ops), 3)},
                      {"lock_word_ops_per_pair", Fixed(per(ops.ops), 3)},
                      {"record_writes_per_pair", 0.0},
                      {"errors", errors},
                      {"processes", 1},
                      {"total_threads", o.threads},
                      {"failed_processes", 0},
                      {"keys", "uniform"},
                      {"batch", 1},
                      {"sets_per_s", Fixed(rate, 1)},
                      {"locks_per_s", Fixed(rate, 1)},
                      {"locks_acquired", n},
                      {"rdma_ops_per_set", Fixed(per(ops.ops), 3)},
                      {"rdma_ops_per_lock", Fixed(per(ops.ops), 3)},
                      {"loop", "closed"},
                      {"lock", "bare"},
                      {"reads_per_pair", Fixed(per(ops.reads), 3)},
                      {"bounced_acquires", ops.bounces},
                      {"word_resets", ops.resets},
                      {"pair_hist_us", Log2Histogram(pair)},
                      {"pair_quantiles_us", Quantiles(pair)}};
    std::fputs((out.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n").c_str(), stdout);
  } else {
    std::printf("bare lock: threads=%d locks=%llu duration=%.2fs hold=%dus\n", o.threads,
                static_cast<unsigned long long>(o.locks), elapsed, o.hold_us);
    std::printf("acquisitions:        %llu (%.1f pairs/s)\n", static_cast<unsigned long long>(n),
                rate);
    auto line = [](const char* label, const std::vector<uint32_t>& s) {
      std::printf("%-20s p50 %.2f  p90 %.2f  p99 %.2f  p999 %.2f  max %.2f\n", label, At(s, 0.5),
                  At(s, 0.9), At(s, 0.99), At(s, 0.999), At(s, 1.0));
    };
    line("acquire latency us:", acq);
    line("release latency us:", rel);
    line("pair latency us:", pair);
    std::printf("rdma ops per pair:   %.3f (%.3f READs; %llu bounced acquires, %llu word resets)\n",
                per(ops.ops), per(ops.reads), static_cast<unsigned long long>(ops.bounces),
                static_cast<unsigned long long>(ops.resets));
    std::printf("errors %llu\n", static_cast<unsigned long long>(errors));
  }
  std::fflush(stdout);
  if (errors > 0) {
    std::fprintf(stderr, "rdma_bare_lock client: %llu errors; first: %s\n",
                 static_cast<unsigned long long>(errors), first_error.c_str());
    return 1;
  }
  return n > 0 ? 0 : 1;
}

}  // namespace
}  // namespace bare

int main(int argc, char** argv) {
  CLI::App app{
      "rdma_bare_lock: the bare verbs ticket lock rdmalock's benchmarks are judged against"};
  app.require_subcommand(1);
  bare::ServerOptions so;
  auto* server = app.add_subcommand("server", "serve a zeroed table of lock slots");
  server->add_option("--address", so.address, "address to listen on");
  server->add_option("--port", so.port, "port to listen on");
  server->add_option("--locks", so.locks, "slots in the table");
  bare::ClientOptions co;
  auto* client = app.add_subcommand("client", "run lockctl bench's closed loop on the bare lock");
  client->add_option("--server", co.server, "the server's RDMA address")->required();
  client->add_option("--port", co.port, "the server's port");
  client->add_option("--threads", co.threads, "threads, each on its own connection");
  client->add_option("--locks", co.locks, "slots 0..N-1 the keys are drawn from (uniformly)");
  client->add_option("--duration", co.duration_s, "seconds to measure");
  client->add_option("--warmup", co.warmup_s, "seconds before measuring");
  client->add_option("--hold-us", co.hold_us, "hold each lock this many microseconds");
  client->add_flag("--json", co.json, "one JSON object with lockctl --json bench's keys");
  client
      ->add_option("--entry-write", co.entry_write,
                   "after each FA, WRITE 16 bytes as a record entry: none, after (posted once the "
                   "FA returned) or fenced (in the FA's doorbell, IBV_SEND_FENCE)")
      ->check(CLI::IsMember({"none", "after", "fenced"}));
  CLI11_PARSE(app, argc, argv);
  if (server->parsed()) return bare::RunServer(so);
  return bare::RunClient(co);
}
