/* Built against an installed hixl by test_install.sh, with pkg-config and with CMake. */
#include <hixl/hixl.h>
#include <stdio.h>

int main(void) {
  HixlEngine *e;
  if (HixlEngineCreate(&e) != HIXL_SUCCESS) return 1;
  HixlStatus st = HixlEngineInitialize(e, "127.0.0.1", NULL, 0);
  printf("hixl %s: Initialize -> %s\n", HixlVersionString(), HixlStatusName(st));
  HixlEngineDestroy(e);
  return st == HIXL_SUCCESS ? 0 : 1;
}
