// Symbol visibility of librdmalock: the library is built with hidden visibility, and only what is
// marked RDMALOCK_EXPORT (the public API in client.h and status.h) is exported.
#pragma once

#define RDMALOCK_EXPORT [[gnu::visibility("default")]]
