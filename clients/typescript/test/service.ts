// Test support: build `authz serve` from this repository and run it on a free loopback port or a
// unix socket, bounded in time.
import { spawn, execFile, type ChildProcess } from "node:child_process";
import * as http from "node:http";
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";
import { promisify } from "node:util";

/** The repository root: the nearest directory above this file with a go.mod. */
export function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "go.mod"))) {
    const up = dirname(dir);
    if (up === dir) throw new Error("no go.mod above " + fileURLToPath(import.meta.url));
    dir = up;
  }
  return dir;
}

/** Builds the authz binary into dir (go build -o), and returns its path. */
export async function buildAuthz(dir: string): Promise<string> {
  const out = join(dir, "authz");
  const go = process.env["GO"] ?? "go";
  await promisify(execFile)(go, ["build", "-o", out, "./cmd/authz"], { cwd: repoRoot(), timeout: 600_000 });
  return out;
}

export interface Service {
  /** The base URL for the client: http://127.0.0.1:PORT or unix:///path. */
  baseUrl: string;
  /** The service log so far (stderr, JSON lines). */
  log: string[];
  /** The service's process id. */
  pid: number;
  stop(): Promise<void>;
  /** Sends signal to the service and resolves once it has exited. */
  kill(signal: NodeJS.Signals): Promise<void>;
}

/**
 * Starts `authz serve --log-json ARGS` (add --addr) and resolves once it logs the address it
 * listens on. The process is killed after lifetimeMs whatever happens.
 */
export async function startServe(bin: string, args: string[], lifetimeMs = 300_000): Promise<Service> {
  const proc: ChildProcess = spawn(bin, ["serve", "--log-json", ...args], {
    cwd: repoRoot(),
    stdio: ["ignore", "ignore", "pipe"],
    timeout: lifetimeMs,
    killSignal: "SIGKILL",
  });
  const log: string[] = [];
  const exited = new Promise<void>((res) => proc.once("exit", () => res()));
  const baseUrl = await new Promise<string>((res, rej) => {
    const timer = setTimeout(() => rej(new Error("authz serve did not log its address within 60s:\n" + log.join("\n"))), 60_000);
    proc.once("exit", (code) => {
      clearTimeout(timer);
      rej(new Error(`authz serve exited (${code}) before listening:\n` + log.join("\n")));
    });
    createInterface({ input: proc.stderr! }).on("line", (line) => {
      log.push(line);
      try {
        const rec = JSON.parse(line) as Record<string, unknown>;
        if (rec["@message"] === "listening" && typeof rec["addr"] === "string") {
          clearTimeout(timer);
          const addr = rec["addr"];
          res(addr.startsWith("unix://") ? addr : `http://${addr}`);
        }
      } catch {
        // not a JSON line: keep it in the log
      }
    });
  });
  return {
    baseUrl,
    log,
    pid: proc.pid!,
    async kill(signal: NodeJS.Signals) {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill(signal);
        await exited;
      }
    },
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGTERM");
        await exited;
      }
    },
  };
}

/** Waits until GET /health/ready answers 200 (the plugins have started); http:// or unix://. */
export async function waitReady(baseUrl: string, timeoutMs = 60_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if ((await getStatus(baseUrl, "/health/ready")) === 200) return;
    if (Date.now() > deadline) throw new Error(`${baseUrl} not ready within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function getStatus(baseUrl: string, path: string): Promise<number> {
  const where: http.RequestOptions = baseUrl.startsWith("unix://")
    ? { socketPath: baseUrl.slice("unix://".length) }
    : { host: new URL(baseUrl).hostname, port: Number(new URL(baseUrl).port) };
  return new Promise((res) => {
    const req = http.get({ ...where, path, timeout: 2000 }, (r) => {
      r.resume();
      res(r.statusCode ?? 0);
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => res(0));
  });
}
