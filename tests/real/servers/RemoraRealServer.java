// A CPU-bound HTTP server for real_programs_test.py (com.sun.net.httpserver):
// GET /work?n=N answers sum(k*k % 1000003 for k < N), on two worker threads.
// Its JIT code is named by the JVM's perf map (jcmd PID Compiler.perfmap,
// which remora asks for when it renders). Listens on 127.0.0.1, a port the
// kernel picks, and prints "ready PORT" once it accepts.
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.concurrent.Executors;

public class RemoraRealServer {
  static long work(long n) {
    long s = 0;
    for (long k = 0; k < n; k++) s += (k * k) % 1000003;
    return s;
  }

  static void handle(HttpExchange ex) throws IOException {
    String query = ex.getRequestURI().getQuery();
    if (!ex.getRequestURI().getPath().equals("/work") || query == null || !query.startsWith("n=")) {
      ex.sendResponseHeaders(404, -1);
      ex.close();
      return;
    }
    byte[] body = (work(Long.parseLong(query.substring(2))) + "\n").getBytes(StandardCharsets.US_ASCII);
    ex.sendResponseHeaders(200, body.length);
    try (OutputStream out = ex.getResponseBody()) {
      out.write(body);
    }
  }

  public static void main(String[] args) throws IOException {
    HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 64);
    server.createContext("/", RemoraRealServer::handle);
    server.setExecutor(Executors.newFixedThreadPool(2));
    server.start();
    System.out.println("ready " + server.getAddress().getPort());
    System.out.flush();
  }
}
