#include <catch2/catch.hpp>

#include "rdmalock/proto/handshake.h"
#include "rdmalock/proto/layout.h"
#include "rdmalock/proto/lock_word.h"

using namespace rdmalock::proto;

TEST_CASE("word0 encodes fields at their documented bit positions") {
  Word0 w{.max_s = 0x1111, .max_x = 0x2222, .n_s = 0x3333, .n_x = 0x4444};
  REQUIRE(w.Encode() == 0x4444333322221111ull);
  REQUIRE(Word0::Decode(0x4444333322221111ull) == w);
  REQUIRE(kAcquireShared == 1);
  REQUIRE(Word0::Decode(kAcquireExclusive).max_x == 1);
  REQUIRE(Word0::Decode(kReleaseShared).n_s == 1);
  REQUIRE(Word0::Decode(kReleaseExclusive).n_x == 1);
}

TEST_CASE("grant, skip and ahead follow the ticket rules") {
  // Two X before us, one S before us; we are X.
  const Word0 ticket{.max_s = 1, .max_x = 2, .n_s = 0, .n_x = 0};
  REQUIRE_FALSE(Granted(ticket, ticket, Mode::kExclusive));
  REQUIRE(Ahead(ticket, ticket, Mode::kExclusive) == 3);
  REQUIRE(Ahead(ticket, ticket, Mode::kShared) == 2);  // S waits for X only
  Word0 now{.max_s = 1, .max_x = 3, .n_s = 1, .n_x = 2};
  REQUIRE(Granted(now, ticket, Mode::kExclusive));
  REQUIRE(Granted(now, ticket, Mode::kShared));
  now.n_s = 0;
  REQUIRE_FALSE(Granted(now, ticket, Mode::kExclusive));
  REQUIRE(Granted(now, ticket, Mode::kShared));  // readers ignore other readers
  now.n_x = 3;
  REQUIRE(Skipped(now, ticket, Mode::kExclusive));
  REQUIRE(Skipped(now, ticket, Mode::kShared));
  now = Word0{.max_s = 1, .max_x = 3, .n_s = 2, .n_x = 2};
  REQUIRE(Skipped(now, ticket, Mode::kExclusive));
  REQUIRE_FALSE(Skipped(now, ticket, Mode::kShared));  // S never tests nS
}

TEST_CASE("frozen and drained words") {
  REQUIRE(Word0{.max_s = 0, .max_x = kCountMax}.Frozen());
  REQUIRE(Word0{.max_s = kCountMax}.Frozen());
  REQUIRE_FALSE(Word0{.max_s = kCountMax - 1, .max_x = kCountMax - 1}.Frozen());
  REQUIRE(Word0{.max_s = 3, .max_x = 5, .n_s = 3, .n_x = 5}.Drained());
  REQUIRE_FALSE(Word0{.max_s = 3, .max_x = 5, .n_s = 2, .n_x = 5}.Drained());
}

TEST_CASE("occupancy: holders and waiters from the counters") {
  const Occupancy free = OccupancyOf(Word0{.max_s = 3, .max_x = 5, .n_s = 3, .n_x = 5});
  REQUIRE(free.holders == 0);
  REQUIRE(free.waiting == 0);
  REQUIRE_FALSE(free.exclusive_held);
  // Three exclusive requests outstanding: one holds, two wait.
  const Occupancy x = OccupancyOf(Word0{.max_s = 1, .max_x = 8, .n_s = 1, .n_x = 5});
  REQUIRE(x.holders == 1);
  REQUIRE(x.waiting == 2);
  REQUIRE(x.exclusive_held);
  // Only shared outstanding: all hold.
  const Occupancy s = OccupancyOf(Word0{.max_s = 7, .max_x = 2, .n_s = 3, .n_x = 2});
  REQUIRE(s.holders == 4);
  REQUIRE(s.waiting == 0);
  REQUIRE_FALSE(s.exclusive_held);
  // Mixed: one head holds (a lower bound), the rest count as waiting; no exclusive claim.
  const Occupancy m = OccupancyOf(Word0{.max_s = 2, .max_x = 2, .n_s = 0, .n_x = 1});
  REQUIRE(m.exclusive_outstanding == 1);
  REQUIRE(m.shared_outstanding == 2);
  REQUIRE(m.holders == 1);
  REQUIRE(m.waiting == 2);
  REQUIRE_FALSE(m.exclusive_held);
}

TEST_CASE("requests between two readings: modulo 2^16, and after a reset what the word shows") {
  const Word0 before{.max_s = 10, .max_x = 65530};
  REQUIRE(RequestsBetween(before, 7, Word0{.max_s = 12, .max_x = 65535}, 7) == 7);
  REQUIRE(RequestsBetween(before, 7, Word0{.max_s = 10, .max_x = 4}, 7) == 10);  // wrapped
  REQUIRE(RequestsBetween(before, 7, Word0{.max_s = 1, .max_x = 2}, 8) == 3);    // reset
  REQUIRE(RequestsBetween(before, 7, before, 7) == 0);
}

TEST_CASE("recovered word marks everything up to the waiter as done") {
  const Word0 seen{.max_s = 4, .max_x = 6, .n_s = 2, .n_x = 3};
  const Word0 tx{.max_s = 3, .max_x = 5};
  const Word0 rx = RecoveredWord(seen, tx, Mode::kExclusive);
  REQUIRE(rx.n_x == 6);
  REQUIRE(rx.n_s == 3);
  REQUIRE(rx.max_x == 6);
  REQUIRE(rx.max_s == 4);
  const Word0 rs = RecoveredWord(seen, tx, Mode::kShared);
  REQUIRE(rs.n_x == 5);
  REQUIRE(rs.n_s == 3);
}

