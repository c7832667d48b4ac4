"""Wall time of `fleetd bootstrap` for 1 host and for N hosts (default 8) in one run.

    sudo .venv/bin/python bench/bootstrap.py [--hosts 8] [--bundle dist/fleet-agent-bundle-X.tar.gz]

Needs root and the SSH test-host tools (iproute2, util-linux, openssh-server,
docker-systemctl-replacement): it makes 1 + N test hosts (network namespaces with their own
sshd, see tests/provision/hosts.py), starts fleetd on their bridge, then times a first
bootstrap of 1 host and of the N others with --parallel N, and a second, idempotent run of
each. Prints a table and writes bench/results/bootstrap.json. Target (issue 7): N hosts take
under twice as long as 1 (parallelism, not serial SSH).

The test hosts share this machine's cores with fleetd and the controller, so the CPU work that
real hosts do on their own CPUs (pip unpacking the wheels, starting the agent) queues here;
the CPU columns (busy CPU seconds of the whole machine, that over wall time x cores, and the
CPU of the `fleetd bootstrap` process itself) show how much of the N-host run was bound by that.
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from fleetd.provision.bundle import build_bundle, read_bundle  # noqa: E402
from tests.integration.conftest import fleetd_init  # noqa: E402
from tests.provision.conftest import FAST, FLEET, Api, BoundFleetd, Lab, missing_tools  # noqa: E402
from tests.provision.hosts import SshLab  # noqa: E402

SHAPES = ("h100_x8", "l4_x4", "a100_mig_x2")


def busy_seconds():
    """CPU seconds this machine spent busy so far (all cores; /proc/stat)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed_bootstrap(lab, bundle, hosts, verbose=False):
    """Run `fleetd bootstrap --json` on hosts; (seconds, busy CPU seconds, rows, exit code)."""
    args = lab.bootstrap_args(bundle, *hosts, extra=["--parallel", str(len(hosts))])
    busy = busy_seconds()
    own = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    result = lab.fleetd_cli(*args, timeout=900)
    seconds = time.monotonic() - start
    busy = busy_seconds() - busy
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    controller = (after.ru_utime + after.ru_stime) - (own.ru_utime + own.ru_stime)
    if verbose:
        sys.stderr.write(result.stderr)
    try:
        rows = json.loads(result.stdout)
    except ValueError:
        raise SystemExit(
            f"fleetd bootstrap printed no JSON (exit {result.returncode}):\n{result.stderr[-3000:]}"
        )
    return seconds, busy, controller, rows, result.returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=8, help="N, the size of the parallel run")
    parser.add_argument("--bundle", help="a built bundle (default: build one from this checkout)")
    parser.add_argument("--verbose", action="store_true", help="show each host's progress lines")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "bootstrap.json"))
    args = parser.parse_args()
    why = missing_tools()
    if why:
        raise SystemExit(f"cannot make test hosts: {why}")

    with tempfile.TemporaryDirectory(prefix="bench-bootstrap-") as tmp:
        tmp = Path(tmp)
        bundle = (
            read_bundle(args.bundle) if args.bundle else build_bundle(tmp / "bundle", source=ROOT)
        )
        ssh_lab = SshLab(tmp / "lab")
        fleetd = None
        try:
            ssh_lab.open()
            (ssh_lab.root / "home").mkdir()
            hosts = ssh_lab.add_hosts([SHAPES[i % len(SHAPES)] for i in range(args.hosts + 1)])
            data_dir = tmp / "fleetd-data"
            token = fleetd_init(data_dir)
            fleetd = BoundFleetd(data_dir, ssh_lab.gateway, FAST).start()
            api = Api(fleetd.url, token)
            api("POST", "/api/v1/fleets", expect=201, json={"name": FLEET})
            lab = Lab(ssh_lab, fleetd, api)

            runs = []
            for label, group in (("1 host", hosts[:1]), (f"{args.hosts} hosts", hosts[1:])):
                for kind in ("first run", "second run (no change)"):
                    seconds, busy, controller, rows, code = timed_bootstrap(
                        lab, bundle, group, args.verbose
                    )
                    results = sorted({r["result"] for r in rows})
                    runs.append(
                        {
                            "hosts": len(group),
                            "label": label,
                            "run": kind,
                            "seconds": round(seconds, 2),
                            "cpu_busy_seconds": round(busy, 1),
                            "controller_cpu_seconds": round(controller, 1),
                            "cpu_utilisation": round(busy / (seconds * os.cpu_count()), 2),
                            "exit_code": code,
                            "results": results,
                        }
                    )
                    if code != 0:
                        failed = [
                            f"{r['host']}: {r['reason']}" for r in rows if r["result"] == "failed"
                        ]
                        raise SystemExit("bootstrap failed:\n" + "\n".join(failed))
        finally:
            if fleetd is not None:
                fleetd.kill()
            ssh_lab.close()

    first = {r["hosts"]: r["seconds"] for r in runs if r["run"] == "first run"}
    again = {r["hosts"]: r["seconds"] for r in runs if r["run"] != "first run"}
    ratio = first[args.hosts] / first[1]
    print(
        f"{'hosts':>5}  {'run':<24} {'seconds':>8} {'CPU busy s':>10} {'CPU use':>8} "
        f"{'bootstrap CPU s':>15}"
        "  results"
    )
    for r in runs:
        print(
            f"{r['hosts']:>5}  {r['run']:<24} {r['seconds']:>8.2f} {r['cpu_busy_seconds']:>10.1f} "
            f"{r['cpu_utilisation']:>7.0%} {r['controller_cpu_seconds']:>15.1f}  "
            f"{', '.join(r['results'])}"
        )
    print(
        f"ratio {args.hosts} hosts / 1 host: first run {ratio:.2f}, second run "
        f"{again[args.hosts] / again[1]:.2f} (target < 2)"
    )
    report = {
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "bundle_version": bundle.version,
        "runs": runs,
        "ratio_first_run": round(ratio, 2),
        "ratio_second_run": round(again[args.hosts] / again[1], 2),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if ratio < 2 else 1


if __name__ == "__main__":
    sys.exit(main())
