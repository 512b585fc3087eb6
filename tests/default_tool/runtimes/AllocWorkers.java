// A JVM for the default tool's runtime test (runtimes_test.py): 8 threads
// allocating and checking their own results, so that samples land in JIT
// code, the interpreter and the GC. Prints "ready" once every worker has
// run, then answers each line "check N" on stdin with
// "sum=<sum of k*k mod 1000003 for k < N> errors=<wrong worker results>".
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

public class AllocWorkers {
  static final AtomicLong errors = new AtomicLong();

  static long work(int seed) {
    ArrayList<long[]> list = new ArrayList<>();
    long sum = 0;
    for (int i = 0; i < 2000; i++) {
      long[] a = new long[16 + (i + seed) % 16];
      for (int j = 0; j < a.length; j++) a[j] = (long) i * j;
      list.add(a);
    }
    for (long[] a : list) sum += a[a.length - 1];
    return sum;
  }

  static long expected(int seed) {
    long sum = 0;
    for (int i = 0; i < 2000; i++) sum += (long) i * (16 + (i + seed) % 16 - 1);
    return sum;
  }

  static long checksum(int n) {
    HashMap<Integer, Long> map = new HashMap<>();
    for (int k = 0; k < n; k++) map.put(k, ((long) k * k) % 1000003L);
    long sum = 0;
    for (long v : map.values()) sum += v;
    return sum;
  }

  public static void main(String[] args) throws Exception {
    CountDownLatch started = new CountDownLatch(8);
    for (int t = 0; t < 8; t++) {
      final int seed = t;
      Thread w = new Thread(() -> {
        boolean first = true;
        while (true) {
          if (work(seed) != expected(seed)) errors.incrementAndGet();
          if (first) {
            started.countDown();
            first = false;
          }
        }
      }, "alloc-" + t);
      w.setDaemon(true);
      w.start();
    }
    started.await();
    System.out.println("ready");
    System.out.flush();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
    for (String line; (line = in.readLine()) != null;) {
      if (line.startsWith("check ")) {
        int n = Integer.parseInt(line.substring(6).trim());
        System.out.println("sum=" + checksum(n) + " errors=" + errors.get());
        System.out.flush();
      }
    }
  }
}
