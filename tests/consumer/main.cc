// Links against the installed SDK and calls into it: a name's slot, and a connect that must be
// refused for a missing server (no RDMA needed).
#include <rdmalock/client.h>

#include <cstdio>

int main() {
  const uint64_t slot = rdmalock::SlotForName("orders/42", 65536);
  auto c = rdmalock::Client::Connect({});
  if (c.ok() || c.status().code() != rdmalock::ErrorCode::kInvalidArgument) {
    std::printf("unexpected: %s\n", c.status().ToString().c_str());
    return 1;
  }
  std::printf("consumer ok: slot %llu; %s\n", static_cast<unsigned long long>(slot),
              c.status().ToString().c_str());
  return 0;
}
