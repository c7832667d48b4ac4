#!/usr/bin/env python3
"""People at scale: what a request's credential check costs, the listings and the cluster status
with 10,000 users and 1,000 projects, and how soon a deactivation holds on every replica.

  1. On SQLite (the default), a real `fleetd serve`: fleetd's own tables get --users users (signed
     in with a provider) and --projects projects with --members members each, in bulk before the
     server starts; through the API, --nodes simulated nodes (8 GPUs each, never lost) and --jobs
     jobs of --submitters users spread over the projects, as many running as the GPUs hold, the
     rest queued. Then, from this process (the server's client, its own clock):
     - the credential check: GET /api/v1/whoami with an API token, and with a workload's JWT of a
       `jwt` provider whose keys (JWKS) this process serves on 127.0.0.1 (fetched once, then held);
       beside it, the check alone in this process (fleetd.auth.resolve_token over the same
       database), per call;
     - GET /api/v1/users (a page of 100, and of 1,000), GET /api/v1/projects (the same),
       GET /api/v1/users/{login} and GET /api/v1/cluster/status.
  2. On PostgreSQL, two `fleetd serve` replicas of one database: a user's token answers on replica
     B; the user is deactivated through replica A (PATCH /api/v1/users/{login}), and replica B is
     asked again at once and then every 5 ms until it refuses the token: the time from sending the
     PATCH to B's first 401, --rounds times.
Prints a table and writes JSON to bench/results/identity.json.

    .venv/bin/python bench/identity.py --users 10000 --projects 1000 --members 10 --nodes 100 \\
        --jobs 1000 --submitters 200 --requests 300 --rounds 10
"""

import argparse
import datetime as dt
import http.server
import json
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time

import requests
from joserfc import jwt
from joserfc.jwk import RSAKey

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.control_plane import percentile  # noqa: E402
from bench.replicas import Postgres, Replica, fleetd_init  # noqa: E402

ISSUER = "https://ci.bench.example"


def _insert(model, rows):
    for start in range(0, len(rows), 500):
        model.insert_many(rows[start : start + 500]).on_conflict_ignore().execute()


def seed(db_url, users, projects, members):
    """Users, projects and memberships straight into fleetd's tables (made by `fleetd init`)."""
    from fleetd.db import bind, open_database
    from fleetd.models import Project, ProjectMember, User

    db = bind(open_database(db_url, "OFF"))
    now = dt.datetime(2026, 12, 1)
    with db.connection_context(), db.atomic():
        rows = [
            dict(
                key=f"p{i:04d}",
                name=f"project {i}",
                display_name=f"Project {i}",
                team=f"team{i % 50:02d}",
                description="",
                created_at=now,
            )
            for i in range(projects)
        ]
        _insert(Project, rows)
        rows = [
            dict(
                id=f"u{i:031d}",
                login=f"user{i:05d}",
                display_name=f"User {i}",
                email=f"user{i}@lab.example",
                active=True,
                role="member",
                team=f"team{(i % projects) % 50:02d}",
                default_project=f"p{i % projects:04d}",
                source="oidc",
                provider="lab",
                subject=f"sub-{i}",
                groups=json.dumps(["ml"]),
                created_at=now,
            )
            for i in range(users)
        ]
        _insert(User, rows)
        rows = [
            dict(
                project=f"p{p:04d}",
                user_id=f"u{(p + k * projects) % users:031d}",
                role="admin" if k == 0 else "member",
                bound=True,
            )
            for p in range(projects)
            for k in range(members)
        ]
        _insert(ProjectMember, rows)
    db.close()


class Jwks(http.server.BaseHTTPRequestHandler):
    body = b"{}"

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def serve_jwks(key):
    Jwks.body = json.dumps({"keys": [key.as_dict(private=False)]}).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/jwks"


def workload_jwt(key, subject):
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": "fleetd",
        "sub": subject,
        "preferred_username": subject,
        "groups": ["ml"],
        "iat": now,
        "exp": now + 3600,
    }
    return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key)


def timed(session, method, url, count, **kw):
    """Latencies (s) of `count` calls, each answered 200 (the first call is not counted: it warms
    the connection and any cache)."""
    session.request(method, url, timeout=60, **kw).raise_for_status()
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        resp = session.request(method, url, timeout=60, **kw)
        out.append(time.perf_counter() - t0)
        if resp.status_code != 200:
            raise SystemExit(f"{method} {url}: {resp.status_code} {resp.text[:300]}")
    return out


def summary(latencies):
    return {
        "count": len(latencies),
        "p50_ms": round(percentile(latencies, 0.5), 3),
        "p99_ms": round(percentile(latencies, 0.99), 3),
        "max_ms": round(max(latencies) * 1000, 3),
    }


