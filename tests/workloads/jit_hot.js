// jit_hot.js: a hot JavaScript function for Node's JIT, for the tests of
// JIT symbols (perf maps with --perf-basic-prof, jitdump with --perf-prof).
// Runs for SECONDS of wall time (argv[2], default 2), then prints a number.
//
// Expected leaf frames: ddprofHotLoop, called from ddprofOuter (named by
// V8 as `JS:*ddprofHotLoop …` once optimized).
function ddprofHotLoop(n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s = (s * 31 + i) % 1000003;
  }
  return s;
}

function ddprofOuter(seconds) {
  let total = 0;
  const end = Date.now() + seconds * 1000;
  while (Date.now() < end) {
    total += ddprofHotLoop(100000);
  }
  return total;
}

console.log(ddprofOuter(Number(process.argv[2] || 2)));
