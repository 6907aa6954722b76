#include "server/regions.h"

#include <spdlog/spdlog.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "server/budgets.h"

namespace rdmalock::lockd {

Mapping::~Mapping() {
  if (addr_ != nullptr) munmap(addr_, len_);
}

Result<std::unique_ptr<Mapping>> Mapping::Create(size_t len) {
  const size_t page = 4096;
  len = (len + page - 1) / page * page;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return rdma::ErrnoStatus(ErrorCode::kResource, "mmap of " + std::to_string(len) + " bytes",
                             errno);
  }
  auto m = std::make_unique<Mapping>();
  m->addr_ = p;
  m->len_ = len;
  return m;
}

Regions::~Regions() {
  devices_.clear();      // CQs, completion channels, MRs, PDs
  device_list_.Reset();  // the device contexts
  // then the memory (the members' own destructors), which no MR covers any more
}

Device* Regions::DeviceFor(ibv_context* ctx) const {
  for (auto& d : devices_) {
    if (d->ctx == ctx) return d.get();
  }
  return nullptr;
}

Result<std::unique_ptr<Regions>> Regions::Create(const Config& config,
                                                 const proto::InfoPage& page) {
  std::unique_ptr<Regions> r(new Regions());
  // Memory first, zeroed (mmap gives zero pages) before it is registered.
  RDMALOCK_ASSIGN_OR_RETURN(r->info_, Mapping::Create(proto::kInfoPageSize));
  RDMALOCK_ASSIGN_OR_RETURN(r->locks_, Mapping::Create(proto::LockTableBytes(config.lock_count)));
  // One record per client plus one for lockd's own loopback connection.
  RDMALOCK_ASSIGN_OR_RETURN(r->sessions_, Mapping::Create((uint64_t{config.max_clients} + 1) *
                                                          proto::kSessionRecordSize));
  // The probe word: initialisation, before any NIC can reach the table.
  std::memcpy(r->locks_->data() + proto::ProbeOffset(config.lock_count), &proto::kProbePattern, 8);
  page.EncodeTo(std::span<uint8_t>(r->info_->data(), proto::kInfoPageSize));
  RDMALOCK_RETURN_IF_ERROR(r->OpenDevices(config));
  return r;
}

Status Regions::OpenDevices(const Config& config) {
  device_list_ = rdma::DeviceList::Get();
  if (device_list_.size() == 0) {
    return Error(ErrorCode::kUnsupported,
                 "no RDMA device found (on a host without an RDMA NIC, load Soft-RoCE: "
                 "modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IFACE; see "
                 "deploy/softroce)");
  }
  std::vector<DeviceAtomics> atomics;
  for (int i = 0; i < device_list_.size(); ++i) {
    auto d = std::make_unique<Device>();
    d->ctx = device_list_[i];
    d->name = rdma::DeviceName(d->ctx);
    auto sizes = rdma::DeviceQpSizes(d->ctx, 1);
    if (!sizes.ok()) {
      spdlog::warn("skipping RDMA device {}: {}", d->name, sizes.status().ToString());
      continue;
    }
    d->sizes = *sizes;
    RDMALOCK_RETURN_IF_ERROR(rdma::SetNonBlocking(d->ctx->async_fd, d->name + "'s async fd"));
    RDMALOCK_ASSIGN_OR_RETURN(const ibv_device_attr dattr, rdma::QueryDevice(d->ctx, d->name));
    atomics.push_back({d->name, dattr.atomic_cap == IBV_ATOMIC_GLOB});
    if (config.memory_windows && dattr.max_mw == 0) {
      return Error(
          ErrorCode::kUnsupported,
          "device " + d->name +
              " has no memory windows (max_mw 0): set memory_windows: false in "
              "lockd.yaml (a fenced client's rkeys then stay valid, on any QP, until lockd "
              "exits)");
    }
    {
      const DeviceLimits limits{d->name, static_cast<uint64_t>(std::max(dattr.max_qp, 0)),
                                static_cast<uint64_t>(std::max(dattr.max_mr, 0)),
                                static_cast<uint64_t>(std::max(dattr.max_mw, 0))};
      std::string warning;
      RDMALOCK_RETURN_IF_ERROR(CheckDeviceLimits(config, limits, &warning));
      if (!warning.empty()) spdlog::warn("{}", warning);
    }
    RDMALOCK_ASSIGN_OR_RETURN(d->pd, rdma::AllocPd(d->ctx));
    RDMALOCK_ASSIGN_OR_RETURN(d->comp_channel, rdma::CreateCompChannel(d->ctx));
    RDMALOCK_RETURN_IF_ERROR(
        rdma::SetNonBlocking(d->comp_channel->fd, d->name + "'s completion channel"));
    if (dattr.max_cqe < kCqDepth) {
      // budgets.h sizes the handshakes in flight by kCqDepth: fewer entries can overrun the CQ
      // (IBV_EVENT_CQ_ERR), after which no handshake completes.
      spdlog::warn(
          "device {}: its completion queues hold at most {} entries, fewer than the {} lockd's "
          "handshake budget assumes; many clients connecting at once may overrun it",
          d->name, dattr.max_cqe, kCqDepth);
    }
    RDMALOCK_ASSIGN_OR_RETURN(
        d->cq, rdma::CreateCq(d->ctx, std::min(kCqDepth, dattr.max_cqe), d->comp_channel.get()));
    RDMALOCK_RETURN_IF_ERROR(rdma::ArmCq(d->cq.get()));
    // The NIC enforces who may do what: info READ only; the lock table atomics and READ, never
    // WRITE (a WRITE racing a NIC atomic on one word is not atomic); the session table READ, a
    // client's own record WRITE and atomics (its probe word, which only it writes). With memory
    // windows (the default) the regions themselves grant no remote access at all: each connection
    // gets windows bound to its QP (see Admit).
    const int mw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND;
    const bool w = config.memory_windows;
    RDMALOCK_ASSIGN_OR_RETURN(d->info_mr,
                              rdma::RegisterMr(d->pd.get(), info_->data(), info_->size(),
                                               w ? mw : IBV_ACCESS_REMOTE_READ));
    RDMALOCK_ASSIGN_OR_RETURN(
        d->locks_mr,
        rdma::RegisterMr(
            d->pd.get(), locks_->data(), locks_->size(),
            w ? mw : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
    RDMALOCK_ASSIGN_OR_RETURN(
        d->sessions_mr,
        rdma::RegisterMr(d->pd.get(), sessions_->data(), sessions_->size(),
                         w ? mw
                           : IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                                 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC));
    spdlog::info("device {}: regions registered (lock table {} bytes, rd_atomic {}, {})", d->name,
                 locks_->size(), d->sizes.rd_atomic,
                 w ? "memory windows per connection (max_mw " + std::to_string(dattr.max_mw) + ")"
                   : "shared rkeys (memory_windows: false)");
    devices_.push_back(std::move(d));
  }
  if (devices_.empty()) {
    return Error(ErrorCode::kUnsupported, "no RDMA device with RC atomics found");
  }
  return CheckAtomicScope(config, atomics);
}

}  // namespace rdmalock::lockd
