// A JVM whose threads stand in every state a remote call may find one in,
// for real_programs_test.py --program java-calls: running Java code (JIT
// compiled loops, with safepoint polls), allocating (so the GC runs and arms
// safepoints often), blocked on a monitor, parked, sleeping, waiting on a
// condition, recursing deep into its stack, and blocked in native code
// (accept). Its own load checks itself: every loop recomputes a sum whose
// value it knows. Listens on 127.0.0.1, prints "ready PORT"; a connection
// gets "ok loops=N bad=M" and is closed.
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

public class RemoraThreadZoo {
  static final AtomicLong loops = new AtomicLong();
  static final AtomicLong bad = new AtomicLong();
  static final Object monitor = new Object();
  static final Object condition = new Object();
  static volatile Object sink;

  static long sum(int n) {
    long s = 0;
    for (int k = 0; k < n; k++) s += (long) k * k % 1000003;
    return s;
  }

  static int depth(int n) {
    return n == 0 ? 0 : 1 + depth(n - 1);
  }

  static void daemon(String name, Runnable r) {
    Thread t = new Thread(r, name);
    t.setDaemon(true);
    t.start();
  }

  public static void main(String[] args) throws Exception {
    final long expected = sum(20000);
    for (int i = 0; i < 2; i++)
      daemon("zoo-compute-" + i, () -> {
        for (;;) {
          if (sum(20000) != expected) bad.incrementAndGet();
          loops.incrementAndGet();
        }
      });
    for (int i = 0; i < 2; i++)
      daemon("zoo-alloc-" + i, () -> {
        for (;;) {
          byte[] b = new byte[64 * 1024];
          b[b.length - 1] = 1;
          sink = b;
          if (b[b.length - 1] != 1) bad.incrementAndGet();
        }
      });
    daemon("zoo-recurse", () -> {
      for (;;)
        if (depth(3000) != 3000) bad.incrementAndGet();
    });
    synchronized (monitor) {
      for (int i = 0; i < 2; i++)
        daemon("zoo-blocked-" + i, () -> {
          synchronized (monitor) {
            sink = monitor;
          }
        });
      daemon("zoo-parked", () -> {
        for (;;) LockSupport.park();
      });
      daemon("zoo-sleeping", () -> {
        for (;;) {
          try {
            Thread.sleep(3_600_000);
          } catch (InterruptedException e) {
            bad.incrementAndGet();
          }
        }
      });
      daemon("zoo-waiting", () -> {
        synchronized (condition) {
          for (;;) {
            try {
              condition.wait();
            } catch (InterruptedException e) {
              bad.incrementAndGet();
            }
          }
        }
      });
      // The main thread holds the monitor for good and serves reports,
      // blocked in accept (native code) in between.
      ServerSocket server = new ServerSocket(0, 8, InetAddress.getLoopbackAddress());
      System.out.println("ready " + server.getLocalPort());
      System.out.flush();
      for (;;) {
        try (Socket s = server.accept(); OutputStream out = s.getOutputStream()) {
          out.write(("ok loops=" + loops.get() + " bad=" + bad.get() + "\n").getBytes(StandardCharsets.US_ASCII));
        }
      }
    }
  }
}
