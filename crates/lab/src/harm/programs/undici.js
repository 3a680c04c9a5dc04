// One column of a harm row, as a Node app calls with undici: each call of the plan
// (stdin: "seq at_ms path" a line) sent once at its instant, HARM_START_MS (wall clock)
// plus at_ms; through `EnvHttpProxyAgent` when `http_proxy` is set (it sends CONNECT
// host:80 even for http://), else through a plain `Agent`. A line a call on stdout:
// "seq status ok latency_us attempts outcome" ("-" for no outcome).
const { Agent, EnvHttpProxyAgent, request } = require('undici');

const plan = require('fs')
  .readFileSync(0, 'utf8')
  .split('\n')
  .filter((l) => l.trim() !== '')
  .map((l) => {
    const [seq, at, path] = l.trim().split(' ');
    return { seq: Number(seq), at: Number(at), path };
  });
const base = process.env.HARM_BASE;
const column = process.env.HARM_COLUMN;
const start = Number(process.env.HARM_START_MS);
const patience = Number(process.env.HARM_PATIENCE_MS);
const dispatcher = process.env.http_proxy ? new EnvHttpProxyAgent() : new Agent();

function one(call) {
  const began = process.hrtime.bigint();
  const line = (status, ok, headers) => {
    const us = (process.hrtime.bigint() - began) / 1000n;
    const h = headers || {};
    const attempts = Number(h['x-tollgate-attempts'] || 0) || 0;
    const outcome = h['x-tollgate-outcome'] || '-';
    return `${call.seq} ${status} ${ok ? 1 : 0} ${us} ${attempts} ${outcome}`;
  };
  return request(base + call.path, {
    dispatcher,
    headers: { 'x-harm-column': column, 'x-harm-seq': String(call.seq) },
    signal: AbortSignal.timeout(patience),
  }).then(
    async (r) => {
      try {
        await r.body.text();
        return line(r.statusCode, r.statusCode === 200, r.headers);
      } catch (e) {
        return line(r.statusCode, false, r.headers);
      }
    },
    () => line(0, false, null),
  );
}

const calls = plan.map(
  (call) =>
    new Promise((resolve) => {
      setTimeout(() => one(call).then(resolve), Math.max(0, start + call.at - Date.now()));
    }),
);
Promise.all(calls).then(async (lines) => {
  process.stdout.write(lines.join('\n') + '\n');
  await dispatcher.close().catch(() => {});
  process.exit(0);
});
