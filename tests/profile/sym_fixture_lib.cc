// The library the symboliser tests name addresses in: an inline chain
// (leaf_inl inlined into mid_inl inlined into outer) and a noinline
// function, built -O2 -g. Each place a test looks up carries a marker: a
// nop whose address the library exports in a data word (symfx_mark_*), so
// that no extra code symbol sits inside the functions. The "// @name"
// comments mark the lines the tests expect; they read them from this file.
//
// Built twice: the main build, and with SYMFX_ALT (another build ID, the
// noinline function renamed) for the replaced-file and container cases.

#ifdef SYMFX_ALT
#define SYMFX_NOINLINE noinline_fn_alt
#else
#define SYMFX_NOINLINE noinline_fn
#endif

// A nop here; its address in the exported data word `sym`.
#define SYMFX_MARK(sym)                    \
  __asm__ volatile(                        \
      "%=:\n\tnop\n\t"                     \
      ".pushsection .data.rel.local." #sym \
      ",\"aw\"\n\t"                        \
      ".globl " #sym                       \
      "\n\t"                               \
      ".type " #sym                        \
      ", @object\n\t"                      \
      ".size " #sym                        \
      ", 8\n\t"                            \
      ".p2align 3\n" #sym                  \
      ":\n\t"                              \
      ".quad %=b\n\t"                      \
      ".popsection" ::                     \
          : "memory")

namespace fx {

// Code of the function's own before each marker: so the nop lies inside
// the function's (and the inlined instance's) range, not at an entry
// address that several line rows and inline scopes start at.
#define SYMFX_OWN_CODE(x) \
  x ^= 0x55;              \
  __asm__ volatile("" : "+r"(x))

static inline __attribute__((always_inline)) int leaf_inl(int x) {
  SYMFX_OWN_CODE(x);
  SYMFX_MARK(symfx_mark_inline);  // @leaf
  return x * 7 + 1;
}

static inline __attribute__((always_inline)) int mid_inl(int x) {
  return leaf_inl(x + 2) * 3;  // @mid
}

__attribute__((noinline, noclone)) int outer(int x) {
  SYMFX_OWN_CODE(x);
  return mid_inl(x) - 5;  // @outer
}

__attribute__((noinline, noclone)) int SYMFX_NOINLINE(int x) {
  SYMFX_OWN_CODE(x);
  SYMFX_MARK(symfx_mark_noinline);  // @noinline
  return x + 11;
}

}  // namespace fx

extern "C" int symfx_run(int x) { return fx::outer(x) + fx::SYMFX_NOINLINE(x); }
