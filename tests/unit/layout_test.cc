// Unit tests of proto/rdmalock/proto/layout.h: the info page, request entries and the scan of
// a session record's live entries.
#include "rdmalock/proto/layout.h"

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "rdmalock/proto/wire.h"

using namespace rdmalock::proto;

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
  // Nor is it live once a later use of the entry was marked done (its WRITE landed late).
  REQUIRE_FALSE(RequestEntry::DecodeLive(w[0], w[1], 79, &out));
  // Seqs wrap at 2^17: a use after the wrap is newer than one before it.
  REQUIRE(RequestEntry::Newer(2, RequestEntry::kSeqMask - 1));
  REQUIRE_FALSE(RequestEntry::Newer(RequestEntry::kSeqMask - 1, 2));
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
  // A use's seq is even and skips 0 when it wraps; a re-armed use takes the odd one above, which
  // the next use skips.
  REQUIRE(RequestEntry::NextSeq(0) == 2);
  REQUIRE(RequestEntry::NextSeq(2) == 4);
  REQUIRE(RequestEntry::NextSeq(RequestEntry::RearmSeq(2)) == 4);
  REQUIRE(RequestEntry::RearmSeq(2) == 3);
  REQUIRE(RequestEntry::NextSeq(RequestEntry::kSeqMask - 1) == 2);
  REQUIRE(RequestEntry::NextSeq(RequestEntry::kSeqMask) == 2);
  REQUIRE(RequestEntry::RearmSeq(RequestEntry::kSeqMask - 1) == RequestEntry::kSeqMask);
}

TEST_CASE("a tagged entry carries its generation, and counts only in it (protocol versions 6, 8)") {
  using rdmalock::proto::Mode;
  using rdmalock::proto::Word0;
  RequestEntry e;
  e.slot = 42;
  e.mode = Mode::kExclusive;
  e.state = RequestEntry::State::kQueued;
  e.seq = 9;
  e.ticket = Word0{.max_s = 3, .max_x = 7, .n_s = 2, .n_x = 5}.Encode();
  e.tagged = true;
  e.generation = 0xfedcba98u;
  const auto w = e.Encode();
  REQUIRE(((w[0] >> 29) & 3) == RequestEntry::kTaggedStateBits);
  RequestEntry out;
  REQUIRE(RequestEntry::Decode(w[0], w[1], &out));
  CHECK(out.tagged);
  CHECK(out.state == RequestEntry::State::kQueued);
  CHECK(out.generation == 0xfedcba98u);
  // The ticket keeps its max fields (all a grant or a reap compares); the FA's n fields are not
  // kept.
  CHECK(Word0::Decode(out.ticket) == Word0{.max_s = 3, .max_x = 7, .n_s = 0, .n_x = 0});
  // The check covers the generation: another generation with the same a word is torn.
  RequestEntry other = e;
  other.generation = 1;
  REQUIRE_FALSE(RequestEntry::Decode(w[0], other.Encode()[1], &out));
  // A shared entry is tagged the same way (protocol version 8), and an untagged one (a client of
  // version 7 or before) keeps its whole ticket.
  RequestEntry sh = e;
  sh.mode = Mode::kShared;
  const auto ws = sh.Encode();
  REQUIRE(RequestEntry::Decode(ws[0], ws[1], &out));
  CHECK(out.tagged);
  CHECK(out.mode == Mode::kShared);
  CHECK(out.generation == 0xfedcba98u);
  sh.tagged = false;
  const auto wu = sh.Encode();
  REQUIRE(RequestEntry::Decode(wu[0], wu[1], &out));
  CHECK_FALSE(out.tagged);
  CHECK(out.state == RequestEntry::State::kQueued);
  CHECK(Word0::Decode(out.ticket) == Word0{.max_s = 3, .max_x = 7, .n_s = 2, .n_x = 5});
  // Over in another generation, or once the word has moved past its ticket; not while granted.
  REQUIRE(RequestEntry::Decode(w[0], w[1], &out));
  const Word0 granted{.max_s = 3, .max_x = 8, .n_s = 3, .n_x = 7};
  const uint64_t gen_word1 = uint64_t{0xfedcba98u} << 16;
  CHECK_FALSE(out.TaggedOver(granted, gen_word1));
  CHECK(out.TaggedOver(granted, gen_word1 + rdmalock::proto::kGenerationIncrement));
  CHECK(out.TaggedOver(Word0{.max_s = 3, .max_x = 8, .n_s = 3, .n_x = 8}, gen_word1));
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

// docs/protocol.md §10 drew the record header with the heartbeat at +96 and lockd's stamp at
// +104, where the code has them at +112 and +96 since protocol 4 (found by review, 2026-12-06).
// The drawing is checked against the constants.
TEST_CASE("docs/protocol.md draws the session record header the code writes") {
  std::ifstream in(std::string(RDMALOCK_SOURCE_DIR) + "/docs/protocol.md");
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  using R = SessionRecord;
  for (const std::string& field :
       {"+" + std::to_string(R::kHeartbeatSeenUnixNs) + " heartbeat last seen moving (lockd)",
        "+" + std::to_string(R::kHeartbeat) + " heartbeat (client)",
        "+" + std::to_string(R::kProbe) + " probe word",
        "WRITEs a counter at `+" + std::to_string(R::kHeartbeat) + "`",
        "stamps `+" + std::to_string(R::kHeartbeatSeenUnixNs) + "` with its clock"}) {
    INFO(field);
    CHECK(doc.find(field) != std::string::npos);
  }
  // The probe word is in the client's window, before the entries, and 8-byte aligned.
  STATIC_REQUIRE(R::kProbe >= R::kClientWritable);
  STATIC_REQUIRE(R::kProbe + 8 <= R::kEntries);
  STATIC_REQUIRE(R::kProbe % 8 == 0);
  STATIC_REQUIRE(R::kProbe != R::kHeartbeat);
}
