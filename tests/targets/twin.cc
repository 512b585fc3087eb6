// libremora_twin_a.so and libremora_twin_b.so: two libraries whose names
// share the prefix "libremora_twin", loaded together by the twins target so
// that a lookup by that prefix is ambiguous. REMORA_TWIN_VALUE is 'a' or 'b'.
extern "C" __attribute__((visibility("default"), used, noinline)) long remora_twin_value(void) {
  return REMORA_TWIN_VALUE;
}
