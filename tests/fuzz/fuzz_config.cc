// libFuzzer target: lockd's configuration parser (YAML text from the admin, but a typo must
// never crash lockd or systemd's ExecStartPre). Whatever parses must validate, and the effective
// configuration lockd prints (--print-config) must parse back to the same values.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/config.h"

using rdmalock::lockd::ChangedKeys;
using rdmalock::lockd::ParseConfig;
using rdmalock::lockd::Validate;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto c = ParseConfig(text, "fuzz.yaml");
  if (!c.ok()) {
    if (c.status().message().empty()) std::abort();  // every error says what is wrong
    return 0;
  }
  if (!Validate(*c).ok()) std::abort();
  auto again = ParseConfig(c->ToYaml(), "printed.yaml");
  if (!again.ok() || !ChangedKeys(*c, *again).empty()) std::abort();
  return 0;
}
