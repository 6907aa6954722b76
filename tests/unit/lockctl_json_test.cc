// lockctl's --json printers: every string is escaped, whatever bytes it holds (issue 17,
// finding 14). Each output is parsed by Python's json module.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "client/lockctl/json.h"

namespace {

// Names and peers as a client (or etcd) may make them: quotes, backslashes, control bytes,
// DEL, invalid UTF-8 (a lone continuation byte, a truncated sequence, an overlong '/', a
// surrogate), and valid multi-byte UTF-8 that must survive.
const std::vector<std::string> kNasty = {
    "plain",
    "quote\"in",
    "back\\slash",
    std::string("nul\0byte", 8),
    "ctl\x01\x1f\n\t\r\b\f",
    "del\x7f",
    "lone\x80",
    "trunc\xe2\x82",
    "overlong\xc0\xaf",
    "surrogate\xed\xa0\x80",
    "high\xff\xfe",
    "utf8 \xc3\xa9 \xe2\x82\xac \xf0\x9f\x94\x92",
    "\"}]},{\"injected\":1",
};

// The outputs among `texts` that Python's json module does not parse as one JSON document, with
// why, each shown with the bytes a terminal would eat made visible. One python3 for them all (one
// per output took 13 s of the unit run).
std::vector<std::string> NotJson(const std::vector<std::string>& texts) {
  // The files are removed whatever happens below (a REQUIRE throws).
  struct Files {
    std::vector<std::string> paths;
    ~Files() {
      for (const auto& p : paths) unlink(p.c_str());
    }
  } files;
  std::vector<std::string>& paths = files.paths;
  for (const std::string& text : texts) {
    char path[] = "/tmp/lockctl-json-XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    paths.emplace_back(path);
    const bool written = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
    close(fd);
    REQUIRE(written);
  }
  std::string cmd =
      "python3 -c 'import json,sys\n"
      "for i, p in enumerate(sys.argv[1:]):\n"
      "  try: json.load(open(p, encoding=\"utf-8\"))\n"
      "  except Exception as e: print(i, str(e).replace(chr(10), \" \"))\n'";
  for (const auto& p : paths) cmd += " " + p;  // stderr not read: only the script's lines
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string report;
  char buf[512];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), pipe)) > 0;) report.append(buf, n);
  const int rc = pclose(pipe);
  REQUIRE(rc == 0);  // the script itself ran (python3 is there)
  std::vector<std::string> bad;
  std::istringstream lines(report);
  for (std::string line; std::getline(lines, line);) {
    INFO("python3 printed: " << line);
    const size_t sp = line.find(' ');  // "INDEX why"
    REQUIRE(sp != std::string::npos);
    REQUIRE(sp > 0);
    REQUIRE(line.find_first_not_of("0123456789") == sp);
    const size_t i = std::stoul(line.substr(0, sp));
    REQUIRE(i < texts.size());
    std::string shown;
    for (unsigned char ch : texts[i]) {
      if (ch < 0x20 || ch >= 0x7f) {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "<%02x>", ch);
        shown += hex;
      } else {
        shown += static_cast<char>(ch);
      }
    }
    bad.push_back("not JSON: " + line.substr(sp + 1) + "; output: " + shown);
  }
  return bad;
}

}  // namespace

TEST_CASE(
    "issue 17 finding 14: lockctl's --json output parses whatever bytes names and peers hold") {
  std::vector<std::string> outputs;
  for (const auto& bad : kNasty) {
    rdmalock::SessionInfo s;
    s.session_id = 3;
    s.client_name = bad;
    s.pid = 42;
    s.peer = bad;
    s.requests.push_back({.slot = 7,
                          .mode = rdmalock::LockMode::kExclusive,
                          .status = rdmalock::RequestInfo::Status::kHolding,
                          .ticket = 1});
    const std::vector<rdmalock::SessionInfo> sessions{s};
    outputs.push_back(lockctl::ClientsJson(sessions, 3));

    rdmalock::SlotState v;
    v.slot = 7;
    v.exclusive_outstanding = 1;
    v.exclusive_held = true;
    outputs.push_back(
        lockctl::InspectJson(bad, v, "held exclusive", {{&sessions[0], s.requests[0]}}));

    rdmalock::ClusterMap map;
    map.shards.push_back({.name = bad, .server = bad, .port = 7471});
    map.shards.push_back({.name = "b", .server = "", .port = 7471});
    outputs.push_back(lockctl::ClusterJson(bad, map, {{bad, "10.0.0.1:7471"}, {}}));
  }
  REQUIRE(outputs.size() == 3 * kNasty.size());
  const std::vector<std::string> bad = NotJson(outputs);
  for (const auto& why : bad) WARN(why);
  CHECK(bad.empty());
  // The check itself: what is not JSON is found.
  CHECK(NotJson({"{\"a\":1}", "{\"a\":\"\x80\"}", "{"}).size() == 2);
}

