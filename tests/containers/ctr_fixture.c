// The fixture library loaded by the container's target. Built several ways
// (tests/containers/CMakeLists.txt):
//   CTR_VALUE  what ctr_value() returns (4242 in build A, 7 in build B);
//   CTR_SWAP   swaps the two functions' places, so that ctr_value's offset in
//              one layout is ctr_decoy's offset in the other. A controller
//              that read the wrong file would call ctr_decoy (666) instead of
//              failing silently with the right-looking value.
#ifndef CTR_VALUE
#error "CTR_VALUE must be defined"
#endif

#define CTR_EXPORT __attribute__((visibility("default"), noinline, used))

#ifdef CTR_SWAP
CTR_EXPORT int ctr_decoy(void) { return 666; }
CTR_EXPORT int ctr_value(void) { return CTR_VALUE; }
#else
CTR_EXPORT int ctr_value(void) { return CTR_VALUE; }
CTR_EXPORT int ctr_decoy(void) { return 666; }
#endif
