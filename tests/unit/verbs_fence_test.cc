// CmId::FenceQp (common/rdma/verbs.cc) moves a QP to ERR: lockd's fence of a client whose session
// ends, before it recovers the client's locks. Its ibv_modify_qp is wrapped here (unit_tests links
// with -Wl,--wrap=ibv_modify_qp; nothing else in this binary calls it, and librdmacm's own calls
// are not wrapped) so that a test can make it fail; with no failure set it is the real call.
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cerrno>
#include <string>

#include "common/rdma/verbs.h"

extern "C" int __real_ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask);

namespace {
// The error the wrapped ibv_modify_qp returns (0: call the real one) and what it was asked.
std::atomic<int> g_modify_qp_error{0};
std::atomic<int> g_modify_qp_state{-1};
std::atomic<int> g_reported_rc{0};
std::atomic<int> g_reports{0};
}  // namespace

extern "C" int __wrap_ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  if (const int err = g_modify_qp_error.load(); err != 0) {
    g_modify_qp_state.store(attr->qp_state);
    return err;
  }
  return __real_ibv_modify_qp(qp, attr, attr_mask);
}

using namespace rdmalock;

// FenceQp ignored what ibv_modify_qp returned: a fence that failed left the QP able to execute
// the client's work requests while lockd went on to recover its locks as if fenced, and nothing
// said so (listed by an earlier review, left until 2026-12-07). It is reported and returned now.
TEST_CASE("verbs: a fence that fails is reported and returned, not ignored") {
  rdma::SetTeardownReporter([](const char*, int rc) {
    g_reported_rc.store(rc);
    g_reports.fetch_add(1);
  });
  // A cm_id and QP that only carry the pointer FenceQp reads; the wrapped call never reaches a
  // device.
  rdma_cm_id fake_id{};
  ibv_qp fake_qp{};
  fake_id.qp = &fake_qp;
  rdma::CmId id(&fake_id);
  g_modify_qp_error.store(EIO);
  const Status st = id.FenceQp();
  g_modify_qp_error.store(0);
  (void)id.release();  // not a real id: nothing to destroy
  rdma::SetTeardownReporter(nullptr);
  INFO("FenceQp: " << st.ToString() << "; reports " << g_reports.load() << ", rc "
                   << g_reported_rc.load());
  CHECK(g_modify_qp_state.load() == IBV_QPS_ERR);
  CHECK(g_reports.load() == 1);
  CHECK(g_reported_rc.load() == EIO);
  CHECK_FALSE(st.ok());
  CHECK_THAT(st.message(), Catch::Contains("ibv_modify_qp") && Catch::Contains("ERR"));
}
