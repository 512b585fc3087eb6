// A node process for the default tool's runtime test (runtimes_test.py):
// keeps V8's JIT busy with allocating work that checks its own results,
// prints "ready", then answers each line "check N" on stdin with
// "sum=<sum of k*k mod 1000003 for k < N> errors=<wrong results>".
'use strict';
let errors = 0;

function work(seed) {
  const list = [];
  for (let i = 0; i < 2000; i++) list.push({ i, v: i * ((seed + i) % 7) });
  let sum = 0;
  for (const o of list) sum += o.v;
  return sum;
}

function expected(seed) {
  let sum = 0;
  for (let i = 0; i < 2000; i++) sum += i * ((seed + i) % 7);
  return sum;
}

function checksum(n) {
  const m = new Map();
  for (let k = 0; k < n; k++) m.set(k, Number((BigInt(k) * BigInt(k)) % 1000003n));
  let sum = 0;
  for (const v of m.values()) sum += v;
  return sum;
}

let seed = 0;
function busy() {
  // A slice of work, then yield to the event loop so stdin is answered.
  const until = Date.now() + 20;
  while (Date.now() < until) {
    if (work(seed) !== expected(seed)) errors++;
    seed = (seed + 1) % 1000;
  }
  setImmediate(busy);
}

let buffered = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (chunk) => {
  buffered += chunk;
  let nl;
  while ((nl = buffered.indexOf('\n')) >= 0) {
    const line = buffered.slice(0, nl);
    buffered = buffered.slice(nl + 1);
    if (line.startsWith('check ')) process.stdout.write(`sum=${checksum(parseInt(line.slice(6), 10))} errors=${errors}\n`);
  }
});
process.stdin.on('end', () => process.exit(0));
busy();
process.stdout.write('ready\n');
