/* What a C caller may pass the C API and C++ may not make: an int outside an enum's values
 * (c_api_cluster_test.cc). In C an enum is an integer type, and any int converts to it. */
#include "rdmalock/rdmalock.h"

const char* rdmalock_test_error_name_of(int code);
rdmalock_status_t rdmalock_test_cluster_try_lock_mode(rdmalock_cluster_t* cluster, const char* name,
                                                      int mode, rdmalock_lock_t** out);

const char* rdmalock_test_error_name_of(int code) {
  return rdmalock_error_name((rdmalock_status_t)code);
}

rdmalock_status_t rdmalock_test_cluster_try_lock_mode(rdmalock_cluster_t* cluster, const char* name,
                                                      int mode, rdmalock_lock_t** out) {
  return rdmalock_cluster_try_lock(cluster, name, (rdmalock_mode_t)mode, out);
}
