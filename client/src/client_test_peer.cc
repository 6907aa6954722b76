// ClientTestPeer: the test hooks into a Client (client_test_peer.h).
#include "client/src/client_test_peer.h"

#include "client/src/client_impl.h"

namespace rdmalock {

void ClientTestPeer::SetTestHook(Client& c, std::function<void(std::string_view)> fn) {
  c.impl_->test_hook_ = std::move(fn);
}

void ClientTestPeer::PauseRenewals(Client& c, bool paused) {
  c.impl_->renewals_paused_.store(paused, std::memory_order_relaxed);
}

void ClientTestPeer::PauseKeeper(Client& c, bool paused) {
  c.impl_->keeper_paused_.store(paused, std::memory_order_relaxed);
}

void ClientTestPeer::PauseReleaseReaping(Client& c, bool paused) {
  c.impl_->release_reaping_paused_.store(paused, std::memory_order_relaxed);
}

void ClientTestPeer::HoldHeldList(Client& c, bool hold) NO_THREAD_SAFETY_ANALYSIS {
  auto ch = c.impl_->Channel(std::chrono::steady_clock::time_point{});
  if (!ch.ok()) return;
  sdk::HeldList& list = *(*ch)->held;
  if (hold) {
    list.mu_.Lock();
  } else {
    list.mu_.Unlock();
  }
}

void ClientTestPeer::FailSession(Client& c, const std::string& why) {
  if (auto s = c.impl_->session()) {
    c.impl_->OnSessionError(s->gen, Error(ErrorCode::kConnection, why));
  }
}

Result<std::unique_ptr<Client>> ClientTestPeer::Connect(
    const ClientOptions& options, Connector connector,
    std::function<void(std::string_view point)> hook) {
  RDMALOCK_ASSIGN_OR_RETURN(auto impl, ConnectImpl(options, nullptr, std::move(connector)));
  impl->test_hook_ = std::move(hook);
  // The Client first, then its threads: once they run, only ~Client (Close) ends them.
  auto client = std::unique_ptr<Client>(new Client(std::move(impl)));
  RDMALOCK_RETURN_IF_ERROR(client->impl_->Start());  // else ~Client closes what started
  return client;
}

uint64_t ClientTestPeer::JoinKey(Client& c) {
  auto s = c.impl_->session();
  return s ? s->reply.join_key : 0;
}

std::weak_ptr<const void> ClientTestPeer::Lifetime(Client& c) { return c.impl_; }

size_t ClientTestPeer::LocalWaiters(Client& c, uint64_t slot) {
  const auto& table = c.impl_->cohort();
  if (!table) return 0;
  sdk::CohortEntry& e = table->Entry(slot);
  MutexLock lk(&e.mu);
  if (!table->Owned(slot)) return 0;
  size_t n = 0;
  for (const sdk::CohortWaiter* w = e.head; w != nullptr; w = w->next) ++n;
  // The entry's count of its queue (where a waiter spins from) must agree with the queue.
  return n == e.waiting ? n : kWaitersMiscounted;
}

bool ClientTestPeer::HeldHere(Client& c, uint64_t slot) {
  const auto& table = c.impl_->cohort();
  return table && table->Entry(slot).held_here.load(std::memory_order_relaxed);
}

uint32_t ClientTestPeer::BudgetUnits(Client& c, uint64_t slot) {
  return c.impl_->budget_->Count(slot);
}

}  // namespace rdmalock
