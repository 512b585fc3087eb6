/* remora_mpi_ranks: a real MPI program for the end-to-end test of
 * `remora attach --slurm JOBID` (tests/slurm). Knows nothing about Remora.
 *
 *   remora_mpi_ranks [--ready-dir DIR] [--stop-file FILE] [--standalone] [--max-seconds N]
 *
 * Every rank spends most of its time in a hot function of its own, named by
 * its rank: rank_work_<rank % 8>, so a profile of rank R that shows
 * rank_work_R proves the profiler looked at the right process. Each
 * iteration is one quantum of that work (about 5 ms of CPU), then, in MPI
 * mode, an allreduce of the per-iteration checksums, an allreduce (MAX) of
 * rank 0's stop decision and a ring exchange of the checksums with the
 * neighbours.
 *
 * --ready-dir DIR   each rank creates DIR/ready.<rank> (holding its pid) once
 *                   it is in its steady loop, after its first collective.
 * --stop-file FILE  rank 0 looks for FILE every iteration; when it exists all
 *                   ranks stop at the same iteration (the allreduce above).
 * --standalone      no MPI at all: rank from SLURM_PROCID, size from
 *                   SLURM_NTASKS, each rank looks for the stop file itself.
 *                   For fault tests, where killing one rank must not end the
 *                   others.
 * --max-seconds N   safety limit (default 300): stop with exit status 2 and a
 *                   message on stderr if the stop file never appeared.
 *
 * The work is deterministic: iteration i of rank r works on the seed
 * seed(r, i % kSeedCycle), and every rank computes the kSeedCycle expected
 * checksums of its own seeds before its loop, i.e. before anything can attach
 * to it. Every iteration's checksum is compared with its expectation (a
 * profiler that corrupts registers or memory shows up here), and at the end
 * rank 0 compares the allreduced total and the ring's total with the sum of
 * what every rank says it should have contributed (closed form over the
 * cycle). Output, on stdout, nothing but:
 *
 *   MPI mode, rank 0:   mpi_ranks: ok ranks=N iterations=I checksum=X
 *   standalone, each:   mpi_ranks: ok rank=R ranks=N iterations=I checksum=X
 *
 * (X: 16 hex digits) and exit status 0; or one line "mpi_ranks: FAILED ..."
 * and exit status 1. Diagnostics go to stderr. Exit status 2: the
 * --max-seconds limit; 64: bad usage. */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { kSeedCycle = 8, kWorkFunctions = 8, kExitUsage = 64, kExitTimeout = 2 };

/* noclone as well as noinline: a constprop clone would be called
 * rank_work_N.constprop.0 and the profile would not name rank_work_N. */
#if defined(__clang__)
#define HOT __attribute__((noinline, used))
#else
#define HOT __attribute__((noinline, noclone, used))
#endif

static uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static uint64_t double_bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof u);
  return u;
}

/* ---- the hot functions: one per rank (mod 8), each different code ------ */
/* The loop counts are sized for about 5 ms on one core of the machines this runs
 * on; the functions are extern (and the program linked -rdynamic) so that
 * both the symbol table and the dynamic symbol table name them. */

/* Alternating harmonic series from a seed-dependent offset: FP division. */
HOT uint64_t rank_work_0(uint64_t seed) {
  double x = 1.0 + (double)(seed & 0xffff) / 65536.0;
  double acc = 0.0;
  for (int i = 0; i < 3600000; ++i) acc += ((i & 1) ? -1.0 : 1.0) / (x + i);
  return double_bits(acc) ^ seed;
}

/* xorshift64* chain: integer shifts and multiplies. */
HOT uint64_t rank_work_1(uint64_t seed) {
  uint64_t x = seed | 1, acc = 0;
  for (int i = 0; i < 2300000; ++i) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    acc += x * 0x2545f4914f6cdd1dULL;
  }
  return acc;
}

/* Logistic map in its chaotic regime: dependent FP multiplies. */
HOT uint64_t rank_work_2(uint64_t seed) {
  double x = 0.1 + (double)(seed % 1000) / 10000.0, acc = 0.0;
  for (int i = 0; i < 1650000; ++i) {
    x = 3.99 * x * (1.0 - x);
    acc += x;
  }
  return double_bits(acc) ^ double_bits(x);
}

