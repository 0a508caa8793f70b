// watchDuplexGrant against a live `authz serve` built from this repository, with the example
// driver as a real plugin process: the grant ends, once, when the driver's worker is killed,
// when the service stops, and when the service is killed.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { AuthzGateError, watchDuplexGrant, type Decision, type GateRequest } from "../src/index.js";
import { buildAuthz, repoRoot, startServe, waitReady, type Service } from "./service.js";

let work: string;
let bin: string;
let grant: GateRequest;

before(async () => {
  work = await mkdtemp(join(tmpdir(), "authz-watch-"));
  bin = await buildAuthz(work);
  grant = JSON.parse(await readFile(join(repoRoot(), "examples", "grant.json"), "utf8")) as GateRequest;
}, { timeout: 600_000 });

after(async () => {
  if (work) await rm(work, { recursive: true, force: true });
});

/** A service with the example driver on a free loopback port, ready. */
async function service(): Promise<Service> {
  const s = await startServe(bin, ["--addr", "127.0.0.1:0"]);
  await waitReady(s.baseUrl);
  return s;
}

/** The pid of the example driver's worker, from GET /v1/plugins. */
async function workerPid(baseUrl: string): Promise<number> {
  const res = await fetch(baseUrl + "/v1/plugins", { signal: AbortSignal.timeout(10_000) });
  const body = (await res.json()) as { plugins: { worker?: { pid: number } }[] };
  const pid = body.plugins[0]?.worker?.pid;
  assert.ok(pid && pid > 0, "the example driver has a worker");
  return pid;
}

/** Opens a watch on the example grant; ended resolves with what onRevoke was called with. */
async function watch(baseUrl: string): Promise<{ ended: Promise<Decision | AuthzGateError>; calls: () => number }> {
  let calls = 0;
  let resolve!: (v: Decision | AuthzGateError) => void;
  const ended = new Promise<Decision | AuthzGateError>((r) => (resolve = r));
  const g = await watchDuplexGrant(grant, {
    baseUrl,
    onRevoke: (end) => {
      calls++;
      resolve(end);
    },
  });
  assert.equal(g.allow, true);
  assert.equal(g.capabilities.duplexCommandStream, true);
  assert.match(g.watchId, /^[0-9a-f-]{36}$/);
  return { ended, calls: () => calls };
}

function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise<T>((_, rej) => (timer = setTimeout(() => rej(new Error(`${what}: not within ${ms} ms`)), ms))),
  ]);
}

test("a killed worker revokes the grant: onRevoke gets the deny, once", { timeout: 120_000 }, async () => {
  const s = await service();
  try {
    const w = await watch(s.baseUrl);
    process.kill(await workerPid(s.baseUrl), "SIGKILL");
    const end = await within(w.ended, 10_000, "the revoke");
    assert.ok(!(end instanceof AuthzGateError), `a deny document, got ${String(end)}`);
    assert.equal(end.allow, false);
    assert.equal(end.code, "DUPLEX_CHANNEL_CAPABILITY_DENIED");
    assert.equal(end.message, "Sandbox lease does not grant the duplex command stream capability.");
    assert.ok(end.reasons.includes("worker_not_running"), `reasons ${end.reasons.join(",")}`);
    await new Promise((r) => setTimeout(r, 200)); // nothing more may come: a second call would count
    assert.equal(w.calls(), 1);
  } finally {
    await s.stop();
  }
});

test("a service that stops revokes the grant with service_stopping", { timeout: 120_000 }, async () => {
  const s = await service();
  try {
    const w = await watch(s.baseUrl);
    const stopped = s.kill("SIGTERM");
    const end = await within(w.ended, 20_000, "the revoke");
    assert.ok(!(end instanceof AuthzGateError), `a deny document, got ${String(end)}`);
    assert.equal(end.allow, false);
    assert.deepEqual(end.reasons, ["service_stopping"]);
    await within(stopped, 30_000, "the service's exit");
    assert.equal(w.calls(), 1);
  } finally {
    await s.stop();
  }
});

test("a killed service ends the grant: onRevoke gets AUTHZ_UNREACHABLE, once", { timeout: 120_000 }, async () => {
  const s = await service();
  try {
    const w = await watch(s.baseUrl);
    await s.kill("SIGKILL");
    const end = await within(w.ended, 10_000, "the end of the grant");
    assert.ok(end instanceof AuthzGateError, `an error, got ${JSON.stringify(end)}`);
    assert.equal(end.code, "AUTHZ_UNREACHABLE");
    assert.equal(w.calls(), 1);
  } finally {
    await s.stop();
  }
});
