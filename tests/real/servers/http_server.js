// A CPU-bound HTTP server for real_programs_test.py, run by node with
// --perf-basic-prof: GET /work?n=N answers sum(k*k % 1000003 for k < N).
// The JIT code of remoraRealWork is named only by node's perf map. Listens on
// 127.0.0.1, a port the kernel picks, and prints "ready PORT" once it accepts.
'use strict';
const http = require('http');

function remoraRealWork(n) {
  let s = 0;
  for (let k = 0; k < n; k++) s += (k * k) % 1000003;
  return s;
}

function remoraRealHandle(req, res) {
  const url = new URL(req.url, 'http://localhost');
  const n = Number(url.searchParams.get('n'));
  if (url.pathname !== '/work' || !Number.isInteger(n)) {
    res.writeHead(404);
    res.end();
    return;
  }
  const body = remoraRealWork(n) + '\n';
  res.writeHead(200, {'Content-Length': Buffer.byteLength(body)});
  res.end(body);
}

const server = http.createServer(remoraRealHandle);
server.listen(0, '127.0.0.1', () => {
  process.stdout.write('ready ' + server.address().port + '\n');
});