/* Collatz step counts of consecutive numbers: data-dependent branches. */
HOT uint64_t rank_work_3(uint64_t seed) {
  uint64_t start = (seed % 1000000) + 1, steps = 0;
  for (uint64_t n = start; n < start + 20000; ++n) {
    uint64_t v = n;
    while (v != 1) {
      v = (v & 1) ? 3 * v + 1 : v / 2;
      ++steps;
    }
  }
  return steps * 0x9e3779b97f4a7c15ULL ^ seed;
}

/* Repeated 8x8 matrix products, reduced mod 1 to stay bounded. */
HOT uint64_t rank_work_4(uint64_t seed) {
  double a[8][8], b[8][8], c[8][8];
  uint64_t s = seed;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      s = splitmix64(s);
      a[i][j] = (double)(s >> 11) / 9007199254740992.0;
      b[i][j] = (double)((s * 31) >> 11) / 9007199254740992.0;
    }
  for (int round = 0; round < 15000; ++round) {
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) {
        double sum = 0.0;
        for (int k = 0; k < 8; ++k) sum += a[i][k] * b[k][j];
        c[i][j] = sum - (double)(int64_t)sum; /* keep [0,1): a decaying matrix turns subnormal, 200x slower */
      }
    memcpy(a, c, sizeof a);
  }
  uint64_t acc = 0;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) acc = acc * 31 + double_bits(a[i][j]);
  return acc;
}

/* FNV-1a over a seed-filled buffer, one pass per round. */
HOT uint64_t rank_work_5(uint64_t seed) {
  unsigned char buf[4096];
  uint64_t s = seed;
  for (size_t i = 0; i < sizeof buf; i += 8) {
    s = splitmix64(s);
    memcpy(buf + i, &s, 8);
  }
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int round = 0; round < 900; ++round) {
    for (size_t i = 0; i < sizeof buf; ++i) {
      h ^= buf[i];
      h *= 0x100000001b3ULL;
    }
    buf[round % sizeof buf] ^= (unsigned char)h;
  }
  return h;
}

/* Euclid's gcd of pseudo-random pairs: integer division. */
HOT uint64_t rank_work_6(uint64_t seed) {
  uint64_t x = seed, acc = 0;
  for (int i = 0; i < 28000; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t a = (x >> 16) | 1, b = (x * 2862933555777941757ULL >> 20) | 1;
    while (b != 0) {
      uint64_t t = a % b;
      a = b;
      b = t;
    }
    acc += a;
  }
  return acc ^ x;
}

/* Newton's square roots of consecutive numbers: FP division and compares. */
HOT uint64_t rank_work_7(uint64_t seed) {
  double base = 2.0 + (double)(seed % 100000), acc = 0.0;
  for (int i = 0; i < 280000; ++i) {
    double v = base + i, r = v;
    for (int k = 0; k < 12; ++k) r = 0.5 * (r + v / r);
    acc += r;
  }
  return double_bits(acc);
}

typedef uint64_t (*WorkFn)(uint64_t);
static const WorkFn kWork[kWorkFunctions] = {rank_work_0, rank_work_1, rank_work_2, rank_work_3,
                                             rank_work_4, rank_work_5, rank_work_6, rank_work_7};

/* ---- options, clocks, files -------------------------------------------- */

typedef struct {
  const char* ready_dir;
  const char* stop_file;
  int standalone;
  long max_seconds;
} Options;

static int parse_options(int argc, char** argv, Options* o) {
  static const struct option kLong[] = {{"ready-dir", required_argument, NULL, 'r'},
                                        {"stop-file", required_argument, NULL, 's'},
                                        {"standalone", no_argument, NULL, 'a'},
                                        {"max-seconds", required_argument, NULL, 'm'},
                                        {NULL, 0, NULL, 0}};
  *o = (Options){NULL, NULL, 0, 300};
  int c;
  while ((c = getopt_long(argc, argv, "", kLong, NULL)) != -1) {
    switch (c) {
      case 'r': o->ready_dir = optarg; break;
      case 's': o->stop_file = optarg; break;
      case 'a': o->standalone = 1; break;
      case 'm': o->max_seconds = strtol(optarg, NULL, 10); break;
      default: return -1;
    }
  }
  if (optind != argc || o->max_seconds <= 0) return -1;
  return 0;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Written to a temporary name and renamed, so a test polling for the file
 * never reads it half-written. Failure is reported but not fatal: the test
 * that waits for the file will say it never came. */
static void write_ready_file(const char* dir, int rank) {
  if (!dir) return;
  char path[4096], tmp[4200];
  snprintf(path, sizeof path, "%s/ready.%d", dir, rank);
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  FILE* f = fopen(tmp, "w");
  if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0 || rename(tmp, path) != 0)
    fprintf(stderr, "mpi_ranks: rank %d: cannot write %s: %s (is --ready-dir writable on this node?)\n", rank,
            path, strerror(errno));
}

