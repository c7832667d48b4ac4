"""The quick start as a user restarts it: `scripts/run.sh` started `--runs` times in this checkout
(the first one may set up .venv and the database), each timed by the client's clock from the start
of the script until `fleetd node list` shows the local node ready, then stopped with SIGTERM (as its
terminal's Ctrl-C would) and timed until it exited. Its own ports (--port, --port + 1) and the
checkout's .dev/ are used; nothing else may run scripts/run.sh here meanwhile.

    .venv/bin/python bench/quick_start.py --runs 3
"""

import argparse
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _admin_token(out_path, deadline):
    while time.monotonic() < deadline:
        for line in out_path.read_text(errors="replace").splitlines():
            if line.startswith("admin token:"):
                return line.split(":", 1)[1].strip()
        time.sleep(0.05)
    raise SystemExit(f"scripts/run.sh printed no admin token; its output is in {out_path}")


def _node_ready(url, token):
    env = dict(os.environ, FLEETD_URL=url, FLEETD_TOKEN=token)
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "fleetd"), "node", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    if done.returncode != 0:
        return False
    items = json.loads(done.stdout)
    items = items.get("items", items) if isinstance(items, dict) else items
    return any(node.get("status") == "ready" for node in items)


def one_run(port, out_path, timeout):
    url = f"http://127.0.0.1:{port}"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "FLEETD_BIND": f"127.0.0.1:{port}",
        "FLEET_AGENT_LOCAL_API_LISTEN": f"127.0.0.1:{port + 1}",
    }
    started = time.monotonic()
    with out_path.open("w") as out:
        proc = subprocess.Popen(
            ["scripts/run.sh"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = started + timeout
        token = _admin_token(out_path, deadline)
        while time.monotonic() < deadline:
            if _node_ready(url, token):
                break
            time.sleep(0.05)
        else:
            raise SystemExit(f"the local node was not ready within {timeout} s; see {out_path}")
        ready = time.monotonic() - started
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        return ready, time.monotonic() - stopping
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--port", type=int, default=18741)
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds for one start (the first may install)"
    )
    args = parser.parse_args()
    out_path = pathlib.Path(os.environ.get("TMPDIR", "/tmp")) / f"quick-start-{os.getpid()}.log"
    results = []
    for number in range(1, args.runs + 1):
        ready, stopped = one_run(args.port, out_path, args.timeout)
        results.append(
            {"run": number, "ready_seconds": round(ready, 2), "stop_seconds": round(stopped, 2)}
        )
        print(
            f"run {number}: ready after {ready:.2f} s (client clock, start to node ready); "
            f"stopped {stopped:.2f} s after SIGTERM",
            flush=True,
        )
    out_path.unlink(missing_ok=True)
    json.dump({"runs": results}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
