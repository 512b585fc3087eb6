// Fixture shared library for elf_test: exported, hidden and file-local
// functions, a data object, an IFUNC and an undefined reference, built with
// several hash styles and build-id settings (see ../CMakeLists.txt).
#include <string.h>

int remora_fixture_data = 5;
static int remora_fixture_counter;

// File-local: only in .symtab.
__attribute__((noinline, used)) static int remora_fixture_local_helper(int x) {
  return x * 3 + remora_fixture_counter++;
}

// Hidden visibility: only in .symtab.
__attribute__((visibility("hidden"), noinline, used)) int remora_fixture_hidden(void) { return 7; }

int remora_fixture_add(int a, int b) {
  return a + b + remora_fixture_local_helper(0) * 0 + remora_fixture_hidden() * 0;
}
int remora_fixture_answer(void) { return 42; }

// An undefined reference to libc: strlen is UND in .dynsym.
size_t remora_fixture_strlen(const char* s) { return strlen(s); }

static int remora_fixture_ifunc_impl(void) { return 9; }
static void* remora_fixture_ifunc_resolver(void) { return (void*)remora_fixture_ifunc_impl; }
int remora_fixture_ifunc(void) __attribute__((ifunc("remora_fixture_ifunc_resolver")));

// Enough exported names that hash buckets hold chains longer than one.
#define F(n) \
  int remora_fixture_f##n(void) { return n; }
#define F8(n) F(n##0) F(n##1) F(n##2) F(n##3) F(n##4) F(n##5) F(n##6) F(n##7)
F8(1) F8(2) F8(3) F8(4) F8(5) F8(6) F8(7) F8(8)
