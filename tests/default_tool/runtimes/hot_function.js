// A node process for names_test.py: one named JS function does nearly all
// the work, so that its JIT code (named only by node's perf map, with
// --perf-basic-prof) is the profile's hottest frame. The event loop calls
// it (setImmediate), so V8 cannot inline it into a caller. Prints "ready"
// once it has run long enough to be compiled; exits when stdin closes.
'use strict';
let total = 0;

function remoraHotJsFunction(ms) {
  const until = Date.now() + ms;
  let s = 0;
  while (Date.now() < until)
    for (let i = 0; i < 20000; i++) s = (s + i * i) % 1000003;
  total += s;
  setImmediate(remoraHotJsFunction, 20);
}

process.stdin.on('data', () => {});
process.stdin.on('end', () => process.exit(0));
remoraHotJsFunction(300);  // warm-up: V8 compiles the loop within it
process.stdout.write('ready\n');