static int stop_file_exists(const char* path) { return path && access(path, F_OK) == 0; }

/* ---- the deterministic expectation ------------------------------------- */

static uint64_t seed_for(int rank, int slot) {
  return splitmix64(((uint64_t)rank << 32) ^ (uint64_t)slot ^ 0x52454d4f5241ULL);
}

/* What iterations 0..iterations-1 of this rank add up to: slot k of the
 * cycle is used iterations/kSeedCycle times, plus once more if k falls in
 * the remainder. Arithmetic mod 2^64, as the sums themselves. */
static uint64_t expected_total(const uint64_t expected[kSeedCycle], uint64_t iterations) {
  uint64_t total = 0;
  for (uint64_t k = 0; k < kSeedCycle; ++k) {
    uint64_t uses = iterations / kSeedCycle + (k < iterations % kSeedCycle ? 1 : 0);
    total += uses * expected[k];
  }
  return total;
}

typedef struct {
  int rank, size;
  WorkFn work;
  uint64_t expected[kSeedCycle];
  uint64_t iterations, local_sum, mismatches, first_bad_iteration;
} RankState;

static void init_rank(RankState* st, int rank, int size) {
  memset(st, 0, sizeof *st);
  st->rank = rank;
  st->size = size;
  st->work = kWork[rank % kWorkFunctions];
  for (int k = 0; k < kSeedCycle; ++k) st->expected[k] = st->work(seed_for(rank, k));
}

/* One quantum of hot work, checked against its expectation. */
static uint64_t work_once(RankState* st) {
  int slot = (int)(st->iterations % kSeedCycle);
  uint64_t got = st->work(seed_for(st->rank, slot));
  if (got != st->expected[slot] && st->mismatches++ == 0) st->first_bad_iteration = st->iterations;
  st->local_sum += got;
  return got;
}

/* ---- standalone mode: no MPI ------------------------------------------- */

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}

static int run_standalone(const Options* o) {
  RankState st;
  init_rank(&st, env_int("SLURM_PROCID", 0), env_int("SLURM_NTASKS", 1));
  double deadline = now_seconds() + (double)o->max_seconds;
  for (;;) {
    work_once(&st);
    if (++st.iterations == 1) write_ready_file(o->ready_dir, st.rank);
    if (stop_file_exists(o->stop_file)) break;
    if (now_seconds() > deadline) {
      fprintf(stderr, "mpi_ranks: rank %d: the stop file %s did not appear within %ld s (--max-seconds)\n",
              st.rank, o->stop_file ? o->stop_file : "(none given)", o->max_seconds);
      return kExitTimeout;
    }
  }
  uint64_t want = expected_total(st.expected, st.iterations);
  if (st.mismatches || st.local_sum != want) {
    printf("mpi_ranks: FAILED rank=%d iterations=%" PRIu64 " mismatches=%" PRIu64 " first_bad=%" PRIu64
           " checksum=%016" PRIx64 " expected=%016" PRIx64 "\n",
           st.rank, st.iterations, st.mismatches, st.first_bad_iteration, st.local_sum, want);
    return 1;
  }
  printf("mpi_ranks: ok rank=%d ranks=%d iterations=%" PRIu64 " checksum=%016" PRIx64 "\n", st.rank, st.size,
         st.iterations, st.local_sum);
  return 0;
}

/* ---- MPI mode ---------------------------------------------------------- */

/* Waits for requests by testing them with short sleeps in between. MPICH's
 * blocking calls busy-poll, and with 4 ranks on 2 cores a rank spinning in
 * MPI_Wait takes the CPU that the rank it waits for needs: progress crawls.
 * Sleeping 100 us between tests costs little against a quantum of
 * milliseconds and leaves the hot function as the place the rank spends
 * its time. */
enum { kRequests = 4 };

static int wait_all_yielding(MPI_Request requests[kRequests]) {
  static const struct timespec kNap = {0, 100 * 1000};
  /* Real statuses, not MPI_STATUSES_IGNORE: GCC 12 takes that (MPI_Status*)1
   * for an empty array and warns (-Wstringop-overflow). */
  MPI_Status statuses[kRequests];
  int done = 0;
  for (;;) {
    int rc = MPI_Testall(kRequests, requests, &done, statuses);
    if (rc != MPI_SUCCESS || done) return rc;
    nanosleep(&kNap, NULL);
  }
}

