// server/admin: the admin socket's request parser (pure; no socket, no verbs).
#include "server/admin.h"

#include <catch2/catch.hpp>
#include <string>

using rdmalock::lockd::AdminRequest;
using rdmalock::lockd::ParseAdminCommand;

TEST_CASE("admin parser: the two requests, with their number") {
  std::string error;
  auto slot = ParseAdminCommand("release-slot 42", &error);
  REQUIRE(slot);
  CHECK(slot->kind == AdminRequest::Kind::kReleaseSlot);
  CHECK(slot->number == 42);
  CHECK(slot->arg == "42");
  auto session = ParseAdminCommand("  release-session   7 ", &error);
  REQUIRE(session);
  CHECK(session->kind == AdminRequest::Kind::kReleaseSession);
  CHECK(session->number == 7);
  // 19 digits is the most taken (always fits 64 bits).
  auto big = ParseAdminCommand("release-session 9999999999999999999", &error);
  REQUIRE(big);
  CHECK(big->number == 9999999999999999999ull);
}

TEST_CASE("admin parser: a malformed line is an error reply that quotes it") {
  for (const std::string line : {"", "release-slot", "release-slot x", "release-slot -1",
                                 "release-slot 1 2", "release-lock 3", "release-slot 0x10",
                                 "release-session 12345678901234567890", "RELEASE-SLOT 1"}) {
    std::string error;
    INFO(line);
    CHECK_FALSE(ParseAdminCommand(line, &error));
    CHECK(error.rfind("error bad request '", 0) == 0);
    CHECK(error.find("(expected: release-slot SLOT | release-session ID)") != std::string::npos);
  }
  // The quote is cut at 80 characters: a peer cannot make lockd echo a long line.
  std::string error;
  CHECK_FALSE(ParseAdminCommand(std::string(500, 'a'), &error));
  CHECK(error.size() < 200);
}
