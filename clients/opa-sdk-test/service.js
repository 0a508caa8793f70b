// Test support: build `authz serve` from this repository and run it on a free loopback port,
// bounded in time.
import { execFile, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

/** The repository root: the nearest directory above this file with a go.mod. */
export function repoRoot() {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "go.mod"))) {
    const up = dirname(dir);
    if (up === dir) throw new Error("no go.mod above " + fileURLToPath(import.meta.url));
    dir = up;
  }
  return dir;
}

/** Builds authz into dir and starts `authz serve --log-json --addr 127.0.0.1:0 ARGS`. */
export async function buildAndServe(dir, args, lifetimeMs = 300_000) {
  const bin = join(dir, "authz");
  await promisify(execFile)(process.env.GO ?? "go", ["build", "-o", bin, "./cmd/authz"], { cwd: repoRoot(), timeout: 600_000 });
  return serve(bin, args, lifetimeMs);
}

/** Starts `BIN serve --log-json --addr 127.0.0.1:0 ARGS` (BIN built by buildAndServe). */
export async function serve(bin, args, lifetimeMs = 300_000) {
  const proc = spawn(bin, ["serve", "--log-json", "--addr", "127.0.0.1:0", ...args], {
    cwd: repoRoot(), stdio: ["ignore", "ignore", "pipe"], timeout: lifetimeMs, killSignal: "SIGKILL",
  });
  const exited = new Promise((res) => proc.once("exit", res));
  const log = [];
  const baseUrl = await new Promise((res, rej) => {
    const timer = setTimeout(() => rej(new Error("authz serve did not log its address within 60s:\n" + log.join("\n"))), 60_000);
    proc.once("exit", (code) => { clearTimeout(timer); rej(new Error(`authz serve exited (${code}):\n` + log.join("\n"))); });
    createInterface({ input: proc.stderr }).on("line", (line) => {
      log.push(line);
      try {
        const rec = JSON.parse(line);
        if (rec["@message"] === "listening") { clearTimeout(timer); res(`http://${rec.addr}`); }
      } catch { /* not JSON */ }
    });
  });
  return {
    baseUrl,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) { proc.kill("SIGTERM"); await exited; }
    },
  };
}
