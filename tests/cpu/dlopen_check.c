/* Loads libflame.so by path with dlopen (no link-time dependency on it), as the Rust and C#
 * bindings do, and checks on a machine without a usable driver (the test sets
 * FLAME_CUDA_DRIVER_PATH to a missing file) that:
 *  - the library loads with RTLD_NOW (every symbol it needs resolves without libcuda),
 *  - flame_abi_version() matches the header and flame_version_string() the version macros,
 *  - flame_ctx_create() returns FLAME_ERROR_NO_DRIVER or FLAME_ERROR_NO_DEVICE, sets the context
 *    to NULL and leaves a message that names the function.
 * Usage: flame_dlopen_check /path/to/libflame.so */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include "flame.h"

typedef int32_t (*abi_fn)(void);
typedef const char* (*str_fn)(void);
typedef const char* (*status_str_fn)(flame_status_t);
typedef flame_status_t (*create_fn)(const flame_ctx_options_t*, flame_ctx_t*);

int main(int argc, char** argv) {
  void* lib;
  abi_fn abi;
  str_fn version, last_error;
  status_str_fn status_string;
  create_fn create;
  flame_ctx_t ctx = (flame_ctx_t)&argc; /* garbage that must be overwritten with NULL */
  flame_status_t st;
  char expected[64];
  if (argc != 2) {
    fprintf(stderr, "usage: %s /path/to/libflame.so\n", argv[0]);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "FAIL: dlopen(%s): %s\n", argv[1], dlerror());
    return 1;
  }
  /* ISO C forbids converting void* to function pointers; POSIX guarantees it works. */
  *(void**)(&abi) = dlsym(lib, "flame_abi_version");
  *(void**)(&version) = dlsym(lib, "flame_version_string");
  *(void**)(&last_error) = dlsym(lib, "flame_last_error_message");
  *(void**)(&status_string) = dlsym(lib, "flame_status_string");
  *(void**)(&create) = dlsym(lib, "flame_ctx_create");
  if (!abi || !version || !last_error || !status_string || !create) {
    fprintf(stderr, "FAIL: a flame_* symbol is missing from %s\n", argv[1]);
    return 1;
  }
  if (abi() != FLAME_ABI_VERSION) {
    fprintf(stderr, "FAIL: flame_abi_version() = %d, header says %d\n", (int)abi(), FLAME_ABI_VERSION);
    return 1;
  }
  snprintf(expected, sizeof expected, "%d.%d.%d", FLAME_VERSION_MAJOR, FLAME_VERSION_MINOR, FLAME_VERSION_PATCH);
  if (strcmp(version(), expected) != 0) {
    fprintf(stderr, "FAIL: flame_version_string() = %s, header says %s\n", version(), expected);
    return 1;
  }
  st = create(NULL, &ctx);
  if (st != FLAME_ERROR_NO_DRIVER && st != FLAME_ERROR_NO_DEVICE) {
    fprintf(stderr, "FAIL: flame_ctx_create without a driver returned %s (%s)\n", status_string(st), last_error());
    return 1;
  }
  if (ctx != NULL) {
    fprintf(stderr, "FAIL: flame_ctx_create failed but did not set *ctx to NULL\n");
    return 1;
  }
  if (!strstr(last_error(), "flame_ctx_create")) {
    fprintf(stderr, "FAIL: the message does not name flame_ctx_create: \"%s\"\n", last_error());
    return 1;
  }
  printf("ok: %s loaded with dlopen; version %s, ABI %d; flame_ctx_create -> %s: %s\n", argv[1], version(),
         (int)abi(), status_string(st), last_error());
  dlclose(lib);
  return 0;
}
