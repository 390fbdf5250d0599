/* A downstream C program of the installed flashserve::c (libflashserve_c.so, flashserve/c_api.h):
 * prints the library's version and refuses a malformed call with the status and message the header
 * promises. */
#include <stdio.h>
#include <string.h>

#include "flashserve/c_api.h"

int main(void) {
  fs_attention_params p;
  fs_attention_params_init(&p);
  /* No q: the library must say so rather than run. */
  if (fs_attention_forward(&p) != FS_ERROR_INVALID_ARGUMENT || strlen(fs_last_error()) == 0) {
    fprintf(stderr, "an empty call was not refused: '%s'\n", fs_last_error());
    return 1;
  }
  printf("flashserve %s (ABI %d), C API: ok\n", fs_version(), fs_abi_version());
  return 0;
}
