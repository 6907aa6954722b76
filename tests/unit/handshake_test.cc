// Unit tests of proto/rdmalock/proto/handshake.h: connect requests (and joins), the challenge,
// hellos, accept and reject replies, and the reject reasons' names.
#include "rdmalock/proto/handshake.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <span>
#include <vector>

using namespace rdmalock::proto;

TEST_CASE("connect request round-trips and fits rdma_cm's 56 bytes") {
  ConnectRequest r;
  r.flags = kFlagLoopback;
  r.pid = 4242;
  r.client_name = "worker-with-a-long-name-that-is-cut";
  const auto b = r.Encode();
  REQUIRE(b.size() == 56);
  ConnectRequest out;
  REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kNone);
  REQUIRE(out.pid == 4242);
  REQUIRE(out.flags == kFlagLoopback);
  REQUIRE(out.client_name == "worker-with-a-long-name-");
  // The transport pads to its maximum with zeros: still valid.
  std::vector<uint8_t> padded(b.begin(), b.end());
  padded.resize(56, 0);
  REQUIRE(ConnectRequest::Decode(padded, &out) == RejectReason::kNone);
}

TEST_CASE("malformed connect requests are refused with a reason") {
  ConnectRequest r;
  auto b = r.Encode();
  ConnectRequest out;
  SECTION("empty") { REQUIRE(ConnectRequest::Decode({}, &out) == RejectReason::kBadLength); }
  SECTION("truncated") {
    REQUIRE(ConnectRequest::Decode(std::span(b.data(), 20), &out) == RejectReason::kBadLength);
  }
  SECTION("bad magic") {
    b[0] ^= 0xff;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kBadMagic);
  }
  SECTION("future version") {
    b[ConnectRequest::kVersion] = 99;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kBadVersion);
  }
  SECTION("version 5: lockd of version 6 serves version-5 clients") {
    b[ConnectRequest::kVersion] = 5;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kNone);
    REQUIRE(out.version == 5);
  }
  SECTION("version 7: lockd of version 8 serves version-7 clients") {
    b[ConnectRequest::kVersion] = 7;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kNone);
    REQUIRE(out.version == 7);
  }
  SECTION("version 4: refused") {
    b[ConnectRequest::kVersion] = 4;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kBadVersion);
  }
  SECTION("version zero") {
    b[ConnectRequest::kVersion] = 0;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kBadVersion);
  }
  // Each refusal of a request of the right size says what is wrong with it, for lockd's log: a
  // newer client's new flag read "malformed request length" with no detail (found by review,
  // 2026-12-08).
  std::string why;
  SECTION("wrong length field") {
    b[ConnectRequest::kLength] = 55;
    REQUIRE(ConnectRequest::Decode(b, &out, &why) == RejectReason::kBadLength);
    CHECK_THAT(why, Catch::Contains("length field 55"));
  }
  SECTION("join fields set without the join flag") {
    b[ConnectRequest::kJoinSession + 3] = 1;
    REQUIRE(ConnectRequest::Decode(b, &out, &why) == RejectReason::kBadLength);
    CHECK_THAT(why, Catch::Contains("join fields without the join flag"));
  }
  SECTION("unknown flag") {
    b[ConnectRequest::kFlags] = 0x10;
    REQUIRE(ConnectRequest::Decode(b, &out, &why) == RejectReason::kBadLength);
    CHECK_THAT(why, Catch::Contains("unknown flags 0x10"));
  }
  SECTION("join and loopback at once") {
    b[ConnectRequest::kFlags] = static_cast<uint8_t>(kFlagJoin | kFlagLoopback);
    REQUIRE(ConnectRequest::Decode(b, &out, &why) == RejectReason::kBadLength);
    CHECK_THAT(why, Catch::Contains("both join and loopback"));
  }
  SECTION("trailing garbage") {
    std::vector<uint8_t> v(b.begin(), b.end());
    v.push_back(1);
    REQUIRE(ConnectRequest::Decode(v, &out, &why) == RejectReason::kBadLength);
    CHECK_THAT(why, Catch::Contains("bytes after the request"));
  }
}

TEST_CASE("a join request carries its session and key") {
  ConnectRequest req;
  req.flags = kFlagJoin;
  req.pid = 7;
  req.client_name = "w";
  req.join_session = 0x1122334455667788ull;
  req.join_key = 0x99aabbccddeeff01ull;
  const auto b = req.Encode();
  ConnectRequest out;
  REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kNone);
  REQUIRE(out.flags == kFlagJoin);
  REQUIRE(out.join_session == req.join_session);
  REQUIRE(out.join_key == req.join_key);
}