def in_process_checks(db_url, tokens, count):
    """The credential check alone, per call (µs), in this process over the same database."""
    from fleetd.auth import resolve_token
    from fleetd.db import bind, open_database
    from fleetd.runtime import Runtime
    from fleetd.settings import Settings

    db = bind(open_database(db_url))
    rt = Runtime.build(Settings.load(environ={"FLEETD_DB_URL": db_url}))
    out = {}
    with db.connection_context():
        for name, token in tokens.items():
            resolve_token(token, dt.datetime.utcnow(), rt=rt)  # warm: keys fetched, user made
            t0 = time.perf_counter()
            for _ in range(count):
                resolve_token(token, dt.datetime.utcnow(), rt=rt)
            out[name] = round((time.perf_counter() - t0) / count * 1e6, 1)
    db.close()
    return out


def sqlite_phase(args):
    data = tempfile.mkdtemp(prefix="fleetd-bench-identity-")
    db_url = f"sqlite:///{data}/fleetd.db"
    env = dict(
        os.environ,
        FLEETD_DATA_DIR=data,
        FLEETD_DB_URL=db_url,
        FLEETD_NODE_TTL_SECONDS="86400",
        FLEETD_TASK_LEASE_SECONDS="86400",
    )
    admin = fleetd_init(env)
    t0 = time.perf_counter()
    seed(db_url, args.users, args.projects, args.members)
    seeded = time.perf_counter() - t0
    server = Replica(env).start()
    key = RSAKey.generate_key(2048, parameters={"kid": "bench"})
    jwks, jwks_url = serve_jwks(key)
    try:
        url = server.url
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {admin}"
        http.post(url + "/api/v1/fleets", json={"name": "bench"}, timeout=30).raise_for_status()
        http.put(
            url + "/api/v1/auth/providers/lab",
            json={"kind": "oidc", "issuer": "https://idp.bench.example", "client_id": "fleetd"},
            timeout=30,
        ).raise_for_status()
        http.put(
            url + "/api/v1/auth/providers/ci",
            json={"kind": "jwt", "issuer": ISSUER, "audience": "fleetd", "jwks_url": jwks_url},
            timeout=30,
        ).raise_for_status()
        rules = [
            {"provider": p, "claim": "groups", "contains": "ml", "role": "member", "team": "ml"}
            for p in ("lab", "ci")
        ]
        rules[1]["projects"] = [{"project": "p0000", "role": "member"}]
        http.put(url + "/api/v1/auth/bindings", json=rules, timeout=30).raise_for_status()
        join = http.post(url + "/api/v1/fleets/bench/join-tokens", json={}, timeout=30).json()
        gpu = {"model": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * 2**30}
        for i in range(args.nodes):
            body = {
                "hostname": f"sim-{i}",
                "machine_id": f"sim-{i}",
                "agent_version": "bench",
                "address": "127.0.0.1",
                "resources": {"cpu_count": 64, "memory_bytes": 2**39},
                "gpus": [dict(gpu, uuid=f"GPU-{i}-{k}", index=k) for k in range(8)],
            }
            headers = {"Authorization": f"Bearer {join['token']}", "X-Fleet-Protocol": "1"}
            reg = requests.post(url + "/api/v1/agent/register", json=body, headers=headers)
            reg.raise_for_status()
            headers["Authorization"] = f"Bearer {reg.json()['session_token']}"
            requests.post(
                url + "/api/v1/agent/heartbeat", json={"tasks": []}, headers=headers, timeout=30
            ).raise_for_status()
        tokens = []
        for i in range(args.submitters):
            made = http.post(
                url + "/api/v1/tokens",
                json={"name": f"cli {i}", "role": "member", "user": f"user{i:05d}"},
                timeout=30,
            )
            made.raise_for_status()
            tokens.append(made.json()["token"])
        for n in range(args.jobs):
            i = n % args.submitters
            resp = requests.post(
                url + "/api/v1/jobs",
                json={
                    "name": f"train-{n}",
                    "command": ["sleep", "3600"],
                    "resources": {"gpus": 1},
                    "project": f"p{i % args.projects:04d}",
                },
                headers={"Authorization": f"Bearer {tokens[i]}"},
                timeout=60,
            )
            if resp.status_code != 201:
                raise SystemExit(f"submit: {resp.status_code} {resp.text[:300]}")
        status = http.get(url + "/api/v1/cluster/status", timeout=60).json()
        results = {
            "users": args.users,
            "projects": args.projects,
            "members_per_project": args.members,
            "nodes": args.nodes,
            "jobs": args.jobs,
            "active_jobs_listed": len(status.get("active_jobs") or []),
            "seed_seconds": round(seeded, 2),
        }
        user = requests.Session()
        user.headers["Authorization"] = f"Bearer {tokens[0]}"
        workload = requests.Session()
        workload.headers["Authorization"] = f"Bearer {workload_jwt(key, 'ci-runner')}"
        n = args.requests
        calls = {
            "whoami, API token": timed(user, "GET", url + "/api/v1/whoami", n),
            "whoami, workload JWT": timed(workload, "GET", url + "/api/v1/whoami", n),
            "users, page of 100": timed(http, "GET", url + "/api/v1/users?limit=100", n),
            "users, page of 1000": timed(http, "GET", url + "/api/v1/users?limit=1000", n // 3),
            "user by login": timed(
                http, "GET", url + f"/api/v1/users/user{args.users // 2:05d}", n
            ),
            "projects, page of 100": timed(http, "GET", url + "/api/v1/projects?limit=100", n),
            "projects, page of 1000": timed(
                http, "GET", url + "/api/v1/projects?limit=1000", n // 3
            ),
            "projects, a member's": timed(user, "GET", url + "/api/v1/projects", n),
            "cluster status": timed(http, "GET", url + "/api/v1/cluster/status", n // 3),
        }
        results["client"] = {name: summary(values) for name, values in calls.items()}
        results["check_in_process_us"] = in_process_checks(
            db_url,
            {"API token": tokens[0], "workload JWT": workload_jwt(key, "ci-runner")},
            2000,
        )
        return results
    finally:
        server.stop()
        jwks.shutdown()


def deactivation_phase(args):
    pg = Postgres()
    replicas = []
    try:
        env = dict(os.environ, FLEETD_DB_URL=pg.database(), FLEETD_DATA_DIR=tempfile.mkdtemp())
        admin = fleetd_init(env)
        replicas = [Replica(env).start(), Replica(env).start()]
        a, b = replicas[0].url, replicas[1].url
        http = requests.Session()
        http.headers["Authorization"] = f"Bearer {admin}"
        rounds = []
        for r in range(args.rounds):
            login = f"leaver{r}"
            made = http.post(
                a + "/api/v1/tokens",
                json={"name": f"{login} cli", "role": "member", "user": login},
                timeout=30,
            )
            made.raise_for_status()
            user = requests.Session()
            user.headers["Authorization"] = f"Bearer {made.json()['token']}"
            user.get(b + "/api/v1/whoami", timeout=30).raise_for_status()
            t0 = time.perf_counter()
            patched = http.patch(a + f"/api/v1/users/{login}", json={"active": False}, timeout=30)
            answered = time.perf_counter() - t0
            patched.raise_for_status()
            deadline = time.monotonic() + 10
            while True:
                status = user.get(b + "/api/v1/whoami", timeout=30).status_code
                if status == 401:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"replica B still accepts {login}'s token after 10 s")
                time.sleep(0.005)
            rounds.append(
                {
                    "patch_answered_s": round(answered, 4),
                    "refused_on_b_s": round(time.perf_counter() - t0, 4),
                }
            )
        return {
            "rounds": rounds,
            "refused_on_b_s": {
                "median": statistics.median(x["refused_on_b_s"] for x in rounds),
                "max": max(x["refused_on_b_s"] for x in rounds),
            },
        }
    finally:
        for replica in replicas:
            replica.stop()
        pg.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--projects", type=int, default=1_000)
    parser.add_argument("--members", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1_000)
    parser.add_argument("--submitters", type=int, default=200)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--skip-replicas", action="store_true")
    args = parser.parse_args()
    results = {"sqlite": sqlite_phase(args)}
    if not args.skip_replicas:
        results["replicas"] = deactivation_phase(args)
    out = ROOT / "bench" / "results" / "identity.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    sqlite = results["sqlite"]
    print(
        f"{sqlite['users']} users, {sqlite['projects']} projects, {sqlite['nodes']} nodes, "
        f"{sqlite['jobs']} jobs ({sqlite['active_jobs_listed']} active in the cluster status)"
    )
    print(f"{'call (client clock)':32} {'p50 ms':>8} {'p99 ms':>8}")
    for name, row in sqlite["client"].items():
        print(f"{name:32} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f}")
    for name, us in sqlite["check_in_process_us"].items():
        print(f"credential check in process, {name}: {us} µs")
    if "replicas" in results:
        ref = results["replicas"]["refused_on_b_s"]
        print(
            f"deactivated on replica A -> refused on replica B: median {ref['median'] * 1000:.1f}"
            f" ms, max {ref['max'] * 1000:.1f} ms"
        )


if __name__ == "__main__":
    main()