enum { kContinue = 0, kStop = 1, kTimedOut = 2 };

typedef struct {
  uint64_t total;    /* sum over iterations of the allreduced checksums */
  uint64_t ring_sum; /* sum of the checksums received from the left neighbour */
} Collected;

/* One iteration's communication: the checksum allreduce, rank 0's decision
 * shared by an allreduce (MAX), and the ring exchange. Returns the decision. */
static int communicate(const RankState* st, uint64_t local, int decision, Collected* c) {
  uint64_t sum = 0, from_left = 0;
  int shared = kContinue;
  int right = (st->rank + 1) % st->size, left = (st->rank + st->size - 1) % st->size;
  MPI_Request r[kRequests];
  MPI_Iallreduce(&local, &sum, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD, &r[0]);
  MPI_Iallreduce(&decision, &shared, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &r[1]);
  MPI_Irecv(&from_left, 1, MPI_UINT64_T, left, 7, MPI_COMM_WORLD, &r[2]);
  MPI_Isend(&local, 1, MPI_UINT64_T, right, 7, MPI_COMM_WORLD, &r[3]);
  if (wait_all_yielding(r) != MPI_SUCCESS) MPI_Abort(MPI_COMM_WORLD, 1);
  c->total += sum;
  c->ring_sum += from_left;
  return shared;
}

static int rank0_decision(const Options* o, double deadline) {
  if (stop_file_exists(o->stop_file)) return kStop;
  return now_seconds() > deadline ? kTimedOut : kContinue;
}

/* Rank 0 compares what was collected with what every rank says it should
 * have contributed; the verdict is broadcast so all ranks exit alike. */
static int verify_mpi(const RankState* st, const Collected* c) {
  uint64_t mine[2] = {expected_total(st->expected, st->iterations), st->mismatches};
  uint64_t sums[2] = {0, 0}, ring = 0;
  MPI_Reduce(mine, sums, 2, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&c->ring_sum, &ring, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  if (st->mismatches)
    fprintf(stderr,
            "mpi_ranks: rank %d: %" PRIu64 " iterations computed a wrong checksum, the first %" PRIu64 "\n",
            st->rank, st->mismatches, st->first_bad_iteration);
  int ok = 1;
  if (st->rank == 0) {
    ok = sums[1] == 0 && c->total == sums[0] && ring == sums[0];
    if (ok)
      printf("mpi_ranks: ok ranks=%d iterations=%" PRIu64 " checksum=%016" PRIx64 "\n", st->size,
             st->iterations, c->total);
    else
      printf("mpi_ranks: FAILED ranks=%d iterations=%" PRIu64 " mismatches=%" PRIu64 " checksum=%016" PRIx64
             " expected=%016" PRIx64 " ring=%016" PRIx64 "\n",
             st->size, st->iterations, sums[1], c->total, sums[0], ring);
    fflush(stdout);
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok ? 0 : 1;
}

static int run_mpi(int* argc, char*** argv, const Options* o) {
  MPI_Init(argc, argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  RankState st;
  init_rank(&st, rank, size);
  Collected c = {0, 0};
  double deadline = now_seconds() + (double)o->max_seconds;
  int decision = kContinue;
  while (decision == kContinue) {
    uint64_t local = work_once(&st);
    decision = communicate(&st, local, rank == 0 ? rank0_decision(o, deadline) : kContinue, &c);
    if (++st.iterations == 1) write_ready_file(o->ready_dir, rank);
  }
  int status;
  if (decision == kTimedOut) {
    if (rank == 0)
      fprintf(stderr, "mpi_ranks: the stop file %s did not appear within %ld s (--max-seconds)\n",
              o->stop_file ? o->stop_file : "(none given)", o->max_seconds);
    status = kExitTimeout;
  } else {
    status = verify_mpi(&st, &c);
  }
  MPI_Finalize();
  return status;
}

int main(int argc, char** argv) {
  Options o;
  if (parse_options(argc, argv, &o) != 0) {
    fprintf(stderr, "usage: %s [--ready-dir DIR] [--stop-file FILE] [--standalone] [--max-seconds N>0]\n",
            argv[0]);
    return kExitUsage;
  }
  return o.standalone ? run_standalone(&o) : run_mpi(&argc, &argv, &o);
}
