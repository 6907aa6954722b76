// libFuzzer target: the handshake parsers. lockd decodes ConnectRequest (rdma_cm private data) and
// Hello (the first SEND) from any peer that reaches its port; a client decodes Challenge,
// AcceptReply (the Welcome) and RejectReply from whatever answers. None
// may crash, read out of bounds or hit undefined behaviour, and what decodes must round-trip.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "rdmalock/proto/handshake.h"

using namespace rdmalock::proto;

namespace {

void Check(bool ok) {
  if (!ok) std::abort();  // a property failed: libFuzzer saves the input
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);

  ConnectRequest req;
  if (ConnectRequest::Decode(in, &req) == RejectReason::kNone) {
    // Accepted input re-encodes to a request that decodes to the same fields.
    const auto again = req.Encode();
    ConnectRequest req2;
    Check(ConnectRequest::Decode(again, &req2) == RejectReason::kNone);
    Check(req2.version == req.version && req2.flags == req.flags && req2.pid == req.pid &&
          req2.client_name == req.client_name && req2.join_session == req.join_session &&
          req2.join_key == req.join_key);
    Check(req.client_name.size() <= ConnectRequest::kClientNameLen);
  }
  (void)RejectReasonName(RejectReason(size > 1 ? data[0] | (data[1] << 8) : 0));

  AcceptReply acc;
  if (AcceptReply::Decode(in, &acc)) {
    AcceptReply acc2;
    Check(AcceptReply::Decode(acc.Encode(), &acc2));
    Check(acc2.epoch == acc.epoch && acc2.lock_count == acc.lock_count &&
          acc2.locks.rkey == acc.locks.rkey && acc2.join_key == acc.join_key &&
          acc2.record.rkey == acc.record.rkey && acc2.mac == acc.mac);
  }

  Hello hello;
  if (Hello::Decode(in, &hello) == RejectReason::kNone) {
    Check(size == Hello::kSize);
    Hello hello2;
    Check(Hello::Decode(hello.Encode(), &hello2) == RejectReason::kNone);
    Check(hello2.flags == hello.flags && hello2.nonce == hello.nonce && hello2.mac == hello.mac);
  }

  Challenge ch;
  if (Challenge::Decode(in, &ch)) {
    Challenge ch2;
    Check(Challenge::Decode(ch.Encode(), &ch2));
    Check(ch2.flags == ch.flags && ch2.nonce == ch.nonce && ch2.version == ch.version);
  }

  RejectReply rej;
  if (RejectReply::Decode(in, &rej)) {
    Check(rej.detail.size() <= RejectReply::kDetailLen);
    (void)RejectReasonName(rej.reason);
    (void)RejectReasonLabel(rej.reason);
  }
  return 0;
}