namespace {

// What a JSON parser reads from lockctl's rendering of `in` (nlohmann's parser checks UTF-8).
std::string Decoded(const std::string& in) {
  return nlohmann::json::parse(lockctl::JsonString(in)).get<std::string>();
}

const std::string kFffd = "\xef\xbf\xbd";  // U+FFFD in UTF-8

}  // namespace

// The hand-written escaper is gone (issue 18): strings go through nlohmann-json's dump with
// error_handler_t::replace. The escapes of quotes, backslashes and control bytes and the bytes of
// valid UTF-8 are as they were; what a parser reads is compared where nlohmann writes the same
// value differently (U+FFFD and DEL unescaped). One U+FFFD per invalid sequence's maximal
// subpart, as Unicode recommends: a truncated sequence is one, a byte that can start none (an
// overlong lead, a stray continuation, a surrogate's bytes) one each.
TEST_CASE("issue 17 finding 14: JSON strings keep valid UTF-8 and replace invalid bytes") {
  CHECK(lockctl::JsonString("a\"b\\c\n\x01") == "\"a\\\"b\\\\c\\n\\u0001\"");
  CHECK(lockctl::JsonString("\xc3\xa9\xf0\x9f\x94\x92") == "\"\xc3\xa9\xf0\x9f\x94\x92\"");
  CHECK(Decoded("x\x80y") == "x" + kFffd + "y");
  CHECK(Decoded("\xc0\xaf") == kFffd + kFffd);
  CHECK(Decoded("\xed\xa0\x80") == kFffd + kFffd + kFffd);
  CHECK(Decoded("\xe2\x82") == kFffd);
  CHECK(Decoded("\xe2\x82x") == kFffd + "x");
  CHECK(Decoded("\x7f") == "\x7f");
}

// The figures lockctl prints keep the decimals of the printf it used before.
TEST_CASE("lockctl's JSON figures: integers as integers, fractions rounded as %.Nf was") {
  const lockctl::Json j = {
      {"n", uint64_t{18446744073709551615u}},  {"neg", -1},
      {"lease_ms", lockctl::Fixed(1000.0, 3)}, {"rate", lockctl::Fixed(2.0 / 3.0, 3)},
      {"p50", lockctl::Fixed(3.14159, 2)},     {"zero", lockctl::Fixed(0.0004, 3)}};
  CHECK(lockctl::JsonLine(j) ==
        "{\"n\":18446744073709551615,\"neg\":-1,\"lease_ms\":1000.0,\"rate\":0.667,"
        "\"p50\":3.14,\"zero\":0.0}\n");
}

// Found by review (2026-12-06): lockctl cluster printed an IPv6 primary as "fe80::1:7471" (its
// members, as lockd writes them, "[fe80::1]:7471"), so a script could not match the primary to
// its member, nor split the address from the port.
TEST_CASE("lockctl cluster: an IPv6 primary is written [HOST]:PORT, as its members are") {
  rdmalock::ClusterMap map;
  map.shards.push_back({.name = "a", .server = "fe80::1", .port = 7471});
  map.shards.push_back({.name = "b", .server = "10.0.0.2", .port = 7472});
  const auto j = nlohmann::json::parse(lockctl::ClusterJson("c", map, {{"[fe80::1]:7471"}, {}}));
  CHECK(j["shards"][0]["primary"] == "[fe80::1]:7471");
  CHECK(j["shards"][1]["primary"] == "10.0.0.2:7472");
  CHECK(lockctl::ShardAddress(map.shards[0]) == "[fe80::1]:7471");
  CHECK(lockctl::ShardAddress(map.shards[1]) == "10.0.0.2:7472");
}