TEST_CASE("accept and reject replies round-trip within their limits") {
  AcceptReply a;
  a.epoch = 9;
  a.session_id = 77;
  a.lease_ns = 2'000'000'000;
  a.lock_count = 1 << 20;
  a.stall_factor = 2;
  a.locks = {0x7f0000001000ull, 16 << 20, 0xabcd};
  a.sessions = {0x7f0000002000ull, 4096, 0x1234};
  a.session_record_offset = 512;
  a.record = {0x7f0000002200ull, 4096, 0x5678};
  a.mac[0] = 0xee;
  a.mac[31] = 0x11;
  const auto b = a.Encode();
  REQUIRE(b.size() <= kControlMessageMax);
  AcceptReply out;
  REQUIRE(AcceptReply::Decode(b, &out));
  REQUIRE(out.epoch == 9);
  REQUIRE(out.session_id == 77);
  REQUIRE(out.locks.addr == 0x7f0000001000ull);
  REQUIRE(out.locks.rkey == 0xabcd);
  REQUIRE(out.sessions.length == 4096);
  REQUIRE(out.session_record_offset == 512);
  REQUIRE(out.record.rkey == 0x5678);
  REQUIRE(out.record.addr == 0x7f0000002200ull);
  REQUIRE(out.mac == a.mac);
  auto bad = b;
  bad[AcceptReply::kLength] = 0;
  REQUIRE_FALSE(AcceptReply::Decode(bad, &out));

  RejectReply r;
  r.reason = RejectReason::kBadVersion;
  r.detail = "client speaks 7";
  const auto rb = r.Encode();
  REQUIRE(rb.size() <= kMaxRejectPrivateData);
  RejectReply rout;
  REQUIRE(RejectReply::Decode(rb, &rout));
  REQUIRE(rout.reason == RejectReason::kBadVersion);
  REQUIRE(rout.detail == "client speaks 7");
}

TEST_CASE("the challenge fits rdma_cm's accept and carries only a nonce and a flag") {
  Challenge c;
  c.flags = kChallengeAuthRequired;
  c.nonce[0] = 1;
  c.nonce[31] = 2;
  const auto b = c.Encode();
  REQUIRE(b.size() <= kMaxAcceptPrivateData);
  std::vector<uint8_t> padded(b.begin(), b.end());
  padded.resize(kMaxAcceptPrivateData, 0);  // as the client receives it
  Challenge out;
  REQUIRE(Challenge::Decode(padded, &out));
  REQUIRE(out.flags == kChallengeAuthRequired);
  REQUIRE(out.nonce == c.nonce);
  auto old = padded;
  old[Challenge::kVersion] = 2;  // a version-2 lockd's accept is not a challenge
  REQUIRE_FALSE(Challenge::Decode(old, &out));
}

TEST_CASE("hellos: exact size, known flags, zero padding, this version") {
  Hello h;
  h.flags = kHelloHasProof;
  h.nonce[5] = 9;
  h.mac[7] = 3;
  const auto b = h.Encode();
  std::vector<uint8_t> v(b.begin(), b.end());
  Hello out;
  REQUIRE(Hello::Decode(v, &out) == RejectReason::kNone);
  REQUIRE(out.nonce == h.nonce);
  REQUIRE(out.mac == h.mac);
  REQUIRE(Hello::Decode(std::vector<uint8_t>(v.begin(), v.end() - 1), &out) ==
          RejectReason::kBadHello);
  auto longer = v;
  longer.push_back(0);
  REQUIRE(Hello::Decode(longer, &out) == RejectReason::kBadHello);
  auto magic = v;
  magic[0] ^= 1;
  REQUIRE(Hello::Decode(magic, &out) == RejectReason::kBadHello);
  auto version = v;
  version[Hello::kVersion] = 2;
  REQUIRE(Hello::Decode(version, &out) == RejectReason::kBadVersion);
  auto flags = v;
  flags[Hello::kFlags] = 2;
  REQUIRE(Hello::Decode(flags, &out) == RejectReason::kBadHello);
  auto pad = v;
  pad[12] = 1;
  REQUIRE(Hello::Decode(pad, &out) == RejectReason::kBadHello);
  REQUIRE(Hello::Decode({}, &out) == RejectReason::kBadHello);
}

TEST_CASE("every reject reason has a name and a metrics label") {
  for (size_t r = 1; r < kRejectReasonCount; ++r) {
    const auto reason = static_cast<RejectReason>(r);
    REQUIRE(RejectReasonName(reason) != "unknown reason");
    REQUIRE(RejectReasonLabel(reason) != "unknown");
  }
}