TEST_CASE("fencing token layout") {
  REQUIRE(FencingToken(0x0102, 0x0000000304050607ull, 0x0809) == 0x0102040506070809ull);
  REQUIRE(FencingToken(1, 0, 5) < FencingToken(1, 1, 0));
  REQUIRE(FencingToken(1, 0xffffffff, 0xffff) < FencingToken(2, 0, 0));
}

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
  SECTION("version zero") {
    b[ConnectRequest::kVersion] = 0;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kBadVersion);
  }
  SECTION("wrong length field") {
    b[ConnectRequest::kLength] = 55;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kBadLength);
  }
  SECTION("join fields set without the join flag") {
    b[ConnectRequest::kJoinSession + 3] = 1;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kBadLength);
  }
  SECTION("unknown flag") {
    b[ConnectRequest::kFlags] = 0x10;
    REQUIRE(ConnectRequest::Decode(b, &out) == RejectReason::kBadLength);
  }
  SECTION("trailing garbage") {
    std::vector<uint8_t> v(b.begin(), b.end());
    v.push_back(1);
    REQUIRE(ConnectRequest::Decode(v, &out) == RejectReason::kBadLength);
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

TEST_CASE("request entries round-trip and reject torn or garbage words") {
  RequestEntry e;
  e.slot = 123456;
  e.mode = rdmalock::proto::Mode::kShared;
  e.state = RequestEntry::State::kQueued;
  e.seq = 77;
  e.ticket = 0x0001000200030004ull;
  const auto w = e.Encode();
  RequestEntry out;
  REQUIRE(RequestEntry::Decode(w[0], w[1], &out));
  REQUIRE(out.slot == e.slot);
  REQUIRE(out.mode == e.mode);
  REQUIRE(out.state == e.state);
  REQUIRE(out.seq == 77);
  REQUIRE(out.ticket == e.ticket);
  // Live until its seq is marked done; an older done word does not end it.
  REQUIRE(RequestEntry::DecodeLive(w[0], w[1], 0, &out));
  REQUIRE(RequestEntry::DecodeLive(w[0], w[1], 76, &out));
  REQUIRE_FALSE(RequestEntry::DecodeLive(w[0], w[1], 77, &out));
  // A free entry is all zero and never decodes.
  RequestEntry f;
  const auto z = f.Encode();
  REQUIRE(z[0] == 0);
  REQUIRE(z[1] == 0);
  REQUIRE_FALSE(RequestEntry::Decode(0, 0, &out));
  // Half of one write and half of another (a torn entry), or garbage: refused.
  RequestEntry e2 = e;
  e2.ticket = 0x0001000200030005ull;
  REQUIRE_FALSE(RequestEntry::Decode(w[0], e2.Encode()[1], &out));
  REQUIRE_FALSE(RequestEntry::Decode(0xdeadbeefdeadbeefull, 0x1234, &out));
  REQUIRE_FALSE(RequestEntry::Decode(w[0] ^ (uint64_t{1} << 33), w[1], &out));
  // Sequence numbers skip 0 when they wrap.
  REQUIRE(RequestEntry::NextSeq(RequestEntry::kSeqMask) == 1);
  REQUIRE(RequestEntry::NextSeq(0) == 1);
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

TEST_CASE("info page round-trips") {
  std::array<uint8_t, kInfoPageSize> page{};
  InfoPage p;
  p.epoch = 3;
  p.lock_count = 1000;
  p.lease_ns = 5;
  p.connected_clients = 12;
  p.EncodeTo(page);
  const InfoPage q = InfoPage::DecodeFrom(page);
  REQUIRE(q.magic == kInfoMagic);
  REQUIRE(q.epoch == 3);
  REQUIRE(q.lock_count == 1000);
  REQUIRE(q.connected_clients == 12);
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

TEST_CASE("ScanRecordEntries reports live requests, skips free and finished ones, counts garbage") {
  std::vector<uint8_t> rec(kSessionRecordSize, 0);
  auto put = [&rec](uint32_t i, const RequestEntry& e, uint64_t done) {
    const auto w = e.Encode();
    const uint64_t off = SessionRecord::EntryOffset(i);
    PutLe(rec, off, w[0], 8);
    PutLe(rec, off + 8, w[1], 8);
    PutLe(rec, off + RequestEntry::kDone, done, 8);
  };
  RequestEntry live{.slot = 5,
                    .mode = Mode::kExclusive,
                    .state = RequestEntry::State::kQueued,
                    .seq = 9,
                    .ticket = 0x10};
  RequestEntry over = live;
  over.slot = 6;
  RequestEntry asking = live;
  asking.slot = 7;
  asking.state = RequestEntry::State::kRequesting;
  RequestEntry beyond = live;
  beyond.slot = 100;  // lock_count below is 64
  put(0, live, 8);    // an older use is done, this one is not
  put(3, over, 9);    // this use is marked done
  put(4, asking, 0);
  put(7, beyond, 0);                                                    // garbage: no such slot
  PutLe(rec, SessionRecord::EntryOffset(9), 0xdeadbeefdeadbeefull, 8);  // torn: garbage
  std::vector<std::pair<uint32_t, uint32_t>> seen;                      // (index, slot)
  const uint32_t garbage =
      ScanRecordEntries([&rec](uint64_t off) { return GetLe(rec, off, 8); }, 64,
                        [&](const RequestEntry& e, uint32_t i) { seen.emplace_back(i, e.slot); });
  REQUIRE(garbage == 2);
  REQUIRE(seen == std::vector<std::pair<uint32_t, uint32_t>>{{0, 5}, {4, 7}});
}
