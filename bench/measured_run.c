/* The harness's measured runs (count_instructions.py): callgrind collects
 * only between the toggles and dumps after each run. Client requests, not
 * callgrind's --toggle-collect by function name: the libraries under
 * measurement call libc's sorts too, and callgrind does not resolve every
 * function name. Outside valgrind the requests do nothing. */
#include <valgrind/callgrind.h>

void jaxlib_patch_measured_run(void (*run)(void)) {
  CALLGRIND_TOGGLE_COLLECT;
  run();
  CALLGRIND_TOGGLE_COLLECT;
  CALLGRIND_DUMP_STATS;
}
