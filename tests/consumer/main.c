/* A C11 program built against the installed C API (rdmalock/rdmalock.h), the way a C user's
 * project would: a name's slot, and a connect that must be refused for a missing server (no RDMA
 * needed). */
#include <rdmalock/rdmalock.h>
#include <stdio.h>
#include <string.h>

int main(void) {
  rdmalock_options_t o;
  rdmalock_client_t* c = NULL;
  rdmalock_options_init(&o);
  const rdmalock_status_t st = rdmalock_connect(&o, &c);
  if (st != RDMALOCK_ERR_INVALID_ARGUMENT || c != NULL ||
      strstr(rdmalock_last_error(), "server") == NULL) {
    printf("unexpected: %s: %s\n", rdmalock_error_name(st), rdmalock_last_error());
    return 1;
  }
  printf("C consumer ok: librdmalock %s, slot %llu; %s: %s\n", rdmalock_version(),
         (unsigned long long)rdmalock_slot_for_name("orders/42", 65536), rdmalock_error_name(st),
         rdmalock_last_error());
  return 0;
}
