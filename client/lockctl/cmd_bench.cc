// lockctl bench: checks that lockd can be named, then runs the workload (bench.h), each bench
// process connecting by itself after the fork.
#include "client/lockctl/bench.h"
#include "client/lockctl/commands.h"

namespace lockctl {

int CmdBench(const Common& c, const BenchOptions& opts) {
  if (c.cluster_file.empty() && c.etcd.empty() && TargetOf(c).usage_error) return kExitUsage;
  return RunBench(opts, [&c](int* code) {
    BenchTarget t;
    if (c.cluster_file.empty() && c.etcd.empty()) {
      t.client = ConnectOrDie(c, code);
    } else {
      t.cluster = ConnectClusterOrDie(c, code);
    }
    return t;
  });
}

}  // namespace lockctl
