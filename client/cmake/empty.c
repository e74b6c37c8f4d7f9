/* empty.c: libkcache.so is kc_client, kc_gpu and kc_schema whole; CMake
 * wants one source for a library target. */
typedef int kc_shared_empty_unit;
