// The process the symboliser tests look at. argv[1]: the library to load
// (one build of sym_fixture_lib.cc). It prints, as the default tool would
// hand them over:
//   result N                      what the library computed (run(3))
//   mark inline|noinline 0xADDR   the marker addresses (sym_fixture_lib.cc)
//   thread_stack 0xA 0xB ...      backtrace() of a worker thread: return
//                                 addresses into start_thread and clone3
//   module 0xBIAS BUILDID|- PATH  every loaded object (dl_iterate_phdr)
//   ready
// then keeps the worker blocked and waits for EOF on stdin.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int printed = 0;
static int block_fds[2];

static void* worker(void* arg) {
  (void)arg;
  void* frames[32];
  int n = backtrace(frames, 32);
  pthread_mutex_lock(&lock);
  printf("thread_stack");
  for (int i = 0; i < n; ++i) printf(" %p", frames[i]);
  printf("\n");
  fflush(stdout);
  printed = 1;
  pthread_cond_signal(&cond);
  pthread_mutex_unlock(&lock);
  char c;
  while (read(block_fds[0], &c, 1) < 0) {
  }
  return NULL;
}

static void print_build_id(const struct dl_phdr_info* info) {
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_NOTE) continue;
    const char* p = (const char*)(info->dlpi_addr + ph->p_vaddr);
    const char* end = p + ph->p_memsz;
    while (p + sizeof(ElfW(Nhdr)) <= end) {
      const ElfW(Nhdr)* nh = (const ElfW(Nhdr)*)p;
      const char* name = p + sizeof *nh;
      const unsigned char* desc = (const unsigned char*)(name + ((nh->n_namesz + 3) & ~3u));
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && memcmp(name, "GNU", 4) == 0) {
        for (unsigned k = 0; k < nh->n_descsz; ++k) printf("%02x", desc[k]);
        return;
      }
      p = (const char*)desc + ((nh->n_descsz + 3) & ~3u);
    }
  }
  printf("-");
}

static int print_module(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size;
  (void)data;
  const char* name = info->dlpi_name;
  char exe[4096];
  if (name == NULL || name[0] == '\0') {
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return 0;
    exe[n] = '\0';
    name = exe;
  }
  printf("module %#lx ", (unsigned long)info->dlpi_addr);
  print_build_id(info);
  printf(" %s\n", name);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s LIBRARY\n", argv[0]);
    return 2;
  }
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (lib == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
    return 2;
  }
  int (*run)(int) = (int (*)(int))dlsym(lib, "symfx_run");
  void* const* mark_inline = (void* const*)dlsym(lib, "symfx_mark_inline");
  void* const* mark_noinline = (void* const*)dlsym(lib, "symfx_mark_noinline");
  if (run == NULL || mark_inline == NULL || mark_noinline == NULL) {
    fprintf(stderr, "%s lacks the fixture's symbols\n", argv[1]);
    return 2;
  }
  printf("result %d\n", run(3));
  printf("mark inline %p\n", *mark_inline);
  printf("mark noinline %p\n", *mark_noinline);
  fflush(stdout);
  if (pipe(block_fds) != 0) return 2;
  pthread_t t;
  if (pthread_create(&t, NULL, worker, NULL) != 0) return 2;
  pthread_mutex_lock(&lock);
  while (!printed) pthread_cond_wait(&cond, &lock);
  pthread_mutex_unlock(&lock);
  dl_iterate_phdr(print_module, NULL);
  printf("ready\n");
  fflush(stdout);
  char buf[256];
  while (read(0, buf, sizeof buf) > 0) {
  }
  return 0;
}
