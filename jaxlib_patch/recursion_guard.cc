// The C stack left to this thread, for RecursionGuard.

#include "jaxlib_patch/recursion_guard.h"

#include <pthread.h>

#include <algorithm>

namespace jaxlib_patch {

uintptr_t RecursionGuard::StackLimit() {
  // Computed once per thread. A quarter of the stack (at least 64 KiB, at
  // most half of a small stack) is kept free for the Python code that
  // flatten functions run at the deepest level.
  static thread_local uintptr_t limit = [] {
    pthread_attr_t attr;
    void* base = nullptr;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return uintptr_t{0};
    pthread_attr_getstack(&attr, &base, &size);
    pthread_attr_destroy(&attr);
    const size_t reserve =
        std::min<size_t>(std::max<size_t>(size / 4, 64 << 10), size / 2);
    return reinterpret_cast<uintptr_t>(base) + reserve;
  }();
  return limit;
}

}  // namespace jaxlib_patch
