// Finding a library's image in another process (remote/lookup.h) when the
// controller has cached images of that file already: a cached image is taken
// for the mapped one only when its own Build ID note is where the mapping
// puts it; any other build of the file is refused and the image is
// identified from the process's memory as on a first lookup.
#include "remote/lookup.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "elf/elf_image.h"
#include "procfs/procfs.h"

namespace remora::test {
namespace {

using elf::ElfImage;
using elf::ImageCache;

// A forked copy of this test, blocked on a pipe until the test ends: its
// libc is mapped where ours is. Killed and reaped however the test ends.
class ForkedCopy {
 public:
  ForkedCopy() {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(fds[1]);
      char b;
      (void)!::read(fds[0], &b, 1);  // EOF: the test is over
      ::_exit(0);
    }
    ::close(fds[0]);
    hold_ = fds[1];
  }
  ~ForkedCopy() {
    if (hold_ >= 0) ::close(hold_);
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int hold_ = -1;
};

std::shared_ptr<const ElfImage> own_executable() {
  int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  auto image = ElfImage::from_fd(fd);
  ::close(fd);
  return image ? *image : nullptr;
}

TEST(Lookup, ACachedImageIsTakenOnlyWhenItsBuildIdIsTheMappedOne) {
  ForkedCopy child;
  ASSERT_GT(child.pid(), 0);
  auto mem = remote::Memory::open(child.pid());
  ASSERT_TRUE(mem) << mem.error().to_string();
  auto maps = procfs::read_maps(child.pid());
  ASSERT_TRUE(maps) << maps.error().to_string();
  auto libc = remote::find_library(child.pid(), *maps, "libc.so.6");
  ASSERT_TRUE(libc) << libc.error().to_string();
  const auto want = reinterpret_cast<uint64_t>(::dlsym(RTLD_DEFAULT, "getpid"));
  ASSERT_NE(want, 0u);

  // Another build cached under libc's device and inode (a file rewritten in
  // place keeps both): this test's own executable, which has a Build ID of
  // its own.
  ImageCache& cache = ImageCache::global();
  cache.clear();
  auto other = own_executable();
  ASSERT_TRUE(other);
  ASSERT_FALSE(other->build_id().empty()) << "the test executable was linked without a Build ID";
  ASSERT_TRUE(cache.get_or_load({libc->dev, libc->inode, other->build_id_hex()},
                                [&]() -> Result<std::shared_ptr<const ElfImage>> { return other; }));
  ASSERT_EQ(cache.with_build_id(libc->dev, libc->inode).size(), 1u);

  auto first = remote::load_image(child.pid(), *libc, *mem, {});
  ASSERT_TRUE(first) << first.error().to_string();
  EXPECT_NE(first->image, other) << "another build of the file was taken for the mapped image";
  ASSERT_FALSE(first->image->build_id().empty());
  auto sym = first->image->find_symbol("getpid");
  ASSERT_TRUE(sym);
  EXPECT_EQ(first->bias + sym->value, want);
  EXPECT_EQ(cache.loads(), 2u);  // the other build, then libc itself from the process's view

  // Now both are cached: libc's is taken (its note is where the mapping
  // puts it), nothing is loaded again, and the bias is the same.
  ASSERT_EQ(cache.with_build_id(libc->dev, libc->inode).size(), 2u);
  auto again = remote::load_image(child.pid(), *libc, *mem, {});
  ASSERT_TRUE(again) << again.error().to_string();
  EXPECT_EQ(again->image, first->image);
  EXPECT_EQ(again->bias, first->bias);
  EXPECT_EQ(again->route, remote::OpenRoute::kCache);
  EXPECT_EQ(cache.loads(), 2u);
  cache.clear();
}

}  // namespace
}  // namespace remora::test
